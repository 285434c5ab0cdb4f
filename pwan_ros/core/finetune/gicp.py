"""Plane-aware polish of a rigid 3-D result: small_gicp's GICP from the fine-tuned pose, coarse to
fine (the correspondence gate halves from a wide one down to the matching gate).

The fine-tune's re-weighted nearest-neighbour steps move slowly along weakly constrained
directions (a street, a corridor), and a pose the adversarial stage left metres along them is
not brought back within the iteration cap: 4 of 9 consecutive BALM scan pairs registered with
``voxel_size=0.25`` ended 0.23-1.27 m off with the rotation right. GICP's Gauss-Newton steps on
the points' local covariances, from a gate of 2 % of the reference's extent down to the
matching gate, take such a slide back (all 9 within 1 cm, with and without ``voxel_size``). The
polished pose is kept only when it puts clearly more of the source (``MIN_GAIN``) within half the
finest gate of the reference than the fine-tuned pose: on a small object with as many uniform
outliers as points, where both poses match everything at that distance, GICP's pull toward the
outliers would otherwise cost a degree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from pwan_ros.geometry.se3 import invert

__all__ = ['PolishResult', 'gicp_polish', 'MAX_POINTS', 'MIN_POINTS']

#: points of each set the polish uses at most (a random subset beyond)
MAX_POINTS = 20000
#: below this the local covariances (10 neighbours) mean little: no polish
MIN_POINTS = 30
#: the polished pose must match this much more of the source (fraction) to be kept
MIN_GAIN = 0.005


@dataclass(frozen=True)
class PolishResult:
    """transform: (4, 4) T_reference_source after the polish (the input when not kept);
    kept: whether GICP's pose was kept; matched_before / matched_after: fraction of the source
    within ``gate / 2`` of the reference at the input / GICP pose; iterations: GICP's."""

    transform: np.ndarray
    kept: bool
    matched_before: float
    matched_after: float
    iterations: int


def _subset(points: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    if len(points) <= n:
        return points
    return points[np.sort(rng.choice(len(points), n, replace=False))]


#: the widest gate, as a fraction of the reference's bounding-box diagonal
WIDE_GATE = 0.02


def gicp_polish(
    source: np.ndarray,
    reference: np.ndarray,
    transform: np.ndarray,
    gate: float,
    reference_tree: cKDTree | None = None,
    num_threads: int = 1,
    seed: int = 0,
) -> PolishResult:
    """Polish ``transform`` (4, 4, source -> reference) of (N, 3) / (M, 3) point sets (caller
    units). gate: the matching gate (caller units, the partial selection: pairs farther apart do
    not count); the passes start at WIDE_GATE x the reference's diagonal when that is wider.
    reference_tree: a k-d tree of ``reference`` to score with (else built). num_threads > 1 is
    faster but not bit-reproducible (small_gicp's parallel sums)."""
    import small_gicp

    transform = np.asarray(transform, dtype=np.float64)
    if len(source) < MIN_POINTS or len(reference) < MIN_POINTS or not gate > 0:
        return PolishResult(transform, False, float('nan'), float('nan'), 0)
    rng = np.random.default_rng(seed)
    src = np.ascontiguousarray(_subset(source, MAX_POINTS, rng), dtype=np.float64)
    ref = np.ascontiguousarray(_subset(reference, MAX_POINTS, rng), dtype=np.float64)
    # GICP's increments turn about the origin: about the data's centre, a pose at map
    # coordinates (1e5 m out) is as well conditioned as near the origin
    center = ref.mean(axis=0)
    target = small_gicp.PointCloud(ref - center)
    target_tree = small_gicp.KdTree(target, num_threads=num_threads)
    small_gicp.estimate_covariances(target, target_tree, num_neighbors=10, num_threads=num_threads)
    moving = small_gicp.PointCloud(src - center)
    small_gicp.estimate_covariances(
        moving,
        small_gicp.KdTree(moving, num_threads=num_threads),
        num_neighbors=10,
        num_threads=num_threads,
    )
    wide = WIDE_GATE * float(np.linalg.norm(ref.max(axis=0) - ref.min(axis=0)))
    gates = [gate]
    while gates[0] * 2.0 <= wide:
        gates.insert(0, gates[0] * 2.0)
    shift = np.eye(4)
    shift[:3, 3] = center
    polished, iterations = invert(shift) @ transform @ shift, 0
    for g in gates:
        res = small_gicp.align(
            target,
            moving,
            target_tree,
            init_T_target_source=polished,
            registration_type='GICP',
            max_correspondence_distance=g,
            num_threads=num_threads,
            max_iterations=50,
        )
        polished = np.asarray(res.T_target_source, dtype=np.float64)
        iterations += int(res.iterations)
    polished = shift @ polished @ invert(shift)
    tree = reference_tree if reference_tree is not None else cKDTree(reference)

    def matched(t):
        moved = src @ t[:3, :3].T + t[:3, 3]
        dist, _ = tree.query(moved, k=1, distance_upper_bound=gate / 2)
        return float(np.mean(dist <= gate / 2))

    before, after = matched(transform), matched(polished)
    if not np.isfinite(polished).all() or after < before + MIN_GAIN:
        return PolishResult(transform, False, before, after, iterations)
    return PolishResult(polished, True, before, after, iterations)
