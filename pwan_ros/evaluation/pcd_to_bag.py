"""Convert a folder of PCD scans plus a pose file into a rosbag2 (mcap) for replay/evaluation.

Each scan becomes a PointCloud2 on ``--topic`` (all PCD fields kept, frame ``--frame-id``; a
``.npy`` scan of N x 3 or N x 4+ numbers is x y z [intensity], metres, the layout of Python
datasets such as nuScenes' keyframes);
its pose (``T_world_sensor``) a nav_msgs/Odometry on ``--gt-topic``; ``/clock`` is written
at ``--clock-hz``. Stamps come from the pose file (TUM, or 4x4 blocks whose [3, 3] element
holds the stamp) or, for pose files without stamps (KITTI), from ``--rate-hz``.

Scan <-> pose matching (``--match``): ``name-index`` (default) uses the last integer in the
file name as the 0-based pose index (``full26.pcd.gz`` -> pose 26, the BALM convention);
``order`` pairs the sorted files with the poses in order.

    pwan_pcd2bag --scans DIR --poses POSES --output BAG [--pose-format auto|tum|kitti|blocks]
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np

from pwan_ros.io import bags as bag_io
from pwan_ros.io.scan_folder import ScanFolder, read_scan_file
from pwan_ros.params import POINTS_TOPIC, REQUIRED, check, param

__all__ = ['ConvertConfig', 'ConvertResult', 'convert']

MAX_STAMP_S = 2**31  # builtin_interfaces/Time: int32 seconds, no negative times


@dataclass(frozen=True)
class ConvertConfig:
    """Converter options (CLI flags: same names with dashes)."""

    scans: str = param(REQUIRED, 'folder of .pcd / .pcd.gz / .npy files, one scan each')
    poses: str = param(REQUIRED, 'pose file (TUM, KITTI or blocks), T_world_sensor per scan')
    output: str = param(REQUIRED, 'rosbag2 directory to create (must not exist)')
    pose_format: str = param(
        'auto',
        'format of the pose file; auto = detect',
        choices=('auto', 'tum', 'kitti', 'blocks'),
    )
    match: str = param(
        'name-index',
        'scan-to-pose pairing: the last number in the file name indexes the poses, '
        'or the order of the names with numbers compared as numbers (scan2 before scan10)',
        choices=('name-index', 'order'),
    )
    pattern: str = param(
        '*', 'glob of scan files (.pcd, .pcd.gz, .npy) inside the scans folder (any case)'
    )
    rate_hz: float = param(
        10.0,
        'scan rate for stamps when the pose file has none (KITTI, plain 4x4 blocks; Hz)',
        0.0,
        1000.0,
        low_open=True,
    )
    start_time: float = param(0.0, 'first stamp when rate_hz is used (s)', 0.0)
    frame_id: str = param('base_link', 'frame of the clouds (the sensor)', fmt='frame_name')
    world_frame: str = param('world', 'parent frame of the ground truth poses', fmt='frame_name')
    topic: str = param(POINTS_TOPIC, 'topic of the clouds (sensor_msgs/PointCloud2)', fmt='topic')
    gt_topic: str = param(
        '/ground_truth', 'topic of the ground truth (nav_msgs/Odometry)', fmt='topic'
    )
    clock_hz: float = param(
        100.0, '/clock messages per second of bag time', 0.0, 100_000.0, low_open=True
    )
    storage: str = param('mcap', 'rosbag2 storage plugin', choices=('mcap', 'sqlite3'))

    def __post_init__(self):
        check(self, rules=lambda c: bag_io.topic_rules(c.topic, 'topic', c.gt_topic))


@dataclass(frozen=True)
class ConvertResult:
    bag: pathlib.Path
    scans: int
    mean_points: float
    duration_s: float


def _folder(cfg: ConvertConfig) -> ScanFolder:
    return ScanFolder(
        cfg.scans, cfg.poses, cfg.pose_format, cfg.match, cfg.pattern, cfg.rate_hz, cfg.start_time
    )


def convert(cfg: ConvertConfig, log=print) -> ConvertResult:
    """Write the bag; raises ValueError/PcdError/TrajectoryError/BagError with the problem."""
    folder = _folder(cfg)
    traj = folder.trajectory()
    pairs = folder.pairs(traj, log)
    for path, k in pairs:
        if not 0.0 <= traj.stamps[k] < MAX_STAMP_S:
            raise ValueError(
                f'{cfg.poses}: stamp {traj.stamps[k]:g} s of pose {k} ({path.name}) is outside '
                f'0 .. {MAX_STAMP_S} s (ROS time)'
            )
    n_points = _write(cfg, pairs, traj, log)
    duration = traj.stamps[pairs[-1][1]] - traj.stamps[pairs[0][1]]
    return ConvertResult(
        bag=pathlib.Path(cfg.output),
        scans=len(pairs),
        mean_points=float(np.mean(n_points)),
        duration_s=float(duration),
    )


def _write(cfg: ConvertConfig, pairs: list, traj, log) -> list:
    """Write the bag: /clock at ``clock_hz``, each scan with its ground-truth odometry. Returns
    the scans' point counts."""
    store = bag_io.typestore()
    cloud_cls, field_cls = (
        store.types['sensor_msgs/msg/PointCloud2'],
        store.types['sensor_msgs/msg/PointField'],
    )
    clock_step = int(round(1e9 / cfg.clock_hz))
    next_clock, n_points = None, []
    with bag_io.BagWriter(cfg.output, storage=cfg.storage) as writer:
        for path, k in pairs:
            stamp_ns = int(round(traj.stamps[k] * 1e9))
            if next_clock is None:
                next_clock = stamp_ns
            while next_clock <= stamp_ns:
                writer.write('/clock', next_clock, bag_io.clock(next_clock))
                next_clock += clock_step
            enc = read_scan_file(path)
            msg = cloud_cls(
                header=bag_io.header(stamp_ns, cfg.frame_id),
                height=enc.height,
                width=enc.width,
                fields=[
                    field_cls(name=f.name, offset=f.offset, datatype=f.datatype, count=f.count)
                    for f in enc.fields
                ],
                is_bigendian=False,
                point_step=enc.point_step,
                row_step=enc.row_step,
                data=enc.data,
                is_dense=enc.is_dense,
            )
            writer.write(
                cfg.gt_topic,
                stamp_ns,
                bag_io.odometry(stamp_ns, traj.poses[k], cfg.world_frame, cfg.frame_id),
            )
            writer.write(cfg.topic, stamp_ns, msg)
            n_points.append(enc.width * enc.height)
            log(f'{path.name}: pose {k}, {n_points[-1]} points, stamp {stamp_ns * 1e-9:.3f}')
    return n_points
