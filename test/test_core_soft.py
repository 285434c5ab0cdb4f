"""The soft-correspondence stage of non-rigid registrations (:mod:`pwan_ros.core.finetune.soft`:
the polish of the fine-tuned field and CPD from the start) on known deformations, and its place
in :func:`register`."""

import dataclasses
import os

import numpy as np
import pytest
import torch

from _core_shapes import blob
from pwan_ros.core import RegistrationConfig, register
from pwan_ros.core.config import CoherenceConfig, FineTuneConfig
from pwan_ros.core.finetune.objective import Selection, Transform
from pwan_ros.core.finetune.soft import (
    EM,
    cpd_from_start,
    cpd_variance,
    outlier_fraction,
    soft_coherence,
    soft_polish,
    soft_stage,
)


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
    res = soft_polish(y, ref, Transform(np.eye(3), np.zeros(3), v0), coh, w, EM(100, 1e-6))
    start = _mse(y + v0, x)
    end = _mse(y @ res.a + res.t + res.v, x)
    assert end < 0.05 * start, end / start
    s2_start = float(np.mean(np.min(np.sum((ref[:, None] - (y + v0)[None]) ** 2, 2), 0))) / 3
    assert res.s2 <= s2_start


def _with_outliers(x, ratio, seed=1):
    rng = np.random.default_rng(seed)
    return np.vstack((x, rng.uniform(x.min(0), x.max(0), size=(int(ratio * len(x)), x.shape[1]))))


def test_cpd_variance_is_the_mean_over_all_pairs():
    rng = np.random.default_rng(0)
    z, ref = rng.normal(size=(7, 3)), 2.0 * rng.normal(size=(11, 3)) + 1.0
    brute = float(np.mean(np.sum((ref[:, None] - z[None]) ** 2, 2))) / 3
    assert cpd_variance(z, ref) == pytest.approx(brute, rel=1e-12)


def test_extend_reproduces_a_smooth_field_on_the_source():
    """The Nystrom extension of a field of the kernel's span (what the EM's M-step returns) equals
    it on the source points, with CPD's ridge-free regulariser, and varies smoothly between
    them."""
    y, x = _deformed(300)
    coh = soft_coherence(y, CoherenceConfig(), 2.0, 2.0, seed=0, ridge=1e-6)
    v = coh.solve_weighted(torch.full((300,), 100.0, dtype=torch.float64), torch.as_tensor(x - y))
    yt = torch.as_tensor(y)
    assert torch.allclose(coh.extend(v, yt), v, atol=1e-6 * float(v.abs().max()))
    step = coh.extend(v, yt + 1e-3) - coh.extend(v, yt)
    assert float(step.abs().max()) < 1e-2 * float(v.abs().max())


def test_cpd_from_start_recovers_the_deformation_at_any_scale():
    """CPD from the pose as given, with as many uniform outliers as true points (w their known
    share), recovers the deformation, and the same in metres 50x larger 30 m away: its outlier
    term is a density over the reference's bounding box and its kernel follows the source's
    spread, so the relative error does not depend on the units."""
    y, x = _deformed(400)
    ref = _with_outliers(x, 1.0)
    w = outlier_fraction(len(x), len(ref))
    rels = []
    for scale, offset in ((1.0, 0.0), (50.0, np.array([30.0, -4.0, 2.0]))):
        ys, xs = y * scale + offset, x * scale + offset
        ft = FineTuneConfig(soft_beta=2.0, soft_lambda=2.0, soft_iterations=100)
        ft = dataclasses.replace(ft, tolerance=1e-6 * scale)
        res, interp = cpd_from_start(ys, ref * scale + offset, ft, CoherenceConfig(), w, 0)
        rels.append(_mse(ys @ res.a + res.t + res.v, xs) / _mse(ys, xs))
        v = interp(torch.as_tensor(res.v), torch.as_tensor(ys)).numpy()
        assert np.allclose(v, res.v, atol=1e-6 * scale)
    assert rels[0] < 0.02, rels
    assert rels[1] == pytest.approx(rels[0], rel=1e-3)


def _config(**finetune):
    """The configuration the soft stage reads (its finetune, coherence and seed 0)."""
    return RegistrationConfig(transform='nonrigid', seed=0, finetune=FineTuneConfig(**finetune))


def _stage(y, ref, a, v, n_matched, from_start=True):
    w = outlier_fraction(n_matched, len(ref))
    d = y.shape[1]
    return soft_stage(
        y,
        ref,
        Transform(a, np.zeros(d), v),
        _config(soft_from_start=from_start),
        Selection('mass', n_matched, 0.0),
        w,
    )


def test_soft_stage_keeps_cpd_when_the_fine_tune_is_in_a_wrong_basin():
    """A fine-tuned field left a quarter turn off (a wrong local optimum): the polish stays
    there, CPD from the initial pose (the truth's) finds the deformation, and the stage keeps
    it by its lower partial nearest-neighbour objective."""
    y, x = _deformed(400)
    ref = _with_outliers(x, 0.5)
    quarter = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    out = _stage(y, ref, quarter, np.zeros_like(y), len(x))
    assert out.origin == 'cpd'
    assert out.objectives['cpd'] < out.objectives['polish']
    o = out.outcome
    assert _mse(y @ o.a + o.t + o.v, x) < 0.02 * _mse(y, x)
    only = _stage(y, ref, quarter, np.zeros_like(y), len(x), from_start=False)
    assert only.origin == 'polish' and set(only.objectives) == {'polish'}
    assert _mse(y @ only.outcome.a + only.outcome.t + only.outcome.v, x) > 0.5 * _mse(y, x)
    assert out.iterations > only.iterations


