"""KR-form PW discrepancies L_M,m (mass type) and L_D,h (distance type) with a potential network.

Point masses: the reference alpha has total mass m_alpha spread uniformly over its q points, the
source beta has m_beta over its r points (the registration uses m_alpha = q, m_beta = r).
    mass:      L = m_alpha/q sum f(x) - m_beta/r sum f(y) + h (m - m_beta)     (eq. loss_m_app)
    distance:  L = m_alpha/q sum f(x) - m_beta/r sum f(y) - h m_beta          (eq. loss_d_app)
with f in [-h, 0] 1-Lipschitz. :class:`PotentialTrainer` ascends L - gp_weight*GP (Alg. 1 inner
loop); :func:`estimate_discrepancy` trains to convergence and reports the value and the per-point
gradient norms (zero gradient = point omitted by the partial matching).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..config import DIVERGENCES, PotentialConfig
from ..device import resolve_device, thread_scope
from ..errors import PwanInputError
from ..preprocess import clean_pair
from .potential import PotentialNet, gradient_norm, gradient_penalty

__all__ = [
    'DiscrepancyEstimate',
    'ESTIMATOR_CTRANSFORM',
    'ESTIMATOR_POTENTIAL',
    'EstimatorSettings',
    'PotentialTrainer',
    'estimate_discrepancy',
]


#: network defaults of the stand-alone estimator: wider, lower lr, decays to 1e-3 x lr; precision
#: matters there, not speed (the registration keeps PotentialConfig()).
ESTIMATOR_POTENTIAL = PotentialConfig(hidden=(64, 64), lr=3e-3, length_scale=0.3)

#: defaults of the c-transform estimator (method='ctransform'): no gradient penalty (the
#: c-transform makes the potential exactly 1-Lipschitz), Adam betas (0.9, 0.999).
ESTIMATOR_CTRANSFORM = PotentialConfig(
    hidden=(64, 64), lr=3e-3, length_scale=0.3, gp_weight=0.0, betas=(0.9, 0.999)
)


class PotentialTrainer:
    """Alg. 1 inner loop: Adam ascent of the KR objective in the normalised frame of ``problem``
    (its divergence, masses m_alpha / m_beta, mass m (same units as the point masses) or fixed
    threshold h). The training loss is divided by m_beta so that learning rates do not depend on
    set sizes; a learned h stays above 1e-6.
    """

    def __init__(self, problem: '_KRProblem', config: PotentialConfig, device: torch.device):
        p = problem
        if p.divergence not in DIVERGENCES:
            raise PwanInputError(f'unknown divergence {p.divergence!r}')
        self.divergence = p.divergence
        self.config = config
        self.device = device
        self.net = PotentialNet(p.ref.shape[1], config).to(device)
        self.m_alpha = float(p.m_alpha)
        self.m_beta = float(p.m_beta)
        self.mass = None if p.mass is None else float(p.mass)
        self.closed_form = p.divergence == 'mass' and config.h_mode == 'closed_form'
        self.h_floor = 1e-6
        if p.divergence == 'distance':
            if p.h is None or not p.h > 0:
                raise PwanInputError('distance divergence needs a positive threshold h')
            with torch.no_grad():
                self.net.h.fill_(float(p.h))
            self.net.h.requires_grad_(False)
        elif self.mass is None:
            raise PwanInputError('mass divergence needs a mass')
        params = [prm for n, prm in self.net.named_parameters() if n != 'h']
        groups = [{'params': params}]
        if p.divergence == 'mass' and not self.closed_form:
            groups.append({'params': [self.net.h]})
        self.opt = torch.optim.Adam(groups, lr=config.lr, betas=self.config.betas)
        self.updates = 0

    def h_value(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Current h (tensor): fixed, learned, or closed form max |g| over the batch."""
        if self.closed_form:
            return -torch.minimum(
                self.net.negpart(self.net.raw(x)).min(), self.net.negpart(self.net.raw(y)).min()
            )
        return self.net.h

    def objective(self, x: torch.Tensor, y: torch.Tensor, train: bool = True) -> torch.Tensor:
        """KR objective L (eq. loss_m_app / loss_d_app, without GP) on reference x (q, d), source y
        (r, d).

        In training only the source potential is clipped at -h (see docs/core.md); the value
        reported by :func:`estimate_discrepancy` clips both (a feasible dual point)."""
        h = self.h_value(x, y)
        if self.closed_form:
            fx = self.net.negpart(self.net.raw(x))
            fy = self.net.negpart(self.net.raw(y))
        else:
            fx = self.net.potential(x, h, clip=not train)
            fy = self.net.potential(y, h, clip=True)
        val = self.m_alpha * fx.mean() - self.m_beta * fy.mean()
        if self.divergence == 'mass':
            val = val + h * (self.mass - self.m_beta)
        else:
            val = val - h * self.m_beta
        return val

    def update(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        with_gp: bool,
        gp_idx: Optional[torch.Tensor] = None,
    ) -> None:
        """One Adam ascent step on (L - gp_weight * GP) / m_beta. x: (q, d), y: (r, d) detached."""
        self.opt.zero_grad(set_to_none=True)
        loss = -self.objective(x, y) / self.m_beta
        if with_gp and self.config.gp_weight > 0:
            pts = torch.cat((x, y), 0)
            if gp_idx is not None:
                pts = pts[gp_idx]
            loss = loss + self.config.gp_weight * gradient_penalty(self.net, pts)
        loss.backward()
        self.opt.step()
        if not self.closed_form and self.divergence == 'mass':
            with torch.no_grad():
                self.net.h.clamp_(min=self.h_floor)
        self.updates += 1


