"""Non-rigid benchmark on the bcpd pairs (point i of X corresponds to point i of Y).

Protocols of the paper (Sec. 5.2.2):
 (a) outliers: sample n (500) corresponding points, add ratio x n uniform points to the reference
     (inside its bounding box), normalise both sets to mean 0 / variance 1, MSE over the
     corresponding points after registration;
 (b) partial overlap: sample 1000 corresponding points, cut each set by its own random plane
     keeping a fraction s, MSE over the points present in both.
Methods: 'pwan' (m-PWAN, mass = the corresponding points: n in (a), the true overlap count in
(b)), 'd-pwan' (distance type, h = 0.05 as in the paper's protocol (b)). Anchors: pycpd / probreg
CPD (beta=2, lambda=2, w=0.1 as in the paper's settings) and the best-similarity oracle (Procrustes
with the known correspondences, a floor for any method that is not truly non-rigid). Column
``refused``: draws whose result PWAN's self-check refused (its MSE still counts in the median).

    python bench/bench_nonrigid.py --data ../shared/data --results results/nonrigid --protocol a
    python bench/bench_nonrigid.py --data ../shared/data --results results/nonrigid --protocol b
    python bench/bench_nonrigid.py --protocol humans   # SHREC'19 bodies (see bench/humans.py)

``--unrotate``: the source is first turned by the rotation of its best similarity to the
reference (known correspondences, all points), so the pair differs by scale, translation and the
deformation only: the setting where CPD from identity works (the bcpd pairs as stored are rotated
59-93 deg, where it fails). Run with ``--starts 1`` (a single rigid pre-alignment from identity)
for PWAN's cost in that setting.

``--device cuda``: PWAN on a GPU (pycpd / probreg stay on the CPU), each setting's first
registration (graph build) timed apart.

``--also KEY=VALUE ...``: the method ``pwan[KEY=VALUE,...]`` is m-PWAN with these configuration
overrides (e.g. ``cuda_graphs=false``), run side by side on the same draws.

``--baseline DIR``: the method 'pwan-baseline' is m-PWAN by another checkout's core (e.g. main:
``git worktree add /tmp/pwan_base main``), run in the same process on the same draws.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Timer, key_values, print_table, write_results  # noqa: E402
import anchors  # noqa: E402

from pwan_ros.core import RegistrationConfig, register  # noqa: E402


def load_pair(data_dir, shape):
    d = os.path.join(data_dir, 'nonrigid', 'bcpd')

    def path(name):  # armadillo's pair is gzipped
        p = os.path.join(d, name)
        return p if os.path.isfile(p) else p + '.gz'

    y = np.loadtxt(path(f'{shape}-y.txt'))  # source (moves)
    x = np.loadtxt(path(f'{shape}-x.txt'))  # reference
    return y, x


def best_similarity(src, ref):
    """(r (d, d), scale, src centroid, ref centroid) of the similarity ref ~ scale r (src - ms) +
    mr, point i of src corresponding to point i of ref (Umeyama)."""
    ms, mr = src.mean(0), ref.mean(0)
    a, b = src - ms, ref - mr
    u, s, vt = np.linalg.svd(b.T @ a)
    d = np.ones(src.shape[1])
    d[-1] = np.sign(np.linalg.det(u @ vt))
    return u @ np.diag(d) @ vt, (s * d).sum() / (a**2).sum(), ms, mr


def unrotated(y, x):
    """y (n, d) turned about its centroid by the rotation of its best similarity to x (n, d):
    what is left is scale, translation and the deformation."""
    r, _, ms, _ = best_similarity(y, x)
    return (y - ms) @ r.T + ms


def standardise(p):
    return (p - p.mean(0)) / p.std()


def similarity_oracle(src, ref):
    """src moved by its best similarity to ref, known correspondences (the MSE floor of any
    method that is not truly non-rigid)."""
    r, scale, ms, mr = best_similarity(src, ref)
    return scale * (src - ms) @ r.T + mr


def mse(a, b):
    return float(np.mean(np.sum((a - b) ** 2, axis=1)))


def run_method(method, src, ref, pwan_cfg, baseline=None, baseline_cfg=None, also_cfg=None):
    """(moved source (n, d) or None, status): PWAN's 'ok' | 'refused', '' for the anchors."""
    if method == 'pwan':
        res = register(src, ref, pwan_cfg)
        return res.transformed_source, res.status
    if method.startswith('pwan['):
        res = register(src, ref, also_cfg)
        return res.transformed_source, res.status
    if method == 'pwan-baseline':
        if baseline is None:
            raise SystemExit('pwan-baseline needs --baseline DIR')
        res = baseline.register(src, ref, baseline_cfg)
        return res.transformed_source, getattr(res, 'status', '')
    if method == 'd-pwan':
        # the paper's d-PWAN setting for partial overlap: h = 0.05 in the standardised units
        res = register(
            src, ref, pwan_cfg.replace(divergence='distance', mass=None, distance_threshold=0.05)
        )
        return res.transformed_source, res.status
    if method == 'pycpd':
        return anchors.pycpd_deformable(src, ref), ''
    if method == 'probreg-cpd':
        return anchors.probreg_cpd_deformable(src, ref), ''
    if method == 'oracle-similarity':
        return None, ''
    raise SystemExit(f'unknown method {method}')


