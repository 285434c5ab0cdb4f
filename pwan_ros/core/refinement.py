"""The fine-tune alone from a given pose (:func:`api.refine` at the configured mass, and the refit
of :func:`judging.mass_at_overlap`)."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch

from .config import RegistrationConfig
from .device import resolve_device
from .finetune_stage import finetune_data, finetune_stage
from .finish import Effort, finish, prepared_reference
from .multistart import Candidate
from .nearest import search_device
from .preprocess import make_normaliser
from .problem import prepare, threshold
from .reference import ReferenceCache
from .result import RegistrationResult

__all__ = ['refine_at_mass']


def refine_at_mass(
    source,
    reference,
    init,
    config: RegistrationConfig,
    reference_cache: Optional[ReferenceCache],
    take_rival: bool,
) -> RegistrationResult:
    """:func:`api.refine` at the configured mass; ``take_rival``: a rigid 3-D result takes a
    clearly better pose its self-check finds next to it (and is judged there)."""
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
    prep = prepared_reference(prob, reference_cache)
    data = finetune_data(prob, config, kind, rng, prep, search_device(config.finetune.nn, dev))
    a, t, v_fn, iters, conv = finetune_stage(
        prob, config, kind, np.eye(d), np.zeros(d), None, h_caller, rng, data, warn=True
    )
    timings = {'preprocess': t1 - t0, 'finetune': time.perf_counter() - t1}
    return finish(
        prob,
        config,
        Candidate(0.0, a, t, v_fn, conv, None, None),
        Effort(t0, timings, finetune_iterations=iters),
        h_caller,
        str(dev),
        fit_tree=prep.fit_tree(),
        take_rival=take_rival,
    )
