"""PWAN registration, the public entry points: :func:`register` (Alg. 1 + fine-tune, optionally
multi-start) and :func:`refine` (the fine-tune alone).

Frames/units: inputs and outputs are in the caller's units (metres for ROS). Internally both sets
are centred and divided by a common scale (see :func:`preprocess.make_normaliser`); every
threshold is converted on the way in and reported in caller units. The stages live in their own
modules: input preparation (:mod:`problem`), Alg. 1 (:mod:`alg1`), the multi-start
(:mod:`multistart`) and the fine-tune stage (:mod:`finetune_stage`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
from scipy.spatial import cKDTree

from .alg1 import run_alg1
from .coherence import Coherence
from .config import NONRIGID_MATCHED_STEPS, RegistrationConfig
from .device import resolve_device, thread_scope
from .errors import PwanInputError
from .finetune import partial_objective, select_pairs
from .finetune_stage import finetune_data, finetune_stage
from .global_search import register_global
from .mass import measured_mass_ratio, refit_mass
from .multistart import (
    Candidate,
    OverlapScorer,
    distinct_poses,
    overlap_score,
    run_multistart,
    start_rotations,
)
from .nearest import query_workers, search_device
from .polish import gicp_polish
from .preprocess import (
    far_outliers,
    homogeneous,
    make_normaliser,
    median_spacing,
    random_subset,
    voxel_downsample,
)
from .problem import Problem, prepare, threshold
from .reference import PreparedReference, ReferenceCache
from .result import RegistrationResult
from .verify import CHECK_POINTS, RIVAL_DISTINCT, RIVAL_MARGIN, check_pose, judging_voxel

__all__ = ['register', 'refine', 'ReferenceCache']


@dataclass(frozen=True)
class _Effort:
    """What a registration spent: ``t0`` (time.perf_counter seconds at its start), ``timings``
    (seconds per stage), Alg. 1 steps, potential updates and fine-tune iterations."""

    t0: float
    timings: Dict[str, float]
    iterations: int = 0
    updates: int = 0
    finetune_iterations: int = 0


def _finish(
    prob: Problem,
    config: RegistrationConfig,
    cand: Candidate,
    effort: _Effort,
    h_caller: Optional[float],
    device: str,
    fit_tree: Optional[cKDTree] = None,
    polish: bool = False,
    take_rival: bool = False,
) -> RegistrationResult:
    """Assemble the result of ``cand`` (normalised frame): caller-frame transform, transformed
    points, match weights, the self-check (:mod:`verify`, ``config.self_check``).
    h_caller: the distance threshold (caller units; None for the mass divergence).
    polish: a rigid 3-D result gets the plane-aware polish (:mod:`polish`, ``finetune.polish``)
    and, like ``take_rival``, takes a clearly better pose the self-check finds next to it."""
    kind = config.transform
    a, t, v_fn = cand.a, cand.t, cand.v_fn
    t0, timings = effort.t0, effort.timings
    norm = prob.norm
    m_lin, b = norm.to_caller(a, t)
    total = homogeneous(m_lin, b) @ prob.init
    ys = norm.source(prob.src_init)
    zn = ys @ a + t
    disp = None
    if v_fn is not None:
        vn = v_fn(ys)
        zn = zn + vn
        disp = vn * norm.scale
    z = norm.denormalise_reference(zn)
    tree = cKDTree(prob.ref_fit) if fit_tree is None else fit_tree
    if polish and kind == 'rigid' and prob.dim == 3 and config.finetune.polish:
        tp = time.perf_counter()
        spacing = median_spacing(
            random_subset(prob.ref_fit, 20000, np.random.default_rng(config.seed))
        )
        gate = 2.0 * (h_caller if h_caller else 2.0 * spacing)
        pr = gicp_polish(
            prob.src_init,
            prob.ref_fit,
            homogeneous(m_lin, b),
            gate,
            reference_tree=tree,
            seed=config.seed,
        )
        if pr.kept:
            total = pr.transform @ prob.init
            z = prob.src_init @ pr.transform[:3, :3].T + pr.transform[:3, 3]
        timings['polish'] = time.perf_counter() - tp
    n_s = z.shape[0]

    def match_weights(points):
        dist, _ = tree.query(points, k=1, workers=query_workers(n_s))
        if config.divergence == 'mass':
            return select_pairs(
                dist, 'mass', int(round(min(1.0, prob.mass / n_s) * n_s)), 0.0
            ).astype(np.float64)
        return select_pairs(dist, 'distance', 0, h_caller).astype(np.float64)

    weights = match_weights(z)
    verdict = None
    if config.self_check:
        tc = time.perf_counter()
        verdict = check_pose(z, prob.ref_fit, seed=config.seed)
        if (polish or take_rival) and verdict.rival_better and kind == 'rigid':
            # a clearly better pose next to the result (GICP from a start around it): take it, and
            # judge it in turn
            total = verdict.rival_transform @ total
            z = z @ verdict.rival_transform[:3, :3].T + verdict.rival_transform[:3, 3]
            weights = match_weights(z)
            verdict = check_pose(z, prob.ref_fit, verdict.voxel, seed=config.seed)
        timings['check'] = time.perf_counter() - tc
    return RegistrationResult(
        transform=total,
        transformed_source=z,
        match_weights=weights,
        source_valid=prob.src.valid,
        matched_ratio=float(weights.mean()),
        converged=bool(cand.converged),
        iterations=int(effort.iterations),
        potential_updates=int(effort.updates),
        finetune_iterations=int(effort.finetune_iterations),
        time_s=time.perf_counter() - t0,
        timings=timings,
        num_source=int(n_s),
        num_reference=int(prob.ref.points.shape[0]),
        num_dropped_source=prob.src.dropped,
        num_dropped_reference=prob.ref.dropped,
        mass=prob.mass,
        distance_threshold=h_caller,
        h=None if cand.h is None else cand.h * norm.scale,
        displacement=disp,
        potential_state=cand.state,
        device=device,
        start_index=cand.index,
        check=verdict,
        status=verdict.status if verdict is not None else 'ok',
        reason=verdict.reason if verdict is not None else '',
    )


def _prepared(prob: Problem, cache: Optional[ReferenceCache]) -> PreparedReference:
    """The reference's prepared search structures: kept by ``cache``, else built for this call."""
    return cache.lookup(prob.ref_fit) if cache is not None else PreparedReference(prob.ref_fit)


