"""Parametric transforms T_theta(y) = y A + t + V (eq. our_transformation), row-vector convention.

Points are (S, n, d) tensors in the internal normalised frame, d in {2, 3}, for S starts
(:class:`BatchedTransform`). rigid: A = R^T with R from a quaternion (3-D, stored unnormalised,
normalised on use) or an angle (2-D). affine: A free. nonrigid: A, t and per-point offsets V
(r, d) of the source set.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn


def _quadratic_form() -> torch.Tensor:
    """(16, 9): R.ravel() = (q q^T).ravel() @ C / |q|^2 for a quaternion q = (w, x, y, z) (any
    norm)."""
    c = torch.zeros(4, 4, 3, 3, dtype=torch.float64)
    w, x, y, z = range(4)
    for k, sign in ((w, 1), (x, 1), (y, -1), (z, -1)):
        c[k, k, 0, 0] = sign
    for k, sign in ((w, 1), (x, -1), (y, 1), (z, -1)):
        c[k, k, 1, 1] = sign
    for k, sign in ((w, 1), (x, -1), (y, -1), (z, 1)):
        c[k, k, 2, 2] = sign
    # off-diagonal terms 2 (a b +- w e): each product appears twice in the symmetric q q^T
    for (i, j), (a, b), (e, sign) in (
        ((0, 1), (x, y), (z, -1)),
        ((1, 0), (x, y), (z, 1)),
        ((0, 2), (x, z), (y, 1)),
        ((2, 0), (x, z), (y, -1)),
        ((1, 2), (y, z), (x, -1)),
        ((2, 1), (y, z), (x, 1)),
    ):
        c[a, b, i, j] = c[b, a, i, j] = 1.0
        c[w, e, i, j] = c[e, w, i, j] = float(sign)
    return c.reshape(16, 9)


@functools.lru_cache(maxsize=None)
def _form(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return _quadratic_form().to(dtype=dtype, device=device)


def quaternion_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices (..., 3, 3), column convention, of quaternions (..., 4) = (w, x, y, z)
    (any non-zero norm): R = C(q q^T) / |q|^2 with the constant linear map C of the homogeneous
    quadratic form, a handful of tensor operations (and as many in backward)."""
    outer = q[..., :, None] * q[..., None, :]
    flat = outer.reshape(*q.shape[:-1], 16) / (q * q).sum(-1, keepdim=True)
    return (flat @ _form(q.dtype, q.device)).reshape(*q.shape[:-1], 3, 3)


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


class BatchedTransform(nn.Module):
    """S transforms y (S, n, d) -> y A_s + t_s (+ V_s[idx] for nonrigid): rigid (unit quaternion /
    2-D angle), affine, or nonrigid (affine + per-source-point offsets V (S, r, d))."""

    def __init__(
        self, kind: str, rotations: Sequence[np.ndarray], dtype: torch.dtype, num_points: int = 0
    ):
        super().__init__()
        self.kind = kind
        count, dim = len(rotations), rotations[0].shape[0]
        self.dim = dim
        rots = torch.as_tensor(
            np.stack(rotations), dtype=torch.float64
        )  # (S, d, d), column convention
        if kind in ('affine', 'nonrigid'):
            self.a = nn.Parameter(rots.transpose(1, 2).to(dtype).contiguous())
        elif dim == 3:
            self.q = nn.Parameter(torch.stack([matrix_to_quaternion(r) for r in rots]).to(dtype))
        else:
            self.q = nn.Parameter(torch.atan2(rots[:, 1, 0], rots[:, 0, 0])[:, None].to(dtype))
        self.t = nn.Parameter(torch.zeros(count, dim, dtype=dtype))
        if kind == 'nonrigid':
            self.v = nn.Parameter(torch.zeros(count, num_points, dim, dtype=dtype))

    def linear(self) -> torch.Tensor:
        """A_s (S, d, d), row-vector convention (y A), computed in closed form."""
        if self.kind != 'rigid':
            return self.a
        if self.dim == 3:
            return quaternion_to_matrix(self.q).transpose(1, 2)
        c, s = torch.cos(self.q[:, 0]), torch.sin(self.q[:, 0])
        return torch.stack((torch.stack((c, s), 1), torch.stack((-s, c), 1)), 1)

    def apply(
        self, y: torch.Tensor, a: torch.Tensor, idx: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """y (S, n, d) moved by linear part ``a`` (from :meth:`linear`) and t (+ V rows ``idx``;
        None = all r source points in order)."""
        z = torch.baddbmm(self.t[:, None, :], y, a)
        if self.kind == 'nonrigid':
            z = z + (self.v if idx is None else self.v[:, idx])
        return z

    def forward(self, y: torch.Tensor, idx: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.apply(y, self.linear(), idx)
