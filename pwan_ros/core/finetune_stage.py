"""The fine-tune stage of a registration (eq. fine_tune on full-resolution points): its point sets,
built once per registration and shared by all starts, and one run of it from a pose (normalised
frame). The iterations themselves are :func:`finetune.run_finetune`."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from .coherence import Coherence
from .config import RegistrationConfig
from .device import resolve_threads
from .finetune import run_finetune
from .nearest import make_search, query_workers
from .problem import Problem, finetune_set
from .reference import PreparedReference
from .soft_finetune import outlier_fraction, soft_stage

__all__ = ['SAMPLE_REF_FACTOR', 'FineTuneData', 'finetune_data', 'finetune_stage']

#: reference points per source point in the multi-start's selection fine-tunes
SAMPLE_REF_FACTOR = 4


@dataclass
class FineTuneData:
    """Point sets of the fine-tune stage (normalised): source ys, reference xr, its search
    structure (a cKDTree, or the query interface of one: :class:`reference.ScaledSearch`,
    :class:`nearest.TorchNearest`) and normals (rigid point-to-plane). Built once per registration
    and shared by all starts; device: where the search of a :meth:`subset` runs (None: k-d
    tree)."""

    ys: np.ndarray
    xr: np.ndarray
    tree: object
    normals: Optional[np.ndarray]
    device: Optional[torch.device] = None

    def subset(self, cap: int, seed: int) -> 'FineTuneData':
        """At most ``cap`` source and ``SAMPLE_REF_FACTOR x cap`` reference points (0: all), with
        their normals: the data of the multi-start's selection fine-tunes. They only rank the
        candidates (the winner gets the dense fine-tune), and a sparser reference makes the search
        of every source point outside the overlap several times cheaper."""
        rng = np.random.default_rng(seed + 31)
        ys, xr, tree, normals = self.ys, self.xr, self.tree, self.normals
        if cap and ys.shape[0] > cap:
            ys = ys[np.sort(rng.choice(ys.shape[0], size=cap, replace=False))]
        if cap and xr.shape[0] > SAMPLE_REF_FACTOR * cap:
            idx = np.sort(rng.choice(xr.shape[0], size=SAMPLE_REF_FACTOR * cap, replace=False))
            xr = xr[idx]
            tree = make_search(xr, self.device)
            normals = None if normals is None else normals[idx]
        return FineTuneData(ys, xr, tree, normals, self.device)


def finetune_data(
    prob: Problem,
    config: RegistrationConfig,
    kind: str,
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
    if kind == 'rigid' and config.finetune.metric == 'point_to_plane':
        k = config.finetune.normal_neighbors
    xr, search, normals = prepared.finetune_reference(
        norm, max(config.finetune.max_points, 0) * 2, config.seed, k, device
    )
    return FineTuneData(ys, xr, search, normals, device)


def finetune_stage(
    prob: Problem,
    config: RegistrationConfig,
    kind: str,
    a,
    t,
    v_fn,
    h_caller: Optional[float],
    rng: np.random.Generator,
    data: Optional[FineTuneData] = None,
    final: bool = False,
    warn: bool = False,
    max_iterations: Optional[int] = None,
):
    """Run eq. fine_tune on (capped) full-resolution points, at most ``max_iterations`` (default
    ``finetune.max_iterations``). Returns (a, t, v_fn, iters, converged).

    ``final`` (the last fine-tune of a rigid mass-type registration, ``finetune.overlap_refine``):
    then the distance-type fine-tune at h = 2 x the median spacing of the dense reference, whose
    matched mass follows the actual overlap instead of the configured mass."""
    norm = prob.norm
    cap = config.finetune.max_iterations if max_iterations is None else max_iterations
    if data is None:
        data = finetune_data(prob, config, kind, rng)
    ys, xr, tree, normals = data.ys, data.xr, data.tree, data.normals
    count = 0
    if config.divergence == 'mass':
        count = int(round(min(1.0, prob.mass / prob.src_fit.shape[0]) * ys.shape[0]))
    h_n = (h_caller / norm.scale) if h_caller is not None else 0.0
    coh = None
    v0 = None
    if kind == 'nonrigid':
        gen = torch.Generator().manual_seed(config.seed + 17)
        coh = Coherence(torch.as_tensor(ys, dtype=torch.float64), config.coherence, gen)
        v0 = v_fn(ys) if v_fn is not None else np.zeros_like(ys)
    out = run_finetune(
        ys,
        tree,
        xr,
        kind,
        a,
        t,
        config.divergence,
        count,
        h_n,
        cap,
        config.finetune.tolerance,
        v=v0,
        coherence=coh,
        workers=resolve_threads(config.threads),
        ref_normals=normals,
    )
    capped = not out.converged and out.iterations >= cap
    if (
        final
        and kind == 'rigid'
        and config.divergence == 'mass'
        and config.finetune.overlap_refine
    ):
        probe = xr[
            np.random.default_rng(config.seed + 37).choice(
                xr.shape[0], size=min(2000, xr.shape[0]), replace=False
            )
        ]
        h_ov = 2.0 * float(np.median(tree.query(probe, k=2)[0][:, 1]))
        if h_ov > 0:
            first = out
            out = run_finetune(
                ys,
                tree,
                xr,
                kind,
                out.a,
                out.t,
                'distance',
                0,
                h_ov,
                cap,
                config.finetune.tolerance,
                workers=resolve_threads(config.threads),
                ref_normals=normals,
            )
            capped = capped or (not out.converged and out.iterations >= cap)
            out = dataclasses.replace(out, iterations=first.iterations + out.iterations)
    if warn and capped:
        warnings.warn(
            f'the fine-tune stopped at finetune.max_iterations={config.finetune.max_iterations} '
            'before converging: the result may be short of the optimum (raise '
            'finetune.max_iterations)',
            RuntimeWarning,
            stacklevel=3,
        )
    new_v_fn = v_fn
    if kind == 'nonrigid':
        interp = coh.interpolate
        if final and config.finetune.soft_iterations > 0:
            out, interp = _soft(prob, config, ys, xr, out, h_n, count)
        v_ft = torch.as_tensor(out.v, dtype=torch.float64)
        solved_on = ys  # offsets are exact on the points they were solved for

        def _offsets(p):
            if p.shape == solved_on.shape and np.array_equal(p, solved_on):
                return out.v
            return interp(v_ft, torch.as_tensor(p, dtype=torch.float64)).numpy()

        new_v_fn = _offsets
    return out.a, out.t, new_v_fn, out.iterations, out.converged


def _soft(prob: Problem, config: RegistrationConfig, ys, xr, out, h_n: float, count: int):
    """The soft-correspondence stage (:func:`soft_finetune.soft_stage`) of a final non-rigid
    fine-tune ``out``, from the stage's initial pose (the identity here). Returns (the outcome
    with its a, t, v, the interpolation of its offsets)."""
    if config.divergence == 'mass':
        w = outlier_fraction(prob.mass, prob.ref_fit.shape[0])
    else:  # the share of the reference within h of the moved source is what is matched
        z = ys @ out.a + out.t + out.v
        dist = cKDTree(z).query(
            xr, k=1, distance_upper_bound=h_n, workers=query_workers(xr.shape[0])
        )[0]
        near = np.isfinite(dist)
        w = outlier_fraction(float(near.sum()), xr.shape[0])
    soft = soft_stage(
        ys,
        xr,
        out.a,
        out.t,
        out.v,
        config.finetune,
        config.coherence,
        config.divergence,
        w,
        count,
        h_n,
        config.seed,
        workers=resolve_threads(config.threads),
    )
    o = soft.outcome
    out = dataclasses.replace(
        out, a=o.a, t=o.t, v=o.v, iterations=out.iterations + soft.iterations
    )
    return out, soft.interpolate
