"""Alg. 1 of the paper (adversarial stage), the one implementation: S starts in lock-step.

A single registration is S = 1; the multi-start tournament runs S starts (rigid / affine) as one
batched network and transform (batched matrix products over a leading start axis). The S problems
stay exactly independent: the objective is the sum of the S per-start objectives, every parameter
belongs to one start and Adam is element-wise, so each start takes the steps it would take alone
(only the random stream is shared: all starts see the same mini-batch indices).

One step (:meth:`Alg1.step`): the transform's linear part is computed once (closed form), the
source mini-batch is moved, u potential updates ascend the KR objective, one Adam step descends
it in the transform. The potential's gradients (incl. the gradient penalty) are written out
(:mod:`gradients`: the network is piecewise linear, so its input gradient is a masked product of
its weights, and no double backward is needed). Everything inside a step stays
on the device: random indices come from a device generator, learning rates are read from a
device table, Adam is fused, and the host reads the state only every ``window`` steps (the
convergence test). The two gradient functions are pure functions of tensors that
``torch.compile(fullgraph=True)`` captures whole (``compile`` setting). On CUDA one step is
captured once as a CUDA graph and replayed (``cuda_graphs``). Both: :mod:`acceleration`.

Shapes: points (S, n, d) in the normalised frame; row-vector convention T(y) = y A_s + t_s (+ V).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..config import RegistrationConfig
from ..errors import PwanInputError
from ..preprocess import median_spacing
from ..problem import SampledProblem
from .acceleration import FusedAdam, compile_wanted, compiled, graphs_wanted, window_graph
from .coherence import Coherence
from .gradients import Penalty, potential_grads, transform_input_grad
from .potential import BatchedPotential, Workspace, tangent_rows
from .transforms import BatchedTransform

__all__ = ['Alg1', 'Alg1Result', 'Schedule', 'StartResult', 'Starts', 'run_alg1']


# --------------------------------------------------------------------------- the algorithm


@dataclass(frozen=True)
class Starts:
    """Where the S starts of a run begin: ``rotations`` (d, d) (column convention, about the
    origin), ``translations`` (d,) (None: 0) and ``states`` (a ``PotentialNet`` state dict per
    start to begin from; None or None entries: a fresh network)."""

    rotations: List[np.ndarray]
    translations: Optional[Sequence[np.ndarray]] = None
    states: Optional[Sequence[Optional[Dict[str, torch.Tensor]]]] = None


@dataclass(frozen=True)
class Schedule:
    """How long a run goes: up to ``steps`` transform steps, the learning-rate schedule of a full
    ``config.steps`` run entered at ``step_offset``; ``seed`` of its random draws; ``converge``:
    stop once every start's motion is below the tolerance (else run all steps); ``warmup``: the
    potential's warm-up updates first."""

    steps: int
    seed: int
    step_offset: int = 0
    converge: bool = True
    warmup: bool = True


@dataclass
class StartResult:
    """One start after :func:`run_alg1`: ``a`` (d, d) row convention, ``t`` (d,), ``v`` (r, d)
    non-rigid offsets of the source points (None otherwise), normalised frame; ``state``: its
    potential as a ``PotentialNet`` state dict; ``converged``: its motion fell below the
    tolerance; ``h``: its clip level (normalised units)."""

    a: np.ndarray
    t: np.ndarray
    v: Optional[np.ndarray]
    state: Dict[str, torch.Tensor]
    converged: bool
    h: float


@dataclass
class Alg1Result:
    """starts: one :class:`StartResult` per start (input order); steps: transform updates done;
    updates: potential updates per start."""

    starts: List[StartResult]
    steps: int
    updates: int


