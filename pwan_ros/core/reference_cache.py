"""A reference set prepared once for many registrations against it (odometry: every scan against
the same keyframe): the fine-tune's search structure and normals, and the caller-frame k-d tree of
the result's match weights.

The core works in a normalised frame whose scale depends on the source too (see
:func:`preprocess.make_normaliser`), so what is kept is built over the reference centred on its own
centroid in caller units; a nearest-neighbour search is invariant to translation and uniform
scale, so :class:`ScaledSearch` answers normalised queries with it (query mapped back to the
centred caller frame, distances divided by the scale). Normals are unit vectors, invariant too.
A registration without a cache builds the same objects on the spot, so a reused reference gives
the result of a fresh one (tested).
"""

from __future__ import annotations

import threading
from typing import Dict, Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from .nearest import HostNearest, estimate_normals, make_search
from .preprocess import Normaliser

__all__ = ['FINETUNE_SUBSET_SEED', 'PreparedReference', 'ReferenceCache', 'ScaledSearch']

#: offset of the seed of the fine-tune's reference subset (references above 2 x
#: finetune.max_points)
FINETUNE_SUBSET_SEED = 41


class ScaledSearch:
    """A search structure over centred caller-frame points (p - center) answering queries in the
    normalised frame of ``norm``: a row z maps to z x scale + (reference_center - center), the
    distances come back divided by the scale (beyond ``distance_upper_bound``, normalised: inf and
    index n, as cKDTree)."""

    def __init__(self, search, scale: float, offset: np.ndarray):
        self.search = search
        self.n = search.n
        self.scale = float(scale)
        self.offset = np.asarray(offset, dtype=np.float64)
        self._shift = bool(np.any(self.offset != 0.0))

    def query(self, x, k: int = 1, distance_upper_bound: float = np.inf, workers: int = 1):
        z = np.asarray(x, dtype=np.float64) * self.scale
        if self._shift:
            z = z + self.offset
        bound = distance_upper_bound
        # a little wider in caller units (rounding of the scale), then exactly the bound again
        wide = bound * self.scale * (1.0 + 1e-12) if np.isfinite(bound) else np.inf
        dist, idx = self.search.query(z, k=k, distance_upper_bound=wide, workers=workers)
        dist = dist / self.scale
        if np.isfinite(bound):
            far = ~(dist < bound)
            dist[far] = np.inf
            idx[far] = self.n
        return dist, idx


class PreparedReference:
    """Search structures of one reference's estimation points ``fit`` (k, d), caller units (the
    ``Problem.ref_fit`` of a registration), built on first use and kept: the fine-tune's subset
    (all points up to the cap, else a random subset seeded by ``seed`` + FINETUNE_SUBSET_SEED), its
    k-d tree or device search, its normals per neighbour count, and the k-d tree of all points."""

    def __init__(self, fit: np.ndarray):
        self.fit = np.array(fit, dtype=np.float64)
        self.fit.setflags(write=False)
        self.center = self.fit.mean(axis=0)
        self._fit_tree: Optional[cKDTree] = None
        self._subsets: Dict[tuple, tuple] = {}
        self._normals: Dict[tuple, np.ndarray] = {}
        self._device: Dict[tuple, object] = {}

    def fit_tree(self) -> cKDTree:
        """k-d tree of all estimation points, caller frame."""
        if self._fit_tree is None:
            self._fit_tree = cKDTree(self.fit)
        return self._fit_tree

    def _subset(self, cap: int, seed: int):
        """(indices, centred points, their k-d tree) of the fine-tune's reference subset."""
        n = self.fit.shape[0]
        key = (cap, seed) if cap and n > cap else (0, 0)
        if key not in self._subsets:
            if key[0]:
                rng = np.random.default_rng(seed + FINETUNE_SUBSET_SEED)
                idx = np.sort(rng.choice(n, size=cap, replace=False))
            else:
                idx = np.arange(n)
            centred = self.fit[idx] - self.center
            self._subsets[key] = (key, idx, centred, HostNearest(centred))
        return self._subsets[key]

    def finetune_reference(
        self,
        norm: Normaliser,
        cap: int,
        seed: int,
        normal_neighbors: Optional[int],
        device: Optional[torch.device] = None,
    ):
        """(xr (q, d) normalised, search over it answering normalised queries, normals (q, d) or
        None) of the fine-tune: ``cap`` reference points at most (0 = all), normals from
        ``normal_neighbors`` neighbours (None = none), the search a k-d tree (device None) or a
        :class:`nearest.TorchNearest` on ``device``."""
        key, idx, centred, tree = self._subset(cap, seed)
        xr = norm.reference(self.fit[idx])
        normals = None
        if normal_neighbors:
            nkey = key + (int(normal_neighbors),)
            if nkey not in self._normals:
                self._normals[nkey] = estimate_normals(
                    centred, tree, k=normal_neighbors, workers=-1
                )
            normals = self._normals[nkey]
        search = tree
        if device is not None:
            dkey = key + (str(device),)
            if dkey not in self._device:
                self._device[dkey] = make_search(centred, device)
            search = self._device[dkey]
        return xr, ScaledSearch(search, norm.scale, norm.reference_center - self.center), normals


class ReferenceCache:
    """The :class:`PreparedReference` of the last reference registered against, reused while the
    reference's estimation points stay the same (compared by value: O(points), microseconds for
    a keyframe; a changed or modified array builds a new one). Pass the same cache to every
    :func:`register` / :func:`refine` of a sequence (``reference_cache=``). ``builds`` / ``hits``
    count how often it prepared a reference / reused one."""

    def __init__(self):
        self._prepared: Optional[PreparedReference] = None
        self._lock = threading.Lock()
        self.builds = 0
        self.hits = 0

    def lookup(self, fit: np.ndarray) -> PreparedReference:
        """The prepared reference of the estimation points ``fit`` (built when they changed)."""
        with self._lock:
            prep = self._prepared
            if prep is not None and prep.fit.shape == fit.shape and np.array_equal(prep.fit, fit):
                self.hits += 1
                return prep
            prep = PreparedReference(fit)
            self._prepared = prep
            self.builds += 1
            return prep

    def clear(self) -> None:
        with self._lock:
            self._prepared = None
