"""Shared fixtures: an isolated ROS 2 environment for tests that start real ROS processes; the
test run's threads, DDS domains and xdist scheduling (``make test`` runs two workers)."""

import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys

import pytest

from pwan_ros.ros.env import isolated_ros_env

# One thread per BLAS / OpenMP pool, in this process and in every process a test starts (they
# inherit the environment): set before numpy or torch is first imported (nothing imported above
# loads them). Two xdist workers (and whatever else runs) share the cores; a pool of 2 threads
# that spin-wait for a busy core made a 4 s non-rigid registration take 28 s. The registrations
# set torch's threads themselves (``RegistrationConfig.threads``), small_gicp its own.
for _pool in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
    os.environ.setdefault(_pool, '1')

# Wheel-based ROS installs live in the venv prefix; ament_index look-ups need it named.
# (A sourced system ROS sets AMENT_PREFIX_PATH itself.)
os.environ.setdefault('AMENT_PREFIX_PATH', sys.prefix)

# The tests that press Ctrl-C (SIGINT to pwan_sim, pwan_register, ros2 launch) start those
# programs as a terminal would: with SIGINT at its default. A suite started as a background job
# of a non-interactive shell (``make test &`` in a script) inherits SIGINT ignored, and an ignored
# signal stays ignored across exec in every child; a Python handler does not (exec resets it).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: test files that run on one xdist worker together (``make test``: ``--dist loadfile``, each file
#: whole on one worker, in order): those whose ROS processes pick their own DDS domain in 101..199
#: (pwan_demo, a launch from a sourced workspace), which two workers could otherwise both pick at
#: the same time
SHARED_GROUP = 'tool_domains'
SHARED_FILES = ('test_demo_e2e.py', 'test_launch_real.py', 'test_replay.py')
#: the largest test files, whose module fixtures are cheap: their tests are handed to the workers
#: one by one (a whole file scheduled last would leave the other worker idle for minutes)
SPLIT_FILES = ('test_core_register.py', 'test_faults_register.py', 'test_odometry_node.py')


def pytest_collection_modifyitems(config, items):
    """A test that takes the ``ros_env`` fixture starts ROS processes: it must carry the ``ros``
    marker, so that ``make test-unit`` (``-m "not ros ..."``) really runs no DDS.

    The files of :data:`SHARED_FILES` (minutes of replays, mostly waiting) run first; the order
    of the other files and of the tests within a file is kept."""
    unmarked = [
        i.nodeid
        for i in items
        if 'ros_env' in getattr(i, 'fixturenames', ()) and i.get_closest_marker('ros') is None
    ]
    if unmarked:
        raise pytest.UsageError(
            'tests using ros_env without @pytest.mark.ros: ' + ', '.join(unmarked)
        )
    items.sort(key=lambda i: i.path.name not in SHARED_FILES)  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the files of :data:`SHARED_FILES` as one scope and each test of
    :data:`SPLIT_FILES` its own. (xdist's ``loadgroup`` and ``xdist_group`` markers do not group
    under pytest 9.2: xdist renames ``item._nodeid``, which pytest no longer reads.)"""
    if config.getvalue('dist') != 'loadfile':
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndSharedGroup(LoadFileScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split('::', 1)[0]
            name = path.rsplit('/', 1)[-1]
            if name in SHARED_FILES:
                return SHARED_GROUP
            return nodeid if name in SPLIT_FILES else path

    return FilesAndSharedGroup(config, log)


def test_domain_id() -> int:
    """A random DDS domain for a test's ROS processes: in 1..100 (tools pick 101..199), and with
    xdist in this worker's share of it (gw0: 1..50, gw1: 51..100, ...), so that tests running at
    the same time on two workers never share a domain."""
    worker = os.environ.get('PYTEST_XDIST_WORKER', '')
    count = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1') or 1)
    if not worker.startswith('gw') or count < 2:
        return random.randint(1, 100)
    size = 100 // count
    k = int(worker[2:]) % count
    return random.randint(1 + k * size, (k + 1) * size)


test_domain_id.__test__ = False  # a helper, not a test


ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def small_bag(tmp_path_factory):
    """A tiny simulated rosbag2 (:func:`simbag.make_small_bag`), generated once per test module."""
    from simbag import make_small_bag

    return make_small_bag(tmp_path_factory.mktemp('simbag') / 'bag')


@pytest.fixture(scope='session')
def colcon_install(tmp_path_factory):
    """The package built by ``colcon build`` in a scratch workspace: its install base."""
    colcon = shutil.which('colcon') or str(pathlib.Path(sys.executable).with_name('colcon'))
    assert os.path.exists(colcon), 'colcon is part of the test extras (pip install -e .[test])'
    work = tmp_path_factory.mktemp('colcon')
    env = dict(os.environ, COLCON_HOME=str(work / 'colcon_home'))
    proc = subprocess.run(
        [
            colcon,
            '--log-base',
            str(work / 'log'),
            'build',
            '--base-paths',
            str(ROOT),
            '--packages-select',
            'pwan_ros',
            '--build-base',
            str(work / 'build'),
            '--install-base',
            str(work / 'install'),
            '--event-handlers',
            'console_direct-',
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work / 'install'


@pytest.fixture
def ros_env(tmp_path):
    """The package's own isolated ROS environment (:func:`pwan_ros.ros.env.isolated_ros_env`):
    its own DDS domain (1..100; tools use 101..199), localhost discovery, LARGE_DATA transports,
    logs in the test's temporary directory."""
    return isolated_ros_env(tmp_path, domain_id=test_domain_id())


@pytest.fixture
def thread_starts(monkeypatch):
    """Names of the Python threads started while the test runs (scipy's k-d tree starts its
    query workers as such threads, anew on every call); undo with ``monkeypatch.undo()``."""
    import threading

    started = []
    start = threading.Thread.start

    def counting_start(self):
        started.append(self.name)
        return start(self)

    monkeypatch.setattr(threading.Thread, 'start', counting_start)
    return started


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory the test process cannot create files in: a 0555 directory, or for root (who
    writes through permissions) /proc/sys, which no process can write into."""
    d = tmp_path / 'readonly'
    d.mkdir()
    d.chmod(0o555)
    yield d if not os.access(d, os.W_OK) else pathlib.Path('/proc/sys')
    d.chmod(0o755)


def cli_main(capfd, name, *args):
    """The console script ``name``'s ``main(argv)`` (setup.py's entry point) run in this process,
    as a CompletedProcess (returncode, stdout, stderr; a SystemExit's code, its message on stderr
    as the interpreter prints it). For what a tool refuses before any work: the same parsing and
    checks as the executable, without a process start and its imports per case. Tests that are
    about the process (exit on a signal, a full disk, the umask) run the executable."""
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group='console_scripts') if e.name == name]
    argv = [str(a) for a in args]
    capfd.readouterr()
    message = ''
    try:
        rc = ep.load()(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) or exc.code is None else 1
        message = '' if isinstance(exc.code, int) or exc.code is None else f'{exc.code}\n'
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([name, *argv], rc or 0, out, err + message)


def assert_one_line_failure(proc, code=2, contains=()):
    """A CLI failure by the package's contract: exit ``code``, one non-empty stderr line, no
    traceback, naming each of ``contains``."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert 'Traceback' not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    for text in contains:
        assert str(text) in lines[0], (text, lines[0])
