"""A deformation judged as a deformation: the fit it buys and how it bends the source locally.

Measured from the data alone (source, reference, the deformed source, its affine part), in units
of the sets' point spacing and in angles:

- ``explained``: the fraction of the deformed source within the gate of the reference (a few
  point spacings), and the same for the source under the affine part alone;
- ``local turn``: the neighbourhood (its ``NEIGHBOURS`` nearest source points) of each source
  point the deformation lays within the gate (what it claims to match), as the affine part would
  carry it, against where the deformation puts it: the angle of the best rotation between the two
  (Kabsch); a fold of a surface is a turn near 180 deg;
- ``local strain``: what that rotation leaves unexplained, relative to the neighbourhood's size
  (a neighbourhood torn apart or crushed onto a point), and never to less than a neighbourhood
  at the sets' resolution: a scan samples its detail densely (a body scan's hands: 10 points
  a fraction of a spacing apart), and how a deformation lays points out below the spacing the
  sets resolve is noise, not a tear.

A deformation that turns most of the shape locally by a large angle is making up for a wrong
pose (the affine part should carry a common turn); one that tears most neighbourhoods has
scrambled the correspondences.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from ..preprocess import median_spacing

NEIGHBOURS = 10
#: neighbourhood turned over TURN_DEG from its affine part, torn over TORN_STRAIN (relative)
TURN_DEG = 45.0
TORN_STRAIN = 0.5
#: refused when over these fractions of the source: a coherent deformation of an articulated
#: shape turns its limbs, not most of it (the SHREC'19 bodies' right results: at most 7 % turned,
#: 1 % torn; those making up for a wrong pose: 8-56 % turned, 6-55 % torn)
MAX_TURNED = 0.15
MAX_TORN = 0.05
#: refused when the median neighbourhood turns over this (deg): the affine part should carry a
#: turn the whole shape shares (right bodies: at most 11 deg; the bcpd shapes 14 deg)
MAX_TURN_MEDIAN = 20.0
#: refused when under this fraction of the deformed source lies within the gate of the reference
MIN_EXPLAINED = 0.25
#: the gate: this many times the larger median nearest-neighbour spacing of the two sets
GATE_SPACINGS = 3.0
#: neighbourhoods measured at most at this many source points (a random subset)
MEASURED_POINTS = 4000
#: a neighbourhood's size (root sum of squared offsets from its mean) is taken as at least this
#: many median point spacings times sqrt(NEIGHBOURS + 1), as if its points lay a spacing from
#: their mean: the sets' resolution (a typical neighbourhood measures about twice that, so only
#: over-dense ones are raised). The SHREC'19 scans with 43k-vertex hands: their right
#: deformations onto other people (MSE 0.001-0.007 of no registration's) tore 5-9 % by the
#: neighbourhoods' own size, at most 4.5 % with the floor; the 78 dev verdicts are unchanged.
RESOLUTION_SPACINGS = 1.0


@dataclass(frozen=True)
class DeformationCheck:
    """Measurements of a deformation (see the module). Angles in degrees; fractions in [0, 1];
    gate in the data's units."""

    explained: float  # deformed source within the gate of the reference
    explained_affine: float  # the source under the affine part alone
    turn_median: float  # median local turn (deg)
    turned: float  # fraction of points turned locally by over TURN_DEG
    strain_median: float  # median local strain (relative)
    torn: float  # fraction of points strained over TORN_STRAIN
    gate: float
    status: str = 'ok'
    reason: str = ''

    def as_dict(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self).items()}


