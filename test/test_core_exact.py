"""Exact (LP) PW discrepancies: identities that pin down their definitions."""

import numpy as np
import ot
import pytest
from scipy.spatial.distance import cdist

from pwan_ros.core import (
    PwanInputError,
    exact_distance_discrepancy,
    exact_mass_discrepancy,
    exact_w1,
)


def _sets(seed=0):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(30, 2))
    x = np.vstack((y + 0.05 * rng.normal(size=y.shape), rng.uniform(-4, 4, size=(15, 2))))
    return x, y


def test_w1_matches_pot_emd2():
    x, y = _sets()
    e = exact_w1(x, y)
    ref = ot.emd2(np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y)), cdist(x, y))
    assert e.value == pytest.approx(ref, rel=1e-9)
    assert e.transported == pytest.approx(1.0)


def test_mass_discrepancy_moves_exactly_m_and_is_monotone():
    x, y = _sets()
    vals = []
    for m in (5, 15, 30):
        e = exact_mass_discrepancy(x, y, m)
        assert e.transported == pytest.approx(m, rel=1e-6)
        assert np.all(e.source_matched <= 1 + 1e-9) and np.all(e.reference_matched <= 1 + 1e-9)
        vals.append(e.value)
    assert vals[0] < vals[1] < vals[2]


def test_distance_discrepancy_is_legendre_dual_of_mass():
    """L_D,h = min_m L_M,m - h m (Lemma: L_M,m = sup_h L_D,h + h m)."""
    x, y = _sets(1)
    h = 0.3
    d = exact_distance_discrepancy(x, y, h)
    best = min(exact_mass_discrepancy(x, y, m).value - h * m for m in np.linspace(0.5, 30, 60))
    assert d.value <= best + 1e-6
    assert d.value == pytest.approx(best, abs=0.05 * abs(best))
    # only pairs closer than h are transported
    assert np.all(cdist(x, y)[d.plan > 1e-9] <= h + 1e-9)


def test_exact_rejects_bad_mass_and_threshold():
    x, y = _sets()
    with pytest.raises(PwanInputError):
        exact_mass_discrepancy(x, y, 31)
    with pytest.raises(PwanInputError):
        exact_distance_discrepancy(x, y, 0.0)
