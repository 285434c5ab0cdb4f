"""The real ``pwan_odometry_node`` executable in a subprocess, driven over DDS."""

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from pwan_ros.geometry.se3 import from_quaternion, invert, rotation_angle
from pwan_ros.io.point_files import write_points

PEERS = pathlib.Path(__file__).parent / 'peers'
NODE = pathlib.Path(sys.executable).with_name('pwan_odometry_node')


def start_node(env, *params, params_file=None, preexec_fn=None, log=None, command=None):
    """The node (or ``command``, a list) in a subprocess; its output to a pipe, or to the file
    ``log`` (read it while the node runs)."""
    cmd = (command or [str(NODE)]) + ['--ros-args']
    if params_file:
        cmd += ['--params-file', str(params_file)]
    for p in params:
        cmd += ['-p', p]
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE if log is None else log.open('w'),
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=preexec_fn,
    )


def wait_for_log(log, text, timeout):
    """Wait until ``text`` is in the file ``log`` (True) or ``timeout`` seconds pass (False)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text():
            return True
        time.sleep(0.2)
    return text in log.read_text()


def stop_node(proc):
    proc.send_signal(2)  # SIGINT, as Ctrl-C
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError('pwan_odometry_node did not stop on SIGINT:\n' + out[-3000:])
    return proc.returncode, out


def node_main(ros_env, monkeypatch, capfd, argv, cwd=None):
    """``pwan_odometry_node``'s ``main`` with ``argv`` (after the program name) in this process,
    in the test's DDS domain: (exit code, everything it printed, rclpy's C output included). For
    what the node refuses at start-up (rclpy parses the same arguments, the node runs the same
    checks): a subprocess would only add seconds of imports. The executable's own exit status
    and one-line output are checked in a subprocess by test_faults_register's
    test_node_bad_start_up_one_line_exit_2. A node that accepts ``argv`` fails the test instead
    of spinning."""
    from pwan_ros.ros import odometry_node

    class MustRefuse(odometry_node.OdometryNode):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.destroy_node()
            raise AssertionError(f'pwan_odometry_node accepted {argv}')

    for key in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE', 'FASTDDS_BUILTIN_TRANSPORTS'):
        monkeypatch.setenv(key, ros_env[key])
    monkeypatch.setattr(odometry_node, 'OdometryNode', MustRefuse)
    if cwd is not None:
        monkeypatch.chdir(cwd)
    capfd.readouterr()
    rc = odometry_node.main([str(NODE), *argv])
    out, err = capfd.readouterr()
    return rc, out + err


def scenario_messages(path, scenario, extra):
    """The scans of the driver's ``scenario`` (``--scans`` of ``extra``, else the driver's 12),
    made in this process (the simulator is imported here already; it takes the driver seconds),
    written to ``path`` for the driver's ``--messages``."""
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import scan_driver

    extra = [str(e) for e in extra]
    scans = int(extra[extra.index('--scans') + 1]) if '--scans' in extra else 12
    scan_driver.save_messages(path, scan_driver.messages(scenario, scans))
    return path


