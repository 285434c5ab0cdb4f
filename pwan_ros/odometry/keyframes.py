"""Keyframes: the registered scans later scans are tracked against (or a fixed reference cloud)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pwan_ros.geometry.se3 import rotation_angle, translation_norm
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.keyframe_tracker import PreparedCloud


@dataclass
class Keyframe:
    """cloud: the downsampled scan in its sensor frame, prepared for GICP. pose: (4, 4)
    T_odom_keyframe. index: 1, 2, ... in order of creation (0: the reference cloud)."""

    cloud: PreparedCloud
    pose: np.ndarray
    index: int
    is_reference: bool = False


class Keyframes:
    """The current keyframe and the rule that starts a new one (``keyframe_distance`` /
    ``keyframe_angle`` of motion from it; never while aligning to a reference cloud)."""

    def __init__(self, config: OdometryConfig):
        self.config = config
        self.reset()

    def reset(self) -> None:
        self.current: Optional[Keyframe] = None
        self._count = 0

    def set_reference(self, cloud: PreparedCloud) -> Keyframe:
        """Make the reference cloud (odom_frame coordinates) the fixed keyframe."""
        self.current = Keyframe(cloud, np.eye(4), 0, True)
        return self.current

    def start(self, cloud: PreparedCloud, pose: np.ndarray) -> Keyframe:
        """Make ``cloud`` at (4, 4) T_odom_sensor ``pose`` the new keyframe."""
        self._count += 1
        self.current = Keyframe(cloud, np.array(pose, dtype=np.float64), self._count)
        return self.current

    def due(self, t_kf_scan: np.ndarray) -> bool:
        """Whether a scan at (4, 4) T_keyframe_scan is far enough to become the next keyframe."""
        if self.current is None or self.current.is_reference:
            return False
        cfg = self.config
        return (translation_norm(t_kf_scan) >= cfg.keyframe_distance
                or rotation_angle(t_kf_scan) >= cfg.keyframe_angle)
