"""Partial domain adaptation benchmark on Office-Caltech10 features (paper Sec. 5 protocol).

The labelled domain keeps all 10 classes; the unlabelled domain keeps classes 1-5 (ids 0-4).
Methods: PWAN, source-only (lambda1 = lambda2 = 0) and complete alignment (wgan, m_alpha = 1),
all run by the same trainer with the same defaults; plus a logistic-regression anchor
(scikit-learn, source-only). Accuracy is the last iterate on all unlabelled rows (no model
selection on target labels); time is the training wall time on this machine.

  python bench/bench_pda.py --data ../shared/data/pda --features googlenet --seeds 0 1 2 \
      --out results/pda_googlenet.json
  python bench/bench_pda.py --data ../shared/data/pda --features surf --out results/pda_surf.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import numpy as np
import scipy.io as sio
import torch

from pwan_ros.adaptation import AdaptConfig, AdaptTrainer, FeatureSet

SETS = {
    'googlenet': ('office_caltech10_googlenet', '{}.mat', ('amazon', 'dslr', 'webcam'),
                  ['A>W', 'A>D', 'W>A', 'D>A', 'D>W', 'W>D']),
    'surf': ('office_caltech10_surf', '{}_SURF_L10.mat', ('amazon', 'Caltech10', 'dslr', 'webcam'),
             [f'{a}>{b}' for a, b in itertools.permutations('ACDW', 2)]),
}
LETTER = {'A': 'amazon', 'C': 'Caltech10', 'D': 'dslr', 'W': 'webcam'}
KEEP = 5  # the unlabelled domain keeps classes 0..KEEP-1


def load_domain(data: str, features: str, name: str):
    folder, pattern, _, _ = SETS[features]
    path = os.path.join(data, folder, pattern.format(name))
    if not os.path.isfile(path):
        raise SystemExit(f'missing data file {path} (pass --data DIR pointing at shared/data/pda)')
    m = sio.loadmat(path)
    return m['fts'].astype(np.float32), m['labels'].ravel().astype(np.int64) - 1


def task_sets(data, features, task):
    a, b = task.split('>')
    xs, ls = load_domain(data, features, LETTER[a])
    xt, lt = load_domain(data, features, LETTER[b])
    keep = lt < KEEP
    return FeatureSet(xs, ls, path=LETTER[a]), FeatureSet(xt[keep], lt[keep], path=LETTER[b])


def run_method(lab, unl, method, seed, overrides):
    cfg = AdaptConfig.from_mapping(dict(overrides, method=method, seed=seed))
    tr = AdaptTrainer(cfg, lab, unl)
    t0 = time.perf_counter()
    tr.train()
    dt = time.perf_counter() - t0
    res = tr.evaluate()
    return {'accuracy': res.accuracy, 'absent': res.absent_fraction, 'seconds': dt}


def run_logreg(lab, unl, seed):
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import normalize
    except ImportError:
        raise SystemExit('the logreg anchor needs scikit-learn (pip install scikit-learn), '
                         'or leave logreg out of --methods') from None
    t0 = time.perf_counter()
    clf = LogisticRegression(max_iter=2000, random_state=seed).fit(normalize(lab.features), lab.labels)
    pred = clf.predict(normalize(unl.features))
    return {'accuracy': float((pred == unl.labels).mean()), 'absent': float((pred >= KEEP).mean()),
            'seconds': time.perf_counter() - t0}


def print_table(rows, tasks, methods):
    """Markdown table: mean accuracy over seeds (absent-class prediction rate, mean time)."""
    print('\n| task | ' + ' | '.join(methods) + ' |')
    print('|---|' + '---|' * len(methods))
    means = {m: [] for m in methods}
    for task in tasks:
        cells = []
        for m in methods:
            rs = [r for r in rows if r['task'] == task and r['method'] == m]
            acc, ab, sec = (np.mean([r[k] for r in rs]) for k in ('accuracy', 'absent', 'seconds'))
            means[m].append(acc)
            cells.append(f'{acc:.3f} (abs {ab:.3f}, {sec:.1f}s, n={len(rs)})')
        print(f'| {task} | ' + ' | '.join(cells) + ' |')
    print('| mean | ' + ' | '.join(f'{np.mean(means[m]):.3f}' for m in methods) + ' |')


def merge(paths):
    """Print the table of several result files (e.g. seeds run separately)."""
    rows = []
    for p in paths:
        with open(p) as fh:
            rows += json.load(fh)['rows']
    tasks = list(dict.fromkeys(r['task'] for r in rows))
    methods = list(dict.fromkeys(r['method'] for r in rows))
    print_table(rows, tasks, methods)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--data', default='../shared/data/pda')
    ap.add_argument('--features', choices=sorted(SETS), default='googlenet')
    ap.add_argument('--tasks', nargs='*', help='subset of tasks, e.g. A>W D>A')
    ap.add_argument('--methods', nargs='*', default=['source_only', 'wgan', 'pwan', 'logreg'])
    ap.add_argument('--seeds', nargs='*', type=int, default=[0, 1, 2])
    ap.add_argument('--set', nargs='*', default=[], metavar='KEY=VALUE', help='AdaptConfig overrides')
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--out', help='write all results as JSON here')
    ap.add_argument('--merge', nargs='*', metavar='JSON', help='only print the table of earlier --out files')
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge)
    torch.set_num_threads(args.threads)
    defaults = AdaptConfig()
    overrides = {'device': 'cpu', 'plots': False}
    for kv in args.set:
        k, v = kv.split('=', 1)
        typ = type(getattr(defaults, k))
        overrides[k] = (v.lower() in ('1', 'true', 'yes')) if typ is bool else typ(v)
    tasks = args.tasks or SETS[args.features][3]
    rows = []
    print(f'# {args.features}  overrides={overrides}  seeds={args.seeds}', flush=True)
    for task in tasks:
        lab, unl = task_sets(args.data, args.features, task)
        for method in args.methods:
            for seed in args.seeds:
                r = run_logreg(lab, unl, seed) if method == 'logreg' else run_method(lab, unl, method, seed, overrides)
                rows.append(dict(task=task, method=method, seed=seed, **r))
                print(f"{task:5s} {method:12s} seed={seed} acc={r['accuracy']:.4f} absent={r['absent']:.4f} "
                      f"t={r['seconds']:.1f}s", flush=True)
    print_table(rows, tasks, args.methods)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as fh:
            json.dump({'features': args.features, 'overrides': overrides, 'rows': rows}, fh, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
