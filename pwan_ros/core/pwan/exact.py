"""Exact PW discrepancies of small discrete sets by linear programming (POT), the reference
against which the KR estimates are checked. Cost = Euclidean distance (Wasserstein-1 family).

Memory/time are O(q r) / LP: use up to a few thousand points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy.spatial.distance import cdist

from ..errors import PwanInputError
from ..preprocess import clean_pair


@dataclass(frozen=True)
class ExactDiscrepancy:
    """LP solution. value: the discrepancy (caller units x mass). plan: (q, r) transport plan
    (reference rows, source columns). transported: total mass moved. source_matched (r,) /
    reference_matched (q,): fraction of each point's mass that is transported (0 = omitted)."""

    value: float
    plan: np.ndarray
    transported: float
    source_matched: np.ndarray
    reference_matched: np.ndarray


def _ot():
    """POT, imported on first use (the registration itself never needs it)."""
    import ot
    import ot.partial

    return ot


def _prepare(reference, source, mass_reference, mass_source):
    ref, src, m_alpha, m_beta = clean_pair(reference, source, mass_reference, mass_source)
    q, r = ref.shape[0], src.shape[0]
    a = np.full(q, m_alpha / q)
    b = np.full(r, m_beta / r)
    return ref, src, a, b, cdist(ref, src)


def _result(value, plan, a, b):
    return ExactDiscrepancy(
        value=float(value),
        plan=plan,
        transported=float(plan.sum()),
        source_matched=plan.sum(axis=0) / b,
        reference_matched=plan.sum(axis=1) / a,
    )


def exact_mass_discrepancy(
    reference,
    source,
    mass: float,
    mass_reference: Optional[float] = None,
    mass_source: Optional[float] = None,
) -> ExactDiscrepancy:
    """L_M,m(alpha, beta) = min over plans moving mass m of sum pi_ij |x_i - y_j| (eq. POT_primal).

    reference (q, d), source (r, d); total masses default to q and r. 0 < m <= min(m_alpha,
    m_beta). With m_alpha = m_beta = m this is W1."""
    ref, src, a, b, cost = _prepare(reference, source, mass_reference, mass_source)
    total = min(a.sum(), b.sum())
    if not (mass is not None and 0 < mass <= total * (1 + 1e-9)):
        raise PwanInputError(f'mass must be in (0, {total:g}], got {mass!r}')
    mass = min(float(mass), total)
    if abs(a.sum() - b.sum()) <= 1e-12 * total and abs(mass - total) <= 1e-12 * total:
        plan = _ot().emd(a, b, cost, numItermax=10_000_000)
    else:
        plan = _ot().partial.partial_wasserstein(a, b, cost, m=mass, nb_dummies=1)
    return _result((plan * cost).sum(), plan, a, b)


def exact_distance_discrepancy(
    reference,
    source,
    distance_threshold: float,
    mass_reference: Optional[float] = None,
    mass_source: Optional[float] = None,
) -> ExactDiscrepancy:
    """L_D,h(alpha, beta) = min over sub-plans of sum pi_ij (|x_i - y_j| - h) (eq. POT_primal_lag).

    Solved as a balanced LP with one dummy point per side (mass m_beta on the reference side,
    m_alpha on the source side, zero cost to/from dummies): untransported mass goes to a dummy."""
    ref, src, a, b, cost = _prepare(reference, source, mass_reference, mass_source)
    h = distance_threshold
    if h is None or not (np.isfinite(h) and h > 0):
        raise PwanInputError(f'distance_threshold must be positive, got {h!r}')
    q, r = cost.shape
    big = np.zeros((q + 1, r + 1))
    big[:q, :r] = cost - h
    a2 = np.append(a, b.sum())
    b2 = np.append(b, a.sum())
    full = _ot().emd(a2, b2, big, numItermax=10_000_000)
    plan = full[:q, :r]
    return _result((plan * (cost - h)).sum(), plan, a, b)


def exact_w1(reference, source) -> ExactDiscrepancy:
    """Wasserstein-1 between the two sets as probability measures (uniform weights 1/q, 1/r)."""
    return exact_mass_discrepancy(reference, source, 1.0, mass_reference=1.0, mass_source=1.0)
