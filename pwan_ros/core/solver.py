"""PWAN registration (Alg. 1 + fine-tune) and the cheap fine-tune-only refinement.

Frames/units: inputs and outputs are in the caller's units (metres for ROS). Internally both sets
are centred and divided by a common scale (see :func:`preprocess.make_normaliser`); every
threshold is converted on the way in and reported in caller units.
"""
from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from .coherence import Coherence
from .config import RegistrationConfig
from .device import resolve_device, thread_scope
from .discrepancy import PotentialTrainer
from .ensemble import run_ensemble
from .errors import PwanInputError
from .finetune import estimate_normals, run_finetune, select_pairs
from .preprocess import (CleanPoints, Normaliser, check_init, check_rank, clean_points, far_outliers, homogeneous,
                         make_normaliser, median_spacing, random_subset, voxel_downsample)
from .result import RegistrationResult
from .transforms import make_transform


#: points (starts x mini-batch) of one lock-step group of the tournament's short stage
_ENSEMBLE_POINTS = 1 << 16
#: reference points per source point in the multi-start's selection fine-tunes
_SAMPLE_REF_FACTOR = 4


@dataclass
class _Problem:
    """Validated inputs shared by register/refine (caller units unless noted)."""

    src: CleanPoints
    ref: CleanPoints
    src_init: np.ndarray        # valid source points after the init transform
    init: np.ndarray            # (d+1, d+1)
    norm: Normaliser
    dim: int
    ratio_min: Optional[float]  # mass / min(N_s, N_r) (mass type)
    mass: Optional[float]

    @property
    def src_fit(self) -> np.ndarray:
        """Source points used in the estimation (far outliers left out), after the init transform."""
        return self.src_init if self.src.core is None else self.src_init[self.src.core]

    @property
    def ref_fit(self) -> np.ndarray:
        """Reference points used in the estimation (far outliers left out)."""
        return self.ref.fit


def _prepare(source, reference, config: RegistrationConfig, init) -> _Problem:
    src = clean_points(source, 'source')
    ref = clean_points(reference, 'reference')
    dim = src.points.shape[1]
    if ref.points.shape[1] != dim:
        raise PwanInputError(f'source is {dim}-D but reference is {ref.points.shape[1]}-D')
    init_m = check_init(init, dim)
    check_rank(src.fit, config.transform, 'source')
    check_rank(ref.fit, config.transform, 'reference')
    n_min = min(src.fit.shape[0], ref.fit.shape[0])
    ratio = mass = None
    if config.divergence == 'mass':
        if config.mass is not None:
            if config.mass > n_min:
                raise PwanInputError(f'mass {config.mass:g} exceeds the smaller set ({n_min} valid points)')
            mass = float(config.mass)
            ratio = mass / n_min
        else:
            ratio = config.effective_mass_ratio
            mass = ratio * n_min
    init_h = np.eye(dim + 1) if init_m is None else init_m
    src_init = src.points @ init_h[:dim, :dim].T + init_h[:dim, dim]
    prob = _Problem(src, ref, src_init, init_h, None, dim, ratio, mass)
    prob.norm = make_normaliser(prob.src_fit, prob.ref_fit, align_centroids=init_m is None)
    return prob


def _finetune_set(points: np.ndarray, cap: int, rng: np.random.Generator):
    """Indices of the points used in the fine-tune (all, or a random ``cap`` subset)."""
    n = points.shape[0]
    if cap and n > cap:
        return np.sort(rng.choice(n, size=cap, replace=False))
    return np.arange(n)


def _threshold(config: RegistrationConfig, ref_points: np.ndarray) -> float:
    """Distance threshold h in caller units: given, or 2x the median NN spacing of ``ref_points``."""
    if config.distance_threshold is not None:
        return float(config.distance_threshold)
    h = 2.0 * median_spacing(ref_points)
    if not h > 0:
        raise PwanInputError('cannot derive a distance threshold (duplicate reference points); set distance_threshold')
    return h


