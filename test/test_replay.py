"""Replay over real DDS into a stand-in node, evaluation of what it answered, and the demo
driver."""

import json
import pathlib
import subprocess
import sys
import time

import pytest

from pwan_ros.io import bags as bag_io
from pwan_ros.cli import demo
from pwan_ros.evaluation.metrics import SUMMARY_KEYS, evaluate, load_ground_truth
from pwan_ros.evaluation.replay import ReplayConfig, _play, _Recorder
from pwan_ros.evaluation.run_record import RunRecord

ECHO = pathlib.Path(__file__).parent / 'peers' / 'echo_odom.py'


def replay_cmd(bag, out, *extra):
    """pwan_replay of ``bag`` into ``out`` (its module, in this interpreter) with ``extra``."""
    cmd = [sys.executable, '-m', 'pwan_ros.cli.replay', '--bag', str(bag), '--output', str(out)]
    return cmd + [str(e) for e in extra]


def start_echo(env, *args):
    return subprocess.Popen(
        [sys.executable, str(ECHO), *args, '--ros-args', '-p', 'use_sim_time:=true'],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc):
    """SIGTERM; the stand-in spins with the product's loop, so it must end within 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError('the stand-in node ignored SIGTERM for 20 s')


@pytest.mark.ros
def test_replay_into_node_and_evaluate(tmp_path, ros_env, small_bag):
    # The stand-in answers every scan except each 4th with ground truth scaled by 1.02.
    echo = start_echo(ros_env, '--drop-every', '4', '--drift', '0.02')
    try:
        out = tmp_path / 'run'
        proc = subprocess.run(
            replay_cmd(small_bag, out, '--drain-timeout', '3'),
            env=ros_env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        stop(echo)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f'run: {out / "run.json"}'
    run = RunRecord.load(out / 'run.json')
    assert (run.scans_published, run.scans, run.scans_dropped) == (6, 5, 1)
    assert run.node_scans_dropped == 1 and len(run.node_latencies_ms) == 5
    assert len(run.latencies_ms) == 5 and 0 < run.median_latency_ms() < 1000
    # the node ran on the replayed /clock: its clock equalled the scan stamps
    assert abs(float(run.diagnostics_last['sim_lag_s'])) < 0.15
    assert int(run.diagnostics_last['points']) > 1000
    gt, _ = load_ground_truth(small_bag, '/ground_truth')
    r = evaluate(run.estimate, gt)
    # scaled translations: relative error = 2 % of the chord, which is ~ the path on this short
    # piece
    assert 1.9 < r.rpe_trans_pct <= 2.0 + 1e-6
    assert r.rpe_rot_deg_per_m == pytest.approx(0.0, abs=1e-3)
    assert r.ate_rmse_m < 0.02


@pytest.mark.ros
def test_replay_ends_quietly_on_a_signal(tmp_path, ros_env, small_bag):
    """Ctrl-C while waiting for the node, SIGTERM while playing: 'pwan_replay: interrupted',
    exit 130, no traceback and no output (before: thread tracebacks, exit 1: rclpy's own signal
    handler shut the context down under the spinner thread and the publishers)."""
    import signal

    env = dict(ros_env, PYTHONUNBUFFERED='1')
    for sig, phase, node in ((signal.SIGINT, 'waiting', False), (signal.SIGTERM, 'playing', True)):
        echo = start_echo(ros_env) if node else None
        log, out = tmp_path / f'{phase}.log', tmp_path / f'run_{phase}'
        with log.open('w') as sink:
            proc = subprocess.Popen(
                replay_cmd(small_bag, out, '--startup-timeout', '120', '--rate', '0.05'),
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
            )
        try:
            deadline = time.monotonic() + 120
            while f'replay: {phase}' not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.2)
            assert f'replay: {phase}' in log.read_text(), log.read_text()
            time.sleep(0.5)
            proc.send_signal(sig)
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            if echo is not None:
                stop(echo)
        text = log.read_text()
        assert rc == 130 and 'pwan_replay: interrupted' in text, (phase, rc, text[-3000:])
        assert 'Traceback' not in text and 'Exception' not in text, (phase, text[-3000:])
        assert not out.exists()


@pytest.mark.ros
def test_replay_without_subscriber_fails_clearly(tmp_path, ros_env, small_bag, capfd):
    """No subscriber: exit 2 naming the topic (the executable); a topic the bag lacks, refused
    before any DDS, through its main(argv) in this process."""
    from conftest import cli_main

    proc = subprocess.run(
        replay_cmd(small_bag, tmp_path / 'run', '--startup-timeout', '2'),
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no subscriber on '/points' after 2 s" in proc.stderr
    proc = cli_main(
        capfd,
        'pwan_replay',
        '--bag',
        small_bag,
        '--output',
        tmp_path / 'run',
        '--points-topic',
        '/velodyne_points',
    )
    assert proc.returncode == 2 and "has no topic '/velodyne_points'" in proc.stderr
    # a remap onto the scan topic names the bag's scans (the docs' --remap
    # /velodyne_points:=/points on a driver's bag): played as the scans, waited for as such
    proc = subprocess.run(
        replay_cmd(small_bag, tmp_path / 'run', '--points-topic', '/velodyne_points')
        + ['--remap', '/points:=/velodyne_points', '--startup-timeout', '2'],
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no subscriber on '/velodyne_points' after 2 s" in proc.stderr


class FakePub:
    def __init__(self, log, name, clock=time):
        self.log, self.name, self.clock = log, name, clock

    def publish(self, msg):
        self.log.append((self.name, self.clock.monotonic(), msg))


class FakeClock:
    """``time`` for the replay's pacing: sleeping advances it exactly (a busy machine, another
    test's processes on the same cores, cannot delay a publication)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_pacing_follows_bag_time_and_rate(small_bag, monkeypatch):
    """Messages leave at bag time / rate; generated /clock ticks are monotonic and end at each scan
    stamp (on the replay's clock)."""
    from pwan_ros.evaluation import replay

    clock = FakeClock()
    monkeypatch.setattr(replay, 'time', clock)
    log = []
    cfg = ReplayConfig(
        bag=str(small_bag), topics=('/points', '/ground_truth'), rate=2.0, clock_hz=50.0
    )
    pubs = {t: FakePub(log, t, clock) for t in cfg.topics}
    counts = _play(cfg, pubs, FakePub(log, '/clock', clock), _Recorder(), list(cfg.topics))
    assert counts == {'/points': 6, '/ground_truth': 6}
    scans = [(t, raw) for name, t, raw in log if name == '/points']
    t0 = scans[0][0]
    for k, (t, raw) in enumerate(scans):
        assert t - t0 == pytest.approx(k * 0.05, abs=0.02)  # 0.1 s of bag time at rate 2
    clocks = [bag_io.stamp_to_ns(m.clock) for name, _, m in log if name == '/clock']
    assert (
        clocks == sorted(clocks) and len(clocks) >= 6 + 25
    )  # 50 Hz over 0.5 s of bag time plus one per message
    last_clock_before_scan = [
        next(bag_io.stamp_to_ns(m.clock) for n, _, m in reversed(log[:i]) if n == '/clock')
        for i, (n, _, _) in enumerate(log)
        if n == '/points'
    ]
    assert last_clock_before_scan == [int(1.7e18) + k * 100_000_000 for k in range(6)]


