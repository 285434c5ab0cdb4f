"""The non-rigid self-check's confusion table: register(transform='nonrigid') with its defaults
on every dev case, each result labelled right or wrong by its ground truth (MSE at most half of
no registration) and counted by its verdict.

Cases: the SHREC'19 bodies (bench/humans.py: the README's ten pairs x complete / cropped /
outliers, seeds 0 and 1), three of them turned 150 deg about the vertical; the bcpd pairs fish /
bunny / monkey in protocol (a) (500 points, outlier ratios 0.2 and 1.2; 0.2 also turned 150 deg)
and (b) (1000 points, both sets cut to s = 0.7 and 1), 24 starts as bench_nonrigid.py; 11 body
pairs the README does not list (``humans.CROSS_PAIRS``: other datasets, other up axes), complete,
seed 0.

    python bench/bench_verdicts.py                       # 89 cases, ~40 min on one core
    python bench/bench_verdicts.py --only h_22-23 a_fish  # cases whose name starts so
    python bench/bench_verdicts.py --shard 0 2            # every second case (two processes)
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from scipy.spatial.transform import Rotation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_nonrigid as bn  # noqa: E402
import humans  # noqa: E402
from common import Timer, key_values, print_table, write_results  # noqa: E402

from pwan_ros.core import RegistrationConfig, register  # noqa: E402


def _turned(points, deg):
    d = points.shape[1]
    r = Rotation.from_euler('z', deg, degrees=True).as_matrix()[:d, :d]
    c = points.mean(0)
    return (points - c) @ r.T + c


def body_cases(data):
    """(name, source, reference, config, mse(moved), identity MSE) of the bodies."""
    jobs = [(p, v, s, 0) for p in humans.PAIRS for v in humans.VARIANTS for s in (0, 1)]
    jobs += [(p, 'complete', 0, 150) for p in (('12', '13'), ('22', '23'), ('16', '17'))]
    for pair, variant, seed, turn in jobs:
        case = humans.Case(data, pair, variant, 1500, seed)
        identity = case.identity_mse
        if turn:
            case.src = _turned(case.src, turn)
        name = f'h_{pair[0]}-{pair[1]}_{variant}_s{seed}_t{turn}'
        yield name, case.src, case.ref, {}, case.mse, identity


def cross_cases(data):
    """The same for :data:`humans.CROSS_PAIRS` (complete, seed 0), named x_<pair>."""
    for pair in humans.CROSS_PAIRS:
        case = humans.Case(data, pair, 'complete', 1500, 0)
        yield f'x_{pair[0]}-{pair[1]}', case.src, case.ref, {}, case.mse, case.identity_mse


def bcpd_cases(data):
    """The same for the bcpd pairs (protocol (a): outliers; (b): both sets cut)."""
    for shape in ('fish', 'bunny', 'monkey'):
        y, x = bn.load_pair(data, shape)
        for kind, ratio, turn in (('a', 0.2, 0), ('a', 1.2, 0), ('a', 0.2, 150), ('b', 0.7, 0)):
            yield _bcpd_case(shape, y, x, kind, ratio, turn)
        yield _bcpd_case(shape, y, x, 'b', 1.0, 0)


def _bcpd_case(shape, y, x, kind, ratio, turn):
    rng = np.random.default_rng(7)
    if kind == 'a':
        n = min(500, len(y))
        idx = rng.choice(len(y), size=n, replace=False)
        ref = x[idx]
        out = rng.uniform(ref.min(0), ref.max(0), size=(int(round(ratio * n)), ref.shape[1]))
        src, ref_all = bn.standardise(y[idx]), np.vstack((ref, out))
        ref_all = (ref_all - ref_all.mean(0)) / ref_all.std()
        keep, truth, mass = np.arange(n), ref_all[:n], float(n)
    else:
        n = min(1000, len(y))
        idx = rng.choice(len(y), size=n, replace=False)
        src0, ref0 = bn.standardise(y[idx]), bn.standardise(x[idx])

        def cut(p):
            proj = p @ rng.normal(size=p.shape[1])
            return proj <= np.quantile(proj, ratio)

        ms, mr = cut(src0), cut(ref0)
        src, ref_all = src0[ms], ref0[mr]
        both = np.flatnonzero(ms & mr)
        pos = {j: i for i, j in enumerate(np.flatnonzero(ms))}
        keep, truth = np.array([pos[j] for j in both]), ref0[both]
        mass = float(min(max(3, len(both)), len(src), len(ref_all)))
    if turn:
        src = _turned(src, turn)

    def mse(moved):
        return float(np.mean(np.sum((moved[keep] - truth) ** 2, axis=1)))

    cfg = {'mass': mass, 'starts': 24, 'start_steps': 60}
    return f'{kind}_{shape}_{ratio}_t{turn}', src, ref_all, cfg, mse, mse(src)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('--data', default='../shared/data')
    p.add_argument('--results', default='results/verdicts')
    p.add_argument('--only', nargs='+', help='cases whose name starts with one of these')
    p.add_argument(
        '--set', nargs='*', default=[], help='configuration overrides KEY=VALUE (YAML values)'
    )
    p.add_argument(
        '--shard',
        nargs=2,
        type=int,
        default=(0, 1),
        metavar=('I', 'N'),
        help='every N-th case from the I-th',
    )
    args = p.parse_args(argv)
    index, count = args.shard
    if count < 1 or not 0 <= index < count:
        raise SystemExit(f'--shard I N needs 0 <= I < N, got {index} {count}')
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)
    overrides = key_values(args.set)
    rows = []
    cases = (*body_cases(args.data), *cross_cases(args.data), *bcpd_cases(args.data))
    for i, (name, src, ref, cfg, mse, identity) in enumerate(cases):
        if (args.only and not name.startswith(tuple(args.only))) or i % count != index:
            continue
        with Timer() as tm:
            res = register(
                src,
                ref,
                RegistrationConfig.from_dict({'transform': 'nonrigid', **cfg, **overrides}),
            )
        moved = np.full(src.shape, np.nan)
        moved[res.source_valid] = res.transformed_source
        err = mse(moved)
        right = err <= 0.5 * identity
        rows.append(
            {
                'case': name,
                'mse': err,
                'identity': identity,
                'right': right,
                'status': res.status,
                'time_s': tm.s,
                'reason': res.reason,
            }
        )
        print(
            f'{name}: MSE {err:.5f} (identity {identity:.5f}) {"right" if right else "wrong"} '
            f'{res.status} {tm.s:.1f} s {res.reason[:90]}',
            flush=True,
        )
    table = [
        {
            'verdict': v,
            'right': sum(r['right'] and r['status'] == v for r in rows),
            'wrong': sum(not r['right'] and r['status'] == v for r in rows),
        }
        for v in ('ok', 'refused')
    ]
    print_table(table, ['verdict', 'right', 'wrong'], f'non-rigid verdicts, {len(rows)} cases')
    write_results(args.results, 'bench_verdicts', rows, table)


if __name__ == '__main__':
    main()
