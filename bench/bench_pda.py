"""Partial domain adaptation benchmark on Office-Caltech10 features (paper Sec. 5 protocol).

The labelled domain keeps all 10 classes; the unlabelled domain keeps classes 1-5 (ids 0-4).
Columns (``--methods``), all with the package defaults (:class:`AdaptConfig`) unless ``--set``:

* ``logreg``: source-only multinomial logistic regression (L2, C = 1, z-scored inputs, L-BFGS;
  torch, no extra dependency); ``mlp``: source-only bottleneck network (``method=source_only``,
  all labelled rows) - the two source-only anchors;
* ``pwan``: the adapted model's last iterate (trained on the labelled rows minus the held-out
  split); ``deployed``: what ``pwan_adapt`` deploys (the adapted snapshot selected without
  target labels or, when it fails the safeguard, the source-only model on all labelled rows:
  the network trained beside it in lock-step, or the package's logistic regression when the
  held-out rows show it better) - one run gives both;
* ``wgan``: complete alignment (m_alpha = 1), ``source_only``: same as mlp;
* ``kmm``, ``dreweight``: library methods (``skada`` 0.6, the ``bench`` extra; imported only
  when asked for): sample reweighting of the labelled rows toward the unlabelled domain, then the
  logreg column's classifier (scikit-learn ``LogisticRegression``, C = 1, L-BFGS) fitted with
  those weights, on the same z-scored inputs. ``kmm``: kernel mean matching (Huang et al. 2007;
  RBF kernel, gamma = 1 / D, skada's other defaults); ``dreweight``: weights p_u / p_l from a
  logistic domain classifier. Reweighting is the classic partial-DA mechanism: rows of classes
  absent from the unlabelled domain get small weights. logreg, kmm and dreweight are
  deterministic: they run once (first seed).

Accuracy is on all unlabelled rows, measured once at the end (no model selection with target
labels); ``abs`` is the fraction of predictions in the 5 absent classes.

``--features synthetic``: partial-domain tasks with a known shift, generated here (tasks
``s0`` .. ``s1``: the unlabelled rows moved by s class distances toward the absent classes; see
:func:`synthetic_sets`).

``--copies`` runs transformed copies of the features that leave a linear source-only model's
decision function unchanged: ``rot4096`` (a random orthonormal map into 4096-d), ``x0.01``,
``x100`` (global scaling) and ``shift`` (a random offset 10x the features' RMS norm).

  python bench/bench_pda.py --features googlenet --copies orig rot4096 x0.01 x100 shift --seeds 0 \
      --out results/pda_googlenet.json
  python bench/bench_pda.py --features surf --seeds 0 --out results/pda_surf.json
  python bench/bench_pda.py --merge results/pda_googlenet.json results/pda_surf.json

``--estimates`` prints the m0 estimate per task; ``--confusion`` where each present class's
unlabelled rows go under source-only and under the adapted final weights, next to logistic
regression on that domain's own labels (a yardstick no method may use):

  python bench/bench_pda.py --confusion --tasks 'A>W' 'A>D'
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
from pwan_ros.adaptation.safeguard import adapt_with_safeguard
from pwan_ros.adaptation.trainer import fit_input_norm

SETS = {
    'googlenet': (
        'office_caltech10_googlenet',
        '{}.mat',
        ('amazon', 'dslr', 'webcam'),
        ['A>W', 'A>D', 'W>A', 'D>A', 'D>W', 'W>D'],
    ),
    'surf': (
        'office_caltech10_surf',
        '{}_SURF_L10.mat',
        ('amazon', 'Caltech10', 'dslr', 'webcam'),
        [f'{a}>{b}' for a, b in itertools.permutations('ACDW', 2)],
    ),
    # generated here (synthetic_sets): no folder, no files
    'synthetic': (None, None, (), ['s0', 's0.25', 's0.5', 's0.75', 's1']),
}
LETTER = {'A': 'amazon', 'C': 'Caltech10', 'D': 'dslr', 'W': 'webcam'}
#: Office-Caltech10's classes in label order (../shared/data/README.md)
CLASSES = (
    'back_pack',
    'bike',
    'calculator',
    'headphones',
    'keyboard',
    'laptop',
    'monitor',
    'mouse',
    'mug',
    'projector',
)
KEEP = 5  # the unlabelled domain keeps classes 0..KEEP-1


def load_domain(data: str, features: str, name: str):
    folder, pattern, _, _ = SETS[features]
    path = os.path.join(data, folder, pattern.format(name))
    if not os.path.isfile(path):
        raise SystemExit(f'missing data file {path} (pass --data DIR pointing at shared/data/pda)')
    m = sio.loadmat(path)
    return m['fts'].astype(np.float32), m['labels'].ravel().astype(np.int64) - 1


COPIES = ('orig', 'rot4096', 'x0.01', 'x100', 'shift')


def transform(copy: str, xs: np.ndarray, xt: np.ndarray, seed: int = 0):
    """The same transformation of both domains (see the module docstring)."""
    if copy == 'orig':
        return xs, xt
    if copy == 'rot4096':
        q, _ = np.linalg.qr(np.random.default_rng([seed, 4096]).normal(size=(4096, xs.shape[1])))
        q = q.astype(np.float32)
        return xs @ q.T, xt @ q.T
    if copy in ('x0.01', 'x100'):
        c = np.float32(float(copy[1:]))
        return xs * c, xt * c
    if copy == 'shift':
        v = np.random.default_rng([seed, 7]).normal(size=xs.shape[1])
        v *= 10 * np.sqrt((xs.astype(np.float64) ** 2).sum(1).mean()) / np.linalg.norm(v)
        v = v.astype(np.float32)
        return xs + v, xt + v
    raise SystemExit(f'unknown copy {copy!r} (one of {", ".join(COPIES)})')


def synthetic_sets(task, dim=256, k=10, n=80, sep=5.0):
    """A partial-domain task with a known shift: K Gaussian classes in ``dim`` dimensions (unit
    noise, class means ~``sep`` apart), ``n`` rows per class; labelled: all classes; unlabelled:
    classes 0..KEEP-1 translated by ``s * sep`` toward the mean of the absent classes' means
    (task ``s<s>``: s = 0 no shift, s = 1 one class distance). The shift pushes the unlabelled
    rows toward classes that are absent there: source-only predicts them more the larger s is
    (logistic regression: 9 % of the rows at s = 0, 79 % at s = 1), the trap partial
    alignment is for. The data is fixed (generator 2026); ``--seeds`` vary the training only."""
    shift = float(task[1:])
    rng = np.random.default_rng(2026)
    means = rng.normal(size=(k, dim)) * sep / np.sqrt(2 * dim)
    ll = np.repeat(np.arange(k), n)
    xl = means[ll] + rng.normal(size=(k * n, dim))
    u = means[KEEP:].mean(0) - means[:KEEP].mean(0)
    u /= np.linalg.norm(u)
    lu = np.repeat(np.arange(KEEP), n)
    xu = means[lu] + rng.normal(size=(KEEP * n, dim)) + shift * sep * u
    return xl.astype(np.float32), ll, xu.astype(np.float32), lu


def task_sets(data, features, task, copy='orig'):
    if features == 'synthetic':
        xs, ls, xt, lt = synthetic_sets(task)
        xs, xt = transform(copy, xs, xt)
        return FeatureSet(xs, ls, path='labelled'), FeatureSet(xt, lt, path='unlabelled')
    a, b = task.split('>')
    xs, ls = load_domain(data, features, LETTER[a])
    xt, lt = load_domain(data, features, LETTER[b])
    keep = lt < KEEP
    xs, xt = transform(copy, xs, xt[keep])
    return FeatureSet(xs, ls, path=LETTER[a]), FeatureSet(xt, lt[keep], path=LETTER[b])


def _scores(tr):
    res = tr.evaluate()
    return {'accuracy': res.accuracy, 'absent': res.absent_fraction}


def check_rows(unl, count: int, seed: int):
    """``count`` random rows of the unlabelled domain with their labels (``--check-rows``): what a
    user labels by hand to check the safeguard's candidates; None for 0."""
    if count <= 0:
        return None
    idx = np.sort(np.random.default_rng([seed, 1013]).choice(unl.n, min(count, unl.n), False))
    return FeatureSet(unl.rows(idx), unl.labels[idx], path='check')


