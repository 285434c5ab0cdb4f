"""The SHREC'19 human bodies protocol of ``bench_nonrigid.py --protocol humans``.

Points: a random subset of each mesh's vertices (``--points``, 3 draws); ground truth at the 6890
template correspondences: MSE over those whose source vertex is in the subset, each to its
corresponding reference vertex, both shapes normalised by the reference's centre and max
|x - mean| (the dataset README's units). Variants: ``complete``; ``cropped`` (30 % of the source
cut off along a random direction, MSE on the kept correspondences); ``outliers`` (0.5 x |reference|
uniform points in the reference's box). PWAN gets the sets in metres, as a user gives them; the
anchors (pycpd beta 0.3 / 2, probreg BCPD) get them normalised, the units their defaults assume.
A result is right when its MSE is at most half the no-registration MSE.
"""

from __future__ import annotations

import os

import numpy as np

PAIRS = [
    ('12', '13'),
    ('23', '24'),
    ('11', '13'),
    ('11', '12'),
    ('24', '29'),
    ('22', '23'),
    ('16', '17'),
    ('33', '34'),
    ('33', '35'),
    ('34', '35'),
]
VARIANTS = ('complete', 'cropped', 'outliers')
#: pairs the dataset README does not list: across datasets (a 43k-vertex scan's dense hands onto
#: other people, the SMPL template) and across up axes (y up onto z up: a quarter turn)
CROSS_PAIRS = [
    ('13', '29'),
    ('11', '16'),
    ('17', '11'),
    ('22', '29'),
    ('29', '17'),
    ('44', '11'),
    ('12', '23'),
    ('23', '12'),
    ('12', '44'),
    ('44', '16'),
    ('35', '33'),
]


def load_shape(data_dir, nn):
    with np.load(
        os.path.join(data_dir, 'nonrigid', 'shrec19_humans', f'shape_{nn}.npz'), allow_pickle=False
    ) as z:
        return z['vertices'].astype(np.float64), z['triangles'], z['smpl_matches']


