"""The multi-start (rigid / affine): the coarse-to-fine tournament of its starts
(:mod:`starts`), run in lock-step (:func:`pwan.alg1.run_alg1` with S starts) over a
:class:`run.FitRun` and compared by its score (:mod:`scoring`)."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Iterator, Optional

import numpy as np

from ..device import thread_scope
from ..pwan.alg1 import Schedule, Starts, run_alg1
from ..result import Candidate
from .run import FitRun
from .starts import own_poses

__all__ = ['ENSEMBLE_POINTS', 'OWN_KEEP', 'run_multistart']

#: points (starts x mini-batch) of one lock-step group of the tournament's short stage
ENSEMBLE_POINTS = 1 << 16
#: starts' own poses (:func:`starts.own_poses`) fine-tuned and compared in the tournament, best
#: scored first
OWN_KEEP = 2


def run_multistart(run: FitRun, rots: list, should_stop=None, potential_state=None) -> list:
    """Multi-start (rigid/affine) from the rotations ``rots``, all starts in lock-step.

    ``start_steps > 0`` (coarse-to-fine tournament, :func:`_tournament`): every start runs
    ``start_steps`` steps of Alg. 1 and a fine-tune on ``start_finetune_points`` source points,
    and the ``start_keep`` best by the run's score (plus the first start, the caller's prior)
    continue with the rest of Alg. 1. ``start_steps == 0``: every start runs the full Alg. 1.
    Finalists end with the fine-tune on ``start_finetune_points`` source points (if enabled;
    the caller gives the winner the dense one); in the tournament each finalist contributes the
    better (by the score) of its continued and its short-stage pose. Returns the finalists as
    [:class:`Candidate`]."""
    config = run.config
    if config.start_steps > 0:
        keep = _tournament(run, rots, should_stop, potential_state)
        items = [(c[1].T, c[2], c[3]) for c in keep]
        index = [c[4] for c in keep]
        rest = (
            0
            if should_stop is not None and should_stop()
            else max(config.steps - config.start_steps, 0)
        )
        schedule = Schedule(rest, config.seed + 7919, step_offset=config.start_steps, warmup=False)
        finals = _lock_step(run, config, items, schedule, should_stop)
    else:
        keep = None
        index = list(range(len(rots)))
        items = [(rot, None, potential_state) for rot in rots]
        finals = _lock_step(run, config, items, Schedule(config.steps, config.seed), should_stop)
    out = []
    for i, st in finals:
        poses = [(st.a, st.t)]
        if keep is not None:
            # the finalist's short-stage pose stays a candidate: continuing Alg. 1 at the
            # schedule's higher learning rate can walk away from a pose the short stage had already
            # found
            poses.append((keep[i][1], keep[i][2]))
        out.append(_best_of(run, poses, st, index[i]))
        if config.verbose:
            print(f'[pwan] start {index[i] + 1} final score {out[-1].score:.5g}', file=sys.stderr)
    return out


def _best_of(run: FitRun, poses: list, st, index: int) -> Candidate:
    """The best by the run's score of ``poses`` [(a, t)] of one finalist (Alg. 1 start ``st``),
    each fine-tuned on the sample first (if enabled)."""
    best = None
    for a, t in poses:
        ft_conv = True
        if run.config.finetune.enabled:
            a, t, _, ft_conv = run.finetune(a, t, small=True)
        score = run.score(a, t)
        if best is None or score < best.score:
            best = Candidate(score, a, t, None, st.converged and ft_conv, st.h, st.state, index)
    return best


def _tournament(run: FitRun, rots: list, should_stop, potential_state) -> list:
    """The tournament's short stage: every start runs ``start_steps`` steps and a fine-tune on
    the sample, and in 3-D so does its own pose (:func:`starts.own_poses`) for the
    :data:`OWN_KEEP` starts whose own poses score best as they are, the better of the two
    standing for the start. Returns the ``start_keep`` best [(score, a, t, state, start)], plus
    the first start (the caller's prior) when it is not among them."""
    config = run.config
    cfg1 = config.replace(min_steps=min(config.min_steps, config.start_steps))
    cands = []
    own = own_poses(run.sampled.ys, run.sampled.xs, rots, config.seed)
    if own is not None:  # only the best few by the score as they are get a fine-tune
        raw = [run.score(a, t) for a, t in own]
        own = {int(k): own[k] for k in np.argsort(raw, kind='stable')[:OWN_KEEP]}
    items = [(rot, None, potential_state) for rot in rots]
    schedule = Schedule(config.start_steps, config.seed, converge=False)
    for i, st in _lock_step(run, cfg1, items, schedule, should_stop):
        a, t, _, _ = run.finetune(st.a, st.t, small=True)
        cands.append((run.score(a, t), a, t, st.state, i))
        if own is not None and i in own:
            # the start's own pose stays a candidate: m-PWAN's short stage, at a mass above the
            # pair's overlap, walks away from a start that was right (bunny 090->180: 52 deg)
            a, t, _, _ = run.finetune(own[i][0], own[i][1], small=True)
            cands[-1] = min(cands[-1], (run.score(a, t), a, t, st.state, i), key=lambda c: c[0])
        if config.verbose:
            print(f'[pwan] start {i + 1}/{len(rots)}: score {cands[-1][0]:.5g}', file=sys.stderr)
    # the first start (the caller's init / identity) is always a finalist: it is the prior,
    # and a short run from it may simply not have converged yet
    keep = sorted(cands, key=lambda c: c[0])[: config.start_keep]
    if all(c[4] != 0 for c in keep):
        keep.append(cands[0])
    return keep


def _lock_step(
    run: FitRun, cfg, items: list, schedule: Schedule, should_stop: Optional[callable]
) -> Iterator:
    """:func:`run_alg1` over ``items`` [(rotation, translation, state)] in groups of
    :data:`ENSEMBLE_POINTS` points; yields (start, :class:`alg1.StartResult`) per start."""
    ys, xs = run.sampled.ys, run.sampled.xs
    group = max(
        1, ENSEMBLE_POINTS // max(run.config.batch_size or max(xs.shape[0], ys.shape[0]), 1)
    )
    for g0 in range(0, len(items), group):
        if g0 > 0 and should_stop is not None and should_stop():
            return
        part = items[g0 : g0 + group]
        starts = Starts(
            [p[0] for p in part],
            None if part[0][1] is None else [p[1] for p in part],
            [p[2] for p in part],
        )
        ta = time.perf_counter()
        with thread_scope(run.config.threads):
            out = run_alg1(
                cfg,
                run.sampled,
                starts,
                dataclasses.replace(schedule, seed=schedule.seed + g0),
                should_stop,
            )
        run.timings['adversarial'] += time.perf_counter() - ta
        for k, st in enumerate(out.starts):
            run.steps += out.steps
            run.updates += out.updates
            yield g0 + k, st
