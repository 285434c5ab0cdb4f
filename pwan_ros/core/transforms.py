"""Parametric transforms T_theta(y) = y A + t + V (eq. our_transformation), row-vector convention.

Points are (n, d) tensors in the internal normalised frame, d in {2, 3}.
rigid: A = R^T with R from a unit quaternion (3-D, stored unnormalised, normalised on use) or an
angle (2-D). affine: A free. nonrigid: A, t and per-point offsets V (r, d) of the source set.
"""
from __future__ import annotations

import abc

from typing import Optional, Tuple

import torch
from torch import nn


def quaternion_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices (..., 3, 3), column convention, of quaternions (..., 4) = (w, x, y, z)
    (normalised here)."""
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    return torch.stack((
        torch.stack((1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)), -1),
        torch.stack((2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)), -1),
        torch.stack((2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)), -1),
    ), -2)


def matrix_to_quaternion(r: torch.Tensor) -> torch.Tensor:
    """Unit quaternion (w, x, y, z) of a rotation matrix (3, 3) (Shepperd's method)."""
    r = r.detach().double().cpu()
    tr = float(r[0, 0] + r[1, 1] + r[2, 2])
    diag = [float(r[i, i]) for i in range(3)]
    k = max(range(4), key=lambda i: tr if i == 0 else diag[i - 1])
    if k == 0:
        s = 2.0 * (1.0 + tr) ** 0.5
        q = [0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
    elif k == 1:
        s = 2.0 * (1.0 + r[0, 0] - r[1, 1] - r[2, 2]) ** 0.5
        q = [(r[2, 1] - r[1, 2]) / s, 0.25 * s, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s]
    elif k == 2:
        s = 2.0 * (1.0 - r[0, 0] + r[1, 1] - r[2, 2]) ** 0.5
        q = [(r[0, 2] - r[2, 0]) / s, (r[0, 1] + r[1, 0]) / s, 0.25 * s, (r[1, 2] + r[2, 1]) / s]
    else:
        s = 2.0 * (1.0 - r[0, 0] - r[1, 1] + r[2, 2]) ** 0.5
        q = [(r[1, 0] - r[0, 1]) / s, (r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, 0.25 * s]
    q = torch.tensor([float(v) for v in q], dtype=torch.float64)
    return q / q.norm()


class Transform(nn.Module, abc.ABC):
    """T(y) = y A + t (+ V). ``forward(y, idx)``: y (n, d); idx (n,) rows of V for the points
    (nonrigid only; None = all r source points in order)."""

    kind = 'affine'

    def __init__(self, dim: int, num_points: int = 0):
        super().__init__()
        self.dim = dim
        self.t = nn.Parameter(torch.zeros(dim))

    @abc.abstractmethod
    def linear(self) -> torch.Tensor:
        """The (d, d) linear part A (row-vector convention, y A)."""

    def forward(self, y: torch.Tensor, idx: Optional[torch.Tensor] = None) -> torch.Tensor:
        return y @ self.linear() + self.t

    @abc.abstractmethod
    def set_linear(self, a: torch.Tensor) -> None:
        """Set the linear part to ``a`` (d, d) (the nearest valid one for constrained kinds)."""

    def affine_part(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(A (d, d), t (d,)) detached."""
        return self.linear().detach(), self.t.detach()


class RigidTransform(Transform):
    """Rotation (unit quaternion in 3-D, angle in 2-D) + translation."""

    kind = 'rigid'

    def __init__(self, dim: int, num_points: int = 0):
        super().__init__(dim)
        if dim == 3:
            self.q = nn.Parameter(torch.tensor([1.0, 0.0, 0.0, 0.0]))
        else:
            self.q = nn.Parameter(torch.zeros(1))

    def rotation(self) -> torch.Tensor:
        """R (d, d), column convention x = R y."""
        if self.dim == 3:
            return quaternion_to_matrix(self.q)
        c, s = torch.cos(self.q[0]), torch.sin(self.q[0])
        return torch.stack((torch.stack((c, -s)), torch.stack((s, c))))

    def linear(self) -> torch.Tensor:
        return self.rotation().T

    def set_linear(self, a: torch.Tensor) -> None:
        r = a.T
        with torch.no_grad():
            if self.dim == 3:
                self.q.copy_(matrix_to_quaternion(r).to(self.q))
            else:
                self.q.fill_(float(torch.atan2(r[1, 0], r[0, 0])))


class AffineTransform(Transform):
    """Free linear map A + translation."""

    kind = 'affine'

    def __init__(self, dim: int, num_points: int = 0):
        super().__init__(dim)
        self.a = nn.Parameter(torch.eye(dim))

    def linear(self) -> torch.Tensor:
        return self.a

    def set_linear(self, a: torch.Tensor) -> None:
        with torch.no_grad():
            self.a.copy_(a.to(self.a))


class NonrigidTransform(AffineTransform):
    """y A + t + V_j with V (r, d) offsets of the r source points."""

    kind = 'nonrigid'

    def __init__(self, dim: int, num_points: int):
        super().__init__(dim)
        self.v = nn.Parameter(torch.zeros(num_points, dim))

    def forward(self, y: torch.Tensor, idx: Optional[torch.Tensor] = None) -> torch.Tensor:
        v = self.v if idx is None else self.v[idx]
        return y @ self.a + self.t + v


def make_transform(kind: str, dim: int, num_points: int) -> Transform:
    """Factory for 'rigid' | 'affine' | 'nonrigid'."""
    return {'rigid': RigidTransform, 'affine': AffineTransform, 'nonrigid': NonrigidTransform}[kind](dim, num_points)
