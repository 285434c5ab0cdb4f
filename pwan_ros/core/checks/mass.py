"""The matched mass of an m-PWAN result, measured at its own pose (numpy / scipy only).

The mass type matches a given mass; a mass above the true overlap pulls the pose towards the
parts that do not overlap (bunny 090->180 at the default 0.8 against an overlap of about 0.45:
2-5 deg off), one below only drops constraints. :func:`measured_mass_ratio` estimates the overlap
a pose shows (:class:`OverlapMass` on dense subsets of both sets); :func:`refit_mass` fine-tunes
again at that mass while the estimate shrinks. Used by :func:`decide.mass_at_overlap` when the
mass is left to the default, and by the global search's winner.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy.spatial import cKDTree

from ..preprocess import random_subset

__all__ = ['MASS_PASSES', 'OverlapMass', 'measured_mass_ratio', 'refit_mass']

#: points of the source and of the reference the overlap is measured on (random subsets beyond)
MASS_SOURCE_POINTS = 20000
MASS_REFERENCE_POINTS = 80000

#: the matched source points' residual scale that still counts as overlap, in median residuals
MASS_SCALE = 5.0
#: further mass-type fine-tunes while the mass estimate shrinks
MASS_PASSES = 3
#: random places off the source's surfaces needed to measure the chance of a match
MIN_PROBES = 100
#: a measured mass this far below the one used changes nothing (fraction of the smaller set)
MASS_SLACK = 0.02


def measured_mass_ratio(
    source: np.ndarray,
    reference: cKDTree,
    pose: np.ndarray,
    voxel: float,
    cap: float = 1.0,
    seed: int = 0,
) -> float:
    """The overlap of ``source`` (n, d) at ``pose`` (d+1, d+1, source -> reference) as a mass
    ratio: the fraction of the source within :data:`MASS_SCALE` median residuals of the reference
    tree, the residuals being those of the points within 1.5 ``voxel`` (caller units), the scale
    floored at a tenth of a voxel (exact copies have residuals of 0) and capped at one (matches to
    outliers inflate the median); beyond chance (uniform outliers put a reference point near any
    place): ``(o - c) / (1 - c)`` with ``c`` the fraction of random places in the moved source's
    box, off its surfaces, that are as near (0 when fewer than :data:`MIN_PROBES` are off them);
    at most ``cap`` (an overlap measured otherwise), clipped to [0.05, 1]. A lidar scan's rings
    farther apart than the median residual do not shrink it: the scale follows the residuals."""
    dim = source.shape[1]
    moved = source @ pose[:dim, :dim].T + pose[:dim, dim]
    d, _ = reference.query(moved, k=1, distance_upper_bound=1.5 * voxel)
    near = d[np.isfinite(d)]
    if len(near):
        scale = min(max(MASS_SCALE * np.median(near), 0.1 * voxel), voxel)
        probes = np.random.default_rng(seed).uniform(
            moved.min(axis=0), moved.max(axis=0), size=moved.shape
        )
        off, _ = cKDTree(moved).query(probes, k=1, distance_upper_bound=scale)
        probes = probes[~np.isfinite(off)]  # places off the source's own surfaces
        chance = 0.0
        if len(probes) >= MIN_PROBES:
            dp, _ = reference.query(probes, k=1, distance_upper_bound=scale)
            chance = float(np.mean(np.isfinite(dp)))
        overlap = float(np.mean(d <= scale))
        beyond = (overlap - chance) / (1.0 - chance) if chance < 1.0 else 0.0
        cap = min(cap, beyond)
    return float(np.clip(cap, 0.05, 1.0))


def refit_mass(result, used: float, measure: Callable, fit: Callable):
    """Fine-tune ``result`` again at the mass its pose shows while that shrinks.

    used: the mass ratio ``result`` was fine-tuned at; measure(transform) -> mass ratio at that
    pose (:func:`measured_mass_ratio`); fit(transform, mass_ratio) -> a new result warm-started
    there. At most :data:`MASS_PASSES` fits; a result whose measured mass is not below ``used``
    by more than :data:`MASS_SLACK` is returned as it is."""
    for _ in range(MASS_PASSES):
        mass = measure(result.transform)
        if mass >= used - MASS_SLACK:
            break
        result, used = fit(result.transform, mass), mass
    return result


class OverlapMass:
    """:func:`measured_mass_ratio` of a pose on random subsets of ``source`` (n, d) and
    ``reference`` (m, d) (:data:`MASS_SOURCE_POINTS` / :data:`MASS_REFERENCE_POINTS`, drawn from
    ``rng`` in that order), at the judging ``voxel``, at most ``cap``. Call it with a (d+1, d+1)
    transform source -> reference."""

    def __init__(
        self,
        source: np.ndarray,
        reference: np.ndarray,
        voxel: float,
        rng: np.random.Generator,
        cap: float = 1.0,
        seed: int = 0,
    ):
        self.source = random_subset(source, MASS_SOURCE_POINTS, rng)
        self.tree = cKDTree(random_subset(reference, MASS_REFERENCE_POINTS, rng))
        self.voxel, self.cap, self.seed = voxel, cap, seed

    def __call__(self, transform: np.ndarray) -> float:
        return measured_mass_ratio(
            self.source, self.tree, transform, self.voxel, self.cap, self.seed
        )