class Alg1:
    """The state of one lock-step run (network, transform, optimisers, device generator) and its
    step. Built by :func:`run_alg1`; see there for the arguments."""

    def __init__(
        self,
        config: RegistrationConfig,
        problem: SampledProblem,
        starts: Starts,
        seed: int,
        coherence: Optional[Coherence] = None,
    ):
        pc = config.potential
        self.config, self.problem, self.device = config, problem, problem.device
        device = problem.device
        self.kind = config.transform
        dtype = torch.float32
        self.count = count = len(starts.rotations)
        if self.kind == 'nonrigid' and count != 1:
            raise PwanInputError('the non-rigid transform runs one start at a time')
        init_gen = torch.Generator().manual_seed(seed)  # network init: the same law everywhere
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.y = torch.as_tensor(problem.ys, dtype=dtype, device=device)
        self.x = torch.as_tensor(problem.xs, dtype=dtype, device=device)
        r = self.y.shape[0]
        self.net = BatchedPotential(count, problem.ys.shape[1], pc, init_gen).to(device)
        self._load_states(starts.states)
        self.closed_form = config.divergence == 'mass' and pc.h_mode == 'closed_form'
        self.learn_h = config.divergence == 'mass' and not self.closed_form
        self.h_mode = 'closed_form' if self.closed_form else 'learn' if self.learn_h else 'fixed'
        self.h_min = max(float(problem.h_floor), 1e-6)
        if config.divergence == 'distance':
            with torch.no_grad():
                self.net.h.fill_(float(problem.h))
        c_h = (problem.mass - r) / r if config.divergence == 'mass' else -1.0
        m_alpha = float(problem.ref_mass)
        self.coef = torch.tensor([m_alpha / r, c_h], dtype=dtype, device=device)
        self.opt_f = FusedAdam([self.net.theta], pc.lr, pc.betas)
        self.weights = self.net.weights()  # views of theta, valid across its in-place updates
        self.transform = BatchedTransform(self.kind, starts.rotations, dtype, r).to(device)
        if starts.translations is not None:
            with torch.no_grad():
                self.transform.t.copy_(torch.as_tensor(np.stack(starts.translations), dtype=dtype))
        self.t_params = list(self.transform.parameters())
        self.opt_t = FusedAdam(self.t_params, config.lr_transform)
        self.coh = coherence
        self._penalty_rows(pc, dtype)
        self._gradient_functions()

    def _load_states(self, states) -> None:
        """Start i's network from ``states[i]`` (None: the fresh init)."""
        for i, st in enumerate(states or []):
            if st is None:
                continue
            try:
                self.net.load_state(i, st)
            except (KeyError, RuntimeError, TypeError) as exc:
                raise PwanInputError(f'potential_state does not fit this network: {exc}') from None

    def _penalty_rows(self, pc, dtype) -> None:
        """The gradient penalty's sample size ``n_gp``, weight and tangent rows."""
        q, r, bs = self.x.shape[0], self.y.shape[0], self.config.batch_size
        self.batch_size = bs
        self.n_gp = (
            min(pc.gp_points, q + r) if not bs else min(pc.gp_points, min(bs, q) + min(bs, r))
        )
        self.gp_weight = float(pc.gp_weight)
        self.tangents = (
            tangent_rows(self.n_gp, self.y.shape[1], dtype, self.device)
            if self.gp_weight > 0
            else None
        )

    def _gradient_functions(self) -> None:
        """The two gradient functions: compiled (``config.compile``) or eager with one workspace
        for the run; on CUDA the steps are replayed from a captured CUDA graph
        (acceleration.WindowGraph), which the compiled functions' own graphs (mode
        'reduce-overhead') cannot nest in."""
        config, device = self.config, self.device
        self.graphs = graphs_wanted(config, device)
        mode = 'reduce-overhead' if device.type == 'cuda' and not self.graphs else None
        use = compile_wanted(config)
        if use:
            self._potential_grads = compiled('potential_grads', mode)
            self._transform_grad = compiled('transform_input_grad', mode)
        else:  # eager: one workspace for the run, so the loop allocates no large tensor
            work = Workspace()
            self._potential_grads = functools.partial(potential_grads, work=work)
            self._transform_grad = functools.partial(transform_input_grad, work=work)

    # -- pieces of a step
    def _batch(self):
        """Reference mini-batch (1, b, d) and source indices (b,) (None: all), drawn on the
        device."""
        q, r, bs = self.x.shape[0], self.y.shape[0], self.batch_size
        xb = (
            self.x[torch.randint(q, (bs,), generator=self.gen, device=self.device)]
            if bs and bs < q
            else self.x
        )
        yi = (
            torch.randint(r, (bs,), generator=self.gen, device=self.device)
            if bs and bs < r
            else None
        )
        return xb.expand(self.count, -1, -1), yi

    def potential_update(self, xb: torch.Tensor, zb: torch.Tensor, with_gp: bool) -> None:
        """One Adam ascent step of every start's (L - gp_weight GP) / m_beta (gradients by
        hand)."""
        net = self.net
        gp_index = None
        if with_gp and self.tangents is not None:
            gp_index = torch.randint(
                xb.shape[1] + zb.shape[1], (self.n_gp,), generator=self.gen, device=self.device
            )
        with torch.no_grad():
            grad = self._potential_grads(
                self.weights,
                net.h,
                xb,
                zb,
                self.coef,
                Penalty(gp_index, self.tangents, self.gp_weight),
                self.h_mode,
            )
            self.opt_f.step([grad])
            if self.learn_h:
                net.h.clamp_(min=self.h_min)

    def h_now(self, xb: torch.Tensor, zb: torch.Tensor) -> torch.Tensor:
        """(S,) clip levels: learned / fixed, or the closed form over the batch."""
        if not self.closed_form:
            return self.net.h.detach()
        with torch.no_grad():
            return self.net(torch.cat((xb, zb), 1)).abs().amax(1)

    def warmup(self, updates: int) -> None:
        """Potential updates against the initial transform (before the first transform step)."""
        with torch.no_grad():
            z_all = self.transform(self.y.expand(self.count, -1, -1))
        for k in range(updates):
            xb, yi = self._batch()
            self.potential_update(
                xb,
                z_all if yi is None else z_all[:, yi],
                with_gp=(k % self.config.potential_updates == 0),
            )

    def set_schedule(self, lrs: Sequence[float]) -> None:
        """The transform's learning rate of each coming step (host floats, rounded to float32 as
        ``fill_`` would); :meth:`step` reads the next one on the device."""
        self.lr_table = torch.tensor(list(lrs) or [0.0], dtype=torch.float32, device=self.device)
        self.lr_k = torch.zeros(1, dtype=torch.long, device=self.device)

    def step(self) -> None:
        """One step of Alg. 1: u potential updates, then one transform update at the next
        learning rate of the schedule (:meth:`set_schedule`), read on the device."""
        self.opt_t.lr.copy_(self.lr_table.index_select(0, self.lr_k).reshape(()))
        self.lr_k.add_(1)
        xb, yi = self._batch()
        ysrc = (
            self.y.expand(self.count, -1, -1)
            if yi is None
            else self.y[yi].expand(self.count, -1, -1)
        )
        with torch.set_grad_enabled(self.kind == 'rigid'):  # the others: gradients by hand
            a = self.transform.linear()  # once per step
            z = self.transform.apply(ysrc, a, yi)
        zb = z.detach()
        for k in range(self.config.potential_updates):
            self.potential_update(xb, zb, with_gp=(k == 0))
        with torch.no_grad():
            dz = self._transform_grad(self.weights, self.h_now(xb, zb), zb)
        if self.kind != 'rigid':
            self.opt_t.step(self.linear_grads(ysrc, dz, yi))
            return
        loss = (z * dz).sum()  # its gradient in the transform parameters is the chain rule's
        grads = list(torch.autograd.grad(loss, self.t_params, allow_unused=True))
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self.t_params, grads)]
        with torch.no_grad():
            self.opt_t.step(grads)

    def linear_grads(
        self, ysrc: torch.Tensor, dz: torch.Tensor, yi: Optional[torch.Tensor]
    ) -> List[torch.Tensor]:
        """The transform gradients of an affine / non-rigid step, written out (no autograd
        graph), in ``t_params`` order: z = y A + t (+ V) is linear in its parameters, so with
        dz = dL/dz (S, b, d) and ysrc (S, b, d): dL/dA = y^T dz, dL/dt = sum_j dz_j, dL/dV = dz on
        the batch's rows (yi; None: all) plus the coherence term's dC/dV / r, taken in the metric
        (sigma I + G) (natural gradient: smooth, coherent offsets)."""
        with torch.no_grad():
            grads = [torch.bmm(ysrc.transpose(1, 2), dz), dz.sum(1)]
            if self.kind == 'nonrigid':
                r = self.y.shape[0]
                v = self.transform.v
                dv = dz.clone() if yi is None else torch.zeros_like(v).index_add_(1, yi, dz)
                if self.coh is not None:
                    dv[0] += self.coh.gradient(v[0]) / r
                    dv = self.coh.apply_kernel(dv[0])[None] * r
                grads.append(dv)
        return grads

    def moved(self, eval_idx: torch.Tensor) -> torch.Tensor:
        """The evaluation points moved by the current transforms (S, k, d), no graph."""
        with torch.no_grad():
            return self.transform(
                self.y[eval_idx].expand(self.count, -1, -1),
                eval_idx if self.kind == 'nonrigid' else None,
            )


