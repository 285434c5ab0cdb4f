"""The fine-tune stage of a registration (eq. fine_tune on full-resolution points): its point sets,
built once per registration and shared by all starts (:func:`finetune_data`), and one run of it
from a pose (:func:`finetune_stage`, normalised frame). The iterations themselves are
:func:`objective.run_finetune`; a final non-rigid run ends with the soft-correspondence stage
(:mod:`soft`)."""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from ..config import RegistrationConfig
from ..device import resolve_threads
from ..nearest import query_workers
from ..problem import Problem, finetune_set
from ..pwan.coherence import Coherence
from ..reference_cache import PreparedReference
from .objective import FineTuneData, Selection, Transform, run_finetune
from .soft import outlier_fraction, soft_stage

__all__ = ['StageOutcome', 'capped_warning', 'finetune_data', 'finetune_stage']


class StageOutcome(NamedTuple):
    """A fine-tune run: ``a`` (d, d), ``t`` (d,), ``v_fn`` the non-rigid offsets of source points
    (callable, None otherwise), normalised frame; ``iterations``; ``converged``; ``capped``: it
    stopped at its iteration cap before converging (:func:`capped_warning`)."""

    a: np.ndarray
    t: np.ndarray
    v_fn: Optional[Callable]
    iterations: int
    converged: bool
    capped: bool = False


def capped_warning(config: RegistrationConfig) -> str:
    """What a result whose fine-tune stopped at its cap warns."""
    return (
        f'the fine-tune stopped at finetune.max_iterations={config.finetune.max_iterations} '
        'before converging: the result may be short of the optimum (raise '
        'finetune.max_iterations)'
    )


def finetune_data(
    prob: Problem,
    config: RegistrationConfig,
    rng: np.random.Generator,
    prepared: Optional[PreparedReference] = None,
    device: Optional[torch.device] = None,
) -> FineTuneData:
    """The fine-tune's point sets: up to ``finetune.max_points`` source points (drawn from
    ``rng``), up to twice as many reference points with their search structure and normals from
    ``prepared`` (the reference's :class:`PreparedReference`, kept across registrations by a
    :class:`ReferenceCache`; built here when None). device: the search's device (None: k-d tree,
    see :func:`nearest.search_device`)."""
    norm = prob.norm
    ys_all = norm.source(prob.src_fit)
    idx = finetune_set(ys_all, config.finetune.max_points, rng)
    ys = ys_all[idx]
    if prepared is None:
        prepared = PreparedReference(prob.ref_fit)
    k = None
    if config.transform == 'rigid' and config.finetune.metric == 'point_to_plane':
        k = config.finetune.normal_neighbors
    xr, search, normals = prepared.finetune_reference(
        norm, max(config.finetune.max_points, 0) * 2, config.seed, k, device
    )
    return FineTuneData(ys, xr, search, normals, device)


