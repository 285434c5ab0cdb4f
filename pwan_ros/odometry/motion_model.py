"""Constant-velocity motion prediction for warm-starting scan registration."""

from __future__ import annotations

from typing import Optional

import numpy as np

from pwan_ros.geometry.se3 import invert, project_rigid, scale_motion
from pwan_ros.odometry.deskew import Velocity, velocity_of


class ConstantVelocityModel:
    """Predicts the next sensor pose from the last two accepted poses (metres, radians).

    The motion between the last two accepted poses is extrapolated to the new stamp along its
    geodesic, scaled by the ratio of the time steps, over at most ``max_extrapolation`` steps or
    ``max_gap_s`` seconds, whichever is longer: a vehicle keeps its velocity through a short
    blackout (about a second), while a long gap after dropped scans does not fling the
    prediction away.
    """

    def __init__(self, max_extrapolation: float = 3.0, max_gap_s: float = 1.0):
        self.max_extrapolation = max_extrapolation
        self.max_gap_s = max_gap_s
        self.reset()

    def reset(self) -> None:
        self._pose: Optional[np.ndarray] = None
        self._stamp: Optional[float] = None
        self._delta = np.eye(4)  # last motion, in the previous pose's frame
        self._dt: Optional[float] = None

    @property
    def pose(self) -> Optional[np.ndarray]:
        return self._pose

    @property
    def stamp(self) -> Optional[float]:
        """Stamp (s) of the last accepted pose, None before the first."""
        return self._stamp

    @property
    def period(self) -> Optional[float]:
        """Seconds between the last two accepted poses while predicting, else None."""
        return self._dt if self.predicting else None

    @property
    def predicting(self) -> bool:
        """Whether it extrapolates a velocity (two updates since the last hold)."""
        return self._dt is not None and self._dt > 0.0

    def velocity(self) -> Optional[Velocity]:
        """The extrapolated body velocity (sensor frame), None when not predicting."""
        return velocity_of(self._delta, self._dt) if self.predicting else None

    def predict(self, stamp: float) -> np.ndarray:
        """Predicted (4, 4) pose at ``stamp`` (seconds). Identity before the first update."""
        if self._pose is None:
            return np.eye(4)
        if self._dt is None or self._dt <= 0.0:
            return self._pose.copy()
        cap = max(self.max_extrapolation, self.max_gap_s / self._dt)
        factor = min(max((stamp - self._stamp) / self._dt, 0.0), cap)
        return self._pose @ scale_motion(self._delta, factor)

    def update(self, pose: np.ndarray, stamp: float) -> None:
        """Record an accepted (4, 4) pose at ``stamp`` (seconds). The pose is re-orthonormalised:
        rigid inverses use the transpose, and rounding would otherwise compound scan by scan."""
        pose = project_rigid(np.asarray(pose, dtype=np.float64))
        if self._pose is not None and stamp > self._stamp:
            self._delta = invert(self._pose) @ pose
            self._dt = stamp - self._stamp
        self._pose = pose
        self._stamp = float(stamp)

    def hold(self, stamp: float) -> None:
        """Forget the velocity (e.g. after a rejected registration): predict standing still."""
        self._delta = np.eye(4)
        self._dt = None
