"""Per-scan cost of pwan_ros adaptive odometry by stage, against KISS-ICP, on the same scans.

Both run in one process on the sequences of ``bench_drift.py`` (nuScenes keyframes, BALM seq a,
the simulated drive with 24 and 64 beams), alternately ``--repeats`` times (pwan_ros, KISS-ICP,
pwan_ros, ...), so machine load hits both alike. Per stage, the median over all scans of all
repeats (first scan of each run excluded: it only defines odom) of:

  preprocess  scan filter (finite, far glitches, range gate, voxel grid, isolated returns, caps)
              + KD-tree and covariances of the tracked points
  track       GICP against the local map + match quality
  map         a new keyframe's local map (scans that start one; 0 for the others); map_kf: the
              median over the scans that start a keyframe only
  total       whole ``OdometryPipeline.process`` call
  kiss        whole KISS-ICP ``register_frame`` (deskew off, voxel max_range / 100)

``ratio`` = pwan_ros total / KISS-ICP total (median). ``max`` is the slowest scan and
``period`` the sensor's scan period: every scan is answered at the sensor's rate when max < period.
ATE and drift (first repeat) as in bench_drift.py, to check that speed did not cost accuracy.

  python bench/bench_scan_cost.py [--data ../shared/data] [--sequences nuscenes balm sim] \
      [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_drift import (
    BALM_MAX_RANGE,
    NUSCENES_MAX_RANGE,
    SIM_MAX_RANGE,
    load_balm,  # noqa: E402
    load_nuscenes,
    load_sim,
    score,
)
from common import print_table, write_results  # noqa: E402

from pwan_ros.evaluation.lidar_sim import SimConfig  # noqa: E402
from pwan_ros.evaluation.offline import KissIcpOdometry  # noqa: E402
from pwan_ros.odometry.config import OdometryConfig  # noqa: E402
from pwan_ros.odometry.pipeline import OdometryPipeline  # noqa: E402

STAGES = ('preprocess', 'track', 'map')
COLS = [
    'sequence',
    'points',
    'preprocess_ms',
    'track_ms',
    'map_ms',
    'map_kf_ms',
    'total_ms',
    'max_ms',
    'kiss_ms',
    'kiss_max_ms',
    'ratio',
    'period_ms',
    'ate_m',
    'drift_pct',
    'kiss_ate_m',
    'kiss_drift_pct',
]


def run_pwan(xyz, stamps, cfg: OdometryConfig, num_threads: int | None = None):
    """(poses (S, 4, 4), {stage: [ms per scan]}) of one run; scans after the first."""
    pipe = (
        OdometryPipeline(cfg)
        if num_threads is None
        else OdometryPipeline(cfg, num_threads=num_threads)
    )
    poses, cost = [], {k: [] for k in STAGES + ('total',)}
    for i, (pts, t) in enumerate(zip(xyz, stamps)):
        t0 = time.perf_counter()
        est = pipe.process(pts, float(t))
        total = (time.perf_counter() - t0) * 1e3
        poses.append(est.pose)
        if i:
            for k in STAGES:
                cost[k].append(est.timings_ms.get(k, 0.0))
            cost['total'].append(total)
    return np.array(poses), cost


def run_kiss(xyz, stamps, max_range: float):
    odo = KissIcpOdometry(max_range=max_range)
    poses, lat = [], []
    for i, (pts, t) in enumerate(zip(xyz, stamps)):
        t0 = time.perf_counter()
        poses.append(odo(pts, float(t)))
        if i:
            lat.append((time.perf_counter() - t0) * 1e3)
    return np.array(poses), lat


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument('--data', default='../shared/data', type=pathlib.Path)
    ap.add_argument('--results', default='results/scan_cost', type=pathlib.Path)
    ap.add_argument(
        '--sequences',
        nargs='+',
        default=['nuscenes', 'balm', 'sim'],
        choices=['sim', 'balm', 'nuscenes'],
    )
    ap.add_argument(
        '--sim-scans', type=int, default=300, help='scans of the simulated drive (10 Hz, 3 m/s)'
    )
    ap.add_argument('--sim-beams', type=int, nargs='+', default=[SimConfig().beams, 64])
    ap.add_argument('--threads', type=int, help="pwan_ros's num_threads (default: the pipeline's)")
    ap.add_argument(
        '--repeats', type=int, default=3, help='alternate runs of each method per sequence'
    )
    args = ap.parse_args(argv)

    rows = []
    for which in args.sequences:
        for beams in args.sim_beams if which == 'sim' else [None]:
            if which == 'sim':
                print(
                    f'simulating {args.sim_scans} scans, {beams} beams ...',
                    file=sys.stderr,
                    flush=True,
                )
                seq, xyz, stamps, gt = load_sim(args.sim_scans, beams, None)
                max_range = SIM_MAX_RANGE
            else:
                folder = {'balm': 'balm_seq_a', 'nuscenes': 'nuscenes_keyframes'}[which]
                if not (args.data / 'lidar' / folder).is_dir():
                    print(f'error: {args.data}/lidar/{folder} not found (--data)', file=sys.stderr)
                    return 2
                seq, xyz, stamps, gt = (load_balm if which == 'balm' else load_nuscenes)(args.data)
                max_range = BALM_MAX_RANGE if which == 'balm' else NUSCENES_MAX_RANGE
            cost = {k: [] for k in STAGES + ('total',)}
            kiss = []
            for rep in range(args.repeats):
                print(f'[{seq}] repeat {rep + 1}/{args.repeats} ...', file=sys.stderr, flush=True)
                poses, c = run_pwan(xyz, stamps, OdometryConfig(), args.threads)
                for k in cost:
                    cost[k] += c[k]
                kposes, lat = run_kiss(xyz, stamps, max_range)
                kiss += lat
                if rep == 0:
                    acc = score(seq, 'pwan_ros', poses, [0.0, 0.0], gt, stamps, {})
                    kacc = score(seq, 'KISS-ICP', kposes, [0.0, 0.0], gt, stamps, {})
            med = {k: float(np.median(v)) for k, v in cost.items()}
            kf = [v for v in cost['map'] if v > 0.0]
            rows.append(
                {
                    'sequence': seq,
                    'points': int(np.median([len(x) for x in xyz])),
                    **{f'{k}_ms': med[k] for k in med},
                    'map_kf_ms': float(np.median(kf)) if kf else '-',
                    'max_ms': float(np.max(cost['total'])),
                    'kiss_ms': float(np.median(kiss)),
                    'kiss_max_ms': float(np.max(kiss)),
                    'ratio': med['total'] / float(np.median(kiss)),
                    'period_ms': 1e3 * float(np.median(np.diff(stamps))),
                    'ate_m': acc['ate_rmse_m'],
                    'drift_pct': acc['drift_pct'],
                    'kiss_ate_m': kacc['ate_rmse_m'],
                    'kiss_drift_pct': kacc['drift_pct'],
                }
            )
    print_table(
        rows,
        COLS,
        f'Per-scan cost, median over scans x {args.repeats} alternate runs (ms); '
        'ratio = pwan_ros total / KISS-ICP',
    )
    write_results(str(args.results), 'bench_scan_cost', [], rows)
    print(f'\nresults: {args.results}/bench_scan_cost.json')
    return 0


if __name__ == '__main__':
    sys.exit(main())
