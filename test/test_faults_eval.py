"""Fault injection on the bag and evaluation tools (pwan_sim, pwan_pcd2bag, pwan_evaluate,
pwan_replay, pwan_demo) in subprocesses: broken run records, unwritable outputs checked before
any work, a full disk (RLIMIT_FSIZE) and Ctrl-C while a bag is being written. Contract: one
line and exit 2 (130 when interrupted), no bag or temporary left behind, umask permissions."""

import json
import os
import pathlib
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import assert_one_line_failure, cli_main
from pwan_ros.evaluation.offline import run_offline
from pwan_ros.evaluation.run_record import RunRecord
from test_bag_pcd import points, write_pcd

BIN = pathlib.Path(sys.executable).parent


def tool(name, *args, fsize=None, umask=None, timeout=180):
    def limits():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if umask is not None:
            os.umask(umask)

    return subprocess.run(
        [str(BIN / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limits,
    )


def entries(directory):
    """Everything in ``directory`` (hidden temporaries included), as names."""
    return sorted(p.name for p in pathlib.Path(directory).iterdir())


@pytest.mark.heavy
def test_evaluate_broken_run_records_name_the_file(tmp_path, small_bag, capfd):
    """A run record that cannot be evaluated: one line naming the file, exit 2, no output. The
    first case runs the pwan_evaluate executable, the others its main(argv) in this process."""
    good = RunRecord.load(
        run_offline(small_bag, lambda xyz, stamp: np.eye(4), max_scans=2).save(tmp_path / 'good')
    )
    assert good.scans == 2
    record = json.loads((tmp_path / 'good' / 'run.json').read_text())
    (tmp_path / 'adir').mkdir()
    cases = {
        'missing.json': (None, 'no such file'),
        'empty.json': ('{}', 'missing trajectory_tum, scans_published'),
        'broken.json': ('{"scans_published": 3,', 'not valid JSON (line 1'),
        'list.json': ('[1, 2]', 'expected a JSON object'),
        'extra.json': (json.dumps({**record, 'speed': 1}), 'unknown keys speed'),
        'typed.json': (
            json.dumps({**record, 'scans_published': 'six'}),
            'scans_published must be an integer',
        ),
        'orphan.json': (
            json.dumps({**record, 'trajectory_tum': 'gone.tum'}),
            'gone.tum is missing',
        ),
        'adir': (None, 'is a directory'),
    }
    for k, (name, (text, words)) in enumerate(cases.items()):
        path = tmp_path / 'good' / name if name == 'orphan.json' else tmp_path / name
        if text is not None:
            path.write_text(text)
        args = ['--run', path, '--bag', small_bag, '--output', tmp_path / 'out']
        proc = tool('pwan_evaluate', *args) if k == 0 else cli_main(capfd, 'pwan_evaluate', *args)
        assert_one_line_failure(proc, 2, [str(path), words])
        assert not (tmp_path / 'out').exists()
    # a record evaluated against another bag's ground truth: said, then done
    shutil.copytree(small_bag, tmp_path / 'other_bag')
    proc = cli_main(
        capfd,
        'pwan_evaluate',
        '--run',
        tmp_path / 'good' / 'run.json',
        '--bag',
        tmp_path / 'other_bag',
        '--output',
        tmp_path / 'out',
    )
    assert proc.returncode == 0, proc.stderr
    assert f'was recorded from {small_bag}, evaluated against the ground truth of' in proc.stderr


@pytest.mark.heavy
def test_outputs_are_checked_before_any_work(tmp_path, small_bag, unwritable_dir, capfd):
    """Each tool refuses an output it cannot write before it works (or waits) on anything: the
    first check runs the pwan_evaluate executable, the others the tools' main(argv) in this
    process."""
    (tmp_path / 'afile').write_text('x')
    cases = [
        (
            'pwan_evaluate',
            ['--offline', '--bag', small_bag, '--max-scans', '2', '--output'],
            'not a directory',
        ),
        ('pwan_sim', ['--scans', '2', '--output'], 'already exists'),
        (
            'pwan_replay',
            ['--bag', small_bag, '--startup-timeout', '60', '--output'],
            'not a directory',
        ),
        ('pwan_demo', ['--output'], 'not a directory'),
    ]
    for k, (name, args, words) in enumerate(cases):
        t0 = time.monotonic()
        proc = (tool if k == 0 else lambda *a: cli_main(capfd, *a))(
            name, *args, tmp_path / 'afile'
        )
        assert_one_line_failure(proc, 2, ['afile', words])
        assert time.monotonic() - t0 < 30, f'{name} worked (or waited) before checking --output'
        proc = cli_main(capfd, name, *args, unwritable_dir / 'out')
        assert_one_line_failure(proc, 2, [str(unwritable_dir), 'not writable'])
    assert (tmp_path / 'afile').read_text() == 'x'


def test_a_file_that_is_no_bag_is_one_line(tmp_path, capfd):
    """A --bag of no known storage format (rosbags refuses it while opening) is bad input (the
    pwan_evaluate executable; pwan_replay's main(argv) in this process)."""
    notbag = tmp_path / 'some_file.txt'
    notbag.write_text('x\n')
    for k, (name, args) in enumerate(
        [
            ('pwan_evaluate', ['--offline', '--bag', notbag, '--json']),
            ('pwan_replay', ['--bag', notbag, '--output', tmp_path / 'out']),
        ]
    ):
        proc = tool(name, *args) if k == 0 else cli_main(capfd, name, *args)
        assert_one_line_failure(proc, 2, ['some_file.txt', 'Unrecognized storage format'])
    assert entries(tmp_path) == ['some_file.txt']


@pytest.mark.heavy
def test_evaluate_unusable_estimator_factory_is_one_line(tmp_path, small_bag, capfd):
    """--estimator module:factory: a factory that needs arguments, or whose result is no
    estimate(points_xyz, stamp) callable, is bad input, refused before any output (the
    executable for the first, its main(argv) in this process for the others)."""
    out = tmp_path / 'out'
    for k, (spec, words) in enumerate(
        [
            ('os:system', 'not a factory callable without arguments'),
            ('os.path:sep', 'not a factory callable without arguments'),
            ('os:getcwd', 'getcwd() returned str, not an estimator'),
        ]
    ):
        args = ['--offline', '--bag', small_bag, '--estimator', spec, '--output', out]
        proc = tool('pwan_evaluate', *args) if k == 0 else cli_main(capfd, 'pwan_evaluate', *args)
        assert_one_line_failure(proc, 2, [spec, words])
        assert not out.exists()


def test_bad_topics_and_scan_counts_are_refused_before_writing(tmp_path, capfd):
    """Two message types on one topic, an invalid ROS topic name, an empty or absolute frame id
    (TF cannot use either), an empty output path, a negative --max-scans: one line naming the
    flag, exit 2, nothing written. The first case runs the pwan_sim executable, the others the
    tools' main(argv) in this process."""
    scans = tmp_path / 'scans'
    scans.mkdir()
    write_pcd(scans / 'scan0.pcd', points(0), 'binary')
    (tmp_path / 'poses.tum').write_text('0 0 0 0 0 0 0 1\n')
    pcd2bag = ['--scans', scans, '--poses', tmp_path / 'poses.tum', '--output', tmp_path / 'bag']
    cases = [
        ('pwan_sim', ['--points-topic', '/a', '--gt-topic', '/a'], "--gt-topic '/a'"),
        ('pwan_sim', ['--points-topic', 'bad topic'], "--points-topic 'bad topic'"),
        ('pwan_sim', ['--gt-topic', '/clock'], "--gt-topic '/clock'"),
        ('pwan_pcd2bag', [*pcd2bag, '--topic', '/points/'], "--topic '/points/'"),
        ('pwan_pcd2bag', [*pcd2bag, '--gt-topic', '/points'], "--gt-topic '/points'"),
        ('pwan_sim', ['--frame-id', ''], "--frame-id '': expected a frame id (not empty"),
        ('pwan_pcd2bag', [*pcd2bag, '--world-frame', '/map'], "--world-frame '/map'"),
        ('pwan_pcd2bag', [*pcd2bag[:-1], ''], 'empty output path'),
        (
            'pwan_evaluate',
            ['--offline', '--bag', tmp_path / 'bag', '--max-scans', '-1'],
            '--max-scans -1',
        ),
    ]
    for k, (name, args, words) in enumerate(cases):
        extra = ['--scans', '2', '--output', tmp_path / 'bag'] if name == 'pwan_sim' else []
        if name == 'pwan_evaluate':
            extra = ['--output', tmp_path / 'eval']
        proc = tool(name, *args, *extra) if k == 0 else cli_main(capfd, name, *args, *extra)
        assert_one_line_failure(proc, 2, [words])
        assert entries(tmp_path) == ['poses.tum', 'scans'], name


def test_sim_on_a_full_disk_leaves_no_bag(tmp_path):
    proc = tool(
        'pwan_sim',
        '--scans',
        '20',
        '--beams',
        '8',
        '--azimuth-steps',
        '360',
        '--output',
        tmp_path / 'bag',
        fsize=100_000,
    )
    assert_one_line_failure(proc, 2, [str(tmp_path / 'bag'), 'File too large'])
    assert entries(tmp_path) == []


def _interrupt(cmd, tmp_path, sig):
    """Start ``cmd``; once its temporary bag directory exists, send ``sig``."""
    proc = subprocess.Popen(
        [str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while (
        not any(n.startswith('.bag.') for n in entries(tmp_path)) and time.monotonic() < deadline
    ):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM])
def test_sim_interrupted_exits_130_and_leaves_no_bag(tmp_path, sig):
    rc, err = _interrupt(
        [BIN / 'pwan_sim', '--scans', '2000', '--output', tmp_path / 'bag'], tmp_path, sig
    )
    assert rc == 130 and err.strip() == 'pwan_sim: interrupted', err
    assert entries(tmp_path) == []


def test_pcd2bag_corrupt_scan_midway_leaves_no_bag(tmp_path):
    scans = tmp_path / 'scans'
    scans.mkdir()
    for k in range(4):
        write_pcd(scans / f'scan{k}.pcd', points(k, n=50), 'binary')
    (scans / 'scan2.pcd').write_bytes((scans / 'scan2.pcd').read_bytes()[:-37])  # truncated copy
    np.savetxt(
        tmp_path / 'poses.tum', np.column_stack([np.arange(4.0), np.zeros((4, 6)), np.ones(4)])
    )
    out = tmp_path / 'out'
    out.mkdir()
    proc = tool(
        'pwan_pcd2bag',
        '--scans',
        scans,
        '--poses',
        tmp_path / 'poses.tum',
        '--output',
        out / 'bag',
    )
    assert_one_line_failure(proc, 2, ['scan2.pcd'])
    assert entries(out) == []


@pytest.mark.heavy
def test_evaluation_outputs_follow_the_umask(tmp_path, small_bag):
    out = tmp_path / 'eval'
    proc = tool(
        'pwan_evaluate',
        '--offline',
        '--bag',
        small_bag,
        '--max-scans',
        '3',
        '--output',
        out,
        umask=0o027,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ('summary.json', 'run.json', 'trajectory_est.tum', 'trajectory.png'):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o640, name
    assert not [n for n in entries(out) if n.startswith('.')]
    bag = tmp_path / 'bag'
    proc = tool(
        'pwan_sim',
        '--scans',
        '2',
        '--beams',
        '4',
        '--azimuth-steps',
        '90',
        '--output',
        bag,
        umask=0o027,
    )
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(bag.stat().st_mode) == 0o750
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o640 for p in bag.iterdir())
