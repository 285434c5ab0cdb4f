"""The lock-step multi-start ensemble: exact state mapping, no cross-talk between starts, and it
solves what a single start solves."""
import numpy as np
import torch

from _core_shapes import blob, rot3, rot_err_deg
from pwan_ros.core import RegistrationConfig
from pwan_ros.core.config import PotentialConfig
from pwan_ros.core.ensemble import EnsemblePotential, EnsembleTransform, run_ensemble
from pwan_ros.core.potential import PotentialNet
from pwan_ros.core.preprocess import make_normaliser


def test_member_state_is_a_potentialnet_with_identical_values():
    gen = torch.Generator().manual_seed(0)
    ens = EnsemblePotential(3, 3, PotentialConfig(), gen)
    x = torch.randn(3, 50, 3)
    raw = ens.raw(x)
    for i in range(3):
        net = PotentialNet(3, PotentialConfig())
        net.load_state_dict(ens.state(i))
        torch.testing.assert_close(net.raw(x[i]), raw[i], rtol=1e-5, atol=1e-6)
    # and back: a PotentialNet state loaded into member 1 reproduces that network
    ens.load_member_state(1, net.state())
    torch.testing.assert_close(ens.raw(x)[1], net.raw(x[1]), rtol=1e-5, atol=1e-6)


def test_transform_matches_rotation_convention():
    rots = [rot3(30, 0, 0), rot3(0, -45, 10)]
    tr = EnsembleTransform('rigid', rots, torch.float64)
    y = torch.randn(2, 20, 3, dtype=torch.float64)
    z = tr(y)
    for i, r in enumerate(rots):
        np.testing.assert_allclose(z[i].detach().numpy(), y[i].numpy() @ r.T, atol=1e-10)


def _sets(rot, n=300):
    """Normalised like register() does (centroids aligned, unit RMS)."""
    src = blob(n, 1)
    ref = blob(n, 0) @ rot.T + np.array([0.1, -0.05, 0.0])
    norm = make_normaliser(src, ref, align_centroids=True)
    return norm.source(src), norm.reference(ref)


def test_starts_do_not_interact():
    """Member 0 follows the same path whatever the other members do (sum of independent
    objectives, element-wise Adam)."""
    ys, xs = _sets(rot3(20, 0, 0))
    cfg = RegistrationConfig(warmup_updates=20).resolved()
    a, _, _ = run_ensemble(cfg, torch.device('cpu'), ys, xs, 0.8 * len(ys), None,
                           [np.eye(3), rot3(90, 0, 0)], 15, seed=4)
    b, _, _ = run_ensemble(cfg, torch.device('cpu'), ys, xs, 0.8 * len(ys), None,
                           [np.eye(3), rot3(0, 120, 0)], 15, seed=4)
    np.testing.assert_allclose(a[0].a, b[0].a, atol=1e-5)
    np.testing.assert_allclose(a[0].t, b[0].t, atol=1e-5)
    assert not np.allclose(a[1].a, b[1].a, atol=1e-2)
