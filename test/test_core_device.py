"""The registration on the device under check: ``PWAN_TEST_DEVICE`` (e.g. ``cuda``, ``cuda:1``,
``cpu``; default: cuda when torch sees one, else cpu). On CUDA the steps run as CUDA graphs of
eager kernels (``compile='auto'``) or compiled (``compile='on'``); the results must agree with the
CPU's. bench/device_check.sh runs this file with ``PWAN_TEST_DEVICE=cuda`` (the suite's CUDA
tests)."""

import os

import numpy as np
import pytest
import torch

from _core_shapes import blob, curve2d, knobbed_blob, rot3, rot_err_deg
from pwan_ros.core import RegistrationConfig, register

DEVICE = os.environ.get('PWAN_TEST_DEVICE') or ('cuda' if torch.cuda.is_available() else 'cpu')
#: on the CPU a test below that repeats a test_core_register test exactly (the same data,
#: configuration and checks) is slow only: on a GPU it is the device's check and stays fast
ON_CPU_SAME_AS_CORE_REGISTER = pytest.mark.slow if DEVICE == 'cpu' else pytest.mark.heavy
R_TRUE = rot3(30, -20, 25)
T_TRUE = np.array([0.3, -0.2, 0.5])


def _device_ok():
    if DEVICE.startswith('cuda'):
        assert torch.cuda.is_available(), f'PWAN_TEST_DEVICE={DEVICE} but torch sees no CUDA'


def _device_pair(n: int):
    """(source, reference) blobs of ``n`` points apart by (R_TRUE, T_TRUE), once the device is
    known to exist."""
    _device_ok()
    return blob(n, 1), blob(n, 0) @ R_TRUE.T + T_TRUE


# on the CPU: test_core_register's test_rigid_recovery[mass-0.0-rot0]
@ON_CPU_SAME_AS_CORE_REGISTER
def test_rigid_on_the_device_agrees_with_the_cpu():
    src, ref = _device_pair(500)
    on_dev = register(src, ref, RegistrationConfig(seed=0, device=DEVICE))
    on_cpu = register(src, ref, RegistrationConfig(seed=0, device='cpu'))
    assert on_dev.device.split(':')[0] == DEVICE.split(':')[0]
    assert rot_err_deg(on_dev.transform[:3, :3], R_TRUE) < 0.5
    assert np.linalg.norm(on_dev.transform[:3, 3] - T_TRUE) < 0.01
    # different kernels, same optimum: the fine-tune ends within a small fraction of a degree
    assert rot_err_deg(on_dev.transform[:3, :3], on_cpu.transform[:3, :3]) < 0.2
    assert on_dev.converged


@pytest.mark.slow
def test_eager_and_compiled_steps_agree_on_the_device():
    """compile='on' (off by default): inductor builds the graphs, 45 s of CPU on a CPU device,
    so `make test-slow` and bench/device_check.sh (which runs this file whole) run it."""
    src, ref = _device_pair(400)
    compiled = register(src, ref, RegistrationConfig(seed=1, device=DEVICE, compile='on'))
    eager = register(src, ref, RegistrationConfig(seed=1, device=DEVICE))
    assert rot_err_deg(compiled.transform[:3, :3], R_TRUE) < 0.5
    assert rot_err_deg(compiled.transform[:3, :3], eager.transform[:3, :3]) < 0.2


# on the CPU: test_core_register's test_multistart_tournament_selects_by_overlap[mass]
@ON_CPU_SAME_AS_CORE_REGISTER
def test_tournament_on_the_device():
    """A 120-degree rotation, 100 % outliers: the lock-step multi-start on the device finds it
    (which start wins is the optimiser's business: the identity start alone may reach it too)."""
    _device_ok()
    rot = rot3(0, 0, 120) @ rot3(10, 0, 0)
    src = knobbed_blob(500, 1)
    ref = knobbed_blob(500, 0) @ rot.T + T_TRUE
    rng = np.random.default_rng(3)
    ref = np.vstack((ref, rng.uniform(ref.min(0), ref.max(0), size=(500, 3))))
    cfg = RegistrationConfig(seed=0, starts=4, start_steps=40, start_keep=1, device=DEVICE)
    res = register(src, ref, cfg)
    assert rot_err_deg(res.transform[:3, :3], rot) < 1.0
    assert np.linalg.norm(res.transform[:3, 3] - T_TRUE) < 0.02