def _finish(prob: _Problem, config: RegistrationConfig, kind: str, a: np.ndarray, t: np.ndarray,
            v_fn, h_caller: Optional[float], t0: float, timings: Dict[str, float], iterations: int,
            updates: int, ft_iters: int, converged: bool, h_pot: Optional[float], state, device: str,
            start_index: int = 0) -> RegistrationResult:
    """Assemble the result: caller-frame transform, transformed points, match weights."""
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
    tree = cKDTree(prob.ref_fit)
    dist, _ = tree.query(z, k=1, workers=-1)
    n_s = z.shape[0]
    if config.divergence == 'mass':
        frac = min(1.0, prob.mass / n_s)
        sel = select_pairs(dist, 'mass', int(round(frac * n_s)), 0.0)
    else:
        sel = select_pairs(dist, 'distance', 0, h_caller)
    weights = sel.astype(np.float64)
    return RegistrationResult(
        transform=total, transformed_source=z, match_weights=weights, source_valid=prob.src.valid,
        matched_ratio=float(weights.mean()), converged=bool(converged), iterations=int(iterations),
        potential_updates=int(updates), finetune_iterations=int(ft_iters), time_s=time.perf_counter() - t0,
        timings=timings, num_source=int(n_s), num_reference=int(prob.ref.points.shape[0]),
        num_dropped_source=prob.src.dropped, num_dropped_reference=prob.ref.dropped,
        mass=prob.mass, distance_threshold=h_caller, h=h_pot, displacement=disp, potential_state=state,
        device=device, start_index=start_index)


@dataclass
class _FineTuneData:
    """Point sets of the fine-tune stage (normalised): source ys, reference xr, its tree and
    normals (rigid point-to-plane). Built once per registration and shared by all starts."""

    ys: np.ndarray
    xr: np.ndarray
    tree: cKDTree
    normals: Optional[np.ndarray]


    def subset(self, cap: int, seed: int) -> '_FineTuneData':
        """At most ``cap`` source and ``_SAMPLE_REF_FACTOR x cap`` reference points (0: all), with
        their normals: the data of the multi-start's selection fine-tunes. They only rank the
        candidates (the winner gets the dense fine-tune), and a sparser reference makes the search
        of every source point outside the overlap several times cheaper."""
        rng = np.random.default_rng(seed + 31)
        ys, xr, tree, normals = self.ys, self.xr, self.tree, self.normals
        if cap and ys.shape[0] > cap:
            ys = ys[np.sort(rng.choice(ys.shape[0], size=cap, replace=False))]
        if cap and xr.shape[0] > _SAMPLE_REF_FACTOR * cap:
            idx = np.sort(rng.choice(xr.shape[0], size=_SAMPLE_REF_FACTOR * cap, replace=False))
            xr = xr[idx]
            tree = cKDTree(xr)
            normals = None if normals is None else normals[idx]
        return _FineTuneData(ys, xr, tree, normals)


class _OverlapScorer:
    """Selection criterion of the multi-start: the distance-type partial objective of the
    nearest-neighbour plan (eq. our_primal with the NN plan, sum_j min(d_j - h, 0)) at the
    resolution-derived threshold h = 2 x the median nearest-neighbour spacing of the dense
    fine-tune reference, on up to 2000 dense source points, as mean(min(d_j, h)) / h in [0, 1]
    (lower = more of the source lies on the reference). Unlike the fixed-mass NN objective it does
    not charge a candidate for the points outside the overlap, and uniform outliers are too sparse
    at this scale to be matched by chance."""

    def __init__(self, data: '_FineTuneData', seed: int, cap: int = 2000):
        rng = np.random.default_rng(seed + 29)
        n = data.ys.shape[0]
        self.ys = data.ys[rng.choice(n, size=min(cap, n), replace=False)]
        self.tree = data.tree
        m = data.xr.shape[0]
        probe = data.xr[rng.choice(m, size=min(cap, m), replace=False)]
        self.h = 2.0 * max(float(np.median(data.tree.query(probe, k=2)[0][:, 1])), 1e-12)

    def __call__(self, a: np.ndarray, t: np.ndarray) -> float:
        # searched within h only: farther points count h either way, and their search is slow
        dist, _ = self.tree.query(self.ys @ a + t, k=1, distance_upper_bound=self.h)
        return float(np.minimum(dist, self.h).mean() / self.h)


