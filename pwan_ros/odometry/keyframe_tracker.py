"""The fast tracking path: partial registration of a scan to the local map of recent keyframes.

It minimises the fine-tune objective of PWAN (eq. fine_tune, distance type: only
correspondences within h count) with small_gicp's GICP as the inner solver: each iteration
pairs every scan point with its nearest keyframe point, drops pairs farther than h (the
partial selection), and takes a Gauss-Newton step on the plane-aware GICP cost. The target's
covariances and KD-tree (:class:`PreparedCloud`, built once per keyframe: the local map of
:mod:`pwan_ros.odometry.keyframes`) are reused for every scan tracked against it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import small_gicp

from pwan_ros.geometry.se3 import project_rigid, transform_points
from pwan_ros.odometry.constraint import Constraint


@dataclass
class PreparedCloud:
    """A downsampled cloud ready for GICP: points (M, 3) float64 in one sensor frame (a scan's
    own; a local map's: its newest keyframe's), small_gicp cloud with per-point covariances and
    its KD-tree."""

    points: np.ndarray
    cloud: 'small_gicp.PointCloud'
    tree: 'small_gicp.KdTree'

    @classmethod
    def build(
        cls, points: np.ndarray, num_threads: int = 2, num_neighbors: int = 10
    ) -> 'PreparedCloud':
        pts = np.ascontiguousarray(points, dtype=np.float64)
        cloud = small_gicp.PointCloud(pts)
        tree = small_gicp.KdTree(cloud, num_threads=num_threads)
        small_gicp.estimate_covariances(
            cloud, tree, num_neighbors=num_neighbors, num_threads=num_threads
        )
        return cls(pts, cloud, tree)

    def __len__(self):
        return len(self.points)


@dataclass(frozen=True)
class MatchQuality:
    """matched_ratio: fraction of the scan's points whose nearest keyframe point is within h.
    median_residual: median of those distances (m)."""

    matched_ratio: float
    median_residual: float


@dataclass(frozen=True)
class TrackResult:
    """transform: (4, 4) T_keyframe_scan (maps scan points into the keyframe's frame).
    quality: match quality at h. iterations: GICP iterations. converged: GICP's flag.
    time_ms: wall time. constraint: how firmly the final GICP pass pins the pose."""

    transform: np.ndarray
    quality: MatchQuality
    iterations: int
    converged: bool
    time_ms: float
    constraint: Optional[Constraint] = None


def match_quality(
    target: PreparedCloud, points: np.ndarray, transform: np.ndarray, h: float
) -> MatchQuality:
    """Partial-matching quality of ``points`` (M, 3), moved by ``transform``, against
    ``target``."""
    moved = transform_points(transform, points)
    _, sq = target.tree.batch_nearest_neighbor_search(moved)
    dist = np.sqrt(np.asarray(sq, dtype=np.float64))
    inl = dist <= h
    ratio = float(inl.mean()) if len(dist) else 0.0
    med = float(np.median(dist[inl])) if inl.any() else float('inf')
    return MatchQuality(ratio, med)


def track(
    target: PreparedCloud,
    source: PreparedCloud,
    init: np.ndarray,
    h: float,
    max_iterations: int = 30,
    num_threads: int = 2,
    capture: float = 0.0,
) -> TrackResult:
    """Register ``source`` to ``target`` from ``init`` (4x4 T_target_source).

    While converging, correspondences are gated at 2h (a wider capture range from a poor
    prediction); the reported quality counts the scan points within h of the keyframe.
    capture > 2h (m): how far the scan may be from ``init`` (no velocity known yet, a gap): the
    gate starts there and halves after each converged pass down to 2h (coarse to fine).
    Returns the refined T_target_source and its match quality."""
    start = time.perf_counter()
    gates = [2.0 * h]
    while capture > gates[0] * 1.5:
        gates.insert(0, gates[0] * 2.0)
    t, iterations, converged = np.asarray(init, dtype=np.float64), 0, True
    for gate in gates:
        res = small_gicp.align(
            target.cloud,
            source.cloud,
            target.tree,
            init_T_target_source=t,
            registration_type='GICP',
            max_correspondence_distance=gate,
            num_threads=num_threads,
            max_iterations=max_iterations,
        )
        t = np.asarray(res.T_target_source, dtype=np.float64)
        iterations += int(res.iterations)
        converged = bool(res.converged)
    t = project_rigid(t)
    quality = match_quality(target, source.points, t, h)
    elapsed = (time.perf_counter() - start) * 1e3
    return TrackResult(t, quality, iterations, converged, elapsed, Constraint.of(res.H))
