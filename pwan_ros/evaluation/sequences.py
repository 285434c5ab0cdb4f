"""Sequences of scans as users have them: a rosbag2, a KITTI odometry folder, a scan folder.

A :class:`SequenceSource` names one sequence (small and picklable: it travels to Ray workers)
and reads it: :meth:`~SequenceSource.scans` yields :class:`Scan` in stamp order,
:meth:`~SequenceSource.ground_truth` the poses of the sensor (or None), and
:meth:`~SequenceSource.static_frames` the bag's ``/tf_static``.

- ``bag``: scans on ``topic`` (sensor_msgs/PointCloud2, every field kept, per-point times
  included), ground truth on ``gt_topic`` or from ``poses`` (a pose file).
- ``kitti``: ``velodyne/*.bin`` (float32 x y z reflectance), ``times.txt`` (s), ``calib.txt``
  and ``poses.txt`` inside the folder or ``../../poses/<name>.txt`` (KITTI's own layout:
  ``dataset/sequences/00`` and ``dataset/poses/00.txt``). KITTI's poses are camera 0's,
  ``T_cam0_cam0(i)``; the lidar's are ``inv(Tr) @ P_i @ Tr`` with ``Tr = T_cam0_velodyne``
  from calib.txt. No pose file: the sequence runs without evaluation.
- ``folder``: ``.pcd`` / ``.pcd.gz`` / ``.npy`` files paired with ``poses`` by
  :class:`~pwan_ros.io.scan_folder.ScanFolder` (stamps from the pose file or ``rate_hz``).
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from pwan_ros.geometry.frame_graph import FrameGraph
from pwan_ros.io import bags as bag_io
from pwan_ros.io.pointcloud2 import PointCloud2Error, check_byte_order, read_cloud, stamp_seconds
from pwan_ros.io.scan_folder import ScanFolder, read_scan_file
from pwan_ros.io.trajectory import Trajectory, TrajectoryError, read_kitti, read_pose_file
from pwan_ros.params import POINTS_TOPIC

__all__ = ['Scan', 'SequenceSource', 'SequenceError', 'kitti_calibration', 'write_kitti_sequence']

KINDS = ('bag', 'kitti', 'folder')
KITTI_FRAME = 'velodyne'
FOLDER_FRAME = 'lidar'


class SequenceError(ValueError):
    """A sequence that cannot be read (the message names the file and the problem)."""


@dataclass(frozen=True)
class Scan:
    """One scan. xyz: (N, 3) in ``frame`` (metres, NaN rows possible); stamp: seconds;
    extras: (N,) structured array of the other fields (intensity, per-point time, ...);
    invalid: why a cloud that could not be decoded is skipped (xyz then empty), as the node
    skips it."""

    xyz: np.ndarray
    stamp: float
    extras: np.ndarray
    frame: str
    invalid: str = ''


@dataclass(frozen=True)
class SequenceSource:
    """kind: 'bag', 'kitti' or 'folder'; path: the bag, the KITTI sequence or the scan folder;
    name: the sequence's name in results (default: the folder's name); poses: a ground-truth
    pose file (folder: required; bag: instead of ``gt_topic``; kitti: instead of its own);
    a folder's default name is its parent's when the pose file sits there (``seq/scans``);
    topic / gt_topic / gt_frame / gt_parent: a bag's scan and ground-truth topics (TF ground
    truth: its child and parent frames); rate_hz: stamps of a folder whose pose file has none."""

    kind: str
    path: str
    name: str = ''
    poses: str = ''
    topic: str = POINTS_TOPIC
    gt_topic: str = '/ground_truth'
    gt_frame: Optional[str] = None
    gt_parent: Optional[str] = None
    rate_hz: float = 10.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise SequenceError(f'sequence kind {self.kind!r}: expected one of {", ".join(KINDS)}')
        if self.kind == 'folder' and not self.poses:
            raise SequenceError(f'{self.path}: a scan folder needs a pose file (--poses)')
        # absolute: Ray workers run in their own folders (and on other machines)
        object.__setattr__(self, 'path', os.path.abspath(self.path))
        if self.poses:
            object.__setattr__(self, 'poses', os.path.abspath(self.poses))
        if not self.name:
            object.__setattr__(self, 'name', self._default_name())

    def _default_name(self) -> str:
        """The folder's name; a scan folder whose pose file sits in its parent (``seq/scans``,
        ``seq/poses.txt``) is named after the parent."""
        here = pathlib.Path(self.path).resolve()
        if self.kind == 'folder' and pathlib.Path(self.poses).resolve().parent == here.parent:
            return here.parent.name
        return here.name

    # ------------------------------------------------------------------ reading
    def scans(self) -> Iterator[Scan]:
        """The scans in order."""
        if self.kind == 'bag':
            yield from self._bag_scans()
        elif self.kind == 'kitti':
            yield from self._kitti_scans()
        else:
            folder = self._folder()
            traj = folder.trajectory()
            for path, k in folder.pairs(traj, log=lambda _: None):
                yield _scan(read_scan_file(path), float(traj.stamps[k]), FOLDER_FRAME)

    def check(self) -> None:
        """Read what a run needs besides the scans (raises SequenceError / BagError naming the
        problem): the scans are there, and the ground truth when the sequence has one."""
        if self.count() < 2:
            raise SequenceError(f'{self.path}: fewer than 2 scans')
        if self.kind == 'kitti':
            self._kitti_times(self.count())
        self.ground_truth()

    def in_pose_file_frame(self, poses: np.ndarray) -> np.ndarray:
        """Estimated sensor poses (N, 4, 4), the first the identity, in the convention of the
        sequence's pose file: a KITTI sequence's are camera 0's (``Tr @ P @ inv(Tr)``, what
        KITTI's devkit compares), the others' the sensor's."""
        if self.kind != 'kitti':
            return poses
        tr = kitti_calibration(pathlib.Path(self.path) / 'calib.txt')
        return tr @ poses @ np.linalg.inv(tr)

    def count(self) -> int:
        """Scans in the sequence (without reading them)."""
        if self.kind == 'bag':
            return bag_io.require_topic(self.path, self.topic, [bag_io.CLOUD_TYPE]).count
        if self.kind == 'kitti':
            return len(self._kitti_files())
        return len(self._folder().files())

    def ground_truth(self) -> Optional[Trajectory]:
        """The sensor's (bag: the ground truth topic's) poses, or None when the sequence has
        none (a KITTI test sequence)."""
        try:
            if self.kind == 'kitti':
                return self._kitti_poses()
            if self.kind == 'folder':
                return self._folder().trajectory()
            if self.poses:
                return read_pose_file(self.poses)
            return bag_io.read_trajectory(self.path, self.gt_topic, self.gt_frame, self.gt_parent)
        except TrajectoryError as exc:
            raise SequenceError(str(exc)) from None

    def static_frames(self) -> FrameGraph:
        """The bag's ``/tf_static`` (empty for the other kinds: their scans are in the sensor
        frame, which is the base frame)."""
        graph, invalid = FrameGraph(), {}
        if self.kind == 'bag' and '/tf_static' in bag_io.bag_topics(self.path):
            for _, msg in bag_io.iter_decoded(self.path, '/tf_static'):
                graph.add_message(msg, invalid)
        return graph

    # ------------------------------------------------------------------ kinds
    def _bag_scans(self) -> Iterator[Scan]:
        for _, msg in bag_io.iter_decoded(self.path, self.topic, [bag_io.CLOUD_TYPE]):
            stamp = stamp_seconds(msg.header.stamp)  # as the node: the same motion model
            frame = msg.header.frame_id.lstrip('/')
            try:
                cloud = read_cloud(msg)
                check_byte_order(msg, cloud.xyz)
            except PointCloud2Error as exc:  # the node skips such a cloud
                empty = np.zeros((0, 3))
                yield Scan(empty, stamp, np.zeros(0, dtype=[]), frame, f'invalid cloud: {exc}')
                continue
            yield Scan(cloud.xyz, stamp, cloud.extras, frame)

    def _folder(self) -> ScanFolder:
        return ScanFolder(self.path, self.poses, rate_hz=self.rate_hz)

    def _kitti_files(self) -> list:
        folder = pathlib.Path(self.path) / 'velodyne'
        files = sorted(folder.glob('*.bin')) if folder.is_dir() else []
        if not files:
            raise SequenceError(f'{self.path}: no velodyne/*.bin scans (a KITTI sequence folder)')
        return files

    def _kitti_times(self, n: int) -> np.ndarray:
        path = pathlib.Path(self.path) / 'times.txt'
        try:
            times = np.loadtxt(path, dtype=np.float64, ndmin=1)
        except (OSError, ValueError) as exc:
            raise SequenceError(f'{path}: not a KITTI times file ({exc})') from None
        if len(times) != n or not np.all(np.diff(times) > 0):
            raise SequenceError(
                f'{path}: {len(times)} increasing stamps expected one per scan ({n} scans)'
            )
        return times

    def _kitti_scans(self) -> Iterator[Scan]:
        files = self._kitti_files()
        times = self._kitti_times(len(files))
        for path, stamp in zip(files, times):
            raw = np.fromfile(path, dtype=np.float32)
            if raw.size % 4:
                raise SequenceError(f'{path}: not a KITTI scan (float32 x y z reflectance rows)')
            raw = raw.reshape(-1, 4)
            extras = np.empty(len(raw), dtype=[('intensity', np.float32)])
            extras['intensity'] = raw[:, 3]
            yield Scan(raw[:, :3].astype(np.float64), float(stamp), extras, KITTI_FRAME)

    def _kitti_pose_file(self) -> Optional[pathlib.Path]:
        if self.poses:
            return pathlib.Path(self.poses)
        here = pathlib.Path(self.path).resolve()
        for path in (here / 'poses.txt', here.parent.parent / 'poses' / f'{here.name}.txt'):
            if path.is_file():
                return path
        return None

    def _kitti_poses(self) -> Optional[Trajectory]:
        path = self._kitti_pose_file()
        if path is None:
            return None
        n = len(self._kitti_files())
        cam = read_kitti(path)
        if len(cam) != n:
            raise SequenceError(f'{path}: {len(cam)} poses for {n} scans')
        tr = kitti_calibration(pathlib.Path(self.path) / 'calib.txt')
        lidar = np.linalg.inv(tr) @ cam.poses @ tr
        return Trajectory(self._kitti_times(n), lidar)


