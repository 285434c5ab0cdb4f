"""The pwan_register console script (called in-process through main(argv))."""

import gzip
import json

import numpy as np
import pytest

from _core_shapes import blob, knobbed_blob, rot3
from pwan_ros.io.point_files import read_points, write_points
from pwan_ros.cli.register import main

R = rot3(10, -8, 12)
T = np.array([0.1, 0.05, -0.2])


@pytest.fixture()
def pair(tmp_path):
    # the knob pins the pose: the blob alone at 400 points fits about as well turned half over
    # (its self-check finds that rival from a wide turn and refuses it)
    src = knobbed_blob(400, 1)
    ref = knobbed_blob(400, 0) @ R.T + T
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
    assert data['transform_type'] == 'rigid'
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
    for ext in ('.npy', '.ply', '.pcd', '.txt', '.xyz', '.csv', '.obj'):
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
    # the mass type's settings with the distance type: said (d-PWAN ignores them)
    with pytest.warns(UserWarning, match='--mass-ratio set the mass type.s matched mass'):
        _config(
            _parser().parse_args(['a', 'b', '--divergence', 'distance', '--mass-ratio', '0.5'])
        )


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


PCD_ASCII = (
    '# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT {count}\nWIDTH 2\n'
    'HEIGHT 1\nPOINTS {points}\nDATA ascii\n{body}'
)
PLY_ASCII = (
    b'ply\nformat ascii 1.0\nelement vertex 4\nproperty float x\nproperty float y\n'
    b'property float z\nend_header\n'
)


def _bad_point_files(tmp_path):
    """{name: (file contents, expected message)}: malformed point files that Open3D or numpy
    read as valid (zero padding), or failed on with a traceback or a wrong message."""
    good = tmp_path / 'good.ply'
    write_points(str(good), blob(2000, 3))
    return {
        'trunc.ply': (good.read_bytes()[:1000], 'early end-of-file'),
        'trunc_gz.ply.gz': (gzip.compress(good.read_bytes()[:1000]), 'early end-of-file'),
        'trunc_ascii.ply': (PLY_ASCII + b'1 2 3\n4 5 6\n', 'row 2: early end-of-file'),
        'token.ply': (PLY_ASCII + b'1 2 3\n4 abc 6\n7 8 9\n1 1 1\n', 'malformed input'),
        'text.ply': (b'hello world\n', "expected 'ply'"),
        'token.pcd': (
            PCD_ASCII.format(count='1 1 1', points=2, body='1 2 3\n4 abc 6\n').encode(),
            'cannot parse ascii data',
        ),
        'negative.pcd': (
            PCD_ASCII.format(count='1 1 1', points=-5, body='').replace('ascii', 'binary').encode()
            + bytes(24),
            'POINTS -5',
        ),
        'count.pcd': (
            PCD_ASCII.format(count='2 1 1', points=2, body='1 2 3 7\n4 5 6 8\n').encode(),
            "field 'x' has COUNT 2, expected 1",
        ),
        'text.npy': (b'1 2 3\n', 'not a valid .npy file'),
    }


@pytest.mark.parametrize(
    'name',
    [
        'trunc.ply',
        'trunc_gz.ply.gz',
        'trunc_ascii.ply',
        'token.ply',
        'text.ply',
        'token.pcd',
        'negative.pcd',
        'count.pcd',
        'text.npy',
    ],
)
def test_bad_point_file_is_one_line_naming_it_and_stdout_stays_json(pair, tmp_path, capfd, name):
    """A truncated or malformed input: exit 2, one stderr line naming the file, nothing on stdout
    (captured at the file descriptor: Open3D's own warnings went there, breaking --json)."""
    _, sp, _ = pair
    data, msg = _bad_point_files(tmp_path)[name]
    bad = tmp_path / name
    bad.write_bytes(data)
    capfd.readouterr()
    rc = main([str(bad), str(sp), '-q', '--json', '--steps', '30'])
    out, err = capfd.readouterr()
    lines = err.splitlines()
    assert rc == 2 and out == '', (rc, out)
    assert len(lines) == 1 and lines[0].startswith(f'pwan_register: error: {bad}: '), err
    assert msg in lines[0], err