def run_alg1(
    config: RegistrationConfig,
    problem: SampledProblem,
    starts: Starts,
    schedule: Schedule,
    should_stop: Optional[Callable[[], bool]] = None,
    coherence: Optional[Coherence] = None,
) -> Alg1Result:
    """Alg. 1 (u = ``config.potential_updates``) for every start at once: ``config.warmup_updates``
    potential updates (if ``schedule.warmup``), then up to ``schedule.steps`` transform steps.

    problem: the sampled sets, masses and threshold (:class:`problem.SampledProblem`, normalised
    frame); starts: where each start begins (:class:`Starts`); schedule: :class:`Schedule`. With
    ``schedule.converge`` a run stops once every start's RMS motion over ``config.window`` steps
    is below ``config.tolerance`` x the source spacing (after ``config.min_steps``; tested every
    ``window`` steps, the only host read of the loop). coherence: the non-rigid regulariser
    (nonrigid only, one start). should_stop: polled before every step (with CUDA graphs: every
    ``window`` steps); True ends the run (not converged).
    """
    run = Alg1(config, problem, starts, schedule.seed, coherence)
    warm = config.warmup_updates if schedule.warmup else 0
    run.warmup(warm)
    decay = (config.lr_transform_final / config.lr_transform) ** (1.0 / max(config.steps - 1, 1))
    run.set_schedule(
        config.lr_transform * decay ** (k + schedule.step_offset) for k in range(schedule.steps)
    )
    done, moving, checked = _steps(run, schedule, should_stop)
    # converged: the motion test passed; a run of no step (steps 0) or without the test did not
    conv = (~moving).tolist() if schedule.converge and checked else [False] * run.count
    return Alg1Result(_finals(run, conv), done, warm + done * config.potential_updates)


