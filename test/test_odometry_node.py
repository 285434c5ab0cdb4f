"""The real ``pwan_odometry_node`` executable in a subprocess, driven over DDS."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from pwan_ros.geometry.se3 import from_quaternion, invert, rotation_angle

PEERS = pathlib.Path(__file__).parent / 'peers'
NODE = pathlib.Path(sys.executable).with_name('pwan_odometry_node')


def start_node(env, *params, params_file=None):
    cmd = [str(NODE), '--ros-args']
    if params_file:
        cmd += ['--params-file', str(params_file)]
    for p in params:
        cmd += ['-p', p]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_node(proc):
    proc.send_signal(2)  # SIGINT, as Ctrl-C
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError('pwan_odometry_node did not stop on SIGINT:\n' + out[-3000:])
    return proc.returncode, out


def drive(env, tmp_path, scenario, *extra, timeout=600):
    out = tmp_path / f'{scenario}.json'
    proc = subprocess.run([sys.executable, str(PEERS / 'scan_driver.py'), '--scenario', scenario,
                           '--out', str(out), *extra], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


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
    for label in ('empty', 'no_z', 'all_nan', 'bad_datatype', 'truncated'):
        ans = by_label[label]
        assert ans is not None and 'odom' not in ans, label
        assert ans['diag']['level'] == 1, (label, ans)
    assert 'x/y/z' in by_label['no_z']['diag']['message'] or 'z' in by_label['no_z']['diag']['message']
    # scans with NaN rows and a huge cloud are registered, not skipped
    for label in ('scan_with_nans', 'huge', 'scan'):
        ans = by_label[label]
        assert ans is not None and 'odom' in ans, (label, ans)
        assert ans['diag']['values']['path'] in ('init', 'track'), ans
    assert int(by_label['huge']['diag']['values']['num_points']) <= 4000
    # time going backwards resets the odometry (with a warning in the log)
    assert by_label['time_backwards']['diag']['values']['path'] == 'init'
    assert 'time went backwards' in log
    assert by_label['scan_after_reset']['diag']['values']['path'] == 'track'
    # a frame change restarts registration but the pose continues from the last one
    assert "frame changed from 'base_link' to 'other_lidar'" in log
    before = odom_pose(by_label['scan_after_reset'])
    after = odom_pose(by_label['frame_change'])
    assert np.linalg.norm(before[:3, 3] - after[:3, 3]) < 1e-6
    values = answers[str(res['sent'][-1]['stamp'])]['diag']['values']
    assert int(values['scans_invalid']) >= 6
    assert int(values['resets']) == 2


@pytest.mark.ros
@pytest.mark.parametrize('param, words', [
    ('mode:=fastest', ["'mode'", 'adaptive | pwan']),
    ('mass_ratio:=1.5', ['mass_ratio']),
    ('scan_voxel_size:=fine', ['scan_voxel_size']),
    ('transform:=nonrigid', ["'transform'", 'reference_cloud']),
    ('reference_cloud:=/nonexistent/map.ply', ['reference_cloud', '/nonexistent/map.ply']),
])
def test_node_rejects_invalid_parameters(ros_env, param, words):
    proc = subprocess.run([str(NODE), '--ros-args', '-p', param], env=ros_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert 'Traceback' not in text, text
    for w in words:
        assert w in text, text


@pytest.mark.ros
def test_params_file_and_overrides_reach_the_node(tmp_path, ros_env):
    """The YAML file loads into the running node's parameters; -p overrides it."""
    import rclpy
    from rcl_interfaces.srv import GetParameters
    root = pathlib.Path(__file__).resolve().parents[1]
    # voxel_size is the old name of scan_voxel_size: still honoured for one release, with a warning
    node = start_node(ros_env, 'voxel_size:=0.3', 'mode:=pwan',
                      params_file=root / 'config' / 'odometry.yaml')
    env_backup = dict(os.environ)
    os.environ['ROS_DOMAIN_ID'] = ros_env['ROS_DOMAIN_ID']
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    rclpy.init()
    try:
        client_node = rclpy.create_node('param_probe')
        cli = client_node.create_client(GetParameters, '/pwan_odometry/get_parameters')
        assert cli.wait_for_service(timeout_sec=30), 'node parameter service not found'
        request = GetParameters.Request(names=['scan_voxel_size', 'mode', 'scan_max_points', 'odom_frame',
                                               'reliability'])
        for _ in range(6):  # a reply can be lost while the service's reply writer is still matching
            fut = cli.call_async(request)
            rclpy.spin_until_future_complete(client_node, fut, timeout_sec=10)
            if fut.done() and fut.result() is not None:
                break
            cli.remove_pending_request(fut)
        assert fut.result() is not None, 'no answer from the node parameter service in 60 s'
        values = fut.result().values
        assert values[0].double_value == pytest.approx(0.3)
        assert values[1].string_value == 'pwan'
        assert values[2].integer_value == 10000
        assert values[3].string_value == 'odom'
        assert values[4].string_value == 'auto'
        client_node.destroy_node()
    finally:
        rclpy.try_shutdown()
        os.environ.clear()
        os.environ.update(env_backup)
        rc, log = stop_node(node)
    assert rc == 0, log[-2000:]
    assert "parameter 'voxel_size' was renamed 'scan_voxel_size'" in log, log[-2000:]


