"""Timestamped 6-DoF trajectories and pose files (TUM, KITTI, 4x4 blocks).

A :class:`Trajectory` holds ``stamps`` (N,) float64 seconds and ``poses`` (N, 4, 4) float64
homogeneous transforms ``T_parent_child`` (e.g. base_link in odom, REP-105), metres.

File formats:
- TUM: ``stamp tx ty tz qx qy qz qw`` per line (``#`` comments allowed).
- KITTI: 12 numbers per line, the first three rows of the 4x4 matrix, row-major; no stamps
  (``read_kitti`` takes them separately, default 0, 1, 2, ...).
- blocks: 4 lines per pose forming a 4x4 matrix, comma or space separated; with
  ``stamp_in_corner`` element [3, 3] holds the stamp (it is replaced by 1), as in the BALM
  ``alidarPose.csv`` files; plain homogeneous matrices (every corner 1) have no stamps.

A trajectory read without stamps (KITTI, plain blocks) has ``stamped`` False and the stamps 0,
1, 2, ... (its poses can only be matched line by line, never by time).
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

__all__ = [
    'Trajectory',
    'TrajectoryError',
    'pose_from_tq',
    'tq_from_pose',
    'read_tum',
    'write_tum',
    'read_kitti',
    'write_kitti',
    'read_blocks',
    'read_pose_file',
    'detect_pose_format',
    'POSE_FORMATS',
]

POSE_FORMATS = ('tum', 'kitti', 'blocks')


class TrajectoryError(ValueError):
    """A pose file or trajectory that cannot be used (message says why)."""


def pose_from_tq(t, q_xyzw) -> np.ndarray:
    """4x4 pose(s) from translation(s) (..., 3) and unit quaternion(s) (..., 4) in x, y, z, w
    order."""
    t = np.asarray(t, dtype=np.float64)
    q = np.asarray(q_xyzw, dtype=np.float64)
    out = np.zeros(t.shape[:-1] + (4, 4))
    out[..., :3, :3] = (
        Rotation.from_quat(q.reshape(-1, 4)).as_matrix().reshape(t.shape[:-1] + (3, 3))
    )
    out[..., :3, 3] = t
    out[..., 3, 3] = 1.0
    return out


def tq_from_pose(poses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(translations (N, 3), quaternions (N, 4) x, y, z, w with w >= 0) from (N, 4, 4) poses."""
    poses = np.asarray(poses, dtype=np.float64).reshape(-1, 4, 4)
    q = Rotation.from_matrix(poses[:, :3, :3]).as_quat()
    q[q[:, 3] < 0] *= -1.0
    return poses[:, :3, 3].copy(), q


@dataclass(frozen=True)
class Trajectory:
    """Poses ``T_parent_child`` (N, 4, 4) at strictly increasing ``stamps`` (N,) in seconds;
    ``stamped`` False: the file had no stamps and ``stamps`` are the pose indices 0, 1, 2, ..."""

    stamps: np.ndarray
    poses: np.ndarray
    stamped: bool = True

    def __post_init__(self):
        stamps = np.asarray(self.stamps, dtype=np.float64).reshape(-1)
        poses = np.asarray(self.poses, dtype=np.float64).reshape(-1, 4, 4)
        if stamps.shape[0] != poses.shape[0]:
            raise TrajectoryError(f'{stamps.shape[0]} stamps but {poses.shape[0]} poses')
        if stamps.size > 1 and not np.all(np.diff(stamps) > 0):
            raise TrajectoryError('trajectory stamps must be strictly increasing')
        if not np.all(np.isfinite(poses)):
            raise TrajectoryError('trajectory contains non-finite poses')
        object.__setattr__(self, 'stamps', stamps)
        object.__setattr__(self, 'poses', poses)

    def __len__(self) -> int:
        return int(self.stamps.shape[0])

    @property
    def positions(self) -> np.ndarray:
        """(N, 3) translations, metres."""
        return self.poses[:, :3, 3]

    def path_length(self) -> float:
        """Travelled distance along the positions, metres."""
        return (
            float(np.linalg.norm(np.diff(self.positions, axis=0), axis=1).sum())
            if len(self) > 1
            else 0.0
        )

    def replaced_by(self, other: 'Trajectory') -> 'Trajectory':
        """This trajectory with the poses of ``other`` at the stamps both have (to the
        nanosecond) in place of its own: final estimates over live ones."""
        mine = np.round(self.stamps * 1e9).astype(np.int64)
        theirs = dict(zip(np.round(other.stamps * 1e9).astype(np.int64).tolist(), other.poses))
        poses = np.array([theirs.get(ns, p) for ns, p in zip(mine.tolist(), self.poses)])
        return Trajectory(self.stamps.copy(), poses.reshape(-1, 4, 4), self.stamped)

    @classmethod
    def from_unsorted(cls, stamps, poses) -> 'Trajectory':
        """Sort by stamp and drop repeated stamps (keeping the first)."""
        stamps = np.asarray(stamps, dtype=np.float64).reshape(-1)
        poses = np.asarray(poses, dtype=np.float64).reshape(-1, 4, 4)
        order = np.argsort(stamps, kind='stable')
        stamps, poses = stamps[order], poses[order]
        keep = np.ones(stamps.shape[0], dtype=bool)
        keep[1:] = np.diff(stamps) > 0
        return cls(stamps[keep], poses[keep])


