"""register(..., init='global'): feature hypotheses chosen and refined by the partial objective,
with an overlap, a confidence and a refusal status (real units: a simulated street in metres)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from pwan_ros.core import RegistrationConfig, register
from pwan_ros.core.errors import PwanInputError
from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.geometry.se3 import invert, make_transform, rotation_angle

pytestmark = pytest.mark.heavy


@pytest.fixture(scope='module')
def street():
    """Scans 0 and 12 of a simulated drive (3.6 m apart, moving objects and spurious returns),
    the ground truth T_scan0_scan12, and an object that is not in the street."""
    scans = list(simulate(SimConfig(scans=13, beams=16, azimuth_steps=720)))
    # something that is nowhere in the street: a knot of tubes, 6 m across (noisy surface samples)
    rng = np.random.default_rng(3)
    u = rng.uniform(0, 2 * np.pi, 20000)
    v = rng.uniform(0, 2 * np.pi, 20000)
    knot = np.stack([np.sin(u) + 2 * np.sin(2 * u), np.cos(u) - 2 * np.cos(2 * u), -np.sin(3 * u)], 1)
    other = 1.2 * knot + 0.3 * np.stack([np.cos(v), np.sin(v), np.cos(v + u)], 1) + rng.normal(0, 0.01, (20000, 3))
    return scans[12].xyz.astype(float), scans[0].xyz.astype(float), invert(scans[0].pose) @ scans[12].pose, other


@pytest.mark.parametrize('yaw_deg', [0.0, 120.0])
def test_global_finds_an_unknown_pose_in_metres(street, yaw_deg):
    src, ref, gt, _ = street
    turn = make_transform(np.array([[np.cos(np.radians(yaw_deg)), -np.sin(np.radians(yaw_deg)), 0],
                                    [np.sin(np.radians(yaw_deg)), np.cos(np.radians(yaw_deg)), 0], [0, 0, 1]]),
                          np.array([25.0, -40.0, 3.0]))                  # far from the reference, turned
    moved = src @ turn[:3, :3].T + turn[:3, 3]
    res = register(moved, ref, RegistrationConfig(), init='global')
    err = invert(gt @ invert(turn)) @ res.transform
    assert res.status == 'ok', res.reason
    assert np.degrees(rotation_angle(err)) < 0.5 and np.linalg.norm(err[:3, 3]) < 0.15, err   # 16-beam scans
    assert 0.2 < res.overlap <= 1.0 and 0.1 <= res.confidence <= 1.0
    assert {c['origin'] for c in res.candidates} >= {'ransac', 'fgr', 'prior'}
    assert all(-1.0 <= c['objective'] <= 0.0 for c in res.candidates)


def test_global_refuses_without_overlap(street):
    """An object that is not in the street: no pose puts enough of it on the reference, so the
    result is refused with the reason instead of a confident wrong pose."""
    src, ref, _, other = street
    res = register(other, ref, RegistrationConfig(), init='global')
    assert res.status == 'refused' and res.reason, (res.overlap, res.confidence)
    assert 'overlap' in res.reason or 'ambiguous' in res.reason


def test_global_input_errors(street):
    src, ref, _, _ = street
    with pytest.raises(PwanInputError, match='rigid'):
        register(src, ref, RegistrationConfig(transform='affine'), init='global')
    with pytest.raises(PwanInputError, match="'global'"):
        register(src, ref, RegistrationConfig(), init='globl')
    with pytest.raises(PwanInputError, match='3-D'):
        register(src[:, :2], ref[:, :2], RegistrationConfig(), init='global')


def test_cli_global_reports_status_and_exit_codes(street, tmp_path):
    src, ref, gt, other = street
    for name, arr in (('src.npy', src), ('ref.npy', ref), ('other.npy', other)):
        np.save(tmp_path / name, arr)
    run = lambda s: subprocess.run([sys.executable, '-m', 'pwan_ros.cli.register', str(tmp_path / s),  # noqa: E731
                                    str(tmp_path / 'ref.npy'), '--global', '--json', '--quiet'],
                                   capture_output=True, text=True, timeout=300)
    ok = run('src.npy')
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out['status'] == 'ok' and out['overlap'] > 0.2
    np.testing.assert_allclose(np.array(out['transform'])[:3, 3], gt[:3, 3], atol=0.1)
    refused = run('other.npy')
    assert refused.returncode == 3 and json.loads(refused.stdout)['status'] == 'refused'
    assert refused.stderr.strip().startswith('pwan_register: refused:') and 'Traceback' not in refused.stderr
