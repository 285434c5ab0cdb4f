"""What a registration works on: the caller's :class:`Request`, its prepared :class:`Problem`
(validated sets, far outliers left out, the init applied, the mass resolved, the common
normalisation; caller units unless noted) and the adversarial stage's :class:`SampledProblem`
(normalised frame)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .config import RegistrationConfig
from .errors import PwanInputError
from .preprocess import (
    CleanPoints,
    Normaliser,
    check_init,
    check_rank,
    clean_points,
    far_outliers,
    make_normaliser,
    median_spacing,
)
from .reference_cache import ReferenceCache

__all__ = [
    'Problem',
    'Request',
    'SampledProblem',
    'finetune_set',
    'fit_reference',
    'prepare',
    'threshold',
]


@dataclass(frozen=True)
class Request:
    """A registration as the caller asked for it: ``source`` (N, d) and ``reference`` (M, d) as
    given (caller units), the configuration, ``init`` ((d+1, d+1) source -> reference, or None),
    the potential's warm start (``potential_state``), ``should_stop`` (polled by Alg. 1) and the
    reference's search structures kept across calls (``cache``, a :class:`ReferenceCache` or
    None). Every stage of :func:`api.register` takes it."""

    source: Any
    reference: Any
    config: RegistrationConfig
    init: Optional[np.ndarray] = None
    potential_state: Optional[dict] = None
    should_stop: Optional[Callable[[], bool]] = None
    cache: Optional[ReferenceCache] = None

    def with_(self, **changes) -> 'Request':
        """A copy with ``changes`` (config, init, cache, ...)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SampledProblem:
    """The adversarial stage's problem, normalised frame: ``ys`` (r, d) source and ``xs`` (q, d)
    reference points (voxel grid, then the random cap); ``mass``: the matched mass in sampled
    source points (mass type; None for the distance type); ``ref_mass``: the reference's total
    mass in that unit; ``h``: the threshold (distance type; None for the mass type); ``h_floor``:
    the lowest a learned h may go; ``device``: the torch device it runs on."""

    ys: np.ndarray
    xs: np.ndarray
    mass: Optional[float]
    ref_mass: float
    h: Optional[float]
    h_floor: float
    device: Any


@dataclass
class Problem:
    """Validated inputs shared by register/refine (caller units unless noted)."""

    src: CleanPoints
    ref: CleanPoints
    src_init: np.ndarray  # valid source points after the init transform
    init: np.ndarray  # (d+1, d+1)
    norm: Normaliser
    dim: int
    ratio_min: Optional[float]  # mass / min(N_s, N_r) (mass type)
    mass: Optional[float]

    @property
    def src_fit(self) -> np.ndarray:
        """Source points used in the estimation (far outliers left out), after the init
        transform."""
        return self.src_init if self.src.core is None else self.src_init[self.src.core]

    @property
    def ref_fit(self) -> np.ndarray:
        """Reference points used in the estimation (far outliers left out)."""
        return self.ref.fit


def prepare(source, reference, config: RegistrationConfig, init) -> Problem:
    src = clean_points(source, 'source')
    ref = clean_points(reference, 'reference')
    dim = src.points.shape[1]
    if ref.points.shape[1] != dim:
        raise PwanInputError(f'source is {dim}-D but reference is {ref.points.shape[1]}-D')
    init_m = check_init(init, dim)
    check_rank(src.fit, config.transform, 'source')
    check_rank(ref.fit, config.transform, 'reference')
    n_min = min(src.fit.shape[0], ref.fit.shape[0])
    ratio = mass = None
    if config.divergence == 'mass':
        if config.mass is not None:
            if config.mass > n_min:
                raise PwanInputError(
                    f'mass {config.mass:g} exceeds the smaller set ({n_min} valid points)'
                )
            mass = float(config.mass)
            ratio = mass / n_min
        else:
            ratio = config.effective_mass_ratio
            mass = ratio * n_min
    init_h = np.eye(dim + 1) if init_m is None else init_m
    src_init = src.points @ init_h[:dim, :dim].T + init_h[:dim, dim]
    prob = Problem(src, ref, src_init, init_h, None, dim, ratio, mass)
    prob.norm = make_normaliser(prob.src_fit, prob.ref_fit, align_centroids=init_m is None)
    return prob


def finetune_set(points: np.ndarray, cap: int, rng: np.random.Generator):
    """Indices of the points used in the fine-tune (all, or a random ``cap`` subset)."""
    n = points.shape[0]
    if cap and n > cap:
        return np.sort(rng.choice(n, size=cap, replace=False))
    return np.arange(n)


def threshold(config: RegistrationConfig, ref_points: np.ndarray) -> float:
    """Distance threshold h in caller units: given, or 2x the median NN spacing of
    ``ref_points``."""
    if config.distance_threshold is not None:
        return float(config.distance_threshold)
    h = 2.0 * median_spacing(ref_points)
    if not h > 0:
        raise PwanInputError(
            'cannot derive a distance threshold (duplicate reference points); set '
            'distance_threshold'
        )
    return h


def fit_reference(reference) -> np.ndarray:
    """The reference's finite rows without far outliers (m, d), as the estimation sees it."""
    ref = np.asarray(reference, dtype=np.float64)
    ref = ref[np.isfinite(ref).all(axis=1)]
    return ref[~far_outliers(ref)]