def run_method(lab, unl, method, seed, overrides, check_count: int = 0):
    """One trainer run: mlp/source_only, wgan; 'pwan' gives both the pwan and the deployed row
    (with ``check_count`` > 0 the safeguard also compares its candidates on that many labelled
    rows of the unlabelled domain)."""
    if method == 'mlp':
        method = 'source_only'
    cfg = AdaptConfig.from_mapping(dict(overrides, method=method, seed=seed))
    t0 = time.perf_counter()
    if method == 'pwan' and cfg.safeguard:
        deployed, final, source, decision = adapt_with_safeguard(
            cfg, lab, unl, check_rows(unl, check_count, seed)
        )
        dt = time.perf_counter() - t0
        d = decision.to_dict()
        extra = {
            'decision': d['deployed'],
            'reason': d['reason'],
            'snapshot': d['snapshot_step'],
            'criteria': {k: d[k] for k in ('adapted', 'source_only')},
            'companion': _scores(source),
            'm0': float(deployed.state.m0) if d['deployed'] == 'adapted' else None,
            'check': d['check'],
        }
        return [
            dict(
                method='pwan',
                seconds=dt,
                accuracy=final.accuracy,
                absent=final.absent_fraction,
                **extra,
            ),
            dict(
                method='deployed',
                seconds=dt,
                **_scores(deployed),
                decision=d['deployed'],
                snapshot=d['snapshot_step'],
                source_model=d['source_only_model'],
                val={'mlp': d['source_only']['val_accuracy'], 'linear': d['linear_val_accuracy']},
                linear_tests=d['linear_tests'],
            ),
        ]
    tr = AdaptTrainer(cfg, lab, unl)
    tr.train()
    return [
        dict(
            method=method if method != 'source_only' else 'mlp',
            seconds=time.perf_counter() - t0,
            **_scores(tr),
        )
    ]


