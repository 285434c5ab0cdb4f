"""The benchmarks' KEY=VALUE overrides (bench/common.key_values: bench_engine --also,
bench_nonrigid --also / --set, bench_lidar --baseline-set) reach the config as the user meant."""

import pathlib
import sys

import pytest

from pwan_ros.core import RegistrationConfig


def _key_values(items):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'bench'))
    from common import key_values

    return key_values(items)


def test_words_yaml_reads_as_booleans_stay_words():
    """compile=off is the choice 'off' (YAML 1.1 would read False and the config refuse it);
    true / false, numbers and lists are still typed."""
    kv = _key_values(['compile=off', 'cuda_graphs=false', 'steps=50', 'finetune.nn=torch'])
    assert kv == {'compile': 'off', 'cuda_graphs': False, 'steps': 50, 'finetune.nn': 'torch'}
    cfg = RegistrationConfig.from_dict({'transform': 'rigid', **kv})
    assert (cfg.compile, cfg.cuda_graphs, cfg.steps) == ('off', False, 50)
    assert cfg.finetune.nn == 'torch'
    assert _key_values(['verbose=True', 'x=[1, 2]', 'y=yes']) == {
        'verbose': True,
        'x': [1, 2],
        'y': 'yes',
    }


def test_item_without_equals_ends_with_one_line():
    with pytest.raises(SystemExit, match="expected KEY=VALUE, got 'steps'"):
        _key_values(['steps'])


def test_unrotate_leaves_scale_translation_and_deformation():
    """bench_nonrigid --unrotate: a pair rotated by 80 deg, scaled, moved and deformed comes back
    with no rotation in its best similarity (the deformation and the rest untouched)."""
    import numpy as np

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'bench'))
    from bench_nonrigid import similarity_oracle, unrotated

    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 3)) * [3.0, 2.0, 1.0]
    deformed = x + 0.05 * np.sin(x[:, [1, 2, 0]])
    c, s = np.cos(np.radians(80)), np.sin(np.radians(80))
    rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    y = 0.5 * deformed @ rot.T + [4.0, -2.0, 7.0]  # the source: point i corresponds to x[i]
    y0 = unrotated(y, x)
    # only the rotation was removed: distances within the source are kept
    d = np.linalg.norm(y[:50, None] - y[None, :50], axis=2)
    assert np.allclose(np.linalg.norm(y0[:50, None] - y0[None, :50], axis=2), d)
    assert np.allclose(y0.mean(0), y.mean(0))
    # the best similarity y0 -> x is now a scale and a translation: centred, x ~ 2 y0
    yc, xc = y0 - y0.mean(0), x - x.mean(0)
    assert np.abs(2.0 * yc - xc).max() < 0.2 < np.abs(2.0 * (y - y.mean(0)) - xc).max()
    assert np.allclose(similarity_oracle(y0, x), similarity_oracle(y, x))


ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_device_check_refuses_an_unknown_step_in_one_line(tmp_path):
    import subprocess

    out = subprocess.run(
        ['bash', str(ROOT / 'bench/device_check.sh'), '--device', 'cpu', '--steps', 'cpd,gpu'],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        'device_check: --steps takes tests, engine, odometry, nonrigid, cpd; got gpu'
    ]


@pytest.mark.slow
def test_device_check_cpd_step_prints_the_comparison_table(tmp_path):
    """The dry run (--device cpu: fish only) of the cpd step: both protocols with the rotation
    removed, one row per cell with PWAN's and pycpd's MSE and the time ratio."""
    import subprocess

    data = ROOT.parent / 'shared' / 'data'
    out = subprocess.run(
        ['bash', str(ROOT / 'bench/device_check.sh'), '--device', 'cpu', '--steps', 'cpd']
        + ['--data', str(data), '--results', str(tmp_path / 'dc')],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [r for r in out.stdout.splitlines() if r.startswith("| CPD's setting")]
    cells = ['(a) fish, ratio 0.2', '(a) fish, ratio 0.6', '(a) fish, ratio 1.2']
    cells += ['(b) fish, s = 0.7', '(b) fish, s = 0.85', '(b) fish, s = 1']
    assert [r.split(' | ')[0] for r in rows] == [f"| CPD's setting {c}" for c in cells]
    for r in rows:
        cols = r.strip('| ').split(' | ')
        assert cols[1] == 'ok' and float(cols[2]) > 0
        assert 'PWAN on cpu: MSE' in cols[3] and 'pycpd (CPU)' in cols[3]
        assert 'time ratio' in cols[3]