def finetune_stage(
    prob: Problem,
    config: RegistrationConfig,
    data: FineTuneData,
    start: tuple,
    h_caller: Optional[float],
    final: bool = False,
    max_iterations: Optional[int] = None,
) -> StageOutcome:
    """Run eq. fine_tune over ``data`` from ``start`` = (a, t, v_fn) (v_fn: the non-rigid offsets
    of source points, or None), at most ``max_iterations`` (default ``finetune.max_iterations``).
    h_caller: the distance threshold (caller units; None for the mass type). A run stopped by its
    iteration cap says so (``capped``); the caller warns if it returns its pose.

    ``final`` (the last fine-tune of a registration): a rigid mass-type one continues with the
    distance-type fine-tune at h = 2 x the median spacing of the dense reference
    (``finetune.overlap_refine``), whose matched mass follows the actual overlap instead of the
    configured mass; a non-rigid one ends with the soft-correspondence stage."""
    kind = config.transform
    cap = config.finetune.max_iterations if max_iterations is None else max_iterations
    a, t, v_fn = start
    ys = data.ys
    count = 0
    if config.divergence == 'mass':
        count = int(round(min(1.0, prob.mass / prob.src_fit.shape[0]) * ys.shape[0]))
    h_n = (h_caller / prob.norm.scale) if h_caller is not None else 0.0
    coh = v0 = None
    if kind == 'nonrigid':
        gen = torch.Generator().manual_seed(config.seed + 17)
        coh = Coherence(torch.as_tensor(ys, dtype=torch.float64), config.coherence, gen)
        v0 = v_fn(ys) if v_fn is not None else np.zeros_like(ys)
    stop = (cap, config.finetune.tolerance)
    workers = resolve_threads(config.threads)
    out = run_finetune(
        data,
        kind,
        Transform(a, t, v0),
        Selection(config.divergence, count, h_n),
        stop,
        coh,
        workers,
    )
    capped = not out.converged and out.iterations >= cap
    if (
        final
        and kind == 'rigid'
        and config.divergence == 'mass'
        and config.finetune.overlap_refine
    ):
        out, capped = _overlap_refine(config, data, out, stop, capped)
    if kind != 'nonrigid':
        return StageOutcome(out.a, out.t, v_fn, out.iterations, out.converged, capped)
    interp = coh.interpolate
    if final and config.finetune.soft_iterations > 0:
        out, interp = _soft(prob, config, data, out, Selection(config.divergence, count, h_n))
    offsets = _offsets(ys, out.v, interp)
    return StageOutcome(out.a, out.t, offsets, out.iterations, out.converged, capped)


def _overlap_refine(config: RegistrationConfig, data: FineTuneData, out, stop, capped):
    """The distance-type fine-tune after a rigid mass-type one (``finetune.overlap_refine``), at
    h = 2 x the median spacing of the dense reference. Returns (outcome, capped)."""
    xr, tree = data.xr, data.tree
    probe = xr[
        np.random.default_rng(config.seed + 37).choice(
            xr.shape[0], size=min(2000, xr.shape[0]), replace=False
        )
    ]
    h_ov = 2.0 * float(np.median(tree.query(probe, k=2)[0][:, 1]))
    if not h_ov > 0:
        return out, capped
    first = out
    out = run_finetune(
        data,
        config.transform,
        Transform(out.a, out.t),
        Selection('distance', 0, h_ov),
        stop,
        workers=resolve_threads(config.threads),
    )
    capped = capped or (not out.converged and out.iterations >= stop[0])
    return dataclasses.replace(out, iterations=first.iterations + out.iterations), capped


def _offsets(ys: np.ndarray, v: np.ndarray, interp: Callable) -> Callable:
    """The offsets (p, d) of any source points p (normalised) from the field ``v`` solved on ys:
    exact on the points it was solved for, interpolated (``interp``) elsewhere."""
    v_ft = torch.as_tensor(v, dtype=torch.float64)

    def offsets(p):
        if p.shape == ys.shape and np.array_equal(p, ys):
            return v
        return interp(v_ft, torch.as_tensor(p, dtype=torch.float64)).numpy()

    return offsets


def _soft(prob: Problem, config: RegistrationConfig, data: FineTuneData, out, selection):
    """The soft-correspondence stage (:func:`soft.soft_stage`) of a final non-rigid fine-tune
    ``out``, from the stage's initial pose (the identity here). Returns (the outcome with its a,
    t, v, the interpolation of its offsets)."""
    ys, xr, h_n = data.ys, data.xr, selection.h
    if config.divergence == 'mass':
        w = outlier_fraction(prob.mass, prob.ref_fit.shape[0])
    else:  # the share of the reference within h of the moved source is what is matched
        z = ys @ out.a + out.t + out.v
        dist = cKDTree(z).query(
            xr, k=1, distance_upper_bound=h_n, workers=query_workers(xr.shape[0])
        )[0]
        near = np.isfinite(dist)
        w = outlier_fraction(float(near.sum()), xr.shape[0])
    start = Transform(out.a, out.t, out.v)
    soft = soft_stage(ys, xr, start, config, selection, w, resolve_threads(config.threads))
    o = soft.outcome
    out = dataclasses.replace(
        out, a=o.a, t=o.t, v=o.v, iterations=out.iterations + soft.iterations
    )
    return out, soft.interpolate
