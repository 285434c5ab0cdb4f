"""Benchmark of the registration node's pipeline on a real lidar sequence.

Runs, side by side in one process on the same scans:
  pwan_ros adaptive (the node's default path: partial tracking + PWAN on loss), at voxel
  0.25 m and with the automatic voxel size; pwan_ros pwan mode (full PWAN on every scan);
  small_gicp GICP, Open3D point-to-point ICP (pairwise from identity, voxel 0.25 m, the
  anchors' protocol) and KISS-ICP (sequential odometry).
Reports per-scan latency (median / max) and relative pose error per consecutive pair
(rotation deg, translation mm) against the sequence's poses, on
  clean:  the 10 scans as recorded (consecutive scans 8-29 deg apart, ~2 Hz);
  robust: 50 % uniform outliers added to every scan and scans 30-32 dropped (a ~60 deg jump);
and the latency of the tracking and PWAN paths against the number of points. With
``--baseline DIR`` (another checkout, e.g. of a9638ec) pwan mode runs a second time with that
checkout's core doing the registrations (same pipeline, same process: the engine's effect alone;
both without ``recovery_global``, which an older core does not have).

  python bench/bench_lidar.py [--data ../shared/data] [--results results/lidar] [--quick]
  python bench/bench_lidar.py --pwan-only --baseline /tmp/pwan_a9638ec
  python bench/bench_lidar.py --pwan-only --device cuda    # pwan mode's PWAN on a GPU
  python bench/bench_lidar.py --pwan-only --device cuda --also compile=off   # side by side
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_engine import load_core  # noqa: E402
from common import key_values  # noqa: E402

import pwan_ros.odometry.pwan_recovery as pwan_recovery  # noqa: E402
from pwan_ros.io import pointcloud2 as pc2
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.io.pcd import read_pcd
from pwan_ros.odometry.pipeline import OdometryPipeline
from pwan_ros.geometry.se3 import invert, rotation_angle

SCANS = list(range(26, 36))


def load_sequence(data: pathlib.Path):
    seq = data / 'lidar' / 'balm_seq_a'
    poses = np.loadtxt(seq / 'alidarPose.csv', delimiter=',', usecols=range(4)).reshape(-1, 4, 4)
    poses[:, 3, 3] = 1.0
    scans = [
        np.asarray(pc2.read_xyz(read_pcd(seq / f'full{k}.pcd.gz')), dtype=np.float64)
        for k in SCANS
    ]
    return scans, [poses[k] for k in SCANS]


def pair_errors(est_rel, gt_rel):
    out = []
    for e, g in zip(est_rel, gt_rel):
        d = invert(g) @ e
        out.append((float(np.degrees(rotation_angle(d))), float(np.linalg.norm(d[:3, 3]) * 1e3)))
    return out


def run_pipeline(scans, stamps, **cfg):
    pipe = OdometryPipeline(OdometryConfig(**cfg))
    poses, times, paths = [], [], []
    for pts, t in zip(scans, stamps):
        t0 = time.perf_counter()
        est = pipe.process(pts, t)
        times.append((time.perf_counter() - t0) * 1e3)
        poses.append(est.pose)
        paths.append(est.path)
    rel = [invert(a) @ b for a, b in zip(poses[:-1], poses[1:])]
    return rel, times[1:], paths[1:]


@contextlib.contextmanager
def core_of(module):
    """The odometry pipeline's PWAN registrations done by ``module`` (a core package) meanwhile."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(module.RegistrationConfig)}

    def config(**kw):  # fields the other core does not have keep its default
        return module.RegistrationConfig(**{k: v for k, v in kw.items() if k in known})

    accepts = set(inspect.signature(module.register).parameters)

    def register(*args, **kw):  # keywords the other core does not have (reference_cache) left out
        return module.register(*args, **{k: v for k, v in kw.items() if k in accepts})

    saved = pwan_recovery.register, pwan_recovery.RegistrationConfig
    pwan_recovery.register, pwan_recovery.RegistrationConfig = register, config
    try:
        yield
    finally:
        pwan_recovery.register, pwan_recovery.RegistrationConfig = saved


def run_small_gicp(scans, voxel=0.25):
    import small_gicp

    rel, times = [], []
    for a, b in zip(scans[:-1], scans[1:]):
        t0 = time.perf_counter()
        r = small_gicp.align(
            a,
            b,
            np.eye(4),
            'GICP',
            downsampling_resolution=voxel,
            max_correspondence_distance=4 * voxel,
            num_threads=2,
        )
        times.append((time.perf_counter() - t0) * 1e3)
        rel.append(np.asarray(r.T_target_source))
    return rel, times, None


