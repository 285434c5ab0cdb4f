"""The soft-correspondence polish of non-rigid registrations (:mod:`pwan_ros.core.soft_finetune`)
on known deformations, and its place in :func:`register`."""

import numpy as np
import pytest

from _core_shapes import blob
from pwan_ros.core import RegistrationConfig, register
from pwan_ros.core.config import CoherenceConfig
from pwan_ros.core.soft_finetune import outlier_fraction, soft_coherence, soft_polish


def _deformed(n, seed=0):
    """A blob (n, 3) and its smooth deformation (point i corresponds to point i)."""
    y = blob(n, seed)
    x = y + 0.12 * np.stack((np.sin(2 * y[:, 1]), np.cos(2 * y[:, 2]), np.sin(1.5 * y[:, 0])), 1)
    return y, x


def _mse(a, b):
    return float(np.mean(np.sum((a - b) ** 2, 1)))


@pytest.mark.parametrize('outliers', [0.0, 1.0])
def test_polish_recovers_the_deformation_from_halfway(outliers):
    """Started with half the true offsets, the EM steps reach the deformation, also with as many
    uniform outliers as true points (w = their known share); the variance never grows."""
    y, x = _deformed(400)
    rng = np.random.default_rng(1)
    out = rng.uniform(x.min(0), x.max(0), size=(int(outliers * len(x)), 3))
    ref = np.vstack((x, out))
    v0 = 0.5 * (x - y)
    coh = soft_coherence(y, CoherenceConfig(), 2.0, 2.0, seed=0)
    w = outlier_fraction(len(x), len(ref))
    res = soft_polish(y, ref, np.eye(3), np.zeros(3), v0, coh, w, 100, 1e-6)
    start = _mse(y + v0, x)
    end = _mse(y @ res.a + res.t + res.v, x)
    assert end < 0.05 * start, end / start
    s2_start = float(np.mean(np.min(np.sum((ref[:, None] - (y + v0)[None]) ** 2, 2), 0))) / 3
    assert res.s2 <= s2_start


def test_outlier_fraction_is_the_unmatched_share():
    assert outlier_fraction(500, 1100) == pytest.approx(600 / 1100)
    assert outlier_fraction(500, 500) == 0.01  # clipped: the uniform term never vanishes
    assert outlier_fraction(0, 10) == 0.99


@pytest.mark.heavy
def test_register_polish_beats_nearest_neighbour_field_in_metres():
    """A deformed blob in metres (x5, 40 m away) against its twin with 60 % uniform outliers: the
    registration with the polish (the default) ends closer to the true correspondences than the
    nearest-neighbour fine-tune alone, same seed. Measured: 0.013 against 0.092 m^2 (0.58 before
    registration)."""
    y, x = _deformed(400, 0)
    out = np.random.default_rng(0).uniform(x.min(0), x.max(0), size=(240, 3))
    scale, offset = 5.0, np.array([40.0, -12.0, 3.0])
    errs = {}
    for its in (0, 100):
        cfg = RegistrationConfig.from_dict(
            {
                'transform': 'nonrigid',
                'mass_ratio': 1.0,
                'seed': 0,
                'steps': 600,
                'finetune': {'soft_iterations': its},
            }
        )
        res = register(y * scale + offset, np.vstack((x, out)) * scale + offset, cfg)
        errs[its] = _mse(res.transformed_source, x * scale + offset)
    assert errs[100] < 0.3 * errs[0], errs
