"""The default mode's own honesty (pwan_ros.core.checks.mass, api.register): the matched mass
follows the overlap the result shows, uniform outliers do not inflate it, and a pose registered
from no init that explains little of the source is confirmed by the global search or refused."""

import pathlib
import sys
import warnings

import numpy as np
import pytest
from scipy.spatial import cKDTree

from pwan_ros.core import RegistrationConfig, register
from pwan_ros.core.config import GlobalConfig
from pwan_ros.core.checks.mass import measured_mass_ratio
from pwan_ros.core.checks.verify import judging_voxel
from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.geometry.se3 import invert, rotation_angle

DATA = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data'


def tube(u0, u1, n, seed):
    """A 0.3 m tube along x between 4 u0 and 4 u1 metres, 2 mm noise."""
    rng = np.random.default_rng(seed)
    u, v = rng.uniform(u0, u1, n), rng.uniform(0, 2 * np.pi, n)
    return np.stack([4.0 * u, 0.3 * np.cos(v), 0.3 * np.sin(v)], 1) + rng.normal(0, 0.002, (n, 3))


def test_measured_mass_is_the_overlap_also_under_uniform_outliers():
    """Two stretches of a tube sharing 40 % of the source: the measured mass is that overlap, and
    stays it with as many uniform outliers as reference points (chance is taken out)."""
    src, ref = tube(0.0, 2.5, 20000, 1), tube(1.5, 4.0, 20000, 2)
    voxel = judging_voxel(ref)
    clean = measured_mass_ratio(src, cKDTree(ref), np.eye(4), voxel)
    assert 0.35 < clean < 0.45
    rng = np.random.default_rng(3)
    noisy = np.vstack((ref, rng.uniform(ref.min(0) - 1, ref.max(0) + 1, ref.shape)))
    assert measured_mass_ratio(src, cKDTree(noisy), np.eye(4), voxel) == pytest.approx(
        clean, abs=0.05
    )
    assert measured_mass_ratio(src, cKDTree(ref), np.eye(4), voxel, cap=0.2) == 0.2


@pytest.mark.heavy
def test_default_mass_follows_the_overlap_and_a_weak_pose_is_confirmed():
    """Simulated street scans 9 m apart (metres, about 60 % overlap), from no init. With the mass
    left to the default, the result is fine-tuned again at the overlap it shows and, explaining
    less than half of the source, confirmed by the global search: right to millimetres. Given
    explicitly, mass_ratio=0.8 is kept; ``confirm_below=0`` skips the confirmation."""
    scans = list(simulate(SimConfig(scans=31, moving_objects=0)))
    a, b = scans[0], scans[-1]
    src, ref, gt = b.xyz.astype(np.float64), a.xyz.astype(np.float64), invert(a.pose) @ b.pose
    fixed_cfg = RegistrationConfig(mass_ratio=0.8, global_search=GlobalConfig(confirm_below=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        auto = register(src, ref, RegistrationConfig())
        fixed = register(src, ref, fixed_cfg)
    assert auto.status == 'ok', auto.reason
    assert auto.mass < 0.75 * auto.num_source
    assert {'mass', 'confirm'} <= set(auto.timings)
    d = invert(gt) @ auto.transform
    assert np.degrees(rotation_angle(d)) < 0.5 and np.linalg.norm(d[:3, 3]) < 0.005
    assert fixed.mass == pytest.approx(0.8 * fixed.num_source)
    assert not {'mass', 'confirm'} & set(fixed.timings)


@pytest.mark.slow
@pytest.mark.parametrize('pair', [('bun090', 'bun180'), ('bun180', 'bun315')])
def test_default_mode_on_low_overlap_bunny_pairs_is_right_or_refused(pair):
    """Real scans 90 and 135 deg apart with 40 % and 15 % overlap (metres), default mode from no
    init: 090->180 came back 2-5 deg off at the default mass 0.8 and 180->315 164 deg off (a pose
    that fits more of the source than the truth), both with status ok. Now the first is right
    (its mass follows its overlap) and the second right or refused (measured: refused; whether
    the search finds the pose is floating-point detail)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'bench'))
    from common import bunny_poses, load_bunny

    if not (DATA / 'rigid' / 'stanford_bunny').is_dir():
        pytest.fail(f'{DATA} missing (slow tests need ../shared/data)')
    poses = bunny_poses(str(DATA))
    s, r = pair
    gt = np.linalg.inv(poses[r]) @ poses[s]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        res = register(load_bunny(str(DATA), s), load_bunny(str(DATA), r), RegistrationConfig())
    err = np.degrees(rotation_angle(invert(gt) @ res.transform))
    if s == 'bun090':
        assert res.status == 'ok', res.reason
        assert err < 1.0
    elif res.status == 'ok':
        assert err < 1.0, err
    else:
        assert res.status == 'refused', res.reason
