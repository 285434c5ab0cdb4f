"""Choosing among the global search's candidate poses (caller units): each refined by PWAN's
fine-tune, taken to its fit and ranked by the overlap beyond chance the self-check measures, and
the winner refused when the data cannot vouch for it (no overlap, a direction free to slide, an
ambiguous runner-up, every candidate contradicting the sensors' free space). See :mod:`search`
for the whole search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, NamedTuple, Optional

import numpy as np
from scipy.spatial import cKDTree

from ..checks.overlap import OverlapJudge
from ..checks.verify import RIVAL_DISTINCT
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
    """The chosen pose and how it was chosen: ``transform`` (4, 4) the winner's fit
    (:meth:`OverlapJudge.fitted`);
    ``objective`` the fit's partial objective in [-1, 0]; ``overlap`` fraction of the source
    within h; ``confidence`` relative margin in overlap beyond chance over the best distinct
    runner-up (1 when there is none); ``status`` 'ok' | 'refused'; ``reason`` why refused;
    ``candidates`` scored [(origin, support, objective, free_space)] in input order (free_space
    None without viewpoints)."""

    transform: np.ndarray
    objective: float
    overlap: float
    confidence: float
    status: str
    reason: str
    candidates: list


@dataclass(frozen=True)
class Scoring:
    """How :func:`choose` scores a candidate: ``judge`` fits a pose and measures its overlap
    beyond chance (:class:`checks.overlap.OverlapJudge`); ``reference`` (m, 3) and source
    ``probe`` points (n, 3) (both voxelised), the threshold ``h`` of the partial objective;
    ``normals``: the reference's unit normals (m, 3) for the constraint test (None: no test);
    ``free_space``: None or ``f(transform) -> fraction``
    (:func:`checks.free_space.contradiction`)."""

    judge: OverlapJudge
    reference: np.ndarray
    probe: np.ndarray
    h: float
    normals: Optional[np.ndarray] = None
    free_space: Optional[Callable] = None

    def moved(self, transform: np.ndarray) -> np.ndarray:
        """The probe points moved by ``transform`` (4, 4)."""
        return self.probe @ transform[:3, :3].T + transform[:3, 3]


class _Scored(NamedTuple):
    objective: float
    overlap: float
    excess: float
    transform: np.ndarray
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
    """Refine every hypothesis with ``refine_fn(init) -> RegistrationResult`` (PWAN's fine-tune,
    distance type, on subsets), take it to the fit its data show nearby and rank it by the
    self-check's overlap beyond chance (``scoring.judge``, :class:`checks.overlap.OverlapJudge`),
    and pick the winner (see :mod:`search` for the refusal rules). Candidates above
    ``cfg.max_free_space`` contradict what the sensors saw and cannot win. The confidence is the
    winner's lead in that overlap over the best runner-up still distinct once both are fitted
    (the source's points moved by more than ``RIVAL_DISTINCT`` gates RMS; a runner-up the
    fine-tune left a few gates short of the winner's fit is the same pose, not a rival), as a
    share of what the winner explains (:func:`_lead`; without viewpoints, of at least
    ``confirm_below``)."""
    tree = cKDTree(scoring.reference)
    fits: list = []
    scored = [_score(hyp, refine_fn, scoring, tree, fits) for hyp in hyps]
    cands = [
        (s.hypothesis.origin, s.hypothesis.support, s.objective, s.seen_through) for s in scored
    ]
    order = sorted(range(len(scored)), key=lambda k: (-scored[k].excess, scored[k].objective))
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
                best.transform, best.objective, best.overlap, 0.0, 'refused', reason, cands,
            )  # fmt: skip
        order = order_ok
    best = scored[order[0]]
    distinct = RIVAL_DISTINCT * scoring.judge.gate
    runner = next(
        (
            scored[k]
            for k in order[1:]
            if pose_distance(scored[k].transform, best.transform, scoring.probe) > distinct
        ),
        None,
    )
    # with the sensors' viewpoints a pose the search missed must also agree with what they saw
    # free (and the search keeps WIDE_FACTOR x the poses): the winner's own share suffices
    floor = cfg.confirm_below if scoring.free_space is None else 0.0
    confidence = 1.0 if runner is None else _lead(best.excess, runner.excess, floor)
    status, reason = _verdict(best, runner, confidence, cfg, scoring)
    return GlobalOutcome(
        best.transform, best.objective, best.overlap, confidence, status, reason, cands,
    )  # fmt: skip


def _score(hyp: Hypothesis, refine_fn, scoring: Scoring, tree: cKDTree, fits: list) -> _Scored:
    """A hypothesis refined, fitted and scored. fits: [(refined transform, Judged)] so far; a
    refinement within one gate (RMS) of one of them shares its fit (hypotheses that refine to
    one pose are fitted once)."""
    res = refine_fn(hyp.transform)
    fit = next(
        (
            done
            for t, done in fits
            if pose_distance(t, res.transform, scoring.probe) <= scoring.judge.gate
        ),
        None,
    )
    if fit is None:
        fit = scoring.judge.fitted(res.transform)
        fits.append((res.transform, fit))
    obj, overlap = partial_objective_of(scoring.moved(fit.transform), tree, scoring.h)
    seen = None if scoring.free_space is None else scoring.free_space(fit.transform)
    return _Scored(obj, overlap, fit.excess, fit.transform, hyp, seen)


def _verdict(best: _Scored, runner, confidence: float, cfg: GlobalConfig, scoring: Scoring):
    """(status, reason) of the winner: no overlap, a direction free to slide, or ambiguous."""
    if best.overlap < cfg.min_overlap:
        return 'refused', (
            f'best pose puts {best.overlap:.0%} of the source on the reference '
            f'(< min_overlap {cfg.min_overlap:.0%}): no overlap found'
        )
    if scoring.normals is not None:
        held = translation_constraint(
            scoring.moved(best.transform), scoring.reference, scoring.normals, scoring.h
        )
        if held < cfg.min_constraint:
            return 'refused', (
                f'degenerate: the overlap leaves a direction free to slide (constraint '
                f'{held:.3f} < min_constraint {cfg.min_constraint:.3f}: a plane, a corridor); '
                f'{PRIOR_HINT}'
            )
    if confidence < cfg.min_confidence:
        apart = pose_distance(runner.transform, best.transform, scoring.probe)
        little = (
            ' (little overlap, or a pose the search missed)'
            if best.excess < cfg.confirm_below and scoring.free_space is None
            else ''
        )
        return 'refused', (
            f'ambiguous: the best pose puts {best.excess:.0%} of the source on the reference '
            f'beyond chance{little}, a pose {apart:.3g} away {runner.excess:.0%} (confidence '
            f'{confidence:.2f} < min_confidence {cfg.min_confidence:.2f}); {PRIOR_HINT}'
        )
    return 'ok', ''


def _lead(best: float, runner: float, floor: float) -> float:
    """The winner's lead in overlap beyond chance over the runner-up, as a share of what the
    winner explains, or of ``floor`` (``confirm_below``) when it explains less, in [0, 1]: a
    winner that puts little of the source on the reference leaves room for a pose the search
    missed, so it must lead by the same share of the source as one explaining ``floor`` (a
    room at 100 % outliers: a pose 88 deg off explaining 30 % led its runner-up by 5 % of the
    source; the right poses of real rooms and streets by 10 % or more). ``floor`` 0: the
    winner's own share."""
    scale = max(best, floor)
    return 0.0 if scale <= 0 else float(np.clip((best - runner) / scale, 0.0, 1.0))
