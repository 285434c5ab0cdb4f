"""The gradients of Alg. 1's objective, written out: the potential's (one update of the KR
objective, eq. loss_m_app / loss_d_app, with the one-sided gradient penalty) and the moved
source's (the transform's step). The network is piecewise linear, so its input gradient is a
masked product of its weights (:func:`potential.forward` / :func:`potential.backward`) and no
double backward is needed. Both are pure functions of tensors that ``torch.compile(fullgraph=
True)`` captures whole (:mod:`acceleration`). Shapes: (S, n, d), S starts in lock-step."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .potential import Weights, Workspace, backward, buffer, forward

__all__ = ['Penalty', 'potential_grads', 'transform_input_grad']


class Penalty(NamedTuple):
    """The one-sided gradient penalty of a potential update: ``index`` (k,) the points of
    cat(xb, zb) where it is taken (None: no penalty), ``tangents`` (k*d, d)
    (:func:`potential.tangent_rows`), ``weight`` its weight."""

    index: Optional[torch.Tensor]
    tangents: Optional[torch.Tensor]
    weight: float


def potential_grads(
    net: Weights,
    h: torch.Tensor,
    xb: torch.Tensor,
    zb: torch.Tensor,
    coef: torch.Tensor,
    penalty: Penalty,
    h_mode: str,
    work: Optional[Workspace] = None,
) -> torch.Tensor:
    """Gradient of one potential update's loss -(L / m_beta) + gp_weight GP, summed over starts,
    with L / m_beta = c_a mean f(x) - mean f(y) + c_h h (eq. loss_m_app / loss_d_app).

    xb (S, bx, d) reference batch, zb (S, bz, d) moved source batch; h (S,) clip levels; coef (2,)
    = (c_a, c_h) = (m_alpha / m_beta, (m - m_beta) / m_beta) for the mass type, (., -1) for the
    distance type. f = -|g|, the source side clipped at -h (the reference side is not clipped in
    training, docs/core.md). penalty: where the one-sided penalty mean relu(|grad g|^2 - 1) is
    taken, and its weight (:class:`Penalty`). h_mode: 'learn' (h is a parameter), 'closed_form' (h
    = max |g| over the batch, eq. app_final_m_eq2) or 'fixed' (the distance type's h; its gradient
    is 0 as in 'closed_form'). work: buffers kept across calls (:class:`potential.Workspace`; None:
    allocate, the form ``torch.compile`` captures). Returns the gradient in
    :class:`BatchedPotential`'s flat layout (W1, b1, ..., W5, b5, h)."""
    bx, bz = xb.shape[1], zb.shape[1]
    pts = torch.cat((xb, zb), 1, out=buffer(work, 'pts', (zb.shape[0], bx + bz, zb.shape[2]), zb))
    g, grad, tape = forward(net, pts, penalty.tangents, penalty.index, work, 'p')
    sign = torch.sign(g)
    if h_mode == 'closed_form':
        h = g.abs().amax(1)
    inside = (g[:, bx:].abs() <= h[:, None]).to(g.dtype)
    dg = torch.cat((sign[:, :bx] * (coef[0] / bx), sign[:, bx:] * inside * (-1.0 / bz)), 1)
    dgrad = None
    if grad is not None:
        sq = grad.pow(2).sum(2, keepdim=True)
        dgrad = grad * ((sq > 1.0).to(g.dtype) * (2.0 * penalty.weight / grad.shape[1]))
    size = sum(w.numel() + b.numel() for w, b in zip(net.ws, net.bs)) + h.shape[0]
    flat = (
        torch.empty(size, dtype=g.dtype, device=g.device)
        if work is None
        else work.get('flat', (size,), g)
    )
    backward(net, tape, dg, dgrad, out=flat, work=work, tag='p')
    dh = flat[-h.shape[0] :]
    if h_mode == 'learn':
        torch.sub((inside.sum(1) - bz) / bz, coef[1], out=dh)
    else:
        dh.zero_()
    return flat


def transform_input_grad(
    net: Weights, h: torch.Tensor, z: torch.Tensor, work: Optional[Workspace] = None
) -> torch.Tensor:
    """d/dz of sum_s mean_j min(|g_s(z_sj)|, h_s) (= -(1/r) sum_j f_s(T_s y_j)); z (S, n, d);
    work: as in :func:`potential_grads`."""
    g, _, tape = forward(net, z, work=work, tag='t')
    dg = torch.sign(g) * (g.abs() < h[:, None]).to(g.dtype) * (1.0 / g.shape[1])
    return backward(net, tape, dg, work=work, tag='t')
