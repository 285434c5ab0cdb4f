"""The package's one voxel grid (numpy only): voxel keys, occupied voxels, per-voxel reductions.

A point p of an (N, d) cloud lies in the voxel of integer key ``floor((p - origin) / voxel)``
per axis (``origin`` (d,), None: the frame's origin; same units as the points). Keys are shifted
to start at 1 and flattened, first axis slowest, with a span per axis that leaves a free voxel on
each side (a neighbour's flat key is the voxel's plus a constant, never wrapping). One stable
argsort of the flat keys sorts the points voxel by voxel: occupied voxels come out in key order
(lexicographic, first axis slowest), each voxel's points in input order, so every reduction
(centroid, first point, count) is deterministic and independent of the input order of other
voxels. When the cloud spans too many voxels for 63-bit flat keys (but each axis fits in
float64's exact integers), the keys' columns are sorted instead (one stable lexsort, same order;
:attr:`VoxelGrid.flat` is then None).

Open3D's ``voxel_down_sample`` (the global search's feature clouds, ``core/hypotheses.py``) is
this grid with the origin half a voxel below the cloud's minimum: the same centroids bit for bit,
in a hash map's order, which the global search's seeded samples depend on, so it stays there.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import numpy as np

__all__ = ['VoxelGrid', 'voxel_grid', 'MAX_CELLS_PER_AXIS']

#: voxels per axis a grid may span: beyond float64's exact integers, floor() no longer
#: separates neighbouring voxels
MAX_CELLS_PER_AXIS = 2.0**52
#: flat keys stay below this (int64, with room for neighbour offsets)
_MAX_FLAT_KEY = 2.0**62


@dataclass(frozen=True)
class VoxelGrid:
    """Occupied voxels of an (N, d) cloud, sorted by key. points: (N, d) float64 the cloud (not
    copied); keys: (M, d) int64 voxel keys (>= 1, relative to the cloud's lowest voxel);
    counts: (M,) points per voxel; inverse: (N,) voxel of each point; order: (N,) point indices
    voxel by voxel, input order within a voxel; starts: (M,) position in ``order`` of each
    voxel's first point; flat: (M,) int64 sorted flat keys ``(k0 * span[1] + k1) * span[2] + k2``
    (None when they would overflow); span: (d,) int64, larger than every key by at least 2."""

    points: np.ndarray
    keys: np.ndarray
    counts: np.ndarray
    inverse: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    flat: Optional[np.ndarray]
    span: np.ndarray

    @cached_property
    def centroids(self) -> np.ndarray:
        """(M, d) mean of each voxel's points (summed in input order)."""
        m = len(self.counts)
        sums = np.stack(
            [np.bincount(self.inverse, self.points[:, i], m) for i in range(self.points.shape[1])],
            axis=1,
        )
        return sums / self.counts[:, None]

    @property
    def first(self) -> np.ndarray:
        """(M,) index of each voxel's first point (in input order)."""
        return self.order[self.starts]

    @property
    def shared(self) -> np.ndarray:
        """(M,) bool: voxels holding two or more points."""
        return self.counts >= 2


def voxel_grid(
    points: np.ndarray,
    voxel: float,
    origin: Optional[np.ndarray] = None,
    require_flat: bool = False,
) -> VoxelGrid:
    """The occupied voxels of edge ``voxel`` (> 0) of ``points`` (N, d) (see the module
    docstring). origin: (d,) corner of the voxel of key 0 (None: zeros). Per-column floors and
    min / max (numpy's axis-0 reductions of an (N, d) array are several times slower).

    Raises ValueError when the cloud spans more than :data:`MAX_CELLS_PER_AXIS` voxels along an
    axis, or, with ``require_flat``, too many voxels for 63-bit flat keys."""
    pts = np.asarray(points, dtype=np.float64)
    n, d = pts.shape
    if origin is None:
        cols = [np.floor(pts[:, i] / voxel) for i in range(d)]
    else:
        o = np.asarray(origin, dtype=np.float64)
        cols = [np.floor((pts[:, i] - o[i]) / voxel) for i in range(d)]
    # floor is monotone: the min / max cell of a column is the cell of its min / max point
    lo = np.array([c.min() for c in cols]) if n else np.zeros(d)
    hi = np.array([c.max() for c in cols]) if n else np.zeros(d)
    span_f = hi - lo + 3.0  # keys are >= 1, so neighbour keys stay non-negative
    fits = float(np.prod(span_f)) < _MAX_FLAT_KEY
    if not (hi - lo < MAX_CELLS_PER_AXIS).all() or (require_flat and not fits):
        extent = float(np.ptp(pts, axis=0).max()) if n else 0.0
        raise ValueError(f'voxel_size {voxel:g} is too small for a cloud spanning {extent:.4g}')
    keys = [(c - lo[i] + 1.0).astype(np.int64) for i, c in enumerate(cols)]
    span = span_f.astype(np.int64)
    if fits:
        flat = keys[0]
        for i in range(1, d):
            flat = flat * span[i] + keys[i]
        order = np.argsort(flat, kind='stable')
        sflat = flat[order]
        new = sflat[1:] != sflat[:-1]
    else:
        order = np.lexsort(keys[::-1])  # stable, first axis slowest: the flat keys' order
        new = np.zeros(max(n - 1, 0), dtype=bool)
        for k in keys:
            sk = k[order]
            new |= sk[1:] != sk[:-1]
    starts = np.flatnonzero(np.concatenate((np.ones(min(n, 1), dtype=bool), new)))
    counts = np.diff(np.append(starts, n))
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.repeat(np.arange(len(counts)), counts)
    first = order[starts]
    return VoxelGrid(
        pts,
        np.stack([k[first] for k in keys], axis=1),
        counts,
        inverse,
        order,
        starts,
        sflat[starts] if fits else None,
        span,
    )