def run_logreg(lab, unl, seed, c_reg=1.0):
    """Multinomial logistic regression, loss sum CE + ||W||^2 / (2 C) (scikit-learn's objective),
    on labelled-z-scored inputs, L-BFGS in float64 (deterministic)."""
    t0 = time.perf_counter()
    pred = logreg_predict(lab, unl, c_reg)
    return [
        {
            'method': 'logreg',
            'accuracy': float((pred == unl.labels).mean()),
            'absent': float((pred >= KEEP).mean()),
            'seconds': time.perf_counter() - t0,
        }
    ]


def own_label_predictions(unl, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Predictions for the unlabelled rows by logistic regression trained on the *other* rows of
    the same domain with their labels (stratified ``folds``-fold cross-validation): how separable
    the domain is in itself, a diagnostic that uses the labels no method may use."""
    rng = np.random.default_rng(seed)
    fold = np.empty(unl.n, dtype=np.int64)
    for c in np.unique(unl.labels):
        rows = rng.permutation(np.flatnonzero(unl.labels == c))
        fold[rows] = np.arange(rows.size) % folds
    pred = np.empty(unl.n, dtype=np.int64)
    for f in range(folds):
        train, test = fold != f, fold == f
        fit = FeatureSet(unl.features[train], unl.labels[train], path='fit')
        pred[test] = logreg_predict(fit, FeatureSet(unl.features[test], unl.labels[test]))
    return pred


def logreg_predict(lab, unl, c_reg=1.0) -> np.ndarray:
    """Predicted classes of ``unl``'s rows by :func:`run_logreg`'s classifier fitted on ``lab``."""
    mean, scale = fit_input_norm(lab, 'zscore', 4096)
    x = torch.from_numpy((lab.features - mean) * scale).double()
    y = torch.from_numpy(lab.labels)
    k = int(lab.labels.max()) + 1
    w = torch.zeros(x.shape[1], k, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b], lr=1, max_iter=500, tolerance_grad=1e-8, line_search_fn='strong_wolfe'
    )

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y, reduction='sum') + (w * w).sum() / (
            2 * c_reg
        )
        loss.backward()
        return loss

    opt.step(closure)
    xt = torch.from_numpy((unl.features - mean) * scale).double()
    with torch.no_grad():
        return (xt @ w + b).argmax(1).numpy()


SKADA = ('kmm', 'dreweight')


def run_skada(lab, unl, method):
    """A skada reweighting adapter + weighted logistic regression (see the module docstring)."""
    import warnings

    try:
        from skada import DiscriminatorReweightAdapter, KMMReweightAdapter, make_da_pipeline
        from skada.utils import source_target_merge
        from sklearn.linear_model import LogisticRegression
    except ImportError as exc:
        raise SystemExit(
            f'--methods {method} needs skada (pip install -e .[bench]): {exc}'
        ) from None
    t0 = time.perf_counter()
    mean, scale = fit_input_norm(lab, 'zscore', 4096)
    xs = (lab.features - mean) * scale
    xt = (unl.features - mean) * scale
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # "sample_domain inferred" notice
        x, y, domain = source_target_merge(xs, xt, lab.labels, None)
    adapter = (
        KMMReweightAdapter(gamma=1.0 / xs.shape[1])
        if method == 'kmm'
        else DiscriminatorReweightAdapter()
    )
    clf = LogisticRegression(C=1.0, max_iter=1000).set_fit_request(sample_weight=True)
    pipe = make_da_pipeline(adapter, clf)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # convergence and 'sample_domain inferred' notices
        pipe.fit(x, y, sample_domain=domain)
        pred = pipe.predict(xt)
    return [
        {
            'method': method,
            'accuracy': float((pred == unl.labels).mean()),
            'absent': float((pred >= KEEP).mean()),
            'seconds': time.perf_counter() - t0,
        }
    ]


def print_estimates(data, features, tasks, seed, overrides):
    """The m0 estimate where alignment starts, against the truth (``--estimates``): the adapted
    model is trained through its warm-up (plain cross-entropy), then m0 = K / |classes predicted
    for more than 1/K of the unlabelled rows| (the paper's rule, what the trainer uses) and the
    true K / |present classes| = 2, with the absent-class mass of the hard and soft predictions
    (what mu starts from)."""
    cfg = AdaptConfig.from_mapping(dict(overrides, seed=seed))
    print('\n| features | task | m0 (paper rule) | true m0 | absent mass, hard | absent, soft |')
    print('|---|---|---|---|---|---|')
    for task in tasks:
        lab, unl = task_sets(data, features, task)
        tr = AdaptTrainer(cfg, lab, unl)
        tr.train(until=cfg.warmup_steps + 1)  # the first aligning step estimates m0
        soft, hard = tr.class_fractions()
        k, present = tr.num_classes, np.bincount(unl.labels, minlength=tr.num_classes) > 0
        print(
            f'| {features} | {task} | {tr.state.m0:.2f} | {k / present.sum():.2f} | '
            f'{hard[~present].sum():.3f} | {soft[~present].sum():.3f} |',
            flush=True,
        )
    return 0


def confusion(truth: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    """(k, k) counts: row = true class, column = predicted class."""
    out = np.zeros((k, k), dtype=np.int64)
    np.add.at(out, (truth, pred), 1)
    return out


def print_confusion(data, features, tasks, seed, overrides, copy='orig'):
    """Where the unlabelled rows go (``--confusion``): per present class, the classes the
    source-only model (``method=source_only``) and the adapted model's final weights predict for
    its rows, both trained on all labelled rows without the safeguard, first seed; and, as a
    yardstick, logistic regression trained on the unlabelled domain's own labels
    (:func:`own_label_predictions`). Shows which confusions adaptation fixes and which it keeps,
    and whether the domain itself separates them."""
    names = CLASSES if features != 'synthetic' else tuple(f'c{i}' for i in range(10))
    for task in tasks:
        lab, unl = task_sets(data, features, task, copy)
        k = int(lab.labels.max()) + 1
        print(f'\n{features} {copy} {task}, seed {seed}: rows = true class, columns = predicted')
        print('| true class | model | ' + ' | '.join(names[:k]) + ' | accuracy |')
        print('|---|---|' + '---|' * (k + 1))
        for method in ('source_only', 'pwan', 'own_labels'):
            if method == 'own_labels':
                pred = own_label_predictions(unl, seed=seed)
            else:
                cfg = AdaptConfig.from_mapping(
                    dict(overrides, method=method, seed=seed, safeguard=False)
                )
                tr = AdaptTrainer(cfg, lab, unl)
                tr.train()
                pred = tr.evaluate().predictions
            cm = confusion(unl.labels, pred, k)
            for c in np.flatnonzero(cm.sum(1)):
                acc = cm[c, c] / cm[c].sum()
                cells = ' | '.join(str(v) if v else '.' for v in cm[c])
                print(f'| {names[c]} | {method} | {cells} | {acc:.2f} |', flush=True)
    return 0


def _spread(values) -> str:
    """'mean' or 'mean +- sample std' (several seeds)."""
    v = np.asarray(values, dtype=float)
    return f'{v.mean():.3f}' if v.size < 2 else f'{v.mean():.3f}±{v.std(ddof=1):.3f}'


def _chose(r) -> str:
    """The safeguard's choice in a deployed row: A = adapted (@ its snapshot step), M = the
    source-only network, L = the linear source-only model (rows from before it: M)."""
    if r['decision'] == 'adapted':
        return 'A' + (f"@{r['snapshot']}" if r.get('snapshot') is not None else '')
    return 'L' if r.get('source_model') == 'linear' else 'M'


def _best_source_gap(acc) -> str:
    """deployed - max(logreg, mlp) in points, of the seed means; '-' without those columns."""
    if not ('deployed' in acc and ('logreg' in acc or 'mlp' in acc)):
        return '-'
    best = max(np.mean(list(acc[m].values())) for m in ('logreg', 'mlp') if m in acc)
    return f"{100 * (np.mean(list(acc['deployed'].values())) - best):+.1f}"


def print_table(rows, methods):
    """Markdown table per (features, copy, task): accuracy on the unlabelled rows, mean ± sample
    std over seeds, and the absent-class prediction rate (abs, mean); deployed - mlp in points
    (mean of the per-seed differences, min..max when several seeds); deployed - the better
    source-only column (logreg or mlp, seed means); the safeguard's choice per seed (in seed
    order, :func:`_chose`)."""
    methods = [m for m in methods if any(r['method'] == m for r in rows)]
    keys = list(
        dict.fromkeys((r.get('features', ''), r.get('copy', 'orig'), r['task']) for r in rows)
    )
    print(
        '\n| features | copy | task | '
        + ' | '.join(methods)
        + ' | deployed - mlp | deployed - max(logreg, mlp) | safeguard chose |'
    )
    print('|---|---|---|' + '---|' * (len(methods) + 3))
    means = {m: [] for m in methods}
    for key in keys:
        sel = [r for r in rows if (r.get('features', ''), r.get('copy', 'orig'), r['task']) == key]
        cells, acc = [], {}
        for m in methods:
            rs = [r for r in sel if r['method'] == m]
            if not rs:
                cells.append('-')
                continue
            acc[m] = {r['seed']: r['accuracy'] for r in rs}
            means[m].append(np.mean(list(acc[m].values())))
            cells.append(
                f"{_spread(list(acc[m].values()))} (abs {np.mean([r['absent'] for r in rs]):.3f})"
            )
        diff = '-'
        if 'deployed' in acc and 'mlp' in acc:
            d = [
                100 * (acc['deployed'][s] - acc['mlp'][s])
                for s in acc['deployed']
                if s in acc['mlp']
            ]
            diff = f'{np.mean(d):+.1f}' + (
                f' ({min(d):+.1f}..{max(d):+.1f})' if len(d) > 1 else ''
            )
        deployed = sorted((r for r in sel if r['method'] == 'deployed'), key=lambda r: r['seed'])
        chose = ' '.join(_chose(r) for r in deployed) or '-'
        gap = _best_source_gap(acc)
        print(
            f'| {key[0]} | {key[1]} | {key[2]} | '
            + ' | '.join(cells)
            + f' | {diff} | {gap} | {chose} |'
        )
    print(
        '| mean | | | '
        + ' | '.join(f'{np.mean(means[m]):.3f}' if means[m] else '-' for m in methods)
        + ' | | | |'
    )
    secs = {m: np.mean([r['seconds'] for r in rows if r['method'] == m]) for m in methods}
    print('\nmean seconds per run: ' + ', '.join(f'{m} {v:.1f}' for m, v in secs.items()))


def merge(paths):
    """Print the table of several result files (e.g. seeds or feature sets run separately)."""
    rows, seen = [], set()
    for p in paths:
        with open(p) as fh:
            for r in json.load(fh)['rows']:
                key = (r.get('features'), r.get('copy'), r['task'], r['method'])
                if r['method'] in ('logreg', *SKADA):  # deterministic: one run per file
                    if key in seen:
                        continue
                    seen.add(key)
                rows.append(r)
    print_table(rows, list(dict.fromkeys(r['method'] for r in rows)))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument('--data', default='../shared/data/pda')
    ap.add_argument('--features', choices=sorted(SETS), default='googlenet')
    ap.add_argument('--tasks', nargs='*', help='subset of tasks, e.g. A>W D>A')
    ap.add_argument('--copies', nargs='*', default=['orig'], choices=COPIES)
    ap.add_argument(
        '--methods',
        nargs='*',
        default=['logreg', 'mlp', 'pwan'],
        choices=['logreg', 'mlp', 'pwan', 'wgan', *SKADA],
        help='pwan also gives the deployed column; kmm and dreweight need skada',
    )
    ap.add_argument('--seeds', nargs='*', type=int, default=[0])
    ap.add_argument(
        '--set', nargs='*', default=[], metavar='KEY=VALUE', help='AdaptConfig overrides'
    )
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument(
        '--estimates',
        action='store_true',
        help="only print the m0 estimate at the end of warm-up per task (first seed)",
    )
    ap.add_argument(
        '--confusion',
        action='store_true',
        help='only print, per task, the predicted classes of each present class of unlabelled '
        'rows: source-only, the adapted final weights (first seed and copy, no safeguard) and '
        "logistic regression on the unlabelled domain's own labels (5-fold, a yardstick)",
    )
    ap.add_argument(
        '--check-rows',
        type=int,
        default=0,
        metavar='N',
        help='pwan: the safeguard also compares its two candidates on N random labelled rows of '
        'the unlabelled domain (the check file of pwan_adapt; 0 = label-free only)',
    )
    ap.add_argument('--out', help='write all results as JSON here')
    ap.add_argument(
        '--merge', nargs='*', metavar='JSON', help='only print the table of earlier --out files'
    )
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
    if args.estimates:
        return print_estimates(args.data, args.features, tasks, args.seeds[0], overrides)
    if args.confusion:
        return print_confusion(
            args.data, args.features, tasks, args.seeds[0], overrides, args.copies[0]
        )
    rows = []
    # e.g. 'surf input_norm=l2' in the table
    label = ' '.join(
        [args.features, *args.set] + ([f'check_rows={args.check_rows}'] if args.check_rows else [])
    )
    print(
        f'# {args.features}  copies={args.copies}  overrides={overrides}  seeds={args.seeds}',
        flush=True,
    )
    for task, copy in itertools.product(tasks, args.copies):
        lab, unl = task_sets(args.data, args.features, task, copy)
        for method, seed in itertools.product(args.methods, args.seeds):
            if method in ('logreg', *SKADA) and seed != args.seeds[0]:
                continue  # deterministic: one run
            if method == 'logreg':
                out = run_logreg(lab, unl, seed)
            elif method in SKADA:
                out = run_skada(lab, unl, method)
            else:
                out = run_method(lab, unl, method, seed, overrides, args.check_rows)
            for r in out:
                rows.append(dict(features=label, copy=copy, task=task, seed=seed, **r))
                print(
                    f"{task:5s} {copy:8s} {r['method']:9s} seed={seed} acc={r['accuracy']:.4f} "
                    f"absent={r['absent']:.4f} t={r['seconds']:.1f}s {r.get('decision', '')}",
                    flush=True,
                )
        if args.out:  # after every task: a long run that is cut short keeps what it did
            _save(args, overrides, rows)
    print_table(rows, ['logreg', *SKADA, 'mlp', 'wgan', 'pwan', 'deployed'])
    return 0


def _save(args, overrides, rows):
    from pwan_ros.io.atomic import write_json

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json(args.out, {'features': args.features, 'overrides': overrides, 'rows': rows})


if __name__ == '__main__':
    sys.exit(main())
