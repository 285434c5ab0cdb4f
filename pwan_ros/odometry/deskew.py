"""Motion compensation (deskew) of a spinning-LiDAR scan with the constant-velocity model.

A spinning sensor measures its points over a sweep (~0.1 s) while it moves; at 10 m/s a sweep
smears the scene by a metre. Each point, measured at ``offset`` seconds from the header stamp in
the sensor frame of that instant, is moved into the sensor frame of one reference instant (the
pipeline uses the median point time, as KISS-ICP uses mid-sweep) with the velocity of the motion
model. The motion over an offset dt is the model's own
extrapolation (:func:`pwan_ros.geometry.se3.scale_motion`): rotation exp(omega dt), translation
v dt, both in the sensor frame at the stamp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

__all__ = ['Velocity', 'velocity_of', 'motion_over', 'deskew']


@dataclass(frozen=True)
class Velocity:
    """Body velocity of the sensor: ``linear`` (3,) m/s and ``angular`` (3,) rad/s (rotation
    vector rate), in the sensor frame."""

    linear: np.ndarray
    angular: np.ndarray


def velocity_of(delta: np.ndarray, dt: float) -> Velocity:
    """The velocity of a (4, 4) motion ``delta`` (T_prev_current, sensor frame) over ``dt`` s."""
    return Velocity(delta[:3, 3] / dt, Rotation.from_matrix(delta[:3, :3]).as_rotvec() / dt)


def motion_over(velocity: Velocity, dt: float) -> np.ndarray:
    """(4, 4) pose of the sensor ``dt`` seconds later in its current frame: [exp(omega dt), v
    dt]."""
    out = np.eye(4)
    out[:3, :3] = Rotation.from_rotvec(velocity.angular * dt).as_matrix()
    out[:3, 3] = velocity.linear * dt
    return out


def deskew(points: np.ndarray, offsets: np.ndarray, velocity: Velocity) -> np.ndarray:
    """points (N, 3), each in the sensor frame at its ``offsets`` (N,) seconds from a reference
    instant -> (N, 3) in the sensor frame at that instant: p' = exp(omega dt) p + v dt (the
    point's pose :func:`motion_over` dt applied). NaN rows stay NaN."""
    dt = np.asarray(offsets, dtype=np.float64)[:, None]
    pts = np.asarray(points, dtype=np.float64)
    moved = Rotation.from_rotvec(dt * velocity.angular[None, :]).apply(pts)
    return moved + dt * velocity.linear[None, :]