def best_clip_level(
    net,
    x: torch.Tensor,
    y: torch.Tensor,
    m_alpha: float,
    m_beta: float,
    mass: float,
    h_now: torch.Tensor,
) -> torch.Tensor:
    """Exact maximiser over h of the clipped mass-type objective for the fixed network g_w.

    L(h) = m_alpha mean clip(-|g(x)|, -h, 0) - m_beta mean clip(-|g(y)|, -h, 0) + h (m - m_beta)
    is concave piecewise linear in h with kinks at the values |g| (the closed form of
    eq. app_final_m_eq2, extended to the clipped potential); its maximum is at a kink."""
    gx = -net.negpart(net.raw(x))
    gy = -net.negpart(net.raw(y))
    cand = torch.cat((gx, gy, h_now.reshape(1))).clamp(min=1e-12)
    return _best_kink(gx, gy, cand, m_alpha, m_beta, mass)


def _best_kink(
    gx: torch.Tensor,
    gy: torch.Tensor,
    cand: torch.Tensor,
    m_alpha: float,
    m_beta: float,
    mass: float,
) -> torch.Tensor:
    """The h among ``cand`` maximising -m_alpha mean(min(gx, h)) + m_beta mean(min(gy, h)) + h (m -
    m_beta) (evaluated in chunks of 1024 candidates)."""
    best, best_val = cand[0], None
    for s in range(0, cand.shape[0], 1024):
        c = cand[s : s + 1024][:, None]
        val = (
            -m_alpha * torch.minimum(gx[None, :], c).mean(1)
            + m_beta * torch.minimum(gy[None, :], c).mean(1)
            + c[:, 0] * (mass - m_beta)
        )
        i = int(torch.argmax(val))
        if best_val is None or val[i] > best_val:
            best_val, best = val[i], c[i, 0]
    return best


@dataclass(frozen=True)
class DiscrepancyEstimate:
    """KR estimate of a PW discrepancy (caller units).

    value: the discrepancy. h: threshold (learned/closed form for 'mass', given for 'distance').
    source_grad_norm (r,), reference_grad_norm (q,): |grad f| at the valid input points (about
    1 = matched, about 0 = omitted). source_omitted / reference_omitted: grad norm < 0.5.
    iterations: potential updates used.
    """

    value: float
    h: float
    source_grad_norm: np.ndarray
    reference_grad_norm: np.ndarray
    source_omitted: np.ndarray
    reference_omitted: np.ndarray
    iterations: int


@dataclass(frozen=True)
class EstimatorSettings:
    """How :func:`estimate_discrepancy` trains its potential. method: 'ctransform' (the network
    on the reference side, its c-transform on the source side: a certified lower bound) or
    'network' (the registration's potential with the gradient penalty, reported as trained);
    iterations: potential updates (None: 6000 for 'ctransform', 3000 for 'network'); batch_size:
    mini-batch per set (0: the whole sets); potential: the network (None:
    :data:`ESTIMATOR_CTRANSFORM` / :data:`ESTIMATOR_POTENTIAL`); device, seed, threads; the
    learning rate decays to ``final_lr_factor`` x lr (cosine) over the iterations."""

    method: str = 'ctransform'
    iterations: Optional[int] = None
    batch_size: int = 0
    potential: Optional[PotentialConfig] = None
    device: str = 'auto'
    seed: int = 0
    threads: int = 0
    final_lr_factor: float = 0.001


