"""What a registration's result goes through after the fit: the mass refit at the overlap its
pose shows (:mod:`mass`), the global search's confirmation of an unconvincing pose, and a
non-rigid result judged by the pose it deforms (:mod:`verify`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
from scipy.spatial import cKDTree

from pwan_ros.geometry.se3 import rotation_angle

from .config import RegistrationConfig
from .errors import PwanInputError
from .global_search import register_global
from .mass import measured_mass_ratio, refit_mass
from .multistart import overlap_score
from .preprocess import far_outliers, random_subset
from .refinement import refine_at_mass
from .result import RegistrationResult
from .verify import CHECK_POINTS, RIVAL_DISTINCT, RIVAL_MARGIN, check_pose, judging_voxel

__all__ = [
    'PREALIGN_GAP',
    'confirmed',
    'deformable_finalists',
    'fit_reference',
    'judged_with_pose',
    'mass_at_overlap',
    'unconvincing',
]


def fit_reference(reference) -> np.ndarray:
    """The reference's finite rows without far outliers (m, d), as the estimation sees it."""
    ref = np.asarray(reference, dtype=np.float64)
    ref = ref[np.isfinite(ref).all(axis=1)]
    return ref[~far_outliers(ref)]


def judged_with_pose(
    res: RegistrationResult, posed: np.ndarray, reference: np.ndarray, config: RegistrationConfig
) -> RegistrationResult:
    """A non-rigid result judged by the pose it deforms as well: a deformation can lay a
    wrongly posed shape onto the reference (its own overlap then looks right), so the result is
    refused when the self-check refuses that pose. posed (n, d): the source at that pose (the
    rigid pre-alignment's result, or the source under the result's affine part without
    ``prealign``); reference (m, d): caller units, far outliers left out. The check's rival
    search finds a distinct pose of the undeformed shape that fits better or as well; a better
    fit within ``RIVAL_DISTINCT`` gates is the same pose, judged there. A refused result carries
    that pose's check. A distance-type result that matched no source point within ``h`` is
    refused first: its deformation had nothing to fit."""
    if config.divergence == 'distance' and res.matched_ratio == 0.0:
        return dataclasses.replace(
            res,
            status='refused',
            reason=(
                f'no source point lies within the distance threshold h = '
                f'{res.distance_threshold:g} of the reference: the deformation had nothing to '
                "fit (raise distance_threshold to the scans' noise and deformation)"
            ),
        )
    d = posed.shape[1]
    tc = time.perf_counter()
    verdict = check_pose(posed, reference, seed=config.seed, exact_fit=False)
    if verdict.rival_better and verdict.rival_shift <= RIVAL_DISTINCT * verdict.gate:
        # a better rigid fit next to the pose (the fit stopped short of it): the same pose for
        # the deformation, judged there as the rigid path judges the pose it takes
        t = verdict.rival_transform
        moved = posed @ t[:d, :d].T + t[:d, d]
        verdict = check_pose(moved, reference, verdict.voxel, seed=config.seed, exact_fit=False)
    timings = {**res.timings, 'check': res.timings.get('check', 0.0) + time.perf_counter() - tc}
    if verdict.status == 'ok':
        return dataclasses.replace(res, timings=timings)
    reason = f'the self-check refuses the pose it deforms: {verdict.reason}'
    if config.starts == 1 and _turned(verdict.rival_transform) >= HINT_TURN_DEG:
        reason += ' (an orientation far from the initial one needs starts=24 and prealign)'
    return dataclasses.replace(
        res, status='refused', reason=reason, timings=timings, check=verdict
    )


#: a refused pose's rival turned at least this far (deg) from it, or no rival, gets the hint to
#: search orientations (a rival slid along the shape is no orientation out of reach)
HINT_TURN_DEG = 10.0


def _turned(rival: np.ndarray | None) -> float:
    """Rotation angle (deg) of a (d+1, d+1) rival transform; inf without one."""
    if rival is None:
        return float('inf')
    if len(rival) == 3:  # 2-D
        return float(abs(np.degrees(np.arctan2(rival[1, 0], rival[0, 0]))))
    return float(np.degrees(rotation_angle(rival)))


#: non-rigid prealign: a rigid finalist whose overlap score (fraction of the source off the
#: reference) is above the best finalist's by more than this is a distinct, worse pose and is not
#: deformed (a deformation recovers the few points a rigid fit of a deformed shape leaves off,
#: not this many)
PREALIGN_GAP = 0.1


def deformable_finalists(finalists: list, reference: np.ndarray, seed: int) -> list:
    """The rigid ``(index, RegistrationResult)`` finalists of a non-rigid prealign worth deforming:
    those whose overlap score (fraction of ``transformed_source`` off ``reference``, (m, d)) is
    within :data:`PREALIGN_GAP` of the best one's, in their order."""
    if len(finalists) < 2:
        return list(finalists)
    scores = [overlap_score(r.transformed_source, reference, seed) for _, r in finalists]
    return [f for f, sc in zip(finalists, scores) if sc <= min(scores) + PREALIGN_GAP]