def overlap_score(points: np.ndarray, reference: np.ndarray, seed: int = 0) -> float:
    """:class:`_OverlapScorer` on caller-frame points as they are: points (n, d), reference (m, d);
    0 = every point lies on the reference, 1 = none does."""
    d = points.shape[1]
    scorer = _OverlapScorer(_FineTuneData(points, reference, cKDTree(reference), None), seed)
    return scorer(np.eye(d), np.zeros(d))


def _finetune_data(prob: _Problem, config: RegistrationConfig, kind: str, rng: np.random.Generator) -> _FineTuneData:
    norm = prob.norm
    ys_all = norm.source(prob.src_fit)
    idx = _finetune_set(ys_all, config.finetune.max_points, rng)
    ys = ys_all[idx]
    ref_idx = _finetune_set(prob.ref_fit, max(config.finetune.max_points, 0) * 2, rng)
    xr = norm.reference(prob.ref_fit[ref_idx])
    tree = cKDTree(xr)
    normals = None
    if kind == 'rigid' and config.finetune.metric == 'point_to_plane':
        normals = estimate_normals(xr, tree, k=config.finetune.normal_neighbors, workers=-1)
    return _FineTuneData(ys, xr, tree, normals)


def _do_finetune(prob: _Problem, config: RegistrationConfig, kind: str, a, t, v_fn, h_caller: Optional[float],
                 rng: np.random.Generator, data: Optional[_FineTuneData] = None, final: bool = False,
                 warn: bool = False):
    """Run eq. fine_tune on (capped) full-resolution points. Returns (a, t, v_fn, iters, converged).

    ``final`` (the last fine-tune of a rigid mass-type registration, ``finetune.overlap_refine``):
    then the distance-type fine-tune at h = 2 x the median spacing of the dense reference, whose
    matched mass follows the actual overlap instead of the configured mass."""
    norm = prob.norm
    if data is None:
        data = _finetune_data(prob, config, kind, rng)
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
    out = run_finetune(ys, tree, xr, kind, a, t, config.divergence, count, h_n, config.finetune.max_iterations,
                       config.finetune.tolerance, v=v0, coherence=coh, workers=-1, ref_normals=normals)
    capped = not out.converged and out.iterations >= config.finetune.max_iterations
    if final and kind == 'rigid' and config.divergence == 'mass' and config.finetune.overlap_refine:
        probe = xr[np.random.default_rng(config.seed + 37).choice(xr.shape[0], size=min(2000, xr.shape[0]),
                                                                 replace=False)]
        h_ov = 2.0 * float(np.median(tree.query(probe, k=2)[0][:, 1]))
        if h_ov > 0:
            first = out
            out = run_finetune(ys, tree, xr, kind, out.a, out.t, 'distance', 0, h_ov,
                               config.finetune.max_iterations, config.finetune.tolerance, workers=-1,
                               ref_normals=normals)
            capped = capped or (not out.converged and out.iterations >= config.finetune.max_iterations)
            out = dataclasses.replace(out, iterations=first.iterations + out.iterations)
    if warn and capped:
        warnings.warn(f'the fine-tune stopped at finetune.max_iterations={config.finetune.max_iterations} before '
                      'converging: the result may be short of the optimum (raise finetune.max_iterations)',
                      RuntimeWarning, stacklevel=3)
    new_v_fn = v_fn
    if kind == 'nonrigid':
        v_ft = torch.as_tensor(out.v, dtype=torch.float64)
        solved_on = ys  # offsets are exact on the points they were solved for

        def _offsets(p):
            if p.shape == solved_on.shape and np.array_equal(p, solved_on):
                return out.v
            return coh.interpolate(v_ft, torch.as_tensor(p, dtype=torch.float64)).numpy()
        new_v_fn = _offsets
    return out.a, out.t, new_v_fn, out.iterations, out.converged


