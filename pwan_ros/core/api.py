"""PWAN registration, the public entry points: :func:`register` (Alg. 1 + fine-tune, optionally
multi-start, or a global search) and :func:`refine` (the fine-tune alone).

Frames/units: inputs and outputs are in the caller's units (metres for ROS). Internally both sets
are centred and divided by a common scale (see :func:`preprocess.make_normaliser`); every
threshold is converted on the way in and reported in caller units. :func:`register` reads as its
stages, each a function of the caller's :class:`problem.Request` and the result so far:

1. **fit** (:mod:`local`): Alg. 1 and the fine-tune from the init (one start or the multi-start
   tournament); a non-rigid one from its rigid pre-alignment. The result carries its self-check.
2. **mass at the overlap** (:func:`decide.mass_at_overlap`): a default mass refit at the overlap
   the pose shows.
3. **confirm** (:func:`decide.confirm`): a pose a local search cannot vouch for, against the
   global search (:mod:`global_search`).
4. **judge** (:func:`decide.judge`): a deformation judged as a deformation (checks.deformation);
   one refused from one start and no init is registered again from the cube's 24 orientations
   (:func:`decide.reorient`).

The package's layers, each importing only those below it: api -> decide -> global_search ->
local -> checks -> finetune -> pwan -> config / problem / result (test/test_layout.py).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Callable, Optional

import numpy as np

from .config import RegistrationConfig
from .decide import confirm, judge, mass_at_overlap, reorient
from .errors import PwanInputError
from .finetune.stage import capped_warning
from .global_search.search import register_global
from .local.deform import deform
from .local.fit import fit
from .local.from_pose import fit_from_pose
from .problem import Request
from .reference_cache import ReferenceCache
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
    request = Request(
        source, reference, config or RegistrationConfig(), init, cache=reference_cache
    )
    res = mass_at_overlap(request, fit_from_pose(request, take_rival=True))
    return _warned(request.config, res)


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
    objective at 2x the dense reference spacing, see :class:`local.scoring.OverlapScorer`); with
    ``config.start_steps > 0`` as a coarse-to-fine tournament (short runs from every start, the
    best ``start_keep`` continue); all starts run in lock-step as one batched network
    (:mod:`pwan.alg1`). Non-rigid with ``prealign``: rigid registration(s) first; with several
    starts the ``prealign_keep`` best rigid finalists are each deformed and the best non-rigid
    result by the overlap score is returned. should_stop: optional callable polled once per
    transform update (and between starts); when it returns True the adversarial stage ends early
    (``converged`` is then False) — for time budgets and shutdown. Deterministic for a fixed seed
    on a given device and thread count (without should_stop). reference_cache: optional
    :class:`ReferenceCache` kept by the caller across registrations against the same reference
    (odometry: a keyframe): the reference's k-d tree / device search and normals are built once,
    while its points stay the same; the result equals that of a call without it. viewpoints
    (``init='global'`` only): ``(source_viewpoint, reference_viewpoint)``, each (3,) the sensor's
    position in its own cloud's frame (``'origin'``: both clouds are in their sensors' frames, as
    ROS scans and RGB-D fragments are); candidate poses that put either cloud where the other
    sensor saw free space are rejected (``global_search.max_free_space``,
    :mod:`checks.free_space`) — what tells a symmetric room's turned halves from the truth. Every
    result carries the self-check (:mod:`checks.verify`, ``config.self_check``): ``status`` 'ok'
    | 'refused', ``reason``, ``check``; a rigid 3-D result takes a clearly better pose the check
    finds next to it. Raises :class:`PwanInputError` on bad input.
    """
    t0 = time.perf_counter()
    config = (config or RegistrationConfig()).pinned()
    if isinstance(init, str):
        res = _global(source, reference, config, init, reference_cache, viewpoints)
        return _warned(config, res)
    if viewpoints is not None:
        raise PwanInputError("viewpoints are used by init='global' only")
    request = Request(
        source, reference, config, init, potential_state, should_stop, reference_cache
    )
    res = _fitted(request)
    res = mass_at_overlap(request, res)
    res = confirm(request, res)
    res = reorient(request, judge(request, res))
    return _warned(config, dataclasses.replace(res, time_s=time.perf_counter() - t0))


def _warned(config: RegistrationConfig, res: RegistrationResult) -> RegistrationResult:
    """``res``, with one warning when the fine-tune that gave its pose stopped at its cap (a
    capped fine-tune of a pose a later stage replaced says nothing)."""
    if res.finetune_capped:
        warnings.warn(capped_warning(config), RuntimeWarning, stacklevel=3)
    return res


def _fitted(request: Request) -> RegistrationResult:
    """The fit stage: a non-rigid one with ``prealign`` deforms from rigid pre-alignment(s)."""
    config = request.config
    if config.transform == 'nonrigid' and config.prealign:
        return deform(request)
    return fit(request)[0][1]


def _global(source, reference, config, init: str, cache, viewpoints) -> RegistrationResult:
    """``init='global'``: the global search (3-D rigid only)."""
    if init != 'global':
        raise PwanInputError(
            f"init must be a (d+1, d+1) transform, None or 'global', got {init!r}"
        )
    if config.transform != 'rigid':
        raise PwanInputError(
            "init='global' finds a rigid pose; register rigidly first, then pass its "
            'transform as init to the affine / non-rigid registration'
        )
    request = Request(source, reference, config, cache=cache)
    return register_global(request, _viewpoints(viewpoints))


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
