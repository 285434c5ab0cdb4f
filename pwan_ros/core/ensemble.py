"""Alg. 1 for S independent starts in lock-step: one batched potential network and transform.

The short stage of the multi-start tournament runs S starts (rigid or affine) for a few transform
steps each. Run one by one, every update is a handful of tiny matrix products dominated by
per-call overhead; stacked along a leading start axis they become S x larger batched products
(``torch.baddbmm``) at nearly the same overhead (measured 3-5x less time per start on a 2-core
CPU, far more on a GPU).

The S problems stay exactly independent: the objective is the sum of the S per-start objectives,
every parameter belongs to one start, and Adam is element-wise, so each start takes the same steps
it would take alone (only the random stream differs: all starts share the mini-batch indices).
Shapes: points (S, n, d) in the normalised frame; row-vector convention T(y) = y A_s + t_s.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from .config import PotentialConfig, RegistrationConfig
from .errors import PwanInputError
from .preprocess import median_spacing
from .transforms import matrix_to_quaternion, quaternion_to_matrix


class EnsemblePotential(nn.Module):
    """S copies of :class:`potential.PotentialNet` (same structure and init law), evaluated together.

    ``raw(x)``: (S, n, d) -> (S, n). ``h``: (S,) clip levels. ``state(i)`` returns start i's weights
    as a ``PotentialNet`` state dict (to continue that start with the single-run solver)."""

    def __init__(self, count: int, dim: int, config: PotentialConfig, generator: torch.Generator):
        super().__init__()
        h1, h2 = config.hidden
        self.shapes = [(dim, h1), (h1, h2), (h2, 2 * h2), (2 * h2, h2), (2 * h2, 1)]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in self.shapes:
            bound = 1.0 / math.sqrt(fan_in)   # nn.Linear's default init law
            self.weights.append(nn.Parameter((torch.rand(count, fan_in, fan_out, generator=generator) * 2 - 1) * bound))
            self.biases.append(nn.Parameter((torch.rand(count, 1, fan_out, generator=generator) * 2 - 1) * bound))
        self.slope = float(config.leaky_slope)
        self.h = nn.Parameter(torch.full((count,), float(config.h_init)))
        self.register_buffer('length', torch.tensor(float(config.length_scale)))

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """g_w(x) for every start: (S, n, d) -> (S, n)."""
        act = nn.functional.leaky_relu
        w, b = self.weights, self.biases
        x = x / self.length
        a = act(torch.baddbmm(b[1], act(torch.baddbmm(b[0], x, w[0]), self.slope), w[1]), self.slope)
        c = act(torch.baddbmm(b[3], act(torch.baddbmm(b[2], a, w[2]), self.slope), w[3]), self.slope)
        return torch.baddbmm(b[4], torch.cat((a, c), dim=2), w[4]).squeeze(2) * self.length

    def load_member_state(self, i: int, state: Dict[str, torch.Tensor]) -> None:
        """Set member i from a ``PotentialNet`` state dict (a warm start)."""
        with torch.no_grad():
            for k in range(len(self.shapes)):
                self.weights[k][i].copy_(state[f'l{k + 1}.weight'].T.to(self.weights[k]))
                self.biases[k][i, 0].copy_(state[f'l{k + 1}.bias'].to(self.biases[k]))
            self.h[i] = float(state['h'])
            self.length.fill_(float(state['length']))

    def state(self, i: int) -> Dict[str, torch.Tensor]:
        """Start i's weights in ``PotentialNet.state_dict()`` layout (CPU copies)."""
        out = {}
        for k in range(len(self.shapes)):
            out[f'l{k + 1}.weight'] = self.weights[k][i].detach().T.contiguous().cpu().clone()
            out[f'l{k + 1}.bias'] = self.biases[k][i, 0].detach().cpu().clone()
        out['h'] = self.h[i].detach().cpu().clone()
        out['length'] = self.length.detach().cpu().clone()
        return out