def refine(source, reference, init=None, config: Optional[RegistrationConfig] = None) -> RegistrationResult:
    """Cheap partial refinement: the fine-tune objective (eq. fine_tune) alone, warm-started.

    source (N, d), reference (M, d) in caller units; init: (d+1, d+1) source -> reference
    (identity when None). Uses config.transform, divergence, mass / mass_ratio /
    distance_threshold and config.finetune. No network, no torch device: NN search + closed-form
    steps only.
    """
    config = config or RegistrationConfig()
    t0 = time.perf_counter()
    prob = _prepare(source, reference, config, init if init is not None else None)
    # refine never re-centres: keep init semantics (identity init = trust the input frames)
    prob.norm = make_normaliser(prob.src_fit, prob.ref_fit, align_centroids=False)
    rng = np.random.default_rng(config.seed)
    h_caller = _threshold(config, prob.ref_fit) if config.divergence == 'distance' else None
    t1 = time.perf_counter()
    d = prob.dim
    kind = config.transform
    a, t, v_fn, iters, conv = _do_finetune(prob, config, kind, np.eye(d), np.zeros(d), None, h_caller, rng,
                                           warn=True)
    timings = {'preprocess': t1 - t0, 'finetune': time.perf_counter() - t1}
    return _finish(prob, config, kind, a, t, v_fn, h_caller, t0, timings, 0, 0, iters, conv, None, None, 'cpu')


def _start_rotations(dim: int, count: int) -> list:
    """``count`` initial rotations (d, d), identity first: 2-D evenly spaced angles; 3-D the
    rotation group of the cube ordered by angle (90, 120, 180 deg), then random (seeded)."""
    if dim == 2:
        out = []
        for i in range(count):
            a = 2 * np.pi * i / count
            out.append(np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]))
        return out
    mats = []
    import itertools
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1, -1), repeat=3):
            m = np.zeros((3, 3))
            for i, j in enumerate(perm):
                m[i, j] = signs[i]
            if np.linalg.det(m) > 0:
                mats.append(m)
    mats.sort(key=lambda m: (round(float(np.arccos(np.clip((np.trace(m) - 1) / 2, -1, 1))), 6),
                             tuple(m.ravel())))
    rng = np.random.default_rng(12345)
    while len(mats) < count:
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        w, x, y, z = q
        mats.append(np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                              [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                              [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]]))
    return mats[:count]


def _partial_objective(dist: np.ndarray, sel: np.ndarray, divergence: str, h: float) -> float:
    """Primal PW objective of a nearest-neighbour matching: sum of selected distances (mass type,
    fixed count) or sum over selected of (d - h) (distance type); lower is better."""
    if divergence == 'mass':
        return float(dist[sel].sum())
    return float((dist[sel] - h).sum())


