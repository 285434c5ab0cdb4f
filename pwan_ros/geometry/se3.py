"""Small SE(3) helpers on 4x4 homogeneous matrices (metres, radians; REP-103).

Quaternions are (x, y, z, w) as in geometry_msgs. Conversions use scipy's Rotation.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation


def make_transform(rotation: np.ndarray, translation: np.ndarray) -> np.ndarray:
    """(3, 3) rotation + (3,) translation -> (4, 4) float64 homogeneous transform."""
    t = np.eye(4)
    t[:3, :3] = rotation
    t[:3, 3] = translation
    return t


def invert(t: np.ndarray) -> np.ndarray:
    """Inverse of a rigid (4, 4) transform."""
    out = np.eye(4)
    out[:3, :3] = t[:3, :3].T
    out[:3, 3] = -t[:3, :3].T @ t[:3, 3]
    return out


def rotation_angle(t: np.ndarray) -> float:
    """Rotation angle (radians, in [0, pi]) of a (4, 4) or (3, 3) transform."""
    r = t[:3, :3]
    # atan2 of sin and cos: accurate for small angles, where arccos of the trace is not.
    sin = 0.5 * np.linalg.norm([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    cos = 0.5 * (np.trace(r) - 1.0)
    return float(np.arctan2(sin, cos))


def translation_norm(t: np.ndarray) -> float:
    """Length (metres) of the translation of a (4, 4) transform."""
    return float(np.linalg.norm(t[:3, 3]))


def to_quaternion(t: np.ndarray) -> np.ndarray:
    """(4, 4) transform -> unit quaternion (x, y, z, w) of its rotation."""
    return Rotation.from_matrix(t[:3, :3]).as_quat()


def from_quaternion(q, translation=(0.0, 0.0, 0.0)) -> np.ndarray:
    """Quaternion (x, y, z, w) + translation -> (4, 4) transform. The quaternion is normalised."""
    q = np.asarray(q, dtype=float)
    norm = np.linalg.norm(q)
    if not np.isfinite(norm) or norm < 1e-9:
        raise ValueError(f'invalid quaternion {q.tolist()}')
    return make_transform(Rotation.from_quat(q / norm).as_matrix(), np.asarray(translation, float))


def project_rigid(t: np.ndarray) -> np.ndarray:
    """Nearest rigid transform (orthonormal rotation, via SVD) to a (4, 4) matrix."""
    u, _, vt = np.linalg.svd(t[:3, :3])
    r = u @ vt
    if np.linalg.det(r) < 0:
        u[:, -1] *= -1
        r = u @ vt
    return make_transform(r, t[:3, 3])


def scale_motion(delta: np.ndarray, factor: float) -> np.ndarray:
    """The rigid motion ``delta`` scaled by ``factor`` along its geodesic (rotation vector and
    translation both scaled): used to extrapolate a constant-velocity motion over a time step."""
    rotvec = Rotation.from_matrix(delta[:3, :3]).as_rotvec() * factor
    return make_transform(Rotation.from_rotvec(rotvec).as_matrix(), delta[:3, 3] * factor)


def transform_points(t: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a (4, 4) transform to (N, 3) points."""
    return points @ t[:3, :3].T + t[:3, 3]
