"""Synthetic shapes for the core tests (made by the tests, no data files)."""

import numpy as np


def blob(n, seed=0):
    """A smooth, asymmetric closed 3-D surface sample (n, 3), about unit size."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(n, 3))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    r = 1 + 0.35 * np.sin(3 * u[:, 0]) * np.cos(2 * u[:, 1]) + 0.25 * u[:, 2] ** 2 + 0.15 * u[:, 0]
    return u * r[:, None] * np.array([1.0, 0.75, 0.55])


def knobbed_blob(n, seed=0):
    """:func:`blob` with a knob (a small sphere, a fifth of the points) on one side: no pose
    but the true one fits it (the ellipsoid-like blob alone is nearly symmetric under half turns,
    which sparse samples and outliers can make a tie)."""
    rng = np.random.default_rng(seed + 1000)
    u = rng.normal(size=(n // 5, 3))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return np.vstack((blob(n - n // 5, seed), u * 0.25 + np.array([0.85, 0.45, 0.2])))


def curve2d(n, seed=0):
    """An asymmetric closed 2-D curve sample (n, 2)."""
    rng = np.random.default_rng(seed)
    a = np.sort(rng.uniform(0, 2 * np.pi, n))
    r = 1 + 0.3 * np.cos(3 * a) + 0.15 * np.sin(a)
    return np.stack((r * np.cos(a), 0.7 * r * np.sin(a)), 1)


def rot3(ax, ay, az):
    from scipy.spatial.transform import Rotation

    return Rotation.from_euler('xyz', [ax, ay, az], degrees=True).as_matrix()


def rot_err_deg(r_est, r_true):
    c = (np.trace(r_est @ r_true.T) - 1) / 2
    return float(np.degrees(np.arccos(np.clip(c, -1, 1))))
