"""``ros2 launch pwan_ros ...`` for real, as a user with a colcon workspace runs it.

The package is built with colcon into a scratch workspace; the upstream Jazzy launch tooling
(``../shared/ros2-launch``: launch, launch_ros, ros2cli wheels and the composition_interfaces
definition, none of them on the package index) is installed into a scratch prefix; then
``. install/setup.sh && ros2 launch pwan_ros register.launch.py ...`` runs in its own DDS domain.
Checked: launch arguments reach the node (``ros2 param dump``), a replayed bag is answered scan
for scan, SIGINT ends everything with exit code 0 and no process left, and what cannot run (a
missing bag, rviz2 not installed) stops the launch before any process starts.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from pwan_ros.evaluation.run_record import RunRecord
from pwan_ros.ros.env import isolated_ros_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the launch tooling wheels; PWAN_ROS2_LAUNCH names another copy
LAUNCH_TOOLING = pathlib.Path(
    os.environ.get('PWAN_ROS2_LAUNCH', ROOT.parent / 'shared' / 'ros2-launch')
)
BIN = pathlib.Path(sys.executable).parent
PYVER = f'python{sys.version_info.major}.{sys.version_info.minor}'


def _run(cmd, log, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    log.write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f'{cmd[:3]} failed:\n{(proc.stdout + proc.stderr)[-3000:]}'


@pytest.fixture(scope='session')
def launch_prefix(tmp_path_factory):
    """A scratch prefix with ros2cli/ros2launch (pure Python) and composition_interfaces (built
    from its definition with the rosidl generators of this environment): {PYTHONPATH, PATH, ...}
    additions for the launch environment."""
    wheels = sorted((LAUNCH_TOOLING / 'wheels').glob('*.whl'))
    assert wheels, (
        f'the ROS 2 launch tooling wheels are expected in {LAUNCH_TOOLING}/wheels '
        '(../shared/ros2-launch beside the checkout, or PWAN_ROS2_LAUNCH)'
    )
    work = tmp_path_factory.mktemp('launch_tooling')
    tooling, prefix = work / 'tooling', work / 'prefix'
    _run(
        [
            sys.executable,
            '-m',
            'pip',
            'install',
            '-q',
            '--disable-pip-version-check',
            '--no-deps',
            '--no-index',
            '--target',
            str(tooling),
            *map(str, wheels),
        ],
        work / 'pip.log',
        timeout=300,
    )
    env = dict(os.environ, AMENT_PREFIX_PATH=os.environ.get('AMENT_PREFIX_PATH', sys.prefix))
    env.pop('_ROS_WHEELS_BOOTSTRAP_COMPLETE', None)
    build = work / 'build'
    _run(
        [
            'cmake',
            '-S',
            str(LAUNCH_TOOLING / 'interfaces' / 'composition_interfaces'),
            '-B',
            str(build),
            f'-DCMAKE_INSTALL_PREFIX={prefix}',
            f'-DCMAKE_PREFIX_PATH={sys.prefix}',
            f'-DPython3_EXECUTABLE={sys.executable}',
            '-DBUILD_TESTING=OFF',
            '-DCMAKE_BUILD_TYPE=Release',
        ],
        work / 'configure.log',
        env=env,
        timeout=300,
    )
    _run(
        ['cmake', '--build', str(build), '-j', str(os.cpu_count() or 2)],
        work / 'build.log',
        env=env,
        timeout=600,
    )
    _run(['cmake', '--install', str(build)], work / 'install.log', env=env, timeout=120)
    return {
        'PATH': f"{tooling / 'bin'}:{BIN}",
        'PYTHONPATH': f"{tooling}:{prefix / 'lib' / PYVER / 'site-packages'}",
        'LD_LIBRARY_PATH': str(prefix / 'lib'),
        'AMENT_PREFIX_PATH': f'{prefix}:{sys.prefix}',
    }


@pytest.fixture
def launch_env(tmp_path, launch_prefix, colcon_install):
    """Environment of a user's shell with the workspace sourced: {env, setup script}."""
    env = isolated_ros_env(tmp_path, domain_id=None)  # own domain in 101..199
    for key, value in launch_prefix.items():
        env[key] = value + (f':{env[key]}' if env.get(key) and key != 'AMENT_PREFIX_PATH' else '')
    return env, colcon_install / 'setup.sh'


def sourced(env_setup, *cmd):
    """``cmd`` run in bash after sourcing the workspace, exec'd so that signals reach it."""
    env, setup = env_setup
    line = f'. {setup} && exec ' + ' '.join(f"'{c}'" for c in cmd)
    return ['bash', '-c', line], env


def start_launch(env_setup, log, *args):
    cmd, env = sourced(env_setup, 'ros2', 'launch', 'pwan_ros', *args)
    return subprocess.Popen(
        cmd, env=env, stdout=log.open('w'), stderr=subprocess.STDOUT, start_new_session=True
    )


def param_dump(env_setup, timeout=90.0, node='/pwan_odometry'):
    """``ros2 param dump NODE`` once the node answers: its parameters, name -> value (one CLI
    call for all of them; each call starts a ROS process and discovers the graph anew)."""
    cmd, env = sourced(env_setup, 'ros2', 'param', 'dump', '--no-daemon', node)
    end = time.monotonic() + timeout
    while True:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        if proc.returncode == 0 or time.monotonic() > end:
            assert proc.returncode == 0, proc.stdout + proc.stderr
            return yaml.safe_load(proc.stdout)[node]['ros__parameters']
        time.sleep(1.0)


