"""Multi-start (rigid / affine): initial rotations, the coarse-to-fine tournament run in lock-step
(:func:`alg1.run_alg1` with S starts) and the overlap score that compares the candidates."""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from scipy.spatial import cKDTree

from .alg1 import run_alg1
from .config import RegistrationConfig
from .device import thread_scope
from .finetune_stage import FineTuneData
from .preprocess import median_spacing
from .votes import start_translations

__all__ = [
    'ENSEMBLE_POINTS',
    'OverlapScorer',
    'overlap_score',
    'start_rotations',
    'own_poses',
    'distinct_poses',
    'run_multistart',
    'Candidate',
]

#: points (starts x mini-batch) of one lock-step group of the tournament's short stage
ENSEMBLE_POINTS = 1 << 16
#: starts' own poses (:func:`own_poses`) fine-tuned and compared in the tournament, best scored
#: first
OWN_KEEP = 2


@dataclass(frozen=True)
class Candidate:
    """A finalist of Alg. 1 + fine-tune in the normalised frame: ``a`` (d, d) row convention,
    ``t`` (d,), ``v_fn`` the non-rigid offsets of source points (callable, None otherwise);
    ``converged``: Alg. 1 and the fine-tune converged; ``h``: the potential's clip level
    (normalised units; None for :func:`api.refine`); ``state``: the potential's weights;
    ``index``: the start it came from; ``score``: its start score (lower is better)."""

    score: float
    a: np.ndarray
    t: np.ndarray
    v_fn: Optional[Callable]
    converged: bool
    h: Optional[float]
    state: Optional[dict]
    index: int = 0


class OverlapScorer:
    """Selection criterion of the multi-start: the distance-type partial objective of the
    nearest-neighbour plan (eq. our_primal with the NN plan, sum_j min(d_j - h, 0)) at the
    resolution-derived threshold h = 2 x the median nearest-neighbour spacing of the dense
    fine-tune reference, on up to 2000 dense source points, as mean(min(d_j, h)) / h in [0, 1]
    (lower = more of the source lies on the reference). Unlike the fixed-mass NN objective it does
    not charge a candidate for the points outside the overlap, and uniform outliers are too sparse
    at this scale to be matched by chance."""

    def __init__(self, data: 'FineTuneData', seed: int, cap: int = 2000):
        rng = np.random.default_rng(seed + 29)
        n = data.ys.shape[0]
        self.ys = data.ys[rng.choice(n, size=min(cap, n), replace=False)]
        self.tree = data.tree
        m = data.xr.shape[0]
        probe = data.xr[rng.choice(m, size=min(cap, m), replace=False)]
        self.h = 2.0 * max(float(np.median(data.tree.query(probe, k=2)[0][:, 1])), 1e-12)

    def __call__(self, a: np.ndarray, t: np.ndarray) -> float:
        # searched within h only: farther points count h either way, and their search is slow
        dist, _ = self.tree.query(self.ys @ a + t, k=1, distance_upper_bound=self.h)
        return float(np.minimum(dist, self.h).mean() / self.h)


def overlap_score(points: np.ndarray, reference: np.ndarray, seed: int = 0) -> float:
    """:class:`OverlapScorer` on caller-frame points as they are: points (n, d), reference (m, d);
    0 = every point lies on the reference, 1 = none does."""
    d = points.shape[1]
    scorer = OverlapScorer(FineTuneData(points, reference, cKDTree(reference), None), seed)
    return scorer(np.eye(d), np.zeros(d))


