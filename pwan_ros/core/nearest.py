"""Nearest-neighbour searches (and the PCA normals of a point's neighbours,
:func:`estimate_normals`): the fine-tune's search on a torch device (brute force, chunked) with
``finetune.nn='torch'``; the default, ``auto``, is the k-d tree on the host (:class:`HostNearest`:
small_gicp's for 3-D nearest neighbours, scipy's for the rest; see :func:`search_device`).

:class:`TorchNearest` answers the part of scipy's ``cKDTree.query`` interface the fine-tune uses
(``k``, ``distance_upper_bound``, ``workers``, ``n``): distances (n,) / (n, k) float64 and indices,
beyond the bound (strictly, as cKDTree: a neighbour counts when d < bound) inf and index ``n``.
Precision: the search runs in float32 on coordinates centred on the reference's centroid, so the
winner is a nearest neighbour up to float32 rounding (near-ties closer than ~1e-7 x the set's
extent may pick either point); the returned distance is recomputed in float64 for that winner, so
it is exact for the index returned (and the bound is applied to it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
from scipy.spatial import cKDTree

if TYPE_CHECKING:
    import torch

__all__ = [
    'CHUNK_ELEMENTS',
    'PARALLEL_QUERY_ROWS',
    'HostNearest',
    'TorchNearest',
    'estimate_normals',
    'make_search',
    'query_workers',
    'search_device',
]

#: elements (query rows x reference points) of one distance block: 64 MiB in float32
CHUNK_ELEMENTS = 1 << 24
#: scipy k-d tree queries of fewer rows run on one thread: scipy starts its worker threads anew on
#: every call, which costs more than the search (measured 2.6x slower for 2000 rows, none faster up
#: to 80k rows on 2 cores)
PARALLEL_QUERY_ROWS = 50_000
#: query rows of a block at least (a larger reference is searched in slices of CHUNK_ELEMENTS /
#: this)
MIN_BLOCK_ROWS = 256


#: a bounded query within this many median reference spacings runs in the k-d tree's bounded
#: search (:class:`HostNearest`)
BOUNDED_SPACINGS = 3.0
#: ... while under this share of the last such query's rows lay that near: more, and small_gicp's
#: search is as fast or faster (bunny at its truth, 89 % near: 1.45x slower in the bounded search;
#: lidar at 30 %: 0.95-1.15x; bench/bench_nearest.py). The share of the last query stands for the
#: next one's (a fine-tune's consecutive queries move the source little): no probe is paid for
NEAR_SHARE = 0.5
#: reference points the median spacing is measured on (a random subset beyond)
SPACING_SAMPLE = 2000


def median_spacing_of(tree: cKDTree, points: np.ndarray) -> float:
    """Median nearest-neighbour distance of up to :data:`SPACING_SAMPLE` of ``points`` (n, d),
    indexed by ``tree`` (0 with fewer than two points)."""
    if points.shape[0] < 2:
        return 0.0
    rng = np.random.default_rng(0)
    at = rng.choice(points.shape[0], min(SPACING_SAMPLE, points.shape[0]), replace=False)
    return float(np.median(tree.query(points[at], k=2)[0][:, 1]))


def query_workers(rows: int, workers: int = -1) -> int:
    """The ``workers`` argument for a scipy cKDTree query of ``rows`` points."""
    return 1 if rows < PARALLEL_QUERY_ROWS else workers


class TorchNearest:
    """Reference points (n, d) on ``device``; :meth:`query` finds their nearest to query rows."""

    def __init__(self, points: np.ndarray, device='cpu', chunk_elements: int = CHUNK_ELEMENTS):
        import torch  # here, not at the top: the host search (the default) needs no torch

        self.data = np.asarray(points, dtype=np.float64)
        self.n = int(self.data.shape[0])
        self.device = torch.device(device)
        self.center = self.data.mean(axis=0) if self.n else np.zeros(self.data.shape[1])
        self.chunk = int(chunk_elements)
        self._ref64 = torch.as_tensor(self.data - self.center, device=self.device)
        self._ref32 = self._ref64.to(torch.float32)

    def query(
        self,
        x,
        k: int = 1,
        eps: float = 0.0,
        p: float = 2.0,
        distance_upper_bound: float = np.inf,
        workers: int = 1,
    ):
        """(distances, indices) of the ``k`` nearest reference points of each row of x (m, d), as
        cKDTree.query (eps, p and workers are accepted for the interface; the search is exact
        Euclidean). k = 1: (m,) arrays, else (m, k), nearest first."""
        import torch

        x = np.asarray(x, dtype=np.float64)
        m = x.shape[0]
        kk = int(min(k, self.n))
        q64 = torch.as_tensor(x - self.center, device=self.device)
        q32 = q64.to(torch.float32)
        ref_step = max(1, min(self.n, self.chunk // MIN_BLOCK_ROWS))
        row_step = max(1, self.chunk // ref_step)
        idx = torch.empty((m, kk), dtype=torch.int64, device=self.device)
        for r0 in range(0, m, row_step):
            rows = q32[r0 : r0 + row_step]
            best_d = best_i = None
            for c0 in range(0, self.n, ref_step):
                # direct differences (no |x|^2 + |y|^2 - 2xy expansion, which cancels
                # catastrophically for points far from the origin relative to their spacing)
                dist = torch.cdist(
                    rows,
                    self._ref32[c0 : c0 + ref_step],
                    compute_mode='donot_use_mm_for_euclid_dist',
                )
                if kk == 1:
                    d_c, i_c = dist.min(dim=1, keepdim=True)
                else:
                    d_c, i_c = torch.topk(dist, min(kk, dist.shape[1]), dim=1, largest=False)
                i_c = i_c + c0
                if best_d is None:
                    best_d, best_i = d_c, i_c
                elif kk == 1:
                    closer = d_c < best_d  # strict: on equal distances the earlier slice wins
                    best_d, best_i = (
                        torch.where(closer, d_c, best_d),
                        torch.where(closer, i_c, best_i),
                    )
                else:
                    # earlier chunks first: on equal distances the lower index wins, as in a sorted
                    # scan
                    d_all, i_all = torch.cat((best_d, d_c), 1), torch.cat((best_i, i_c), 1)
                    order = torch.sort(d_all, dim=1, stable=True)[1][:, :kk]
                    best_d, best_i = torch.gather(d_all, 1, order), torch.gather(i_all, 1, order)
            idx[r0 : r0 + row_step] = best_i
        # exact float64 distance of each winner, and the bound on it
        diff = q64[:, None, :] - self._ref64[idx]
        dist = torch.sqrt((diff * diff).sum(-1))
        if kk > 1:
            dist, order = torch.sort(dist, dim=1, stable=True)
            idx = torch.gather(idx, 1, order)
        dist, idx = dist.cpu().numpy(), idx.cpu().numpy()
        if kk < k:  # fewer points than k: pad as cKDTree does
            dist = np.hstack((dist, np.full((m, k - kk), np.inf)))
            idx = np.hstack((idx, np.full((m, k - kk), self.n, dtype=np.int64)))
        if np.isfinite(distance_upper_bound):
            far = ~(dist < distance_upper_bound)
            dist[far] = np.inf
            idx[far] = self.n
        if k == 1:
            return dist[:, 0], idx[:, 0]
        return dist, idx


class HostNearest:
    """scipy's k-d tree over reference points (n, d) (``tree``), whose 3-D nearest-neighbour
    queries (k = 1) small_gicp's k-d tree answers: exact as well, and about 2x faster for the
    fine-tune's queries of 2000 rows (0.30 against 0.66 ms on one thread), which were most of a
    24-start tournament's fine-tunes. Other queries go to ``tree``. Same interface as
    :class:`TorchNearest` (``n``, :meth:`query`).

    ``workers`` of a query is the caller's thread budget (-1: every core): small_gicp's OpenMP
    threads are kept between calls, so it uses them at any size (2000 rows: 0.54 -> 0.35 ms on
    two threads); scipy starts its threads on every call, so its queries under
    :data:`PARALLEL_QUERY_ROWS` rows stay on one.

    A query bounded within :data:`BOUNDED_SPACINGS` of the reference's median point spacing
    (``spacing``) goes to ``tree`` while most rows of the last such query lay farther
    (:data:`NEAR_SHARE`): its bounded search gives up on a row as soon as nothing can be that
    near, small_gicp's has no bound. The fine-tune's distance-type pass from a pose that puts most
    of the source off the reference (bench/bench_nearest.py): an indoor fragment pair, 25k rows,
    144 against 9 ms; bunny, 40k rows, 374 against 20 ms. The answers are the same."""

    def __init__(self, points: np.ndarray):
        points = np.ascontiguousarray(points, dtype=np.float64)
        self.tree = cKDTree(points)
        self.n = self.tree.n
        self.data = self.tree.data  # the points (n, d), as cKDTree.data
        self._fast = None
        if points.ndim == 2 and points.shape[1] == 3 and points.shape[0] > 0:
            import small_gicp

            self._fast = small_gicp.KdTree(points, num_threads=1)
        self.spacing = median_spacing_of(self.tree, points)
        self._near_share = 1.0  # of the last query bounded within BOUNDED_SPACINGS

    def query(self, x, k: int = 1, distance_upper_bound: float = np.inf, workers: int = 1):
        """As ``cKDTree.query``: distances and indices, beyond the bound (d >= bound) inf and
        index ``n``."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if k != 1 or self._fast is None or x.ndim != 2 or x.shape[1] != 3:
            rows = (x.shape[0] if x.ndim == 2 else 1) * k
            return self._tree_query(x, k, distance_upper_bound, query_workers(rows, workers))
        near = distance_upper_bound <= BOUNDED_SPACINGS * self.spacing
        if near and self._near_share < NEAR_SHARE:
            dist, idx = self._tree_query(
                x, 1, distance_upper_bound, query_workers(len(x), workers)
            )
        else:
            threads = (os.cpu_count() or 1) if workers == -1 else max(int(workers), 1)
            idx, sq = self._fast.batch_nearest_neighbor_search(x, num_threads=threads)
            idx = np.asarray(idx, dtype=np.intp).reshape(-1)
            dist = np.sqrt(np.asarray(sq, dtype=np.float64).reshape(-1))
            far = ~(dist < distance_upper_bound)
            if far.any():
                dist[far] = np.inf
                idx[far] = self.n
        if near and len(x):
            self._near_share = float(np.mean(np.isfinite(dist)))
        return dist, idx

    def _tree_query(self, x, k: int, bound: float, workers: int):
        return self.tree.query(x, k=k, distance_upper_bound=bound, workers=workers)


