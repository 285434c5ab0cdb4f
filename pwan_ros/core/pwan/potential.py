"""Potential network f_{w,h}(x) = clip(-|g_w(x)|, -h, 0) (Sec. 3.3 of the paper).

g_w is a point-wise MLP with a skip connection (Appx. B.5 structure, widths configurable):
    a = act(L2(act(L1 x)))            # d -> h1 -> h2
    b = act(L4(act(L3 a)))            # h2 -> 2*h2 -> h2
    g = L5([a, b])                     # skip concatenation, 2*h2 -> 1
act = LeakyReLU. Inputs are points in the internal normalised frame, shape (n, d).

:class:`PotentialNet` is one network (the discrepancy estimator's); :class:`BatchedPotential` holds
S of them for Alg. 1, with :func:`forward` / :func:`backward` written out by hand (below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import nn

from ..config import PotentialConfig


class PotentialNet(nn.Module):
    """g_w: (n, d) -> (n,). ``h`` (scalar parameter, normalised units) is the clip level."""

    def __init__(self, dim: int, config: PotentialConfig):
        super().__init__()
        h1, h2 = config.widths
        self.l1 = nn.Linear(dim, h1)
        self.l2 = nn.Linear(h1, h2)
        self.l3 = nn.Linear(h2, 2 * h2)
        self.l4 = nn.Linear(2 * h2, h2)
        self.l5 = nn.Linear(2 * h2, 1)
        self.slope = float(config.leaky_slope)
        self.h = nn.Parameter(torch.tensor(float(config.h_init)))
        self.register_buffer('length', torch.tensor(float(config.length_scale)))

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """g_w(x) = l * mlp(x / l): (n, d) -> (n,); l = ``length`` (resolution, same |grad|)."""
        act = nn.functional.leaky_relu
        x = x / self.length
        a = act(self.l2(act(self.l1(x), self.slope)), self.slope)
        b = act(self.l4(act(self.l3(a), self.slope)), self.slope)
        return self.l5(torch.cat((a, b), dim=1)).squeeze(1) * self.length

    def negpart(self, g: torch.Tensor) -> torch.Tensor:
        """Map g to the non-positive potential -|g| (before the clip at -h)."""
        return -g.abs()

    def potential(
        self, x: torch.Tensor, h: Optional[torch.Tensor], clip: bool = True
    ) -> torch.Tensor:
        """f(x) = clip(-|g(x)|, -h, 0) (no lower clip when ``clip`` is False or h is None)."""
        f = self.negpart(self.raw(x))
        if clip and h is not None:
            f = torch.maximum(f, -h)
        return f

    def state(self) -> Dict[str, torch.Tensor]:
        """CPU copy of the weights (incl. h) for warm starts (``potential_state``)."""
        return {k: v.detach().to('cpu').clone() for k, v in self.state_dict().items()}


def gradient_norm(
    net: PotentialNet, x: torch.Tensor, h: Optional[torch.Tensor], chunk: int = 65536
) -> torch.Tensor:
    """|grad_x f(x)| of the clipped potential at points x (n, d) -> (n,), no graph kept.

    Points where the clip is active (f = -h) have zero gradient: they are "omitted"."""
    out = []
    for s in range(0, x.shape[0], chunk):
        xc = x[s : s + chunk].detach().requires_grad_(True)
        with torch.enable_grad():
            f = net.potential(xc, h, clip=True)
            (g,) = torch.autograd.grad(f.sum(), xc)
        out.append(g.norm(dim=1))
    return torch.cat(out)


def gradient_penalty(net: PotentialNet, x: torch.Tensor) -> torch.Tensor:
    """One-sided penalty mean(relu(|grad_x g_w(x)|^2 - 1)) at points x (n, d), with graph.

    Penalising g_w (not the clipped f) keeps the whole unclipped potential 1-Lipschitz, which is
    what the clipped f inherits (clipping and |.| are 1-Lipschitz)."""
    xg = x.detach().requires_grad_(True)
    g = net.raw(xg)
    (grad,) = torch.autograd.grad(g.sum(), xg, create_graph=True)
    return torch.relu((grad * grad).sum(dim=1) - 1.0).mean()


# --------------------------------------------------------------------------- the network, by hand

# The potential g_w (Appx. B.5, :class:`potential.PotentialNet`): a = act(L2 act(L1 x/l)),
# c = act(L4 act(L3 a)), g = l (L5 [a, c]), act = LeakyReLU. It is piecewise linear, so its input
# gradient is the product of its weight matrices masked by the activation pattern: the same chain
# of linear maps run on d tangent rows per point, without biases, each masked by its point's
# activation slopes. :func:`forward` runs the value rows and the tangent rows, :func:`backward` is
# the reverse pass of both written out: about 60 tensor operations for an update with the penalty,
# instead of an autograd graph with a double backward (equal to autograd's gradient:
# test/test_core_alg1.py). The activations are applied in place: a post-activation value is > 0
# exactly where its pre-activation is (slope >= 0), so it is its own mask.


def _lrelu_backward(
    grad: torch.Tensor, result: torch.Tensor, slope: float, out: Optional[torch.Tensor]
):
    """grad * (1 if result > 0 else slope), ``result`` = the activation's output; into ``out``."""
    if out is None:
        return torch.ops.aten.leaky_relu_backward(grad, result, slope, True)
    return torch.ops.aten.leaky_relu_backward.grad_input(grad, result, slope, True, grad_input=out)