def _adversarial(config: RegistrationConfig, device: torch.device, ys_np: np.ndarray, xs_np: np.ndarray,
                 mass_n: Optional[float], h_n: Optional[float], rot0: Optional[np.ndarray],
                 potential_state: Optional[dict], seed: int, scale: float,
                 should_stop: Optional[Callable[[], bool]] = None, h_floor: float = 0.0):
    """Alg. 1 in the normalised frame from the rotation ``rot0`` (column convention, about the
    origin). Returns (a, t, v_fn, steps, updates, converged, h_final_normalised, state)."""
    kind = config.transform
    d = ys_np.shape[1]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float32
    y = torch.as_tensor(ys_np, dtype=dtype, device=device)
    x = torch.as_tensor(xs_np, dtype=dtype, device=device)
    r, q = y.shape[0], x.shape[0]
    trainer = PotentialTrainer(d, config.divergence, config.potential, device, float(q), float(r),
                               mass=mass_n, h=h_n, state=potential_state, h_floor=h_floor)
    transform = make_transform(kind, d, r).to(device)
    if rot0 is not None:
        transform.set_linear(torch.as_tensor(rot0.T, dtype=dtype, device=device))
    coh = Coherence(y, config.coherence, gen) if kind == 'nonrigid' else None
    t_params = list(transform.parameters())
    opt_t = torch.optim.Adam(t_params, lr=config.lr_transform)
    bs = config.batch_size
    n_gp = min(config.potential.gp_points, q + r) if not bs else min(config.potential.gp_points, 2 * bs)
    eval_idx = torch.randperm(r, generator=gen)[:min(r, 512)].to(device)

    def batches():
        xb = x[torch.randint(q, (bs,), generator=gen).to(device)] if bs and bs < q else x
        yi = torch.randint(r, (bs,), generator=gen).to(device) if bs and bs < r else None
        return xb, yi

    def gp_index(nb):
        return torch.randperm(nb, generator=gen)[:min(n_gp, nb)].to(device)

    # warm-up of the potential before the first transform update
    with torch.no_grad():
        z_all = transform(y)
    for k in range(config.warmup_updates):
        xb, yi = batches()
        yb = z_all if yi is None else z_all[yi]
        trainer.update(xb, yb, with_gp=(k % config.potential_updates == 0),
                       gp_idx=gp_index(xb.shape[0] + yb.shape[0]))
    history: deque = deque(maxlen=config.window + 1)
    # convergence tolerance: a fraction of the source sampling resolution (normalised units)
    tol = config.tolerance * max(median_spacing(ys_np), 1e-9)
    converged = config.steps == 0
    steps_done = 0
    decay = (config.lr_transform_final / config.lr_transform) ** (1.0 / max(config.steps - 1, 1))
    last_print = time.perf_counter()
    hv = trainer.net.h.detach()
    for step in range(config.steps):
        if should_stop is not None and should_stop():
            converged = False
            break
        for g in opt_t.param_groups:
            g['lr'] = config.lr_transform * decay ** step
        xb, yi = batches()
        ysrc = y if yi is None else y[yi]
        with torch.no_grad():
            yb = transform(ysrc, yi)
        for k in range(config.potential_updates):
            trainer.update(xb, yb, with_gp=(k == 0), gp_idx=gp_index(xb.shape[0] + yb.shape[0]))
        # transform update: descend -(m_beta/r) sum f(T y) + C(theta), divided by m_beta = r
        zb = transform(ysrc, yi)
        hv = trainer.h_value(xb, yb).detach() if trainer.closed_form else trainer.net.h.detach()
        loss = -trainer.net.potential(zb, hv, clip=True).mean()
        if coh is not None:
            loss = loss + coh.value(transform.v) / r
        grads = torch.autograd.grad(loss, t_params, allow_unused=True)
        for p, g in zip(t_params, grads):
            p.grad = torch.zeros_like(p) if g is None else g
        if coh is not None:
            # natural-gradient step in the metric (sigma I + G): smooth, coherent offsets
            transform.v.grad = coh.apply_kernel(transform.v.grad) * r
        opt_t.step()
        steps_done = step + 1
        with torch.no_grad():
            history.append(transform(y[eval_idx], eval_idx))
        if len(history) == history.maxlen:
            motion = float((history[-1] - history[0]).pow(2).sum(1).mean().sqrt())
            if motion < tol and steps_done >= config.min_steps:
                converged = True
                break
        if config.verbose and time.perf_counter() - last_print > 2.0:
            last_print = time.perf_counter()
            print(f'[pwan] step {steps_done}/{config.steps} h={float(hv) * scale:.4g}', file=sys.stderr)
    a_t, t_t = transform.affine_part()
    a = a_t.double().cpu().numpy()
    t = t_t.double().cpu().numpy()
    v_fn = None
    if kind == 'nonrigid':
        v_adv = transform.v.detach().double().cpu()
        coh_cpu = Coherence(y.double().cpu(), config.coherence, torch.Generator().manual_seed(seed))

        def _offsets(p, _v=v_adv, _c=coh_cpu):
            return _c.interpolate(_v, torch.as_tensor(p, dtype=torch.float64)).numpy()
        v_fn = _offsets
    with torch.no_grad():
        h_final = float(trainer.h_value(x, transform(y)) if trainer.closed_form else trainer.net.h)
    return a, t, v_fn, steps_done, trainer.updates, converged, h_final, trainer.net.state()


