"""Soft-correspondence stage of a non-rigid registration: the EM steps of coherent point drift
(Myronenko & Song 2010), as a polish of the fine-tuned field and as CPD itself from the initial
pose.

The nearest-neighbour fine-tune (eq. fine_tune) matches each source point to one reference
point, so a field fitted to it keeps the sampling's bias (about half a point spacing). Here every
reference point x_i is explained by a Gaussian of variance s2 around each moved source point z_j
plus a uniform outlier term of weight w:

    p_ij = exp(-|x_i - z_j|^2 / 2 s2) / (sum_k exp(-|x_i - z_k|^2 / 2 s2) + c),
    c = (2 pi s2)^(d/2) w / (1 - w) n / m,

and the transform minimises sum_ij p_ij |x_i - T(y_j)|^2 / 2 s2 + lambda/2 Tr(V^T (sigma I +
G_rho)^-1 V), rho = 2 beta^2 (CPD's kernel, :class:`coherence.Coherence`). s2 starts at the
fine-tuned residuals (a local polish, not CPD's wide start) and is re-estimated each step, never
upwards: uniform outliers near the surface inflate the estimate, and a growing s2 let them pull
the field (bcpd bunny, 120 % outliers: MSE 0.14 after 50 steps, 0.0003 with s2 kept). w is
the reference's outlier fraction, known here: 1 - matched mass / reference points (mass type),
or the fraction of the reference farther than h from the moved source (distance type).
Gaussians beyond 6 sqrt(s2) are dropped (k-d tree, 16 nearest source points per reference
point). Normalised frame, row convention T(y) = y A + t + V.

:func:`cpd_from_start` is CPD as published from the registration's initial pose: s2 starts at
CPD's wide value (every pair, :func:`cpd_variance`) and anneals, the pose stays and only the
smooth field moves (a free affine part would shrink the shape onto the diffuse early targets), the
regulariser has no ridge (CPD's G^-1) and 64 Gaussians count per reference point while s2 is
wide. Its beta and lambda apply with the source scaled to unit variance per coordinate, and the
outliers are a uniform density over the reference's bounding box: CPD's own constant (n / m
above) assumes one unit of volume per reference point, which made the run depend on the units
(the bcpd bunny with 60 % outliers failed in the normalised frame and was solved at 1.7x its
scale). Where the nearest-neighbour field kept a wrong pairing (the 91-point fish) it reaches a
finer optimum than the polish; on cuts that leave a part of the source without a counterpart it
fails as CPD does (its outliers are on the reference side only). :func:`soft_stage` keeps the
run with the lower partial nearest-neighbour objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, NamedTuple, Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from ..config import CoherenceConfig, FineTuneConfig, RegistrationConfig
from ..nearest import query_workers
from ..preprocess import random_subset
from ..problem import finetune_set
from ..pwan.coherence import Coherence
from .objective import Selection, Transform, partial_objective, select_pairs, weighted_affine

__all__ = [
    'EM',
    'SoftOutcome',
    'soft_coherence',
    'soft_polish',
    'cpd_from_start',
    'cpd_variance',
    'outlier_fraction',
    'SoftChoice',
    'soft_stage',
]

#: source Gaussians per reference point in the E-step, and their cut-off in standard deviations
NEIGHBOURS = 16
CUTOFF = 6.0
#: Gaussians per reference point from CPD's wide start (16 drop pairs that matter while s2 is
#: wide: on the bcpd bunny with 20-60 % outliers 2 of 4 draws ended 6-360x worse)
WIDE_NEIGHBOURS = 64
#: source points of :func:`soft_stage`'s CPD from the start (random; the reference at twice
#: that): its field is smooth at the kernel's width, and its E-steps over every point of a large
#: set cost most of the stage (the whole bcpd bunny, 8171 + 12256 points: 4.7 s)
WIDE_POINTS = 2000
#: ridge sigma of :func:`cpd_from_start`'s regulariser (CPD's G^-1; with the polish's 0.1 the
#: field keeps modes that the diffuse early pairs fit: fish and bunny ended 100-1000x worse)
CPD_RIDGE = 1e-6


@dataclass
class SoftOutcome:
    """a (d, d), t (d,), v (n, d); s2: final variance (normalised units^2); iterations run;
    converged: the motion fell below the tolerance."""

    a: np.ndarray
    t: np.ndarray
    v: np.ndarray
    s2: float
    iterations: int
    converged: bool


def soft_coherence(
    ys: np.ndarray,
    coherence: CoherenceConfig,
    beta: float,
    lam: float,
    seed: int,
    ridge: Optional[float] = None,
):
    """The polish's regulariser on the source ys (n, d): CPD's Gaussian of width beta (rho = 2
    beta^2) and weight lambda / 2 against the data term's 1 / 2 s2 (the rank of ``coherence``,
    its ridge unless ``ridge`` is given)."""
    cfg = CoherenceConfig(
        rho=2.0 * beta**2,
        weight=lam / 2.0,
        sigma=coherence.sigma if ridge is None else ridge,
        rank=coherence.rank,
    )
    return Coherence(
        torch.as_tensor(ys, dtype=torch.float64), cfg, torch.Generator().manual_seed(seed)
    )


def cpd_variance(z: np.ndarray, ref: np.ndarray) -> float:
    """CPD's starting variance sum_ij |x_i - z_j|^2 / (d n m) of the moved source z (n, d) and
    the reference (m, d), in O(n + m)."""
    n, d = z.shape
    m = ref.shape[0]
    cross = float(ref.sum(0) @ z.sum(0))
    total = n * float((ref**2).sum()) + m * float((z**2).sum()) - 2.0 * cross
    return max(total, 0.0) / (d * n * m)


def outlier_fraction(matched: float, reference_points: int) -> float:
    """w of the E-step: the reference's share not matched, clipped to [0.01, 0.99]."""
    return float(np.clip(1.0 - matched / max(reference_points, 1), 0.01, 0.99))


