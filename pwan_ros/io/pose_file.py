"""Read a prior pose (``pwan_register --init POSE_FILE``): a homogeneous transform source ->
reference (``T_reference_source``), in the point files' units.

Formats: text (16 numbers, a 4 x 4 row by row, or 12: its top 3 x 4 rows as KITTI writes a pose;
2-D data: 9 or 6), spaces or commas, ``#`` comments; ``.npy`` (no pickles); ``.json``: the matrix
as nested lists, or an object whose ``transform`` is one (``pwan_register --json``'s output).
A rigid registration needs a rotation: a matrix within ``ROTATION_TOL`` of one (rounding in a
text file) is projected onto it, anything else refused. Problems raise
:class:`pwan_ros.core.errors.PwanInputError` with one readable line.
"""

from __future__ import annotations

import json
import os

import numpy as np

from pwan_ros.core.errors import PwanInputError

__all__ = ['ROTATION_TOL', 'read_pose']

#: largest |R^T R - I| (and |det R - 1|) taken as a rotation written with rounded digits
ROTATION_TOL = 1e-3


def read_pose(path: str, dim: int = 3, rigid: bool = True) -> np.ndarray:
    """The (dim+1, dim+1) transform in ``path`` (see the module doc); ``rigid``: its linear part
    must be a rotation (returned exactly orthonormal)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise PwanInputError(f'{path}: no such pose file')
    values = _numbers(path)
    n = dim + 1
    if values.size == n * n:
        pose = values.reshape(n, n)
    elif values.size == dim * n:  # the top rows only (KITTI poses)
        pose = np.vstack((values.reshape(dim, n), np.eye(n)[-1]))
    else:
        raise PwanInputError(
            f'{path}: {values.size} numbers; a {dim}-D pose is a {n}x{n} matrix '
            f'({n * n} numbers) or its top {dim} rows ({dim * n})'
        )
    if not np.isfinite(pose).all():
        raise PwanInputError(f'{path}: the pose contains NaN or inf')
    if np.abs(pose[-1] - np.eye(n)[-1]).max() > 1e-9:
        raise PwanInputError(f'{path}: the last row of a homogeneous pose must be {np.eye(n)[-1]}')
    return _rotation_checked(pose, path) if rigid else pose


def _numbers(path: str) -> np.ndarray:
    """Every number of the file, in order (float64)."""
    ext = os.path.splitext(path.lower())[1]
    try:
        if ext == '.npy':
            return np.asarray(np.load(path, allow_pickle=False), dtype=np.float64).ravel()
        with open(path, encoding='utf-8') as fh:
            text = fh.read()
        if ext == '.json':
            data = json.loads(text)
            data = data.get('transform') if isinstance(data, dict) else data
            return np.asarray(data, dtype=np.float64).ravel()
        rows = [ln.split('#', 1)[0].replace(',', ' ') for ln in text.splitlines()]
        return np.array([float(v) for ln in rows for v in ln.split()], dtype=np.float64)
    except (OSError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise PwanInputError(f'{path}: cannot read a pose ({exc})') from None


def _rotation_checked(pose: np.ndarray, path: str) -> np.ndarray:
    """``pose`` with its linear part projected onto the nearest rotation (SVD), when it is one up
    to ``ROTATION_TOL``."""
    dim = len(pose) - 1
    r = pose[:dim, :dim]
    off = max(np.abs(r.T @ r - np.eye(dim)).max(), abs(np.linalg.det(r) - 1.0))
    if off > ROTATION_TOL:
        raise PwanInputError(
            f'{path}: the pose is not rigid (its {dim}x{dim} part is {off:.2g} from a rotation); '
            'a rigid registration starts from a rotation and a translation'
        )
    u, _, vt = np.linalg.svd(r)
    out = pose.copy()
    out[:dim, :dim] = u @ vt
    return out
