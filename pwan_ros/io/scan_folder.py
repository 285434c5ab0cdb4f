"""A folder of scan files (.pcd, .pcd.gz, .npy) paired with the poses of a pose file.

Scan <-> pose matching (``match``): ``name-index`` uses the last integer in the file name as the
0-based pose index (``full26.pcd.gz`` -> pose 26, the BALM convention); ``order`` pairs the
files, sorted with the numbers in their names compared as numbers, with the poses in order.
Stamps come from the pose file (TUM, or 4x4 blocks whose [3, 3] element holds the stamp) or, for
pose files without stamps (KITTI), from ``rate_hz``.
"""

from __future__ import annotations

import fnmatch
import pathlib
import re
from dataclasses import dataclass

import numpy as np

from pwan_ros.io.pcd import read_pcd
from pwan_ros.io.pointcloud2 import EncodedCloud, encode_cloud
from pwan_ros.io.trajectory import Trajectory, detect_pose_format, read_pose_file

__all__ = ['SCAN_EXTENSIONS', 'ScanFolder', 'read_npy', 'read_scan_file']

SCAN_EXTENSIONS = ('.pcd', '.pcd.gz', '.npy')


def read_npy(path: pathlib.Path) -> EncodedCloud:
    """A ``.npy`` scan (N, 3) or (N, 4+) of numbers: x y z (metres) [intensity], as the payload
    of a PointCloud2 (float32 fields); never unpickled. Raises ValueError naming the file."""
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f'{path}: not a readable .npy array ({exc})') from None
    if a.ndim != 2 or a.shape[1] < 3 or not np.issubdtype(a.dtype, np.number):
        raise ValueError(
            f'{path}: a scan is an (N, 3) or (N, 4+) array of numbers (x y z [intensity]), '
            f'got {a.dtype} {a.shape}'
        )
    extras = None
    if a.shape[1] >= 4:
        extras = np.empty(len(a), dtype=[('intensity', np.float32)])
        extras['intensity'] = a[:, 3]
    return encode_cloud(a[:, :3].astype(np.float32), extras)


def read_scan_file(path: pathlib.Path) -> EncodedCloud:
    """One scan file (.npy, .pcd, .pcd.gz) as a PointCloud2 payload."""
    path = pathlib.Path(path)
    return read_npy(path) if path.name.lower().endswith('.npy') else read_pcd(path)


def _natural(path: pathlib.Path) -> list:
    """Sort key of a file name with its digit runs compared as numbers: scan2 before scan10 (a
    plain sort put scan10 second and paired it with pose 2)."""
    return [
        (0, int(t), '') if t.isdigit() else (1, 0, t.lower())
        for t in re.split(r'(\d+)', path.name)
    ]


def _index(name: str) -> int:
    found = re.findall(r'\d+', name)
    if not found:
        raise ValueError(f'--match name-index: no number in file name {name!r}')
    return int(found[-1])


@dataclass(frozen=True)
class ScanFolder:
    """scans: folder of scan files; poses: pose file (TUM, KITTI or blocks), ``T_world_sensor``
    per scan; pose_format: 'auto' (detect), 'tum', 'kitti', 'blocks'; match: 'name-index' or
    'order'; pattern: glob of scan files (any case); rate_hz / start_time: stamps (Hz, s) of a
    pose file without them."""

    scans: str
    poses: str
    pose_format: str = 'auto'
    match: str = 'name-index'
    pattern: str = '*'
    rate_hz: float = 10.0
    start_time: float = 0.0

    def trajectory(self) -> Trajectory:
        fmt = detect_pose_format(self.poses) if self.pose_format == 'auto' else self.pose_format
        # a repeated TUM stamp is refused: it would silently drop a pose and shift the indices
        traj = read_pose_file(self.poses, fmt)
        if not traj.stamped:  # KITTI, plain 4x4 blocks: the scans' rate gives the stamps
            return Trajectory(self.start_time + traj.stamps / self.rate_hz, traj.poses)
        return traj

    def files(self) -> list:
        """The scan files matching ``pattern``, in natural order (numbers compared as numbers)."""
        folder = pathlib.Path(self.scans)
        if not folder.is_dir():
            raise ValueError(f'scan folder {folder} does not exist')
        files = sorted(  # extensions in any case: a camera card's FULL26.PCD too
            (
                p
                for p in folder.iterdir()
                if fnmatch.fnmatch(p.name.lower(), self.pattern.lower())
                and p.name.lower().endswith(SCAN_EXTENSIONS)
                and p.is_file()
            ),
            key=_natural,
        )
        if not files:
            raise ValueError(f'no .pcd/.pcd.gz/.npy files matching {self.pattern!r} in {folder}')
        return files

    def pairs(self, traj: Trajectory, log=print) -> list:
        """[(scan file, pose index into ``traj``)], in pose order."""
        files = self.files()
        if self.match == 'order':
            if len(files) > len(traj):
                raise ValueError(f'{len(files)} scans but only {len(traj)} poses in {self.poses}')
            if len(files) < len(traj):
                log(
                    f'warning: {len(files)} scans for {len(traj)} poses in {self.poses} (--match '
                    f'order pairs them with the first {len(files)} poses)'
                )
            return list(zip(files, range(len(files))))
        pairs = sorted(((f, _index(f.name)) for f in files), key=lambda p: p[1])
        bad = [f.name for f, k in pairs if k >= len(traj)]
        if bad:
            raise ValueError(f'{bad[0]}: pose index beyond the {len(traj)} poses in {self.poses}')
        for (a, i), (b, j) in zip(pairs, pairs[1:]):
            if i == j:
                raise ValueError(
                    f'{a.name} and {b.name} both map to pose {i} of {self.poses} (--match '
                    'name-index): one scan per pose'
                )
        return pairs
