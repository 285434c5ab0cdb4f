"""How fits are compared: the overlap score of a pose (:class:`OverlapScorer`, the multi-start's
selection criterion; :func:`overlap_score` on caller-frame points) and the distinct poses among
ranked placements (:func:`distinct_poses`)."""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from ..finetune.objective import FineTuneData

__all__ = ['OverlapScorer', 'distinct_poses', 'overlap_score']


class OverlapScorer:
    """Selection criterion of the multi-start: the distance-type partial objective of the
    nearest-neighbour plan (eq. our_primal with the NN plan, sum_j min(d_j - h, 0)) at the
    resolution-derived threshold h = 2 x the median nearest-neighbour spacing of the dense
    fine-tune reference, on up to 2000 dense source points, as mean(min(d_j, h)) / h in [0, 1]
    (lower = more of the source lies on the reference). Unlike the fixed-mass NN objective it does
    not charge a candidate for the points outside the overlap, and uniform outliers are too sparse
    at this scale to be matched by chance."""

    def __init__(self, data: 'FineTuneData', seed: int, cap: int = 2000):
        rng = np.random.default_rng(seed + 29)
        n = data.ys.shape[0]
        self.ys = data.ys[rng.choice(n, size=min(cap, n), replace=False)]
        self.tree = data.tree
        m = data.xr.shape[0]
        probe = data.xr[rng.choice(m, size=min(cap, m), replace=False)]
        self.h = 2.0 * max(float(np.median(data.tree.query(probe, k=2)[0][:, 1])), 1e-12)

    def __call__(self, a: np.ndarray, t: np.ndarray) -> float:
        # searched within h only: farther points count h either way, and their search is slow
        dist, _ = self.tree.query(self.ys @ a + t, k=1, distance_upper_bound=self.h)
        return float(np.minimum(dist, self.h).mean() / self.h)


def overlap_score(points: np.ndarray, reference: np.ndarray, seed: int = 0) -> float:
    """:class:`OverlapScorer` on caller-frame points as they are: points (n, d), reference (m, d);
    0 = every point lies on the reference, 1 = none does."""
    d = points.shape[1]
    scorer = OverlapScorer(FineTuneData(points, reference, cKDTree(reference), None), seed)
    return scorer(np.eye(d), np.zeros(d))


def distinct_poses(placements: list, tol: float, keep: int) -> list:
    """Indices of up to ``keep`` placements (each (n, d), the same points moved by a candidate
    pose, best first) whose RMS distance to every earlier kept one exceeds ``tol`` (caller
    units)."""
    kept: list = []
    for i, z in enumerate(placements):
        if len(kept) == keep:
            break
        if all(np.sqrt(np.mean(np.sum((z - placements[j]) ** 2, 1))) > tol for j in kept):
            kept.append(i)
    return kept