def _batched_kabsch(p: np.ndarray, q: np.ndarray, floor: float = 0.0):
    """Per point i the rotation R_i (det +1) minimising |p_i R_i^T - q_i|: its angle (deg) and the
    relative residual |q_i - p_i R_i^T| / max(|q_i|, floor) for (n, k, d) centred neighbourhood
    offsets (``floor``: the size of a neighbourhood at the sets' resolution, data units)."""
    h = np.einsum('nki,nkj->nij', p, q)
    u, _, vt = np.linalg.svd(h)
    d = np.sign(np.linalg.det(np.einsum('nij,njk->nik', u, vt)))
    u[:, :, -1] *= d[:, None]
    r = np.einsum('nij,njk->nik', u, vt).transpose(0, 2, 1)  # q ~ p @ r^T
    if p.shape[2] == 2:
        angle = np.degrees(np.arctan2(r[:, 1, 0], r[:, 0, 0]))
    else:
        tr = np.einsum('nii->n', r)
        angle = np.degrees(np.arccos(np.clip((tr - 1.0) / 2.0, -1.0, 1.0)))
    resid = np.linalg.norm(q - np.einsum('nkj,nij->nki', p, r), axis=(1, 2))
    size = np.maximum(np.linalg.norm(q, axis=(1, 2)), max(floor, 1e-300))
    return np.abs(angle), resid / size


def measure_deformation(
    source: np.ndarray,
    reference: np.ndarray,
    deformed: np.ndarray,
    affine: np.ndarray,
    seed: int = 0,
) -> DeformationCheck:
    """source, deformed (n, d): the same points before and after; reference (m, d); affine
    (d+1, d+1): the deformation's affine part. Units are the data's; nothing depends on them."""
    d = source.shape[1]
    rng = np.random.default_rng(seed)
    at = np.arange(len(source))
    if len(at) > MEASURED_POINTS:
        at = np.sort(rng.choice(len(at), MEASURED_POINTS, replace=False))
    spacing = max(median_spacing(source), median_spacing(reference))
    gate = GATE_SPACINGS * spacing
    posed = source @ affine[:d, :d].T + affine[:d, d]
    tree = cKDTree(reference)
    on = tree.query(deformed[at], distance_upper_bound=gate)[0] <= gate
    explained = float(np.mean(on))
    explained_affine = float(np.mean(tree.query(posed[at], distance_upper_bound=gate)[0] <= gate))
    if on.any():  # neighbourhoods the deformation lays on the reference: what it claims
        at = at[on]
    k = min(NEIGHBOURS, len(source) - 1)
    _, nb = cKDTree(source).query(source[at], k=k + 1)
    p = posed[nb] - posed[nb].mean(axis=1, keepdims=True)
    q = deformed[nb] - deformed[nb].mean(axis=1, keepdims=True)
    turn, strain = _batched_kabsch(p, q, floor=RESOLUTION_SPACINGS * np.sqrt(k + 1) * spacing)
    check = DeformationCheck(
        explained=explained,
        explained_affine=explained_affine,
        turn_median=float(np.median(turn)),
        turned=float(np.mean(turn > TURN_DEG)),
        strain_median=float(np.median(strain)),
        torn=float(np.mean(strain > TORN_STRAIN)),
        gate=float(gate),
    )
    why = deformation_refusal(check)
    return check if not why else dataclasses.replace(check, status='refused', reason=why)


def deformation_refusal(check: DeformationCheck) -> str:
    """Why the measured deformation is refused ('' if it is not)."""
    if check.explained < MIN_EXPLAINED:
        return (
            f'it puts only {check.explained:.0%} of the source within {check.gate:.3g} of the '
            'reference (nothing it fits)'
        )
    torn = check.torn > MAX_TORN
    if (check.turned > MAX_TURNED or check.turn_median > MAX_TURN_MEDIAN) and not (
        torn and check.torn >= check.turned
    ):
        return (
            f'it turns {check.turned:.0%} of the source by over {TURN_DEG:g} deg from its affine '
            f'part (median {check.turn_median:.0f} deg): it makes up for a wrong pose'
        )
    if torn:
        return (
            f'it tears {check.torn:.0%} of the neighbourhoods apart (the correspondences are '
            'scrambled)'
        )
    return ''
