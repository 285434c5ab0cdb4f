"""The fit of one registration (normalised frame): Alg. 1 from one start or the multi-start
tournament (:mod:`multistart`), the fine-tune of each finalist (:mod:`finetune.stage`), each
finalist assembled as a result (:mod:`assemble`). :class:`run.FitRun` holds what a fit works
with while it runs."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..config import NONRIGID_MATCHED_STEPS, NONRIGID_MATCHED_UPDATES, RegistrationConfig
from ..device import resolve_device, thread_scope
from ..errors import PwanInputError
from ..nearest import search_device
from ..preprocess import median_spacing, random_subset, voxel_downsample
from ..problem import Problem, Request, SampledProblem, prepare, threshold
from ..pwan.alg1 import Schedule, Starts, run_alg1
from ..pwan.coherence import Coherence
from ..finetune.stage import finetune_data
from ..result import Candidate, Effort
from .assemble import assemble, prepared_reference
from .multistart import run_multistart
from .run import FitRun
from .scoring import OverlapScorer
from .starts import start_rotations

__all__ = [
    'SampleMasses',
    'fit',
    'sample_masses',
    'short_nonrigid_schedule',
]


def fit(request: Request) -> list:
    """Alg. 1 + fine-tune of ``request`` (all starts / the tournament); returns the finalists as
    [(start score, RegistrationResult)], best first (one entry without multi-start); the first
    says whether its dense fine-tune stopped at its cap (``finetune_capped``)."""
    t0 = time.perf_counter()
    run, rots = _start(request)
    if len(rots) > 1:
        cands = _multistart(run, rots, request)
    else:
        cands = [_single(run, rots[0], request)]
    out = []
    for rank, cand in enumerate(cands):
        # only the winner is judged (the runners-up are the non-rigid prealignment's finalists)
        cfg = run.config if rank == 0 else run.config.replace(self_check=False)
        effort = Effort(
            t0,
            dict(run.timings),
            run.steps,
            run.updates,
            run.finetune_iterations,
            finetune_capped=run.capped and rank == 0,
        )
        device = str(run.sampled.device)
        res = assemble(
            run.prob, cfg, cand, effort, run.h_caller, device, run.prep.fit_tree(), 'polish'
        )
        out.append((cand.score, res))
    return out


def _start(request: Request) -> tuple:
    """The :class:`FitRun` of ``request`` and its start rotations ([None]: one start)."""
    t0 = time.perf_counter()
    config = request.config
    default_steps, default_updates = config.steps is None, config.potential_updates is None
    config = config.resolved()
    prob = prepare(request.source, request.reference, config, request.init)
    device = resolve_device(config.device)
    rng = np.random.default_rng(config.seed)
    sampled, h_caller, counts = _sampled(prob, config, device, rng)
    timings = {'preprocess': time.perf_counter() - t0, 'adversarial': 0.0, 'finetune': 0.0}
    r = sampled.ys.shape[0]
    masses = sample_masses(prob.ratio_min, *counts, r, sampled.xs.shape[0], config.transform)
    if default_steps and short_nonrigid_schedule(config, masses.matched, r):
        config = dataclasses.replace(config, steps=NONRIGID_MATCHED_STEPS)
        if default_updates:
            config = dataclasses.replace(config, potential_updates=NONRIGID_MATCHED_UPDATES)
    # resolution floor of the learned h (normalised): below the reference sampling the potential
    # is flat
    h_floor = (
        config.potential.h_floor * median_spacing(sampled.xs)
        if config.divergence == 'mass'
        else 0.0
    )
    sampled = dataclasses.replace(
        sampled, mass=masses.matched, ref_mass=masses.reference, h_floor=h_floor
    )
    multi = config.starts > 1 and config.transform != 'nonrigid'
    rots = start_rotations(prob.dim, config.starts) if multi else [None]
    prep = prepared_reference(prob, request.cache)
    data = small = scorer = None
    if config.finetune.enabled or multi:
        search = search_device(config.finetune.nn, device)
        data = finetune_data(prob, config, rng, prep, search)
    if multi:
        # the multi-start's fine-tunes before the final one run on a sample (their selection
        # score's size)
        small = data.subset(config.start_finetune_points, config.seed)
        scorer = OverlapScorer(data, config.seed) if config.start_score == 'overlap' else None
    run = FitRun(prob, config, sampled, h_caller, data, small, scorer, prep, timings=timings)
    return run, rots


def _sampled(prob: Problem, config: RegistrationConfig, device, rng) -> tuple:
    """Alg. 1's sets (caller units -> voxel -> cap -> normalised) as a :class:`SampledProblem`
    (masses still to come), the distance threshold in caller units (None for the mass type) and
    the sets' sizes before the cap."""
    norm = prob.norm
    src_ds = voxel_downsample(prob.src_fit, config.voxel_size)
    ref_ds = voxel_downsample(prob.ref_fit, config.voxel_size)
    counts = src_ds.shape[0], ref_ds.shape[0]
    src_ds = random_subset(src_ds, config.max_points, rng)
    ref_ds = random_subset(ref_ds, config.max_points, rng)
    if src_ds.shape[0] < 3 or ref_ds.shape[0] < 3:
        raise PwanInputError(
            'voxel_size leaves fewer than 3 points in a set; use a smaller voxel_size'
        )
    h_caller = threshold(config, ref_ds) if config.divergence == 'distance' else None
    h_n = h_caller / norm.scale if h_caller is not None else None
    ys, xs = norm.source(src_ds), norm.reference(ref_ds)
    return SampledProblem(ys, xs, None, float(xs.shape[0]), h_n, 0.0, device), h_caller, counts


