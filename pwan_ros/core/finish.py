"""A registration's result assembled from a candidate (normalised frame): the caller-frame
transform and points, the plane-aware polish of a rigid 3-D result, the match weights and the
self-check (:mod:`verify`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
from scipy.spatial import cKDTree

from .config import RegistrationConfig
from .finetune import select_pairs
from .multistart import Candidate
from .nearest import query_workers
from .polish import gicp_polish
from .preprocess import homogeneous, median_spacing, random_subset
from .problem import Problem
from .reference import PreparedReference, ReferenceCache
from .result import RegistrationResult
from .verify import check_pose

__all__ = ['Effort', 'finish', 'prepared_reference']


@dataclass(frozen=True)
class Effort:
    """What a registration spent: ``t0`` (time.perf_counter seconds at its start), ``timings``
    (seconds per stage), Alg. 1 steps, potential updates and fine-tune iterations."""

    t0: float
    timings: Dict[str, float]
    iterations: int = 0
    updates: int = 0
    finetune_iterations: int = 0


def finish(
    prob: Problem,
    config: RegistrationConfig,
    cand: Candidate,
    effort: Effort,
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
        exact = kind != 'nonrigid'  # a deformed shape's fit is rough (check_pose)
        verdict = check_pose(z, prob.ref_fit, seed=config.seed, exact_fit=exact)
        if (polish or take_rival) and verdict.rival_better and kind == 'rigid':
            # a clearly better pose next to the result (GICP from a start around it): take it, and
            # judge it in turn
            rt, d = verdict.rival_transform, prob.dim
            total = rt @ total
            z = z @ rt[:d, :d].T + rt[:d, d]
            weights = match_weights(z)
            verdict = check_pose(z, prob.ref_fit, verdict.voxel, seed=config.seed, exact_fit=exact)
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


def prepared_reference(prob: Problem, cache: Optional[ReferenceCache]) -> PreparedReference:
    """The reference's prepared search structures: kept by ``cache``, else built for this call."""
    return cache.lookup(prob.ref_fit) if cache is not None else PreparedReference(prob.ref_fit)