def test_demo_bag_is_cached(tmp_path):
    logs = []

    def ensure(cfg):
        return demo._ensure_bag(demo._sim_config(cfg), cfg, tmp_path, logs.append)

    cfg = demo.DemoConfig(output=str(tmp_path), scans=3, stress=False)
    bag = ensure(cfg)
    assert bag_io.bag_topics(bag)['/points'].count == 3 and 'generating' in logs[0]
    mtime = (bag / 'metadata.yaml').stat().st_mtime_ns
    assert ensure(cfg) == bag and 'cached' in logs[-1]
    assert (bag / 'metadata.yaml').stat().st_mtime_ns == mtime
    ensure(demo.DemoConfig(output=str(tmp_path), scans=4, stress=False))
    assert bag_io.bag_topics(bag)['/points'].count == 4  # other settings: regenerated
    ensure(demo.DemoConfig(output=str(tmp_path), scans=40))
    assert bag_io.bag_topics(bag)['/points'].count == 31  # stress events: 9 scans blacked out
    with pytest.raises(ValueError, match='at least 4 s'):
        demo._sim_config(demo.DemoConfig(output=str(tmp_path), scans=8))


def test_demo_plan_without_compare_is_the_one_node(tmp_path):
    """--no-compare runs the given node alone; the default adds the sensor-pace, tracking-only
    and KISS-ICP runs (test_demo_e2e runs them all)."""
    node = ['my_node', '--ros-args']
    alone = demo._plan(demo.DemoConfig(output=str(tmp_path), compare=False), node)
    assert alone == [('adaptive', 'PWAN adaptive (default)', node)]
    plan = demo._plan(demo.DemoConfig(output=str(tmp_path)), node)
    assert [p[0] for p in plan] == ['adaptive', 'sensor_rate', 'tracking_only', 'kiss_icp']
    assert plan[2][2] == node + ['--ros-args', '-p', 'mode:=tracking'] and plan[3][2] is None