def refine(
    source,
    reference,
    init=None,
    config: Optional[RegistrationConfig] = None,
    reference_cache: Optional[ReferenceCache] = None,
) -> RegistrationResult:
    """Cheap partial refinement: the fine-tune objective (eq. fine_tune) alone, warm-started.

    source (N, d), reference (M, d) in caller units; init: (d+1, d+1) source -> reference
    (identity when None). Uses config.transform, divergence, mass / mass_ratio /
    distance_threshold and config.finetune; a mass left to the default follows the overlap the
    result shows, as in :func:`register`; a rigid 3-D result takes a clearly better pose its
    self-check finds next to it and is judged there. No network: NN search + closed-form steps
    only, on the host (a k-d tree) unless ``finetune.nn`` is 'torch' (then on config.device).
    reference_cache: as in :func:`register`.
    """
    config = config or RegistrationConfig()
    res = _refine(source, reference, init, config, reference_cache, take_rival=True)
    return _mass_at_overlap(source, reference, config, res, reference_cache)


def _refine(
    source,
    reference,
    init,
    config: RegistrationConfig,
    reference_cache: Optional[ReferenceCache],
    take_rival: bool,
) -> RegistrationResult:
    """:func:`refine` at the configured mass; ``take_rival``: a rigid 3-D result takes a clearly
    better pose its self-check finds next to it (and is judged there)."""
    t0 = time.perf_counter()
    prob = prepare(source, reference, config, init if init is not None else None)
    # refine never re-centres: keep init semantics (identity init = trust the input frames)
    prob.norm = make_normaliser(prob.src_fit, prob.ref_fit, align_centroids=False)
    rng = np.random.default_rng(config.seed)
    h_caller = threshold(config, prob.ref_fit) if config.divergence == 'distance' else None
    t1 = time.perf_counter()
    d = prob.dim
    kind = config.transform
    dev = resolve_device(config.device) if config.finetune.nn == 'torch' else torch.device('cpu')
    prep = _prepared(prob, reference_cache)
    data = finetune_data(prob, config, kind, rng, prep, search_device(config.finetune.nn, dev))
    a, t, v_fn, iters, conv = finetune_stage(
        prob, config, kind, np.eye(d), np.zeros(d), None, h_caller, rng, data, warn=True
    )
    timings = {'preprocess': t1 - t0, 'finetune': time.perf_counter() - t1}
    return _finish(
        prob,
        config,
        Candidate(0.0, a, t, v_fn, conv, None, None),
        _Effort(t0, timings, finetune_iterations=iters),
        h_caller,
        str(dev),
        fit_tree=prep.fit_tree(),
        take_rival=take_rival,
    )


