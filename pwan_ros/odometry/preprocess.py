"""The preprocessing stage of the odometry: one raw scan -> the points it is registered with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.keyframe_tracker import PreparedCloud
from pwan_ros.odometry.scan_filter import (
    FilteredScan,
    automatic_voxel_size,
    filter_scan,
    in_range_gate,
)

#: scans with fewer usable points than this cannot be registered
MIN_POINTS = 30


class ScanError(ValueError):
    """A scan that cannot be registered at all (e.g. no valid points); the pipeline state is
    unchanged and the caller should count and report it."""


@dataclass
class PreparedScan:
    """dense: (M, 3) float64 downsampled scan, sensor frame (metres; what a keyframe keeps).
    tracked: the subset of ``source_points`` points tracked against the keyframe, prepared for
    GICP. filtered: the filter's counts."""

    dense: np.ndarray
    tracked: PreparedCloud
    filtered: FilteredScan

    def keyframe_cloud(self, num_threads: int) -> PreparedCloud:
        """The whole downsampled scan prepared for GICP (built only when it becomes a keyframe)."""
        if len(self.tracked) == len(self.dense):
            return self.tracked
        return PreparedCloud.build(self.dense, num_threads)


class ScanPreparer:
    """Range gate, far-glitch removal, voxel grid (size fixed by the first scan that yields
    enough points, when automatic), isolated-return removal, point caps. ``voxel_size`` is 0
    until known; a skipped scan (ScanError) leaves it unchanged."""

    def __init__(self, config: OdometryConfig, rng: np.random.Generator, num_threads: int = 2):
        self.config = config
        self.rng = rng
        self.num_threads = num_threads
        self.voxel_size = config.scan_voxel_size

    def __call__(self, points: np.ndarray) -> PreparedScan:
        """points: (N, 3) sensor frame (metres), may hold NaN rows. Raises ScanError."""
        cfg = self.config
        pts = np.asarray(points)
        if pts.ndim != 2 or pts.shape[1] != 3:
            raise ScanError(f'expected (N, 3) points, got shape {pts.shape}')
        voxel = self.voxel_size
        if voxel <= 0.0:  # from the returns the filter keeps (no-return points at the sensor out)
            gated = pts.astype(np.float64, copy=False)
            gated = in_range_gate(
                gated[np.isfinite(gated).all(axis=1)], cfg.min_range, cfg.max_range
            )
            if len(gated) < MIN_POINTS:
                raise ScanError(
                    f'scan has {len(gated)} finite points within the range gate '
                    f'[{cfg.min_range:g}, {cfg.max_range or float("inf"):g}] m, need {MIN_POINTS}'
                )
            voxel = automatic_voxel_size(gated)
        try:
            filt = filter_scan(
                pts, voxel, cfg.scan_max_points, cfg.min_range, cfg.max_range, rng=self.rng
            )
        except ValueError as exc:
            raise ScanError(str(exc)) from None
        if len(filt.points) < MIN_POINTS:
            raise ScanError(
                f'scan has {len(filt.points)} usable points after filtering '
                f'({filt.num_input} received, {filt.num_finite} finite, {filt.num_in_range} '
                f'within the range gate, {filt.num_far} far glitches), need {MIN_POINTS}'
            )
        self.voxel_size = voxel  # fixed by the first scan that is registered
        dense = filt.points
        tracked = dense
        if len(dense) > cfg.source_points:
            tracked = dense[np.sort(self.rng.choice(len(dense), cfg.source_points, replace=False))]
        return PreparedScan(dense, PreparedCloud.build(tracked, self.num_threads), filt)