# covered fast by test_demo_e2e (the demo end to end with the real node: summary, trajectory,
# plot), test_demo_reports_a_node_that_dies (--node-cmd, --no-stress), test_replay_into_node_and_
# evaluate (the stand-in's answers evaluated) and test_demo_plan_without_compare_is_the_one_node
@pytest.mark.slow
@pytest.mark.ros
def test_demo_end_to_end_with_stand_in_node(tmp_path, ros_env):
    node_cmd = f'{sys.executable} {ECHO} --ros-args -p use_sim_time:=true'
    proc = subprocess.run(
        [
            sys.executable,
            '-m',
            'pwan_ros.cli.demo',
            '--output',
            str(tmp_path / 'demo'),
            '--scans',
            '8',
            '--node-cmd',
            node_cmd,
            '--drain-timeout',
            '3',
            '--no-stress',
            '--no-compare',
        ],
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f'summary: {tmp_path / "demo" / "summary.json"}'
    summary = json.loads((tmp_path / 'demo' / 'summary.json').read_text())
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary['scans'] == 8 and summary['scans_dropped'] == 0
    assert summary['ate_rmse_m'] < 1e-3 and summary['median_latency_ms'] > 0
    assert (
        pathlib.Path(summary['plot_png']).exists()
        and pathlib.Path(summary['trajectory_tum']).exists()
    )
    assert 'trajectory:' in proc.stdout and 'plot:' in proc.stdout


@pytest.mark.ros
def test_demo_reports_a_node_that_dies(tmp_path, ros_env):
    proc = subprocess.run(
        [
            sys.executable,
            '-m',
            'pwan_ros.cli.demo',
            '--output',
            str(tmp_path / 'demo'),
            '--scans',
            '3',
            '--no-stress',
            '--node-cmd',
            f'{sys.executable} -c "import sys; print(\'boom\'); sys.exit(3)"',
        ],
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert 'the node exited early (code 3)' in proc.stderr and 'boom' in proc.stderr


def node_and_offline(tmp_path, ros_env, bag, one_cpu=False):
    """The real pwan_odometry_node (``num_threads:=1``) fed ``bag`` by pwan_replay
    --wait-for-pose, and `pwan_evaluate --offline`'s default estimator (the same pipeline in
    process, the same parameters): (the node's run, the offline trajectory). ``one_cpu``: both
    on one CPU (``taskset``; offline through `pwan_evaluate --offline --params`), so that the
    thread pools of the global search's libraries (TBB, OpenMP) have one thread and give the
    same candidates."""
    from pwan_ros.io.trajectory import read_tum

    pin = ['taskset', '-c', '0'] if one_cpu else []
    cmd = pin + demo.default_node_command() + ['-p', 'num_threads:=1']
    node = subprocess.Popen(cmd, env=ros_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out = tmp_path / 'run'
        proc = subprocess.run(
            replay_cmd(bag, out, '--wait-for-pose', '60', '--drain-timeout', '5'),
            env=ros_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        node.terminate()
        log = node.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, proc.stderr[-3000:] + log[-3000:]
    if not one_cpu:  # in this process (a second process only to pin it to one CPU)
        from pwan_ros.evaluation.offline import PipelineOdometry, run_offline
        from pwan_ros.odometry.config import OdometryConfig

        offline = run_offline(bag, PipelineOdometry(OdometryConfig(num_threads=1))).estimate
        return RunRecord.load(out / 'run.json'), offline
    params = pathlib.Path(__file__).parents[1] / 'config' / 'odometry.yaml'
    evaluate = [str(pathlib.Path(sys.executable).with_name('pwan_evaluate')), '--offline']
    evaluate += ['--bag', str(bag), '--params', str(params), '--output', str(tmp_path / 'off')]
    proc = subprocess.run(pin + evaluate, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return RunRecord.load(out / 'run.json'), read_tum(tmp_path / 'off' / 'trajectory_est.tum')


def assert_same_poses(live, offline):
    import numpy as np

    np.testing.assert_allclose(live.stamps, offline.stamps, rtol=0, atol=1e-6)
    # the node sends each pose as a quaternion: equal to its rounding
    np.testing.assert_allclose(live.poses, offline.poses, rtol=0, atol=1e-8)


@pytest.mark.ros
def test_the_pipeline_offline_gives_the_node_s_poses(tmp_path, ros_env):
    """`pwan_evaluate --offline`'s default estimator and the node under --wait-for-pose, both
    on one thread, on a drive whose clouds carry per-point times (both deskew): the same pose
    for every scan (to the rounding of the node's quaternions)."""
    import numpy as np

    from simbag import make_small_bag

    bag = make_small_bag(tmp_path / 'sweep_bag', scans=8, sweep=True, speed=8.0)
    run, offline = node_and_offline(tmp_path, ros_env, bag)
    assert len(run.estimate) == len(offline) == 8
    assert run.diagnostics_last['deskewed'] == 'true'
    assert_same_poses(run.estimate, offline)
    assert np.linalg.norm(offline.poses[-1, :3, 3]) > 5.0  # it moved: a real comparison


@pytest.mark.slow
@pytest.mark.ros
def test_the_pipeline_offline_gives_the_node_s_poses_through_a_recovery(tmp_path, ros_env):
    """The same over the demo's drive (a burst of spurious returns, a blackout in a fast turn):
    the node recovers with full PWAN off its scan worker, offline in line; the final poses of
    every scan are the same."""
    from pwan_ros.evaluation.lidar_sim import SimConfig, write_sim_bag

    bag = tmp_path / 'stress_bag'
    write_sim_bag(bag, SimConfig(scans=80, stress=True))
    run, offline = node_and_offline(tmp_path, ros_env, bag, one_cpu=True)
    assert run.pwan_stamps and len(run.estimate) == len(offline) == 71
    assert_same_poses(run.estimate, offline)
