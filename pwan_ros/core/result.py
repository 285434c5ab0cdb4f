"""Result types: :class:`RegistrationResult` (of :func:`register` / :func:`refine`, caller units),
:class:`Candidate` (one fit in the normalised frame, before it is assembled into a result) and
:class:`Effort` (what a registration spent)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import numpy as np


@dataclass(frozen=True)
class RegistrationResult:
    """Outcome of a registration, in the caller's units and frames.

    transform: (d+1, d+1) homogeneous map of source points into the reference frame, x = T[:d, :d]
    @ y + T[:d, d] (rigid/affine; for non-rigid its affine part). transformed_source: (n, d) the
    valid source points mapped into the reference frame (incl. non-rigid offsets), in input order;
    n = source_valid.sum(). match_weights: (n,) in [0, 1]: 1 where the point is matched by the
    final partial objective (top-m / <= h nearest neighbours), 0 where it is omitted. source_valid:
    (N,) bool, input rows kept (False = dropped NaN/inf row). matched_ratio: mean of match_weights.
    converged: the adversarial stage stopped on its motion criterion (refine: it does not run) and
    the fine-tune converged; False after ``steps`` 0 or a stop request. iterations: transform
    updates of the adversarial stage. potential_updates: potential network updates.
    finetune_iterations (incl. the EM steps of the non-rigid soft polish). time_s: wall time of the
    call; timings: per stage seconds. num_source / num_reference: valid input points;
    num_dropped_*: NaN/inf rows removed. mass: matched mass in points (mass type, else None);
    distance_threshold: h in caller units (distance type or the fine-tune threshold, else None); h:
    final potential clip level (caller units, None for refine). displacement: (n, d) non-rigid
    offsets in caller units (None otherwise). potential_state: network weights for a warm start
    (pass back as ``potential_state=``). device: torch device used. status: 'ok' | 'refused'
    (``transform`` is then a best guess, not to be trusted) and the reason: the self-check of every
    result (:mod:`checks.verify`, ``config.self_check``) and, with init='global', the global
    search's own tests (no overlap found, two different poses explain the data almost equally).
    check: the self-check's measurements (:class:`checks.verify.PoseCheck`, None when off).
    init='global' only: overlap: fraction of the source within h of the reference; confidence:
    margin over the best distinct runner-up in [0, 1]; candidates: [{origin, support, objective}]
    scored. finetune_capped: the fine-tune that produced this pose stopped at
    ``finetune.max_iterations`` before converging (:func:`api.register` / :func:`api.refine`
    warn then; a capped fine-tune of a pose they do not return does not warn)."""

    transform: np.ndarray
    transformed_source: np.ndarray
    match_weights: np.ndarray
    source_valid: np.ndarray
    matched_ratio: float
    converged: bool
    iterations: int
    potential_updates: int
    finetune_iterations: int
    time_s: float
    timings: Dict[str, float]
    num_source: int
    num_reference: int
    num_dropped_source: int
    num_dropped_reference: int
    mass: Optional[float]
    distance_threshold: Optional[float]
    h: Optional[float] = None
    displacement: Optional[np.ndarray] = None
    potential_state: Optional[dict] = field(default=None, repr=False)
    device: str = 'cpu'
    start_index: int = 0
    status: str = 'ok'
    reason: str = ''
    overlap: Optional[float] = None
    confidence: Optional[float] = None
    candidates: list = field(default_factory=list, repr=False)
    check: Optional[object] = field(default=None, repr=False)
    finetune_capped: bool = False


@dataclass(frozen=True)
class Candidate:
    """A fit of Alg. 1 + fine-tune in the normalised frame: ``a`` (d, d) row convention, ``t``
    (d,), ``v_fn`` the non-rigid offsets of source points (callable, None otherwise);
    ``converged``: Alg. 1 and the fine-tune converged; ``h``: the potential's clip level
    (normalised units; None for :func:`api.refine`); ``state``: the potential's weights;
    ``index``: the start it came from; ``score``: its start score (lower is better)."""

    score: float
    a: np.ndarray
    t: np.ndarray
    v_fn: Optional[Callable]
    converged: bool
    h: Optional[float]
    state: Optional[dict]
    index: int = 0


@dataclass(frozen=True)
class Effort:
    """What a registration spent: ``t0`` (time.perf_counter seconds at its start), ``timings``
    (seconds per stage), Alg. 1 steps, potential updates and fine-tune iterations, and whether
    the last fine-tune stopped at its iteration cap."""

    t0: float
    timings: Dict[str, float]
    iterations: int = 0
    updates: int = 0
    finetune_iterations: int = 0
    finetune_capped: bool = False