def _single_start(
    config: RegistrationConfig,
    device: torch.device,
    ys_np: np.ndarray,
    xs_np: np.ndarray,
    mass_n: Optional[float],
    h_n: Optional[float],
    rot0: Optional[np.ndarray],
    potential_state: Optional[dict],
    seed: int,
    should_stop: Optional[Callable[[], bool]] = None,
    h_floor: float = 0.0,
    ref_mass: Optional[float] = None,
) -> Tuple[Candidate, int, int]:
    """Alg. 1 (one start, :func:`alg1.run_alg1`) in the normalised frame from the rotation ``rot0``
    (column convention, about the origin); ``mass_n`` / ``ref_mass``: :class:`SampleMasses`.
    Returns (the start as a :class:`Candidate` of score 0, Alg. 1 steps, potential updates)."""
    kind = config.transform
    d = ys_np.shape[1]
    coh = None
    if kind == 'nonrigid':
        y = torch.as_tensor(ys_np, dtype=torch.float32, device=device)
        coh = Coherence(y, config.coherence, torch.Generator().manual_seed(seed))
    out = run_alg1(
        config,
        device,
        ys_np,
        xs_np,
        mass_n,
        h_n,
        [np.eye(d) if rot0 is None else rot0],
        config.steps,
        seed,
        should_stop,
        states=[potential_state],
        h_floor=h_floor,
        coherence=coh,
        ref_mass=ref_mass,
    )
    st = out.starts[0]
    v_fn = None
    if kind == 'nonrigid':
        v_adv = torch.as_tensor(st.v, dtype=torch.float64)
        coh_cpu = Coherence(
            torch.as_tensor(ys_np, dtype=torch.float64),
            config.coherence,
            torch.Generator().manual_seed(seed),
        )

        def _offsets(p, _v=v_adv, _c=coh_cpu):
            return _c.interpolate(_v, torch.as_tensor(p, dtype=torch.float64)).numpy()

        v_fn = _offsets
    return Candidate(0.0, st.a, st.t, v_fn, st.converged, st.h, st.state), out.steps, out.updates


