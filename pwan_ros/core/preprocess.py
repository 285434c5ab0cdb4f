"""Input validation, cleaning, downsampling and normalisation of point sets (numpy only)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
from scipy.spatial import cKDTree

from pwan_ros.geometry.outliers import FAR_OUTLIER_FACTOR, far_outliers
from pwan_ros.geometry.voxels import voxel_grid

from .errors import PwanInputError


@dataclass(frozen=True)
class CleanPoints:
    """A validated point set. points: (n, d) float64 finite rows; valid: (N,) bool mask of kept
    input rows; dropped: number of input rows with NaN/inf removed; core: (n,) bool mask of the
    rows used in the estimation (all but far outliers, see :data:`FAR_OUTLIER_FACTOR`)."""

    points: np.ndarray
    valid: np.ndarray
    dropped: int
    core: Optional[np.ndarray] = None

    @property
    def fit(self) -> np.ndarray:
        """(k, d) the rows used in the estimation."""
        return self.points if self.core is None else self.points[self.core]

    @property
    def num_far(self) -> int:
        return 0 if self.core is None else int((~self.core).sum())


def clean_points(points, name: str) -> CleanPoints:
    """Validate an (N, d) array-like, d in {2, 3}; drop non-finite rows with a warning; mark far
    outliers (left out of the estimation, with a warning).

    Raises :class:`PwanInputError` for wrong shapes/dims, non-numeric data, or fewer than 3
    distinct finite points.
    """
    try:
        arr = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PwanInputError(f'{name}: not a numeric array ({exc})') from None
    if arr.ndim != 2:
        raise PwanInputError(f'{name}: expected an (N, 2) or (N, 3) array, got shape {arr.shape}')
    if arr.shape[1] not in (2, 3):
        raise PwanInputError(f'{name}: points must have 2 or 3 coordinates, got {arr.shape[1]}')
    if arr.shape[0] == 0:
        raise PwanInputError(f'{name}: empty point set')
    valid = np.isfinite(arr).all(axis=1)
    dropped = int((~valid).sum())
    if dropped:
        warnings.warn(
            f'{name}: dropped {dropped} of {arr.shape[0]} rows containing NaN/inf',
            RuntimeWarning,
            stacklevel=3,
        )
    pts = arr[valid]
    if pts.shape[0] < 3:
        raise PwanInputError(f'{name}: need at least 3 finite points, got {pts.shape[0]}')
    far = far_outliers(pts)
    core = ~far
    n_distinct = _count_distinct(pts[core])
    if n_distinct < 3:
        raise PwanInputError(
            f'{name}: degenerate point set: {n_distinct} distinct point(s) among {pts.shape[0]} '
            f'finite ones (need at least 3)'
        )
    if far.any():
        median = np.median(pts, axis=0)
        r_max = float(np.linalg.norm(pts[far] - median, axis=1).max())
        warnings.warn(
            f'{name}: {int(far.sum())} of {pts.shape[0]} points lie more than '
            f'{FAR_OUTLIER_FACTOR:g}x the median spread from the median (up to {r_max:.3g} from '
            'it, in the input units) and are left out of the estimation',
            RuntimeWarning,
            stacklevel=3,
        )
    return CleanPoints(points=pts, valid=valid, dropped=dropped, core=core if far.any() else None)


def _count_distinct(points: np.ndarray, k: int = 3) -> int:
    """min(k, number of distinct rows) in O(n k) without sorting."""
    rest = points
    found = 0
    while rest.shape[0] and found < k:
        found += 1
        rest = rest[(rest != rest[0]).any(axis=1)]
    return found


def check_rank(points: np.ndarray, transform: str, name: str) -> None:
    """Raise :class:`PwanInputError` when ``points`` (n, d) cannot determine a ``transform``:
    rigid needs points not all on one line, affine / non-rigid (an affine part) needs them to span
    all d dimensions. Relative tolerance 1e-9 of the largest extent."""
    d = points.shape[1]
    c = points - points.mean(axis=0)
    sv = np.linalg.svd(c[:: max(1, c.shape[0] // 20000)], compute_uv=False)
    rank = int((sv > 1e-9 * sv[0]).sum()) if sv[0] > 0 else 0
    need = 2 if transform == 'rigid' else d
    if rank < need:
        shape = 'collinear' if rank == 1 else ('coplanar' if rank == 2 else 'coincident')
        raise PwanInputError(
            f'{name}: degenerate point set: all points are {shape}, which cannot determine '
            f'{ {"rigid": "a rigid", "affine": "an affine"}.get(transform, "a non-rigid") } '
            'transform'
            + (' (planar data: give it as N x 2)' if shape == 'coplanar' and d == 3 else '')
        )


def voxel_downsample(points: np.ndarray, voxel: float) -> np.ndarray:
    """Centroid of the points in each occupied voxel of edge ``voxel`` (same units as points),
    the grid anchored at the set's lowest corner (:func:`pwan_ros.geometry.voxels.voxel_grid`).

    Returns (k, d), k <= n, ordered by voxel key (deterministic)."""
    if voxel is None or voxel <= 0:
        return points
    try:
        return voxel_grid(points, voxel, origin=points.min(axis=0)).centroids
    except ValueError as exc:
        raise PwanInputError(str(exc)) from None


def random_subset(points: np.ndarray, max_points: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``max_points`` rows drawn without replacement (all rows when fewer)."""
    if max_points <= 0 or points.shape[0] <= max_points:
        return points
    idx = np.sort(rng.choice(points.shape[0], size=max_points, replace=False))
    return points[idx]


