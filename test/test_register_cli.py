"""The pwan_register console script (called in-process through main(argv))."""

import gzip
import json

import numpy as np
import pytest

from _core_shapes import blob, rot3
from pwan_ros.io.point_files import read_points, write_points
from pwan_ros.cli.register import main

R = rot3(10, -8, 12)
T = np.array([0.1, 0.05, -0.2])


@pytest.fixture()
def pair(tmp_path):
    src = blob(400, 1)
    ref = blob(400, 0) @ R.T + T
    sp, rp = tmp_path / 'src.npy', tmp_path / 'ref.txt.gz'
    np.save(sp, src)
    with gzip.open(rp, 'wt') as fh:
        np.savetxt(fh, ref)
    return src, sp, rp


def test_json_output_and_written_points(pair, tmp_path, capsys):
    src, sp, rp = pair
    out = tmp_path / 'out.ply'
    rc = main([str(sp), str(rp), '--json', '--output', str(out), '--steps', '150', '--seed', '1'])
    assert rc == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # stdout is exactly one JSON object
    assert set(data) >= {
        'transform',
        'time_s',
        'num_source',
        'num_reference',
        'matched_ratio',
        'converged',
        'output',
    }
    tf = np.array(data['transform'])
    assert tf.shape == (4, 4)
    assert np.abs(tf[:3, :3] - R).max() < 0.01 and np.abs(tf[:3, 3] - T).max() < 0.01
    assert data['num_source'] == 400 and data['output'] == str(out)
    moved = read_points(str(out))
    np.testing.assert_allclose(moved, src @ tf[:3, :3].T + tf[:3, 3], atol=1e-5)


def test_text_output_2d_and_nan_rows(tmp_path, capsys):
    a = np.linspace(0, 2 * np.pi, 120, endpoint=False)
    pts = np.stack((np.cos(a) * (1 + 0.3 * np.cos(3 * a)), 0.6 * np.sin(a)), 1)
    src = pts.copy()
    src[3] = np.nan
    sp, rp, op = tmp_path / 's.csv', tmp_path / 'r.xyz', tmp_path / 'o.txt'
    np.savetxt(sp, src, delimiter=',')
    np.savetxt(rp, pts + [0.05, -0.02])
    rc = main([str(sp), str(rp), '--output', str(op), '--divergence', 'distance', '-q'])
    assert rc == 0
    captured = capsys.readouterr()
    assert 'transform' in captured.out and 'dropped 1' in captured.err
    out = np.loadtxt(op)
    assert out.shape == (120, 2) and np.isnan(out[3]).all()
    np.testing.assert_allclose(out[10], pts[10] + [0.05, -0.02], atol=0.01)


@pytest.mark.parametrize(
    'args,msg',
    [
        (['missing.npy', 'REF'], 'no such file'),
        (['SRC', 'REF', '--mass', '1e9'], 'exceeds'),
        (
            ['SRC', 'REF', '--divergence', 'distance', '--distance-threshold', '-1'],
            "invalid value -1.0 for parameter 'distance_threshold': expected a number > 0",
        ),
        (['SRC', 'BAD'], 'cannot parse'),
        (['SRC', 'EMPTY'], 'empty'),
    ],
)
def test_bad_input_gives_message_and_nonzero_exit(pair, tmp_path, capsys, args, msg):
    _, sp, rp = pair
    bad = tmp_path / 'bad.txt'
    bad.write_text('1 2 3\n4 five 6\n')
    empty = tmp_path / 'empty.npy'
    np.save(empty, np.zeros((0, 3)))
    subst = {'SRC': str(sp), 'REF': str(rp), 'BAD': str(bad), 'EMPTY': str(empty)}
    rc = main([subst.get(a, a) for a in args])
    captured = capsys.readouterr()
    assert rc == 2
    assert msg in captured.err and 'Traceback' not in captured.err


def test_cloud_io_round_trip(tmp_path):
    pts = np.random.default_rng(0).normal(size=(50, 3))
    for ext in ('.npy', '.ply', '.pcd', '.txt', '.xyz', '.csv'):
        path = str(tmp_path / ('p' + ext))
        write_points(path, pts)
        np.testing.assert_allclose(read_points(path), pts, atol=1e-6)


@pytest.mark.parametrize(
    'args,starts,start_steps',
    [([], 1, 0), (['--starts', '24'], 24, 60), (['--starts', '8', '--start-steps', '0'], 8, 0)],
)
def test_multistart_flags_pick_the_tournament(args, starts, start_steps):
    """The CLI and the library resolve the same defaults: --starts 24 and register(starts=24) both
    run the 60-step tournament."""
    from pwan_ros.cli.register import _config, _parser
    from pwan_ros.core import RegistrationConfig

    cfg = _config(_parser().parse_args(['a.npy', 'b.npy'] + args)).resolved()
    assert (cfg.starts, cfg.start_steps) == (starts, start_steps)
    library = RegistrationConfig(
        **{a.lstrip('-').replace('-', '_'): int(v) for a, v in zip(args[::2], args[1::2])}
    )
    assert library.resolved() == cfg.replace(verbose=False)


def test_section_flags_reach_the_config():
    """Every field of the config's sections is a flag named by its from_dict key
    (``--finetune.max-iterations``, ``--potential.hidden A B``, ``--no-finetune.polish``), so the
    fine-tune cap warning's advice can be followed from the command line."""
    from pwan_ros.cli.register import _config, _parser
    from pwan_ros.core import RegistrationConfig

    args = [
        'a.npy',
        'b.npy',
        '--finetune.max-iterations',
        '600',
        '--potential.hidden',
        '8',
        '12',
        '--no-finetune.polish',
        '--global-search.min-overlap',
        '0.3',
        '--coherence.rho',
        '1.5',
    ]
    cfg = _config(_parser().parse_args(args))
    library = RegistrationConfig.from_dict(
        {
            'finetune.max_iterations': 600,
            'potential.hidden': (8, 12),
            'finetune.polish': False,
            'global_search.min_overlap': 0.3,
            'coherence.rho': 1.5,
        }
    )
    assert cfg == library.replace(verbose=True)
    assert _config(_parser().parse_args(['a.npy', 'b.npy'])) == RegistrationConfig(verbose=True)


def test_section_flag_in_a_real_run_and_a_bad_value(pair, capsys):
    """--finetune.max-iterations 1 caps the fine-tune of a real registration (its warning on
    stderr, exit 0); an out-of-range section value is one line, exit 2."""
    _, sp, rp = pair
    rc = main([str(sp), str(rp), '--json', '--steps', '60', '--finetune.max-iterations', '1'])
    captured = capsys.readouterr()
    assert rc == 0 and 'finetune.max_iterations=1 ' in captured.err
    assert json.loads(captured.out)['converged'] is False
    rc = main([str(sp), str(rp), '--potential.lr', '-1'])
    captured = capsys.readouterr()
    assert rc == 2 and 'potential.lr' in captured.err and 'Traceback' not in captured.err