def estimate_normals(
    points: np.ndarray, tree: cKDTree, k: int = 10, workers: int = 1
) -> np.ndarray:
    """Unit normals (n, d) by PCA of the k nearest neighbours (smallest-eigenvalue direction)."""
    k = int(min(k, points.shape[0]))
    _, nn = tree.query(points, k=k, workers=query_workers(points.shape[0] * k, workers))
    nb = points[nn]  # (n, k, d)
    nb = nb - nb.mean(axis=1, keepdims=True)
    cov = np.einsum('nki,nkj->nij', nb, nb)
    _, vec = np.linalg.eigh(cov)
    return vec[:, :, 0]


def make_search(points: np.ndarray, device=None):
    """A :class:`HostNearest` over ``points`` (device None), else a :class:`TorchNearest` on
    ``device``."""
    if device is None:
        return HostNearest(points)
    return TorchNearest(points, device)


def search_device(nn: str, device: torch.device):
    """The device of the fine-tune's search for ``finetune.nn`` and the registration's device, or
    None for a k-d tree on the host: auto = the k-d tree on every device. The fine-tune's steps
    run on the host, so a search on CUDA pays two copies and a synchronisation per iteration; on
    an H200 it made the 24-start tournament's fine-tunes 2.6x slower than the host's k-d tree
    (docs/benchmarks.md, device check)."""
    if nn == 'torch':
        return device
    return None