def test_ply_reader_matches_open3d(tmp_path):
    """The PLY reader (plyfile) reads what Open3D writes, binary and ASCII, layouts with a list
    before the vertices, and what :func:`write_points` writes."""
    import open3d as o3d

    pts = blob(300, 2)
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(pts))
    for ascii_ in (False, True):
        path = str(tmp_path / f'o3d_{ascii_}.ply')
        assert o3d.io.write_point_cloud(path, cloud, write_ascii=ascii_)
        np.testing.assert_allclose(read_points(path), pts, atol=1e-5 if ascii_ else 0)
    listed = tmp_path / 'listed.ply'
    listed.write_bytes(
        b'ply\nformat binary_little_endian 1.0\nelement tag 1\nproperty list uchar int ids\n'
        b'element vertex 300\nproperty double x\nproperty double y\nproperty double z\n'
        b'end_header\n' + bytes([2]) + np.array([7, 9], '<i4').tobytes() + pts.tobytes()
    )
    np.testing.assert_array_equal(read_points(str(listed)), pts)
    ours = str(tmp_path / 'ours.ply')
    write_points(ours, pts)
    np.testing.assert_array_equal(np.asarray(o3d.io.read_point_cloud(ours).points), pts)
    np.testing.assert_array_equal(read_points(ours), pts)


@pytest.mark.parametrize('ext', ['.npy', '.ply', '.pcd', '.txt', '.csv', '.xyz', '.obj'])
def test_written_points_come_back_exactly_in_map_coordinates(tmp_path, ext):
    """A cloud in UTM-like metres (4.5e6 m north) with millimetre detail: every output format
    returns the doubles it was given (float32 PCD rounded them to 0.25 m, 9-digit text to 1 cm)."""
    pts = blob(200, 5) + np.array([512345.678, 4498765.4321, 123.456])
    path = str(tmp_path / f'map{ext}')
    write_points(path, pts)
    np.testing.assert_array_equal(read_points(path), pts)


def test_upper_case_gz_extension_is_decompressed(tmp_path):
    """``.PCD.GZ`` passes the extension check and is read as gzip (the check is case-blind)."""
    pts = blob(50, 4)
    write_points(str(tmp_path / 'p.pcd'), pts)
    gz = tmp_path / 'OK.PCD.GZ'
    gz.write_bytes(gzip.compress((tmp_path / 'p.pcd').read_bytes()))
    np.testing.assert_allclose(read_points(str(gz)), pts, atol=1e-6)


def test_output_equal_to_an_input_is_refused(pair, tmp_path, capsys):
    """-o naming the source or the reference (directly, through a link or a ``..`` path): exit 2,
    one line, the input untouched."""
    _, sp, rp = pair
    src = tmp_path / 'in.txt'
    np.savetxt(src, blob(400, 1))
    before = src.read_bytes()
    (tmp_path / 'link.txt').symlink_to(src)
    for out, role in [
        (src, 'source'),
        (tmp_path / 'link.txt', 'source'),
        (tmp_path / 'missing' / '..' / 'in.txt', 'source'),
    ]:
        rc = main([str(src), str(rp), '-q', '--output', str(out)])
        err = capsys.readouterr().err
        want = f'pwan_register: error: {out}: output is the {role} file; choose another path\n'
        assert rc == 2 and err == want, err
    rc = main([str(sp), str(src), '-q', '--output', str(src)])
    assert rc == 2 and 'output is the reference file' in capsys.readouterr().err
    assert src.read_bytes() == before


def test_unusable_option_values_are_one_line(pair, capsys):
    """An empty --output (a script's unset $OUT: before, ignored with exit 0) and --global with
    an affine / non-rigid transform (before: 'pass its transform as init', an option this CLI
    does not have; now how to do it here) are refused with one line, exit 2."""
    _, sp, rp = pair
    rc = main([str(sp), str(rp), '-q', '--output', ''])
    assert rc == 2 and capsys.readouterr().err == 'pwan_register: error: empty output path\n'
    rc = main([str(sp), str(rp), '-q', '--global', '--transform', 'affine'])
    err = capsys.readouterr().err
    assert rc == 2 and '--output moved.ply, then --transform affine on moved.ply' in err, err
    assert err.count('\n') == 1


@pytest.mark.parametrize(
    'module,essential,most',
    [('register', 'pwan_ros.cli.register', 16), ('adapt', 'pwan_ros.cli.adapt', 14)],
)
def test_help_shows_what_a_user_needs_and_help_all_the_rest(module, essential, most, capsys):
    """--help lists the options most runs need (each of ESSENTIAL, few others); --help-all lists
    every option, and an option --help leaves out still works."""
    import importlib

    cli = importlib.import_module(essential)
    run = getattr(cli, 'main')
    with pytest.raises(SystemExit) as short:
        run(['--help'])
    assert short.value.code == 0
    text = capsys.readouterr().out
    shown = [line.split()[0] for line in text.splitlines() if line.startswith('  --')]
    with pytest.raises(SystemExit):
        run(['--help-all'])
    full = capsys.readouterr().out
    every = [line.split()[0] for line in full.splitlines() if line.startswith('  --')]
    assert len(shown) <= most < len(every), (shown, len(every))
    for dest in cli.ESSENTIAL:
        flag = '--' + {'global_init': 'global'}.get(dest, dest).replace('_', '-')
        assert flag in shown or flag + ',' in shown, flag
    assert f'show all {len(every) - 1} options' in text  # -h not counted, --help-all is
    assert set(shown) < set(every)