def median_spacing(points: np.ndarray) -> float:
    """Median distance from each point to its nearest other point (same units as points)."""
    if points.shape[0] < 2:
        return 0.0
    d, _ = cKDTree(points).query(points, k=2)
    return float(np.median(d[:, 1]))


@dataclass(frozen=True)
class Normaliser:
    """Similarity map into the internal frame: p_n = (p - center) / scale, per set.

    source_center / reference_center: (d,) caller units. scale: caller units per normalised unit
    (common to both sets, so distances scale uniformly)."""

    source_center: np.ndarray
    reference_center: np.ndarray
    scale: float

    def source(self, p: np.ndarray) -> np.ndarray:
        return (p - self.source_center) / self.scale

    def reference(self, p: np.ndarray) -> np.ndarray:
        return (p - self.reference_center) / self.scale

    def denormalise_reference(self, p: np.ndarray) -> np.ndarray:
        return p * self.scale + self.reference_center

    def to_caller(self, a_mat: np.ndarray, t_vec: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Convert a normalised row-vector map y_n -> y_n A + t into the caller frame.

        Returns (M, b) with x = M @ y + b for column vectors in caller units."""
        m = a_mat.T
        b = self.scale * t_vec + self.reference_center - m @ self.source_center
        return m, b


def make_normaliser(
    source: np.ndarray, reference: np.ndarray, align_centroids: bool
) -> Normaliser:
    """Centre the reference on its centroid; the source on its own centroid when
    ``align_centroids`` (cold start) or on the reference centroid (warm start keeps ``init``).
    Scale = RMS distance of the reference to its centroid (unit-RMS internal frame)."""
    rc = reference.mean(axis=0)
    sc = source.mean(axis=0) if align_centroids else rc
    scale = float(np.sqrt(((reference - rc) ** 2).sum(axis=1).mean()))
    src_scale = float(np.sqrt(((source - source.mean(axis=0)) ** 2).sum(axis=1).mean()))
    scale = max(scale, src_scale)
    if not np.isfinite(scale) or scale <= 0:
        raise PwanInputError('degenerate point sets: all points coincide')
    return Normaliser(source_center=sc, reference_center=rc, scale=scale)


def homogeneous(m: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(d+1, d+1) homogeneous matrix from linear part (d, d) and translation (d,)."""
    d = m.shape[0]
    out = np.eye(d + 1)
    out[:d, :d] = m
    out[:d, d] = b
    return out


def check_init(init: Optional[np.ndarray], dim: int) -> Optional[np.ndarray]:
    """Validate an initial (dim+1, dim+1) homogeneous transform (source -> reference frame)."""
    if init is None:
        return None
    try:
        arr = np.asarray(init, dtype=np.float64)
    except (TypeError, ValueError):
        raise PwanInputError('init: not a numeric matrix') from None
    if arr.shape != (dim + 1, dim + 1):
        raise PwanInputError(
            f'init: expected a {dim + 1}x{dim + 1} homogeneous transform, got shape {arr.shape}'
        )
    if not np.isfinite(arr).all():
        raise PwanInputError('init: contains NaN/inf')
    return arr


def clean_pair(reference, source, mass_reference=None, mass_source=None):
    """Validated (reference (q, d), source (r, d), m_alpha, m_beta) for a discrepancy between two
    point sets of the same dimension; total masses default to the point counts."""
    ref = clean_points(reference, 'reference').points
    src = clean_points(source, 'source').points
    if ref.shape[1] != src.shape[1]:
        raise PwanInputError(f'reference is {ref.shape[1]}-D but source is {src.shape[1]}-D')
    m_alpha = float(ref.shape[0] if mass_reference is None else mass_reference)
    m_beta = float(src.shape[0] if mass_source is None else mass_source)
    if not (m_alpha > 0 and m_beta > 0):
        raise PwanInputError('total masses must be positive')
    return ref, src, m_alpha, m_beta