def test_soft_stage_keeps_the_polish_when_it_fits_better():
    """From the true field, the polish ends at the deformation and is kept unless CPD from the
    start fits the reference at least as closely."""
    y, x = _deformed(400)
    ref = _with_outliers(x, 1.0)
    out = _stage(y, ref, np.eye(3), x - y, len(x))
    assert out.objectives[out.origin] == min(out.objectives.values())
    o = out.outcome
    assert _mse(y @ o.a + o.t + o.v, x) < 0.05 * _mse(y, x)


def test_outlier_fraction_is_the_unmatched_share():
    assert outlier_fraction(500, 1100) == pytest.approx(600 / 1100)
    assert outlier_fraction(500, 500) == 0.01  # clipped: the uniform term never vanishes
    assert outlier_fraction(0, 10) == 0.99


@pytest.mark.heavy
def test_register_polish_beats_nearest_neighbour_field_in_metres():
    """A deformed blob in metres (x5, 40 m away) against its twin with 60 % uniform outliers: the
    registration with the polish (the default) ends closer to the true correspondences than the
    nearest-neighbour fine-tune alone, same seed. Measured (300 steps): 3e-8 against 0.064 m^2
    (600 steps: 3e-8 against 0.0065; 0.58 before registration)."""
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
                'steps': 300,
                'finetune': {'soft_iterations': its},
            }
        )
        res = register(y * scale + offset, np.vstack((x, out)) * scale + offset, cfg)
        errs[its] = _mse(res.transformed_source, x * scale + offset)
    assert errs[100] < 0.3 * errs[0], errs


DATA = os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'data', 'nonrigid', 'bcpd')


def _unrotated(y, x):
    """y turned about its centroid by the rotation of its best similarity to x (known
    correspondences), as ``bench_nonrigid.py --unrotate`` does."""
    a, b = y - y.mean(0), x - x.mean(0)
    u, _, vt = np.linalg.svd(b.T @ a)
    sign = np.ones(y.shape[1])
    sign[-1] = np.sign(np.linalg.det(u @ vt))
    return a @ (u @ np.diag(sign) @ vt).T + y.mean(0)


@pytest.mark.slow
@pytest.mark.parametrize('shape', ['fish', 'monkey'])
def test_bcpd_pair_with_outliers_in_metres(shape):
    """A bcpd pair (../shared/data; rotation removed, 500 corresponding points, fish all 91)
    against its deformed twin with 60 % uniform outliers, in metres (x3, 20 m away), m-PWAN with
    the true mass. Measured (bench_nonrigid.py, three draws, standardised units): fish 5e-6,
    monkey 4.5e-6; pycpd from identity 0.047 / 0.085; the polish alone 0.023 / 6e-6. Asserted:
    below 1e-3 in standardised units."""
    y = np.loadtxt(os.path.join(DATA, f'{shape}-y.txt'))
    x = np.loadtxt(os.path.join(DATA, f'{shape}-x.txt'))
    y = _unrotated(y, x)
    rng = np.random.default_rng(7)
    idx = rng.choice(len(y), size=min(500, len(y)), replace=False)
    src, ref = y[idx], x[idx]
    out = rng.uniform(ref.min(0), ref.max(0), size=(int(round(0.6 * len(idx))), ref.shape[1]))
    src = (src - src.mean(0)) / src.std()
    ref_all = np.vstack((ref, out))
    ref_all = (ref_all - ref_all.mean(0)) / ref_all.std()
    offset = np.array([20.0, -5.0, 1.0])[: y.shape[1]]
    cfg = RegistrationConfig.from_dict({'transform': 'nonrigid', 'mass': float(len(idx))})
    res = register(src * 3.0 + offset, ref_all * 3.0 + offset, cfg)
    err = _mse(res.transformed_source, ref_all[: len(idx)] * 3.0 + offset) / 9.0
    assert res.status == 'ok'
    assert err < 1e-3, err


def test_cpd_from_start_on_a_sample_of_a_large_set(monkeypatch):
    """Above ``WIDE_POINTS`` source points CPD from the start runs on a random sample and its
    field is extended to every source point: from a wrong fine-tuned basin the stage still keeps
    it, and the extended field recovers the deformation on the points it did not see."""
    from pwan_ros.core.finetune import soft

    monkeypatch.setattr(soft, 'WIDE_POINTS', 600)
    y, x = _deformed(900)
    ref = _with_outliers(x, 0.5)
    quarter = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    out = _stage(y, ref, quarter, np.zeros_like(y), len(x))
    assert out.origin == 'cpd'
    o = out.outcome
    assert o.v.shape == y.shape
    assert _mse(y @ o.a + o.t + o.v, x) < 0.02 * _mse(y, x)
    again = out.interpolate(torch.as_tensor(o.v), torch.as_tensor(y)).numpy()
    assert np.allclose(again, o.v, atol=1e-9)


def test_soft_stage_on_small_sets_starts_no_threads(thread_starts):
    """Asked for every core (``workers=-1``, what the fine-tune passes), the stage's k-d tree
    queries of a few hundred rows stay on the calling thread: scipy starts its worker threads
    anew on every query, which on a 16-core machine cost more than the search (9488 threads for
    one non-rigid registration before)."""
    y, x = _deformed(300)
    ref = _with_outliers(x, 0.5)
    out = soft_stage(
        y,
        ref,
        Transform(np.eye(3), np.zeros(3), np.zeros_like(y)),
        _config(),
        Selection('mass', len(x), 0.0),
        0.3,
        workers=-1,
    )
    assert out.iterations > 2
    assert thread_starts == []