@dataclass(frozen=True)
class _KRProblem:
    """The estimator's sets in its normalised frame ((p - center) / scale): reference (q, d) and
    source (r, d) in caller units, the divergence, mass m, threshold h (normalised), masses."""

    ref: np.ndarray
    src: np.ndarray
    center: np.ndarray
    scale: float
    divergence: str
    mass: Optional[float]
    h: Optional[float]
    m_alpha: float
    m_beta: float

    def tensors(self, dtype, device):
        """(x, y): the normalised reference and source as tensors."""
        x = torch.as_tensor((self.ref - self.center) / self.scale, dtype=dtype, device=device)
        y = torch.as_tensor((self.src - self.center) / self.scale, dtype=dtype, device=device)
        return x, y

    def value(self, fx: torch.Tensor, fy: torch.Tensor, hv) -> torch.Tensor:
        """The KR objective of potential values fx (q,) / fy (r,) at clip level hv."""
        val = self.m_alpha * fx.mean() - self.m_beta * fy.mean()
        if self.divergence == 'mass':
            return val + hv * (self.mass - self.m_beta)
        return val - hv * self.m_beta


def estimate_discrepancy(
    reference,
    source,
    divergence: str = 'mass',
    mass: Optional[float] = None,
    distance_threshold: Optional[float] = None,
    mass_reference: Optional[float] = None,
    mass_source: Optional[float] = None,
    settings: Optional[EstimatorSettings] = None,
) -> DiscrepancyEstimate:
    """Estimate L_M,m(alpha, beta) or L_D,h(alpha, beta) by training a potential network.

    reference: (q, d) points of alpha, source: (r, d) points of beta (same units; d in {2, 3}).
    mass_reference / mass_source: total masses m_alpha / m_beta (default q and r; uniform point
    masses). divergence 'mass' needs ``mass`` (0 < m <= min(m_alpha, m_beta)); 'distance' needs
    ``distance_threshold`` h > 0. W1 is 'mass' with m_alpha = m_beta = m. settings: how the
    potential is trained (:class:`EstimatorSettings`; method 'ctransform' by default, see
    docs/core.md, "KR estimator": the reported value is that of an exactly 1-Lipschitz potential
    in [-h, 0], hence a certified lower bound).
    """
    st = settings or EstimatorSettings()
    problem = _kr_problem(
        reference, source, divergence, mass, distance_threshold, (mass_reference, mass_source)
    )
    if st.method not in ('ctransform', 'network'):
        raise PwanInputError(f"method must be 'ctransform' or 'network', got {st.method!r}")
    iterations = st.iterations
    if iterations is None:
        iterations = 6000 if st.method == 'ctransform' else 3000
    if iterations < 1:
        raise PwanInputError('iterations must be >= 1')
    st = dataclasses.replace(st, iterations=iterations)
    dev = resolve_device(st.device)
    if st.method == 'ctransform':
        return _estimate_ctransform(problem, st, st.potential or ESTIMATOR_CTRANSFORM, dev)
    return _estimate_network(problem, st, st.potential or ESTIMATOR_POTENTIAL, dev)


def _kr_problem(reference, source, divergence, mass, distance_threshold, masses) -> _KRProblem:
    """The validated sets of :func:`estimate_discrepancy` in its normalised frame."""
    ref, src, m_alpha, m_beta = clean_pair(reference, source, *masses)
    center = np.concatenate((ref, src)).mean(axis=0)
    scale = float(np.sqrt(((ref - center) ** 2).sum(axis=1).mean()))
    scale = scale if scale > 0 else 1.0
    h = None
    if divergence == 'mass':
        if mass is None or not (0 < mass <= min(m_alpha, m_beta) * (1 + 1e-9)):
            raise PwanInputError(
                f'mass must be in (0, min(m_alpha, m_beta)] = (0, {min(m_alpha, m_beta):g}], got '
                f'{mass!r}'
            )
    elif divergence == 'distance':
        if distance_threshold is None or not distance_threshold > 0:
            raise PwanInputError(
                f'distance_threshold must be positive, got {distance_threshold!r}'
            )
        h = distance_threshold / scale
    else:
        raise PwanInputError(f'unknown divergence {divergence!r}')
    return _KRProblem(ref, src, center, scale, divergence, mass, h, m_alpha, m_beta)


