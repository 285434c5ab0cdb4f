"""Motion compensation (deskew) on a fast simulated drive, side by side in one process.

A simulated spinning LiDAR (``SimConfig(sweep=True)``: the sensor moves during each revolution,
every point carries its time in a ``t`` field, Ouster convention) drives at ``--speed`` m/s,
10 Hz, along the S-shaped street path. Runs, on the same scans:

  pwan_ros adaptive, deskew auto   (the default: per-point times -> motion-compensated)
  pwan_ros adaptive, deskew off
  KISS-ICP, deskew on / off         (if installed; its poses are mid-sweep poses, so it is
                                     evaluated against the ground truth half a sweep later)

Prints ATE RMSE, RPE (per frame and drift %), and median latency per run.

    python bench/bench_deskew.py --scans 80 --speed 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table, write_results  # noqa: E402

from pwan_ros.evaluation.lidar_sim import SimConfig, ground_truth_pose, simulate  # noqa: E402
from pwan_ros.evaluation.metrics import evaluate  # noqa: E402
from pwan_ros.evaluation.offline import kiss_icp_available  # noqa: E402
from pwan_ros.io.point_times import point_times  # noqa: E402
from pwan_ros.io.trajectory import Trajectory  # noqa: E402
from pwan_ros.odometry.config import OdometryConfig  # noqa: E402
from pwan_ros.odometry.pipeline import OdometryPipeline  # noqa: E402


def run_pwan(scans, deskew: str):
    pipe = OdometryPipeline(OdometryConfig(deskew=deskew))
    poses, times, deskewed = [], [], 0
    for sc in scans:
        stamp = sc.stamp_ns * 1e-9
        offsets = point_times(sc.extras, stamp).offsets
        t0 = time.perf_counter()
        est = pipe.process(sc.xyz, stamp, offsets)
        times.append((time.perf_counter() - t0) * 1e3)
        poses.append(est.pose)
        deskewed += int(est.deskewed)
    return np.array(poses), times, deskewed


def run_kiss(scans, deskew: bool, max_range: float):
    from kiss_icp.config import KISSConfig
    from kiss_icp.kiss_icp import KissICP

    cfg = KISSConfig()
    cfg.data.max_range = max_range
    cfg.data.deskew = deskew
    cfg.mapping.voxel_size = max_range / 100.0
    odo = KissICP(cfg)
    poses, times = [], []
    for sc in scans:
        t = sc.extras['t'].astype(np.float64) * 1e-9
        t0 = time.perf_counter()
        odo.register_frame(sc.xyz.astype(np.float64), t)
        times.append((time.perf_counter() - t0) * 1e3)
        poses.append(np.asarray(odo.last_pose).copy())
    return np.array(poses), times, len(scans) if deskew else 0


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('--results', default='results/deskew')
    p.add_argument('--scans', type=int, default=80)
    p.add_argument('--speed', type=float, default=10.0, help='sensor speed (m/s)')
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args(argv)
    cfg = SimConfig(scans=args.scans, speed=args.speed, sweep=True, seed=args.seed)
    t0 = time.perf_counter()
    scans = list(simulate(cfg))
    print(
        f'simulated {len(scans)} scans at {args.speed:g} m/s in {time.perf_counter() - t0:.1f} s',
        file=sys.stderr,
    )
    stamps = np.array([sc.stamp_ns * 1e-9 for sc in scans])
    start = cfg.start_time

    def gt_at(shift: float) -> Trajectory:
        return Trajectory(
            stamps, np.array([ground_truth_pose(s - start + shift, cfg)[0] for s in stamps])
        )

    sweep_s = 1.0 / cfg.rate_hz
    runs = [
        ('pwan_ros adaptive, deskew auto', lambda: run_pwan(scans, 'auto'), 0.0),
        ('pwan_ros adaptive, deskew off', lambda: run_pwan(scans, 'off'), 0.0),
    ]
    if kiss_icp_available():
        runs += [
            ('KISS-ICP, deskew on', lambda: run_kiss(scans, True, cfg.max_range), 0.5 * sweep_s),
            ('KISS-ICP, deskew off', lambda: run_kiss(scans, False, cfg.max_range), 0.0),
        ]
    rows = []
    for name, fn, shift in runs:
        print(f'{name} ...', file=sys.stderr)
        poses, times, deskewed = fn()
        gt = gt_at(shift)
        r = evaluate(Trajectory(stamps, poses), gt)
        rows.append(
            {
                'method': name,
                'scans': len(poses),
                'deskewed': deskewed,
                'ate_rmse_m': r.ate_rmse_m,
                'rpe_trans_m': r.rpe_trans_m,
                'rpe_rot_deg': r.rpe_rot_deg,
                'rpe_trans_pct': r.rpe_trans_pct,
                'rpe_rot_deg_per_m': r.rpe_rot_deg_per_m,
                'latency_median_ms': float(np.median(times[1:])),
            }
        )
    print_table(
        rows,
        [
            'method',
            'scans',
            'deskewed',
            'ate_rmse_m',
            'rpe_trans_m',
            'rpe_rot_deg',
            'rpe_trans_pct',
            'rpe_rot_deg_per_m',
            'latency_median_ms',
        ],
        f'Deskew: simulated sweep drive, {args.scans} scans at {args.speed:g} m/s, 10 Hz '
        f'(KISS-ICP deskewed: poses at mid-sweep, ground truth shifted by {0.5 * sweep_s:g} s)',
    )
    write_results(args.results, 'bench_deskew', rows, rows)


if __name__ == '__main__':
    main()
