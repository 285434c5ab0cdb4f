"""Deploying the adapted classifier: :mod:`pwan_ros.adaptation.deploy` on a model.ts trained by the
project's own runner, and the ``pwan_classifier`` node in a subprocess fed over DDS."""

import pathlib
import queue
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import test_params
from conftest import assert_one_line_failure
from pwan_ros.adaptation import (
    AdaptConfig,
    AdaptConfigError,
    AdaptInputError,
    run_adaptation,
    save_npz,
)
from pwan_ros.adaptation.deploy import ClassifierConfig, Prediction, load_classifier
from test_adapt_core import gaussian_domains

ROOT = pathlib.Path(__file__).resolve().parents[1]
NODE = [
    sys.executable,
    '-m',
    'pwan_ros.ros.classifier_node',
]  # = the pwan_classifier_node executable
NAMES = [f'c{i}' for i in range(6)]
pytestmark = pytest.mark.filterwarnings(
    'ignore:`torch.jit:DeprecationWarning'
)  # the format model.ts has


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    """A finished adaptation run (model.ts, summary.json with class names) on 32-d Gaussian
    classes."""
    tmp = tmp_path_factory.mktemp('adapt')
    xl, yl, xu, yu = gaussian_domains(0)
    save_npz(tmp / 'lab.npz', xl, yl, NAMES)
    save_npz(tmp / 'unl.npz', xu, yu)
    cfg = AdaptConfig(
        steps=30,
        warmup_steps=10,
        weight_interval=10,
        eval_interval=10,
        checkpoint_interval=1000,
        batch_size=36,
        potential_updates=1,
        bottleneck_dim=16,
        potential_hidden=16,
        device='cpu',
        threads=1,
        plots=False,
    )
    result = run_adaptation(cfg, tmp / 'lab.npz', tmp / 'unl.npz', tmp / 'out')
    assert result.completed
    return tmp / 'out', xu


def _reference(model_path, x):
    """Softmax probabilities of the TorchScript model itself (n, K)."""
    module = torch.jit.load(str(model_path), map_location='cpu')
    with torch.no_grad():
        return torch.softmax(module(torch.from_numpy(x)), dim=1).numpy()


# ---------------------------------------------------------------------------- deploy.py
def test_predictions_are_the_models_argmax_and_softmax(run_dir):
    out, xu = run_dir
    clf = load_classifier(out / 'model.ts')
    assert (clf.dim, clf.num_classes, clf.class_names) == (32, 6, NAMES)
    probs = _reference(out / 'model.ts', xu)
    preds = clf.classify(xu)
    assert len(preds) == len(xu)
    assert [p.class_id for p in preds] == probs.argmax(axis=1).tolist()
    np.testing.assert_allclose([p.confidence for p in preds], probs.max(axis=1), rtol=1e-6)
    assert all(p.class_name == NAMES[p.class_id] for p in preds)
    # the deployed model reproduces the run's own predictions of the unlabelled rows
    assert [p.class_id for p in preds] == np.load(out / 'predictions.npy').tolist()
    one = clf.classify(xu[7].astype(np.float64))  # one vector (D,) -> one Prediction
    assert isinstance(one, Prediction)
    assert (one.class_id, one.class_name) == (preds[7].class_id, preds[7].class_name)
    # one row and a batch may sum in another order (float32): the same up to rounding
    assert one.confidence == pytest.approx(preds[7].confidence, rel=1e-5)
    assert clf.classify(np.zeros((0, 32), np.float32)) == []
    assert (
        load_classifier(out / 'model.ts', 'auto', class_names=list('abcdef'))
        .classify(xu[7])
        .class_name
        == 'abcdef'[preds[7].class_id]
    )


def test_unusable_models_and_features_are_one_line_errors(run_dir, tmp_path):
    out, xu = run_dir
    garbage = tmp_path / 'garbage.ts'
    garbage.write_bytes(b'not a model')
    identity = tmp_path / 'identity.ts'
    torch.jit.save(torch.jit.script(torch.nn.Identity()), str(identity))
    for path, words in [
        (tmp_path / 'nope.ts', 'does not exist'),
        (out, 'is a directory'),
        (garbage, 'is not a TorchScript model'),
        (out / 'checkpoints' / 'latest.pt', 'is not a TorchScript model'),
        (identity, 'is not a classifier'),
    ]:
        with pytest.raises(AdaptInputError, match=words) as err:
            load_classifier(path)
        assert '\n' not in str(err.value) and str(path) in str(err.value)
    with pytest.raises(AdaptInputError, match='3 class names for a model with 6 classes'):
        load_classifier(out / 'model.ts', class_names=['a', 'b', 'c'])
    if not torch.cuda.is_available():
        with pytest.raises(AdaptConfigError, match='CUDA is not available'):
            load_classifier(out / 'model.ts', 'cuda')
    clf = load_classifier(out / 'model.ts')
    bad = xu[:3].copy()
    bad[1, 4] = np.nan
    for features, words in [
        (xu[:, :31], 'has length 31; the model expects 32'),
        (xu[0, :10], 'has length 10'),
        (np.zeros((2, 2, 32)), 'shape'),
        (bad, r'NaN or infinite values \(row 1\)'),
        # finite but overflowing the model (3e38): published as class 0 at confidence NaN before
        (np.full((1, 32), 3e38, np.float32), r"features overflow the model \(row 0"),
    ]:
        with pytest.raises(AdaptInputError, match=words):
            clf.classify(features)