def start_rotations(dim: int, count: int) -> list:
    """``count`` initial rotations (d, d), identity first: 2-D evenly spaced angles; 3-D the
    rotation group of the cube ordered by angle (90, 120, 180 deg), then random (seeded)."""
    if dim == 2:
        out = []
        for i in range(count):
            a = 2 * np.pi * i / count
            out.append(np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]))
        return out
    mats = []
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1, -1), repeat=3):
            m = np.zeros((3, 3))
            for i, j in enumerate(perm):
                m[i, j] = signs[i]
            if np.linalg.det(m) > 0:
                mats.append(m)
    mats.sort(
        key=lambda m: (
            round(float(np.arccos(np.clip((np.trace(m) - 1) / 2, -1, 1))), 6),
            tuple(m.ravel()),
        )
    )
    rng = np.random.default_rng(12345)
    while len(mats) < count:
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        w, x, y, z = q
        mats.append(
            np.array(
                [
                    [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                    [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                    [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
                ]
            )
        )
    return mats[:count]


def distinct_poses(placements: list, tol: float, keep: int) -> list:
    """Indices of up to ``keep`` placements (each (n, d), the same points moved by a candidate
    pose, best first) whose RMS distance to every earlier kept one exceeds ``tol`` (caller
    units)."""
    kept: list = []
    for i, z in enumerate(placements):
        if len(kept) == keep:
            break
        if all(np.sqrt(np.mean(np.sum((z - placements[j]) ** 2, 1))) > tol for j in kept):
            kept.append(i)
    return kept


def own_poses(ys: np.ndarray, xs: np.ndarray, rots: list, seed: int):
    """[(a (3, 3), t (3,))] per start rotation in the solver's convention (``ys @ a + t``): the
    rotation with the translation most point pairs vote for (:func:`votes.start_translations`,
    cells of 2 x the median spacing of ``xs``); None for 2-D or when the caller gave no
    rotations."""
    if ys.shape[1] != 3 or rots[0] is None:
        return None
    cell = 2.0 * median_spacing(xs)
    return [
        (rot.T.copy(), t)
        for rot, (t, _) in zip(rots, start_translations(ys, xs, rots, cell, seed + 3))
    ]


def run_multistart(
    config: RegistrationConfig,
    device,
    ys_np,
    xs_np,
    mass_n,
    h_n,
    h_floor,
    rots,
    should_stop,
    potential_state,
    timings,
    tot,
    finetune,
    score_of,
    ref_mass=None,
) -> list:
    """Multi-start (rigid/affine), all starts in lock-step (:func:`alg1.run_alg1`).

    ``start_steps > 0`` (coarse-to-fine tournament): every start runs ``start_steps`` steps of
    Alg. 1 and a fine-tune on ``start_finetune_points`` source points (always: it is part of the
    selection), and in 3-D so does its own pose (:func:`own_poses`) for the :data:`OWN_KEEP` starts
    whose own poses score best as they are, the better of the two by ``score_of`` standing for the
    start; the ``start_keep`` best by ``score_of`` (plus the first
    start, the caller's prior) continue with the rest of Alg. 1. ``start_steps == 0``: every start
    runs the full Alg. 1. Finalists end with the fine-tune on ``start_finetune_points`` source
    points (if enabled; the caller gives the winner the dense one); in the tournament each finalist
    contributes the better (by ``score_of``) of its continued and its short-stage pose. Returns the
    finalists as [:class:`Candidate`]. mass_n / ref_mass: :class:`candidates.SampleMasses`."""
    r, q = ys_np.shape[0], xs_np.shape[0]
    group = max(1, ENSEMBLE_POINTS // max(config.batch_size or max(q, r), 1))

    def stage(cfg, items, steps, seed, **kw):
        """run_alg1 over ``items`` [(rotation, translation, state)] in groups; yields per start."""
        for g0 in range(0, len(items), group):
            if g0 > 0 and should_stop is not None and should_stop():
                return
            part = items[g0 : g0 + group]
            ta = time.perf_counter()
            with thread_scope(config.threads):
                out = run_alg1(
                    cfg,
                    device,
                    ys_np,
                    xs_np,
                    mass_n,
                    h_n,
                    [p[0] for p in part],
                    steps,
                    seed + g0,
                    should_stop,
                    states=[p[2] for p in part],
                    translations=None if part[0][1] is None else [p[1] for p in part],
                    h_floor=h_floor,
                    ref_mass=ref_mass,
                    **kw,
                )
                starts, done, updates = out.starts, out.steps, out.updates
            timings['adversarial'] += time.perf_counter() - ta
            for k, st in enumerate(starts):
                tot['steps'] += done
                tot['updates'] += updates
                yield g0 + k, st

    if config.start_steps > 0:
        cfg1 = config.replace(min_steps=min(config.min_steps, config.start_steps))
        cands = []
        own = own_poses(ys_np, xs_np, rots, config.seed)
        if own is not None:  # only the best few by the score as they are get a fine-tune
            raw = [score_of(a, t) for a, t in own]
            own = {int(k): own[k] for k in np.argsort(raw, kind='stable')[:OWN_KEEP]}
        for i, st in stage(
            cfg1,
            [(rot, None, potential_state) for rot in rots],
            config.start_steps,
            config.seed,
            converge=False,
        ):
            a, t, _, _ = finetune(st.a, st.t, small=True)
            cands.append((score_of(a, t), a, t, st.state, i))
            if own is not None and i in own:
                # the start's own pose stays a candidate: m-PWAN's short stage, at a mass above the
                # pair's overlap, walks away from a start that was right (bunny 090->180: 52 deg)
                a, t, _, _ = finetune(own[i][0], own[i][1], small=True)
                cands[-1] = min(cands[-1], (score_of(a, t), a, t, st.state, i), key=lambda c: c[0])
            if config.verbose:
                print(
                    f'[pwan] start {i + 1}/{len(rots)}: score {cands[-1][0]:.5g}', file=sys.stderr
                )
        # the first start (the caller's init / identity) is always a finalist: it is the prior,
        # and a short run from it may simply not have converged yet
        keep = sorted(cands, key=lambda c: c[0])[: config.start_keep]
        if all(c[4] != 0 for c in keep):
            keep.append(cands[0])
        items = [(c[1].T, c[2], c[3]) for c in keep]
        index = [c[4] for c in keep]
        rest = (
            0
            if should_stop is not None and should_stop()
            else max(config.steps - config.start_steps, 0)
        )
        finals = stage(
            config, items, rest, config.seed + 7919, step_offset=config.start_steps, warmup=False
        )
    else:
        index = list(range(len(rots)))
        finals = stage(
            config, [(rot, None, potential_state) for rot in rots], config.steps, config.seed
        )
    out = []
    for i, st in finals:
        poses = [(st.a, st.t)]
        if config.start_steps > 0:
            # the finalist's short-stage pose stays a candidate: continuing Alg. 1 at the
            # schedule's higher learning rate can walk away from a pose the short stage had already
            # found
            poses.append((keep[i][1], keep[i][2]))
        best = None
        for a, t in poses:
            ft_conv = True
            if config.finetune.enabled:
                a, t, _, ft_conv = finetune(a, t, small=True)
            score = score_of(a, t)
            if best is None or score < best.score:
                best = Candidate(
                    score, a, t, None, st.converged and ft_conv, st.h, st.state, index[i]
                )
        out.append(best)
        if config.verbose:
            print(f'[pwan] start {index[i] + 1} final score {best.score:.5g}', file=sys.stderr)
    return out