class EM(NamedTuple):
    """How an EM run goes: at most ``iterations`` steps, stopping when the RMS motion is below
    ``tolerance``; ``s2``: the starting variance (None: the mean squared nearest-neighbour
    residual / d, a local polish); ``affine``: the M-step also refits a and t (else they stay);
    ``neighbours``: Gaussians per reference point; ``volume``: the outliers are uniform over this
    volume (None: CPD's constant, a volume of one per reference point)."""

    iterations: int
    tolerance: float
    s2: Optional[float] = None
    affine: bool = True
    neighbours: int = NEIGHBOURS
    volume: Optional[float] = None


def soft_polish(
    src: np.ndarray,
    ref: np.ndarray,
    start: Transform,
    coherence: Coherence,
    w: float,
    em: EM,
    workers: int = 1,
) -> SoftOutcome:
    """EM from T(y) = src a + t + v (``start``): src (n, d), ref (m, d), v (n, d) normalised; w:
    outlier fraction of ref; ``em``: its steps and start (:class:`EM`)."""
    n, d = src.shape
    m = ref.shape[0]
    volume = float(m) if em.volume is None else em.volume
    iterations, tolerance, s2, affine, neighbours = em[:5]
    a, t, v = (np.array(x, dtype=np.float64) for x in start)
    z = src @ a + t + v
    if s2 is None:
        near = cKDTree(ref).query(z, k=1, workers=query_workers(n, workers))[0]
        s2 = float((near**2).mean()) / d
    k = min(neighbours, n)
    converged, it = False, 0
    for it in range(1, iterations + 1):
        if not s2 > 1e-20:
            converged = True
            break
        dist, idx = cKDTree(z).query(
            ref,
            k=k,
            distance_upper_bound=CUTOFF * np.sqrt(s2),
            workers=query_workers(m * k, workers),
        )
        dist, idx = dist.reshape(m, k), idx.reshape(m, k)
        found = np.isfinite(dist)
        # s2 never grows, so the cut-off only shrinks: once the fullest row holds at most half
        # of its k Gaussians within it, the next E-step keeps twice that many (cheaper, same)
        k = min(k, max(2 * int(found.sum(1).max()), 1))
        logk = np.where(found, -(dist**2) / (2.0 * s2), -np.inf)
        logc = 0.5 * d * np.log(2.0 * np.pi * s2) + np.log(w / (1.0 - w) * n / volume)
        top = np.maximum(logk.max(1, keepdims=True), logc)
        e = np.exp(logk - top)
        p = e / (e.sum(1, keepdims=True) + np.exp(logc - top))  # (m, k)
        rows, pf, ref_rows = idx[found], p[found], np.nonzero(found)[0]
        p1 = np.bincount(rows, weights=pf, minlength=n)
        mass = float(p1.sum())
        if mass < d + 1:
            break
        px = np.stack(
            [np.bincount(rows, weights=pf * ref[ref_rows, c], minlength=n) for c in range(d)],
            1,
        )
        target = np.where(p1[:, None] > 0, px / np.maximum(p1, 1e-300)[:, None], z)
        if affine:
            a, t = weighted_affine(src, target - v, p1)
        resid = target - (src @ a + t)
        v = coherence.solve_weighted(
            torch.as_tensor(p1 / (2.0 * s2)), torch.as_tensor(resid)
        ).numpy()
        z_new = src @ a + t + v
        # s2 at the new transform: sum_ij p_ij |x_i - z_j|^2 / (d sum p)
        pt1 = p.sum(1)
        s2_new = float(
            (pt1 * (ref**2).sum(1)).sum()
            - 2.0 * (px * z_new).sum()
            + (p1 * (z_new**2).sum(1)).sum()
        ) / (d * mass)
        s2 = min(s2, s2_new)
        motion = float(np.sqrt(((z_new - z) ** 2).sum(1).mean()))
        z = z_new
        if motion < tolerance:
            converged = True
            break
    return SoftOutcome(a=a, t=t, v=v, s2=max(s2, 0.0), iterations=it, converged=converged)