def run_open3d(scans, voxel=0.25):
    import open3d as o3d

    reg = o3d.pipelines.registration
    rel, times = [], []
    for a, b in zip(scans[:-1], scans[1:]):
        t0 = time.perf_counter()
        pa = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(a)).voxel_down_sample(voxel)
        pb = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(b)).voxel_down_sample(voxel)
        r = reg.registration_icp(
            pb,
            pa,
            4 * voxel,
            np.eye(4),
            reg.TransformationEstimationPointToPoint(),
            reg.ICPConvergenceCriteria(max_iteration=50),
        )
        times.append((time.perf_counter() - t0) * 1e3)
        rel.append(np.asarray(r.transformation))
    return rel, times, None


def run_kiss(scans):
    from kiss_icp.config import KISSConfig
    from kiss_icp.kiss_icp import KissICP

    cfg = KISSConfig()
    cfg.data.deskew = False
    cfg.data.max_range = 100.0
    cfg.mapping.voxel_size = 0.5  # KISS-ICP's rule: max_range / 100, for a ~50 m sensor
    odo = KissICP(cfg)
    poses, times = [], []
    for pts in scans:
        t0 = time.perf_counter()
        odo.register_frame(pts, np.zeros(len(pts)))
        times.append((time.perf_counter() - t0) * 1e3)
        poses.append(np.asarray(odo.last_pose).copy())
    rel = [invert(a) @ b for a, b in zip(poses[:-1], poses[1:])]
    return rel, times[1:], None


def summarise(name, rel, times, gt_rel, paths=None):
    errs = np.array(pair_errors(rel, gt_rel))
    row = {
        'method': name,
        'pairs': len(errs),
        'rot_median_deg': float(np.median(errs[:, 0])),
        'rot_max_deg': float(errs[:, 0].max()),
        'trans_median_mm': float(np.median(errs[:, 1])),
        'trans_max_mm': float(errs[:, 1].max()),
        'success': int(((errs[:, 0] < 0.5) & (errs[:, 1] < 50)).sum()),
        'latency_median_ms': float(np.median(times)),
        'latency_max_ms': float(np.max(times)),
        'per_pair': errs.tolist(),
    }
    if paths is not None:
        row['pwan_engaged'] = sum(p == 'pwan' for p in paths)
        row['rejected'] = sum(p == 'rejected' for p in paths)
    return row


def print_table(title, rows):
    print(f'\n== {title}')
    print(
        f"{'method':34s} {'rot med':>8s} {'rot max':>8s} {'tr med':>8s} {'tr max':>8s} "
        f"{'ok':>5s} {'lat med':>8s} {'lat max':>8s} {'pwan':>5s}"
    )
    for r in rows:
        print(
            f"{r['method']:34s} {r['rot_median_deg']:8.3f} {r['rot_max_deg']:8.3f} "
            f"{r['trans_median_mm']:8.1f} {r['trans_max_mm']:8.1f} "
            f"{r['success']:>2d}/{r['pairs']:<2d} {r['latency_median_ms']:8.1f} "
            f"{r['latency_max_ms']:8.1f} {r.get('pwan_engaged', '-')!s:>5s}"
        )
    print('   (deg / mm; ok = rot < 0.5 deg and trans < 50 mm; latency ms per scan)')