def register(
    source,
    reference,
    config: Optional[RegistrationConfig] = None,
    init=None,
    potential_state: Optional[dict] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    reference_cache: Optional[ReferenceCache] = None,
    viewpoints=None,
) -> RegistrationResult:
    """Register ``source`` (N, d) onto ``reference`` (M, d), d in {2, 3}, with PWAN (Alg. 1).

    Caller units in, caller units out. init: optional (d+1, d+1) warm-start transform source ->
    reference, or ``'global'`` for an unknown initial pose (3-D rigid): feature hypotheses chosen
    and refined by the partial objective, with ``status`` / ``overlap`` / ``confidence`` in the
    result (:mod:`global_search`; ``config.global_search``). potential_state: optional network
    weights from a previous result (``result.potential_state``) to warm-start the potential.
    config.starts > 1 (rigid/affine) runs Alg. 1 + fine-tune from several initial rotations and
    keeps the one with the lowest ``config.start_score`` (default: the distance-type partial NN
    objective at 2x the dense reference spacing, see :class:`OverlapScorer`); with
    ``config.start_steps > 0`` as a coarse-to-fine tournament (short runs from every start, the
    best ``start_keep`` continue); all starts run in lock-step as one batched network
    (:mod:`alg1`). Non-rigid with ``prealign``: rigid registration(s) first; with several starts
    the ``prealign_keep`` best rigid finalists are each deformed and the best non-rigid result by
    the overlap score is returned. should_stop: optional callable polled once per transform update
    (and between starts); when it returns True the adversarial stage ends early (``converged`` is
    then False) — for time budgets and shutdown. Deterministic for a fixed seed on a given device
    and thread count (without should_stop). reference_cache: optional :class:`ReferenceCache` kept
    by the caller across registrations against the same reference (odometry: a keyframe): the
    reference's k-d tree / device search and normals are built once, while its points stay the
    same; the result equals that of a call without it. viewpoints (``init='global'`` only):
    ``(source_viewpoint, reference_viewpoint)``, each (3,) the sensor's position in its own cloud's
    frame (``'origin'``: both clouds are in their sensors' frames, as ROS scans and RGB-D fragments
    are); candidate poses that put either cloud where the other sensor saw free space are rejected
    (``global_search.max_free_space``, :mod:`free_space`) — what tells a symmetric room's turned
    halves from the truth. Every result carries the self-check (:mod:`verify`,
    ``config.self_check``): ``status`` 'ok' | 'refused', ``reason``, ``check``; a rigid 3-D result
    takes a clearly better pose the check finds next to it. Raises :class:`PwanInputError` on bad
    input.
    """
    config = (config or RegistrationConfig()).pinned()
    t0 = time.perf_counter()
    if isinstance(init, str):
        if init != 'global':
            raise PwanInputError(
                f"init must be a (d+1, d+1) transform, None or 'global', got {init!r}"
            )
        if config.transform != 'rigid':
            raise PwanInputError(
                "init='global' finds a rigid pose; register rigidly first, then pass its "
                "transform as init to the affine / non-rigid registration"
            )
        return register_global(
            source, reference, config, reference_cache, refine, _viewpoints(viewpoints)
        )
    if viewpoints is not None:
        raise PwanInputError("viewpoints are used by init='global' only")
    if config.transform != 'nonrigid' or not config.prealign:
        res = _register_candidates(
            source, reference, config, init, potential_state, should_stop, reference_cache
        )[0][1]
        res = _mass_at_overlap(source, reference, config, res, reference_cache)
        if init is None and _unconvincing(res, config):
            res = _confirmed(source, reference, config, res, reference_cache)
        if config.transform == 'nonrigid' and config.self_check and res.status == 'ok':
            # the pose it deforms: the source under the result's affine part
            src = np.asarray(source, dtype=np.float64)[res.source_valid]
            a = res.transform
            posed = src @ a[:-1, :-1].T + a[:-1, -1]
            res = _judged_with_pose(res, posed, _fit_reference(reference), config)
        return dataclasses.replace(res, time_s=time.perf_counter() - t0)
    # the rigid and non-rigid stages share the reference's search structures
    cache = reference_cache if reference_cache is not None else ReferenceCache()
    # coarse-to-fine: rigid PWAN registration(s) (with config.starts) initialise the non-rigid one
    # (large rotations are out of reach of a deformation started at identity); steps, u and
    # tolerance left None take the rigid defaults there, the network and warm-up stay the
    # non-rigid ones (pinned above). With several starts the ``prealign_keep`` best rigid finalists
    # are deformed and compared after the non-rigid stage: a rigid fit of a deformed shape can rank
    # a wrong, symmetric pose first.
    rigid = config.replace(transform='rigid', prealign=False, self_check=False)
    cands = _register_candidates(
        source, reference, rigid, init, None, should_stop, cache, warn=False
    )
    ref_clean = _fit_reference(reference)  # validated by the rigid stage
    # distinct poses only: finalists that converged to the same pose (within the reference
    # sampling) would be deformed twice
    tol = median_spacing(random_subset(ref_clean, 5000, np.random.default_rng(config.seed)))
    pres = [
        cands[i]
        for i in distinct_poses(
            [c[1].transformed_source for c in cands], tol, config.prealign_keep
        )
    ]
    pres = deformable_finalists(pres, ref_clean, config.seed)
    best = None
    for _, pre in pres:
        if best is not None and should_stop is not None and should_stop():
            break
        res = _register_candidates(
            source,
            reference,
            config.replace(prealign=False),
            pre.transform,
            potential_state,
            should_stop,
            cache,
        )[0][1]
        score = (
            overlap_score(res.transformed_source, ref_clean, config.seed) if len(pres) > 1 else 0.0
        )
        res = dataclasses.replace(
            res,
            timings={**res.timings, 'prealign': pre.time_s},
            iterations=res.iterations + pre.iterations,
            potential_updates=res.potential_updates + pre.potential_updates,
            start_index=pre.start_index,
        )
        if best is None or score < best[0]:
            best = (score, res, pre)
    res = best[1]
    if config.self_check and res.status == 'ok':
        res = _judged_with_pose(res, best[2].transformed_source, ref_clean, config)
    return dataclasses.replace(res, time_s=time.perf_counter() - t0)


