"""Choosing among the global search's candidate poses (caller units): each refined, scored by
PWAN's partial objective, and the winner refused when the data cannot vouch for it (no overlap,
a direction free to slide, an ambiguous runner-up, every candidate contradicting the sensors'
free space). See :mod:`search` for the whole search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, NamedTuple, Optional

import numpy as np
from scipy.spatial import cKDTree

from ..checks.verify import MAX_CHANCE
from ..config import GlobalConfig
from .hypotheses import Hypothesis, pose_distance

__all__ = [
    'PRIOR_HINT',
    'GlobalOutcome',
    'Scoring',
    'choose',
    'partial_objective_of',
    'translation_constraint',
]


#: what settles a pose the data leave open
PRIOR_HINT = 'a prior pose settles it (init; pwan_register --init POSE_FILE)'


@dataclass(frozen=True)
class GlobalOutcome:
    """The chosen pose and how it was chosen: ``result`` the winner's refinement
    (RegistrationResult); ``objective`` its partial objective in [-1, 0]; ``overlap`` fraction of
    the source within h; ``confidence`` relative margin over the best distinct runner-up (1 when
    there is none); ``status`` 'ok' | 'refused'; ``reason`` why refused; ``candidates`` scored
    [(origin, support, objective, free_space)] in input order (free_space None without
    viewpoints); ``backing``: the most feature inliers of a hypothesis that refined to the
    winner's pose (within 2 h)."""

    result: object
    objective: float
    overlap: float
    confidence: float
    status: str
    reason: str
    candidates: list
    backing: int = 0


@dataclass(frozen=True)
class Scoring:
    """How :func:`choose` scores a candidate: ``reference`` (m, 3) and source ``probe`` points
    (n, 3) (both voxelised), the threshold ``h``; ``normals``: the reference's unit normals (m, 3)
    for the constraint test (None: no test); ``free_space``: None or ``f(transform) -> fraction``
    (:func:`checks.free_space.contradiction`); ``judge``: None or ``f(transform) -> excess``
    (:func:`checks.verify.check_pose`'s overlap beyond chance at the judging voxel)."""

    reference: np.ndarray
    probe: np.ndarray
    h: float
    normals: Optional[np.ndarray] = None
    free_space: Optional[Callable] = None
    judge: Optional[Callable] = None

    def moved(self, transform: np.ndarray) -> np.ndarray:
        """The probe points moved by ``transform`` (4, 4)."""
        return self.probe @ transform[:3, :3].T + transform[:3, 3]


class _Scored(NamedTuple):
    objective: float
    overlap: float
    result: object
    hypothesis: Hypothesis
    seen_through: Optional[float]


def partial_objective_of(moved: np.ndarray, tree: cKDTree, h: float) -> tuple:
    """(objective, overlap) of source points ``moved`` (n, 3) onto a reference tree: the
    distance-type primal mean_j min(d_j - h, 0) / h in [-1, 0], and the fraction within h."""
    d, _ = tree.query(moved, k=1, distance_upper_bound=h)
    within = np.isfinite(d)
    return float(np.sum(d[within] - h) / (h * len(moved))), float(within.mean())


def translation_constraint(
    moved: np.ndarray, reference: np.ndarray, normals: np.ndarray, h: float
) -> float:
    """How well the overlap fixes the translation: the smallest eigenvalue of mean(n n^T) over the
    reference normals (m, 3) at the nearest neighbours of the source points ``moved`` (n, 3) within
    ``h``. 0: every matched normal is orthogonal to one direction (a plane, a floor and one wall, a
    corridor), along which the pose can slide without changing the overlap; 1/3 at most."""
    d, j = cKDTree(reference).query(moved, k=1, distance_upper_bound=h)
    n = normals[j[np.isfinite(d)]]
    if len(n) < 3:
        return 0.0
    return float(max(np.linalg.eigvalsh(n.T @ n / len(n))[0], 0.0))


def choose(
    hyps: List[Hypothesis], cfg: GlobalConfig, refine_fn: Callable, scoring: Scoring
) -> GlobalOutcome:
    """Refine every hypothesis with ``refine_fn(init) -> RegistrationResult`` (the fine-tune,
    distance type), score it by the partial objective of ``scoring``, and pick the winner (see
    :mod:`search` for the refusal rules). Candidates above ``cfg.max_free_space`` contradict what
    the sensors saw and cannot win. Where spurious points (uniform outliers) put a reference
    point within h of most places (more than ``MAX_CHANCE`` of random places in the source's
    box), every pose scores near chance at the feature voxel and only the surfaces at the
    judging voxel still tell poses apart: the :data:`JUDGED` best distinct candidates by the
    objective are then ranked again by the judge, and the confidence is the winner's margin in
    it over the best distinct runner-up."""
    tree = cKDTree(scoring.reference)
    scored = [_score(hyp, refine_fn, scoring, tree) for hyp in hyps]
    cands = [
        (s.hypothesis.origin, s.hypothesis.support, s.objective, s.seen_through) for s in scored
    ]
    order = sorted(range(len(scored)), key=lambda k: scored[k].objective)
    if scoring.free_space is not None:
        order_ok = [k for k in order if scored[k].seen_through <= cfg.max_free_space]
        if not order_ok:
            best = scored[order[0]]
            least = min(s.seen_through for s in scored)
            reason = (
                f'every candidate pose puts one cloud where the other sensor saw free space '
                f'(least: {least:.0%} > max_free_space {cfg.max_free_space:.0%})'
            )
            return GlobalOutcome(
                best.result, best.objective, best.overlap, 0.0, 'refused', reason, cands
            )
        order = order_ok
    order, confidence, runner = _ranked(order, scored, cfg, scoring, tree)
    best = scored[order[0]]
    status, reason = _verdict(best, runner, confidence, cfg, scoring)
    backing = max(
        s.hypothesis.support
        for s in scored
        if pose_distance(s.result.transform, best.result.transform, scoring.probe)
        <= 2.0 * scoring.h
    )
    return GlobalOutcome(
        best.result, best.objective, best.overlap, confidence, status, reason, cands, backing
    )