def _batch(x: torch.Tensor, size: int, gen: torch.Generator, dev) -> torch.Tensor:
    """A mini-batch of ``size`` rows of x drawn with replacement (x itself when size is 0 or not
    smaller)."""
    n = x.shape[0]
    if size and size < n:
        return x[torch.randint(n, (size,), generator=gen).to(dev)]
    return x


def _estimate_network(problem: _KRProblem, st: EstimatorSettings, cfg, dev) -> DiscrepancyEstimate:
    """The plain Alg. 1 potential f = clip(-|g|, -h, 0) with the gradient penalty, trained by
    :class:`PotentialTrainer`; the value of the clipped potential on the full sets."""
    p = problem
    q, r = p.ref.shape[0], p.src.shape[0]
    with thread_scope(st.threads):
        gen, x, y = _seeded(p, st, dev)
        # mass is in units of the point masses; the normalised problem keeps the same masses
        trainer = PotentialTrainer(p, cfg, dev)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            trainer.opt, T_max=st.iterations, eta_min=cfg.lr * st.final_lr_factor
        )
        n_gp = min(cfg.gp_points, q + r)
        for _ in range(st.iterations):
            xb = _batch(x, st.batch_size, gen, dev)
            yb = _batch(y, st.batch_size, gen, dev)
            nb = xb.shape[0] + yb.shape[0]
            gp_idx = torch.randperm(nb, generator=gen)[: min(n_gp, nb)].to(dev)
            trainer.update(xb, yb, with_gp=True, gp_idx=gp_idx)
            sched.step()
        with torch.no_grad():
            hv = trainer.h_value(x, y) if trainer.closed_form else trainer.net.h.detach()
            if p.divergence == 'mass':
                hv = best_clip_level(trainer.net, x, y, p.m_alpha, p.m_beta, p.mass, hv)
            # evaluate the clipped (feasible) potential on the full sets
            val = p.value(
                trainer.net.potential(x, hv, clip=True),
                trainer.net.potential(y, hv, clip=True),
                hv,
            )
        gy = gradient_norm(trainer.net, y, hv).cpu().numpy()
        gx = gradient_norm(trainer.net, x, hv).cpu().numpy()
    return _estimate(p, float(val), float(hv), gy, gx, st.iterations)


def _estimate(p: _KRProblem, val: float, hv: float, gy, gx, iterations: int):
    """The :class:`DiscrepancyEstimate` in caller units."""
    return DiscrepancyEstimate(
        value=val * p.scale,
        h=hv * p.scale,
        source_grad_norm=gy,
        reference_grad_norm=gx,
        source_omitted=gy < 0.5,
        reference_omitted=gx < 0.5,
        iterations=iterations,
    )


