"""Scan preprocessing: drop invalid points, range gate, voxel grid, isolated returns, cap.

Input points are (N, 3) in the sensor frame (metres). Output float64 (M, 3) plus counts, so
the node can report how many points were dropped and why.

Isolated returns: a voxel grid keeps one point per occupied voxel, so spurious returns
(rain, dust, multipath, uniform outliers), which rarely share a voxel, survive it one for one
while real surfaces are compressed many-to-one: heavy noise dominates a downsampled scan even
when it is a minority of the raw returns. A voxel is *isolated* when it holds a single return
and none of its 26 neighbouring voxels is occupied (surfaces, even sparse lidar rings, have
neighbours along the surface). When isolated voxels make up more than
``ISOLATED_VOXEL_FRACTION`` of the occupied voxels while the other voxels still hold at least
``DENSE_MASS_FRACTION`` of the returns, the isolated voxels are dropped. A clean scan (few
isolated voxels) and a cloud that is sparse everywhere are left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from pwan_ros.geometry import voxels
from pwan_ros.geometry.outliers import far_outliers
from pwan_ros.geometry.voxels import VoxelGrid

ISOLATED_VOXEL_FRACTION = 0.2
DENSE_MASS_FRACTION = 0.3
_NEIGHBOURS = np.array(
    [o for o in product((-1, 0, 1), repeat=3) if o != (0, 0, 0)], dtype=np.int64
)
#: order in which :func:`isolated_voxels` tries the neighbour offsets (any order gives the same
#: result): the same layer first, sides before diagonals (a lidar ring's neighbours lie along it,
#: in a sensor frame with z up), then the layers above and below
_OFFSET_ORDER = np.lexsort((np.abs(_NEIGHBOURS).sum(axis=1), np.abs(_NEIGHBOURS[:, 2])))


@dataclass(frozen=True)
class FilteredScan:
    """points: (M, 3) float64, sensor frame. num_input: points received; num_finite: of those
    with finite x/y/z; num_in_range: of those inside the range gate; voxel_size: metres used;
    num_isolated_removed: isolated voxels dropped (see the module docstring); num_far: returns in
    the range gate dropped as far glitches (:func:`~pwan_ros.geometry.outliers.far_outliers`)."""

    points: np.ndarray
    num_input: int
    num_finite: int
    num_in_range: int
    voxel_size: float
    num_isolated_removed: int = 0
    num_far: int = 0


def voxel_grid(points: np.ndarray, voxel_size: float) -> VoxelGrid:
    """The occupied voxels (:class:`~pwan_ros.geometry.voxels.VoxelGrid`) of an (N, 3) float64
    cloud (metres, sensor frame) with cubic voxels of ``voxel_size`` anchored at the sensor: voxels
    sorted by flat key, each voxel's points summed in input order.

    Raises ValueError when the cloud spans too many voxels for 63-bit keys (far glitches are
    removed before, see :func:`~pwan_ros.geometry.outliers.far_outliers`)."""
    return voxels.voxel_grid(points, voxel_size, require_flat=True)


def isolated_voxels(grid: VoxelGrid) -> np.ndarray:
    """Boolean (M,) mask of the voxels to drop as isolated returns (all False when the rule of
    the module docstring does not apply).

    A neighbour's flat key is the voxel's plus a constant per offset (keys never wrap). The
    offsets are tried one after the other on the single-return voxels not yet known to have a
    neighbour (face neighbours first: most surface voxels are settled by the first few), each
    a search of sorted keys in the sorted key array. The voxels still unsettled bound the isolated
    ones, so the search stops as soon as they are too few for the rule to apply (a clean scan:
    after the first offsets)."""
    single = np.flatnonzero(grid.counts == 1)
    drop = np.zeros(len(grid.counts), dtype=bool)
    enough = ISOLATED_VOXEL_FRACTION * len(grid.counts)
    if len(single) <= enough:
        return drop
    span, flat = grid.span, grid.flat
    offsets = (_NEIGHBOURS[:, 0] * span[1] + _NEIGHBOURS[:, 1]) * span[2] + _NEIGHBOURS[:, 2]
    isolated, keys = single, flat[single]  # candidates, sorted
    last = len(flat) - 1
    for off in offsets[_OFFSET_ORDER]:
        nk = keys + off
        alone = flat[np.minimum(np.searchsorted(flat, nk), last)] != nk
        isolated, keys = isolated[alone], keys[alone]
        if len(isolated) <= enough:
            return drop
    if (
        len(isolated) > ISOLATED_VOXEL_FRACTION * len(grid.counts)
        and grid.counts.sum() - len(isolated) >= DENSE_MASS_FRACTION * grid.counts.sum()
    ):
        drop[isolated] = True
    return drop


def _ranges(points: np.ndarray) -> np.ndarray:
    """(N,) Euclidean norms of (N, 3) points (x^2 + y^2 + z^2 summed in that order)."""
    x, y, z = points[:, 0], points[:, 1], points[:, 2]
    return np.sqrt(x * x + y * y + z * z)


def _finite_rows(points: np.ndarray) -> np.ndarray:
    """(N,) bool: rows of (N, 3) points with finite x, y and z."""
    fin = np.isfinite(points)
    return fin[:, 0] & fin[:, 1] & fin[:, 2]


def in_range_gate(
    points: np.ndarray, min_range: float = 0.0, max_range: float = 0.0
) -> np.ndarray:
    """The rows of finite (N, 3) float64 points inside the range gate (0 = that side off)."""
    if min_range <= 0.0 and max_range <= 0.0:
        return points
    r = _ranges(points)
    keep = r >= min_range
    if max_range > 0.0:
        keep &= r <= max_range
    return points[keep]


def automatic_voxel_size(points: np.ndarray) -> float:
    """Voxel size (m) from a scan's extent: 3.5 % of the median range from the sensor, clamped
    to [0.02, 1.0] m (about 0.2 m for a lidar in a street or a building, a few cm for a depth
    camera on a desk). Isolated returns (see the module docstring), looked for at a fine first
    guess, do not count: dense far-flung outliers would otherwise inflate the statistic (at a
    coarse size they fill neighbouring voxels and nothing looks isolated)."""
    pts = np.asarray(points, dtype=np.float64)
    if len(pts) == 0:
        raise ValueError('cannot choose a voxel size for an empty scan')
    pts = pts[~far_outliers(pts)]

    def from_ranges(p, factor):
        return float(np.clip(factor * np.median(np.linalg.norm(p, axis=1)), 0.02, 1.0))

    grid = voxel_grid(pts, from_ranges(pts, 0.015))
    drop = isolated_voxels(grid)
    if drop.any():
        pts = pts[~drop[grid.inverse]]
    return from_ranges(pts, 0.035)


def filter_scan(
    points: np.ndarray,
    voxel_size: float,
    max_points: int,
    min_range: float = 0.0,
    max_range: float = 0.0,
    rng: np.random.Generator | None = None,
) -> FilteredScan:
    """Finite-point filter, range gate (0 = off), far-glitch gate
    (:func:`~pwan_ros.geometry.outliers.far_outliers`), voxel grid (voxel_size > 0) with
    isolated-return removal, and random cap at ``max_points``. The range gate comes first: a
    driver's no-return points piled at the sensor (zeros, a ring at the beam origin) would
    otherwise be the bulk that the real returns look far from.

    points: (N, 3) array-like in the sensor frame. Raises ValueError for a wrong shape.
    """
    pts = np.asarray(points)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise ValueError(f'expected (N, 3) points, got shape {pts.shape}')
    pts = pts.astype(np.float64, copy=False)
    finite = _finite_rows(pts)
    if not finite.all():
        pts = pts[finite]
    num_finite = len(pts)
    pts = in_range_gate(pts, min_range, max_range)
    num_in_range = len(pts)
    far = far_outliers(pts)
    num_far = int(far.sum())
    if num_far:
        pts = pts[~far]
    removed = 0
    if voxel_size > 0.0 and len(pts):
        grid = voxel_grid(pts, voxel_size)
        drop = isolated_voxels(grid)
        removed = int(drop.sum())
        pts = grid.centroids[~drop]
    if len(pts) > max_points:
        rng = rng or np.random.default_rng(0)
        pts = pts[np.sort(rng.choice(len(pts), max_points, replace=False))]
    return FilteredScan(
        np.ascontiguousarray(pts),
        int(np.asarray(points).shape[0]),
        num_finite,
        num_in_range,
        float(voxel_size),
        removed,
        num_far,
    )
