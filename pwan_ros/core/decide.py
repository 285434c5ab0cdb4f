"""What a fitted result goes through before it is returned (caller units): the mass refit at the
overlap its pose shows (:func:`mass_at_overlap`), the global search's confirmation of a pose a
local search cannot vouch for (:func:`confirm`), and a deformation judged as a deformation
(:func:`judge`), retried from the cube's orientations when refused from one start
(:func:`reorient`). Each takes the caller's :class:`problem.Request` and a result, and returns a
result."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .checks.deformation import DeformationCheck, measure_deformation
from .checks.mass import OverlapMass, refit_mass
from .checks.verify import CHECK_POINTS, RIVAL_DISTINCT, RIVAL_MARGIN, check_pose, judging_voxel
from .errors import PwanInputError
from .global_search.search import register_global
from .local.deform import deform
from .local.from_pose import fit_from_pose
from .preprocess import random_subset
from .problem import Request, fit_reference
from .result import RegistrationResult

__all__ = ['REORIENT_STARTS', 'confirm', 'judge', 'mass_at_overlap', 'reorient', 'unconvincing']

#: starts of :func:`reorient`'s second registration: the 24 rotations of the cube (3-D; 2-D: 24
#: angles 15 deg apart), each within 60 deg of any orientation
REORIENT_STARTS = 24


def mass_at_overlap(request: Request, res: RegistrationResult) -> RegistrationResult:
    """A mass-type rigid / affine result whose mass was left to the default (``mass`` and
    ``mass_ratio`` None: 0.8) fine-tuned again at the overlap its pose shows while that is lower
    (:mod:`checks.mass`); any other result as it is. The refit is judged by the self-check like
    the first fit."""
    config = request.config
    if (
        config.divergence != 'mass'
        or config.mass is not None
        or config.mass_ratio is not None
        or config.transform == 'nonrigid'
    ):
        return res
    t0 = time.perf_counter()
    src = np.asarray(request.source, dtype=np.float64)[res.source_valid]
    ref = fit_reference(request.reference)
    voxel = res.check.voxel if res.check is not None else judging_voxel(ref)
    meter = OverlapMass(src, ref, voxel, np.random.default_rng(config.seed), seed=config.seed)

    def fit(t, mass):  # judged where it lands: a rival the check finds makes it refused
        refit = request.with_(config=config.replace(mass_ratio=mass), init=t)
        return fit_from_pose(refit, take_rival=False)

    out = refit_mass(res, config.effective_mass_ratio, meter, fit)
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


def unconvincing(res: RegistrationResult, config) -> bool:
    """A rigid or affine 3-D result whose self-check puts less than
    ``global_search.confirm_below`` of the source on the reference beyond chance: a local search
    from identity cannot rule out a distant pose that the data fit as well (bunny 180->315: 34 %
    at 164 deg off, 15 % at the truth; affine 090->180: ok 0.27 diagonals off), and a refused one
    may have missed the pose the global search finds."""
    return (
        config.transform in ('rigid', 'affine')
        and res.check is not None
        and res.transformed_source.shape[1] == 3
        and res.check.excess < config.global_search.confirm_below
    )


def confirm(request: Request, res: RegistrationResult) -> RegistrationResult:
    """A result from no init that is :func:`unconvincing`, against the global search's result
    ``g``: the same pose (the source's points within ``RIVAL_DISTINCT`` gates RMS) keeps ``res``
    as it is when the global search vouches for it, else refuses it (bunny 180->315 came back ok
    164 deg off, found by both searches); a distinct ``g`` the global search vouches for that
    fits clearly better (by ``RIVAL_MARGIN`` of the source beyond chance, judged at one voxel) is
    returned (an affine request: the affine fit from it, judged); a vouched ``res`` that fits
    clearly better than ``g`` is kept; otherwise, or when the global search refuses, the pose is
    open and ``res`` is refused. Any other result as it is."""
    if request.init is not None or not unconvincing(res, request.config):
        return res
    t0 = time.perf_counter()
    try:
        g = register_global(request)
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
    src = np.asarray(request.source, dtype=np.float64)[res.source_valid]
    src = random_subset(src, CHECK_POINTS, np.random.default_rng(request.config.seed))
    diff = res.transform - g.transform
    apart = float(np.sqrt(np.mean(np.sum((src @ diff[:3, :3].T + diff[:3, 3]) ** 2, axis=1))))
    if apart <= RIVAL_DISTINCT * res.check.gate:  # the same pose: as the search judges it
        if g.status == 'ok' or res.status != 'ok':
            return dataclasses.replace(res, timings=timings)
        reason = (
            f'the pose puts {res.check.excess:.0%} of the source on the reference beyond chance, '
            f'too little to rule out a distant pose, and the global search, which finds it too, '
            f'cannot vouch for it: {g.reason}'
        )
        return dataclasses.replace(res, status='refused', reason=reason, timings=timings)
    return _settled(request, res, g, apart, timings)


def _settled(request: Request, res, g, apart: float, timings: dict) -> RegistrationResult:
    """Of two distinct poses (``res`` and the global search's ``g``, ``apart`` RMS), the one that
    fits clearly better at one judging voxel, or ``res`` refused."""
    ref = np.asarray(request.reference, dtype=np.float64)
    ref = ref[np.isfinite(ref).all(axis=1)]
    voxel, seed = res.check.voxel, request.config.seed
    mine = check_pose(res.transformed_source, ref, voxel, seed, rivals=False).excess
    theirs = check_pose(g.transformed_source, ref, voxel, seed, rivals=False).excess
    if g.status == 'ok' and theirs > mine + RIVAL_MARGIN:
        if request.config.transform == 'affine':  # the affine fit from the global (rigid) pose
            g = fit_from_pose(request.with_(init=g.transform), take_rival=True)
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


def judge(request: Request, res: RegistrationResult) -> RegistrationResult:
    """A non-rigid result judged as a deformation (:mod:`checks.deformation`); any other result,
    or one already refused, as it is.

    Refused: a distance-type result that matched no source point within ``h`` (its deformation
    had nothing to fit); one that explains under ``MIN_EXPLAINED`` of the source within the gate;
    one that turns many neighbourhoods far from its affine part (it makes up for a wrong pose) or
    tears them apart (scrambled correspondences). Not judged by a rigid rival of the pose it
    deforms: an articulated shape's rigid pose is ambiguous by nature."""
    config = request.config
    if config.transform != 'nonrigid' or not config.self_check or res.status != 'ok':
        return res
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
    tc = time.perf_counter()
    src = np.asarray(request.source, dtype=np.float64)[res.source_valid]
    reference = fit_reference(request.reference)
    measured = measure_deformation(
        src, reference, res.transformed_source, res.transform, seed=config.seed
    )
    timings = {**res.timings, 'check': res.timings.get('check', 0.0) + time.perf_counter() - tc}
    if measured.status == 'ok':
        return dataclasses.replace(res, timings=timings, check=measured)
    reason = f'the self-check refuses the deformation: {measured.reason}'
    if config.starts == 1 and not _reorients(request):
        reason += ' (an orientation far from the initial one needs starts=24 and prealign)'
    return dataclasses.replace(
        res, status='refused', reason=reason, timings=timings, check=measured
    )


def _reorients(request: Request) -> bool:
    """Whether :func:`reorient` retries ``request``'s refused deformation."""
    config = request.config
    return (
        config.transform == 'nonrigid'
        and config.reorient
        and config.prealign
        and config.starts == 1
        and request.init is None
    )


def reorient(request: Request, res: RegistrationResult) -> RegistrationResult:
    """A non-rigid result from one start and no init whose deformation the self-check refused
    (:func:`judge`; not one that matched nothing), registered again from
    :data:`REORIENT_STARTS` orientations (the rigid pre-alignment's multi-start, then the
    deformation of its best finalists) and judged: returned when accepted, else ``res`` with both
    reasons. A shape far from the initial orientation (body scans whose up axes differ) is out of
    reach of one start, and the deformation it gets there is refused. Any other result as it is;
    nothing is retried after ``should_stop``."""
    refused_deformation = isinstance(res.check, DeformationCheck) and res.check.status != 'ok'
    if not refused_deformation or not _reorients(request):
        return res
    if request.should_stop is not None and request.should_stop():
        return res
    t0 = time.perf_counter()
    again = request.with_(config=request.config.replace(starts=REORIENT_STARTS))
    out = judge(again, deform(again))
    spent = time.perf_counter() - t0
    if out.status == 'ok':
        first = sum(res.timings.values())
        return dataclasses.replace(out, timings={**out.timings, 'first_orientation': first})
    why = out.check.reason if isinstance(out.check, DeformationCheck) else out.reason
    reason = f'{res.reason}; registered again from {REORIENT_STARTS} orientations: {why}'
    return dataclasses.replace(res, reason=reason, timings={**res.timings, 'reorient': spent})