def run_humans(args):
    import humans

    if args.methods == ['pwan', 'pycpd', 'probreg-cpd', 'oracle-similarity']:
        args.methods = ['pwan', 'pycpd-b0.3', 'pycpd-b2', 'bcpd']
    also = key_values(args.also)
    if also:  # m-PWAN with these overrides, next to the defaults on the same draws
        args.methods.insert(
            args.methods.index('pwan') + 1 if 'pwan' in args.methods else 0,
            'pwan[' + ','.join(args.also) + ']',
        )
    rows, summary = humans.run(args, key_values(args.set), also)
    print_table(
        summary,
        humans.COLUMNS,
        f'SHREC19 human bodies, {args.points or 1500} points, {args.runs} draws: '
        'median MSE (normalised units), right = MSE <= identity / 2',
    )
    write_results(args.results, f'bench_nonrigid_humans_{args.points or 1500}', rows, summary)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('--data', default='../shared/data')
    p.add_argument('--results', default='results/nonrigid')
    p.add_argument('--protocol', choices=('a', 'b', 'humans'), default='a')
    p.add_argument(
        '--pairs', nargs='+', help="humans: pairs as SRC-REF (default: the README's ten)"
    )
    p.add_argument(
        '--variants', nargs='+', help='humans: complete cropped outliers (default: all)'
    )
    p.add_argument(
        '--shapes', nargs='+', default=['fish', 'bunny', 'monkey'], help='also: armadillo'
    )
    p.add_argument(
        '--ratios',
        type=float,
        nargs='+',
        help='(a) outlier ratios, default 0.2 0.6 1.0 1.2; '
        '(b) retained fraction s, default 0.7 0.85 1.0',
    )
    p.add_argument('--runs', type=int, default=3, help='random draws per setting')
    p.add_argument(
        '--points',
        type=int,
        help='points sampled from each set (default: 500 in (a), 1000 in (b), as the paper); '
        'larger values measure how the methods scale',
    )
    p.add_argument(
        '--methods', nargs='+', default=['pwan', 'pycpd', 'probreg-cpd', 'oracle-similarity']
    )
    p.add_argument(
        '--starts',
        type=int,
        default=24,
        help='multi-start count of the rigid pre-alignment (the bcpd pairs are rotated 59-93 deg)',
    )
    p.add_argument(
        '--unrotate',
        action='store_true',
        help="remove the pairs' rotation first (the setting where CPD from identity works)",
    )
    p.add_argument(
        '--start-steps', type=int, default=60, help='tournament short-run steps (start_steps)'
    )
    p.add_argument(
        '--set', nargs='*', default=[], help='PWAN config overrides key=value (YAML values)'
    )
    p.add_argument(
        '--device',
        default='cpu',
        help="PWAN's device (cpu, cuda, cuda:N); not cpu: the first registration of each "
        'setting (graph build) is run once untimed and reported as warmup_s',
    )
    p.add_argument(
        '--baseline', help="checkout whose pwan_ros/core runs the method 'pwan-baseline'"
    )
    p.add_argument(
        '--also',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help="also the method 'pwan[KEY=VALUE,...]': m-PWAN with these overrides (YAML values)",
    )
    args = p.parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    # every method on one thread: torch, and the BLAS under numpy that pycpd and probreg use
    # (it would take every core: pycpd's CPU seconds were twice its wall time on 2 cores)
    torch.set_num_threads(1)
    threadpool_limits(1)
    if args.protocol == 'humans':
        return run_humans(args)
    baseline = None
    if args.baseline:
        from bench_engine import load_core

        baseline = load_core(args.baseline)
        if 'pwan-baseline' not in args.methods:
            args.methods.insert(1, 'pwan-baseline')
    ratios = args.ratios or ([0.2, 0.6, 1.0, 1.2] if args.protocol == 'a' else [0.7, 0.85, 1.0])
    overrides = key_values(args.set)
    also = key_values(args.also)
    also_name = 'pwan[' + ','.join(args.also) + ']'
    if also and also_name not in args.methods:
        args.methods.insert(
            args.methods.index('pwan') + 1 if 'pwan' in args.methods else 0, also_name
        )
    overrides.setdefault('device', args.device)
    rows, summary, warmup = [], [], []
    for shape in args.shapes:
        y_all, x_all = load_pair(args.data, shape)
        if args.unrotate:
            y_all = unrotated(y_all, x_all)
        for ratio in ratios:
            errs = {m: [] for m in args.methods}
            times = {m: [] for m in args.methods}
            cpus = {m: [] for m in args.methods}
            refused = {m: 0 for m in args.methods}  # draws PWAN's self-check refused
            for run in range(args.runs):
                rng = np.random.default_rng(1000 * run + 7)
                if args.protocol == 'a':
                    n = min(args.points or 500, len(y_all))
                    idx = rng.choice(len(y_all), size=n, replace=False)
                    src, ref = y_all[idx], x_all[idx]
                    lo, hi = ref.min(0), ref.max(0)
                    out = rng.uniform(lo, hi, size=(int(round(ratio * n)), ref.shape[1]))
                    src = standardise(src)
                    ref_all = np.vstack((ref, out))
                    ref_all = (ref_all - ref_all.mean(0)) / ref_all.std()
                    ref = ref_all[:n]
                    keep_s = np.arange(n)
                    cfg = {'transform': 'nonrigid', 'mass': float(n)}
                else:
                    n = min(args.points or 1000, len(y_all))
                    idx = rng.choice(len(y_all), size=n, replace=False)
                    src0, ref0 = standardise(y_all[idx]), standardise(x_all[idx])

                    def cut(p, s):
                        nrm = rng.normal(size=p.shape[1])
                        proj = p @ nrm
                        return proj <= np.quantile(proj, s)

                    ms, mr = cut(src0, ratio), cut(ref0, ratio)
                    keep_s = np.flatnonzero(ms)
                    src, ref_all = src0[ms], ref0[mr]
                    both = ms & mr
                    overlap = max(3, int(both.sum()))
                    cfg = {
                        'transform': 'nonrigid',
                        'mass': float(min(overlap, len(src), len(ref_all))),
                    }
                    ref = None
                cfg.update(
                    {
                        'starts': args.starts,
                        'start_steps': args.start_steps if args.starts > 1 else 0,
                    }
                )
                cfg.update(overrides)
                pcfg = RegistrationConfig.from_dict(cfg)
                bcfg = baseline.RegistrationConfig.from_dict(cfg) if baseline else None
                acfg = RegistrationConfig.from_dict({**cfg, **also}) if also else None
                for m in ('pwan', 'pwan-baseline', also_name):
                    if run or pcfg.device == 'cpu' or m not in args.methods:
                        continue
                    with Timer() as tw:  # graph build of this setting's shapes, apart
                        run_method(m, src, ref_all, pcfg, baseline, bcfg, acfg)
                    warmup.append({'shape': shape, 'ratio': ratio, 'method': m, 'warmup_s': tw.s})
                    print(
                        f'{shape} ratio {ratio} {m} first registration: {tw.s:.1f} s', flush=True
                    )
                for m in args.methods:
                    status = ''
                    with Timer() as tm:
                        if m == 'oracle-similarity':
                            if args.protocol == 'a':
                                moved = similarity_oracle(src, ref)
                            else:
                                both_idx = np.flatnonzero(ms & mr)
                                moved_b = similarity_oracle(src0[both_idx], ref0[both_idx])
                                moved = None
                        else:
                            moved, status = run_method(m, src, ref_all, pcfg, baseline, bcfg, acfg)
                    if args.protocol == 'a':
                        err = mse(moved, ref)
                    else:
                        both_idx = np.flatnonzero(ms & mr)
                        if m == 'oracle-similarity':
                            err = mse(moved_b, ref0[both_idx])
                        else:
                            pos = {j: i for i, j in enumerate(keep_s)}
                            err = mse(moved[[pos[j] for j in both_idx]], ref0[both_idx])
                    errs[m].append(err)
                    refused[m] += status == 'refused'
                    times[m].append(tm.s)
                    cpus[m].append(tm.cpu)
                    rows.append(
                        {
                            'protocol': args.protocol,
                            'shape': shape,
                            'ratio': ratio,
                            'run': run,
                            'method': m,
                            'mse': err,
                            'time_s': tm.s,
                            'cpu_s': tm.cpu,
                            'status': status,
                        }
                    )
                    print(
                        f'{shape} ratio {ratio} run {run} {m}: MSE {err:.4f} '
                        f'({tm.s:.1f} s, CPU {tm.cpu:.1f} s)' + (f' {status}' if status else ''),
                        flush=True,
                    )
            for m in args.methods:
                e = np.array(errs[m])
                summary.append(
                    {
                        'shape': shape,
                        'ratio': ratio,
                        'method': m,
                        'median': float(np.median(e)),
                        'std': float(np.std(e)),
                        'n': int(e.size),
                        'time_s': float(np.mean(times[m])),
                        'cpu_s': float(np.mean(cpus[m])),
                        'refused': refused[m] if m.startswith(('pwan', 'd-pwan')) else '-',
                    }
                )
    print_table(
        summary,
        ['shape', 'ratio', 'method', 'median', 'std', 'time_s', 'cpu_s', 'n', 'refused'],
        f'bcpd non-rigid pairs, protocol ({args.protocol})'
        + (', rotation removed' if args.unrotate else '')
        + ': MSE (normalised units)',
    )
    if warmup:
        print_table(
            warmup, ['shape', 'ratio', 'method', 'warmup_s'], 'first registration (graph build), s'
        )
    name = f'bench_nonrigid_{args.protocol}' + ('_unrotated' if args.unrotate else '')
    write_results(args.results, name, rows, summary + warmup)


if __name__ == '__main__':
    main()