def with_outliers(scans, ratio, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for s in scans:
        lo, hi = s.min(axis=0), s.max(axis=0)
        out.append(np.vstack([s, rng.uniform(lo, hi, (int(ratio * len(s)), 3))]))
    return out


def latency_scaling(scans, sizes, pwan_sizes):
    """Per-scan time of the tracking path and of one full-PWAN registration vs points."""
    rows = []
    for n in sizes:
        cfg = dict(scan_voxel_size=0.05, scan_max_points=n)
        pipe = OdometryPipeline(OdometryConfig(**cfg))
        pipe.process(scans[0], 0.0)
        t0 = time.perf_counter()
        est = pipe.process(scans[1], 0.5)
        rows.append(
            {
                'path': 'track',
                'points': est.num_points,
                'ms': (time.perf_counter() - t0) * 1e3,
                'timings_ms': est.timings_ms,
            }
        )
    from pwan_ros.odometry.pwan_recovery import PwanAligner

    for n in pwan_sizes:
        al = PwanAligner(OdometryConfig(pwan_max_points=n, scan_voxel_size=0.25))
        t0 = time.perf_counter()
        al.align(scans[1], scans[0], np.eye(4), 0.5)
        rows.append({'path': 'pwan', 'points': n, 'ms': (time.perf_counter() - t0) * 1e3})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--data', default='../shared/data', type=pathlib.Path)
    ap.add_argument('--results', default='results/lidar', type=pathlib.Path)
    ap.add_argument('--quick', action='store_true', help='skip pwan mode and the scaling runs')
    ap.add_argument(
        '--pwan-only', action='store_true', help='pwan mode only (with --baseline: both cores)'
    )
    ap.add_argument(
        '--baseline', help='checkout whose pwan_ros/core also runs pwan mode (side by side)'
    )
    ap.add_argument(
        '--baseline-set',
        nargs='*',
        default=[],
        metavar='KEY=VALUE',
        help="odometry parameters of the baseline run (its checkout's defaults, e.g. "
        "potential_updates=5 for a9638ec)",
    )
    ap.add_argument(
        '--device', default='auto', help="PWAN's device in the pipeline (OdometryConfig.device)"
    )
    ap.add_argument(
        '--also',
        nargs='*',
        default=[],
        metavar='KEY=VALUE',
        help='pwan mode a second time with these odometry parameters, side by side',
    )
    ap.add_argument(
        '--max-scans', type=int, default=0, help='first N scans of each sequence only (0: all)'
    )
    args = ap.parse_args(argv)
    baseline = load_core(args.baseline) if args.baseline else None
    baseline_cfg = key_values(args.baseline_set)
    also_cfg = key_values(args.also)
    if not (args.data / 'lidar' / 'balm_seq_a').is_dir():
        print(f'error: {args.data}/lidar/balm_seq_a not found (--data)', file=sys.stderr)
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    scans, poses = load_sequence(args.data)
    stamps = [0.5 * i for i in range(len(scans))]
    report = {}

    for label, seq_idx, ratio in (
        ('clean', list(range(10)), 0.0),
        ('robust', [0, 1, 2, 3, 7, 8, 9], 0.5),
    ):
        if args.max_scans:
            seq_idx = seq_idx[: max(args.max_scans, 2)]
        s = [scans[i] for i in seq_idx]
        if ratio:
            s = with_outliers(s, ratio)
        st = [stamps[i] for i in seq_idx]
        gt_rel = [invert(poses[a]) @ poses[b] for a, b in zip(seq_idx[:-1], seq_idx[1:])]
        rows = []
        if not args.pwan_only:
            print(f'[{label}] pwan_ros adaptive ...', file=sys.stderr)
            rel, times, paths = run_pipeline(s, st, scan_voxel_size=0.25)
            rows.append(summarise('pwan_ros adaptive (voxel 0.25)', rel, times, gt_rel, paths))
            rel, times, paths = run_pipeline(s, st)
            rows.append(summarise('pwan_ros adaptive (auto voxel)', rel, times, gt_rel, paths))
        if not args.quick:
            # side by side with a baseline core: both without the global recovery, which a core
            # older than the global search (a9638ec) does not have; only the engine differs
            same = {'recovery_global': False} if baseline is not None else {}
            same['device'] = args.device
            print(f'[{label}] pwan_ros pwan mode ...', file=sys.stderr)
            rel, times, paths = run_pipeline(s, st, scan_voxel_size=0.25, mode='pwan', **same)
            rows.append(
                summarise(
                    f'pwan_ros pwan mode ({args.device})'
                    + (', no global recovery' if baseline is not None else ''),
                    rel,
                    times,
                    gt_rel,
                    paths,
                )
            )
            if also_cfg:
                print(f'[{label}] pwan_ros pwan mode {args.also} ...', file=sys.stderr)
                rel, times, paths = run_pipeline(
                    s, st, scan_voxel_size=0.25, mode='pwan', **{**same, **also_cfg}
                )
                name = f"pwan_ros pwan mode ({args.device}) [{','.join(args.also)}]"
                rows.append(summarise(name, rel, times, gt_rel, paths))
            if baseline is not None:
                print(f'[{label}] pwan_ros pwan mode, baseline core ...', file=sys.stderr)
                with core_of(baseline):
                    rel, times, paths = run_pipeline(
                        s, st, scan_voxel_size=0.25, mode='pwan', **{**baseline_cfg, **same}
                    )
                name = ' '.join([f'core of {args.baseline}'] + args.baseline_set)
                rows.append(summarise(f'pwan mode, {name}', rel, times, gt_rel, paths))
        if not args.pwan_only:
            print(f'[{label}] anchors ...', file=sys.stderr)
            rows.append(summarise('small_gicp GICP (pairwise)', *run_small_gicp(s)[:2], gt_rel))
            rows.append(summarise('Open3D ICP p2p (pairwise)', *run_open3d(s)[:2], gt_rel))
            rows.append(summarise('KISS-ICP (sequential)', *run_kiss(s)[:2], gt_rel))
        print_table(
            f'{label}: BALM seq a, scans {[SCANS[i] for i in seq_idx]}'
            + (f', {int(ratio * 100)} % outliers' if ratio else ''),
            rows,
        )
        report[label] = rows

    if not args.quick and not args.pwan_only:
        scaling = latency_scaling(
            scans, [1000, 5000, 10000, 30000, 60000], [500, 1000, 2000, 5000]
        )
        print('\n== latency vs points (one scan)')
        for r in scaling:
            print(f"{r['path']:6s} {r['points']:7d} points  {r['ms']:9.1f} ms")
        report['scaling'] = scaling
    out = args.results / 'bench_lidar.json'
    out.write_text(json.dumps(report, indent=1))
    print(f'\nresults: {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