def _fit_reference(reference) -> np.ndarray:
    """The reference's finite rows without far outliers (m, d), as the estimation sees it."""
    ref = np.asarray(reference, dtype=np.float64)
    ref = ref[np.isfinite(ref).all(axis=1)]
    return ref[~far_outliers(ref)]


def _judged_with_pose(
    res: RegistrationResult, posed: np.ndarray, reference: np.ndarray, config: RegistrationConfig
) -> RegistrationResult:
    """A non-rigid result judged by the pose it deforms as well: a deformation can lay a
    wrongly posed shape onto the reference (its own overlap then looks right), so the result is
    refused when the self-check refuses that pose. posed (n, 3): the source at that pose (the
    rigid pre-alignment's result, or the source under the result's affine part without
    ``prealign``); reference (m, 3): caller units, far outliers left out. The check's rival
    search finds a distinct pose of the undeformed shape that fits better or as well; a better
    fit within ``RIVAL_DISTINCT`` gates is the same pose, judged there. 3-D only: in 2-D the check
    has no rival search, and the overlap of a rigid fit to a deformed shape tells nothing the
    deformed result's own check does not. A refused result carries that pose's check."""
    if posed.shape[1] != 3:
        return res
    tc = time.perf_counter()
    verdict = check_pose(posed, reference, seed=config.seed)
    if verdict.rival_better and verdict.rival_shift <= RIVAL_DISTINCT * verdict.gate:
        # a better rigid fit next to the pose (the fit stopped short of it): the same pose for
        # the deformation, judged there as the rigid path judges the pose it takes
        t = verdict.rival_transform
        moved = posed @ t[:3, :3].T + t[:3, 3]
        verdict = check_pose(moved, reference, verdict.voxel, seed=config.seed)
    timings = {**res.timings, 'check': res.timings.get('check', 0.0) + time.perf_counter() - tc}
    if verdict.status == 'ok':
        return dataclasses.replace(res, timings=timings)
    reason = f'the self-check refuses the pose it deforms: {verdict.reason}'
    if config.starts == 1:
        reason += ' (an orientation far from the initial one needs starts=24 and prealign)'
    return dataclasses.replace(
        res, status='refused', reason=reason, timings=timings, check=verdict
    )


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


def _mass_at_overlap(source, reference, config, res, cache) -> RegistrationResult:
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
    ref = _fit_reference(reference)
    voxel = res.check.voxel if res.check is not None else judging_voxel(ref)
    src, tree = random_subset(src, 20000, rng), cKDTree(random_subset(ref, 80000, rng))

    def measure(t):
        return measured_mass_ratio(src, tree, t, voxel, seed=config.seed)

    def fit(t, mass):  # judged where it lands: a rival the check finds makes it refused
        return _refine(source, reference, t, config.replace(mass_ratio=mass), cache, False)

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


def _unconvincing(res: RegistrationResult, config: RegistrationConfig) -> bool:
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


def _confirmed(source, reference, config, res, cache) -> RegistrationResult:
    """``res`` (from no init, :func:`_unconvincing`) against the global search's result ``g``:
    the same pose (the source's points within ``RIVAL_DISTINCT`` gates RMS) keeps ``res`` as it
    is; a distinct ``g`` the global search vouches for that fits clearly better (by
    ``RIVAL_MARGIN`` of the source beyond chance, judged at one voxel) is returned; a vouched
    ``res`` that fits clearly better than ``g`` is kept; otherwise, or when the global search
    refuses, the pose is open and ``res`` is refused."""
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


def _viewpoints(viewpoints) -> Optional[tuple]:
    """``viewpoints`` as two (3,) float arrays (None stays None); 'origin' = both at (0, 0, 0)."""
    if viewpoints is None:
        return None
    if isinstance(viewpoints, str):
        if viewpoints != 'origin':
            raise PwanInputError(
                f"viewpoints must be 'origin' or two (3,) points, got {viewpoints!r}"
            )
        return np.zeros(3), np.zeros(3)
    try:
        pair = tuple(np.asarray(v, dtype=np.float64) for v in viewpoints)
    except (TypeError, ValueError):
        raise PwanInputError(
            'viewpoints must be two (3,) points: (source_viewpoint, reference_viewpoint)'
        ) from None
    if len(pair) != 2 or any(v.shape != (3,) or not np.isfinite(v).all() for v in pair):
        raise PwanInputError(
            'viewpoints must be two finite (3,) points: (source_viewpoint, reference_viewpoint)'
        )
    return pair


