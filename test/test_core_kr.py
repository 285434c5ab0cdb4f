"""KR estimates of the PW discrepancies against the exact LP (POT)."""
import dataclasses
import os

import numpy as np
import pytest

from pwan_ros.core import (PwanInputError, estimate_discrepancy, exact_distance_discrepancy, exact_mass_discrepancy,
                           exact_w1)
from pwan_ros.core.discrepancy import ESTIMATOR_POTENTIAL

DATA = os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'data')


def _clusters():
    """Source: one cluster; reference: a shifted copy-like cluster + a far outlier cluster."""
    rng = np.random.default_rng(0)
    y = rng.normal(size=(40, 2)) * 0.3
    x = np.vstack((rng.normal(size=(40, 2)) * 0.3 + [2.0, 0.5], rng.normal(size=(20, 2)) * 0.3 + [-1.0, 3.0]))
    return x, y


def _agreement(est, exact):
    omitted = np.concatenate((est.source_omitted, est.reference_omitted))
    unmatched = np.concatenate((exact.source_matched < 0.5, exact.reference_matched < 0.5))
    return float(np.mean(omitted == unmatched))


@pytest.mark.parametrize('kind,param', [('mass', 15.0), ('mass_closed_form', 15.0), ('distance', 2.5), ('w1', None)])
def test_kr_estimate_matches_lp_on_synthetic_sets(kind, param):
    x, y = _clusters()
    if kind == 'mass':
        exact = exact_mass_discrepancy(x, y, param)
        est = estimate_discrepancy(x, y, 'mass', mass=param, iterations=2000, seed=0)
    elif kind == 'mass_closed_form':   # h = -inf f (eq. app_final_m_eq2) instead of a learned h
        exact = exact_mass_discrepancy(x, y, param)
        cfg = dataclasses.replace(ESTIMATOR_POTENTIAL, h_mode='closed_form')
        est = estimate_discrepancy(x, y, 'mass', mass=param, iterations=2000, seed=0, config=cfg)
    elif kind == 'distance':
        exact = exact_distance_discrepancy(x, y, param)
        est = estimate_discrepancy(x, y, 'distance', distance_threshold=param, iterations=2000, seed=0)
    else:
        exact = exact_w1(x, y)
        est = estimate_discrepancy(x, y, 'mass', mass=1.0, mass_reference=1.0, mass_source=1.0, iterations=2000,
                                   seed=0)
    rel = abs(est.value - exact.value) / abs(exact.value)
    assert rel <= 0.01, (est.value, exact.value)
    assert _agreement(est, exact) >= 0.9
    assert est.source_grad_norm.shape == (40,) and est.reference_grad_norm.shape == (60,)


def test_estimator_rejects_bad_parameters():
    x, y = _clusters()
    with pytest.raises(PwanInputError):
        estimate_discrepancy(x, y, 'mass', mass=41.0, iterations=1)
    with pytest.raises(PwanInputError):
        estimate_discrepancy(x, y, 'distance', distance_threshold=-1.0, iterations=1)
    with pytest.raises(PwanInputError):
        estimate_discrepancy(x, y, 'kl', iterations=1)


@pytest.mark.slow
def test_kr_estimate_vs_lp_on_fish_with_outliers():
    """Real set (CPD fish, ../shared/data) + 50 % uniform outliers in the reference.

    Measured precision of the network estimate here is 3-18 % (below the LP value: the trained
    potential is a feasible, slightly sub-optimal dual point), not the paper's < 0.4 %; the
    small-mass case m = 30 is worse and not asserted (see docs/core.md, "Known gaps")."""
    d = os.path.join(DATA, 'nonrigid', 'bcpd')
    x = np.loadtxt(os.path.join(d, 'fish-x.txt'))
    y = np.loadtxt(os.path.join(d, 'fish-y.txt'))
    rng = np.random.default_rng(0)
    lo, hi = np.minimum(x.min(0), y.min(0)), np.maximum(x.max(0), y.max(0))
    x = np.vstack((x, rng.uniform(lo, hi, size=(45, 2))))
    cases = [('mass', 60.0), ('mass', 85.0), ('distance', 0.6), ('distance', 1.0), ('w1', None)]
    for kind, param in cases:
        if kind == 'mass':
            exact = exact_mass_discrepancy(x, y, param)
            est = estimate_discrepancy(x, y, 'mass', mass=param, iterations=3000)
        elif kind == 'distance':
            exact = exact_distance_discrepancy(x, y, param)
            est = estimate_discrepancy(x, y, 'distance', distance_threshold=param, iterations=3000)
        else:
            exact = exact_w1(x, y)
            est = estimate_discrepancy(x, y, 'mass', mass=1.0, mass_reference=1.0, mass_source=1.0, iterations=3000)
        rel = (est.value - exact.value) / abs(exact.value)
        assert rel <= 0.01, (kind, param, est.value, exact.value)        # never above the LP optimum
        assert abs(rel) <= 0.2, (kind, param, est.value, exact.value)
        assert _agreement(est, exact) >= 0.85, (kind, param)