class EnsembleTransform(nn.Module):
    """S rigid (quaternion / 2-D angle) or affine transforms: y (S, n, d) -> y A_s + t_s."""

    def __init__(self, kind: str, rotations: Sequence[np.ndarray], dtype: torch.dtype):
        super().__init__()
        self.kind = kind
        count, dim = len(rotations), rotations[0].shape[0]
        self.dim = dim
        rots = torch.as_tensor(np.stack(rotations), dtype=torch.float64)   # (S, d, d), column convention
        if kind == 'affine':
            self.a = nn.Parameter(rots.transpose(1, 2).to(dtype).contiguous())
        elif dim == 3:
            self.q = nn.Parameter(torch.stack([matrix_to_quaternion(r) for r in rots]).to(dtype))
        else:
            self.q = nn.Parameter(torch.atan2(rots[:, 1, 0], rots[:, 0, 0])[:, None].to(dtype))
        self.t = nn.Parameter(torch.zeros(count, dim, dtype=dtype))

    def linear(self) -> torch.Tensor:
        """A_s (S, d, d), row-vector convention (y A)."""
        if self.kind == 'affine':
            return self.a
        if self.dim == 3:
            return quaternion_to_matrix(self.q).transpose(1, 2)
        c, s = torch.cos(self.q[:, 0]), torch.sin(self.q[:, 0])
        return torch.stack((torch.stack((c, s), 1), torch.stack((-s, c), 1)), 1)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.t[:, None, :], y, self.linear())


@dataclass
class EnsembleStart:
    """One start after :func:`run_ensemble`: ``a`` (d, d) row convention, ``t`` (d,), normalised
    frame; ``state``: its potential as a ``PotentialNet`` state dict; ``converged``: its motion
    fell below the tolerance; ``h``: its clip level (normalised units)."""

    a: np.ndarray
    t: np.ndarray
    state: Dict[str, torch.Tensor]
    converged: bool
    h: float


