"""Registration from an unknown initial pose: feature hypotheses, refined by PWAN's fine-tune and
chosen by the overlap beyond chance they show (``register(..., init='global')``).

1. **Hypotheses.** FPFH features (Open3D) on both sets voxel-downsampled to about
   ``feature_points`` points; mutual nearest neighbours in feature space; a vectorised RANSAC
   over 3-point samples (edge-length consistency, Kabsch) keeps the ``candidates`` best *distinct*
   poses by inlier support, not one answer. Open3D's FGR adds one, KISS-Matcher one more when
   installed; the caller's prior (identity) is always a candidate. When the features are weak,
   PWAN's rotation starts join, each translated by votes (:mod:`local.votes`), not by the
   centroids.
2. **Chosen by the overlap beyond chance.** Each candidate is refined by PWAN's fine-tune
   (eq. fine_tune, distance type at h = 2 x the reference spacing: it needs no overlap guess) on
   subsets, then taken to the fit its data show nearby by GICP coarse to fine at the judging
   voxel (:class:`checks.overlap.OverlapJudge`) and ranked by the fraction of the source it puts
   on the reference's surfaces beyond chance (uniform outliers rarely share a voxel, and chance
   is measured at random places in the moved source's box): the measure the self-check judges
   every result by. Feature support only proposes, so a pose that RANSAC ranks low (features
   broken by outliers) still wins when it explains the geometry; and a candidate the subsets'
   fine-tune left a few gates short of the truth is ranked at its fit.
3. **Refusal.** ``overlap`` = fraction of the source within h at the winner. The confidence is
   the winner's lead in overlap beyond chance over the best runner-up still distinct at its fit
   (points moved by more than ``RIVAL_DISTINCT`` gates RMS), as a share of what the winner
   explains, or, without viewpoints, of ``confirm_below`` when it explains less (it leaves room
   for a pose the search missed). When
   the overlap is below ``min_overlap``, the matched reference normals leave a direction free
   (:func:`translation_constraint` below ``min_constraint``: a plane, a corridor) or the margin
   is below ``min_confidence`` (two different poses explain the data almost equally: a symmetric
   object, a room's repeated structure, or a search that missed the truth) the result is
   ``status='refused'`` with the reason, instead of a confident wrong pose.
4. **The winner's fine-tune** on the dense sets: the distance type as it is; the mass type with
   the mass estimated at the winner (:mod:`checks.mass`), again while the estimate shrinks. Then
   the self-check (:mod:`checks.verify`), which may retake a better rival next to the winner. A
   refused winner stands: it is measured at its fit (no fine-tune, no rival search).

Frames: caller units; every pose maps source -> reference (T_reference_source).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, NamedTuple, Optional

import numpy as np
from scipy.spatial import cKDTree

from ..checks.free_space import FreeSpace, contradiction, supported
from ..checks.mass import OverlapMass, refit_mass
from ..checks.rival import retake_better_rival
from ..checks.overlap import OverlapJudge
from ..checks.verify import check_pose, judging_voxel
from ..config import GlobalConfig, RegistrationConfig
from ..errors import PwanInputError
from ..local.from_pose import fit_from_pose
from ..preprocess import check_rank, median_spacing
from ..problem import Request, fit_reference, threshold
from ..reference_cache import ReferenceCache
from ..result import RegistrationResult
from .choose import PRIOR_HINT, GlobalOutcome, Scoring, choose, partial_objective_of
from .hypotheses import ROTATION_KEEP, feature_hypotheses, feature_normals, rotation_hypotheses
from .hypotheses import voxelised

#: with viewpoints, RANSAC keeps this many times ``candidates`` distinct poses before the
#: free-space filter
WIDE_FACTOR = 8

__all__ = ['WIDE_FACTOR', 'register_global']


class _Candidates(NamedTuple):
    """The hypotheses of a search and what scores them: ``hyps``, the feature ``voxel``, both
    sets voxelised at it (``vs``, ``vr``), the free-space test (None without viewpoints) and the
    timings so far."""

    hyps: list
    voxel: float
    vs: np.ndarray
    vr: np.ndarray
    seen_through: Optional[Callable]
    timings: dict


def register_global(request: Request, viewpoints=None) -> RegistrationResult:
    """``register(source, reference, config, init='global')``: see the module doc. Returns a
    RegistrationResult (the winner's dense fine-tune, in the configured divergence: the distance
    type as it is; the mass type with the mass estimated from the winner's overlap) with
    ``status``, ``reason``, ``overlap``, ``confidence`` and ``candidates`` filled in. viewpoints:
    None or the sensors' positions (source's in the source frame, reference's in the reference
    frame): then candidates that contradict the free space the sensors saw are rejected
    (:mod:`checks.free_space`)."""
    t0 = time.perf_counter()
    config = request.config
    src_f, ref_f = _finite_sets(request.source, request.reference)
    cands = _candidates(src_f, ref_f, config, viewpoints)
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
    # every candidate is refined against the same reference subset: its threshold, search
    # structure and normals are built once
    small = small.replace(distance_threshold=threshold(small, fit_reference(sub_r)))
    sub_cache = ReferenceCache()
    h = config.distance_threshold or 2.0 * median_spacing(
        ref_f[rng.choice(len(ref_f), min(20000, len(ref_f)), replace=False)]
    )
    voxel = judging_voxel(ref_f)
    judge = OverlapJudge(src_f, ref_f, voxel, config.seed)
    t1 = time.perf_counter()
    scoring = Scoring(
        judge,
        cands.vr,
        cands.vs,
        1.5 * cands.voxel,
        feature_normals(cands.vr, cands.voxel),
        cands.seen_through,
    )
    out = choose(  # the candidates' refinements are capped on purpose
        cands.hyps,
        config.global_search,
        lambda init: fit_from_pose(
            Request(sub_s, sub_r, small, init, cache=sub_cache), take_rival=True
        ),
        scoring,
    )
    t2 = time.perf_counter()
    final_cfg = dist_cfg.replace(distance_threshold=h)
    final = _winner_refined(request, out, final_cfg, cands, rng, (src_f, ref_f))
    timings = {**cands.timings, 'choose': t2 - t1, 'finetune': time.perf_counter() - t2}
    status, reason, check, result = out.status, out.reason, None, final.result
    if config.self_check:
        searched = out.status == 'ok'  # a refusal stands: its best guess is only measured
        result, check = _judged(request, final, (ref_f, voxel), cands.seen_through, searched)
        if status == 'ok' and check.status != 'ok':
            status, reason = check.status, check.reason
            if check.rival_transform is not None or 'free to slide' in reason:
                reason = f'{reason}; {PRIOR_HINT}'
    overlap = result.matched_ratio if config.divergence == 'distance' else out.overlap
    return dataclasses.replace(
        result,
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
    )


def _finite_sets(source, reference) -> tuple:
    """The finite rows (n, 3) / (m, 3) of both sets, validated for a global search."""
    src = np.asarray(source, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if src.ndim != 2 or ref.ndim != 2 or src.shape[1] != 3 or ref.shape[1] != 3:
        raise PwanInputError("init='global' needs 3-D point sets (N, 3) and (M, 3)")
    src_f, ref_f = src[np.isfinite(src).all(1)], ref[np.isfinite(ref).all(1)]
    if len(src_f) < 10 or len(ref_f) < 10:
        raise PwanInputError("init='global' needs at least 10 finite points per set")
    check_rank(src_f, 'rigid', 'source')  # points at one place or on a line: no pose
    check_rank(ref_f, 'rigid', 'reference')
    return src_f, ref_f


def _candidates(src_f, ref_f, config: RegistrationConfig, viewpoints) -> _Candidates:
    """The hypotheses (:func:`hypotheses.feature_hypotheses`; with viewpoints, the wide RANSAC's
    poses that agree with the sensors' free space; when the features are weak, the rotation
    starts). They are refined on subsets and scored on both sets voxel-downsampled at the
    feature voxel with h = 1.5 voxels (the RANSAC inlier distance): uniform density, so a
    sensor's own sampling pattern (lidar rings, dense near the sensor) cannot make "no motion"
    look like a match."""
    cfg = config.global_search
    wide = 0 if viewpoints is None else WIDE_FACTOR * cfg.candidates
    hyps, voxel, _, timings = feature_hypotheses(src_f, ref_f, cfg, config.seed, wide)
    vs, vr = voxelised(src_f, voxel), voxelised(ref_f, voxel)
    seen_through = None
    if viewpoints is not None:
        seen_through = _free_space_test(vs, vr, voxel, viewpoints)
        hyps = _seen_hypotheses(hyps, vs, vr, voxel, seen_through, cfg)
    if max((h.support for h in hyps), default=0) < cfg.weak_support:
        hyps = hyps + rotation_hypotheses(vs, vr, voxel, config.seed, ROTATION_KEEP)
    return _Candidates(hyps, voxel, vs, vr, seen_through, timings)


def _free_space_test(vs, vr, voxel: float, viewpoints) -> Callable:
    """f(pose) -> the fraction of either cloud a pose puts where the other sensor saw free space
    (:func:`checks.free_space.contradiction`)."""
    ss, sr = vs[supported(vs, voxel)], vr[supported(vr, voxel)]
    spaces = FreeSpace(ss, viewpoints[0], voxel), FreeSpace(sr, viewpoints[1], voxel)

    def seen_through(pose):
        return contradiction(pose, ss, sr, *spaces)

    return seen_through


def _seen_hypotheses(hyps, vs, vr, voxel, seen_through, cfg: GlobalConfig) -> list:
    """The poses of the wide RANSAC join those refined without viewpoints when, as they are
    (before refinement), they do not contradict the free space and explain most of the source: a
    repetitive scene (a room's box-like furniture) gives its symmetric poses more feature support
    than the true one."""
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
    return [h for h in hyps if h.origin != 'ransac_wide'] + [
        h for _, _, h in extra[: cfg.candidates]
    ]


class _Final(NamedTuple):
    """The winner's dense refinement and how to refine again (``refit(init) -> result``)."""

    result: RegistrationResult
    refit: Callable


def _winner_refined(request: Request, out: GlobalOutcome, dist_cfg, cands, rng, sets) -> _Final:
    """The winner's fine-tune on the dense sets in the configured divergence (distance type:
    ``dist_cfg``); the mass type at the mass its overlap shows (capped by the candidates'
    overlap), again while that shrinks (the candidate was refined on subsets, a few degrees off
    on a hard pair). A refused winner is a best guess only, measured at its fit as it is (no
    dense fine-tune). sets: the finite source and reference points (n, 3), (m, 3)."""
    config = request.config
    final_cfg = dist_cfg
    meter = mass = None
    if config.divergence == 'mass':
        meter = OverlapMass(*sets, cands.voxel, rng, out.overlap, config.seed)
        mass = meter(out.transform)
        final_cfg = config.replace(transform='rigid', mass=None, mass_ratio=mass)
    final_cfg = final_cfg.replace(self_check=False)  # judged by the caller, with the viewpoints

    def refit(init, cfg=final_cfg, iterations=None):
        return fit_from_pose(request.with_(config=cfg, init=init), True, iterations)

    final = refit(out.transform, iterations=None if out.status == 'ok' else 0)
    if meter is not None and out.status == 'ok':
        final = refit_mass(
            final, mass, meter, lambda t, m: refit(t, final_cfg.replace(mass_ratio=m))
        )
    return _Final(final, refit)


def _judged(request: Request, final: _Final, reference, seen_through, rivals: bool) -> tuple:
    """(the final result, its self-check); a clearly better pose next to the winner (hypotheses
    broken by outliers can all miss the truth and leave the winner a partial fit) is refined
    from there and judged in its place. With viewpoints, a rival pose that puts either cloud
    where the other sensor saw free space is no rival. reference: (the finite reference points
    (m, 3), its judging voxel); rivals: False: the overlap only (no rival search, no retake)."""
    ref_f, voxel = reference
    seed = request.config.seed
    max_free = request.config.global_search.max_free_space

    def judge(res):
        admissible = None
        if seen_through is not None:

            def admissible(t):
                return seen_through(t @ res.transform) <= max_free

        return check_pose(
            res.transformed_source, ref_f, voxel, seed, rivals=rivals, admissible=admissible
        )

    result = final.result
    check = judge(result)
    if not rivals:
        return result, check
    retaken = retake_better_rival(check, lambda rt: final.refit(rt @ result.transform), judge)
    if retaken is not None:
        result, check = retaken
    return result, check