def test_an_option_only_help_all_lists_still_works(pair, capsys):
    _, sp, rp = pair
    code = main([str(sp), str(rp), '--json', '-q', '--finetune.max-iterations', '7'])
    out = json.loads(capsys.readouterr().out)
    assert code == (0 if out['status'] == 'ok' else 3)
    assert out['num_source'] == 400


def test_steps_zero_is_not_converged(pair, capsys):
    """--steps 0 runs no step of Alg. 1: the result is the fine-tune from identity and does not
    report the adversarial stage as converged."""
    _, sp, rp = pair
    main([str(sp), str(rp), '--json', '-q', '--steps', '0'])
    out = json.loads(capsys.readouterr().out)
    assert out['converged'] is False


def test_init_pose_file_round_trip_in_metres(tmp_path, capsys):
    """``--init POSE_FILE``: a prior pose 30 m and 150 deg away (the truth 3 deg / 5 cm off, as a
    4x4 text file) gives the truth, status ok; the ``--json`` that run prints, fed back as the
    prior, gives the same pose; KITTI's 3x4 rows and .npy read alike."""
    truth = np.eye(4)
    truth[:3, :3], truth[:3, 3] = rot3(0, 20, 150), [30.0, -12.0, 4.0]
    src = 5.0 * knobbed_blob(400, 1)
    ref = 5.0 * knobbed_blob(400, 0) @ truth[:3, :3].T + truth[:3, 3]
    sp, rp = tmp_path / 'src.npy', tmp_path / 'ref.npy'
    np.save(sp, src)
    np.save(rp, ref)
    prior = truth.copy()
    prior[:3, :3] = truth[:3, :3] @ rot3(3, 0, 0)
    prior[:3, 3] += [0.05, 0.0, 0.0]
    np.savetxt(tmp_path / 'prior.txt', prior, fmt='%.6f')  # rounded: projected onto a rotation
    args = [str(sp), str(rp), '--json', '--steps', '150', '--init']
    rc = main(args + [str(tmp_path / 'prior.txt')])
    found = json.loads(capsys.readouterr().out)
    tf = np.array(found['transform'])
    assert rc == 0 and found['status'] == 'ok', found
    assert np.abs(tf - truth).max() < 0.02, tf
    (tmp_path / 'found.json').write_text(json.dumps(found))
    np.savetxt(tmp_path / 'kitti.txt', tf[:3].reshape(1, 12))
    np.save(tmp_path / 'found.npy', tf)
    for name in ('found.json', 'kitti.txt', 'found.npy'):
        rc = main(args + [str(tmp_path / name)])
        again = json.loads(capsys.readouterr().out)
        assert rc == 0 and np.abs(np.array(again['transform']) - tf).max() < 0.01, (name, again)


@pytest.mark.parametrize(
    ('content', 'msg'),
    [
        ('1 0 0 0\n0 1 0 0\n0 0', '10 numbers'),
        ('1 0 0\n0 1 0\n0 0 1', '9 numbers'),
        ('2 0 0 0 0 1 0 0 0 0 1 0 0 0 0 1', 'not rigid'),
        ('1 0 0 nan 0 1 0 0 0 0 1 0 0 0 0 1', 'NaN'),
        ('1 0 0 0 0 1 0 0 0 0 1 0 0 0 1 1', 'last row'),
        ('one two', 'cannot read a pose'),
    ],
)
def test_a_bad_pose_file_is_one_line(pair, tmp_path, capsys, content, msg):
    _, sp, rp = pair
    pose = tmp_path / 'pose.txt'
    pose.write_text(content)
    rc = main([str(sp), str(rp), '--quiet', '--steps', '5', '--init', str(pose)])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and 'Traceback' not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_init_and_global_are_exclusive_and_a_missing_pose_file_is_named(pair, tmp_path, capsys):
    _, sp, rp = pair
    pose = tmp_path / 'pose.txt'
    np.savetxt(pose, np.eye(4))
    assert main([str(sp), str(rp), '-q', '--global', '--init', str(pose)]) == 2
    assert 'choose one' in capsys.readouterr().err
    assert main([str(sp), str(rp), '-q', '--init', str(tmp_path / 'none.txt')]) == 2
    assert 'none.txt: no such pose file' in capsys.readouterr().err
