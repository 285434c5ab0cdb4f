"""Keyframe reuse in pwan mode: the odometry pipeline with full PWAN on every scan, run twice side
by side in one process on the same BALM scans (interleaved scan by scan, the order alternating):
once keeping the keyframe's prepared reference (k-d tree, normals; ``PwanAligner.reference_cache``,
the default) and once preparing it for every registration (``reference_cache = None``).
Reports the median per-scan latency and PWAN time of each (over ``--repeats`` runs), the median
of the per-scan difference (same scan, same run: the load of a shared machine cancels), the
accuracy of each and the largest difference between their poses, and what preparing the keyframe
costs alone. Then the fine-tune's nearest-neighbour search (one query of every keyframe point
against the keyframe): cKDTree vs :class:`pwan_ros.core.nearest.TorchNearest` on CPU and, when
there is one, CUDA.

  python bench/bench_reuse.py [--data ../shared/data] [--repeats 3] [--robust]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lidar import load_sequence, summarise, with_outliers  # noqa: E402

from pwan_ros.core.nearest import TorchNearest  # noqa: E402
from pwan_ros.core.reference_cache import PreparedReference  # noqa: E402
from pwan_ros.geometry.se3 import invert  # noqa: E402
from pwan_ros.odometry.config import OdometryConfig  # noqa: E402
from pwan_ros.odometry.pipeline import OdometryPipeline  # noqa: E402


def run_side_by_side(scans, stamps, **cfg):
    """{label: (poses, per-scan ms, pwan ms)} for the pipeline with and without reuse."""
    pipes = {
        'reuse': OdometryPipeline(OdometryConfig(**cfg)),
        'rebuild': OdometryPipeline(OdometryConfig(**cfg)),
    }
    pipes['rebuild'].pwan.reference_cache = None
    out = {k: ([], [], []) for k in pipes}
    for i, (pts, t) in enumerate(zip(scans, stamps)):
        order = list(pipes) if i % 2 == 0 else list(pipes)[::-1]
        for k in order:
            t0 = time.perf_counter()
            est = pipes[k].process(pts, t)
            out[k][0].append(est.pose)
            out[k][1].append((time.perf_counter() - t0) * 1e3)
            out[k][2].append(est.timings_ms.get('pwan', 0.0))
    cache = pipes['reuse'].pwan.reference_cache
    return out, (cache.builds, cache.hits)


def prepare_cost(points, repeats=5):
    """ms to prepare a keyframe as a registration does (fine-tune tree + normals + fit tree)."""
    from pwan_ros.core.preprocess import make_normaliser

    norm = make_normaliser(points, points, True)
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        prep = PreparedReference(points)
        prep.finetune_reference(norm, 40000, 0, 10)
        prep.fit_tree()
        ms.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ms))


def search_cost(points, device, repeats=5):
    """ms per query of all ``points`` against themselves (k = 1)."""
    from scipy.spatial import cKDTree

    if device == 'kdtree':
        s = cKDTree(points)
    else:
        s = TorchNearest(points, device)
    s.query(points)  # warm-up (CUDA context, kernels)
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s.query(points, workers=1)
        ms.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ms))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--data', default='../shared/data', type=pathlib.Path)
    ap.add_argument(
        '--robust',
        action='store_true',
        help="bench_lidar's robust set: 50 %% uniform outliers, scans 30-32 dropped (a ~60 deg "
        "jump)",
    )
    ap.add_argument(
        '--repeats', type=int, default=1, help='side-by-side runs (fresh pipelines each)'
    )
    args = ap.parse_args(argv)
    if not (args.data / 'lidar' / 'balm_seq_a').is_dir():
        print(f'error: {args.data}/lidar/balm_seq_a not found (--data)', file=sys.stderr)
        return 2
    scans, poses = load_sequence(args.data)
    idx = [0, 1, 2, 3, 7, 8, 9] if args.robust else list(range(len(scans)))
    scans, poses = [scans[i] for i in idx], [poses[i] for i in idx]
    if args.robust:
        scans = with_outliers(scans, 0.5)
    stamps = [0.5 * i for i in idx]
    gt_rel = [invert(a) @ b for a, b in zip(poses[:-1], poses[1:])]
    times = {'reuse': ([], []), 'rebuild': ([], [])}
    paired, diff, rows = [], 0.0, {}
    for _ in range(args.repeats):
        out, (builds, hits) = run_side_by_side(scans, stamps, scan_voxel_size=0.25, mode='pwan')
        for k, (est, ms, pwan_ms) in out.items():
            rel = [invert(a) @ b for a, b in zip(est[:-1], est[1:])]
            rows[k] = summarise(k, rel, ms[1:], gt_rel)  # the same poses every run
            times[k][0].extend(ms[1:])
            times[k][1].extend(pwan_ms[1:])
        paired.extend(np.subtract(out['rebuild'][1][1:], out['reuse'][1][1:]))
        diff = max(
            [diff]
            + [float(np.abs(a - b).max()) for a, b in zip(out['reuse'][0], out['rebuild'][0])]
        )
    print(
        f'\n== pwan mode, BALM seq a, scans {idx}'
        + (', 50 % outliers' if args.robust else '')
        + f', {args.repeats} run(s)'
    )
    print(
        f"{'keyframe reference':20s} {'scan med':>9s} {'pwan med':>9s} {'rot med':>8s} "
        f"{'rot max':>8s} {'tr med':>7s} {'tr max':>7s} {'ok':>5s}"
    )
    for k, r in rows.items():
        print(
            f"{k:20s} {np.median(times[k][0]):9.1f} {np.median(times[k][1]):9.1f} "
            f"{r['rot_median_deg']:8.3f} {r['rot_max_deg']:8.3f} {r['trans_median_mm']:7.1f} "
            f"{r['trans_max_mm']:7.1f} {r['success']:>2d}/{r['pairs']:<2d}"
        )
    print(
        f'   (ms per scan; deg / mm per consecutive pair; per run: {builds} keyframe '
        f'preparations, {hits} reuses)'
    )
    print(
        'per-scan time saved (rebuild - reuse, same scan and run): median '
        f'{np.median(paired):.1f} ms, mean {np.mean(paired):.1f} ms; largest pose difference '
        f'{diff:.1e}'
    )
    kf = OdometryPipeline(OdometryConfig(scan_voxel_size=0.25))
    kf.process(scans[0], 0.0)
    pts = kf.keyframe.local_map.points
    print(
        f'\npreparing one keyframe ({len(pts)} points: fine-tune tree + normals + tree of the '
        f'result): {prepare_cost(pts):.1f} ms'
    )
    print(f'\n== nearest-neighbour query of {len(pts)} points against the keyframe (k = 1)')
    devices = ['kdtree', 'cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    for d in devices:
        name = 'cKDTree (1 worker)' if d == 'kdtree' else f'TorchNearest ({d})'
        print(f'{name:24s} {search_cost(pts, d):9.2f} ms')
    return 0


if __name__ == '__main__':
    sys.exit(main())