def _source_ctransform(
    u: torch.Tensor, x: torch.Tensor, y: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """w_j = max_i (u_i - |x_i - y_j|) for reference values u (q,) -> (r,) (with graph)."""
    out = []
    for s in range(0, y.shape[0], chunk):
        out.append((u[:, None] - torch.cdist(x, y[s : s + chunk])).max(0).values)
    return torch.cat(out)


def _reference_ctransform(
    v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """min_j (v_j + |x_i - y_j|) for source values v (r,) -> (q,)."""
    out = []
    for s in range(0, x.shape[0], chunk):
        out.append((v[None, :] + torch.cdist(x[s : s + chunk], y)).min(1).values)
    return torch.cat(out)


def _mass_quantile_h(w: torch.Tensor, mass: float, m_beta: float, n: int) -> float:
    """Maximiser over h of  - m_beta mean(max(w, -h)) + h (m - m_beta)  (unclipped reference side):
    the level at which exactly mass m of the source is above -h (weighted quantile of -w)."""
    k = mass * n / m_beta
    srt = torch.sort(-w.detach()).values
    ki = min(max(int(np.ceil(k - 1e-9)), 1), n)
    if ki < n and abs(k - round(k)) < 1e-9:  # flat top between two kinks: take the middle
        hv = 0.5 * (srt[ki - 1] + srt[ki])
    else:
        hv = srt[ki - 1]
    return max(float(hv), 1e-9)


def _best_h_values(
    r: torch.Tensor, w: torch.Tensor, m_alpha: float, m_beta: float, mass: float
) -> torch.Tensor:
    """Exact maximiser over h of m_alpha mean(max(r,-h)) - m_beta mean(max(w,-h)) + h (m - m_beta)
    (concave piecewise linear in h, maximum at a kink -r_i / -w_j)."""
    gx, gy = -r, (-w).clamp(min=0)
    return _best_kink(gx, gy, torch.cat((gx, gy)).clamp(min=1e-12), m_alpha, m_beta, mass)


def _estimate_ctransform(
    problem: _KRProblem, st: EstimatorSettings, cfg, dev
) -> DiscrepancyEstimate:
    """KR estimate with the network on the reference side and the c-transform on the source side.

    Training ascends  m_alpha mean u(x) - m_beta mean max(-h, w(y)) + h-term,  u = -|g_w| (not
    clipped: the objective is then concave in the values u, and no reference point can get stuck
    at the clip), w = c-transform of u. For 'mass', h at every update is the exact maximiser of
    this objective for the current network (a weighted quantile of -w); for 'distance' it is fixed.
    The reported value uses the feasible potential (:func:`_certified`).
    """
    p = problem
    q, r = p.ref.shape[0], p.src.shape[0]
    with thread_scope(st.threads):
        gen, x, y = _seeded(p, st, dev)
        net = PotentialNet(p.ref.shape[1], cfg).to(dev)
        params = [prm for n, prm in net.named_parameters() if n != 'h']
        opt = torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            opt, T_max=st.iterations, eta_min=cfg.lr * st.final_lr_factor
        )
        n_gp = min(cfg.gp_points, q + r)
        for _ in range(st.iterations):
            xb = _batch(x, st.batch_size, gen, dev)
            yb = _batch(y, st.batch_size, gen, dev)
            u = net.negpart(net.raw(xb))
            w = _source_ctransform(u, xb, yb)
            hv = (
                _mass_quantile_h(w, p.mass, p.m_beta, yb.shape[0])
                if p.divergence == 'mass'
                else p.h
            )
            loss = -p.value(u, torch.clamp(w, min=-hv), hv) / p.m_beta
            if cfg.gp_weight > 0:
                pts = torch.cat((xb, yb), 0)
                pts = pts[torch.randperm(pts.shape[0], generator=gen)[:n_gp].to(dev)]
                loss = loss + cfg.gp_weight * gradient_penalty(net, pts)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        with torch.no_grad():
            return _certified(p, net, dev, st.iterations)


def _certified(p: _KRProblem, net, dev, iterations: int) -> DiscrepancyEstimate:
    """The value of the feasible potential
        F(z) = min(0, min_j (v_j + |z - y_j|)),  v_j = max(-h, max_i (u_i - |x_i - y_j|)),
    u = clip(-|g_w(x)|, -h, 0), h the exact best clip level for the final network: F is
    1-Lipschitz and in [-h, 0] by construction, F(y_j) = v_j, F(x_i) >= u_i, so the value is a
    certified KR lower bound of the discrepancy. In float64 (the network values are float32, the
    distances exact)."""
    x32, _ = p.tensors(torch.float32, dev)
    rx = net.negpart(net.raw(x32)).double()
    x, y = p.tensors(torch.float64, dev)
    w = _source_ctransform(rx, x, y)
    if p.divergence == 'mass':
        hv = _best_h_values(rx, w, p.m_alpha, p.m_beta, p.mass)
    else:
        hv = torch.tensor(p.h, dtype=torch.float64, device=rx.device)
    u = torch.maximum(rx, -hv)
    wv = _source_ctransform(u, x, y)
    v = torch.maximum(wv, -hv)
    cu = _reference_ctransform(v, x, y)
    val = p.value(torch.clamp(cu, max=0.0), v, hv)
    # |grad F|: 0 where the clip is active (source at -h, reference at 0), else 1
    tol = 1e-9
    gy = (wv > -hv + tol).to(torch.float64).cpu().numpy()
    gx = (cu < -tol).to(torch.float64).cpu().numpy()
    return _estimate(p, float(val), float(hv), gy, gx, iterations)


def _seeded(problem: _KRProblem, st: EstimatorSettings, dev) -> tuple:
    """Torch's global RNG seeded with ``st.seed``; (a CPU generator seeded alike, the reference
    and source as float32 tensors on ``dev``)."""
    torch.manual_seed(st.seed)
    gen = torch.Generator(device='cpu').manual_seed(st.seed)
    x, y = problem.tensors(torch.float32, dev)
    return gen, x, y
