"""Keyframes: the registered scans later scans are tracked against (or a fixed reference cloud).

Scans are tracked against a *local map*: the union of the last ``local_map_keyframes`` keyframe
scans (in odom, as registered), moved into the newest keyframe's frame, voxel-downsampled at the
scan voxel size and capped at ``scan_max_points`` (so tracking a scan against it costs about
what tracking against one keyframe does). With ``local_map_keyframes: 1`` it is the newest
keyframe's scan alone. A fixed reference cloud replaces it while aligning to one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from pwan_ros.geometry.se3 import invert, rotation_angle, translation_norm
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.keyframe_tracker import PreparedCloud
from pwan_ros.odometry.scan_filter import voxel_grid


@dataclass
class Keyframe:
    """local_map: what scans are tracked against, in the keyframe's sensor frame, prepared for
    GICP (the newest keyframe's downsampled scan when ``local_map_keyframes`` is 1, or the
    reference cloud). pose: (4, 4) T_odom_keyframe. index: 1, 2, ... in order of creation
    (0: the reference cloud). map_keyframes: keyframe scans in ``local_map``."""

    local_map: PreparedCloud
    pose: np.ndarray
    index: int
    is_reference: bool = False
    map_keyframes: int = 1


class Keyframes:
    """The current keyframe, its local map, and the rule that starts a new one
    (``keyframe_distance`` / ``keyframe_angle`` of motion from it; never while aligning to a
    reference cloud). ``voxel_size``: returns the scans' voxel size (m; the pipeline's, chosen
    with the first scan when automatic; default ``scan_voxel_size``); the local map is
    downsampled with it (0: only capped)."""

    def __init__(
        self,
        config: OdometryConfig,
        num_threads: int = 2,
        voxel_size: Optional[Callable[[], float]] = None,
    ):
        self.config = config
        self.num_threads = num_threads
        self.voxel_size = voxel_size or (lambda: config.scan_voxel_size)
        self.reset()

    def reset(self) -> None:
        self.current: Optional[Keyframe] = None
        self._count = 0
        self._recent: deque = deque(maxlen=self.config.local_map_keyframes)  # (M, 3) odom points
        self._rng = np.random.default_rng(self.config.seed)

    def clear_map(self) -> None:
        """Forget the keyframes of the local map (a re-anchor: the old keyframes do not line up
        with the held pose); the next keyframe starts a new map. The current keyframe stays."""
        self._recent.clear()

    def set_reference(self, cloud: PreparedCloud) -> Keyframe:
        """Make the reference cloud (odom_frame coordinates) the fixed keyframe."""
        self.current = Keyframe(cloud, np.eye(4), 0, True)
        return self.current

    def start(
        self, points: np.ndarray, pose: np.ndarray, prepare: Callable[[], PreparedCloud]
    ) -> Keyframe:
        """Make a downsampled scan, (M, 3) ``points`` in its sensor frame at (4, 4) T_odom_sensor
        ``pose``, the new keyframe, the newest of the local map that later scans are tracked
        against. ``prepare()`` returns the scan prepared for GICP; it is called only when the
        keyframe's own scan is the map (no KD-tree or covariances built for a scan that is merged
        into a local map)."""
        pose = np.array(pose, dtype=np.float64)
        self._count += 1
        cloud = None
        if self.config.local_map_keyframes > 1:
            self._recent.append(points @ pose[:3, :3].T + pose[:3, 3])
            if len(self._recent) > 1:
                cloud = self._local_map(pose)
        if cloud is None:
            cloud = prepare()
        self.current = Keyframe(cloud, pose, self._count, map_keyframes=max(len(self._recent), 1))
        return self.current

    def _local_map(self, pose: np.ndarray) -> PreparedCloud:
        """The recent keyframes' union in the frame of ``pose``, voxel-downsampled and capped."""
        inv = invert(pose)
        pts = np.vstack(list(self._recent)) @ inv[:3, :3].T + inv[:3, 3]
        voxel = self.voxel_size()
        if voxel > 0.0:
            pts = voxel_grid(pts, voxel).centroids
        cap = self.config.scan_max_points
        if len(pts) > cap:
            pts = pts[np.sort(self._rng.choice(len(pts), cap, replace=False))]
        return PreparedCloud.build(pts, self.num_threads)

    def due(self, t_kf_scan: np.ndarray) -> bool:
        """Whether a scan at (4, 4) T_keyframe_scan is far enough to become the next keyframe."""
        if self.current is None or self.current.is_reference:
            return False
        cfg = self.config
        return (
            translation_norm(t_kf_scan) >= cfg.keyframe_distance
            or rotation_angle(t_kf_scan) >= cfg.keyframe_angle
        )