class Workspace:
    """Output buffers of :func:`forward` / :func:`backward`, one per call site and shape, kept
    across calls: Alg. 1's loop then allocates no large tensor. On CPU every fresh tensor of a
    few MB is new pages from the kernel (glibc hands them back on free): 19k page faults and ~40 %
    of a 24-start step before (bench/bench_engine.py). Without a workspace (None) every call
    allocates: the functional form that ``torch.compile`` captures."""

    def __init__(self):
        self._bufs: Dict[str, torch.Tensor] = {}

    def get(self, key: str, shape, like: torch.Tensor) -> torch.Tensor:
        buf = self._bufs.get(key)
        if (
            buf is None
            or buf.shape != shape
            or buf.dtype != like.dtype
            or buf.device != like.device
        ):
            buf = self._bufs[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buf


def buffer(
    work: Optional[Workspace], key: str, shape, like: torch.Tensor
) -> Optional[torch.Tensor]:
    """``work``'s buffer ``key`` of ``shape`` (an ``out=`` argument), or None without a
    workspace."""
    return None if work is None else work.get(key, torch.Size(shape), like)


class Weights(NamedTuple):
    """S networks' parameters as :func:`forward` / :func:`backward` take them: ``ws`` / ``bs`` the
    5 weights (S, in, out) and biases (S, 1, out) (views of :class:`BatchedPotential`'s flat
    ``theta``), ``length`` the input scale l (0-d tensor), ``slope`` the LeakyReLU slope."""

    ws: Sequence[torch.Tensor]
    bs: Sequence[torch.Tensor]
    length: torch.Tensor
    slope: float


@dataclass
class Tape:
    """What :func:`backward` needs of a :func:`forward` pass: ``acts`` = x/l and the four hidden
    layers' outputs (A1..A4; A_{i+1} is layer i's output and its activation mask), the skip
    concatenation ``skip`` = [A2, A4]; for the tangent rows (None without): ``t_acts`` (the
    tangents, then T1..T4), ``t_masks`` (their points' A1..A4) and ``t_skip``."""

    acts: List[torch.Tensor]
    skip: torch.Tensor
    t_acts: Optional[List[torch.Tensor]] = None
    t_masks: Optional[List[torch.Tensor]] = None
    t_skip: Optional[torch.Tensor] = None


def forward(
    net: Weights,
    x: torch.Tensor,
    tangents: Optional[torch.Tensor] = None,
    grad_index: Optional[torch.Tensor] = None,
    work: Optional[Workspace] = None,
    tag: str = '',
):
    """g_w(x) for every start and, with ``grad_index`` (k,), its input gradient at those points.

    net: the S networks (:class:`Weights`); x (S, n, d) normalised points; tangents: (k*d, d),
    :func:`tangent_rows`; work / tag: a :class:`Workspace` and the caller's key prefix for its
    buffers (None: allocate). Returns (g (S, n), grad (S, k, d) or None, :class:`Tape`)."""
    ws, bs, length, slope = net
    s, n, d = x.shape
    a = torch.div(x, length, out=buffer(work, tag + 'x', x.shape, x))
    acts = [a]
    t_acts = t_masks = t = rep = None
    if grad_index is not None:
        rep = grad_index.repeat_interleave(d)
        t = tangents.expand(s, -1, -1)
        t_acts, t_masks = [t], []
    for i in range(4):
        width = ws[i].shape[2]
        a = torch.baddbmm(bs[i], a, ws[i], out=buffer(work, f'{tag}a{i}', (s, n, width), x))
        nn.functional.leaky_relu(a, slope, inplace=True)
        acts.append(a)
        if rep is not None:
            mask = torch.index_select(
                a, 1, rep, out=buffer(work, f'{tag}m{i}', (s, rep.shape[0], width), x)
            )
            t = torch.bmm(t, ws[i], out=buffer(work, f'{tag}t{i}', (s, rep.shape[0], width), x))
            t = _lrelu_backward(t, mask, slope, t)
            t_masks.append(mask)
            t_acts.append(t)
    skip = torch.cat(
        (acts[2], acts[4]), 2, out=buffer(work, tag + 'skip', (s, n, 2 * ws[1].shape[2]), x)
    )
    g = torch.baddbmm(bs[4], skip, ws[4])[:, :, 0] * length
    grad = t_skip = None
    if rep is not None:
        t_skip = torch.cat(
            (t_acts[2], t_acts[4]),
            2,
            out=buffer(work, tag + 'tskip', (s, rep.shape[0], 2 * ws[1].shape[2]), x),
        )
        grad = torch.bmm(t_skip, ws[4]).view(s, -1, d)
    return g, grad, Tape(acts, skip, t_acts, t_masks, t_skip)


def backward(
    net: Weights,
    tape: Tape,
    dg: torch.Tensor,
    dgrad: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    work: Optional[Workspace] = None,
    tag: str = '',
):
    """Reverse pass of :func:`forward` for the upstream gradients dg (S, n) of g and dgrad (S, k,
    d) of the input gradient. With ``out`` (the flat gradient buffer, :func:`split` layout): writes
    the parameter gradients there and returns it; without: returns the gradient with respect to the
    points x (S, n, d) (value rows only). work / tag: as in :func:`forward`."""
    ws, length, slope = net.ws, net.length, net.slope
    s, n = dg.shape
    tangents = dgrad is not None
    h2 = ws[1].shape[2]
    w5 = ws[4].transpose(1, 2)  # (S, 1, 2 h2)
    dout = (dg * length)[:, :, None]
    dskip = torch.mul(
        dout, w5, out=buffer(work, tag + 'dskip', (s, n, 2 * h2), dg)
    )  # outer product
    t_dout = t_dskip = t_dz = None
    if tangents:
        t_dout = dgrad.reshape(s, -1, 1)
        t_dskip = torch.mul(
            t_dout, w5, out=buffer(work, tag + 'tdskip', (s, t_dout.shape[1], 2 * h2), dg)
        )
    if out is not None:
        gw, gb = split(out, [w.shape for w in ws])
        torch.bmm(tape.skip.transpose(1, 2), dout, out=gw[4])
        if tangents:
            gw[4].baddbmm_(tape.t_skip.transpose(1, 2), t_dout)
        torch.sum(dout, 1, keepdim=True, out=gb[4])
    da = dskip[:, :, h2:]
    t_da = t_dskip[:, :, h2:] if tangents else None
    for i in (3, 2, 1, 0):
        dz = _lrelu_backward(
            da, tape.acts[i + 1], slope, buffer(work, f'{tag}dz{i}', (s, n, ws[i].shape[2]), dg)
        )
        if tangents:
            t_dz = _lrelu_backward(
                t_da, tape.t_masks[i], slope, buffer(work, f'{tag}tdz{i}', t_da.shape, dg)
            )
        if out is not None:
            torch.bmm(tape.acts[i].transpose(1, 2), dz, out=gw[i])
            if tangents:
                gw[i].baddbmm_(tape.t_acts[i].transpose(1, 2), t_dz)
            torch.sum(dz, 1, keepdim=True, out=gb[i])
        if i == 0:
            break
        wt = ws[i].transpose(1, 2)
        da = torch.bmm(dz, wt, out=buffer(work, f'{tag}da{i}', (s, n, wt.shape[2]), dg))
        if tangents:
            t_da = torch.bmm(
                t_dz, wt, out=buffer(work, f'{tag}tda{i}', (s, t_dz.shape[1], wt.shape[2]), dg)
            )
        if i == 2:
            da.add_(dskip[:, :, :h2])
            if tangents:
                t_da.add_(t_dskip[:, :, :h2])
    if out is not None:
        return out
    return torch.bmm(
        dz, ws[0].transpose(1, 2), out=buffer(work, tag + 'dx', (s, n, ws[0].shape[1]), dg)
    ).div_(length)


def split(flat: torch.Tensor, shapes: Sequence[Sequence[int]]):
    """(weights, biases): views of a flat buffer laid out W1, b1, ..., W5, b5 for weight shapes
    ``shapes`` [(S, in, out)] (biases (S, 1, out)), as :class:`BatchedPotential` lays out its
    parameters."""
    gw, gb, off = [], [], 0
    for s, fan_in, fan_out in shapes:
        gw.append(flat[off : off + s * fan_in * fan_out].view(s, fan_in, fan_out))
        off += s * fan_in * fan_out
        gb.append(flat[off : off + s * fan_out].view(s, 1, fan_out))
        off += s * fan_out
    return gw, gb


def tangent_rows(k: int, dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The (k*d, d) tangent inputs of :func:`forward`: the identity tiled k times."""
    return torch.eye(dim, dtype=dtype, device=device).repeat(k, 1)


class BatchedPotential(nn.Module):
    """S copies of :class:`potential.PotentialNet` (same structure and init law).

    All parameters live in one flat tensor ``theta`` (blocks W1 (S, d, h1), b1 (S, 1, h1), ...,
    W5, b5, then the S clip levels h, each contiguous; :meth:`views` and :attr:`h` give them), so
    one fused Adam step updates them all. ``forward(x)``: (S, n, d) -> g (S, n). ``state(i)`` /
    ``load_state(i)`` exchange start i's weights in ``PotentialNet.state_dict()`` layout."""

    def __init__(self, count: int, dim: int, config: PotentialConfig, generator: torch.Generator):
        super().__init__()
        h1, h2 = config.widths
        self.shapes = [(dim, h1), (h1, h2), (h2, 2 * h2), (2 * h2, h2), (2 * h2, 1)]
        blocks = []
        for fan_in, fan_out in self.shapes:
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default init law
            blocks.append(
                (
                    (torch.rand(count, fan_in, fan_out, generator=generator) * 2 - 1) * bound
                ).reshape(-1)
            )
            blocks.append(
                ((torch.rand(count, 1, fan_out, generator=generator) * 2 - 1) * bound).reshape(-1)
            )
        blocks.append(torch.full((count,), float(config.h_init)))
        self.theta = nn.Parameter(torch.cat(blocks), requires_grad=False)
        self.count = count
        self.slope = float(config.leaky_slope)
        self.register_buffer('length', torch.tensor(float(config.length_scale)))

    def views(self):
        """(ws, bs): the weight and bias views of ``theta``."""
        return split(self.theta, [(self.count, i, o) for i, o in self.shapes])

    def weights(self) -> Weights:
        """The networks as :func:`forward` takes them (views of ``theta``, valid across its
        in-place updates)."""
        ws, bs = self.views()
        return Weights(ws, bs, self.length, self.slope)

    @property
    def h(self) -> torch.Tensor:
        """(S,) clip levels (normalised units), a view of ``theta``."""
        return self.theta[-self.count :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return forward(self.weights(), x)[0]

    def load_state(self, i: int, state: Dict[str, torch.Tensor]) -> None:
        """Set start i from a ``PotentialNet`` state dict."""
        ws, bs = self.views()
        with torch.no_grad():
            for k in range(len(self.shapes)):
                ws[k][i].copy_(state[f'l{k + 1}.weight'].T.to(ws[k]))
                bs[k][i, 0].copy_(state[f'l{k + 1}.bias'].to(bs[k]))
            self.h[i] = float(state['h'])
            self.length.fill_(float(state['length']))

    def state(self, i: int) -> Dict[str, torch.Tensor]:
        """Start i's weights in ``PotentialNet.state_dict()`` layout (CPU copies)."""
        ws, bs = self.views()
        out = {}
        for k in range(len(self.shapes)):
            out[f'l{k + 1}.weight'] = ws[k][i].detach().T.contiguous().cpu().clone()
            out[f'l{k + 1}.bias'] = bs[k][i, 0].detach().cpu().clone()
        out['h'] = self.h[i].detach().cpu().clone()
        out['length'] = self.length.detach().cpu().clone()
        return out