def drive(env, tmp_path, scenario, *extra, timeout=600):
    out = tmp_path / f'{scenario}.json'
    msgs = scenario_messages(tmp_path / f'{scenario}.msgs', scenario, extra)
    proc = subprocess.run(
        [
            sys.executable,
            str(PEERS / 'scan_driver.py'),
            '--scenario',
            scenario,
            '--messages',
            str(msgs),
            '--out',
            str(out),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def scenario(env, tmp_path, name, *extra, params=(), command=None):
    """The node (with ``params``; ``command``: another executable) driven through scenario
    ``name`` of the scan driver; it must exit 0 without a traceback. Returns (the driver's
    record, the node's log)."""
    node = start_node(env, *params, command=command)
    try:
        res = drive(env, tmp_path, name, *extra)
    finally:
        rc, log = stop_node(node)
    assert rc == 0 and 'Traceback' not in log, log[-3000:]
    return res, log


def odom_pose(ans):
    o = ans['odom']
    return from_quaternion(o['orientation'], o['position'])


@pytest.mark.ros
def test_node_tracks_simulated_scans(tmp_path, ros_env):
    node = start_node(ros_env)
    try:
        res = drive(ros_env, tmp_path, 'sim', '--scans', '10')
    finally:
        rc, log = stop_node(node)
    assert rc == 0, log[-3000:]
    assert 'Traceback' not in log, log[-3000:]
    sent = res['sent']
    gt0 = np.array(sent[0]['gt'])
    errors = []
    for s in sent:
        ans = res['answers'][str(s['stamp'])]
        assert ans['odom']['frame'] == 'odom' and ans['odom']['child'] == 'base_link'
        est = odom_pose(ans)
        gt = invert(gt0) @ np.array(s['gt'])
        err = invert(gt) @ est
        errors.append((np.degrees(rotation_angle(err)), np.linalg.norm(err[:3, 3])))
        diag = ans['diag']
        assert diag['level'] == 0, diag
        assert diag['values']['path'] in ('init', 'track')
        assert float(diag['values']['matched_ratio']) > 0.5
        assert float(diag['values']['latency_ms']) > 0
    errors = np.array(errors)
    # ~0.3 m and a few degrees between scans; small_gicp-class accuracy expected
    assert np.max(errors[:, 0]) < 0.5, errors
    assert np.max(errors[:, 1]) < 0.05, errors
    # TF odom -> base_link for every scan, stamped like the scans
    tf_stamps = {t[2] for t in res['tf'] if t[:2] == ['odom', 'base_link']}
    assert {s['stamp'] for s in sent} <= tf_stamps
    # aligned cloud: odom frame, extra fields carried through
    last = res['aligned'][-1]
    assert last['frame'] == 'odom'
    assert last['fields'][:5] == ['x', 'y', 'z', 'intensity', 'ring']
    assert last['points'] > 1000


@pytest.mark.ros
def test_a_deformation_the_self_check_refuses_is_not_published_as_aligned(tmp_path, ros_env):
    """transform nonrigid with a reference cloud: a bent scan of the object is deformed onto it
    and published; a scan where nothing fits is refused by the core's self-check (the node ran
    the core without it), answered WARN with the held pose, and no aligned cloud."""
    sys.path.insert(0, str(PEERS))
    from scan_driver import deform_object

    write_points(str(tmp_path / 'ref.ply'), deform_object()[0])
    params = (f'reference_cloud:={tmp_path / "ref.ply"}', 'transform:=nonrigid')
    res, _ = scenario(ros_env, tmp_path, 'deform', params=params)
    answers = {s['label']: res['answers'][str(s['stamp'])] for s in res['sent']}
    aligned = {a['stamp'] for a in res['aligned']}
    bent, far = res['sent']
    assert answers['bent']['diag']['level'] == 0 and bent['stamp'] in aligned, answers['bent']
    assert answers['far']['diag']['level'] == 1 and far['stamp'] not in aligned
    assert 'the self-check refused the deformation' in answers['far']['diag']['message']


@pytest.mark.ros
def test_node_deskews_scans_with_point_times(tmp_path, ros_env):
    """A fast drive (10 m/s) whose clouds carry per-point times ('t', Ouster convention): with
    deskew auto (the default) the node motion-compensates every scan once it has a velocity (the
    third on), and tracks. ``deskew:=off``: test_deskew_off_is_accepted_and_reads_no_times."""
    node = start_node(ros_env, 'deskew:=auto')
    try:
        res = drive(ros_env, tmp_path, 'sweep', '--scans', '5')
    finally:
        rc, log = stop_node(node)
    assert rc == 0 and 'Traceback' not in log, log[-3000:]
    sent = res['sent']
    flags = [res['answers'][str(s['stamp'])]['diag']['values']['deskewed'] for s in sent]
    assert flags == ['false'] * 2 + ['true'] * 3, flags
    used = {res['answers'][str(s['stamp'])]['diag']['values']['point_times'] for s in sent}
    assert used == {'used'}, used
    # relative motion over 3 m (the odom origin is the first scan's mid-sweep pose)
    first, last = sent[1], sent[-1]
    gt = invert(np.array(first['gt'])) @ np.array(last['gt'])
    est = invert(odom_pose(res['answers'][str(first['stamp'])])) @ odom_pose(
        res['answers'][str(last['stamp'])]
    )
    assert np.linalg.norm(gt[:3, 3]) > 2.5  # it moved
    assert np.linalg.norm((invert(gt) @ est)[:3, 3]) < 0.3, (est, gt)


@pytest.mark.ros
def test_deskew_off_is_accepted_and_reads_no_times(ros_env, monkeypatch):
    """``-p deskew:=off`` (YAML reads off as a boolean) is accepted and turns deskew off: the
    node registers the drive's scans without their per-point times (point_times 'off', deskewed
    'false'), and tracks. The node in this process, the scans handed to its scan handler (the
    same drive over DDS with deskew auto: test_node_deskews_scans_with_point_times)."""
    import time

    import rclpy
    from diagnostic_msgs.msg import DiagnosticStatus

    from pwan_ros.ros.odometry_node import OdometryNode

    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import scan_driver

    for key in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE', 'FASTDDS_BUILTIN_TRANSPORTS'):
        monkeypatch.setenv(key, ros_env[key])
    said = []
    rclpy.init(args=['--ros-args', '-p', 'deskew:=off'])
    try:
        node = OdometryNode()
        try:
            assert node.config.deskew == 'off'
            monkeypatch.setattr(
                node, '_publish_diagnostics', lambda stamp, *status: said.append(status)
            )
            for _, msg, _ in scan_driver.messages('sweep', 4):
                node._handle(msg, time.perf_counter())
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown()
    scans = [(level, values) for level, _, values in said if 'point_times' in values]
    assert [v['point_times'] for _, v in scans] == ['off'] * 4, said
    assert [v['deskewed'] for _, v in scans] == ['false'] * 4, said
    assert [level for level, _ in scans] == [DiagnosticStatus.OK] * 4, said
    assert [v['path'] for _, v in scans] == ['init', 'track', 'track', 'track'], said


def followed_and_skipped(res, other: str, error: str) -> None:
    """The scans labelled ``other`` got an ERROR containing ``error`` and no pose; the others
    were tracked within 0.1 m of the truth without a reset."""
    first = np.array(res['sent'][0]['gt'])
    for s in res['sent']:
        ans = res['answers'][str(s['stamp'])]
        if s['label'] == other:
            assert ans['diag']['level'] == 2 and 'odom' not in ans, ans
            assert error in ans['diag']['message'], ans['diag']['message']
        else:
            gt = invert(first) @ np.array(s['gt'])
            assert np.linalg.norm(odom_pose(ans)[:3, 3] - gt[:3, 3]) < 0.1, s['label']
            assert int(ans['diag']['values']['resets']) == 0


# covered fast by test_odometer's test_two_sources_on_one_topic_never_reset (interleaved frames:
# skipped, no reset) and, over DDS, test_node_survives_bad_input (another frame's scans: ERROR
# naming both frames, no pose) and test_two_writers_in_one_frame_give_an_error_and_are_not_mixed
# (interleaved, followed and skipped, the ERROR logged once per 5 s)
@pytest.mark.slow
@pytest.mark.ros
def test_two_sources_on_points_give_an_error_and_no_resets(tmp_path, ros_env):
    """Two drivers on ``points`` (frames base_link and second_lidar, interleaved): the node
    follows the first, skips the second's scans with an ERROR naming both frames (logged at
    most every 5 s) and never resets; before, every scan restarted it (15 resets in 16 scans)."""
    res, log = scenario(ros_env, tmp_path, 'two_sources', '--scans', '6')
    followed_and_skipped(res, 'second', "'second_lidar' while following frame 'base_link'")
    assert log.count('while following frame') == 1  # once per 5 s, not once per scan


@pytest.mark.ros
def test_dropped_scans_raise_over_budget_and_say_what_to_do(tmp_path, ros_env):
    """Scans arriving faster than ``mode:=pwan`` registers them (5 scans 10 ms apart; a PWAN
    registration, even of 40 steps, takes far longer on any machine: about 250 ms a scan here):
    the scans dropped meanwhile count in ``over_budget`` and the next answer is a WARN giving the
    drop rate and the advice (adaptive mode, a GPU); before, over_budget stayed 0 and nothing was
    said."""
    params = ['mode:=pwan', 'pwan_steps:=40']
    res, log = scenario(ros_env, tmp_path, 'sim', '--scans', '5', '--burst', params=params)
    values = res['answers'][str(res['sent'][-1]['stamp'])]['diag']['values']
    assert int(values['scans_dropped']) > 0 and int(values['over_budget']) > 0, values
    assert int(values['scans_processed']) + int(values['scans_dropped']) == 5, values
    # the scan during which the others were dropped says so
    behind = [
        a['diag']
        for a in res['answers'].values()
        if 'slower than the sensor' in a.get('diag', {}).get('message', '')
    ]
    assert behind and all(d['level'] == 1 for d in behind), res['answers']
    assert "use mode 'adaptive', or a GPU" in behind[0]['message']
    assert 'slower than the sensor' in log


@pytest.mark.ros
def test_scans_answered_during_a_slow_recovery_and_retracked_after(tmp_path, ros_env):
    """The node on a machine where a PWAN recovery takes 2 s longer (test/peers): the scans
    that arrive meanwhile are answered at once with predictions (WARN, covariance inflated,
    ``scans_predicted``), then re-tracked from the recovered pose: their final estimates on
    ``~/corrected_odometry`` are right, with the correction in the diagnostics. Before, the
    worker held every scan until the recovery returned."""
    slow = [sys.executable, str(PEERS / 'slow_recovery_node.py')]
    res, log = scenario(
        ros_env, tmp_path, 'stress', '--scans', '40', '--settle', '0.05', command=slow
    )
    first = np.array(res['sent'][0]['gt'])
    predicted, settled = [], []
    for s in res['sent']:
        ans = res['answers'][str(s['stamp'])]
        live = ans['diags'][0]
        truth = invert(first) @ np.array(s['gt'])
        if live['values']['path'] != 'predicted':
            assert 'corrected' not in ans and live['values']['final'] == 'true', ans
            continue
        predicted.append(s['stamp'])
        assert live['level'] == 1 and ans['odom']['covariance_xx'] > 1.0, live
        final = ans['diags'][-1]['values']
        assert final['final'] == 'true' and final['path'] in ('pwan', 'track'), ans['diags']
        est = from_quaternion(ans['corrected']['orientation'], ans['corrected']['position'])
        err = invert(truth) @ est
        assert np.linalg.norm(err[:3, 3]) < 0.1 and np.degrees(rotation_angle(err)) < 1.0
        settled.append(float(final['correction_deg']))
    # the scan that needed PWAN, and the scans during its 2 s, answered without waiting for it
    assert len(predicted) >= 4, [a['diags'][0]['values']['path'] for a in res['answers'].values()]
    every = [d['values'] for a in res['answers'].values() for d in a['diags']]
    last = max(every, key=lambda v: (int(v['scans_corrected']), int(v['scans_processed'])))
    assert int(last['scans_predicted']) == len(predicted) == int(last['scans_corrected'])
    assert max(settled) > 10.0  # the turn during the blackout: predictions were far off
    assert int(last['scans_dropped']) == 0


@pytest.mark.ros
def test_two_writers_in_one_frame_give_an_error_and_are_not_mixed(tmp_path, ros_env):
    """Two writers on ``points`` in the same frame (a driver started twice): the node follows
    the first writer, skips the other's scans with an ERROR saying so, and tracks right."""
    res, log = scenario(ros_env, tmp_path, 'two_writers', '--scans', '5')
    followed_and_skipped(res, 'writer2', 'two writers publish on /points')
    assert log.count('two writers publish') == 1


@pytest.mark.ros
def test_integer_doubles_and_the_stamp_without_clock(ros_env, monkeypatch):
    """``-p scan_voxel_size:=1`` (YAML reads an integer) sets the double parameter to 1.0;
    before, rclpy refused it for its type. Under sim time without /clock the node's own stamps
    (the no-scan status) come from the wall clock, not 0."""
    import rclpy

    from pwan_ros.ros.odometry_node import OdometryNode

    for key in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE', 'FASTDDS_BUILTIN_TRANSPORTS'):
        monkeypatch.setenv(key, ros_env[key])
    args = ['-p', 'scan_voxel_size:=1', '-p', 'max_speed:=20', '-p', 'use_sim_time:=true']
    rclpy.init(args=['--ros-args', *args])
    try:
        node = OdometryNode()
        try:
            assert node.config.scan_voxel_size == 1.0 and node.config.max_speed == 20.0
            assert isinstance(node.config.scan_voxel_size, float)
            assert node.get_clock().now().nanoseconds == 0  # sim time, no /clock
            assert node._now().sec > 1.7e9  # the wall clock
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown()


@pytest.mark.ros
def test_node_survives_bad_input(tmp_path, ros_env):
    node = start_node(ros_env, 'scan_max_points:=4000')
    try:
        res = drive(ros_env, tmp_path, 'bad')
        assert node.poll() is None, 'pwan_odometry_node died'
    finally:
        rc, log = stop_node(node)
    assert rc == 0, log[-3000:]
    answers = res['answers']
    by_label = {s['label']: answers.get(str(s['stamp'])) for s in res['sent']}
    labels = ('blank', 'empty', 'no_z', 'all_nan', 'bad_datatype', 'truncated', 'late')
    labels += ('no_frame', 'odom_frame', 'time_backwards', 'stamp_zero', 'wrong_byte_order')
    for label in labels:
        ans = by_label[label]
        assert ans is not None and 'odom' not in ans, label
        assert ans['diag']['level'] == 1, (label, ans)
    # the blank start-up frame (all points at the sensor) fixed nothing: the voxel size is the
    # street's (a blank frame used to set it to 0.02 m, and every scan after was rejected)
    assert 'range gate' in by_label['blank']['diag']['message']
    assert float(by_label['scan']['diag']['values']['voxel_size_m']) > 0.1
    assert 'is odom_frame' in by_label['odom_frame']['diag']['message']
    # a scan stamped 1 ms before the last is late: skipped, no reset
    assert 'late' in by_label['late']['diag']['message']
    assert (
        'x/y/z' in by_label['no_z']['diag']['message']
        or 'z' in by_label['no_z']['diag']['message']
    )
    # scans with NaN rows and a huge cloud are registered, not skipped
    for label in ('scan_with_nans', 'huge', 'scan'):
        ans = by_label[label]
        assert ans is not None and 'odom' in ans, (label, ans)
        assert ans['diag']['values']['path'] in ('init', 'track'), ans
    assert int(by_label['huge']['diag']['values']['num_points']) <= 4000
    # one scan stamped back in time (5 s, or 0) is skipped; odometry goes on, no reset
    for label in ('time_backwards', 'stamp_zero'):
        assert 'skipped as out of order' in by_label[label]['diag']['message'], label
    assert 'time went backwards' not in log
    assert by_label['scan_after_glitch']['diag']['values']['path'] == 'track'
    # a wrong byte-order flag is named as such
    assert 'is_bigendian is True' in by_label['wrong_byte_order']['diag']['message']
    # another frame: an ERROR naming both frames until 3 scans in a row, then a frame change,
    # which restarts registration but continues the pose from the last one
    for label in ('other_source_1', 'other_source_2'):
        ans = by_label[label]
        assert ans['diag']['level'] == 2 and 'odom' not in ans, (label, ans)
        assert "'other_lidar' while following frame 'base_link'" in ans['diag']['message']
    assert "frame changed from 'base_link' to 'other_lidar'" in log
    before = odom_pose(by_label['scan_after_glitch'])
    after = odom_pose(by_label['frame_change'])
    assert np.linalg.norm(before[:3, 3] - after[:3, 3]) < 1e-6
    # ... and says so: a WARN naming the change, the carried-over pose with a held covariance
    diag = by_label['frame_change']['diag']
    assert diag['level'] == 1 and 'frame changed' in diag['message'], diag
    assert (
        by_label['frame_change']['odom']['covariance_xx']
        > 10 * by_label['scan_after_glitch']['odom']['covariance_xx']
    )
    values = answers[str(res['sent'][-1]['stamp'])]['diag']['values']
    assert int(values['scans_invalid']) >= 11
    assert int(values['resets']) == 1


@pytest.mark.ros
@pytest.mark.parametrize(
    'param, words',
    [
        ('mode:=fastest', ["'mode'", 'adaptive | pwan']),
        ('mass_ratio:=1.5', ['mass_ratio']),
        ('scan_voxel_size:=fine', ['scan_voxel_size']),
        ('transform:=nonrigid', ["'transform'", 'reference_cloud']),
        ('reference_cloud:=/nonexistent/map.ply', ['reference_cloud', '/nonexistent/map.ply']),
        # names of no release (now scan_voxel_size, pwan_steps): unknown, refused in one line
        ('voxel_size:=0.3', ['unknown parameter(s): voxel_size']),
        ('steps:=50', ['unknown parameter(s): steps']),
    ],
)
def test_node_rejects_invalid_parameters(ros_env, monkeypatch, capfd, param, words):
    rc, text = node_main(ros_env, monkeypatch, capfd, ['--ros-args', '-p', param])
    assert rc == 2, text
    assert 'Traceback' not in text, text
    for w in words:
        assert w in text, text


@pytest.mark.ros
def test_params_file_and_overrides_reach_the_node(tmp_path, ros_env, monkeypatch):
    """The YAML files (the installed one, then the user's) load into the node's parameters, a
    later file over an earlier one; -p overrides them. The node in this process (rcl parses the
    same arguments as the executable's); its parameter service queried from another process over
    DDS: test_launch_real (``ros2 param dump`` of a launched node)."""
    import rclpy

    from pwan_ros.ros.odometry_node import OdometryNode

    root = pathlib.Path(__file__).resolve().parents[1]
    robot = tmp_path / 'robot.yaml'
    robot.write_text(
        'pwan_odometry:\n  ros__parameters:\n'
        '    scan_voxel_size: 0.5\n    scan_max_points: 12000\n'
    )
    for key in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE', 'FASTDDS_BUILTIN_TRANSPORTS'):
        monkeypatch.setenv(key, ros_env[key])
    args = ['--params-file', str(root / 'config' / 'odometry.yaml'), '--params-file', str(robot)]
    args += ['-p', 'scan_voxel_size:=0.3', '-p', 'mode:=pwan']
    rclpy.init(args=['--ros-args', *args])
    try:
        node = OdometryNode()
        try:
            names = ['scan_voxel_size', 'mode', 'scan_max_points', 'odom_frame', 'reliability']
            values = [node.get_parameter(n).value for n in names]
            assert values == [pytest.approx(0.3), 'pwan', 12000, 'odom', 'auto'], values
            cfg = node.config
            assert (cfg.scan_voxel_size, cfg.mode, cfg.scan_max_points) == (0.3, 'pwan', 12000)
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown()


# --- launch files -------------------------------------------------------------------------
# Fast checks of the launch files' own logic against small fakes of the documented launch API
# (injected in sys.modules): a fake accepts only keyword arguments that its upstream class takes,
# and a name the fakes do not define fails the import, so the launch files stay on that API. The
# launch machinery itself (argument parsing, process start, exit codes) runs for real in
# test/test_launch_real.py (upstream Jazzy launch tooling, a colcon-built workspace).

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: upstream keyword arguments (launch / launch_ros, Jazzy) the fakes accept
_PROCESS_KW = {
    'cmd',
    'name',
    'cwd',
    'env',
    'additional_env',
    'shell',
    'output',
    'emulate_tty',
    'prefix',
    'respawn',
    'respawn_delay',
    'sigterm_timeout',
    'sigkill_timeout',
    'condition',
}
_NODE_KW = (_PROCESS_KW - {'cmd'}) | {
    'executable',
    'package',
    'namespace',
    'exec_name',
    'parameters',
    'remappings',
    'ros_arguments',
    'arguments',
}


class _Fake:
    """A recorded launch entity: ``kind``, positional ``args``, keyword ``kw``."""

    allowed = frozenset()

    def __init__(self, *args, **kw):
        unknown = set(kw) - self.allowed
        if unknown:
            raise TypeError(
                f'{type(self).__name__}() got unexpected keyword arguments {sorted(unknown)}'
            )
        self.kind, self.args, self.kw = type(self).__name__, args, kw


def _fake(name, allowed=(), **methods):
    return type(name, (_Fake,), dict(methods, allowed=frozenset(allowed) | {'condition'}))


def _perform(value, context):
    """Substitutions inside a value (lists, tuples, dicts) performed like launch does."""
    if hasattr(value, 'perform'):
        return value.perform(context)
    if isinstance(value, (list, tuple)):
        return type(value)(_perform(v, context) for v in value)
    if isinstance(value, dict):
        return {_perform(k, context): _perform(v, context) for k, v in value.items()}
    return value


def _lc_perform(self, context):
    name = self.args[0]
    if name not in context.launch_configurations:
        if self.kw.get('default') is None:
            raise KeyError(f'launch configuration {name!r} is not set (undeclared argument?)')
        return self.kw['default']
    return context.launch_configurations[name]


def _launch_logger(name):
    """launch.logging.get_logger: a logger whose warnings the tests read (``WARNINGS``)."""
    import types

    return types.SimpleNamespace(warning=lambda text: WARNINGS.append(text))


#: what the launch files warned about through launch.logging (the fake)
WARNINGS = []

#: ROS packages the fake ament index knows besides pwan_ros (run_launch(missing=...) removes some)
FAKE_INSTALLED = ('ros2bag', 'rviz2')


def _fake_modules(share_root, missing=()):
    import types

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    def share(package):
        if package != 'pwan_ros' and (package not in FAKE_INSTALLED or package in missing):
            raise LookupError(package)
        return str(share_root / package)

    class LaunchDescription:
        def __init__(self, initial_entities=None):
            self.entities = list(initial_entities or [])

    def cond(negate):
        return lambda self, context: (
            (str(_perform(self.args[0], context)).lower() in ('true', '1')) != negate
        )

    return {
        'launch': module('launch', LaunchDescription=LaunchDescription),
        'launch.actions': module(
            'launch.actions',
            DeclareLaunchArgument=_fake(
                'DeclareLaunchArgument', {'default_value', 'description', 'choices'}
            ),
            OpaqueFunction=_fake('OpaqueFunction', {'function', 'args', 'kwargs'}),
            SetEnvironmentVariable=_fake('SetEnvironmentVariable'),
            ExecuteProcess=_fake('ExecuteProcess', _PROCESS_KW),
            IncludeLaunchDescription=_fake('IncludeLaunchDescription', {'launch_arguments'}),
            RegisterEventHandler=_fake('RegisterEventHandler'),
        ),
        'launch.event_handlers': module(
            'launch.event_handlers',
            OnProcessExit=_fake('OnProcessExit', {'target_action', 'on_exit'}),
            OnProcessIO=_fake('OnProcessIO', {'target_action', 'on_stdout', 'on_stderr'}),
        ),
        'launch.logging': module('launch.logging', get_logger=_launch_logger),
        'launch.conditions': module(
            'launch.conditions',
            IfCondition=_fake('IfCondition', evaluate=cond(False)),
            UnlessCondition=_fake('UnlessCondition', evaluate=cond(True)),
        ),
        'launch.substitutions': module(
            'launch.substitutions',
            LaunchConfiguration=_fake('LaunchConfiguration', {'default'}, perform=_lc_perform),
        ),
        'launch.launch_description_sources': module(
            'launch.launch_description_sources',
            PythonLaunchDescriptionSource=_fake('PythonLaunchDescriptionSource'),
        ),
        'launch_ros': module('launch_ros'),
        'launch_ros.actions': module('launch_ros.actions', Node=_fake('Node', _NODE_KW)),
        'ament_index_python': module('ament_index_python'),
        'ament_index_python.packages': module(
            'ament_index_python.packages', get_package_share_directory=share
        ),
    }


@pytest.fixture
def fake_share(tmp_path, monkeypatch):
    """An install share of pwan_ros laid out like setup.py's data_files (links into the repo);
    the working directory holds the bag directories the tests name (b, x, my_bag, 'run 1', and
    with_clock, whose metadata lists /clock) and a params file robot.yaml."""
    monkeypatch.chdir(tmp_path)
    for bag in ('b', 'x', 'my_bag', 'run 1', 'with_clock'):
        (tmp_path / bag).mkdir()
    (tmp_path / 'with_clock' / 'metadata.yaml').write_text(
        'rosbag2_bagfile_information:\n  topics_with_message_count:\n'
        '    - topic_metadata: {name: /points, type: sensor_msgs/msg/PointCloud2}\n'
        '    - topic_metadata: {name: /clock, type: rosgraph_msgs/msg/Clock}\n'
    )
    (tmp_path / 'robot.yaml').write_text(
        'pwan_odometry:\n  ros__parameters:\n    mode: tracking\n'
    )
    share = tmp_path / 'share' / 'pwan_ros'
    share.mkdir(parents=True)
    for folder in ('launch', 'config', 'rviz'):
        (share / folder).symlink_to(ROOT / folder)
    return share


def run_launch(share, file='odometry.launch.py', missing=(), undeclared=None, **given):
    """Executes ``generate_launch_description`` of an installed launch file and its actions like
    ``ros2 launch pwan_ros FILE NAME:=VALUE ...``: returns (declared {name: default}, launched
    [(kind, kwargs with substitutions performed)], environment set). Event handlers are not
    launched entities: they go to ``HANDLERS`` ((target node kwargs, on_exit)). ``undeclared``:
    more NAME:=VALUE pairs, which need not be arguments of the file."""
    import importlib.util
    import types
    from unittest import mock

    context = types.SimpleNamespace(launch_configurations={**(undeclared or {}), **given})
    declared, launched, env = {}, [], {}
    WARNINGS.clear()
    HANDLERS.clear()

    def load(path):
        spec = importlib.util.spec_from_file_location(
            '_launch_' + pathlib.Path(path).name.split('.')[0], path
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.generate_launch_description()

    def visit(entities):
        for e in entities:
            condition = e.kw.get('condition')
            if condition is not None and not condition.evaluate(context):
                continue
            if e.kind == 'DeclareLaunchArgument':
                name = e.args[0]
                declared[name] = e.kw.get('default_value')
                if name not in context.launch_configurations:
                    assert declared[name] is not None, f'required launch argument {name} not given'
                    context.launch_configurations[name] = declared[name]
            elif e.kind == 'OpaqueFunction':
                visit(
                    e.kw['function'](context, *e.kw.get('args', ()), **e.kw.get('kwargs', {}))
                    or []
                )
            elif e.kind == 'SetEnvironmentVariable':
                env[_perform(e.args[0], context)] = _perform(e.args[1], context)
            elif e.kind == 'IncludeLaunchDescription':
                visit(load(_perform(e.args[0].args[0], context)).entities)
            elif e.kind == 'RegisterEventHandler':
                handler = e.args[0]
                HANDLERS.append((_perform(handler.kw['target_action'].kw, context), handler))
                if handler.kind == 'OnProcessIO':  # the node's output: start-up, then ready
                    visit(_node_prints(handler))
            else:
                launched.append((e.kind, _perform(e.kw, context)))

    with mock.patch.dict(sys.modules, _fake_modules(share.parent, missing)):
        visit(load(share / 'launch' / file).entities)
    assert set(given) <= set(declared), f'undeclared arguments: {set(given) - set(declared)}'
    return declared, launched, env


#: the event handlers of the last run_launch: (the target node's kwargs, the handler)
HANDLERS = []


def _node_prints(handler):
    """What an output handler of the odometry node starts when the node runs: nothing on its
    first lines, then the entities it returns for the ready line, which arrives split across two
    reads of stderr."""
    import types

    from pwan_ros.params import ODOMETRY_READY

    def say(stream, text):
        return handler.kw[stream](types.SimpleNamespace(text=text.encode()))

    assert say('on_stdout', 'loading the reference cloud\n') is None
    assert say('on_stderr', '[INFO] [1.5] [pwan_odometry]: params read\n') is None
    line = f'[INFO] [2.0] [pwan_odometry]: {ODOMETRY_READY} points=/points mode=adaptive\n'
    assert say('on_stderr', line[:40]) is None
    started = say('on_stderr', line[40:])
    assert started, 'nothing started on the ready line'
    assert say('on_stderr', line) is None  # once
    return started


def _odometry_node(launched):
    nodes = [
        kw for kind, kw in launched if kind == 'Node' and kw['executable'] == 'pwan_odometry_node'
    ]
    assert len(nodes) == 1, launched
    return nodes[0]


def _overrides(node):
    assert len(node['parameters']) in (2, 3), node['parameters']
    assert isinstance(node['parameters'][-1], dict), node['parameters']
    return node['parameters'][-1]


def _extras(launched):
    """What runs besides the odometry node: {'bag': cmd, 'rviz': kwargs}."""
    out = {}
    for kind, kw in launched:
        if kind == 'ExecuteProcess':
            assert kw['cmd'][:3] == ['ros2', 'bag', 'play'], kw
            out['bag'] = kw['cmd']
        elif kind == 'Node' and kw['executable'] == 'rviz2':
            out['rviz'] = kw
        else:
            assert kind == 'Node' and kw['executable'] == 'pwan_odometry_node', (kind, kw)
    return out


def test_launch_file_names_real_executable_and_config(fake_share):
    import re

    for file in ('odometry.launch.py', 'register.launch.py'):
        compile((ROOT / 'launch' / file).read_text(), file, 'exec')
    _, launched, env = run_launch(fake_share)
    node = _odometry_node(launched)
    assert (node['package'], node['executable'], node['name']) == (
        'pwan_ros',
        'pwan_odometry_node',
        'pwan_odometry',
    )
    setup = (ROOT / 'setup.py').read_text()
    assert re.search(r"'pwan_odometry_node = pwan_ros\.ros\.entry:odometry_node'", setup)
    assert 'register_node' not in setup  # a name of no release
    # installed like setup.py's data_files; large clouds: Fast DDS large-data transports
    assert (
        "'/rviz', _files('rviz/*.rviz')" in setup and "'/config', _files('config/*.yaml')" in setup
    )
    assert env == {'FASTDDS_BUILTIN_TRANSPORTS': 'LARGE_DATA'}
    # the entry point register.launch.py and odometry.launch.py (which includes it) are one launch
    assert run_launch(fake_share, 'register.launch.py', bagfile='b', rviz='true') == run_launch(
        fake_share, bagfile='b', rviz='true'
    )
    assert 'deprecat' not in (ROOT / 'launch' / 'register.launch.py').read_text().lower()


def test_adapt_launch_passes_the_run_paths_described_by_their_specs(fake_share):
    """adapt.launch.py (same launch fakes): the run's paths, AdaptIO parameters, reach adapt_node
    over the installed config/adapt.yaml."""
    from pwan_ros.adaptation.config import AdaptIO
    from pwan_ros.params import specs

    declared, launched, _ = run_launch(
        fake_share, 'adapt.launch.py', labelled='l.npz', unlabelled='u.npz', output='out'
    )
    assert set(declared) == {'params_file', 'labelled', 'unlabelled', 'output', 'resume'}
    ((kind, node),) = launched
    assert (kind, node['executable'], node['name']) == ('Node', 'pwan_adapt_node', 'adapt_node')
    assert node['parameters'] == [
        str(fake_share / 'config' / 'adapt.yaml'),
        {'labelled': 'l.npz', 'unlabelled': 'u.npz', 'output': 'out', 'resume': 'false'},
    ]
    assert set(node['parameters'][1]) <= set(specs(AdaptIO))


def test_launch_defaults_keep_the_params_file_values(fake_share):
    """No arguments: the node gets the installed config/odometry.yaml and nothing else (not even
    use_sim_time), so no launch default overrides a value of the file; only the node is
    started, in no namespace."""
    declared, launched, _ = run_launch(fake_share)
    node = _odometry_node(launched)
    assert node['parameters'] == [str(fake_share / 'config' / 'odometry.yaml'), {}]
    assert node['namespace'] == ''
    assert (fake_share / 'config' / 'odometry.yaml').is_file()
    assert node['remappings'] == [('points', '/points')]
    assert _extras(launched) == {}
    # the node-parameter arguments default to '' = keep the file's value
    assert {
        n: declared[n] for n in ('base_frame', 'odom_frame', 'publish_tf', 'device', 'mode')
    } == dict.fromkeys(('base_frame', 'odom_frame', 'publish_tf', 'device', 'mode'), '')


#: a given, non-default value of every launch argument and where it must land
LAUNCH_CASES = {
    'params_file': ('robot.yaml', lambda n, x: n['parameters'][0] == 'robot.yaml'),
    'namespace': ('robot1', lambda n, x: n['namespace'] == 'robot1'),
    'points': ('/ouster/points', lambda n, x: n['remappings'] == [('points', '/ouster/points')]),
    'base_frame': ('base_link', lambda n, x: _overrides(n) == {'base_frame': 'base_link'}),
    'odom_frame': ('odom_lidar', lambda n, x: _overrides(n) == {'odom_frame': 'odom_lidar'}),
    'publish_tf': ('false', lambda n, x: _overrides(n) == {'publish_tf': False}),
    'device': ('cpu', lambda n, x: _overrides(n) == {'device': 'cpu'}),
    'mode': ('pwan', lambda n, x: _overrides(n) == {'mode': 'pwan'}),
    'use_sim_time': ('true', lambda n, x: _overrides(n) == {'use_sim_time': True}),
    'bagfile': (
        'my_bag',
        lambda n, x: (
            x == {'bag': ['ros2', 'bag', 'play', 'my_bag', *PLAY_DELAY, '--clock']}
            and _overrides(n) == {'use_sim_time': True}
        ),
    ),
    'rviz': ('true', lambda n, x: set(x) == {'rviz'}),
}


def test_launch_every_argument_reaches_the_node_or_a_process(fake_share):
    import yaml
    from pwan_ros.odometry.config import OdometryConfig

    declared, baseline, _ = run_launch(fake_share)
    assert set(declared) == set(LAUNCH_CASES), 'a new launch argument needs a case here'
    yaml_params = yaml.safe_load((ROOT / 'config' / 'odometry.yaml').read_text())['pwan_odometry'][
        'ros__parameters'
    ]
    for name, (value, lands) in LAUNCH_CASES.items():
        _, launched, _ = run_launch(fake_share, **{name: value})
        assert launched != baseline, name
        node = _odometry_node(launched)
        assert lands(node, _extras(launched)), (name, launched)
        # an override is a real parameter of the node, spelled like the params file
        for key in set(_overrides(node)) - {'use_sim_time'}:
            assert key in yaml_params and key in OdometryConfig.__dataclass_fields__, key
    # several at once (the robot line of the README)
    _, launched, _ = run_launch(
        fake_share, points='/ouster/points', base_frame='base_link', publish_tf='True'
    )
    node = _odometry_node(launched)
    assert node['remappings'] == [('points', '/ouster/points')]
    assert _overrides(node) == {'base_frame': 'base_link', 'publish_tf': True}
    with pytest.raises(ValueError, match='publish_tf'):
        run_launch(fake_share, publish_tf='yes please')


#: ros2 bag play's wait before the first message: DDS discovery after the node's ready line
PLAY_DELAY = ('--delay', '1')


def test_launch_bag_and_rviz(fake_share):
    """bagfile:= plays the bag with /clock, once the node is ready, and turns sim time on (an
    explicit use_sim_time wins);
    rviz:=true starts rviz2 with the installed config, on the same clock as the node."""
    _, launched, _ = run_launch(fake_share, bagfile='run 1')  # a path with a space: one argument
    assert _extras(launched)['bag'] == ['ros2', 'bag', 'play', 'run 1', *PLAY_DELAY, '--clock']
    assert _overrides(_odometry_node(launched))['use_sim_time'] is True
    _, launched, _ = run_launch(fake_share, bagfile='x', use_sim_time='false')
    assert _extras(launched)['bag'] == ['ros2', 'bag', 'play', 'x', *PLAY_DELAY, '--clock']
    assert _overrides(_odometry_node(launched))['use_sim_time'] is False
    assert _extras(run_launch(fake_share, bagfile='')[1]) == {}
    # a bag that records /clock (pwan_sim's, pwan_pcd2bag's) is played without a second clock
    assert _extras(run_launch(fake_share, bagfile='with_clock')[1])['bag'] == [
        'ros2',
        'bag',
        'play',
        'with_clock',
        *PLAY_DELAY,
    ]
    # the player starts when the node says it is ready (_node_prints), not with the launch
    _, launched, _ = run_launch(fake_share, bagfile='x')
    assert [h.kind for _, h in HANDLERS] == ['OnProcessExit', 'OnProcessIO']
    assert HANDLERS[1][0] == _odometry_node(launched)

    rviz_file = fake_share / 'rviz' / 'pwan_odometry.rviz'
    _, launched, _ = run_launch(fake_share, rviz='true', bagfile='x')
    rviz = _extras(launched)['rviz']
    assert (rviz['package'], rviz['executable']) == ('rviz2', 'rviz2')
    assert rviz['arguments'] == ['-d', str(rviz_file)] and rviz_file.is_file()
    assert rviz['parameters'] == [{'use_sim_time': True}]
    assert _extras(run_launch(fake_share, rviz='false')[1]) == {}
    # a given odom_frame is rviz's fixed frame too
    rviz = _extras(run_launch(fake_share, rviz='true', odom_frame='odom_lidar')[1])['rviz']
    assert rviz['arguments'] == ['-d', str(rviz_file), '-f', 'odom_lidar']
    with pytest.raises(ValueError, match='rviz'):
        run_launch(fake_share, rviz='maybe')


def test_launch_refuses_a_params_file_it_cannot_use(fake_share):
    """A params file that is missing, a directory, not YAML, or has no section for the node (keyed
    by another node's name): an error before any process (before: launch_ros dropped a missing
    file with a warning and the node ran on its defaults; another node's section was ignored
    without a word). The node's name, its namespaced name and rcl's wildcards are sections."""
    import yaml

    (fake_share.parent.parent / 'other.yaml').write_text(
        'pwan_register:\n  ros__parameters:\n    mode: tracking\n'
    )
    (fake_share.parent.parent / 'list.yaml').write_text('- 1\n- 2\n')
    (fake_share.parent.parent / 'bad.yaml').write_text('a: [1,\n')
    for path, words in (
        ('/nonexistent/robot.yaml', 'no such file'),
        ('b', 'is a directory'),
        ('list.yaml', 'not a ROS parameter file'),
        ('bad.yaml', 'not a YAML file'),
        ('other.yaml', 'has no section for node /pwan_odometry (its keys: pwan_register)'),
    ):
        with pytest.raises(RuntimeError, match=re.escape(words)):
            run_launch(fake_share, params_file=path)
    for i, (key, ns) in enumerate(
        (('pwan_odometry', ''), ('/**', 'robot1'), ('/robot1/pwan_odometry', 'robot1'))
    ):
        path = fake_share.parent.parent / f'ok{i}.yaml'
        path.write_text(f'{key}:\n  ros__parameters:\n    mode: tracking\n')
        _, launched, _ = run_launch(fake_share, params_file=str(path), namespace=ns)
        assert _odometry_node(launched)['parameters'] == [str(path), {}]
    # in a namespace rcl matches keys against /robot1/pwan_odometry: the section keyed by the
    # plain name (the installed file's) is passed as values too
    _, launched, _ = run_launch(fake_share, namespace='robot1', device='cpu')
    params = _odometry_node(launched)['parameters']
    installed = fake_share / 'config' / 'odometry.yaml'
    assert params[0] == str(installed) and params[2] == {'device': 'cpu'}
    assert params[1] == yaml.safe_load(installed.read_text())['pwan_odometry']['ros__parameters']


def test_launch_ends_with_an_error_when_the_node_refuses_its_parameters(fake_share):
    """The node exits with code 2 on parameters it refuses (one line): the launch's handler for
    that exit raises, so ros2 launch stops and returns 1 (upstream it logs the death and returns
    0); an exit 0, or any exit after Ctrl-C (shutting down), is no error. A misspelled argument
    is warned about (ros2 launch ignores unknown ones)."""
    import types

    _, launched, _ = run_launch(fake_share, undeclared={'base_fram': 'base_link'})
    ((target, handler),) = HANDLERS
    assert target == _odometry_node(launched)
    assert WARNINGS and "'base_fram'" in WARNINGS[0] and "'base_frame'" in WARNINGS[0]
    on_exit = handler.kw['on_exit']
    running, stopping = (types.SimpleNamespace(is_shutdown=v) for v in (False, True))
    with pytest.raises(RuntimeError, match='pwan_odometry_node exited with code 2'):
        on_exit(types.SimpleNamespace(returncode=2), running)
    assert on_exit(types.SimpleNamespace(returncode=0), running) is None
    assert on_exit(types.SimpleNamespace(returncode=-15), stopping) is None
    run_launch(fake_share, undeclared={'robot_name': 'r2'})  # a parent launch's: no warning
    assert WARNINGS == []


def test_launch_refuses_what_cannot_run(fake_share):
    """A missing bag, a bag without ros2bag, rviz without rviz2: an error before any process."""
    with pytest.raises(RuntimeError, match='no such bag'):
        run_launch(fake_share, bagfile='not_recorded_yet')
    with pytest.raises(RuntimeError, match='ros2bag'):
        run_launch(fake_share, bagfile='b', missing=('ros2bag',))
    with pytest.raises(RuntimeError, match='rviz2'):
        run_launch(fake_share, rviz='true', missing=('rviz2',))
    assert _extras(run_launch(fake_share, missing=('rviz2', 'ros2bag'))[1]) == {}


def _node_topics():
    """{absolute topic: message type} the node publishes or subscribes to, read from its source
    (the node runs in the root namespace; ``points`` is remapped to the launch's default)."""
    import ast

    src = (ROOT / 'pwan_ros' / 'ros' / 'odometry_node.py').read_text()
    topics = {}
    for call in ast.walk(ast.parse(src)):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == 'ScanSubscription'
        ):  # (node, type, topic, ...)
            topics['/' + call.args[2].value.lstrip('/')] = call.args[1].id
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in ('create_publisher', 'create_subscription')
            and isinstance(call.args[1], ast.Constant)
            and isinstance(call.args[0], ast.Name)
        ):
            topic = call.args[1].value
            topics[topic if topic.startswith('/') else '/' + topic] = call.args[0].id
    return topics


def test_launch_rviz_config_shows_what_the_node_publishes(fake_share):
    import yaml
    from pwan_ros.odometry.config import OdometryConfig

    topics = _node_topics()
    assert {
        '/points': 'PointCloud2',
        '/odometry': 'Odometry',
        '/aligned_points': 'PointCloud2',
        '/diagnostics': 'DiagnosticArray',
        '/tf': 'TFMessage',
    }.items() <= topics.items()
    declared, _, _ = run_launch(fake_share)
    assert declared['points'] == '/points'
    config = yaml.safe_load((ROOT / 'rviz' / 'pwan_odometry.rviz').read_text())
    manager = config['Visualization Manager']
    assert manager['Global Options']['Fixed Frame'] == OdometryConfig().odom_frame == 'odom'

    def displays(items):
        for d in items:
            yield d
            yield from displays(d.get('Displays', []))

    shown = {}
    for d in displays(manager['Displays']):
        assert d['Class'].startswith(('rviz_default_plugins/', 'rviz_common/')), d['Class']
        if 'Topic' in d:
            topic = d['Topic']['Value']
            # a display of the type the node's topic really carries
            assert topics.get(topic) == d['Class'].split('/')[1], (topic, d['Class'])
            shown[topic] = d
    assert set(shown) == {'/points', '/aligned_points', '/odometry'}
    assert 'rviz_default_plugins/TF' in {d['Class'] for d in displays(manager['Displays'])}
    # lidar drivers publish best effort: a reliable rviz subscription would see nothing
    assert shown['/points']['Topic']['Reliability Policy'] == 'Best Effort'
    # the documented topics (docs/odometry.md) are the ones shown
    doc = (ROOT / 'docs' / 'odometry.md').read_text()
    assert '`aligned_points`' in doc and '`odometry`' in doc


@pytest.mark.ros
def test_node_stops_promptly_during_pwan(tmp_path, ros_env):
    """Ctrl-C while full PWAN is running: the registration is abandoned at its next step and
    the node exits cleanly (no abort from a thread still inside torch)."""
    import time

    node = start_node(ros_env, 'mode:=pwan', 'pwan_steps:=100000', 'pwan_time_budget_ms:=600000.0')
    try:
        # two scans: the second starts a (deliberately endless) PWAN registration
        # (the driver waits 2 s for the second scan's answer, which never comes; PWAN starts
        # within a fraction of a second of the scan)
        drive(ros_env, tmp_path, 'sim', '--scans', '2', '--timeout', '2')
        time.sleep(1.0)
        assert node.poll() is None
        t0 = time.monotonic()
        rc, log = stop_node(node)
        elapsed = time.monotonic() - t0
    finally:
        if node.poll() is None:
            node.kill()
    assert rc == 0, log[-3000:]
    # within ros2 launch's 5 s before it escalates to SIGTERM: the scan is abandoned, not
    # finished through the fine-tunes and self-checks of the starts still to come (before: 3.7-4.5
    # s in pwan mode)
    assert elapsed < 5.0, elapsed
    assert 'terminate called' not in log and 'Traceback' not in log, log[-3000:]


@pytest.mark.ros
def test_base_frame_through_static_transform(tmp_path, ros_env):
    """base_frame differs from the cloud frame: the node waits for the static transform (scans
    skipped with a warning), then publishes the base pose, composed through it (REP-105)."""
    node = start_node(ros_env, 'base_frame:=robot')
    try:
        missing = drive(ros_env, tmp_path, 'sim', '--scans', '2', '--timeout', '10')
        res = drive(
            ros_env,
            tmp_path,
            'sim',
            '--scans',
            '6',
            '--static-tf',
            'robot',
            'base_link',
            '0.5',
            '0.0',
            '1.2',
        )
    finally:
        rc, log = stop_node(node)
    assert rc == 0, log[-3000:]
    for s in missing['sent']:
        diag = missing['answers'][str(s['stamp'])]['diag']
        assert (
            diag['level'] == 1 and 'missing static transform robot -> base_link' in diag['message']
        )
    # the same scans again (the skipped ones left no state), now with the transform known
    t_rb = np.eye(4)
    t_rb[:3, 3] = [0.5, 0.0, 1.2]
    gt0 = np.array(res['sent'][0]['gt'])
    for s in res['sent']:
        ans = res['answers'][str(s['stamp'])]
        assert ans['odom']['child'] == 'robot'
        expected = t_rb @ invert(gt0) @ np.array(s['gt']) @ invert(t_rb)
        err = invert(expected) @ odom_pose(ans)
        assert np.degrees(rotation_angle(err)) < 0.5 and np.linalg.norm(err[:3, 3]) < 0.05


@pytest.mark.ros
def test_node_ends_promptly_on_each_signal_even_if_started_with_sigint_ignored(tmp_path, ros_env):
    """After serving scans and idling, SIGINT and SIGTERM end the node within seconds with exit
    0; so does SIGINT for a node started with SIGINT ignored (a background job of a script,
    which is how `ros2 launch` from a script starts it; before, such a node outlived its
    launch)."""
    import signal
    import time

    for k, (sig, ignored) in enumerate(
        ((signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True))
    ):
        preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None
        log = tmp_path / f'node{k}.log'
        node = start_node(ros_env, preexec_fn=preexec, log=log)
        try:
            if sig == signal.SIGINT and not ignored:
                res = drive(ros_env, tmp_path, 'sim', '--scans', '3')
                assert len(res['answers']) == 3
            else:  # running: its ready line (a fixed sleep could end during a slow start-up)
                assert wait_for_log(log, 'ready: points=', 90), log.read_text()[-2000:]
            time.sleep(1.0)  # idle
            t0 = time.monotonic()
            node.send_signal(sig)
            node.wait(timeout=15)
        finally:
            if node.poll() is None:
                node.kill()
        out = log.read_text()
        assert node.returncode == 0 and 'Traceback' not in out, (sig, ignored, out[-2000:])
        assert time.monotonic() - t0 < 10.0, (sig, ignored)


def test_invalid_static_transforms_are_named_not_used():
    """A /tf_static transform with a zero quaternion or a NaN translation is not used (before:
    the NaN one reached the registration, 'SVD did not converge'), and the scans that need it
    are told why (before: 'missing static transform', though it was published); a valid one
    published later replaces it."""
    from geometry_msgs.msg import TransformStamped
    from tf2_msgs.msg import TFMessage

    from pwan_ros.geometry.frame_graph import FrameGraph

    def tf(q, t):
        m = TransformStamped()
        m.header.frame_id, m.child_frame_id = 'base_link', '/lidar'
        r, tr = m.transform.rotation, m.transform.translation
        r.x, r.y, r.z, r.w = q
        tr.x, tr.y, tr.z = t
        return TFMessage(transforms=[m])

    graph, invalid = FrameGraph(), {}
    graph.add_message(tf((0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 1.0)), invalid)
    assert graph.lookup('base_link', 'lidar') is None
    assert 'invalid quaternion' in invalid[('base_link', 'lidar')]
    graph.add_message(tf((0.0, 0.0, 0.0, 1.0), (float('nan'), 0.0, 1.0)), invalid)
    assert graph.lookup('base_link', 'lidar') is None
    assert 'non-finite translation' in invalid[('base_link', 'lidar')]
    graph.add_message(tf((0.0, 0.0, 0.0, 1.0), (0.0, 0.0, 1.0)), invalid)
    assert graph.lookup('base_link', 'lidar')[2, 3] == 1.0 and not invalid


@pytest.mark.ros
def test_node_refuses_what_it_cannot_use_before_spinning(tmp_path, ros_env, monkeypatch, capfd):
    """Arguments outside --ros-args (before: ignored, the node ran on its defaults), a reference
    cloud without usable points (all NaN: before, a segfault on the first scan) and a remap rule
    rcl cannot parse (without rcl's C source location) are refused with one line and exit 2."""
    nan = tmp_path / 'nan.xyz'
    nan.write_text('nan nan nan\n' * 40)
    params = tmp_path / 'p.yaml'
    params.write_text('pwan_odometry:\n  ros__parameters:\n    mode: pwan\n')
    for argv, words in (
        (['--params-file', str(params)], ["unknown argument '--params-file'", '--ros-args']),
        (['mode:=pwan'], ["unknown argument 'mode:=pwan'"]),
        (['--ros-args', '-p', f'reference_cloud:={nan}'], ['reference_cloud', 'usable points']),
        (['--ros-args', '-r', 'points:=9bad'], ["Couldn't parse remap rule: '-r points:=9bad'"]),
    ):
        rc, text = node_main(ros_env, monkeypatch, capfd, argv)
        assert rc == 2 and 'Traceback' not in text, (argv, text)
        assert 'arguments.c' not in text and 'error not set' not in text, text  # rcl's C trailer
        for w in words:
            assert w in text, (argv, text)


@pytest.mark.ros
def test_node_ends_quietly_on_a_signal_during_start_up(ros_env):
    """Ctrl-C or SIGTERM while the node is still loading (imports take seconds) ends it with exit
    0 and no traceback, as once it runs (before: a KeyboardInterrupt traceback and 130, or 143)."""
    import signal
    import time

    for sig in (signal.SIGINT, signal.SIGTERM):
        node = start_node(ros_env)
        try:
            time.sleep(0.3)
            node.send_signal(sig)
            out, _ = node.communicate(timeout=30)
        finally:
            if node.poll() is None:
                node.kill()
        assert node.returncode == 0 and 'Traceback' not in out, (sig, out[-2000:])
        assert 'ready' not in out, 'the signal came after the start-up: the test proves nothing'


@pytest.mark.ros
def test_node_says_when_no_scan_arrives(ros_env, tmp_path):
    """Nothing on its topic for 5 s: a warning (and a /diagnostics WARN) naming the topic and
    whether anything publishes there, instead of silence. The 5 s count from the ready line, so
    the test waits for the line (the start-up takes seconds more on a loaded machine)."""
    log = tmp_path / 'node.log'
    node = start_node(ros_env, 'reliability:=reliable', log=log)
    try:
        said = wait_for_log(log, 'no scan on /points for 5 s: nothing publishes there', 90)
    finally:
        rc, _ = stop_node(node)
    text = log.read_text()
    assert rc == 0, text[-2000:]
    assert 'ready: points=/points' in text, text[-2000:]
    assert said, text[-2000:]


@pytest.mark.ros
def test_node_says_when_a_heard_publisher_falls_silent(ros_env, tmp_path):
    """A driver that sent scans and then stopped (still on the topic): the warning says how many
    scans came and that the source stopped, not that the QoS or type may not match."""
    log = tmp_path / 'node.log'
    node = start_node(ros_env, log=log)
    pub = None
    try:
        pub = subprocess.Popen(
            [
                sys.executable,
                str(PEERS / 'startup_publisher.py'),
                '--reliability',
                'reliable',
                '--scans',
                '2',
                '--source',
                'random',  # what the scans hold is not the point: the node counts them
                '--linger',
                '60',
                '--out',
                str(tmp_path / 'sent.json'),
            ],
            env=ros_env,
        )
        said = wait_for_log(log, '2 scan(s) received so far (the driver or player paused', 120)
    finally:
        if pub is not None:
            pub.kill()
            pub.wait()
        rc, _ = stop_node(node)
    text = log.read_text()
    assert rc == 0 and said, text[-2000:]
    assert 'no sensor_msgs/PointCloud2 received yet' not in text, text[-2000:]
