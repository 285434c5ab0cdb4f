"""Fine-tune objective (eq. fine_tune): sum_j s_j |x_N(j) - T(y_j)| + C(theta), minimised by
alternating nearest-neighbour search (scipy cKDTree) and closed-form steps.

s_j = 1 for the m nearest pairs (mass type, Topk) or for pairs closer than h (distance type).
The sum of (unsquared) distances is minimised by iteratively re-weighted least squares: with
weights w_j = s_j / (2 max(d_j, eps)) the weighted squared problem majorises it, and is solved in
closed form: weighted Kabsch (rigid), weighted linear least squares (affine), and for non-rigid
alternately the affine part and V from the coherence-regularised normal equations (Woodbury).
All arrays here are in the internal normalised frame, row-vector convention T(y) = y A + t + V.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from ..nearest import make_search, query_workers
from ..pwan.coherence import Coherence

__all__ = [
    'SAMPLE_REF_FACTOR',
    'FineTuneData',
    'FineTuneOutcome',
    'Selection',
    'Transform',
    'partial_objective',
    'point_to_plane_step',
    'run_finetune',
    'select_pairs',
    'weighted_affine',
    'weighted_kabsch',
]

#: reference points per source point in the multi-start's selection fine-tunes
SAMPLE_REF_FACTOR = 4


@dataclass
class FineTuneData:
    """Point sets the fine-tune runs on (normalised): source ys, reference xr, its search
    structure (a cKDTree, or the query interface of one: :class:`reference_cache.ScaledSearch`,
    :class:`nearest.TorchNearest`) and normals (rigid point-to-plane; None: point-to-point).
    Built once per registration and shared by all starts; device: where the search of a
    :meth:`subset` runs (None: k-d tree)."""

    ys: np.ndarray
    xr: np.ndarray
    tree: object
    normals: Optional[np.ndarray]
    device: Optional[object] = None

    def subset(self, cap: int, seed: int) -> 'FineTuneData':
        """At most ``cap`` source and ``SAMPLE_REF_FACTOR x cap`` reference points (0: all), with
        their normals: the data of the multi-start's selection fine-tunes. They only rank the
        candidates (the winner gets the dense fine-tune), and a sparser reference makes the search
        of every source point outside the overlap several times cheaper."""
        rng = np.random.default_rng(seed + 31)
        ys, xr, tree, normals = self.ys, self.xr, self.tree, self.normals
        if cap and ys.shape[0] > cap:
            ys = ys[np.sort(rng.choice(ys.shape[0], size=cap, replace=False))]
        if cap and xr.shape[0] > SAMPLE_REF_FACTOR * cap:
            idx = np.sort(rng.choice(xr.shape[0], size=SAMPLE_REF_FACTOR * cap, replace=False))
            xr = xr[idx]
            tree = make_search(xr, self.device)
            normals = None if normals is None else normals[idx]
        return FineTuneData(ys, xr, tree, normals, self.device)


class Transform(NamedTuple):
    """A transform in the normalised frame, row convention T(y) = y a + t (+ v): ``a`` (d, d),
    ``t`` (d,), ``v`` (n, d) the non-rigid offsets of the source points (None otherwise)."""

    a: np.ndarray
    t: np.ndarray
    v: Optional[np.ndarray] = None


class Selection(NamedTuple):
    """Which pairs the objective counts: ``divergence`` 'mass' (the ``count`` nearest source
    points) or 'distance' (those within ``h``, normalised units)."""

    divergence: str
    count: int
    h: float


@dataclass
class FineTuneOutcome:
    """a (d, d), t (d,), v (n, d) or None; selected (n,) bool; distances (n,) NN distances at
    the final transform (exact for the selected points, inf for points beyond the search radius);
    iterations run; converged (motion below tolerance)."""

    a: np.ndarray
    t: np.ndarray
    v: Optional[np.ndarray]
    selected: np.ndarray
    distances: np.ndarray
    iterations: int
    converged: bool


def select_pairs(dist: np.ndarray, divergence: str, count: int, h: float) -> np.ndarray:
    """s_j: the ``count`` smallest distances (mass) or distances <= h (distance); (n,) bool."""
    if divergence == 'mass':
        k = int(min(max(count, 1), dist.shape[0]))
        sel = np.zeros(dist.shape[0], dtype=bool)
        sel[np.argpartition(dist, k - 1)[:k]] = True
        return sel
    return dist <= h


def partial_objective(dist: np.ndarray, sel: np.ndarray, divergence: str, h: float) -> float:
    """Primal PW objective of a nearest-neighbour matching: sum of selected distances (mass type,
    fixed count) or sum over selected of (d - h) (distance type); lower is better."""
    if divergence == 'mass':
        return float(dist[sel].sum())
    return float((dist[sel] - h).sum())


def weighted_kabsch(p: np.ndarray, q: np.ndarray, w: np.ndarray):
    """R (d, d), t (d,) minimising sum w_j |R p_j + t - q_j|^2 (column convention)."""
    ws = w.sum()
    pc = (w[:, None] * p).sum(0) / ws
    qc = (w[:, None] * q).sum(0) / ws
    cov = ((p - pc) * w[:, None]).T @ (q - qc)
    u, _, vt = np.linalg.svd(cov)
    d = np.ones(p.shape[1])
    d[-1] = np.sign(np.linalg.det(vt.T @ u.T)) or 1.0
    r = vt.T @ np.diag(d) @ u.T
    return r, qc - r @ pc


def weighted_affine(p: np.ndarray, q: np.ndarray, w: np.ndarray):
    """A (d, d), t (d,) minimising sum w_j |p_j A + t - q_j|^2 (row convention)."""
    ph = np.hstack((p, np.ones((p.shape[0], 1))))
    sw = np.sqrt(w)[:, None]
    sol, *_ = np.linalg.lstsq(ph * sw, q * sw, rcond=None)
    return sol[:-1], sol[-1]


def point_to_plane_step(z: np.ndarray, target: np.ndarray, normals: np.ndarray, w: np.ndarray):
    """Linearised rigid increment (R (d, d), t (d,)) minimising sum w (n.(R z + t - x))^2."""
    d = z.shape[1]
    if d == 3:
        jac = np.hstack((np.cross(z, normals), normals))  # (n, 6): d/d(omega, t)
    else:
        jac = np.hstack(((z[:, 0] * normals[:, 1] - z[:, 1] * normals[:, 0])[:, None], normals))
    res = -((z - target) * normals).sum(1)
    jw = jac * w[:, None]
    lhs = jac.T @ jw
    lhs += 1e-9 * np.trace(lhs) * np.eye(lhs.shape[0])
    x = np.linalg.solve(lhs, jw.T @ res)
    if d == 3:
        omega = x[:3]
        ang = np.linalg.norm(omega)
        kx = np.array(
            [[0, -omega[2], omega[1]], [omega[2], 0, -omega[0]], [-omega[1], omega[0], 0]]
        )
        if ang > 1e-12:
            r = np.eye(3) + np.sin(ang) / ang * kx + (1 - np.cos(ang)) / ang**2 * kx @ kx
        else:
            r = np.eye(3) + kx
        return r, x[3:]
    c, s_ = np.cos(x[0]), np.sin(x[0])
    return np.array([[c, -s_], [s_, c]]), x[1:]


def _nearest(tree, z: np.ndarray, bound: float, need: int, workers: int):
    """Distance and index of the nearest tree point of each row of z (n, d), searched within
    ``bound`` (beyond: inf and index tree.n); rows left at inf are searched again without the bound
    when fewer than ``need`` rows were found (so the ``need`` smallest distances are always
    exact). workers: the thread budget (a cKDTree's small queries stay on one,
    :func:`nearest.query_workers`; the other searches decide themselves)."""
    raw = isinstance(tree, cKDTree)
    dist, nn = tree.query(
        z,
        k=1,
        workers=query_workers(z.shape[0], workers) if raw else workers,
        distance_upper_bound=bound,
    )
    if need and np.isfinite(bound) and int(np.isfinite(dist).sum()) < need:
        far = ~np.isfinite(dist)
        rows = int(far.sum())
        dist[far], nn[far] = tree.query(
            z[far], k=1, workers=query_workers(rows, workers) if raw else workers
        )
    return dist, nn


def run_finetune(
    data: FineTuneData,
    kind: str,
    start: Transform,
    selection: Selection,
    stop: tuple,
    coherence: Optional[Coherence] = None,
    workers: int = 1,
) -> FineTuneOutcome:
    """Minimise eq. fine_tune from ``start`` over ``data`` (normalised): the pairs of
    ``selection``; ``stop`` = (max_iterations, tolerance). With ``data.normals`` and kind ==
    'rigid', the distance to the nearest reference point is measured along its normal
    (point-to-plane, removes the sampling bias). coherence: the non-rigid regulariser."""
    src, ref_tree, ref, ref_normals = data.ys, data.tree, data.xr, data.normals
    a, t, v = start
    divergence, count, h = selection
    max_iterations, tolerance = stop
    a = np.array(a, dtype=np.float64)
    t = np.array(t, dtype=np.float64)
    if kind == 'nonrigid' and v is None:
        v = np.zeros_like(src)
    z = src @ a + t + (v if v is not None else 0.0)
    # IRLS floor: distances below the reference sampling resolution carry no information
    floor = 0.5 * float(np.median(ref_tree.query(ref[:2000], k=2, workers=1)[0][:, 1]))
    converged = False
    it = 0
    # search radius: only the selected pairs need their exact nearest neighbour, and a k-d tree
    # search for a point far from the reference surface (outside the overlap) is slow. Distance
    # type: the threshold h. Mass type: the count-th smallest distance of the last iteration plus
    # the largest point motion since, which bounds every new distance of the last selection.
    bound = np.nextafter(h, np.inf) if divergence == 'distance' else np.inf
    last = ref.shape[0] - 1
    for it in range(1, max_iterations + 1):
        dist, nn = _nearest(ref_tree, z, bound, count if divergence == 'mass' else 0, workers)
        sel = select_pairs(dist, divergence, count, h)
        if sel.sum() < src.shape[1] + 1:
            break
        eps = max(1e-9, floor)
        w = np.where(sel, 0.5 / np.maximum(dist, eps), 0.0)
        nn = np.minimum(nn, last)  # rows beyond the radius are unselected (weight 0)
        target = ref[nn]
        if kind == 'rigid' and ref_normals is not None:
            nrm = ref_normals[nn]
            pd = np.abs(((z - target) * nrm).sum(1))
            wp = np.where(sel, 0.5 / np.maximum(pd, max(1e-9, 0.1 * floor)), 0.0)
            dr, dt = point_to_plane_step(z, target, nrm, wp)
            a, t = a @ dr.T, t @ dr.T + dt
        elif kind == 'rigid':
            r, tc = weighted_kabsch(src, target, w)
            a, t = r.T, tc
        elif kind == 'affine':
            a, t = weighted_affine(src, target, w)
        else:
            a, t = weighted_affine(src, target - v, w)
            resid = target - (src @ a + t)
            v = coherence.solve_weighted(torch.as_tensor(w), torch.as_tensor(resid)).numpy()
        z_new = src @ a + t + (v if v is not None else 0.0)
        step = np.sqrt(((z_new - z) ** 2).sum(1))
        motion = float(np.sqrt((step**2).mean()))
        z = z_new
        if divergence == 'mass':
            bound = np.nextafter(float(dist[sel].max()) + float(step.max()), np.inf) * (1 + 1e-9)
        if motion < tolerance:
            converged = True
            break
    dist, _ = _nearest(ref_tree, z, bound, count if divergence == 'mass' else 0, workers)
    sel = select_pairs(dist, divergence, count, h)
    return FineTuneOutcome(
        a=a, t=t, v=v, selected=sel, distances=dist, iterations=it, converged=converged
    )
