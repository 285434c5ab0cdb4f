"""Fault injection on the adaptation side: pwan_adapt, pwan_adapt_import and adapt_node in
subprocesses with hostile inputs, unwritable outputs and a full disk (RLIMIT_FSIZE: writes fail
with EFBIG, exactly as on a full disk). Contract: one line, exit 2, nothing half-written, files
follow the umask."""

import json
import os
import pathlib
import resource
import stat
import subprocess
import sys
import time

import pytest

from conftest import assert_one_line_failure, cli_main
from pwan_ros.adaptation import save_npz
from pwan_ros.evaluation.lidar_sim import SimConfig, write_sim_bag
from test_adapt_core import gaussian_domains
from test_adapt_node import NODE, _listen, _params

BIN = pathlib.Path(sys.executable).parent
FAST = [
    '--steps',
    '6',
    '--quiet',
    '--device',
    'cpu',
    '--threads',
    '1',
    '--plots',
    'false',
    '--warmup-steps',
    '2',
    '--eval-interval',
    '3',
    '--weight-interval',
    '3',
]


@pytest.fixture
def inputs(tmp_path):
    xl, yl, xu, yu = gaussian_domains(0)
    save_npz(tmp_path / 'lab.npz', xl, yl)
    save_npz(tmp_path / 'unl.npz', xu, yu)
    return tmp_path / 'lab.npz', tmp_path / 'unl.npz'