def register(source, reference, config: Optional[RegistrationConfig] = None, init=None,
             potential_state: Optional[dict] = None,
             should_stop: Optional[Callable[[], bool]] = None) -> RegistrationResult:
    """Register ``source`` (N, d) onto ``reference`` (M, d), d in {2, 3}, with PWAN (Alg. 1).

    Caller units in, caller units out. init: optional (d+1, d+1) warm-start transform source ->
    reference. potential_state: optional network weights from a previous result
    (``result.potential_state``) to warm-start the potential. config.starts > 1 (rigid/affine)
    runs Alg. 1 + fine-tune from several initial rotations and keeps the one with the lowest
    ``config.start_score`` (default: the distance-type partial NN objective at 2x the dense
    reference spacing, see :class:`_OverlapScorer`); with ``config.start_steps > 0`` as a
    coarse-to-fine tournament (short runs from every start, the best ``start_keep`` continue); all
    starts run in lock-step as one batched ensemble (:mod:`ensemble`). Non-rigid with ``prealign``:
    rigid registration(s) first; with several starts the ``prealign_keep`` best rigid finalists are
    each deformed and the best non-rigid result by the overlap score is returned. should_stop: optional callable
    polled once per transform update (and between starts); when it returns True the adversarial
    stage ends early (``converged`` is then False) — for time budgets and shutdown. Deterministic
    for a fixed seed on a given device and thread count (without should_stop). Raises
    :class:`PwanInputError` on bad input.
    """
    config = config or RegistrationConfig()
    t0 = time.perf_counter()
    if config.transform != 'nonrigid' or not config.prealign:
        return _register_candidates(source, reference, config, init, potential_state, should_stop)[0][1]
    # coarse-to-fine: rigid PWAN registration(s) (with config.starts) initialise the non-rigid one
    # (large rotations are out of reach of a deformation started at identity); fields left None
    # take the rigid defaults there. With several starts the ``prealign_keep`` best rigid finalists are
    # deformed and compared after the non-rigid stage: a rigid fit of a deformed shape can rank
    # a wrong, symmetric pose first.
    cands = _register_candidates(source, reference, config.replace(transform='rigid', prealign=False), init,
                                 None, should_stop)
    ref_clean = np.asarray(reference, dtype=np.float64)
    ref_clean = ref_clean[np.isfinite(ref_clean).all(axis=1)]   # validated by the rigid stage
    ref_clean = ref_clean[~far_outliers(ref_clean)]
    # distinct poses only: finalists that converged to the same pose (within the reference sampling)
    # would be deformed twice
    tol = median_spacing(random_subset(ref_clean, 5000, np.random.default_rng(config.seed)))
    pres = [cands[i] for i in distinct_poses([c[1].transformed_source for c in cands], tol, config.prealign_keep)]
    best = None
    for _, pre in pres:
        if best is not None and should_stop is not None and should_stop():
            break
        res = _register_candidates(source, reference, config.replace(prealign=False), pre.transform,
                                   potential_state, should_stop)[0][1]
        score = overlap_score(res.transformed_source, ref_clean, config.seed) if len(pres) > 1 else 0.0
        res = dataclasses.replace(res, timings={**res.timings, 'prealign': pre.time_s},
                                  iterations=res.iterations + pre.iterations,
                                  potential_updates=res.potential_updates + pre.potential_updates,
                                  start_index=pre.start_index)
        if best is None or score < best[0]:
            best = (score, res)
    return dataclasses.replace(best[1], time_s=time.perf_counter() - t0)


def distinct_poses(placements: list, tol: float, keep: int) -> list:
    """Indices of up to ``keep`` placements (each (n, d), the same points moved by a candidate
    pose, best first) whose RMS distance to every earlier kept one exceeds ``tol`` (caller units)."""
    kept: list = []
    for i, z in enumerate(placements):
        if len(kept) == keep:
            break
        if all(np.sqrt(np.mean(np.sum((z - placements[j]) ** 2, 1))) > tol for j in kept):
            kept.append(i)
    return kept


