"""The fit from a given pose: the fine-tune alone, no network (:func:`api.refine`, the global
search's refinements, and the refit of :func:`decide.mass_at_overlap`)."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch

from ..device import resolve_device
from ..nearest import search_device
from ..preprocess import make_normaliser
from ..problem import Request, prepare, threshold
from ..finetune.stage import finetune_data, finetune_stage
from ..result import Candidate, Effort, RegistrationResult
from .assemble import assemble, prepared_reference

__all__ = ['fit_from_pose']


def fit_from_pose(
    request: Request, take_rival: bool, iterations: Optional[int] = None
) -> RegistrationResult:
    """The fine-tune of ``request`` from its ``init`` at the configured mass (identity when
    None: the input frames are trusted, never re-centred); ``take_rival``: a rigid 3-D result
    takes a clearly better pose its self-check finds next to it (and is judged there).
    iterations: the fine-tune's cap (None: ``finetune.max_iterations``; 0: the result at
    ``init`` as it is, measured only)."""
    t0 = time.perf_counter()
    config = request.config
    prob = prepare(request.source, request.reference, config, request.init)
    # refine never re-centres: keep init semantics (identity init = trust the input frames)
    prob.norm = make_normaliser(prob.src_fit, prob.ref_fit, align_centroids=False)
    rng = np.random.default_rng(config.seed)
    h_caller = threshold(config, prob.ref_fit) if config.divergence == 'distance' else None
    t1 = time.perf_counter()
    d = prob.dim
    dev = resolve_device(config.device) if config.finetune.nn == 'torch' else torch.device('cpu')
    prep = prepared_reference(prob, request.cache)
    data = finetune_data(prob, config, rng, prep, search_device(config.finetune.nn, dev))
    start = (np.eye(d), np.zeros(d), None)
    out = finetune_stage(prob, config, data, start, h_caller, max_iterations=iterations)
    timings = {'preprocess': t1 - t0, 'finetune': time.perf_counter() - t1}
    return assemble(
        prob,
        config,
        Candidate(0.0, out.a, out.t, out.v_fn, out.converged, None, None),
        Effort(
            t0,
            timings,
            finetune_iterations=out.iterations,
            finetune_capped=out.capped and iterations != 0,
        ),
        h_caller,
        str(dev),
        prep.fit_tree(),
        'rival' if take_rival else '',
    )
