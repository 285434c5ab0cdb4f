"""The starts of a multi-start (rigid / affine): initial rotations (:func:`start_rotations`)
and, in 3-D, each rotation's own pose, translated by votes (:func:`own_poses`, :mod:`votes`).
The global search's rotation hypotheses start from these too."""

from __future__ import annotations

import itertools

import numpy as np

from ..preprocess import median_spacing
from .votes import start_translations

__all__ = ['own_poses', 'start_rotations']


def start_rotations(dim: int, count: int) -> list:
    """``count`` initial rotations (d, d), identity first: 2-D evenly spaced angles; 3-D the
    rotation group of the cube ordered by angle (90, 120, 180 deg), then random (seeded)."""
    if dim == 2:
        out = []
        for i in range(count):
            a = 2 * np.pi * i / count
            out.append(np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]))
        return out
    mats = []
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1, -1), repeat=3):
            m = np.zeros((3, 3))
            for i, j in enumerate(perm):
                m[i, j] = signs[i]
            if np.linalg.det(m) > 0:
                mats.append(m)
    mats.sort(
        key=lambda m: (
            round(float(np.arccos(np.clip((np.trace(m) - 1) / 2, -1, 1))), 6),
            tuple(m.ravel()),
        )
    )
    rng = np.random.default_rng(12345)
    while len(mats) < count:
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        w, x, y, z = q
        mats.append(
            np.array(
                [
                    [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                    [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                    [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
                ]
            )
        )
    return mats[:count]


def own_poses(ys: np.ndarray, xs: np.ndarray, rots: list, seed: int):
    """[(a (3, 3), t (3,))] per start rotation in the solver's convention (``ys @ a + t``): the
    rotation with the translation most point pairs vote for (:func:`votes.start_translations`,
    cells of 2 x the median spacing of ``xs``); None for 2-D or when the caller gave no
    rotations."""
    if ys.shape[1] != 3 or rots[0] is None:
        return None
    cell = 2.0 * median_spacing(xs)
    return [
        (rot.T.copy(), t)
        for rot, (t, _) in zip(rots, start_translations(ys, xs, rots, cell, seed + 3))
    ]