def _steps(run: Alg1, schedule: Schedule, should_stop) -> tuple:
    """The transform steps of :func:`run_alg1` with their convergence test. Returns (steps done,
    (S,) bool: still moving at the last test, whether a test ran)."""
    config, steps = run.config, schedule.steps
    r = run.y.shape[0]
    eval_idx = torch.randperm(r, generator=torch.Generator().manual_seed(schedule.seed))[
        : min(r, 512)
    ].to(run.device)
    tol = config.tolerance * max(median_spacing(run.problem.ys), 1e-9)
    window = config.window
    moving = torch.ones(run.count, dtype=torch.bool)
    checked = False
    last = run.moved(eval_idx) if schedule.converge else None
    done = 0
    graph = None
    while done < steps:
        if should_stop is not None and should_stop():
            moving[:] = True
            checked = True
            break
        if graph is None and run.graphs and done >= 1:
            # the first step ran eagerly (warm-up of every kernel): capture one
            graph = window_graph(run)
            run.graphs = graph is not None
        if graph is not None:
            # to the end of the window (should_stop is polled once per window here)
            times = min(window - done % window, steps - done)
            graph.replay(times)
            done += times
        else:
            run.step()
            done += 1
        if schedule.converge and done % window == 0:
            now = run.moved(eval_idx)
            motion = (now - last).pow(2).sum(2).mean(1).sqrt().cpu()  # the loop's one host read
            last = now
            moving = motion >= tol
            checked = True
            if not bool(moving.any()) and done >= config.min_steps:
                break
    return done, moving, checked


def _finals(run: Alg1, conv: list) -> List[StartResult]:
    """Each start's transform, network and clip level after the run (host copies)."""
    net, tr = run.net, run.transform
    with torch.no_grad():
        a_all = tr.linear().double().cpu().numpy()
        t_all = tr.t.double().cpu().numpy()
        v_all = tr.v.double().cpu().numpy() if run.kind == 'nonrigid' else None
        if run.closed_form:
            y_all = run.y.expand(run.count, -1, -1)
            net.h.copy_(run.h_now(run.x.expand(run.count, -1, -1), tr(y_all)))
    return [
        StartResult(
            a_all[i],
            t_all[i],
            None if v_all is None else v_all[i],
            net.state(i),
            bool(conv[i]),
            float(net.h[i].detach()),
        )
        for i in range(run.count)
    ]