_SPLIT = re.compile(r'[,\s]+')


def _numeric_rows(path: pathlib.Path) -> list[list[float]]:
    return [row for _, row in _numbered_rows(path)]


def _numbered_rows(path: pathlib.Path) -> list[tuple[int, list[float]]]:
    """(line number, numbers) of each data line of a pose file."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as exc:
        reason = 'is a directory' if pathlib.Path(path).is_dir() else (exc.strerror or str(exc))
        raise TrajectoryError(f'cannot read pose file {path}: {reason}') from None
    except UnicodeDecodeError:
        raise TrajectoryError(f'cannot read pose file {path}: not a text file') from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        try:
            rows.append((lineno, [float(v) for v in _SPLIT.split(line) if v]))
        except ValueError as exc:
            raise TrajectoryError(f'{path}:{lineno}: not a row of numbers: {line[:60]!r}') from exc
    if not rows:
        raise TrajectoryError(f'pose file {path} holds no poses')
    return rows


def read_tum(path, unique: bool = False) -> Trajectory:
    """Read a TUM file (``stamp tx ty tz qx qy qz qw`` per line). Lines are sorted by stamp; a
    repeated stamp keeps its first line, or with ``unique`` is a :class:`TrajectoryError`."""
    numbered = _numbered_rows(path)
    rows = [r for _, r in numbered]
    bad = [i for i, r in enumerate(rows) if len(r) != 8]
    if bad:
        raise TrajectoryError(
            f'{path}:{numbered[bad[0]][0]}: {len(rows[bad[0]])} numbers; TUM lines need 8'
        )
    arr = np.array(rows)
    _check_tum_rows(path, arr, [n for n, _ in numbered])
    if unique:
        values, counts = np.unique(arr[:, 0], return_counts=True)
        if (counts > 1).any():
            stamp = values[counts > 1][0]
            lines = [str(n) for (n, _), s in zip(numbered, arr[:, 0]) if s == stamp]
            raise TrajectoryError(
                f'{path}: stamp {float(stamp):.15g} repeats on lines {", ".join(lines)}; '
                'each pose needs its own stamp'
            )
    return Trajectory.from_unsorted(arr[:, 0], pose_from_tq(arr[:, 1:4], arr[:, 4:8]))


def _check_tum_rows(path, arr: np.ndarray, lines: list[int]) -> None:
    """A :class:`TrajectoryError` naming the first TUM line with a non-finite number or a zero
    quaternion."""
    finite = np.isfinite(arr).all(axis=1)
    zero_q = np.linalg.norm(np.where(finite[:, None], arr[:, 4:8], 1.0), axis=1) < 1e-12
    bad = np.flatnonzero(~finite | zero_q)
    if bad.size:
        i = int(bad[0])
        why = 'non-finite numbers' if not finite[i] else 'zero quaternion (qx qy qz qw all 0)'
        raise TrajectoryError(f'{path}:{lines[i]}: {why}')


def _exact(values) -> str:
    """Numbers as the shortest text that reads back the same double (map coordinates such as a
    UTM northing keep every digit)."""
    return ' '.join(repr(float(v)) for v in values)


def write_tum(path, traj: Trajectory) -> pathlib.Path:
    """Write a TUM file atomically (stamps with 9 decimals, i.e. nanoseconds; poses exact)."""
    from pwan_ros.io.atomic import write_text

    path = pathlib.Path(path)
    t, q = tq_from_pose(traj.poses)
    write_text(
        path,
        ''.join(f'{s:.9f} ' + _exact((*ti, *qi)) + '\n' for s, ti, qi in zip(traj.stamps, t, q)),
    )
    return path


ROTATION_TOL = 1e-3  # max |R^T R - I| of a rotation block read from a file


def _check_rotations(path, mats: np.ndarray, lines: list[int]) -> None:
    """A :class:`TrajectoryError` naming the first line whose 3x3 block is not a rotation."""
    rot = mats[:, :3, :3]
    finite = np.isfinite(mats).all(axis=(1, 2))
    safe = np.where(finite[:, None, None], rot, np.eye(3))
    err = np.abs(np.einsum('nji,njk->nik', safe, safe) - np.eye(3)).max(axis=(1, 2))
    det = np.linalg.det(safe)
    bad = np.flatnonzero(~finite | (err >= ROTATION_TOL) | (det <= 0))
    if bad.size:
        i = int(bad[0])
        why = (
            'non-finite numbers'
            if not finite[i]
            else f'rotation block is not a rotation (|R^T R - I| = {err[i]:.3g}, '
            f'det = {det[i]:.3g})'
        )
        raise TrajectoryError(f'{path}:{lines[i]}: {why}')


def read_kitti(path, stamps=None) -> Trajectory:
    """Read a KITTI pose file; ``stamps`` (N,) seconds, default none (``stamped`` False: 0, 1,
    2, ...)."""
    numbered = _numbered_rows(path)
    rows = [r for _, r in numbered]
    bad = [i for i, r in enumerate(rows) if len(r) != 12]
    if bad:
        raise TrajectoryError(
            f'{path}:{numbered[bad[0]][0]}: {len(rows[bad[0]])} numbers; KITTI lines need 12'
        )
    poses = np.tile(np.eye(4), (len(rows), 1, 1))
    poses[:, :3, :] = np.array(rows).reshape(-1, 3, 4)
    _check_rotations(path, poses, [n for n, _ in numbered])
    stamped = stamps is not None
    stamps = np.asarray(stamps, np.float64) if stamped else np.arange(len(rows), dtype=np.float64)
    if stamps.shape[0] != len(rows):
        raise TrajectoryError(f'{path}: {len(rows)} KITTI poses but {stamps.shape[0]} stamps')
    return _trajectory(path, stamps, poses, stamped)


def write_kitti(path, traj: Trajectory) -> pathlib.Path:
    """Write a KITTI pose file atomically (the 3x4 blocks, exact; no stamps)."""
    from pwan_ros.io.atomic import write_text

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, ''.join(_exact(row) + '\n' for row in traj.poses[:, :3, :].reshape(-1, 12)))
    return path


def read_blocks(path, stamp_in_corner: bool = True) -> Trajectory:
    """Read 4x4 pose blocks (4 lines each). With ``stamp_in_corner`` element [3, 3] is the stamp
    (seconds) unless it is 1 in every block (plain matrices); otherwise none (``stamped``
    False: 0, 1, 2, ...)."""
    numbered = _numbered_rows(path)
    rows = [r for _, r in numbered]
    if len(rows) % 4 or any(len(r) != 4 for r in rows):
        raise TrajectoryError(f'{path}: expected blocks of 4 lines with 4 numbers each')
    mats = np.array(rows).reshape(-1, 4, 4)
    _check_rotations(path, mats, [n for n, _ in numbered[::4]])
    stamped = stamp_in_corner and not (mats.shape[0] > 1 and np.all(mats[:, 3, 3] == 1.0))
    if stamped:
        stamps = mats[:, 3, 3].copy()
        mats[:, 3, 3] = 1.0
    else:  # plain homogeneous matrices: no stamps
        stamps = np.arange(mats.shape[0], dtype=np.float64)
    return _trajectory(path, stamps, mats, stamped, 'element [3, 3] of each block' * stamped)


def _trajectory(path, stamps, poses, stamped: bool, stamps_from: str = '') -> Trajectory:
    """A :class:`Trajectory` whose errors name the file ``path`` (and ``stamps_from``, where the
    stamps were read)."""
    try:
        return Trajectory(stamps, poses, stamped)
    except TrajectoryError as exc:
        where = f' (stamps read from {stamps_from})' if stamps_from else ''
        raise TrajectoryError(f'{path}: {exc}{where}') from None


def detect_pose_format(path) -> str:
    """'tum', 'kitti' or 'blocks' from the number of columns (8, 12, 4)."""
    width = len(_numeric_rows(path)[0])
    fmt = {8: 'tum', 12: 'kitti', 4: 'blocks'}.get(width)
    if fmt is None:
        raise TrajectoryError(
            f'{path}: cannot tell the pose format from {width} columns '
            '(TUM has 8, KITTI 12, 4x4 blocks 4)'
        )
    return fmt


def read_pose_file(path, fmt: str = 'auto') -> Trajectory:
    """Read TUM, KITTI or 4x4-block pose files; ``fmt='auto'`` decides from the column count. A
    repeated TUM stamp is an error (one of the two poses would be dropped unseen)."""
    if fmt == 'auto':
        fmt = detect_pose_format(path)
    if fmt == 'tum':
        return read_tum(path, unique=True)
    if fmt == 'kitti':
        return read_kitti(path)
    if fmt == 'blocks':
        return read_blocks(path)
    raise TrajectoryError(f'unknown pose format {fmt!r}; expected one of {POSE_FORMATS} or auto')