def _score(hyp: Hypothesis, refine_fn, scoring: Scoring, tree: cKDTree) -> _Scored:
    """A hypothesis refined and scored."""
    res = refine_fn(hyp.transform)
    obj, overlap = partial_objective_of(scoring.moved(res.transform), tree, scoring.h)
    seen = None if scoring.free_space is None else scoring.free_space(res.transform)
    return _Scored(obj, overlap, res, hyp, seen)


def _ranked(order: list, scored: list, cfg: GlobalConfig, scoring: Scoring, tree) -> tuple:
    """(the order, the winner's confidence, the best distinct runner-up or None). Random places
    in the box the best-scored source occupies: how often they lie within h of the reference
    (chance) and their objective. Spurious reference points (uniform outliers, clutter) lower
    every pose's objective alike, by that objective; where most places lie within h, the
    objective at the feature voxel cannot tell poses apart and the judge ranks."""
    h, judge, probe = scoring.h, scoring.judge, scoring.probe
    moved = scoring.moved(scored[order[0]].result.transform)
    places = np.random.default_rng(0).uniform(moved.min(axis=0), moved.max(axis=0), moved.shape)
    chance_objective, chance = partial_objective_of(places, tree, h)
    judged = judge is not None and chance > MAX_CHANCE
    if judged:
        order, excess = _judged(order, scored, judge, probe, h)
    best = scored[order[0]]
    res = best.result
    runner = next(
        (
            k
            for k in order[1:]
            if pose_distance(scored[k].result.transform, res.transform, probe) > 2.0 * h
        ),
        None,
    )
    if runner is None:
        confidence = 1.0
    elif judged:  # the margin in overlap beyond chance at the judging voxel
        confidence = _margin(excess[order[0]], excess.get(runner, 0.0))
    else:
        # the margin relative to the objective the winner explains beyond chance; or, where
        # that is small (outliers near the surfaces), the margin the judge sees: ambiguous only
        # when neither scale tells the two poses apart
        confidence = _margin(
            chance_objective - best.objective, chance_objective - scored[runner].objective
        )
        if judge is not None and confidence < cfg.min_confidence:
            confidence = max(
                confidence, _margin(judge(res.transform), judge(scored[runner].result.transform))
            )
    return order, confidence, None if runner is None else scored[runner]


def _verdict(best: _Scored, runner, confidence: float, cfg: GlobalConfig, scoring: Scoring):
    """(status, reason) of the winner: no overlap, a direction free to slide, or ambiguous."""
    res = best.result
    if best.overlap < cfg.min_overlap:
        return 'refused', (
            f'best pose puts {best.overlap:.0%} of the source on the reference '
            f'(< min_overlap {cfg.min_overlap:.0%}): no overlap found'
        )
    if scoring.normals is not None:
        held = translation_constraint(
            scoring.moved(res.transform), scoring.reference, scoring.normals, scoring.h
        )
        if held < cfg.min_constraint:
            return 'refused', (
                f'degenerate: the overlap leaves a direction free to slide (constraint '
                f'{held:.3f} < min_constraint {cfg.min_constraint:.3f}: a plane, a corridor); '
                f'{PRIOR_HINT}'
            )
    if confidence < cfg.min_confidence:
        apart = pose_distance(runner.result.transform, res.transform, scoring.probe)
        return 'refused', (
            f'ambiguous: a pose {apart:.3g} away explains the data almost as well '
            f'(confidence {confidence:.2f} < min_confidence {cfg.min_confidence:.2f}); '
            f'{PRIOR_HINT}'
        )
    return 'ok', ''


def _margin(best: float, runner: float) -> float:
    """(best - runner) / best in [0, 1] for scores where higher is better; 1 when best <= 0."""
    return 1.0 if best <= 0 else float(np.clip((best - runner) / best, 0.0, 1.0))


#: candidates (best by the objective, distinct poses) ranked again by the judge
JUDGED = 6


def _judged(order: list, scored: list, judge, probe: np.ndarray, h: float) -> tuple:
    """``order`` (candidate indices, best objective first) with its first :data:`JUDGED`
    distinct poses ranked by ``judge`` (highest excess first), then the rest; and {index: excess}
    of the judged."""
    judged, rest = [], []
    for k in order:
        t = scored[k].result.transform
        if len(judged) < JUDGED and all(
            pose_distance(scored[j].result.transform, t, probe) > 2.0 * h for j in judged
        ):
            judged.append(k)
        else:
            rest.append(k)
    excess = {k: judge(scored[k].result.transform) for k in judged}
    judged.sort(key=lambda k: -excess[k])  # stable: ties keep the objective's order
    return judged + rest, excess