def kitti_calibration(path: pathlib.Path) -> np.ndarray:
    """(4, 4) ``T_cam0_velodyne`` from a KITTI ``calib.txt`` (its ``Tr`` line, 12 numbers)."""
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except OSError as exc:
        raise SequenceError(f'{path}: cannot read the KITTI calibration ({exc.strerror})')
    for line in lines:
        key, _, values = line.partition(':')
        if key.strip() == 'Tr':
            try:
                numbers = [float(v) for v in values.split()]
            except ValueError:
                numbers = []
            if len(numbers) != 12:
                break
            return np.vstack([np.reshape(numbers, (3, 4)), [0.0, 0.0, 0.0, 1.0]])
    raise SequenceError(f'{path}: no "Tr:" line of 12 numbers (T_cam0_velodyne)')


def write_kitti_sequence(root, scans, stamps, lidar_poses, tr, poses_path=None) -> None:
    """Write a KITTI odometry sequence (the reader's inverse): ``velodyne/%06d.bin`` of
    ``scans`` ((N, 4) x y z reflectance), ``times.txt`` (``stamps``, s), ``calib.txt`` with
    ``tr`` (4, 4) ``T_cam0_velodyne``, and the camera-0 poses ``Tr @ L0^-1 @ Li @ Tr^-1`` of
    ``lidar_poses`` ``T_world_lidar`` into ``poses_path`` (default ``root/poses.txt``)."""
    root = pathlib.Path(root)
    (root / 'velodyne').mkdir(parents=True)
    for k, scan in enumerate(scans):
        np.asarray(scan, dtype=np.float32).tofile(root / 'velodyne' / f'{k:06d}.bin')
    np.savetxt(root / 'times.txt', np.asarray(stamps, dtype=np.float64), fmt='%.6e')
    numbers = ' '.join(f'{v:.12e}' for v in np.asarray(tr)[:3].reshape(-1))
    (root / 'calib.txt').write_text(f'Tr: {numbers}\n')
    poses = np.asarray(lidar_poses, dtype=np.float64)
    cam = tr @ np.linalg.inv(poses[0]) @ poses @ np.linalg.inv(tr)  # as KITTI's devkit
    path = pathlib.Path(poses_path) if poses_path else root / 'poses.txt'
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, cam[:, :3].reshape(len(cam), 12), fmt='%.12e')


def _scan(encoded, stamp: float, frame: str) -> Scan:
    cloud = read_cloud(encoded)
    return Scan(cloud.xyz, stamp, cloud.extras, frame)
