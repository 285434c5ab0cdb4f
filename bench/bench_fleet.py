"""Fleet evaluation: four sequences through `pwan_evaluate --offline` on 1 and on 2 workers.

Sequences: the real nuScenes keyframes (.npy folder + KITTI poses, 2 Hz) and BALM scans (PCD
folder + pose blocks) of ``--data``, and two simulated drives written as KITTI odometry folders
(``--sim-scans`` scans each, 10 Hz). Methods: the product's pipeline (``pwan``, adaptive) and
KISS-ICP. The same command runs once with ``--workers 1`` (one after another in one process)
and once with ``--workers 2`` (a local Ray); the table gives the wall time of each and their
ratio, and checks that both runs' aggregates agree number for number. Prints the aggregate
table of the 2-worker run.

    python bench/bench_fleet.py [--data ../shared/data] [--results results/fleet] [--sim-scans 60]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from pwan_ros.evaluation.lidar_sim import SimConfig, simulate  # noqa: E402
from pwan_ros.evaluation.sequences import write_kitti_sequence  # noqa: E402

#: nominal T_cam0_velodyne (camera z forward, x right, y down; 0.27 m behind the lidar)
TR = np.array([[0, -1, 0, 0], [0, 0, -1, -0.08], [1, 0, 0, -0.27], [0, 0, 0, 1]], dtype=float)


def sim_sequence(root: pathlib.Path, seed: int, scans: int) -> pathlib.Path:
    cfg = SimConfig(scans=scans, beams=16, azimuth_steps=720, seed=seed)
    sim = [s for s in simulate(cfg) if not s.blackout]
    folder = root / f'sim{seed:02d}'
    write_kitti_sequence(
        folder,
        [np.c_[s.xyz, s.extras['intensity']] for s in sim],
        0.1 * np.arange(len(sim)),
        [s.pose for s in sim],
        TR,
    )
    return folder


def run(inputs: list, workers: int, out: pathlib.Path) -> tuple:
    cmd = [str(pathlib.Path(sys.executable).with_name('pwan_evaluate')), '--offline', *inputs]
    cmd += ['--estimator', 'pwan,kiss_icp', '--workers', str(workers), '--output', str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f'bench_fleet: {workers} worker(s) failed:\n{proc.stderr[-3000:]}')
    return wall, json.loads((out / 'aggregate.json').read_text()), proc.stdout


def same(a: dict, b: dict) -> bool:
    keys = ('ate_rmse_m', 'rpe_trans_m', 'rpe_rot_deg', 'rpe_trans_pct', 'scans')
    pairs = zip(a['rows'], b['rows'])
    return len(a['rows']) == len(b['rows']) and all(
        x[k] == y[k] or abs(x[k] - y[k]) <= 1e-9 * max(1.0, abs(x[k]))
        for x, y in pairs
        for k in keys
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--data', default='../shared/data')
    parser.add_argument('--results', default='results/fleet')
    parser.add_argument('--sim-scans', type=int, default=60)
    args = parser.parse_args()
    lidar = pathlib.Path(args.data) / 'lidar'
    nus, balm = lidar / 'nuscenes_keyframes', lidar / 'balm_seq_a'
    results = pathlib.Path(args.results)
    shutil.rmtree(results, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        sims = [sim_sequence(pathlib.Path(tmp), seed, args.sim_scans) for seed in (0, 1)]
        inputs = ['--kitti', *map(str, sims), '--scans', str(nus / 'scans'), str(balm)]
        inputs += ['--poses', str(nus / 'poses.txt'), str(balm / 'alidarPose.csv')]
        inputs += ['--rate-hz', '2']
        one, agg1, _ = run(inputs, 1, results / 'workers1')
        two, agg2, table = run(inputs, 2, results / 'workers2')
    print(table)
    print('| workers | wall time [s] | ratio to 1 worker | aggregates equal |')
    print('|---|---|---|---|')
    print(f'| 1 | {one:.1f} | 1.00 | |')
    print(f'| 2 | {two:.1f} | {two / one:.2f} | {"yes" if same(agg1, agg2) else "NO"} |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