def run_ensemble(config: RegistrationConfig, device: torch.device, ys_np: np.ndarray, xs_np: np.ndarray,
                 mass_n: Optional[float], h_n: Optional[float], rotations: List[np.ndarray], steps: int,
                 seed: int, should_stop: Optional[Callable[[], bool]] = None,
                 states: Optional[Sequence[Optional[Dict[str, torch.Tensor]]]] = None,
                 translations: Optional[Sequence[np.ndarray]] = None, step_offset: int = 0,
                 converge: bool = False, warmup: bool = True, h_floor: float = 0.0) -> tuple:
    """Alg. 1 (u = ``config.potential_updates``) for every start at once: ``config.warmup_updates``
    potential updates (if ``warmup``), then up to ``steps`` transform steps.

    rotations: initial rotations (d, d), column convention, about the origin; translations:
    initial t (d,) (default 0); states: per-start ``PotentialNet`` state dicts to begin from (None
    entries: fresh init). The learning-rate schedule is that of a full ``config.steps`` run,
    entered at ``step_offset``. converge: stop once every start's RMS motion over
    ``config.window`` steps is below ``config.tolerance`` x the source spacing (after
    ``config.min_steps``). h_floor: lower bound of the learned h (normalised units). Returns
    (list of :class:`EnsembleStart`, steps done, potential updates per start).
    """
    kind = config.transform
    pc = config.potential
    dtype = torch.float32
    gen = torch.Generator().manual_seed(seed)
    count = len(rotations)
    y = torch.as_tensor(ys_np, dtype=dtype, device=device)
    x = torch.as_tensor(xs_np, dtype=dtype, device=device)
    r, q = y.shape[0], x.shape[0]
    net = EnsemblePotential(count, ys_np.shape[1], pc, gen).to(device)
    for i, st in enumerate(states or []):
        if st is None:
            continue
        try:
            net.load_member_state(i, st)
        except (KeyError, RuntimeError, TypeError) as exc:
            raise PwanInputError(f'potential_state does not fit this network: {exc}') from None
    closed_form = config.divergence == 'mass' and pc.h_mode == 'closed_form'
    h_min = max(float(h_floor), 1e-6)       # lower bound of a learned h
    m_alpha, m_beta = float(q), float(r)
    if config.divergence == 'distance':
        with torch.no_grad():
            net.h.fill_(float(h_n))
        net.h.requires_grad_(False)
    groups = [{'params': list(net.weights) + list(net.biases)}]
    if config.divergence == 'mass' and not closed_form:
        groups.append({'params': [net.h]})
    opt_f = torch.optim.Adam(groups, lr=pc.lr, betas=pc.betas)
    transform = EnsembleTransform(kind, rotations, dtype).to(device)
    if translations is not None:
        with torch.no_grad():
            transform.t.copy_(torch.as_tensor(np.stack(translations), dtype=dtype))
    opt_t = torch.optim.Adam(transform.parameters(), lr=config.lr_transform)
    bs = config.batch_size
    n_gp = min(pc.gp_points, q + r) if not bs else min(pc.gp_points, 2 * bs)

    def h_of(gx: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
        if closed_form:
            return torch.maximum(gx.amax(1), gy.amax(1)).detach()
        return net.h

    def batches():
        """A reference mini-batch (b, d) and source indices (b,) (None: all), shared by the starts."""
        xb = x[torch.randint(q, (bs,), generator=gen).to(device)] if bs and bs < q else x
        yi = torch.randint(r, (bs,), generator=gen).to(device) if bs and bs < r else None
        return xb, yi

    def update(xb: torch.Tensor, zb: torch.Tensor, with_gp: bool) -> None:
        """One Adam ascent step of every start's (L - gp_weight GP) / m_beta (see PotentialTrainer)."""
        opt_f.zero_grad(set_to_none=True)
        xs = xb.expand(count, -1, -1)
        gx, gy = net.raw(xs).abs(), net.raw(zb).abs()
        h = h_of(gx, gy)
        fx = -gx                                             # reference side unclipped in training
        fy = -torch.minimum(gy, h[:, None])
        val = m_alpha * fx.mean(1) - m_beta * fy.mean(1)
        val = val + (h * (mass_n - m_beta) if config.divergence == 'mass' else -h * m_beta)
        loss = -val.sum() / m_beta
        if with_gp and pc.gp_weight > 0:
            pts = torch.cat((xs, zb), 1)
            sel = torch.randperm(pts.shape[1], generator=gen)[:min(n_gp, pts.shape[1])].to(device)
            pg = pts[:, sel].detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(net.raw(pg).sum(), pg, create_graph=True)
            loss = loss + pc.gp_weight * torch.relu((grad * grad).sum(2) - 1.0).mean(1).sum()
        loss.backward()
        opt_f.step()
        if config.divergence == 'mass' and not closed_form:
            with torch.no_grad():
                net.h.clamp_(min=h_min)

    y_all = y.expand(count, -1, -1)
    warm = config.warmup_updates if warmup else 0
    with torch.no_grad():
        z_all = transform(y_all)
    for k in range(warm):
        xb, yi = batches()
        update(xb, z_all if yi is None else z_all[:, yi], with_gp=(k % config.potential_updates == 0))
    decay = (config.lr_transform_final / config.lr_transform) ** (1.0 / max(config.steps - 1, 1))
    eval_idx = torch.randperm(r, generator=gen)[:min(r, 512)].to(device)
    history: deque = deque(maxlen=config.window + 1)
    tol = config.tolerance * max(median_spacing(ys_np), 1e-9)
    moving = torch.ones(count, dtype=torch.bool)
    done = 0
    for step in range(steps):
        if should_stop is not None and should_stop():
            break
        for g in opt_t.param_groups:
            g['lr'] = config.lr_transform * decay ** (step + step_offset)
        xb, yi = batches()
        ysrc = y_all if yi is None else y_all[:, yi]
        with torch.no_grad():
            zb = transform(ysrc)
        for k in range(config.potential_updates):
            update(xb, zb, with_gp=(k == 0))
        opt_t.zero_grad(set_to_none=True)
        gz = net.raw(transform(ysrc)).abs()
        with torch.no_grad():
            hv = h_of(net.raw(xb.expand(count, -1, -1)).abs(), gz) if closed_form else net.h.detach()
        # transform update: descend -(1/r) sum_j f_s(T_s y_j) for every start s
        (torch.minimum(gz, hv[:, None]).mean(1).sum()).backward()
        opt_t.step()
        done = step + 1
        if converge:
            with torch.no_grad():
                history.append(transform(y_all[:, eval_idx]))
            if len(history) == history.maxlen:
                motion = (history[-1] - history[0]).pow(2).sum(2).mean(1).sqrt().cpu()
                moving = motion >= tol
                if not bool(moving.any()) and done >= config.min_steps:
                    break
    with torch.no_grad():
        a_all = transform.linear().double().cpu().numpy()
        t_all = transform.t.double().cpu().numpy()
        if closed_form:
            net.h.copy_(h_of(net.raw(x.expand(count, -1, -1)).abs(), net.raw(transform(y_all)).abs()))
    conv = (~moving).tolist() if converge and len(history) == history.maxlen else [steps == 0] * count
    starts = [EnsembleStart(a_all[i], t_all[i], net.state(i), bool(conv[i]), float(net.h[i].detach())) for i in range(count)]
    return starts, done, warm + done * config.potential_updates