class Case:
    """One draw of one pair and variant: ``src``, ``ref`` (metres), ``gt_src`` (indices into
    src), ``gt_ref`` (their reference vertices, normalised), ``centre``, ``scale``."""

    def __init__(self, data_dir, pair, variant, points, seed):
        vs, _, ms = load_shape(data_dir, pair[0])
        vr, _, mr = load_shape(data_dir, pair[1])
        rng = np.random.default_rng(seed)
        isrc = rng.choice(len(vs), size=min(points, len(vs)), replace=False)
        iref = rng.choice(len(vr), size=min(points, len(vr)), replace=False)
        self.centre = vr.mean(0)
        self.scale = float(np.abs(vr - self.centre).max())
        src, ref = vs[isrc], vr[iref]
        keep = np.ones(len(src), bool)
        if variant == 'cropped':
            direction = rng.normal(size=3)
            proj = (src - src.mean(0)) @ direction
            keep = proj <= np.quantile(proj, 0.7)
        if variant == 'outliers':
            lo, hi = ref.min(0), ref.max(0)
            ref = np.vstack((ref, rng.uniform(lo, hi, size=(len(ref) // 2, 3))))
        pos = -np.ones(len(vs), int)
        pos[isrc[keep]] = np.arange(keep.sum())
        src = src[keep]
        k = np.flatnonzero(pos[ms] >= 0)  # template indices whose source vertex was drawn
        self.src, self.ref = src, ref
        self.gt_src = pos[ms[k]]
        self.gt_ref = self.norm(vr[mr[k]])
        self.identity_mse = self.mse(src)

    def norm(self, p):
        return (p - self.centre) / self.scale

    def mse(self, moved_metres):
        d = self.norm(moved_metres[self.gt_src]) - self.gt_ref
        return float(np.mean(np.sum(d**2, axis=1)))


def run_anchor(method, case):
    """The source moved by an anchor (metres), the anchor run on normalised sets: 'pycpd-bB'
    (pycpd, beta B, lambda 2, w 0.1, 100 iterations, tolerance 1e-3) or 'bcpd' (probreg, w 0.1,
    50 iterations)."""
    import anchors

    s, r = case.norm(case.src), case.norm(case.ref)
    if method.startswith('pycpd-b'):
        beta = float(method[len('pycpd-b') :])
        moved = anchors.pycpd_deformable(s, r, beta=beta, iterations=100, tolerance=1e-3)
    elif method == 'bcpd':
        moved = anchors.probreg_bcpd(s, r)
    else:
        raise SystemExit(f'unknown method {method} (pwan, pycpd-bB, bcpd)')
    return np.asarray(moved) * case.scale + case.centre


def run_pwan(case, overrides):
    """(moved source in metres, status, time_s) of register(transform='nonrigid')."""
    from pwan_ros.core import RegistrationConfig, register

    cfg = RegistrationConfig.from_dict({'transform': 'nonrigid', **overrides})
    res = register(case.src, case.ref, cfg)
    moved = np.full(case.src.shape, np.nan)
    moved[res.source_valid] = res.transformed_source
    return moved, res.status, float(res.time_s)


def run(args, overrides, also=None):
    """Every pair x variant x draw, each method ('pwan[...]': m-PWAN with ``also`` over
    ``overrides``); rows and the median summary."""
    from common import Timer

    rows, summary = [], []
    pairs = [tuple(p.split('-')) for p in args.pairs] if args.pairs else PAIRS
    for pair in pairs:
        for variant in args.variants or VARIANTS:
            per = {m: [] for m in args.methods}
            for seed in range(args.runs):
                case = Case(args.data, pair, variant, args.points or 1500, seed)
                for m in args.methods:
                    status = ''
                    with Timer() as tm:
                        if m.startswith('pwan'):
                            extra = also if m.startswith('pwan[') else {}
                            moved, status, t = run_pwan(case, {**overrides, **extra})
                        else:
                            moved = run_anchor(m, case)
                    err = case.mse(moved)
                    row = {
                        'pair': '-'.join(pair),
                        'variant': variant,
                        'seed': seed,
                        'method': m,
                        'identity': case.identity_mse,
                        'mse': err,
                        'right': err <= 0.5 * case.identity_mse,
                        'status': status,
                        'time_s': t if m.startswith('pwan') else tm.s,
                    }
                    rows.append(row)
                    per[m].append(row)
                    print(
                        f"{row['pair']} {variant} seed {seed} {m}: MSE {err:.5f} "
                        f"(identity {case.identity_mse:.5f}, {row['time_s']:.1f} s) {status}",
                        flush=True,
                    )
            summary += _summarise(pair, variant, per)
    return rows, summary


def _summarise(pair, variant, per):
    med = {m: float(np.median([r['mse'] for r in rs])) for m, rs in per.items()}
    anchors_ = [v for m, v in med.items() if not m.startswith('pwan')]
    best = min(anchors_) if anchors_ else float('nan')
    out = []
    for m, rs in per.items():
        out.append(
            {
                'pair': '-'.join(pair),
                'variant': variant,
                'method': m,
                'identity': float(np.median([r['identity'] for r in rs])),
                'median': med[m],
                'x_best_anchor': med[m] / best if best > 0 else float('nan'),
                'time_s': float(np.median([r['time_s'] for r in rs])),
                'right': sum(r['right'] for r in rs),
                'refused': (
                    sum(r['status'] == 'refused' for r in rs) if m.startswith('pwan') else '-'
                ),
                'refused_right': (
                    sum(r['status'] == 'refused' and r['right'] for r in rs)
                    if m.startswith('pwan')
                    else '-'
                ),
                'ok_wrong': (
                    sum(r['status'] == 'ok' and not r['right'] for r in rs)
                    if m.startswith('pwan')
                    else '-'
                ),
            }
        )
    return out


COLUMNS = [
    'pair',
    'variant',
    'method',
    'identity',
    'median',
    'x_best_anchor',
    'time_s',
    'right',
    'refused',
    'refused_right',
    'ok_wrong',
]
