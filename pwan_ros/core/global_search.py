"""Registration from an unknown initial pose: feature hypotheses, chosen and refined by PWAN's
partial objective (``register(..., init='global')``).

1. **Hypotheses.** FPFH features (Open3D) on both sets voxel-downsampled to about
   ``feature_points`` points; mutual nearest neighbours in feature space; a vectorised RANSAC
   over 3-point samples (edge-length consistency, Kabsch) keeps the ``candidates`` best *distinct*
   poses by inlier support, not one answer. Open3D's FGR adds one, KISS-Matcher one more when
   installed; the caller's prior (identity) is always a candidate. When the features are weak,
   PWAN's rotation starts join, each translated by votes (:mod:`votes`), not by the centroids.
2. **Chosen by PWAN's partial objective.** Each candidate is refined by the fine-tune stage
   (eq. fine_tune, distance type at h = 2 x the reference spacing: it needs no overlap guess)
   and scored by the distance-type primal objective of the nearest-neighbour plan,
   ``mean_j min(d_j - h, 0) / h`` in [-1, 0] (lower = more of the source lies on the reference).
   Feature support only proposes; the partial objective decides, so a pose that RANSAC ranks
   low (features broken by outliers) still wins when it explains the geometry.
3. **Refusal.** ``overlap`` = fraction of the source within h at the winner. The confidence is
   the margin of the winner's objective over the best *distinct* runner-up, relative to the
   objective the winner explains beyond chance (random places in the source's box score the
   chance level, which uniform outliers raise for every pose alike). Where most random places
   lie within h, the objective cannot tell poses apart: the best candidates are ranked, and
   the margin taken, by the self-check's overlap beyond chance at the judging voxel; elsewhere
   a small objective margin is looked at again with it (ambiguous only when neither tells the
   two poses apart). When the
   overlap is below ``min_overlap``, the matched reference normals leave a direction free
   (:func:`translation_constraint` below ``min_constraint``: a plane, a corridor) or the margin
   is below ``min_confidence`` (two different poses explain the data almost equally: a symmetric
   object) the result is ``status='refused'`` with the reason, instead of a confident wrong pose.
4. **The winner's fine-tune** on the dense sets: the distance type as it is; the mass type with
   the mass estimated at the winner (:mod:`mass`), again while the estimate shrinks.

Frames: caller units; every pose maps source -> reference (T_reference_source).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
from scipy.spatial import cKDTree

from .config import GlobalConfig
from .mass import measured_mass_ratio, refit_mass
from .verify import CHECK_POINTS, MAX_CHANCE, check_pose, judging_voxel
from .hypotheses import (
    ROTATION_KEEP,
    Hypothesis,
    feature_hypotheses,
    feature_normals,
    pose_distance,
    rotation_hypotheses,
    voxelised,
)

#: with viewpoints, RANSAC keeps this many times ``candidates`` distinct poses before the
#: free-space filter
WIDE_FACTOR = 8

__all__ = [
    'GlobalOutcome',
    'partial_objective_of',
    'translation_constraint',
    'choose',
    'register_global',
]


@dataclass(frozen=True)
class GlobalOutcome:
    """The chosen pose and how it was chosen: ``result`` the winner's refinement
    (RegistrationResult); ``objective`` its partial objective in [-1, 0]; ``overlap`` fraction of
    the source within h; ``confidence`` relative margin over the best distinct runner-up (1 when
    there is none); ``status`` 'ok' | 'refused'; ``reason`` why refused; ``candidates`` scored
    [(origin, support, objective, free_space)] in input order (free_space None without
    viewpoints)."""

    result: object
    objective: float
    overlap: float
    confidence: float
    status: str
    reason: str
    candidates: list


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
    reference: np.ndarray,
    hyps: List[Hypothesis],
    cfg: GlobalConfig,
    refine_fn,
    h: float,
    probe: np.ndarray,
    free_space=None,
    normals: Optional[np.ndarray] = None,
    judge=None,
) -> GlobalOutcome:
    """Refine every hypothesis with ``refine_fn(init) -> RegistrationResult`` (the fine-tune,
    distance type), score it by the partial objective on ``probe`` source points against
    ``reference`` at threshold ``h``, and pick the winner (see the module doc for the refusal
    rules). free_space: None, or ``f(transform) -> fraction`` (:func:`free_space.contradiction`):
    candidates above ``cfg.max_free_space`` contradict what the sensors saw and cannot win.
    normals: the reference's unit normals (m, 3): a winner whose overlap leaves a direction free
    (:func:`translation_constraint` below ``cfg.min_constraint``) is refused. judge: None, or
    ``f(transform) -> excess`` (:func:`verify.check_pose`'s overlap beyond chance at the judging
    voxel): where spurious points (uniform outliers) put a reference point within h of most
    places (more than ``MAX_CHANCE`` of random places in the source's box), every pose scores
    near chance at the feature voxel and only the surfaces at the judging voxel still tell
    poses apart: the :data:`JUDGED` best distinct candidates by the objective are then ranked
    again by the judge, and the confidence is the winner's margin in it over the best distinct
    runner-up."""
    tree = cKDTree(reference)
    scored = []
    for hyp in hyps:
        res = refine_fn(hyp.transform)
        moved = probe @ res.transform[:3, :3].T + res.transform[:3, 3]
        obj, overlap = partial_objective_of(moved, tree, h)
        seen_through = None if free_space is None else free_space(res.transform)
        scored.append((obj, overlap, res, hyp, seen_through))
    cands = [(s[3].origin, s[3].support, s[0], s[4]) for s in scored]
    order = sorted(range(len(scored)), key=lambda k: scored[k][0])
    if free_space is not None:
        order_ok = [k for k in order if scored[k][4] <= cfg.max_free_space]
        if not order_ok:
            obj, overlap, res, _, seen = scored[order[0]]
            least = min(s[4] for s in scored)
            return GlobalOutcome(
                res,
                obj,
                overlap,
                0.0,
                'refused',
                f'every candidate pose puts one cloud where the other sensor saw free space '
                f'(least: {least:.0%} > max_free_space {cfg.max_free_space:.0%})',
                cands,
            )
        order = order_ok
    # random places in the box the best-scored source occupies: how often they lie within h of
    # the reference (chance) and their objective. Spurious reference points (uniform outliers,
    # clutter) lower every pose's objective alike, by that objective; where most places lie
    # within h, the objective at the feature voxel cannot tell poses apart and the judge ranks
    moved = probe @ scored[order[0]][2].transform[:3, :3].T + scored[order[0]][2].transform[:3, 3]
    places = np.random.default_rng(0).uniform(moved.min(axis=0), moved.max(axis=0), moved.shape)
    chance_objective, chance = partial_objective_of(places, tree, h)
    judged = judge is not None and chance > MAX_CHANCE
    if judged:
        order, excess = _judged(order, scored, judge, probe, h)
    obj, overlap, res, hyp, _ = scored[order[0]]
    runner = next(
        (
            k
            for k in order[1:]
            if pose_distance(scored[k][2].transform, res.transform, probe) > 2.0 * h
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
        confidence = _margin(chance_objective - obj, chance_objective - scored[runner][0])
        if judge is not None and confidence < cfg.min_confidence:
            confidence = max(
                confidence, _margin(judge(res.transform), judge(scored[runner][2].transform))
            )
    runner = None if runner is None else scored[runner]
    status, reason = 'ok', ''
    if overlap < cfg.min_overlap:
        status, reason = (
            'refused',
            (
                f'best pose puts {overlap:.0%} of the source on the reference '
                f'(< min_overlap {cfg.min_overlap:.0%}): no overlap found'
            ),
        )
    elif (
        normals is not None
        and (
            held := translation_constraint(
                probe @ res.transform[:3, :3].T + res.transform[:3, 3], reference, normals, h
            )
        )
        < cfg.min_constraint
    ):
        status, reason = (
            'refused',
            (
                f'degenerate: the overlap leaves a direction free to slide (constraint '
                f'{held:.3f} < min_constraint {cfg.min_constraint:.3f}: a plane, a corridor)'
            ),
        )
    elif confidence < cfg.min_confidence:
        apart = pose_distance(runner[2].transform, res.transform, probe)
        status, reason = (
            'refused',
            (
                f'ambiguous: a pose {apart:.3g} away explains the data almost as well '
                f'(confidence {confidence:.2f} < min_confidence {cfg.min_confidence:.2f})'
            ),
        )
    return GlobalOutcome(res, obj, overlap, confidence, status, reason, cands)


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
        t = scored[k][2].transform
        if len(judged) < JUDGED and all(
            pose_distance(scored[j][2].transform, t, probe) > 2.0 * h for j in judged
        ):
            judged.append(k)
        else:
            rest.append(k)
    excess = {k: judge(scored[k][2].transform) for k in judged}
    judged.sort(key=lambda k: -excess[k])  # stable: ties keep the objective's order
    return judged + rest, excess


def register_global(source, reference, config, reference_cache=None, refine=None, viewpoints=None):
    """``register(source, reference, config, init='global')``: see the module doc. Returns a
    RegistrationResult (the winner's dense fine-tune, in the configured divergence: the distance
    type as it is; the mass type with the mass estimated from the winner's overlap) with
    ``status``, ``reason``, ``overlap``, ``confidence`` and ``candidates`` filled in. ``refine``:
    the core's :func:`api.refine` (passed in by :func:`api.register`). viewpoints: None or the
    sensors' positions (source's in the source frame, reference's in the reference frame): then
    candidates that contradict the free space the sensors saw are rejected (:mod:`free_space`)."""
    import dataclasses
    from .errors import PwanInputError
    from .preprocess import check_rank, median_spacing

    t0 = time.perf_counter()
    cfg = config.global_search
    src = np.asarray(source, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if src.ndim != 2 or ref.ndim != 2 or src.shape[1] != 3 or ref.shape[1] != 3:
        raise PwanInputError("init='global' needs 3-D point sets (N, 3) and (M, 3)")
    src_f, ref_f = src[np.isfinite(src).all(1)], ref[np.isfinite(ref).all(1)]
    if len(src_f) < 10 or len(ref_f) < 10:
        raise PwanInputError("init='global' needs at least 10 finite points per set")
    check_rank(src_f, 'rigid', 'source')  # points at one place or on a line: no pose
    check_rank(ref_f, 'rigid', 'reference')
    wide = 0 if viewpoints is None else WIDE_FACTOR * cfg.candidates
    hyps, voxel, n_matches, timings = feature_hypotheses(src_f, ref_f, cfg, config.seed, wide)
    # refined on the subsets; scored on both sets voxel-downsampled at the feature voxel with
    # h = 1.5 voxels (the RANSAC inlier distance): uniform density, so a sensor's own sampling
    # pattern (lidar rings, dense near the sensor) cannot make "no motion" look like a match
    vs, vr = voxelised(src_f, voxel), voxelised(ref_f, voxel)
    seen_through = None
    if viewpoints is not None:
        from .free_space import FreeSpace, contradiction, supported

        ss, sr = vs[supported(vs, voxel)], vr[supported(vr, voxel)]
        spaces = FreeSpace(ss, viewpoints[0], voxel), FreeSpace(sr, viewpoints[1], voxel)

        def seen_through(pose):
            return contradiction(pose, ss, sr, *spaces)

        # the poses of the wide RANSAC join those refined without viewpoints when, as they are
        # (before refinement), they do not contradict the free space and explain most of the
        # source: a repetitive scene (a room's box-like furniture) gives its symmetric poses more
        # feature support than the true one
        vtree = cKDTree(vr)
        extra = sorted(
            (
                partial_objective_of(
                    vs @ h.transform[:3, :3].T + h.transform[:3, 3], vtree, 1.5 * voxel
                )[0],
                k,
                h,
            )
            for k, h in enumerate(hyps)
            if h.origin == 'ransac_wide' and seen_through(h.transform) <= cfg.max_free_space
        )
        hyps = [h for h in hyps if h.origin != 'ransac_wide'] + [
            h for _, _, h in extra[: cfg.candidates]
        ]
    if max((h.support for h in hyps), default=0) < cfg.weak_support:
        hyps = hyps + rotation_hypotheses(vs, vr, voxel, config.seed, ROTATION_KEEP)
    rng = np.random.default_rng(config.seed + 41)
    cap = max(config.start_finetune_points, 100)
    sub_s = src_f[rng.choice(len(src_f), min(cap, len(src_f)), replace=False)]
    sub_r = ref_f[rng.choice(len(ref_f), min(4 * cap, len(ref_f)), replace=False)]
    dist_cfg = config.replace(divergence='distance', transform='rigid')
    small = dist_cfg.replace(
        self_check=False,
        finetune=dataclasses.replace(
            dist_cfg.finetune, max_points=cap, max_iterations=config.start_finetune_iterations
        ),
    )
    h = config.distance_threshold or 2.0 * median_spacing(
        ref_f[rng.choice(len(ref_f), min(20000, len(ref_f)), replace=False)]
    )
    # the judge: overlap beyond chance with the reference's surfaces at the judging voxel
    # (:mod:`verify`), on a subset of the dense source
    judged_source = src_f[rng.choice(len(src_f), min(CHECK_POINTS, len(src_f)), replace=False)]
    judge_voxel = []  # computed at the first call: most searches never ask the judge

    def judge(t):
        if not judge_voxel:
            judge_voxel.append(judging_voxel(ref_f))
        moved = judged_source @ t[:3, :3].T + t[:3, 3]
        return check_pose(
            moved, ref_f, voxel=judge_voxel[0], seed=config.seed, rivals=False
        ).excess

    t1 = time.perf_counter()
    with warnings.catch_warnings():  # the candidates' refinements are capped on purpose
        warnings.filterwarnings('ignore', message='the fine-tune stopped', category=RuntimeWarning)
        out = choose(
            vr,
            hyps,
            cfg,
            lambda init: refine(sub_s, sub_r, init=init, config=small),
            1.5 * voxel,
            vs,
            seen_through,
            feature_normals(vr, voxel),
            judge,
        )
    t2 = time.perf_counter()
    final_cfg = dist_cfg.replace(distance_threshold=h)
    if config.divergence == 'mass':
        dense_s = src_f[rng.choice(len(src_f), min(20000, len(src_f)), replace=False)]
        dense_r = cKDTree(ref_f[rng.choice(len(ref_f), min(80000, len(ref_f)), replace=False)])

        def measure(t):  # capped by the candidates' overlap (within 1.5 feature voxels)
            return measured_mass_ratio(dense_s, dense_r, t, voxel, out.overlap, config.seed)

        mass = measure(out.result.transform)
        final_cfg = config.replace(transform='rigid', mass=None, mass_ratio=mass)
    if out.status != 'ok':  # a best guess only: the candidates' iteration cap, not the dense one's
        final_cfg = final_cfg.replace(
            finetune=dataclasses.replace(
                final_cfg.finetune,
                max_iterations=min(
                    final_cfg.finetune.max_iterations, config.start_finetune_iterations
                ),
            )
        )
    final_cfg = final_cfg.replace(self_check=False)  # judged below, with the viewpoints
    final = refine(
        source,
        reference,
        init=out.result.transform,
        config=final_cfg,
        reference_cache=reference_cache,
    )
    if config.divergence == 'mass' and out.status == 'ok':
        # the candidate was refined on subsets (a few degrees off on a hard pair): its residuals,
        # and so the mass, shrink at the refined pose; again from there while they do
        final = refit_mass(
            final,
            mass,
            measure,
            lambda t, m: refine(
                source,
                reference,
                init=t,
                config=final_cfg.replace(mass_ratio=m),
                reference_cache=reference_cache,
            ),
        )
    timings.update(choose=t2 - t1, finetune=time.perf_counter() - t2)
    overlap = final.matched_ratio if config.divergence == 'distance' else out.overlap
    status, reason = out.status, out.reason
    check = None
    if config.self_check:
        # the self-check of the dense refinement; with viewpoints, a rival pose that puts either
        # cloud where the other sensor saw free space is no rival
        admissible = None
        if seen_through is not None:

            def admissible(t):
                return seen_through(t @ final.transform) <= cfg.max_free_space

        check = check_pose(
            final.transformed_source, ref_f, seed=config.seed, admissible=admissible
        )
        if check.rival_better:
            # a clearly better pose next to the winner (hypotheses broken by outliers can all
            # miss the truth and leave the winner a partial fit): refined from there and judged
            final = refine(
                source,
                reference,
                init=check.rival_transform @ final.transform,
                config=final_cfg,
                reference_cache=reference_cache,
            )
            check = check_pose(
                final.transformed_source, ref_f, seed=config.seed, admissible=admissible
            )
        if status == 'ok' and check.status != 'ok':
            status, reason = check.status, check.reason
    return dataclasses.replace(
        final,
        time_s=time.perf_counter() - t0,
        timings=timings,
        status=status,
        reason=reason,
        check=check,
        overlap=overlap,
        confidence=out.confidence,
        candidates=[
            {'origin': o, 'support': sup, 'objective': obj, 'free_space': fs}
            for o, sup, obj, fs in out.candidates
        ],
        distance_threshold=final.distance_threshold,
    )
