"""Alg. 1 and the fine-tune of one registration, in the normalised frame: the sampled sets and
their masses, one start or the multi-start (:mod:`multistart`), and each finalist assembled as a
result (:mod:`finish`)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np
import torch
from scipy.spatial import cKDTree

from .alg1 import run_alg1
from .coherence import Coherence
from .config import NONRIGID_MATCHED_STEPS, RegistrationConfig
from .device import resolve_device, thread_scope
from .errors import PwanInputError
from .finetune import partial_objective, select_pairs
from .finetune_stage import finetune_data, finetune_stage
from .finish import Effort, finish, prepared_reference
from .multistart import Candidate, OverlapScorer, run_multistart, start_rotations
from .nearest import search_device
from .preprocess import median_spacing, random_subset, voxel_downsample
from .problem import prepare, threshold
from .reference import ReferenceCache

__all__ = ['SampleMasses', 'register_candidates', 'sample_masses', 'short_nonrigid_schedule']


def single_start(
    config: RegistrationConfig,
    device: torch.device,
    ys_np: np.ndarray,
    xs_np: np.ndarray,
    mass_n: Optional[float],
    h_n: Optional[float],
    rot0: Optional[np.ndarray],
    potential_state: Optional[dict],
    seed: int,
    should_stop: Optional[Callable[[], bool]] = None,
    h_floor: float = 0.0,
    ref_mass: Optional[float] = None,
) -> Tuple[Candidate, int, int]:
    """Alg. 1 (one start, :func:`alg1.run_alg1`) in the normalised frame from the rotation ``rot0``
    (column convention, about the origin); ``mass_n`` / ``ref_mass``: :class:`SampleMasses`.
    Returns (the start as a :class:`Candidate` of score 0, Alg. 1 steps, potential updates)."""
    kind = config.transform
    d = ys_np.shape[1]
    coh = None
    if kind == 'nonrigid':
        y = torch.as_tensor(ys_np, dtype=torch.float32, device=device)
        coh = Coherence(y, config.coherence, torch.Generator().manual_seed(seed))
    out = run_alg1(
        config,
        device,
        ys_np,
        xs_np,
        mass_n,
        h_n,
        [np.eye(d) if rot0 is None else rot0],
        config.steps,
        seed,
        should_stop,
        states=[potential_state],
        h_floor=h_floor,
        coherence=coh,
        ref_mass=ref_mass,
    )
    st = out.starts[0]
    v_fn = None
    if kind == 'nonrigid':
        v_adv = torch.as_tensor(st.v, dtype=torch.float64)
        coh_cpu = Coherence(
            torch.as_tensor(ys_np, dtype=torch.float64),
            config.coherence,
            torch.Generator().manual_seed(seed),
        )

        def _offsets(p, _v=v_adv, _c=coh_cpu):
            return _c.interpolate(_v, torch.as_tensor(p, dtype=torch.float64)).numpy()

        v_fn = _offsets
    return Candidate(0.0, st.a, st.t, v_fn, st.converged, st.h, st.state), out.steps, out.updates


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


def register_candidates(
    source,
    reference,
    config: RegistrationConfig,
    init,
    potential_state,
    should_stop,
    reference_cache: Optional[ReferenceCache] = None,
    warn: bool = True,
) -> list:
    """Alg. 1 + fine-tune (all starts / the tournament); returns the finalists as
    [(start score, RegistrationResult)], best first (one entry without multi-start). warn: a
    final fine-tune stopped by its iteration cap warns (off for a non-rigid registration's rigid
    pre-alignment, which the deformation continues from)."""
    t0 = time.perf_counter()
    default_steps = config.steps is None
    config = config.resolved()
    prob = prepare(source, reference, config, init)
    device = resolve_device(config.device)
    rng = np.random.default_rng(config.seed)
    norm = prob.norm
    # adversarial-stage point sets (caller units -> voxel -> cap -> normalised)
    src_ds = voxel_downsample(prob.src_fit, config.voxel_size)
    ref_ds = voxel_downsample(prob.ref_fit, config.voxel_size)
    n_src, n_ref = src_ds.shape[0], ref_ds.shape[0]
    src_ds = random_subset(src_ds, config.max_points, rng)
    ref_ds = random_subset(ref_ds, config.max_points, rng)
    if src_ds.shape[0] < 3 or ref_ds.shape[0] < 3:
        raise PwanInputError(
            'voxel_size leaves fewer than 3 points in a set; use a smaller voxel_size'
        )
    h_caller = threshold(config, ref_ds) if config.divergence == 'distance' else None
    ys_np = norm.source(src_ds)
    xs_np = norm.reference(ref_ds)
    r = ys_np.shape[0]
    kind = config.transform
    d = prob.dim
    timings = {'preprocess': time.perf_counter() - t0, 'adversarial': 0.0, 'finetune': 0.0}
    masses = sample_masses(prob.ratio_min, n_src, n_ref, r, xs_np.shape[0], kind)
    mass_n = masses.matched
    if default_steps and short_nonrigid_schedule(config, mass_n, r):
        config = dataclasses.replace(config, steps=NONRIGID_MATCHED_STEPS)
    h_n = h_caller / norm.scale if h_caller is not None else None
    # resolution floor of the learned h (normalised): below the reference sampling the potential is
    # flat
    h_floor = (
        config.potential.h_floor * median_spacing(xs_np) if config.divergence == 'mass' else 0.0
    )
    rots = (
        start_rotations(d, config.starts) if config.starts > 1 and kind != 'nonrigid' else [None]
    )
    multi = len(rots) > 1
    prep = prepared_reference(prob, reference_cache)
    ft_data = None
    if config.finetune.enabled or multi:
        ft_data = finetune_data(
            prob, config, kind, rng, prep, search_device(config.finetune.nn, device)
        )
    # the multi-start's fine-tunes before the final one run on a sample (their selection score's
    # size)
    small_data = ft_data.subset(config.start_finetune_points, config.seed) if multi else None
    scorer = (
        OverlapScorer(ft_data, config.seed) if multi and config.start_score == 'overlap' else None
    )
    count_n = int(round(min(1.0, mass_n / r) * r)) if config.divergence == 'mass' else 0
    tot = {'steps': 0, 'updates': 0, 'ft': 0}

    def score_of(a, t):
        if scorer is not None:
            return scorer(a, t)
        z = ys_np @ a + t
        dist, _ = cKDTree(xs_np).query(z, k=1)
        sel = select_pairs(dist, config.divergence, count_n, h_n if h_n else 0.0)
        return partial_objective(dist, sel, config.divergence, h_n if h_n else 0.0)

    def finetune(a, t, v_fn=None, small: bool = False):
        """Fine-tune (a, t[, v_fn]) (on start_finetune_points source points when ``small``, else
        the final one). Returns (a, t, v_fn, converged)."""
        tf = time.perf_counter()
        data = small_data if small else ft_data
        a, t, v_fn, ft_iters, ft_conv = finetune_stage(
            prob,
            config,
            kind,
            a,
            t,
            v_fn,
            h_caller,
            rng,
            data,
            final=not small,
            warn=warn and not small,
            max_iterations=config.start_finetune_iterations if small else None,
        )
        timings['finetune'] += time.perf_counter() - tf
        tot['ft'] += ft_iters
        return a, t, v_fn, ft_conv

    if multi:
        cands = sorted(
            run_multistart(
                config,
                device,
                ys_np,
                xs_np,
                mass_n,
                h_n,
                h_floor,
                rots,
                should_stop,
                potential_state,
                timings,
                tot,
                finetune,
                score_of,
                ref_mass=masses.reference,
            ),
            key=lambda c: c.score,
        )
        if config.finetune.enabled:
            # the finalists were compared after the fine-tune on start_finetune_points source
            # points (the score's own sample size); only the winner gets the dense fine-tune
            best = cands[0]
            a, t, v_fn, ft_conv = finetune(best.a, best.t)
            cands[0] = dataclasses.replace(
                best, a=a, t=t, v_fn=v_fn, converged=best.converged and ft_conv
            )
    else:
        ta = time.perf_counter()
        with thread_scope(config.threads):
            cand, steps, updates = single_start(
                config,
                device,
                ys_np,
                xs_np,
                mass_n,
                h_n,
                rots[0],
                potential_state,
                config.seed,
                should_stop,
                h_floor,
                masses.reference,
            )
        timings['adversarial'] += time.perf_counter() - ta
        tot['steps'] += steps
        tot['updates'] += updates
        ft_conv = True
        if config.finetune.enabled:
            a, t, v_fn, ft_conv = finetune(cand.a, cand.t, cand.v_fn)
            cand = dataclasses.replace(cand, a=a, t=t, v_fn=v_fn)
        cands = [dataclasses.replace(cand, converged=cand.converged and ft_conv)]
    out = []
    for rank, cand in enumerate(cands):
        # only the winner is judged (the runners-up are the non-rigid prealignment's finalists)
        cfg = config if rank == 0 else config.replace(self_check=False)
        effort = Effort(t0, dict(timings), tot['steps'], tot['updates'], tot['ft'])
        out.append(
            (
                cand.score,
                finish(
                    prob,
                    cfg,
                    cand,
                    effort,
                    h_caller,
                    str(device),
                    fit_tree=prep.fit_tree(),
                    polish=True,
                ),
            )
        )
    return out