def cpd_from_start(
    src: np.ndarray,
    ref: np.ndarray,
    finetune: FineTuneConfig,
    coherence: CoherenceConfig,
    w: float,
    seed: int,
    workers: int = 1,
):
    """Coherent point drift of src (n, d) onto ref (m, d) from their pose as given (normalised
    frame): ``finetune.soft_beta`` and ``soft_lambda`` apply with the source scaled to unit
    variance per coordinate, the outliers (share w of ref) uniform over the reference's bounding
    box; at most ``finetune.soft_iterations`` steps, to ``finetune.tolerance``. Returns
    (:class:`SoftOutcome`, the interpolation (v (n, d), points (p, d)) -> offsets (p, d) of its
    field)."""
    beta, lam = finetune.soft_beta, finetune.soft_lambda
    n, d = src.shape
    k = np.sqrt(d) / max(float(np.sqrt(((src - src.mean(0)) ** 2).sum(1).mean())), 1e-12)
    src_k, ref_k = src * k, ref * k
    ext = ref_k.max(0) - ref_k.min(0)
    volume = float(np.prod(np.maximum(ext, 1e-3 * ext.max())))
    coh = soft_coherence(src_k, coherence, beta, lam, seed, ridge=CPD_RIDGE)
    em = EM(
        finetune.soft_iterations,
        finetune.tolerance * k,
        s2=cpd_variance(src_k, ref_k),
        affine=False,
        neighbours=WIDE_NEIGHBOURS,
        volume=volume,
    )
    out = soft_polish(
        src_k, ref_k, Transform(np.eye(d), np.zeros(d), np.zeros((n, d))), coh, w, em, workers
    )
    out = SoftOutcome(out.a, out.t / k, out.v / k, out.s2 / k**2, out.iterations, out.converged)

    def interpolate(v: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        return coh.extend(v * k, points * k) / k

    return out, interpolate


@dataclass
class SoftChoice:
    """outcome: the kept :class:`SoftOutcome`; interpolate: (v (n, d), points (p, d)) -> its
    offsets at the points (torch, float64); origin: 'polish' or 'cpd'; iterations: EM steps of
    both runs; objectives: the partial nearest-neighbour objective of each run."""

    outcome: SoftOutcome
    interpolate: Callable
    origin: str
    iterations: int
    objectives: Dict[str, float]


def soft_stage(
    src: np.ndarray,
    ref: np.ndarray,
    start: Transform,
    config: RegistrationConfig,
    selection: Selection,
    w: float,
    workers: int = 1,
) -> SoftChoice:
    """The soft-correspondence stage of a non-rigid registration (normalised frame, the identity
    its initial pose): the polish of the fine-tuned field ``start`` (a, t, v) and, with
    ``finetune.soft_from_start``, :func:`cpd_from_start` (on at most :data:`WIDE_POINTS` source
    points, its field extended to the others); the one with the lower partial nearest-neighbour
    objective (eq. fine_tune over the pairs of ``selection``) is kept. src (n, d), ref (m, d); w:
    the reference's outlier fraction; config: its ``finetune``, ``coherence`` and ``seed``."""
    finetune, seed = config.finetune, config.seed
    coh = soft_coherence(
        src, config.coherence, finetune.soft_beta, finetune.soft_lambda, seed + 19
    )
    em = EM(finetune.soft_iterations, finetune.tolerance)
    runs = {'polish': (soft_polish(src, ref, start, coh, w, em, workers), coh.interpolate)}
    if finetune.soft_from_start:
        runs['cpd'] = _cpd_on_sample(src, ref, config, w, workers)
    tree = cKDTree(ref)
    objectives = {}
    divergence, count, h = selection
    for name, (o, _) in runs.items():
        dist = tree.query(src @ o.a + o.t + o.v, k=1, workers=query_workers(len(src), workers))[0]
        sel = select_pairs(dist, divergence, count, h)
        objectives[name] = partial_objective(dist, sel, divergence, h)
    origin = min(objectives, key=objectives.get)  # the polish on a tie (listed first)
    outcome, interpolate = runs[origin]
    return SoftChoice(
        outcome,
        interpolate,
        origin,
        sum(o.iterations for o, _ in runs.values()),
        objectives,
    )


def _cpd_on_sample(src, ref, config: RegistrationConfig, w, workers):
    """:func:`cpd_from_start` on at most :data:`WIDE_POINTS` source and twice as many reference
    points, its field extended to every source point: (outcome on all of src, interpolation)."""
    seed = config.seed + 23
    rng = np.random.default_rng(seed)
    sub = finetune_set(src, WIDE_POINTS, rng)
    ref_s = random_subset(ref, 2 * WIDE_POINTS, rng)
    out, interp = cpd_from_start(
        src[sub], ref_s, config.finetune, config.coherence, w, seed, workers
    )
    if sub.size == src.shape[0]:
        return out, interp
    v_sub = torch.as_tensor(out.v, dtype=torch.float64)

    def extended(v: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        return interp(v_sub, points)  # the field is the sample's, whatever v it is given

    v_all = extended(v_sub, torch.as_tensor(src, dtype=torch.float64)).numpy()
    return SoftOutcome(out.a, out.t, v_all, out.s2, out.iterations, out.converged), extended