def test_launch_file_names_real_executable_and_config():
    """launch_ros is not installable here: check the launch file's structure statically."""
    import ast
    import re
    root = pathlib.Path(__file__).resolve().parents[1]
    src = (root / 'launch' / 'odometry.launch.py').read_text()
    tree = ast.parse(src)
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert 'generate_launch_description' in funcs
    calls = {n.func.id: n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    node_kw = {k.arg: k.value for k in calls['Node'].keywords}
    assert ast.literal_eval(node_kw['executable']) == 'pwan_odometry_node'
    assert ast.literal_eval(node_kw['package']) == 'pwan_ros'
    setup = (root / 'setup.py').read_text()
    assert re.search(r"'pwan_odometry_node = pwan_ros\.ros\.odometry_node:main'", setup)
    assert re.search(r"'register_node': 'pwan_ros\.ros\.odometry_node:main'", setup)   # 0.1 alias
    assert ast.literal_eval(node_kw['name']) == 'pwan_odometry'
    declared = {ast.literal_eval(c.args[0]) for c in ast.walk(tree)
                if isinstance(c, ast.Call) and getattr(c.func, 'id', '') == 'DeclareLaunchArgument'}
    assert declared == {'params_file', 'points', 'use_sim_time', 'device'}
    assert "'config', 'odometry.yaml'" in src
    # device overrides the file only when given: the file's device holds under launch otherwise
    assert "if device:" in src and "DeclareLaunchArgument('device', default_value=''" in src
    # the 0.1 launch file name includes this one
    old = (root / 'launch' / 'register.launch.py').read_text()
    compile(old, 'register.launch.py', 'exec')
    assert "'odometry.launch.py'" in old and 'IncludeLaunchDescription' in old


@pytest.mark.ros
def test_node_stops_promptly_during_pwan(tmp_path, ros_env):
    """Ctrl-C while full PWAN is running: the registration is cancelled at its next step and
    the node exits cleanly (no abort from a thread still inside torch)."""
    import time
    node = start_node(ros_env, 'mode:=pwan', 'pwan_steps:=100000', 'pwan_time_budget_ms:=600000.0')
    try:
        # two scans: the second starts a (deliberately endless) PWAN registration
        drive(ros_env, tmp_path, 'sim', '--scans', '2', '--timeout', '4')
        time.sleep(2.0)
        assert node.poll() is None
        t0 = time.monotonic()
        rc, log = stop_node(node)
        elapsed = time.monotonic() - t0
    finally:
        if node.poll() is None:
            node.kill()
    assert rc == 0, log[-3000:]
    assert elapsed < 20.0, elapsed
    assert 'terminate called' not in log and 'Traceback' not in log, log[-3000:]


@pytest.mark.ros
def test_base_frame_through_static_transform(tmp_path, ros_env):
    """base_frame differs from the cloud frame: the node waits for the static transform (scans
    skipped with a warning), then publishes the base pose, composed through it (REP-105)."""
    node = start_node(ros_env, 'base_frame:=robot')
    try:
        missing = drive(ros_env, tmp_path, 'sim', '--scans', '2', '--timeout', '10')
        res = drive(ros_env, tmp_path, 'sim', '--scans', '6',
                    '--static-tf', 'robot', 'base_link', '0.5', '0.0', '1.2')
    finally:
        rc, log = stop_node(node)
    assert rc == 0, log[-3000:]
    for s in missing['sent']:
        diag = missing['answers'][str(s['stamp'])]['diag']
        assert diag['level'] == 1 and 'missing static transform robot -> base_link' in diag['message']
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
