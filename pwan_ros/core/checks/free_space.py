"""Free-space consistency of a pose from the sensors' viewpoints (``register(..., viewpoints=)``).

A range sensor that returned a point at range R in some direction saw the space before it
empty. A pose that puts the other cloud's surface there contradicts that observation; geometry
alone cannot tell such a pose from the truth in a symmetric room (a 90 or 180 degree turn lays
one half of a box room onto the other), the sensors' viewpoints can.

:class:`FreeSpace` keeps, per direction seen from the viewpoint (a spherical range image whose
pixels span about one voxel at the median range), the nearest return.
:meth:`FreeSpace.contradicted` flags points nearer than that return by more than a margin.
Each sensor also stood in free space: a pose that puts one sensor behind a surface the other
saw is a full contradiction. Only supported points take part (at least :data:`SUPPORT` neighbours
within 2 voxels in their own cloud): isolated spurious returns (rain, dust) and driver glitches are
no evidence either way.

Frames: every cloud in its own frame, caller units; a viewpoint is the sensor's position in
that frame (the origin for a ROS scan in its sensor frame, an RGB-D fragment in its camera frame).
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

__all__ = ['SUPPORT', 'FreeSpace', 'supported', 'contradiction']

#: neighbours within 2 voxels that make a point part of a surface
SUPPORT = 3
#: the depth margin of the tests, in voxels (+ one pixel width at the range)
MARGIN_VOXELS = 1.5
_ROW = 1 << 21  # pixel key = elevation row * _ROW + azimuth column


def supported(points: np.ndarray, voxel: float) -> np.ndarray:
    """(n,) bool: points with at least :data:`SUPPORT` other points within 2 voxels."""
    counts = cKDTree(points).query_ball_point(points, 2.0 * voxel, return_length=True)
    return counts > SUPPORT


class FreeSpace:
    """The nearest return per direction of ``points`` (m, 3) seen from ``viewpoint`` (3,), at
    ``voxel`` resolution (caller units)."""

    def __init__(self, points: np.ndarray, viewpoint: np.ndarray, voxel: float):
        self.viewpoint = np.asarray(viewpoint, dtype=np.float64)
        rel = points - self.viewpoint
        rng = np.linalg.norm(rel, axis=1)
        self.res = voxel / max(
            float(np.median(rng)), voxel
        )  # radians: one voxel at the median range
        self.voxel = voxel
        keys = self._keys(rel, rng)
        order = np.argsort(rng, kind='stable')
        self.keys, first = np.unique(keys[order], return_index=True)
        self.nearest = rng[order][first]

    def _keys(self, rel: np.ndarray, rng: np.ndarray) -> np.ndarray:
        elev = np.arcsin(np.clip(rel[:, 2] / np.maximum(rng, 1e-12), -1.0, 1.0))
        azim = np.arctan2(rel[:, 1], rel[:, 0])
        return np.floor(elev / self.res).astype(np.int64) * _ROW + np.floor(
            azim / self.res
        ).astype(np.int64)

    def _lookup(self, points: np.ndarray, spread: int = 0):
        """(range, nearest return in its direction or nan if that direction was not seen); with
        ``spread`` = 1 the nearest of the 3 x 3 pixels around it (a surface seen at a grazing angle
        spans a long stretch of range within one pixel: the lidar's ground far ahead)."""
        rel = points - self.viewpoint
        rng = np.linalg.norm(rel, axis=1)
        keys = self._keys(rel, rng)
        near = np.full(len(rng), np.inf)
        if len(self.keys) == 0:  # the sensor saw nothing (an empty support set)
            return rng, np.full(len(rng), np.nan)
        for dr in range(-spread, spread + 1):
            for dc in range(-spread, spread + 1):
                k = keys + dr * _ROW + dc
                pos = np.minimum(np.searchsorted(self.keys, k), len(self.keys) - 1)
                near = np.minimum(near, np.where(self.keys[pos] == k, self.nearest[pos], np.inf))
        return rng, np.where(np.isfinite(near), near, np.nan)

    def _margin(self, rng: np.ndarray) -> np.ndarray:
        """3 voxels + one pixel's width at the range (grazing surfaces)."""
        return MARGIN_VOXELS * self.voxel + rng * self.res

    def contradicted(self, points: np.ndarray) -> np.ndarray:
        """(n,) bool: ``points`` (same frame) in a direction the sensor saw, nearer than its return
        by more than the margin: the sensor saw through them."""
        rng, nearest = self._lookup(points, spread=1)
        return rng < nearest - self._margin(rng)  # nan compares False: unseen directions

    def hidden(self, points: np.ndarray) -> np.ndarray:
        """(n,) bool: ``points`` behind a surface the sensor saw (farther than its return by more
        than the margin); in a direction without a return of its own, the nearest of the 3 x 3
        around it (one pixel's gap in a wall, as the voxelised and supported points leave them,
        does not make the wall transparent)."""
        rng, nearest = self._lookup(points)
        gap = np.isnan(nearest)
        if gap.any():
            nearest[gap] = self._lookup(points[gap], spread=1)[1]
        return rng > nearest + self._margin(rng)


def contradiction(
    transform: np.ndarray,
    source: np.ndarray,
    reference: np.ndarray,
    src_space: FreeSpace,
    ref_space: FreeSpace,
) -> float:
    """Free-space contradiction of ``transform`` (4, 4, source -> reference), in [0, 1]: the larger
    of the fractions of supported ``source`` points (source frame) that the reference sensor saw
    through and of supported ``reference`` points that the source sensor saw through; 1 when a
    sensor itself stands behind a surface the other one saw (each sensor stood in free space)."""
    rot, t = transform[:3, :3], transform[:3, 3]
    sensors = (
        ref_space.hidden((rot @ src_space.viewpoint + t)[None])[0]
        or src_space.hidden(((ref_space.viewpoint - t) @ rot)[None])[0]
    )
    if sensors:
        return 1.0
    into_ref = ref_space.contradicted(source @ rot.T + t).mean() if len(source) else 0.0
    into_src = src_space.contradicted((reference - t) @ rot).mean() if len(reference) else 0.0
    return float(max(into_ref, into_src))