def test_node_config_follows_the_spec_rules():
    """The same checks test_params.py applies to every config, on the node's config."""
    test_params.test_every_field_has_a_description_and_a_range(ClassifierConfig)
    test_params.test_validation_agrees_with_the_spec_range(ClassifierConfig, AdaptConfigError)
    assert ClassifierConfig(device='cuda:1').device == 'cuda:1'
    with pytest.raises(AdaptConfigError, match="parameter 'device'"):
        ClassifierConfig(device='gpu')
    src = (ROOT / 'setup.py').read_text()
    assert "'pwan_classifier_node = pwan_ros.ros.entry:classifier_node'" in src


# ---------------------------------------------------------------------------- the node over DDS
def _lines(proc):
    """A queue receiving the process's output lines (a thread reads them)."""
    q = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q, text, timeout, seen):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            line = q.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if text in line:
            return True
    return False


def _start_node(out, ros_env, monkeypatch, args):
    """Start the classifier node on ``out``'s model (CPU) with extra ROS ``args``, and give this
    process the node's DDS environment. Returns (process, its line queue, lines seen)."""
    proc = subprocess.Popen(
        NODE + ['--ros-args', '-p', f'model:={out / "model.ts"}', '-p', 'device:=cpu'] + args,
        env=ros_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for key in (
        'ROS_DOMAIN_ID',
        'ROS_AUTOMATIC_DISCOVERY_RANGE',
        'FASTDDS_BUILTIN_TRANSPORTS',
        'ROS_LOG_DIR',
        'ROS_HOME',
        'RMW_IMPLEMENTATION',
    ):
        monkeypatch.setenv(key, ros_env[key])
    return proc, _lines(proc), []


def _stop(proc):
    """SIGINT, as Ctrl-C; killed if it has not ended in 20 s."""
    proc.send_signal(2)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.ros
def test_node_publishes_the_predictions_of_deploy(run_dir, ros_env, monkeypatch):
    """Feature vectors from an rclpy publisher in this process reach the node (remapped topic);
    its class ids / confidences / names are deploy.py's predictions; bad messages are skipped."""
    out, xu = run_dir
    proc, lines, seen = _start_node(out, ros_env, monkeypatch, ['-r', 'features:=/my/features'])
    import rclpy
    from std_msgs.msg import Float32, Float32MultiArray, Int32, String

    rclpy.init()
    try:
        assert _wait_for(lines, 'pwan_classifier ready', 30, seen), ''.join(seen)[-3000:]
        node = rclpy.create_node('classifier_probe')
        got = {'class_id': [], 'confidence': [], 'class_name': []}
        subs = [
            node.create_subscription(
                kind, f'/{topic}', lambda m, t=topic: got[t].append(m.data), 10
            )
            for topic, kind in (
                ('class_id', Int32),
                ('confidence', Float32),
                ('class_name', String),
            )
        ]
        pub = node.create_publisher(Float32MultiArray, '/my/features', 10)
        end = time.monotonic() + 15  # DDS discovery: every output matched, the input subscribed
        while time.monotonic() < end and not (
            pub.get_subscription_count() and all(s.get_publisher_count() for s in subs)
        ):
            rclpy.spin_once(node, timeout_sec=0.05)
        assert pub.get_subscription_count() == 1, 'the node did not subscribe /my/features'
        assert all(s.get_publisher_count() == 1 for s in subs), (
            'the node does not publish its outputs'
        )
        rows = xu[::30]  # 6 rows, 2 of each present class
        nan = rows[0].copy()
        nan[3] = np.nan
        sent = [rows[0], rows[1], rows[2, :20], rows[2], nan, rows[3], rows[4], rows[5]]
        for vec in sent:
            pub.publish(Float32MultiArray(data=vec.astype(np.float32).tolist()))
            rclpy.spin_once(node, timeout_sec=0.02)
        end = time.monotonic() + 10
        while time.monotonic() < end and min(len(v) for v in got.values()) < len(rows):
            rclpy.spin_once(node, timeout_sec=0.05)
        node.destroy_node()
    finally:
        rclpy.try_shutdown()
        _stop(proc)
    _wait_for(lines, '\0', 5, seen)  # the rest of the output
    log = ''.join(seen)
    expected = load_classifier(out / 'model.ts').classify(rows)
    assert got['class_id'] == [p.class_id for p in expected], log[-3000:]
    np.testing.assert_allclose(got['confidence'], [p.confidence for p in expected], rtol=1e-6)
    assert got['class_name'] == [p.class_name for p in expected]
    # the wrong-length and the NaN message: skipped, warned about (throttled: one line), no crash
    assert proc.returncode == 0 and 'Traceback' not in log, log[-3000:]
    assert (
        log.count(' skipped: ') == 1
        and 'message 2 skipped: feature vector has length 20; the model expects 32' in log
    ), log
    assert 'received 8, classified 6, skipped 2, dropped 0' in log, log


def node_main(ros_env, monkeypatch, capfd, argv):
    """The classifier node's ``main`` with ``argv`` in this process, in the test's DDS domain,
    as a CompletedProcess (rclpy's C output included): for what it refuses at start-up. A node
    that accepts ``argv`` fails the test instead of spinning."""
    from pwan_ros.ros import classifier_node

    class MustRefuse(classifier_node.ClassifierNode):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.destroy_node()
            raise AssertionError(f'pwan_classifier_node accepted {argv}')

    for key in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE', 'FASTDDS_BUILTIN_TRANSPORTS'):
        monkeypatch.setenv(key, ros_env[key])
    monkeypatch.setattr(classifier_node, 'ClassifierNode', MustRefuse)
    capfd.readouterr()
    rc = classifier_node.main(['pwan_classifier_node', *argv])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.mark.ros
def test_node_without_a_usable_model_exits_2_with_one_line(tmp_path, ros_env, monkeypatch, capfd):
    """The executable for the first case, its main(argv) in this process for the others."""
    for k, (params, words) in enumerate(
        [
            (['model:=' + str(tmp_path / 'missing.ts')], ('pwan_classifier', 'does not exist')),
            (['device:=cpu'], ("parameter 'model' is required",)),
            (['modle:=x.ts'], ('unknown parameter(s): modle',)),
        ]
    ):
        args = ['--ros-args'] + [a for p in params for a in ('-p', p)]
        if k == 0:
            proc = subprocess.run(
                NODE + args, env=ros_env, capture_output=True, text=True, timeout=60
            )
        else:
            proc = node_main(ros_env, monkeypatch, capfd, args)
        assert_one_line_failure(proc, 2, words)
        assert 'ready' not in proc.stdout + proc.stderr


def test_launch_file_names_the_executable():
    """launch_ros is not installable here: the launch file is checked statically."""
    src = (ROOT / 'launch' / 'classifier.launch.py').read_text()
    compile(src, 'classifier.launch.py', 'exec')
    src = ''.join(src.split())  # layout-free: the formatter may wrap calls
    assert "executable='pwan_classifier_node'" in src and "name='pwan_classifier'" in src
    for arg in ('model', 'features', 'device'):
        assert f"DeclareLaunchArgument('{arg}'," in src, arg


def _burst(run_dir, ros_env, monkeypatch, extra_params, n=1000, pub_depth=10):
    """Start the node, send one primer message and wait for its answer, then publish ``n`` feature
    messages back to back from a reliable depth-10 publisher (what ``ros2 bag play`` offers by
    default); returns (sent rows, predictions received as dicts, the node's whole log)."""
    import json

    out, xu = run_dir
    proc, lines, seen = _start_node(
        out, ros_env, monkeypatch, [a for p in extra_params for a in ('-p', p)]
    )
    import rclpy
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import Float32MultiArray, String

    rclpy.init()
    got = []
    rows = np.concatenate([xu] * (n // len(xu) + 1))[: n + 1]
    try:
        assert _wait_for(lines, 'pwan_classifier ready', 30, seen), ''.join(seen)[-3000:]
        node = rclpy.create_node('burst_probe')
        deep = QoSProfile(
            depth=n + 100, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE
        )
        sub = node.create_subscription(
            String, '/prediction', lambda m: got.append(json.loads(m.data)), deep
        )
        pub = node.create_publisher(Float32MultiArray, '/features', pub_depth)
        end = time.monotonic() + 15
        while time.monotonic() < end and not (
            pub.get_subscription_count() and sub.get_publisher_count()
        ):
            rclpy.spin_once(node, timeout_sec=0.05)
        pub.publish(Float32MultiArray(data=rows[0].tolist()))
        end = time.monotonic() + 10
        while time.monotonic() < end and not got:
            rclpy.spin_once(node, timeout_sec=0.05)
        assert got, 'no answer to the primer message'
        msgs = [Float32MultiArray(data=r.tolist()) for r in rows[1:]]
        for m in msgs:
            pub.publish(m)
        end, last = time.monotonic() + 30, -1
        while time.monotonic() < end and len(got) < n + 1:  # until all answered, or 3 s of silence
            rclpy.spin_once(node, timeout_sec=0.1)
            if len(got) != last:
                last, quiet = len(got), time.monotonic() + 3
            elif time.monotonic() > quiet:
                break
        node.destroy_node()
    finally:
        rclpy.try_shutdown()
        _stop(proc)
    _wait_for(lines, '\0', 5, seen)
    return rows, got, ''.join(seen)


@pytest.mark.ros
def test_a_burst_is_answered_in_full_and_outputs_name_their_input(run_dir, ros_env, monkeypatch):
    """With the default queue depth a 1000-message burst is classified in full (before: 48 of
    1000 answered, 952 lost silently); each prediction names its input by index and publisher
    sequence number, and the class is the one deploy.py gives that very input."""
    out, _ = run_dir
    rows, got, log = _burst(run_dir, ros_env, monkeypatch, [], pub_depth=1001)
    assert len(got) == len(rows), f'{len(got)} of {len(rows)} answered\n' + log[-3000:]
    assert [g['index'] for g in got] == list(range(len(rows)))
    seqs = [g['seq'] for g in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(rows))), (
        'publisher sequence numbers are not consecutive'
    )
    expected = load_classifier(out / 'model.ts').classify(rows)
    assert [g['class_id'] for g in got] == [p.class_id for p in expected]
    assert all(isinstance(g['stamp_ns'], int) and g['stamp_ns'] > 0 for g in got)
    assert f'received {len(rows)}, classified {len(rows)}, skipped 0, dropped 0' in log, log[
        -3000:
    ]


@pytest.mark.ros
def test_messages_lost_in_a_burst_are_counted_and_reported(run_dir, ros_env, monkeypatch):
    """queue_depth:=2: what the callback never saw is counted from the gaps in the publisher's
    sequence numbers; received + dropped = sent, and every answer still names its input."""
    out, _ = run_dir
    rows, got, log = _burst(run_dir, ros_env, monkeypatch, ['queue_depth:=2'])
    import re

    m = re.search(r'received (\d+), classified (\d+), skipped 0, dropped (\d+)', log)
    assert m, log[-3000:]
    received, classified, dropped = map(int, m.groups())
    assert received == classified and received + dropped == len(rows), log[-3000:]
    assert len(got) <= received
    expected = load_classifier(out / 'model.ts').classify(rows)
    first = got[0]['seq']
    assert all(g['class_id'] == expected[g['seq'] - first].class_id for g in got)
    if dropped:
        assert 'lost before classification' in log and 'raise queue_depth' in log


@pytest.mark.ros
def test_status_keeps_coming_under_sim_time_without_a_clock(run_dir, ros_env, monkeypatch):
    """use_sim_time:=true and nothing on /clock (a bag not playing yet): the status still comes
    every status_period (it runs on the steady clock; before, on the frozen sim clock: none)."""
    from diagnostic_msgs.msg import DiagnosticArray
    import rclpy

    out, _ = run_dir
    proc, lines, seen = _start_node(
        out, ros_env, monkeypatch, ['-p', 'use_sim_time:=true', '-p', 'status_period:=0.5']
    )
    rclpy.init()
    statuses = []
    try:
        assert _wait_for(lines, 'pwan_classifier ready', 30, seen), ''.join(seen)[-3000:]
        node = rclpy.create_node('status_probe')
        node.create_subscription(
            DiagnosticArray,
            '/diagnostics',
            lambda m: statuses.extend(s for s in m.status if s.name.startswith('pwan_classifier')),
            10,
        )
        # counted from the first one heard: discovering the probe takes seconds on loaded cores
        first = time.monotonic() + 30.0
        while not statuses and time.monotonic() < first:
            rclpy.spin_once(node, timeout_sec=0.1)
        heard = len(statuses)
        statuses.clear()
        end = time.monotonic() + 4.0
        while heard and time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.1)
        node.destroy_node()
    finally:
        rclpy.try_shutdown()
        _stop(proc)
    assert proc.returncode == 0
    assert heard, 'no status message in 30 s'
    assert len(statuses) >= 4, f'{len(statuses)} status messages in the 4 s after the first'