def stop_launch(launch, log):
    """SIGINT to ros2 launch (Ctrl-C): exit code 0 and every process it started gone."""
    children = psutil.Process(launch.pid).children(recursive=True)
    assert any('pwan_odometry_node' in ' '.join(c.cmdline()) for c in children), log.read_text()
    launch.send_signal(signal.SIGINT)
    try:
        rc = launch.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        raise AssertionError('ros2 launch did not end on SIGINT:\n' + log.read_text()[-3000:])
    _, alive = psutil.wait_procs(children, timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f'left running: {[p.cmdline() for p in alive]}'
    return rc


@pytest.mark.ros
@pytest.mark.build
def test_register_launch_answers_a_replayed_bag(tmp_path, launch_env, small_bag):
    """The simulated bag of 6 scans (conftest's small_bag: made in this process; pwan_sim itself
    writes bags in test_faults_eval) replayed into the launched node."""
    bag = small_bag
    log = tmp_path / 'launch.log'
    launch = start_launch(
        launch_env,
        log,
        'register.launch.py',
        'odom_frame:=odom_launch',
        'use_sim_time:=true',
        'device:=cpu',
        'points:=/sim/points',
    )
    try:
        params = param_dump(launch_env)
        assert params['odom_frame'] == 'odom_launch'
        assert params['use_sim_time'] is True
        assert params['device'] == 'cpu'
        assert params['mode'] == 'adaptive'  # the installed params file
        env, _ = launch_env
        replay = subprocess.run(
            [
                str(BIN / 'pwan_replay'),
                '--bag',
                str(bag),
                '--output',
                str(tmp_path / 'run'),
                '--wait-for-pose',
                '60',
                '--remap',
                '/points:=/sim/points',
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert replay.returncode == 0, replay.stderr[-3000:]
        assert 'deprecated' not in replay.stderr, replay.stderr  # --remap is ours, not rcl's
    finally:
        rc = stop_launch(launch, log)
    assert rc == 0, log.read_text()[-3000:]
    run = RunRecord.load(tmp_path / 'run' / 'run.json')
    assert run.scans_published == 6 and run.scans == 6 and run.scans_dropped == 0


@pytest.mark.ros
@pytest.mark.build
def test_odometry_launch_with_params_file_and_remap(tmp_path, launch_env):
    """A params file keyed by the node's plain name applies in a namespace too (rcl alone would
    match only /robot1/pwan_odometry); the absolute points topic stays where it is."""
    params = tmp_path / 'robot.yaml'
    params.write_text(
        'pwan_odometry:\n  ros__parameters:\n    scan_voxel_size: 0.35\n    mode: tracking\n'
    )
    log = tmp_path / 'launch.log'
    launch = start_launch(
        launch_env,
        log,
        'odometry.launch.py',
        f'params_file:={params}',
        'points:=/ouster/points',
        'base_frame:=base_link',
        'namespace:=robot1',
    )
    try:
        params = param_dump(launch_env, node='/robot1/pwan_odometry')
        assert params['scan_voxel_size'] == 0.35
        assert params['mode'] == 'tracking'
        assert params['base_frame'] == 'base_link'
        cmd, env = sourced(
            launch_env,
            'ros2',
            'topic',
            'info',
            '--no-daemon',
            '--spin-time',
            '5',
            '/ouster/points',
        )
        info = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert 'Type: sensor_msgs/msg/PointCloud2' in info.stdout, info.stdout + info.stderr
        assert 'Subscription count: 2' in info.stdout, info.stdout  # the two readers of 'auto'
    finally:
        rc = stop_launch(launch, log)
    assert rc == 0, log.read_text()[-3000:]


@pytest.mark.ros
@pytest.mark.build
@pytest.mark.parametrize(
    'args, says',
    [
        (('bagfile:=/nonexistent/bag',), 'no such bag'),
        (('bagfile:=/',), 'ros2bag'),
        (('rviz:=true',), 'rviz2'),
        (('params_file:=/nonexistent/robot.yaml',), 'no such file'),
    ],
)
def test_launch_refuses_before_starting_anything(tmp_path, launch_env, args, says):
    """rviz2 and ros2bag are not installed here: the launch stops with one error line, exit 1,
    and no node was started (before, rviz:=true left the node running as an orphan; a missing
    params file was dropped by launch_ros with a warning and the node ran on its defaults)."""
    cmd, env = sourced(launch_env, 'ros2', 'launch', 'pwan_ros', 'register.launch.py', *args)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    errors = [ln for ln in out.splitlines() if '[ERROR]' in ln]
    assert len(errors) == 1 and says in errors[0], out
    assert 'process started' not in out and 'Traceback' not in out, out


@pytest.mark.ros
@pytest.mark.build
def test_launch_exits_1_when_the_node_refuses_its_parameters(tmp_path, launch_env):
    """The node refuses device:=gpu with one line and exit code 2: the launch stops and returns
    1 (ros2 launch alone logs the death and returns 0, so a script saw success)."""
    cmd, env = sourced(
        launch_env, 'ros2', 'launch', 'pwan_ros', 'register.launch.py', 'device:=gpu'
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "invalid value 'gpu' for parameter 'device'" in out, out
    errors = [ln for ln in out.splitlines() if 'exited with code 2' in ln]
    assert len(errors) == 1 and 'pwan_odometry_node' in errors[0], out
    assert 'Traceback' not in out, out