@dataclass(frozen=True)
class SampleMasses:
    """Masses of the adversarial stage's sampled sets, in units of one sampled source point:
    ``matched`` (mass type; None for the distance type) and ``reference`` (the reference's
    total; see :func:`sample_masses`)."""

    matched: Optional[float]
    reference: float


def sample_masses(
    ratio_min: Optional[float], n_src: int, n_ref: int, r: int, q: int, transform: str
) -> SampleMasses:
    """The masses of the sampled sets. n_src, n_ref: points before the random cap
    (``max_points``, after the voxel grid); r, q: after it; ratio_min: the matched mass over the
    smaller set (:class:`Problem`).

    Non-rigid: the cap draws each set at its own rate and estimates the same problem, so each set
    keeps its mass and the matched mass its fraction of each set (a sampled source point weighs
    n_src / r points). Capping only a reference of 2000 points and 1200 outliers to 2000 points
    would otherwise match that sample as a whole, outliers included, and the deformation
    follows them (docs/core.md). Rigid / affine: the samples weigh as sets of equal points,
    (ratio_min min(r, q), q), what their stages were validated with: weighted by the sets' sizes,
    voxelised street scans with as many uniform outliers (a reference 8-12x the source) were
    solved on 10 of 20 seed runs instead of 18 of 20. Without a cap both give the same."""
    if transform != 'nonrigid':
        return SampleMasses(None if ratio_min is None else ratio_min * min(r, q), float(q))
    unit = r / n_src
    matched = None if ratio_min is None else ratio_min * min(n_src, n_ref) * unit
    return SampleMasses(matched, n_ref * unit)


def _short_nonrigid_schedule(config: RegistrationConfig, mass_n: Optional[float], r: int) -> bool:
    """Whether a non-rigid run takes :data:`NONRIGID_MATCHED_STEPS`: the mass covers all r sampled
    source points, and the fine-tune's soft stage also runs CPD from the start (a second route
    to the deformation; the adversarial field alone keeps the full schedule)."""
    ft = config.finetune
    return (
        config.transform == 'nonrigid'
        and mass_n is not None
        and mass_n >= r * (1 - 1e-9)
        and ft.enabled
        and ft.soft_iterations > 0
        and ft.soft_from_start
    )


