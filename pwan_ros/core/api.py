"""PWAN registration, the public entry points: :func:`register` (Alg. 1 + fine-tune, optionally
multi-start) and :func:`refine` (the fine-tune alone).

Frames/units: inputs and outputs are in the caller's units (metres for ROS). Internally both sets
are centred and divided by a common scale (see :func:`preprocess.make_normaliser`); every
threshold is converted on the way in and reported in caller units. The stages live in their own
modules: input preparation (:mod:`problem`), the fit of one registration (:mod:`candidates`:
Alg. 1 (:mod:`alg1`), the multi-start (:mod:`multistart`), the fine-tune stage
(:mod:`finetune_stage`)), the result's assembly and self-check (:mod:`finish`), the fine-tune
alone (:mod:`refinement`) and what a result goes through after the fit (:mod:`judging`: the
mass at the measured overlap, the global search's confirmation, the deformed pose's check).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import numpy as np

from .candidates import register_candidates
from .config import RegistrationConfig
from .errors import PwanInputError
from .global_search import register_global
from .judging import (
    confirmed,
    deformable_finalists,
    fit_reference,
    judged_with_pose,
    mass_at_overlap,
    unconvincing,
)
from .multistart import distinct_poses, overlap_score
from .preprocess import median_spacing, random_subset
from .reference import ReferenceCache
from .refinement import refine_at_mass
from .result import RegistrationResult

__all__ = ['register', 'refine', 'ReferenceCache']


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
    res = refine_at_mass(source, reference, init, config, reference_cache, take_rival=True)
    return mass_at_overlap(source, reference, config, res, reference_cache)


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
        res = register_candidates(
            source, reference, config, init, potential_state, should_stop, reference_cache
        )[0][1]
        res = mass_at_overlap(source, reference, config, res, reference_cache)
        if init is None and unconvincing(res, config):
            res = confirmed(source, reference, config, res, reference_cache, refine)
        if config.transform == 'nonrigid' and config.self_check and res.status == 'ok':
            # the pose it deforms: the source under the result's affine part
            src = np.asarray(source, dtype=np.float64)[res.source_valid]
            a = res.transform
            posed = src @ a[:-1, :-1].T + a[:-1, -1]
            res = judged_with_pose(res, posed, fit_reference(reference), config)
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
    cands = register_candidates(
        source, reference, rigid, init, None, should_stop, cache, warn=False
    )
    ref_clean = fit_reference(reference)  # validated by the rigid stage
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
        res = register_candidates(
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
        res = judged_with_pose(res, best[2].transformed_source, ref_clean, config)
    return dataclasses.replace(res, time_s=time.perf_counter() - t0)


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