# on the CPU: test_core_register's test_nonrigid_recovers_smooth_deformation
@ON_CPU_SAME_AS_CORE_REGISTER
def test_nonrigid_on_the_device():
    _device_ok()
    rng = np.random.default_rng(0)
    x = curve2d(200, 0)
    ref = x + 0.15 * np.stack((np.sin(2 * x[:, 1]), np.cos(2 * x[:, 0])), 1)
    ref_o = np.vstack((ref, rng.uniform(ref.min(0), ref.max(0), size=(60, 2))))
    cfg = RegistrationConfig(
        transform='nonrigid', mass_ratio=1.0, seed=0, steps=300, device=DEVICE
    )
    res = register(x, ref_o, cfg)
    before = np.mean(np.sum((x - ref) ** 2, 1))
    after = np.mean(np.sum((res.transformed_source - ref) ** 2, 1))
    assert res.displacement is not None and res.displacement.shape == x.shape
    assert after < 0.3 * before


def test_device_search_agrees_with_the_kdtree():
    """finetune.nn=torch: the brute-force search on the device finds the k-d tree's neighbours
    (points in metres, 500 m from the origin), within the bound and beyond it."""
    from scipy.spatial import cKDTree

    from pwan_ros.core.nearest import TorchNearest

    _device_ok()
    rng = np.random.default_rng(3)
    ref = rng.uniform(-20.0, 20.0, size=(6000, 3)) + 500.0
    qry = ref[rng.choice(6000, 2000, replace=False)] + rng.normal(0.0, 0.05, size=(2000, 3))
    qry[:100] += 100.0  # far from the reference: beyond the bound
    tree, dev = cKDTree(ref), TorchNearest(ref, DEVICE)
    d_t, i_t = tree.query(qry, k=2)
    d_d, i_d = dev.query(qry, k=2)
    np.testing.assert_allclose(d_d, d_t, rtol=0, atol=1e-9)
    assert (i_d == i_t).mean() > 0.999  # float32 near-ties may pick the other of two points
    d_t, i_t = tree.query(qry, k=1, distance_upper_bound=1.0)
    d_d, i_d = dev.query(qry, k=1, distance_upper_bound=1.0)
    assert np.array_equal(np.isinf(d_d), np.isinf(d_t)) and np.isinf(d_d[:100]).all()
    assert np.array_equal(i_d[:100], np.full(100, 6000))
    np.testing.assert_allclose(d_d[100:], d_t[100:], rtol=0, atol=1e-9)


@pytest.mark.heavy
def test_window_graphs_agree_with_launched_steps():
    """cuda_graphs (each window of Alg. 1 steps one captured CUDA graph) against the same run
    launched step by step: rigid multi-start (autograd inside the graph, lock-step starts) and
    non-rigid (coherence, device learning-rate table), in metres 40 m from the origin. On a GPU the
    capture must not fall back (no warning); on the CPU the option does nothing (each
    registration then runs once, and is checked against the truth)."""
    import warnings

    from pwan_ros.core.pwan import acceleration

    _device_ok()
    rot = rot3(0, 0, 100) @ rot3(15, 0, 0)
    src = 3.0 * knobbed_blob(400, 1)
    ref = 3.0 * knobbed_blob(400, 0) @ rot.T + np.array([40.0, -12.0, 3.0])
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='CUDA graph capture')
        cfg = RegistrationConfig(seed=0, starts=4, start_steps=40, start_keep=1, device=DEVICE)
        graphs = register(src, ref, cfg)
    # on the CPU cuda_graphs does nothing: the launched run would repeat the same computation
    on_cuda = DEVICE.startswith('cuda')
    launched = register(src, ref, cfg.replace(cuda_graphs=False)) if on_cuda else graphs
    for res in (graphs, launched):
        assert rot_err_deg(res.transform[:3, :3], rot) < 1.0
        assert np.linalg.norm(res.transform[:3, 3] - [40.0, -12.0, 3.0]) < 0.05
    assert rot_err_deg(graphs.transform[:3, :3], launched.transform[:3, :3]) < 0.3
    assert graphs.iterations > 2 * cfg.window  # replays ran, not only the eager first window

    x = 5.0 * curve2d(200, 0) + 30.0
    target = x + 0.75 * np.stack((np.sin(0.4 * x[:, 1]), np.cos(0.4 * x[:, 0])), 1)
    ncfg = RegistrationConfig(transform='nonrigid', mass_ratio=1.0, seed=0, device=DEVICE)
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='CUDA graph capture')
        g_nr = register(x, target, ncfg)
    l_nr = register(x, target, ncfg.replace(cuda_graphs=False)) if on_cuda else g_nr
    before = np.mean(np.sum((x - target) ** 2, 1))
    for res in (g_nr, l_nr):
        assert np.mean(np.sum((res.transformed_source - target) ** 2, 1)) < 0.3 * before
    gap = g_nr.transformed_source - l_nr.transformed_source
    assert np.sqrt(np.mean(np.sum(gap**2, 1))) < 0.1
    assert not acceleration._GRAPH_FAILED  # no earlier test of the process fell back either
