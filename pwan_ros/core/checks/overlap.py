"""The self-check's overlap beyond chance of many poses of one pair, each first taken to the fit
its data shows nearby: how the global search ranks its candidates (:mod:`global_search.choose`)
with the measure and the local search the self-check (:mod:`verify`) judges a pose with.

Both sets are prepared once at the judging voxel: the reference's surfaces (voxels holding two
or more of its points: uniform outliers rarely share one), the voxelised source (at most
``CHECK_POINTS``). A pose is refined by GICP (plane-aware, small_gicp), coarse to fine from
``REACH`` gates down to the gate g = 1.5 voxels (with two levels, two candidates of one room
stopped apart at equal overlap), and scored by ``excess = (overlap - chance) /
(1 - chance)``: the fraction of the source within g of the surfaces, less the fraction random
places in the moved source's box get by chance. Both sets run about their own means, so the
result does not depend on where the data lie (map coordinates). Caller units; poses map source
-> reference (T_reference_source)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..preprocess import voxel_downsample
from .verify import CHECK_POINTS, GicpPaths, _judged, coarse_to_fine

__all__ = ['REACH', 'Judged', 'OverlapJudge']

#: the coarsest GICP gate, in gates: a candidate a few gates off its fit reaches it (the global
#: search's candidates come from a fine-tune on subsets, up to a few degrees off on a room)
REACH = 4.0


class Judged(NamedTuple):
    """A pose taken to its fit: ``transform`` (4, 4) T_reference_source, ``excess`` its overlap
    beyond chance."""

    transform: np.ndarray
    excess: float


class OverlapJudge:
    """Poses of ``source`` (n, 3) on ``reference`` (m, 3), caller units, judged at the judging
    ``voxel`` (refined as the self-check refines it when random places lie within the gate more
    than ``MAX_CHANCE`` of the time, decided at the first pose judged). Sets prepared at the
    first call."""

    def __init__(self, source: np.ndarray, reference: np.ndarray, voxel: float, seed: int = 0):
        self._source, self._reference = source, reference
        self._voxel, self._seed = float(voxel), seed
        self._ready = False

    @property
    def gate(self) -> float:
        """The gate g (1.5 judging voxels; valid once a pose was judged)."""
        return 1.5 * self._voxel

    def excess(self, transform: np.ndarray) -> float:
        """Overlap beyond chance of the source at ``transform`` (4, 4), as it is."""
        self._prepare(transform)
        moved = self._points @ transform[:3, :3].T + transform[:3, 3]
        g = self.gate
        d, _ = self._tree.query(moved, k=1, distance_upper_bound=g)
        rng = np.random.default_rng(self._seed)
        places = rng.uniform(moved.min(axis=0), moved.max(axis=0), size=moved.shape)
        dp, _ = self._tree.query(places, k=1, distance_upper_bound=g)
        overlap, chance = float(np.isfinite(d).mean()), float(np.isfinite(dp).mean())
        return (overlap - chance) / (1.0 - chance) if chance < 1.0 else 0.0

    def fitted(self, transform: np.ndarray) -> Judged:
        """``transform`` (4, 4) taken to the fit GICP reaches from it, coarse to fine from
        ``REACH`` gates to one, and judged there (the pose as it is when GICP leaves the sets)."""
        self._prepare(transform)
        cs, cr = self._source_center, self._target_center
        start = np.array(transform, dtype=np.float64)
        start[:3, 3] = start[:3, :3] @ cs + start[:3, 3] - cr  # about both means
        g = self.gate
        t = coarse_to_fine(
            self._target,
            self._cloud,
            self._target_tree,
            start,
            'GICP',
            [REACH * g, 2 * g, g],
            self._paths,
        ).copy()
        t[:3, 3] = t[:3, 3] - t[:3, :3] @ cs + cr
        if not np.isfinite(t).all():
            t = np.array(transform, dtype=np.float64)
        return Judged(t, self.excess(t))

    def _prepare(self, transform: np.ndarray) -> None:
        """The judged sets at the (refined) voxel, the GICP clouds about their means."""
        if self._ready:
            return
        import small_gicp

        moved = self._source @ transform[:3, :3].T + transform[:3, 3]
        j = _judged(moved, self._reference, self._voxel, self._seed, CHECK_POINTS)
        self._voxel = j.voxel
        points = voxel_downsample(self._source, self._voxel)
        if len(points) > CHECK_POINTS:
            pick = np.random.default_rng(self._seed).choice(len(points), CHECK_POINTS, False)
            points = points[pick]
        surfaces = j.tree.data  # the reference's surfaces at that voxel
        self._points, self._tree = points, j.tree
        self._source_center, self._target_center = points.mean(axis=0), surfaces.mean(axis=0)
        centred = np.ascontiguousarray(points - self._source_center)
        self._cloud = small_gicp.PointCloud(centred)
        self._paths = GicpPaths(centred)  # candidates that meet share the rest of their fit
        self._target = small_gicp.PointCloud(np.ascontiguousarray(surfaces - self._target_center))
        self._target_tree = small_gicp.KdTree(self._target, num_threads=1)
        for cloud, tree in (
            (self._target, self._target_tree),
            (self._cloud, small_gicp.KdTree(self._cloud, num_threads=1)),
        ):
            small_gicp.estimate_covariances(cloud, tree, num_neighbors=10, num_threads=1)
        self._ready = True