def _register_candidates(source, reference, config: RegistrationConfig, init, potential_state, should_stop) -> list:
    """Alg. 1 + fine-tune (all starts / the tournament); returns the finalists as
    [(start score, RegistrationResult)], best first (one entry without multi-start)."""
    t0 = time.perf_counter()
    config = config.resolved()
    prob = _prepare(source, reference, config, init)
    device = resolve_device(config.device)
    rng = np.random.default_rng(config.seed)
    norm = prob.norm
    # adversarial-stage point sets (caller units -> voxel -> cap -> normalised)
    src_ds = voxel_downsample(prob.src_fit, config.voxel_size)
    ref_ds = voxel_downsample(prob.ref_fit, config.voxel_size)
    src_ds = random_subset(src_ds, config.max_points, rng)
    ref_ds = random_subset(ref_ds, config.max_points, rng)
    if src_ds.shape[0] < 3 or ref_ds.shape[0] < 3:
        raise PwanInputError('voxel_size leaves fewer than 3 points in a set; use a smaller voxel_size')
    h_caller = _threshold(config, ref_ds) if config.divergence == 'distance' else None
    ys_np = norm.source(src_ds)
    xs_np = norm.reference(ref_ds)
    r, q = ys_np.shape[0], xs_np.shape[0]
    kind = config.transform
    d = prob.dim
    timings = {'preprocess': time.perf_counter() - t0, 'adversarial': 0.0, 'finetune': 0.0}
    mass_n = prob.ratio_min * min(q, r) if config.divergence == 'mass' else None
    h_n = h_caller / norm.scale if h_caller is not None else None
    # resolution floor of the learned h (normalised): below the reference sampling the potential is flat
    h_floor = config.potential.h_floor * median_spacing(xs_np) if config.divergence == 'mass' else 0.0
    rots = _start_rotations(d, config.starts) if config.starts > 1 and kind != 'nonrigid' else [None]
    multi = len(rots) > 1
    ft_data = _finetune_data(prob, config, kind, rng) if (config.finetune.enabled or multi) else None
    # the multi-start's fine-tunes before the final one run on a sample (their selection score's size)
    small_data = ft_data.subset(config.start_finetune_points, config.seed) if multi else None
    scorer = _OverlapScorer(ft_data, config.seed) if multi and config.start_score == 'overlap' else None
    count_n = int(round(min(1.0, mass_n / r) * r)) if config.divergence == 'mass' else 0
    tot = {'steps': 0, 'updates': 0, 'ft': 0}

    def score_of(a, t):
        if scorer is not None:
            return scorer(a, t)
        z = ys_np @ a + t
        dist, _ = cKDTree(xs_np).query(z, k=1)
        sel = select_pairs(dist, config.divergence, count_n, h_n if h_n else 0.0)
        return _partial_objective(dist, sel, config.divergence, h_n if h_n else 0.0)

    def finetune(a, t, v_fn=None, small: bool = False):
        """Fine-tune (a, t[, v_fn]) (on start_finetune_points source points when ``small``, else
        the final one). Returns (a, t, v_fn, converged)."""
        tf = time.perf_counter()
        data = small_data if small else ft_data
        a, t, v_fn, ft_iters, ft_conv = _do_finetune(prob, config, kind, a, t, v_fn, h_caller, rng, data,
                                                     final=not small, warn=not small)
        timings['finetune'] += time.perf_counter() - tf
        tot['ft'] += ft_iters
        return a, t, v_fn, ft_conv

    if multi:
        cands = sorted(_multistart(config, device, ys_np, xs_np, mass_n, h_n, h_floor, rots, should_stop,
                                   potential_state, timings, tot, finetune, score_of), key=lambda c: c[0])
        if config.finetune.enabled:
            # the finalists were compared after the fine-tune on start_finetune_points source points
            # (the score's own sample size); only the winner gets the dense fine-tune
            score, (a, t, v_fn, conv, h_final, state, idx) = cands[0]
            a, t, v_fn, ft_conv = finetune(a, t)
            cands[0] = (score, (a, t, v_fn, conv and ft_conv, h_final, state, idx))
    else:
        ta = time.perf_counter()
        with thread_scope(config.threads):
            a, t, v_fn, steps, updates, conv, h_final, state = _adversarial(
                config, device, ys_np, xs_np, mass_n, h_n, rots[0], potential_state, config.seed, norm.scale,
                should_stop, h_floor)
        timings['adversarial'] += time.perf_counter() - ta
        tot['steps'] += steps
        tot['updates'] += updates
        ft_conv = True
        if config.finetune.enabled:
            a, t, v_fn, ft_conv = finetune(a, t, v_fn)
        cands = [(0.0, (a, t, v_fn, conv and ft_conv, h_final, state, 0))]
    out = []
    for score, (a, t, v_fn, converged, h_final, state, idx) in cands:
        out.append((score, _finish(prob, config, kind, a, t, v_fn, h_caller, t0, dict(timings), tot['steps'],
                                   tot['updates'], tot['ft'], converged, h_final * norm.scale, state, str(device),
                                   start_index=idx)))
    return out

