"""Timing of the default rigid registration (and anchors, same process, same inputs).

Inputs: the Stanford bunny pair bun000 -> bun045 (34 deg apart), jointly normalised into
[-1, 1]^3, randomly subsampled to N points per cloud. Reports wall time, transform steps,
potential updates, rotation error, torch threads, and process CPU seconds (cpu_s: with one
torch thread this is the wall time the run would take on an idle core). Wall timings are noisy
on shared machines: repeat with --repeats and compare methods within one run.

    python bench/bench_speed.py --data ../shared/data --results results/speed \
        --sizes 1000 2000 5000
    # multi-start cost:
    python bench/bench_speed.py --sizes 2000 --methods pwan pwan-24 pwan-24-keep2-200
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Timer, bunny_poses, print_table, rotation_error_deg, write_results  # noqa: E402
from bench_rigid import make_pair  # noqa: E402
import anchors  # noqa: E402

from pwan_ros.core import RegistrationConfig, register  # noqa: E402


#: tournament variants: the recommended multi-start (defaults: 4 finalists, 600-step schedule) and
#: the previous schedule (2 finalists, 200 steps), 1 thread so that cpu_s is comparable
MULTISTART = {
    'pwan-24': {'starts': 24, 'start_steps': 60, 'threads': 1},
    'pwan-24-keep2-200': {
        'starts': 24,
        'start_steps': 60,
        'threads': 1,
        'start_keep': 2,
        'steps': 200,
    },
}


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('--data', default='../shared/data')
    p.add_argument('--results', default='results/speed')
    p.add_argument('--sizes', type=int, nargs='+', default=[1000, 2000, 5000])
    p.add_argument('--repeats', type=int, default=2)
    p.add_argument('--device', default='auto')
    p.add_argument(
        '--methods', nargs='+', default=['pwan', 'o3d-icp', 'trimmed-icp', 'probreg-cpd']
    )
    args = p.parse_args(argv)
    import torch

    poses = bunny_poses(args.data)
    src_n, ref_n, _, _, gt = make_pair(args.data, 'bun000', 'bun045', poses, 0.0, 0)
    rows, summary = [], []
    for n in args.sizes:
        for rep in range(args.repeats):
            rng = np.random.default_rng(rep)
            src = src_n[rng.choice(len(src_n), n, replace=False)]
            ref = ref_n[rng.choice(len(ref_n), n, replace=False)]
            for m in args.methods:
                with Timer() as tm:
                    extra = {}
                    if m in MULTISTART or m == 'pwan':
                        cfg = RegistrationConfig(
                            device=args.device, seed=rep, **MULTISTART.get(m, {})
                        )
                        res = register(src, ref, cfg)
                        est = res.transform
                        extra = {
                            'steps': res.iterations,
                            'updates': res.potential_updates,
                            'converged': res.converged,
                            'adversarial_s': res.timings['adversarial'],
                            'finetune_s': res.timings['finetune'],
                            'device': res.device,
                        }
                    elif m == 'o3d-icp':
                        est = anchors.o3d_icp(src, ref, 0.1)
                    elif m == 'trimmed-icp':
                        est = anchors.trimmed_icp(src, ref)
                    elif m == 'probreg-cpd':
                        est = anchors.probreg_cpd_rigid(src, ref)
                    else:
                        raise SystemExit(f'unknown method {m}')
                err = rotation_error_deg(est[:3, :3], gt[:3, :3])
                row = {
                    'n': n,
                    'repeat': rep,
                    'method': m,
                    'time_s': tm.s,
                    'cpu_s': tm.cpu,
                    'rot_err_deg': err,
                    'torch_threads': torch.get_num_threads(),
                    **extra,
                }
                rows.append(row)
                print(row, flush=True)
        for m in args.methods:
            sel = [r for r in rows if r['n'] == n and r['method'] == m]
            summary.append(
                {
                    'n': n,
                    'method': m,
                    'time_median_s': float(np.median([r['time_s'] for r in sel])),
                    'cpu_median_s': float(np.median([r['cpu_s'] for r in sel])),
                    'rot_err_median': float(np.median([r['rot_err_deg'] for r in sel])),
                    'steps': float(np.median([r.get('steps', 0) for r in sel])),
                    'updates': float(np.median([r.get('updates', 0) for r in sel])),
                }
            )
    print_table(
        summary,
        ['n', 'method', 'time_median_s', 'cpu_median_s', 'rot_err_median', 'steps', 'updates'],
        'Default rigid registration, bun000 -> bun045 (34 deg), N points per cloud',
    )
    write_results(args.results, 'bench_speed', rows, summary)


if __name__ == '__main__':
    main()
