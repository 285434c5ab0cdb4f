"""Coherence regulariser C(V) = lambda Tr(V^T (sigma I + G_rho)^-1 V) (eq. bending) via Nystrom +
Woodbury.

G_rho(i, j) = exp(-|y_i - y_j|^2 / rho) over the r source points (normalised frame) is
approximated by Q Q^T with Q = G_{r,k} U S^{-1/2} from k landmarks (G_kk = U S U^T), so
(sigma I + Q Q^T)^-1 = sigma^-1 (I - Q (sigma I_k + Q^T Q)^-1 Q^T) (Woodbury; Appx.
Sec_app_PSR_app). Everything is O(r k) per use; the factors are computed once per registration.
"""

from __future__ import annotations

import torch

from ..config import CoherenceConfig


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, rho: float) -> torch.Tensor:
    """exp(-|a_i - b_j|^2 / rho): (n, d), (k, d) -> (n, k)."""
    return torch.exp(-torch.cdist(a, b).pow(2) / rho)


class Coherence:
    """Low-rank coherence operator for source points y (r, d) (normalised frame)."""

    def __init__(self, y: torch.Tensor, config: CoherenceConfig, generator: torch.Generator):
        self.config = config
        self.y = y
        r = y.shape[0]
        k = min(config.rank, r)
        idx = torch.randperm(r, generator=generator)[:k].to(y.device)
        self.landmarks = y[idx]
        g_rk = gaussian_kernel(y, self.landmarks, config.rho).double()
        g_kk = gaussian_kernel(self.landmarks, self.landmarks, config.rho).double()
        s, u = torch.linalg.eigh(g_kk)
        keep = s > s.max() * 1e-8
        self.q = (g_rk @ u[:, keep] / s[keep].sqrt()).to(y.dtype)  # (r, k')
        self.proj = (u[:, keep] / s[keep].sqrt()).to(y.dtype)  # (k, k'): Q = G_rk proj
        qd = self.q.double()
        self.sigma = float(config.sigma)
        self.inner = torch.linalg.inv(
            self.sigma * torch.eye(qd.shape[1], dtype=qd.dtype, device=qd.device) + qd.T @ qd
        ).to(y.dtype)  # (sigma I + Q^T Q)^-1
        # mean kernel row sum, used to normalise the preconditioned data force
        self.row_mean = float((self.q @ self.q.sum(0)).mean())

    def value(self, v: torch.Tensor) -> torch.Tensor:
        """C(V) = lambda/sigma (|V|^2 - Tr(V^T Q M Q^T V)), differentiable; V (r, d)."""
        qv = self.q.T @ v
        return self.config.weight / self.sigma * ((v * v).sum() - (qv * (self.inner @ qv)).sum())

    def gradient(self, v: torch.Tensor) -> torch.Tensor:
        """dC/dV = 2 lambda/sigma (V - Q M Q^T V) (eq. bending_grad), (r, d)."""
        return 2 * self.config.weight / self.sigma * (v - self.q @ (self.inner @ (self.q.T @ v)))

    def apply_kernel(self, g: torch.Tensor) -> torch.Tensor:
        """(sigma I + G) g / (sigma + mean row sum of G): smoothing preconditioner, (r, d)."""
        return (self.sigma * g + self.q @ (self.q.T @ g)) / (self.sigma + self.row_mean)

    def solve_weighted(self, w: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """argmin over smooth V = Q B of sum_j w_j |target_j - V_j|^2 + C(V), O(r k^2).

        V is restricted to the span of the Nystrom factor Q (the smooth kernel subspace); there
        C(QB) = lambda Tr(B^T Q^T Q (sigma I + Q^T Q)^-1 B) (push-through identity), giving the
        k x k system (Q^T W Q + lambda Q^T Q (sigma I + Q^T Q)^-1) B = Q^T W target.
        Without the restriction the per-point sigma part lets every point snap to its nearest
        neighbour (see docs/core.md). w (r,) >= 0, target (r, d)."""
        lam = self.config.weight
        q = self.q.double()
        wd = w.double()
        qtq = q.T @ q
        eye = torch.eye(q.shape[1], dtype=q.dtype, device=q.device)
        reg = qtq @ torch.linalg.inv(self.sigma * eye + qtq)
        lhs = q.T @ (wd[:, None] * q) + lam * reg + 1e-10 * torch.trace(qtq) * eye
        b = torch.linalg.solve(lhs, q.T @ (wd[:, None] * target.double()))
        return (q @ b).to(target.dtype)

    def extend(self, v: torch.Tensor, points: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
        """Offsets at new points p (n, d) of a field in the span of Q (what
        :meth:`solve_weighted` returns), V = Q B: the Nystrom extension G(p, L) U S^-1/2 B over
        the landmarks L, equal to V on the source points and stable for any sigma (the
        ridge-free regulariser of CPD, where :meth:`interpolate` divides by sigma)."""
        b = torch.linalg.lstsq(self.q.double(), v.double()).solution
        w = (self.proj.double() @ b).to(v.dtype)
        out = [
            gaussian_kernel(points[s : s + chunk], self.landmarks, self.config.rho) @ w
            for s in range(0, points.shape[0], chunk)
        ]
        return torch.cat(out) if out else points.new_zeros((0, v.shape[1]))

    def interpolate(
        self, v: torch.Tensor, points: torch.Tensor, chunk: int = 4096
    ) -> torch.Tensor:
        """Offsets at new points p (n, d): V(p) = G(p, Y) C with C = (sigma I + G)^-1 V."""
        c = (v - self.q @ (self.inner @ (self.q.T @ v))) / self.sigma
        out = [
            gaussian_kernel(points[s : s + chunk], self.y, self.config.rho) @ c
            for s in range(0, points.shape[0], chunk)
        ]
        return torch.cat(out) if out else points.new_zeros((0, v.shape[1]))
