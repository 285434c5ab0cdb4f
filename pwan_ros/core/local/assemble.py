"""A registration's result assembled from a candidate (normalised frame): the caller-frame
transform and points, the plane-aware polish of a rigid 3-D result (:mod:`finetune.gicp`), the
match weights and the self-check (:mod:`checks.verify`), which may retake a better rival next to
the result (:mod:`checks.rival`)."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
from scipy.spatial import cKDTree

from ..checks.affine import judge_affine
from ..checks.rival import retake_better_rival
from ..checks.verify import check_pose
from ..config import RegistrationConfig
from ..nearest import query_workers
from ..preprocess import homogeneous, median_spacing, random_subset
from ..problem import Problem
from ..reference_cache import PreparedReference, ReferenceCache
from ..finetune.gicp import gicp_polish
from ..finetune.objective import select_pairs
from ..result import Candidate, Effort, RegistrationResult

__all__ = ['AFTER', 'assemble', 'prepared_reference']

#: what a rigid 3-D result goes through after its fit: '' nothing; 'rival': it takes a clearly
#: better pose its self-check finds next to it; 'polish': the GICP polish first, then that
AFTER = ('', 'rival', 'polish')


def assemble(
    prob: Problem,
    config: RegistrationConfig,
    cand: Candidate,
    effort: Effort,
    h_caller: Optional[float],
    device: str,
    fit_tree: Optional[cKDTree] = None,
    after: str = '',
) -> RegistrationResult:
    """The result of ``cand`` (normalised frame) in caller units: transform, transformed
    points, match weights, the self-check (:mod:`checks.verify`, ``config.self_check``).
    h_caller: the distance threshold (caller units; None for the mass divergence); fit_tree: a
    k-d tree of the reference's estimation points (built when None); after: :data:`AFTER`."""
    norm, timings = prob.norm, effort.timings
    a, t = cand.a, cand.t
    m_lin, b = norm.to_caller(a, t)
    total = homogeneous(m_lin, b) @ prob.init
    ys = norm.source(prob.src_init)
    zn = ys @ a + t
    disp = None
    if cand.v_fn is not None:
        vn = cand.v_fn(ys)
        zn = zn + vn
        disp = vn * norm.scale
    z = norm.denormalise_reference(zn)
    tree = cKDTree(prob.ref_fit) if fit_tree is None else fit_tree
    if after == 'polish' and config.transform == 'rigid' and prob.dim == 3:
        if config.finetune.polish:
            polished = _polished(prob, config, homogeneous(m_lin, b), h_caller, tree, timings)
            if polished is not None:
                total = polished @ prob.init
                z = prob.src_init @ polished[:3, :3].T + polished[:3, 3]

    verdict = None
    if config.self_check and config.transform != 'nonrigid':  # a deformation: decide.judge
        tc = time.perf_counter()
        total, z, verdict = _self_check(prob, config, total, z, after)
        timings['check'] = time.perf_counter() - tc
    weights = _match_weights(prob, config, tree, z, h_caller)
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
        finetune_capped=bool(effort.finetune_capped),
        time_s=time.perf_counter() - effort.t0,
        timings=timings,
        num_source=int(z.shape[0]),
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


def _self_check(prob: Problem, config, total, z, after: str) -> tuple:
    """(transform, moved source, :class:`checks.verify.PoseCheck`) of a result's self-check; a
    rigid result (``after``: 'rival' or 'polish') takes a clearly better pose the check finds next
    to it (GICP from a start around it), judged in turn; an affine one is judged against the
    rigid pose inside it (:mod:`checks.affine`). (A deformation is judged by decide.judge.)"""
    verdict = check_pose(z, prob.ref_fit, seed=config.seed)
    if config.transform == 'affine':  # against the rigid pose inside it (checks.affine)
        judged, verdict = judge_affine(prob.src.points, total, prob.ref_fit, verdict, config.seed)
        if judged is not total:
            d = prob.dim
            total, z = judged, prob.src.points @ judged[:d, :d].T + judged[:d, d]
    if not after or config.transform != 'rigid':
        return total, z, verdict
    d = prob.dim

    def judge(moved):
        return check_pose(moved, prob.ref_fit, verdict.voxel, config.seed)

    retaken = retake_better_rival(verdict, lambda rt: z @ rt[:d, :d].T + rt[:d, d], judge)
    if retaken is None:
        return total, z, verdict
    return (verdict.rival_transform @ total, *retaken)


def _polished(prob: Problem, config, pose, h_caller, tree, timings) -> Optional[np.ndarray]:
    """The GICP polish of a rigid 3-D result's ``pose`` (4, 4, of the source after the init):
    the polished pose, or None when it is not kept."""
    tp = time.perf_counter()
    spacing = median_spacing(
        random_subset(prob.ref_fit, 20000, np.random.default_rng(config.seed))
    )
    gate = 2.0 * (h_caller if h_caller else 2.0 * spacing)
    pr = gicp_polish(
        prob.src_init, prob.ref_fit, pose, gate, reference_tree=tree, seed=config.seed
    )
    timings['polish'] = time.perf_counter() - tp
    return pr.transform if pr.kept else None


def _match_weights(prob: Problem, config, tree, points: np.ndarray, h_caller) -> np.ndarray:
    """(n,) 1 where a moved source point is matched by the final partial objective (the
    ``mass`` nearest, or those within h), else 0."""
    n_s = points.shape[0]
    dist, _ = tree.query(points, k=1, workers=query_workers(n_s))
    if config.divergence == 'mass':
        count = int(round(min(1.0, prob.mass / n_s) * n_s))
        return select_pairs(dist, 'mass', count, 0.0).astype(np.float64)
    return select_pairs(dist, 'distance', 0, h_caller).astype(np.float64)


def prepared_reference(prob: Problem, cache: Optional[ReferenceCache]) -> PreparedReference:
    """The reference's prepared search structures: kept by ``cache``, else built for this call."""
    return cache.lookup(prob.ref_fit) if cache is not None else PreparedReference(prob.ref_fit)