def adapt(*args, fsize=None, umask=None, timeout=180):
    def limits():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if umask is not None:
            os.umask(umask)

    return subprocess.run(
        [str(BIN / 'pwan_adapt'), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limits,
    )


def adapt_main(capfd, *args):
    """``pwan_adapt``'s ``main(argv)`` in this process, as a CompletedProcess (returncode,
    stdout, stderr): for checks of what it refuses before any work, where a subprocess adds
    only seconds of imports (the executable itself runs in the other tests here)."""
    from pwan_ros.cli.adapt import main

    capfd.readouterr()
    rc = main([str(a) for a in args])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(['pwan_adapt', *map(str, args)], rc, out, err)


def leftovers(root):
    """Temporaries of atomic writes left anywhere under ``root``."""
    return [p for p in pathlib.Path(root).rglob('*') if p.name.endswith('.tmp')]


@pytest.mark.heavy
def test_bad_inputs_one_line_exit_2(tmp_path, inputs, capfd):
    """Unusable inputs, config and output: one line, exit 2, nothing written. The first case runs
    the pwan_adapt executable, the others its main(argv) in this process."""
    lab, unl = inputs
    (tmp_path / 'empty.npz').write_bytes(b'')
    (tmp_path / 'adir').mkdir()
    (tmp_path / 'bad.yaml').write_text('steps: [1, 2\n')
    (tmp_path / 'afile').write_text('x')
    out = tmp_path / 'out'
    cases = [
        (['--labelled', tmp_path / 'empty.npz', '--unlabelled', unl], ['empty.npz', 'is empty']),
        (['--labelled', tmp_path / 'adir', '--unlabelled', unl], ['adir', 'is a directory']),
        (['--labelled', '/dev/null', '--unlabelled', unl], ['/dev/null', 'not a regular file']),
        (
            ['--labelled', lab, '--unlabelled', tmp_path / 'nope.npz'],
            ['nope.npz', 'does not exist'],
        ),
        (
            ['--labelled', lab, '--unlabelled', unl, '--config', tmp_path / 'bad.yaml'],
            ['bad.yaml', 'not valid YAML', 'line 2'],
        ),
        (
            ['--labelled', lab, '--unlabelled', unl, '--config', tmp_path / 'adir'],
            ['adir', 'is a directory'],
        ),
    ]
    for k, (args, words) in enumerate(cases):
        run = adapt if k == 0 else lambda *a: adapt_main(capfd, *a)
        proc = run(*args, '--output', out, *FAST)
        assert_one_line_failure(proc, 2, words)
        assert not out.exists()
    proc = adapt_main(
        capfd, '--labelled', lab, '--unlabelled', unl, '--output', tmp_path / 'afile', *FAST
    )
    assert_one_line_failure(proc, 2, ['afile', 'not a directory'])


def test_label_beyond_the_class_names_is_refused(tmp_path, inputs, capfd):
    """A label >= len(class_names) is a careless-user error, not an extra unnamed class
    (pwan_adapt's main(argv) in this process)."""
    from test_adapt_core import gaussian_domains as domains

    xl, yl, _, _ = domains(0)
    save_npz(tmp_path / 'named.npz', xl, yl, [f'c{i}' for i in range(5)])  # labels 0..5, 5 names
    out = tmp_path / 'out'
    proc = adapt_main(
        capfd,
        '--labelled',
        tmp_path / 'named.npz',
        '--unlabelled',
        inputs[1],
        '--output',
        out,
        *FAST,
    )
    assert_one_line_failure(proc, 2, ['named.npz', 'label 5 out of range for 5 class_names'])
    assert not out.exists()


def test_stray_labels_and_float64_beyond_float32_are_one_line(tmp_path, inputs, capfd):
    """A stray label of 2**40 is refused at once (it hung the split before the labels were
    checked, SIGTERM ignored: the executable, under a timeout); a missing class list is short,
    with the 1-based hint where it fits; a float64 feature beyond float32's range is refused (it
    trained a NaN model that was deployed as 'adapted'): pwan_adapt's main(argv) in this
    process."""
    import numpy as np

    xl, yl, _, _ = gaussian_domains(0)
    big = xl.astype(np.float64)
    big[3, 7] = 1e300
    huge, gap, one_based = yl.copy(), yl.copy(), yl + 1
    huge[0] = 2**40
    gap[gap == 5] = 40
    for name, x, y in [
        ('huge', xl, huge),
        ('gap', xl, gap),
        ('one', xl, one_based),
        ('big', big, yl),
    ]:
        np.savez(tmp_path / f'{name}.npz', features=x, labels=y)
    cases = [
        ('huge', ['label 1099511627776 makes 1099511627777 classes, more than its 360 rows']),
        ('gap', ['35 class(es) [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, ...] have no rows']),
        ('one', ['1 class(es) [0] have no rows', 'labels 1-based?']),
        ('big', ['feature 1e+300 at row 3, column 7 is beyond the float32 range']),
    ]
    for k, (name, words) in enumerate(cases):
        out = tmp_path / f'out_{name}'
        args = ['--labelled', tmp_path / f'{name}.npz', '--unlabelled', inputs[1], '--output', out]
        proc = adapt(*args, *FAST, timeout=60) if k == 0 else adapt_main(capfd, *args, *FAST)
        assert_one_line_failure(proc, 2, [f'{name}.npz', *words])
        assert len(proc.stderr) < 400 and not out.exists()


def test_unlabelled_class_names_take_the_labelled_ids():
    """An unlabelled file that names its own classes (a bag import of part of them, numbered
    0..) is evaluated with the labelled file's ids for those names (its accuracy read 0.0
    against a true 0.835); names the labelled file lacks, or cannot compare, are refused."""
    import numpy as np

    from pwan_ros.adaptation import FeatureSet, check_pair
    from pwan_ros.adaptation.errors import AdaptInputError

    xl, yl, xu, yu = gaussian_domains(0)  # unlabelled: classes 0..2
    names = [f'c{i}' for i in range(6)]

    def pair(unl_names, unl_labels, lab_names=names):
        return (
            FeatureSet(xl, yl, lab_names, 'lab.npz'),
            FeatureSet(xu, unl_labels, unl_names, 'unl.npz'),
        )

    lab, unl = pair(['c2', 'c0', 'c1'], (yu + 1) % 3)  # c2 -> 0, c0 -> 1, c1 -> 2
    assert check_pair(lab, unl) == 6 and check_pair(lab, unl) == 6  # twice: the same
    np.testing.assert_array_equal(unl.labels, yu)
    assert unl.class_names == names
    for args, words in [
        ((['c0', 'car'], yu % 2), r"class_names \['car'\] are not among"),
        ((['c0', 'c1', 'c2'], yu, None), 'the labelled file lab.npz does not'),
    ]:
        with pytest.raises(AdaptInputError, match=words):
            check_pair(*pair(*args))


def test_pickled_arrays_are_refused_in_every_member(tmp_path, inputs, capfd):
    """An object array (loading it would unpickle, i.e. run code) in class_names, as in labels,
    is bad input: one line naming the file and the array, in --labelled (the executable) and in
    --check (pwan_adapt's main(argv) in this process)."""
    import numpy as np

    from test_adapt_core import gaussian_domains as domains

    xl, yl, _, _ = domains(0)
    evil = tmp_path / 'evil.npz'
    names = np.array(['a', 1, 'c', 2.0, 'e', 'f'], dtype=object)
    np.savez(evil, features=xl, labels=yl, class_names=names)
    out = tmp_path / 'out'
    lab, unl = inputs
    for k, args in enumerate(
        (
            ['--labelled', evil, '--unlabelled', unl],
            ['--labelled', lab, '--unlabelled', unl, '--check', evil],
        )
    ):
        run = adapt if k == 0 else lambda *a: adapt_main(capfd, *a)
        proc = run(*args, '--output', out, *FAST)
        assert_one_line_failure(proc, 2, ['evil.npz', 'class_names unreadable'])
        assert not out.exists()


def test_unwritable_output_fails_before_training(inputs, unwritable_dir):
    lab, unl = inputs
    t0 = time.monotonic()
    proc = adapt('--labelled', lab, '--unlabelled', unl, '--output', unwritable_dir / 'out', *FAST)
    assert_one_line_failure(proc, 2, [str(unwritable_dir), 'not writable'])
    assert not (unwritable_dir / 'out').exists()
    assert time.monotonic() - t0 < 60


@pytest.mark.heavy
def test_full_disk_one_line_and_nothing_half_written(tmp_path, inputs):
    lab, unl = inputs
    out = tmp_path / 'out'
    proc = adapt('--labelled', lab, '--unlabelled', unl, '--output', out, *FAST, fsize=20_000)
    assert_one_line_failure(proc, 2, ['checkpoints', '.pt: File too large'])
    assert not out.exists() or not any(out.rglob('*.pt')), 'a checkpoint was left behind'
    assert not leftovers(tmp_path)


@pytest.mark.heavy
def test_outputs_follow_the_umask(tmp_path, inputs):
    lab, unl = inputs
    out = tmp_path / 'out'
    proc = adapt('--labelled', lab, '--unlabelled', unl, '--output', out, *FAST, umask=0o027)
    assert proc.returncode == 0, proc.stderr
    files = ['summary.json', 'model.ts', 'predictions.npy', 'metrics.csv', 'checkpoints/latest.pt']
    for name in files:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o640, name
    assert stat.S_IMODE(out.stat().st_mode) == 0o750


@pytest.fixture(scope='module')
def points_bag(tmp_path_factory):
    """A real rosbag2 with sensor_msgs/PointCloud2 on /points (not features)."""
    bag = tmp_path_factory.mktemp('pc') / 'bag'
    write_sim_bag(bag, SimConfig(scans=2, beams=4, azimuth_steps=90, moving_objects=0))
    return bag


def adapt_import(*args):
    return subprocess.run(
        [str(BIN / 'pwan_adapt_import'), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.heavy
def test_import_wrong_message_type_names_it(tmp_path, points_bag, capfd):
    """The pwan_adapt_import executable for the first topic, its main(argv) in this process for
    the second."""
    out = tmp_path / 'f.npz'
    for k, (topic, words) in enumerate(
        [
            ('/points', ['/points', 'sensor_msgs/msg/PointCloud2', 'raw bytes']),
            ('/ground_truth', ['/ground_truth', "no field 'data'"]),
        ]
    ):
        args = [points_bag, '--features-topic', topic, '--output', out]
        proc = adapt_import(*args) if k == 0 else cli_main(capfd, 'pwan_adapt_import', *args)
        assert_one_line_failure(proc, 2, words)
        assert not out.exists()


def test_import_checks_the_output_before_reading(tmp_path, points_bag, unwritable_dir, capfd):
    """pwan_adapt_import's main(argv) in this process (the executable's one line and exit status:
    test_import_wrong_message_type_names_it)."""
    (tmp_path / 'adir').mkdir()
    for out, words in [
        (unwritable_dir / 'f.npz', ['not writable']),
        (tmp_path / 'adir', ['is a directory']),
    ]:
        args = [points_bag, '--features-topic', '/points', '--output', out]
        proc = cli_main(capfd, 'pwan_adapt_import', *args)
        assert_one_line_failure(proc, 2, [str(out), *words])  # the output, not the wrong topic


@pytest.mark.ros
def test_node_on_an_unwritable_or_full_disk_publishes_error(tmp_path, ros_env, unwritable_dir):
    """adapt_node: the output problem is logged, published as state ``error`` on /diagnostics
    (received by a separate process over DDS), and the node exits 2."""
    for case, out, fsize in [
        ('unwritable', unwritable_dir / 'out', None),
        ('full', tmp_path / 'out', 20_000),
    ]:
        work = tmp_path / case
        work.mkdir()
        listener, status = _listen(work, ros_env, 90)
        time.sleep(1.0)  # discovery
        limit = (
            None
            if fsize is None
            else (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize)))
        )
        node = subprocess.run(
            [str(NODE)] + _params(work, steps=50, output=str(out)),
            env=ros_env,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=limit,
        )
        assert node.returncode == 2, (case, node.stderr[-2000:])
        assert 'Traceback' not in node.stderr
        listener.wait(timeout=30)
        got = json.loads(status.read_text())
        assert got and got[-1]['state'] == 'error', (case, got[-3:])
        expect = 'not writable' if case == 'unwritable' else 'File too large'
        assert expect in got[-1]['message'] and expect in node.stderr, (case, got[-1])
        assert not leftovers(work) and not (out / 'checkpoints' / 'latest.pt').exists()
