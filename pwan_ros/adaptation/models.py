"""Networks of PWAN for partial domain adaptation (paper Fig. PDA_net).

eta = D_nu o T_theta: input normalisation -> bottleneck T_theta (D -> B, ReLU) -> classifier
D_nu (B -> K logits). Potential f_w on bottleneck features: B -> H -> H -> 1 (LeakyReLU) with
f = -|g_w| <= 0 (PWAN) or f = g_w (unconstrained, complete alignment / WGAN).
"""

from __future__ import annotations

import torch
from torch import nn

NORM_MODES = {'none': 0, 'l2': 1, 'zscore': 2, 'l2_zscore': 3, 'standard': 2, 'l2_standard': 3}


class InputNorm(nn.Module):
    """Row-wise L2 normalisation and/or ``(x - mean) * scale`` with stored mean/scale (D,), or
    identity.

    ``scale`` is 1/std per column for ``zscore`` (0 for a column that is constant on the labelled
    rows, so it is ignored rather than blown up on the unlabelled ones) and one common factor for
    ``standard`` (see :func:`pwan_ros.adaptation.trainer.fit_input_norm`)."""

    def __init__(self, dim: int, mode: str = 'l2'):
        super().__init__()
        self.mode = NORM_MODES[mode]
        self.register_buffer('mean', torch.zeros(dim))
        self.register_buffer('scale', torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == 1 or self.mode == 3:
            x = x / x.pow(2).sum(dim=1, keepdim=True).sqrt().clamp_min(1e-12)
        if self.mode == 2 or self.mode == 3:
            x = (x - self.mean) * self.scale
        return x


class AdaptedClassifier(nn.Module):
    """eta(x): features (n, D) float32 -> logits (n, K). ``embed`` gives the bottleneck (n, B)."""

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        bottleneck_dim: int = 256,
        dropout: float = 0.0,
        input_norm: str = 'l2',
    ):
        super().__init__()
        self.norm = InputNorm(in_dim, input_norm)
        self.bottleneck = nn.Sequential(
            nn.Linear(in_dim, bottleneck_dim), nn.ReLU(), nn.Dropout(dropout)
        )
        self.head = nn.Linear(bottleneck_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.bottleneck(self.norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


class PotentialNet(nn.Module):
    """f_w: bottleneck features (n, B) -> potentials (n,); f <= 0 when ``nonpositive``."""

    def __init__(self, dim: int, hidden: int = 256, nonpositive: bool = True):
        super().__init__()
        # LeakyReLU: with f = -|g| the constant g = 0 is a stationary point that dead ReLUs fall
        # into.
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, 1),
        )
        self.nonpositive = nonpositive

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        g = self.net(z).squeeze(1)
        return -g.abs() if self.nonpositive else g


def gradient_penalty(
    potential: PotentialNet, a: torch.Tensor, b: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """One-sided penalty mean(relu(|grad f(z)| - 1)^2) at random interpolates of a and b (n, B).

    Keeps f_w (approximately) 1-Lipschitz; the graph is kept so that it trains w."""
    n = min(a.shape[0], b.shape[0])
    t = torch.rand(n, 1, generator=generator).to(a.device)
    z = (t * a[:n] + (1 - t) * b[:n]).detach().requires_grad_(True)
    f = potential(z)
    (grad,) = torch.autograd.grad(f.sum(), z, create_graph=True)
    return torch.relu(grad.norm(dim=1) - 1.0).pow(2).mean()
