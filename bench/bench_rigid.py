"""Rigid benchmark on Stanford bunny scan pairs (ground truth from bun.conf).

Protocol (paper Sec. 5.2.5 / prototype notes): both scans of a pair are normalised jointly into
[-1, 1]^3 and voxel-downsampled with 0.08; ``--outliers R`` adds R x (#reference voxel points)
uniform outliers inside the reference's bounding box. Every method gets the same voxel sets from
identity; PWAN additionally refines on the dense (normalised) scans (fine-tune stage).
Rotation error (deg) per pair; success = error < 2 deg.

    python bench/bench_rigid.py --data ../shared/data --results results/rigid --outliers 0 0.5 1.0
    python bench/bench_rigid.py --methods pwan-global fpfh-ransac-icp fgr-icp kiss-matcher \
        --outliers 0 0.5 1.0
    python bench/bench_rigid.py --scenes --methods pwan-global fpfh-ransac-icp fgr-icp kiss-matcher
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    BUNNY_PAIRS,
    Timer,
    bunny_poses,
    load_bunny,
    print_table,
    rotation_error_deg,  # noqa: E402
    summarise,
    voxel,
    write_results,
)
import anchors  # noqa: E402

from pwan_ros.core import RegistrationConfig, register  # noqa: E402


def make_pair(data_dir, s_name, r_name, poses, outlier_ratio, seed):
    src = load_bunny(data_dir, s_name)
    ref = load_bunny(data_dir, r_name)
    gt = np.linalg.inv(poses[r_name]) @ poses[s_name]
    both = np.vstack((src, ref))
    lo, hi = both.min(0), both.max(0)
    c, s = (lo + hi) / 2, (hi - lo).max() / 2
    src_n, ref_n = (src - c) / s, (ref - c) / s
    gt_n = gt.copy()
    gt_n[:3, 3] = (gt[:3, :3] @ c + gt[:3, 3] - c) / s
    src_v, ref_v = voxel(src_n, 0.08), voxel(ref_n, 0.08)
    if outlier_ratio > 0:
        rng = np.random.default_rng(seed)
        lo, hi = ref_v.min(0), ref_v.max(0)
        out = rng.uniform(lo, hi, size=(int(round(outlier_ratio * len(ref_v))), 3))
        ref_v = np.vstack((ref_v, out))
        ref_n = np.vstack((ref_n, out))
    return src_n, ref_n, src_v, ref_v, gt_n


def load_scenes(data_dir):
    """[(name, source, reference, T_reference_source)]: the libpointmatcher car pair (401 -> 400,
    the library's reference transform) and the small_gicp pair (its estimated T_target_source)."""
    from pwan_ros.io.point_files import read_points

    car = os.path.join(data_dir, 'rigid', 'libpointmatcher_car')
    c400 = np.loadtxt(os.path.join(car, 'car_cloud400.csv'), delimiter=',', skiprows=1)[:, :3]
    c401 = np.loadtxt(os.path.join(car, 'car_cloud401.csv'))[:, :3]
    with open(os.path.join(car, 'carCloudList.csv')) as fh:
        rows = [ln.split(',') for ln in fh.read().splitlines()[1:] if ln.strip()]
    g = {r[0].strip(): np.array([float(v) for v in r[1:]]).reshape(4, 4) for r in rows}
    sg = os.path.join(data_dir, 'rigid', 'small_gicp_pair')
    t_sg = np.loadtxt(os.path.join(sg, 'T_target_source.txt'))
    return [
        ('car 401->400', c401, c400, np.linalg.inv(g['car_cloud400.csv']) @ g['car_cloud401.csv']),
        (
            'small_gicp source->target',
            read_points(os.path.join(sg, 'source.ply')),
            read_points(os.path.join(sg, 'target.ply')),
            t_sg,
        ),
    ]


def run_scenes(args):
    """Scene pairs from identity and from the source turned 90 and 180 deg about z (about its
    centroid): rotation (deg) and translation errors against the reference transforms."""
    rows = []
    for name, src, ref, gt in load_scenes(args.data):
        extent = float(np.linalg.norm(ref.max(0) - ref.min(0)))
        voxel = extent / 100.0  # the methods' feature voxel: 1 % of the scene
        for yaw in (0, 90, 180):
            c = src.mean(0)
            rz = np.array(
                [
                    [np.cos(np.radians(yaw)), -np.sin(np.radians(yaw)), 0],
                    [np.sin(np.radians(yaw)), np.cos(np.radians(yaw)), 0],
                    [0, 0, 1],
                ]
            )
            turn = np.eye(4)
            turn[:3, :3], turn[:3, 3] = rz, c - rz @ c
            src_t = src @ rz.T + turn[:3, 3]
            gt_t = gt @ np.linalg.inv(turn)
            for m in args.methods:
                with Timer() as tm:
                    status = 'ok'
                    if m == 'pwan-global':
                        res = register(src_t, ref, RegistrationConfig(), init='global')
                        est, status = res.transform, res.status
                    elif m in ('fpfh-ransac-icp', 'fgr-icp', 'kiss-matcher'):
                        est = getattr(anchors, m.replace('-', '_'))(src_t, ref, voxel)
                    else:
                        continue
                rot = rotation_error_deg(est[:3, :3], gt_t[:3, :3])
                trans = float(np.linalg.norm(est[:3, 3] - gt_t[:3, 3]))
                ok = status == 'ok' and rot < 2.0 and trans < 2 * voxel
                rows.append(
                    {
                        'scene': name,
                        'yaw': yaw,
                        'method': m,
                        'rot_err_deg': rot,
                        'trans_err': trans,
                        'status': status,
                        'solved': int(ok),
                        'time_s': tm.s,
                        'voxel': voxel,
                    }
                )
                print(
                    f'{name} turned {yaw} deg, {m}: {rot:.2f} deg {trans:.3f} ({status}) '
                    f'{tm.s:.1f} s',
                    flush=True,
                )
    print_table(
        rows,
        ['scene', 'yaw', 'method', 'rot_err_deg', 'trans_err', 'status', 'solved', 'time_s'],
        'Scene pairs (solved: rotation < 2 deg and translation < 2 x 1 % of the scene extent)',
    )
    write_results(args.results, 'bench_rigid_scenes', rows, rows)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('--data', default='../shared/data')
    p.add_argument('--results', default='results/rigid')
    p.add_argument('--outliers', type=float, nargs='+', default=[0.0, 0.5, 1.0])
    p.add_argument(
        '--methods',
        nargs='+',
        default=['m-pwan', 'd-pwan', 'o3d-icp', 'trimmed-icp', 'probreg-cpd', 'pycpd'],
    )
    p.add_argument(
        '--pairs', type=int, nargs='+', help='indices into the pair list (default all 8)'
    )
    p.add_argument('--starts', type=int, default=1, help='PWAN multi-start count')
    p.add_argument(
        '--outlier-seed',
        type=int,
        default=0,
        help='offset added to the pair index that seeds the outlier draw (another draw: e.g. 100)',
    )
    p.add_argument('--set', nargs='*', default=[], help='PWAN config overrides key=value')
    p.add_argument(
        '--scenes',
        action='store_true',
        help='the scene pairs (libpointmatcher car, small_gicp) from identity / 90 / 180 deg '
        'instead',
    )
    args = p.parse_args(argv)
    if args.scenes:
        return run_scenes(args)
    poses = bunny_poses(args.data)
    indices = args.pairs if args.pairs else list(range(len(BUNNY_PAIRS)))
    pairs = [BUNNY_PAIRS[i] for i in indices]
    overrides = {}
    for kv in args.set:
        k, v = kv.split('=', 1)
        overrides[k] = eval(v, {}, {})  # numbers / tuples from the command line
    rows, summary = [], []
    for ratio in args.outliers:
        errs = {m: [] for m in args.methods}
        times = {m: [] for m in args.methods}
        for pi, (s_name, r_name) in zip(indices, pairs):
            # the outliers of a pair are seeded by its index in the full list (same draw with
            # --pairs)
            src_n, ref_n, src_v, ref_v, gt = make_pair(
                args.data, s_name, r_name, poses, ratio, seed=pi + args.outlier_seed
            )
            true_angle = rotation_error_deg(gt[:3, :3], np.eye(3))
            for m in args.methods:
                with Timer() as tm:
                    if m in ('m-pwan', 'd-pwan'):
                        cfg = {
                            'divergence': 'mass' if m == 'm-pwan' else 'distance',
                            'starts': args.starts,
                            'voxel_size': 0.08,
                        }
                        if m == 'd-pwan':
                            cfg['distance_threshold'] = 0.05
                        cfg.update(overrides)
                        res = register(src_n, ref_n, RegistrationConfig.from_dict(cfg))
                        est = res.transform
                    elif m == 'o3d-icp':
                        est = anchors.o3d_icp(src_v, ref_v, max_dist=0.05 * 2)
                    elif m == 'trimmed-icp':
                        est = anchors.trimmed_icp(src_v, ref_v, 0.8)
                    elif m == 'probreg-cpd':
                        est = anchors.probreg_cpd_rigid(src_v, ref_v)
                    elif m == 'pycpd':
                        est = anchors.pycpd_rigid(src_v, ref_v)
                    elif m == 'small-gicp':
                        est = anchors.small_gicp(src_v, ref_v, 0.08)
                    elif m == 'pwan-global':
                        cfg = RegistrationConfig.from_dict(overrides)
                        res = register(src_n, ref_n, cfg, init='global')
                        est = res.transform if res.status == 'ok' else None
                    elif m == 'fpfh-ransac-icp':
                        est = anchors.fpfh_ransac_icp(src_v, ref_v, 0.08)
                    elif m == 'fgr-icp':
                        est = anchors.fgr_icp(src_v, ref_v, 0.08)
                    elif m == 'kiss-matcher':
                        est = anchors.kiss_matcher(src_v, ref_v, 0.08)
                    else:
                        raise SystemExit(f'unknown method {m}')
                # a refused global registration (status != 'ok') counts as a failure (180 deg)
                err = 180.0 if est is None else rotation_error_deg(est[:3, :3], gt[:3, :3])
                errs[m].append(err)
                times[m].append(tm.s)
                rows.append(
                    {
                        'outliers': ratio,
                        'pair': f'{s_name}->{r_name}',
                        'true_angle': round(true_angle, 2),
                        'method': m,
                        'rot_err_deg': err,
                        'time_s': tm.s,
                    }
                )
                print(
                    f'outliers {ratio:.1f} {s_name}->{r_name} ({true_angle:.0f} deg) {m}: '
                    f'{err:.2f} deg {tm.s:.1f} s',
                    flush=True,
                )
        for m in args.methods:
            sm = summarise(errs[m], times[m], 2.0)
            le60 = [
                e
                for e, (s, r) in zip(errs[m], pairs)
                if rotation_error_deg((np.linalg.inv(poses[r]) @ poses[s])[:3, :3], np.eye(3))
                <= 60
            ]
            sm.update(
                {
                    'method': m,
                    'outliers': ratio,
                    'success_le60': float(np.mean(np.array(le60) < 2.0)) if le60 else float('nan'),
                }
            )
            summary.append(sm)
    print_table(
        summary,
        ['outliers', 'method', 'median', 'std', 'success', 'success_le60', 'time_s', 'n'],
        'Stanford bunny rigid pairs: rotation error (deg), success < 2 deg',
    )
    write_results(args.results, 'bench_rigid', rows, summary)


if __name__ == '__main__':
    main()