def _multistart(config: RegistrationConfig, device, ys_np, xs_np, mass_n, h_n, h_floor, rots, should_stop,
                potential_state, timings, tot, finetune, score_of) -> list:
    """Multi-start (rigid/affine), all starts in lock-step (:func:`ensemble.run_ensemble`).

    ``start_steps > 0`` (coarse-to-fine tournament): every start runs ``start_steps`` steps of
    Alg. 1 and a fine-tune on ``start_finetune_points`` source points (always: it is part of the
    selection); the ``start_keep`` best by ``score_of`` (plus the first start, the caller's prior)
    continue with the rest of Alg. 1. ``start_steps == 0``: every start runs the full Alg. 1.
    Finalists end with the fine-tune on ``start_finetune_points`` source points (if enabled; the
    caller gives the winner the dense one); in the tournament each finalist contributes the better
    (by ``score_of``) of its continued and its short-stage pose. Returns [(score, (a, t, v_fn,
    converged, h, state, index))]."""
    r, q = ys_np.shape[0], xs_np.shape[0]
    group = max(1, _ENSEMBLE_POINTS // max(config.batch_size or max(q, r), 1))

    def stage(cfg, items, steps, seed, **kw):
        """run_ensemble over ``items`` [(rotation, translation, state)] in groups; yields per start."""
        for g0 in range(0, len(items), group):
            if g0 > 0 and should_stop is not None and should_stop():
                return
            part = items[g0:g0 + group]
            ta = time.perf_counter()
            with thread_scope(config.threads):
                starts, done, updates = run_ensemble(
                    cfg, device, ys_np, xs_np, mass_n, h_n, [p[0] for p in part], steps, seed + g0, should_stop,
                    states=[p[2] for p in part], translations=None if part[0][1] is None else [p[1] for p in part],
                    h_floor=h_floor, **kw)
            timings['adversarial'] += time.perf_counter() - ta
            for k, st in enumerate(starts):
                tot['steps'] += done
                tot['updates'] += updates
                yield g0 + k, st

    if config.start_steps > 0:
        cfg1 = config.replace(min_steps=min(config.min_steps, config.start_steps))
        cands = []
        for i, st in stage(cfg1, [(rot, None, potential_state) for rot in rots], config.start_steps, config.seed):
            a, t, _, _ = finetune(st.a, st.t, small=True)
            cands.append((score_of(a, t), a, t, st.state, i))
            if config.verbose:
                print(f'[pwan] start {i + 1}/{len(rots)}: score {cands[-1][0]:.5g}', file=sys.stderr)
        # the first start (the caller's init / identity) is always a finalist: it is the prior,
        # and a short run from it may simply not have converged yet
        keep = sorted(cands, key=lambda c: c[0])[:config.start_keep]
        if all(c[4] != 0 for c in keep):
            keep.append(cands[0])
        items = [(c[1].T, c[2], c[3]) for c in keep]
        index = [c[4] for c in keep]
        rest = 0 if should_stop is not None and should_stop() else max(config.steps - config.start_steps, 0)
        finals = stage(config, items, rest, config.seed + 7919, step_offset=config.start_steps, converge=True,
                       warmup=False)
    else:
        index = list(range(len(rots)))
        finals = stage(config, [(rot, None, potential_state) for rot in rots], config.steps, config.seed,
                       converge=True)
    out = []
    for i, st in finals:
        poses = [(st.a, st.t)]
        if config.start_steps > 0:
            # the finalist's short-stage pose stays a candidate: continuing Alg. 1 at the schedule's
            # higher learning rate can walk away from a pose the short stage had already found
            poses.append((keep[i][1], keep[i][2]))
        best = None
        for a, t in poses:
            ft_conv = True
            if config.finetune.enabled:
                a, t, _, ft_conv = finetune(a, t, small=True)
            score = score_of(a, t)
            if best is None or score < best[0]:
                best = (score, (a, t, None, st.converged and ft_conv, st.h, st.state, index[i]))
        out.append(best)
        if config.verbose:
            print(f'[pwan] start {index[i] + 1} final score {best[0]:.5g}', file=sys.stderr)
    return out