def _register_candidates(
    source,
    reference,
    config: RegistrationConfig,
    init,
    potential_state,
    should_stop,
    reference_cache: Optional[ReferenceCache] = None,
    warn: bool = True,
) -> list:
    """Alg. 1 + fine-tune (all starts / the tournament); returns the finalists as
    [(start score, RegistrationResult)], best first (one entry without multi-start). warn: a
    final fine-tune stopped by its iteration cap warns (off for a non-rigid registration's rigid
    pre-alignment, which the deformation continues from)."""
    t0 = time.perf_counter()
    default_steps = config.steps is None
    config = config.resolved()
    prob = prepare(source, reference, config, init)
    device = resolve_device(config.device)
    rng = np.random.default_rng(config.seed)
    norm = prob.norm
    # adversarial-stage point sets (caller units -> voxel -> cap -> normalised)
    src_ds = voxel_downsample(prob.src_fit, config.voxel_size)
    ref_ds = voxel_downsample(prob.ref_fit, config.voxel_size)
    n_src, n_ref = src_ds.shape[0], ref_ds.shape[0]
    src_ds = random_subset(src_ds, config.max_points, rng)
    ref_ds = random_subset(ref_ds, config.max_points, rng)
    if src_ds.shape[0] < 3 or ref_ds.shape[0] < 3:
        raise PwanInputError(
            'voxel_size leaves fewer than 3 points in a set; use a smaller voxel_size'
        )
    h_caller = threshold(config, ref_ds) if config.divergence == 'distance' else None
    ys_np = norm.source(src_ds)
    xs_np = norm.reference(ref_ds)
    r = ys_np.shape[0]
    kind = config.transform
    d = prob.dim
    timings = {'preprocess': time.perf_counter() - t0, 'adversarial': 0.0, 'finetune': 0.0}
    masses = sample_masses(prob.ratio_min, n_src, n_ref, r, xs_np.shape[0], kind)
    mass_n = masses.matched
    if default_steps and _short_nonrigid_schedule(config, mass_n, r):
        config = dataclasses.replace(config, steps=NONRIGID_MATCHED_STEPS)
    h_n = h_caller / norm.scale if h_caller is not None else None
    # resolution floor of the learned h (normalised): below the reference sampling the potential is
    # flat
    h_floor = (
        config.potential.h_floor * median_spacing(xs_np) if config.divergence == 'mass' else 0.0
    )
    rots = (
        start_rotations(d, config.starts) if config.starts > 1 and kind != 'nonrigid' else [None]
    )
    multi = len(rots) > 1
    prep = _prepared(prob, reference_cache)
    ft_data = None
    if config.finetune.enabled or multi:
        ft_data = finetune_data(
            prob, config, kind, rng, prep, search_device(config.finetune.nn, device)
        )
    # the multi-start's fine-tunes before the final one run on a sample (their selection score's
    # size)
    small_data = ft_data.subset(config.start_finetune_points, config.seed) if multi else None
    scorer = (
        OverlapScorer(ft_data, config.seed) if multi and config.start_score == 'overlap' else None
    )
    count_n = int(round(min(1.0, mass_n / r) * r)) if config.divergence == 'mass' else 0
    tot = {'steps': 0, 'updates': 0, 'ft': 0}

    def score_of(a, t):
        if scorer is not None:
            return scorer(a, t)
        z = ys_np @ a + t
        dist, _ = cKDTree(xs_np).query(z, k=1)
        sel = select_pairs(dist, config.divergence, count_n, h_n if h_n else 0.0)
        return partial_objective(dist, sel, config.divergence, h_n if h_n else 0.0)

    def finetune(a, t, v_fn=None, small: bool = False):
        """Fine-tune (a, t[, v_fn]) (on start_finetune_points source points when ``small``, else
        the final one). Returns (a, t, v_fn, converged)."""
        tf = time.perf_counter()
        data = small_data if small else ft_data
        a, t, v_fn, ft_iters, ft_conv = finetune_stage(
            prob,
            config,
            kind,
            a,
            t,
            v_fn,
            h_caller,
            rng,
            data,
            final=not small,
            warn=warn and not small,
            max_iterations=config.start_finetune_iterations if small else None,
        )
        timings['finetune'] += time.perf_counter() - tf
        tot['ft'] += ft_iters
        return a, t, v_fn, ft_conv

    if multi:
        cands = sorted(
            run_multistart(
                config,
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
                ref_mass=masses.reference,
            ),
            key=lambda c: c.score,
        )
        if config.finetune.enabled:
            # the finalists were compared after the fine-tune on start_finetune_points source
            # points (the score's own sample size); only the winner gets the dense fine-tune
            best = cands[0]
            a, t, v_fn, ft_conv = finetune(best.a, best.t)
            cands[0] = dataclasses.replace(
                best, a=a, t=t, v_fn=v_fn, converged=best.converged and ft_conv
            )
    else:
        ta = time.perf_counter()
        with thread_scope(config.threads):
            cand, steps, updates = _single_start(
                config,
                device,
                ys_np,
                xs_np,
                mass_n,
                h_n,
                rots[0],
                potential_state,
                config.seed,
                should_stop,
                h_floor,
                masses.reference,
            )
        timings['adversarial'] += time.perf_counter() - ta
        tot['steps'] += steps
        tot['updates'] += updates
        ft_conv = True
        if config.finetune.enabled:
            a, t, v_fn, ft_conv = finetune(cand.a, cand.t, cand.v_fn)
            cand = dataclasses.replace(cand, a=a, t=t, v_fn=v_fn)
        cands = [dataclasses.replace(cand, converged=cand.converged and ft_conv)]
    out = []
    for rank, cand in enumerate(cands):
        # only the winner is judged (the runners-up are the non-rigid prealignment's finalists)
        cfg = config if rank == 0 else config.replace(self_check=False)
        effort = _Effort(t0, dict(timings), tot['steps'], tot['updates'], tot['ft'])
        out.append(
            (
                cand.score,
                _finish(
                    prob,
                    cfg,
                    cand,
                    effort,
                    h_caller,
                    str(device),
                    fit_tree=prep.fit_tree(),
                    polish=True,
                ),
            )
        )
    return out
