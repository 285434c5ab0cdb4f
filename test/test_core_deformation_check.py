"""The non-rigid self-check's tear measure (core/checks/deformation.py) on deformations built
exactly, in metres far from the origin: points laid out differently below the sets' resolution
are no tear (a body scan samples its hands a fraction of a spacing apart); points scrambled
across a few spacings are."""

import numpy as np

from pwan_ros.core.checks.deformation import MAX_TORN, measure_deformation

SPACING = 0.02  # m
OFFSET = np.array([300.0, -50.0, 20.0])  # m


def sheet(n: int = 40) -> np.ndarray:
    """(n*n, 3) a gently curved sheet sampled every SPACING, far from the origin."""
    u, v = np.meshgrid(np.arange(n) * SPACING, np.arange(n) * SPACING)
    u, v = u.ravel(), v.ravel()
    return np.stack((u, v, 0.1 * np.sin(3.0 * u)), 1) + OFFSET


def bend(p: np.ndarray) -> np.ndarray:
    """A smooth deformation (metres): the sheet bent by a few spacings."""
    q = p - OFFSET
    return p + 0.05 * np.stack((np.sin(2.0 * q[:, 1]), np.zeros(len(q)), np.sin(2.5 * q[:, 0])), 1)


def test_points_shuffled_below_the_sets_resolution_are_no_tear():
    """A sheet with a dense cluster on it (12 % of the points within a quarter spacing, as a
    scan's hand), bent smoothly, the cluster's points shuffled among themselves: where each lies
    in the cluster is below what the sets resolve. Measured against each neighbourhood's own size
    (the cluster's) 12 % of it was torn and the deformation refused."""
    rng = np.random.default_rng(0)
    base = sheet()
    centre = base[820]
    ball = rng.normal(size=(220, 3))
    ball *= (0.25 * SPACING * rng.uniform(size=(220, 1)) ** (1 / 3)) / np.linalg.norm(
        ball, axis=1, keepdims=True
    )
    source = np.vstack((base, centre + ball))
    deformed = bend(source)
    cluster = np.arange(len(base), len(source))
    deformed[cluster] = deformed[rng.permutation(cluster)]
    check = measure_deformation(source, deformed, deformed, np.eye(4))
    assert check.status == 'ok', check.reason
    assert check.torn <= MAX_TORN and check.explained == 1.0


def test_points_scrambled_across_a_few_spacings_are_a_tear():
    """The same sheet, bent, with a fifth of its points swapped pairwise with points 3-5 spacings
    away: the correspondences are scrambled at the sets' resolution, and the deformation is
    refused for it."""
    rng = np.random.default_rng(1)
    source = sheet()
    deformed = bend(source)
    chosen = rng.choice(len(source), len(source) // 10, replace=False)
    for i in chosen:
        dist = np.linalg.norm(source - source[i], axis=1)
        j = rng.choice(np.flatnonzero((dist > 3 * SPACING) & (dist < 5 * SPACING)))
        deformed[[i, j]] = deformed[[j, i]]
    check = measure_deformation(source, deformed, deformed, np.eye(4))
    assert check.status == 'refused' and 'tears' in check.reason, check
    assert check.torn > MAX_TORN