def mass_at_overlap(source, reference, config, res, cache) -> RegistrationResult:
    """A mass-type result whose mass was left to the default (``mass`` and ``mass_ratio`` None:
    0.8) fine-tuned again at the overlap its pose shows while that is lower (:mod:`mass`); any
    other result as it is. The refit is judged by the self-check like the first fit."""
    if (
        config.divergence != 'mass'
        or config.mass is not None
        or config.mass_ratio is not None
        or config.transform == 'nonrigid'
    ):
        return res
    t0 = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    src = np.asarray(source, dtype=np.float64)[res.source_valid]
    ref = fit_reference(reference)
    voxel = res.check.voxel if res.check is not None else judging_voxel(ref)
    src, tree = random_subset(src, 20000, rng), cKDTree(random_subset(ref, 80000, rng))

    def measure(t):
        return measured_mass_ratio(src, tree, t, voxel, seed=config.seed)

    def fit(t, mass):  # judged where it lands: a rival the check finds makes it refused
        return refine_at_mass(source, reference, t, config.replace(mass_ratio=mass), cache, False)

    out = refit_mass(res, config.effective_mass_ratio, measure, fit)
    if out is res:
        return res
    return dataclasses.replace(
        out,
        time_s=res.time_s + time.perf_counter() - t0,
        timings={**res.timings, 'mass': time.perf_counter() - t0},
        iterations=res.iterations,
        potential_updates=res.potential_updates,
        finetune_iterations=res.finetune_iterations + out.finetune_iterations,
        potential_state=res.potential_state,
        h=res.h,
        start_index=res.start_index,
    )


def unconvincing(res: RegistrationResult, config: RegistrationConfig) -> bool:
    """A rigid 3-D result whose self-check puts less than ``global_search.confirm_below`` of the
    source on the reference beyond chance: a local search from identity cannot rule out a distant
    pose that the data fit as well (bunny 180->315: 34 % at 164 deg off, 15 % at the truth), and
    a refused one may have missed the pose the global search finds."""
    return (
        config.transform == 'rigid'
        and res.check is not None
        and res.transformed_source.shape[1] == 3
        and res.check.excess < config.global_search.confirm_below
    )


def confirmed(source, reference, config, res, cache, refine: Callable) -> RegistrationResult:
    """``res`` (from no init, :func:`unconvincing`) against the global search's result ``g``:
    the same pose (the source's points within ``RIVAL_DISTINCT`` gates RMS) keeps ``res`` as it
    is; a distinct ``g`` the global search vouches for that fits clearly better (by
    ``RIVAL_MARGIN`` of the source beyond chance, judged at one voxel) is returned; a vouched
    ``res`` that fits clearly better than ``g`` is kept; otherwise, or when the global search
    refuses, the pose is open and ``res`` is refused. refine: :func:`api.refine`, with which the
    global search refines its hypotheses."""
    t0 = time.perf_counter()
    try:
        g = register_global(source, reference, config, cache, refine, None)
    except PwanInputError as exc:  # too few points or a degenerate set for feature hypotheses
        if res.status != 'ok':
            return res
        reason = (
            f'the pose puts {res.check.excess:.0%} of the source on the reference beyond chance, '
            f'too little to rule out a distant pose, and the global search cannot run: {exc}'
        )
        timings = {**res.timings, 'confirm': time.perf_counter() - t0}
        return dataclasses.replace(res, status='refused', reason=reason, timings=timings)
    timings = {**res.timings, 'confirm': time.perf_counter() - t0}
    src = np.asarray(source, dtype=np.float64)[res.source_valid]
    src = random_subset(src, CHECK_POINTS, np.random.default_rng(config.seed))
    diff = res.transform - g.transform
    apart = float(np.sqrt(np.mean(np.sum((src @ diff[:3, :3].T + diff[:3, 3]) ** 2, axis=1))))
    gate = res.check.gate
    if apart <= RIVAL_DISTINCT * gate:
        return dataclasses.replace(res, timings=timings)
    ref = np.asarray(reference, dtype=np.float64)
    ref = ref[np.isfinite(ref).all(axis=1)]
    voxel = res.check.voxel
    mine = check_pose(res.transformed_source, ref, voxel, config.seed, rivals=False).excess
    theirs = check_pose(g.transformed_source, ref, voxel, config.seed, rivals=False).excess
    if g.status == 'ok' and theirs > mine + RIVAL_MARGIN:
        return dataclasses.replace(g, timings={**timings, **g.timings})
    if res.status == 'ok' and g.status == 'ok' and mine > theirs + RIVAL_MARGIN:
        return dataclasses.replace(res, timings=timings)
    why = (
        f'the global search refuses: {g.reason}'
        if g.status != 'ok'
        else f'the global search finds a pose {apart:.3g} away that fits about as well '
        f'({theirs:.0%} against {mine:.0%} beyond chance)'
    )
    reason = (
        f'the pose puts {mine:.0%} of the source on the reference beyond chance, too little to '
        f'rule out a distant pose, and {why}'
    )
    return dataclasses.replace(res, status='refused', reason=reason, timings=timings)
