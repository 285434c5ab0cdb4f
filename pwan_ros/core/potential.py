"""Potential network f_{w,h}(x) = clip(-|g_w(x)|, -h, 0) (Sec. 3.3 of the paper).

g_w is a point-wise MLP with a skip connection (Appx. B.5 structure, widths configurable):
    a = act(L2(act(L1 x)))            # d -> h1 -> h2
    b = act(L4(act(L3 a)))            # h2 -> 2*h2 -> h2
    g = L5([a, b])                     # skip concatenation, 2*h2 -> 1
act = LeakyReLU. Inputs are points in the internal normalised frame, shape (n, d).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from .config import PotentialConfig


class PotentialNet(nn.Module):
    """g_w: (n, d) -> (n,). ``h`` (scalar parameter, normalised units) is the clip level."""

    def __init__(self, dim: int, config: PotentialConfig):
        super().__init__()
        h1, h2 = config.hidden
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

    def potential(self, x: torch.Tensor, h: Optional[torch.Tensor], clip: bool = True) -> torch.Tensor:
        """f(x) = clip(-|g(x)|, -h, 0) (no lower clip when ``clip`` is False or h is None)."""
        f = self.negpart(self.raw(x))
        if clip and h is not None:
            f = torch.maximum(f, -h)
        return f

    def state(self) -> Dict[str, torch.Tensor]:
        """CPU copy of the weights (incl. h) for warm starts (``potential_state``)."""
        return {k: v.detach().to('cpu').clone() for k, v in self.state_dict().items()}


def gradient_norm(net: PotentialNet, x: torch.Tensor, h: Optional[torch.Tensor], chunk: int = 65536) -> torch.Tensor:
    """|grad_x f(x)| of the clipped potential at points x (n, d) -> (n,), no graph kept.

    Points where the clip is active (f = -h) have zero gradient: they are "omitted"."""
    out = []
    for s in range(0, x.shape[0], chunk):
        xc = x[s:s + chunk].detach().requires_grad_(True)
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