def _single(run: FitRun, rot0: Optional[np.ndarray], request: Request) -> Candidate:
    """One start from the rotation ``rot0`` (None: identity), fine-tuned."""
    ta = time.perf_counter()
    with thread_scope(run.config.threads):
        cand = single_start(run, rot0, request.potential_state, request.should_stop)
    run.timings['adversarial'] += time.perf_counter() - ta
    ft_conv = True
    if run.config.finetune.enabled:
        a, t, v_fn, ft_conv = run.finetune(cand.a, cand.t, cand.v_fn)
        cand = dataclasses.replace(cand, a=a, t=t, v_fn=v_fn)
    return dataclasses.replace(cand, converged=cand.converged and ft_conv)


def _multistart(run: FitRun, rots: list, request: Request) -> list:
    """The multi-start's finalists, best first; the winner with the dense fine-tune."""
    cands = sorted(
        run_multistart(run, rots, request.should_stop, request.potential_state),
        key=lambda c: c.score,
    )
    if run.config.finetune.enabled:
        # the finalists were compared after the fine-tune on start_finetune_points source
        # points (the score's own sample size); only the winner gets the dense fine-tune
        best = cands[0]
        a, t, v_fn, ft_conv = run.finetune(best.a, best.t)
        cands[0] = dataclasses.replace(
            best, a=a, t=t, v_fn=v_fn, converged=best.converged and ft_conv
        )
    return cands


def single_start(
    run: FitRun, rot0: Optional[np.ndarray], potential_state=None, should_stop=None
) -> Candidate:
    """Alg. 1 (one start, :func:`pwan.alg1.run_alg1`) in the normalised frame from the rotation
    ``rot0`` (column convention, about the origin; None: identity). Returns the start as a
    :class:`Candidate` of score 0 (its steps and updates counted in ``run``)."""
    config, sampled = run.config, run.sampled
    ys = sampled.ys
    coh = None
    if config.transform == 'nonrigid':
        y = torch.as_tensor(ys, dtype=torch.float32, device=sampled.device)
        coh = Coherence(y, config.coherence, torch.Generator().manual_seed(config.seed))
    starts = Starts([np.eye(ys.shape[1]) if rot0 is None else rot0], states=[potential_state])
    out = run_alg1(config, sampled, starts, Schedule(config.steps, config.seed), should_stop, coh)
    run.steps += out.steps
    run.updates += out.updates
    st = out.starts[0]
    v_fn = None
    if config.transform == 'nonrigid':
        v_fn = _adversarial_offsets(st.v, ys, config)
    return Candidate(0.0, st.a, st.t, v_fn, st.converged, st.h, st.state)


def _adversarial_offsets(v: np.ndarray, ys: np.ndarray, config: RegistrationConfig):
    """The offsets of any source points (normalised) from Alg. 1's field ``v`` on ys (float64,
    on the host)."""
    v_adv = torch.as_tensor(v, dtype=torch.float64)
    coh_cpu = Coherence(
        torch.as_tensor(ys, dtype=torch.float64),
        config.coherence,
        torch.Generator().manual_seed(config.seed),
    )

    def offsets(p):
        return coh_cpu.interpolate(v_adv, torch.as_tensor(p, dtype=torch.float64)).numpy()

    return offsets


@dataclass(frozen=True)
class SampleMasses:
    """Masses of the adversarial stage's sampled sets, in units of one sampled source point:
    ``matched`` (mass type; None for the distance type) and ``reference`` (the reference's
    total; see :func:`sample_masses`)."""

    matched: Optional[float]
    reference: float


def sample_masses(
    ratio_min: Optional[float], n_src: int, n_ref: int, r: int, q: int, transform: str
) -> SampleMasses:
    """The masses of the sampled sets. n_src, n_ref: points before the random cap
    (``max_points``, after the voxel grid); r, q: after it; ratio_min: the matched mass over the
    smaller set (:class:`Problem`).

    Non-rigid: the cap draws each set at its own rate and estimates the same problem, so each set
    keeps its mass and the matched mass its fraction of each set (a sampled source point weighs
    n_src / r points). Capping only a reference of 2000 points and 1200 outliers to 2000 points
    would otherwise match that sample as a whole, outliers included, and the deformation
    follows them (docs/core.md). Rigid / affine: the samples weigh as sets of equal points,
    (ratio_min min(r, q), q), what their stages were validated with: weighted by the sets' sizes,
    voxelised street scans with as many uniform outliers (a reference 8-12x the source) were
    solved on 10 of 20 seed runs instead of 18 of 20. Without a cap both give the same."""
    if transform != 'nonrigid':
        return SampleMasses(None if ratio_min is None else ratio_min * min(r, q), float(q))
    unit = r / n_src
    matched = None if ratio_min is None else ratio_min * min(n_src, n_ref) * unit
    return SampleMasses(matched, n_ref * unit)


def short_nonrigid_schedule(config: RegistrationConfig, mass_n: Optional[float], r: int) -> bool:
    """Whether a non-rigid run takes :data:`NONRIGID_MATCHED_STEPS`: the mass covers all r sampled
    source points, and the fine-tune's soft stage also runs CPD from the start (a second route
    to the deformation; the adversarial field alone keeps the full schedule)."""
    ft = config.finetune
    return (
        config.transform == 'nonrigid'
        and mass_n is not None
        and mass_n >= r * (1 - 1e-9)
        and ft.enabled
        and ft.soft_iterations > 0
        and ft.soft_from_start
    )
