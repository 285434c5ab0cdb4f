"""Replay a rosbag2 into ROS 2 and record the odometry a node answers with.

For machines without ``ros2 bag play`` (rosbag2 is not pip-installable). Plays the chosen
topics of a bag (mcap or sqlite3) with their original bytes (header stamps untouched),
paced by the bag's receive times divided by ``rate``, and publishes ``/clock`` with the bag
time (from the bag's own /clock topic when it is played, else generated at ``clock_hz``), so
nodes with ``use_sim_time:=true`` see the recorded time. Before starting it waits until the
scan topic has a subscriber and the odometry topic a publisher (no scan is lost to
discovery); after the last message it waits until every scan has an odometry answer or
``drain_timeout`` seconds pass without one.

Odometry messages (nav_msgs/Odometry, header stamp = the scan stamp it answers) become the
estimated trajectory; the wall time from publishing a scan to receiving its odometry is the
end-to-end latency; ``latency_ms`` / ``scans_dropped`` key values on /diagnostics are kept.

CLI::

    pwan_replay --bag BAG --output DIR [--rate 1.0] [--topics /points,/clock] \
                [--odom-topic /odometry] [--remap /velodyne_points:=/points]
    # writes DIR/run.json + DIR/trajectory_est.tum;
    # then: pwan_evaluate --run DIR/run.json --bag BAG

On a ROS machine ``ros2 bag play BAG --clock`` plus any recorder does the same job.
"""

from __future__ import annotations

import dataclasses

import importlib
import struct
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from pwan_ros.io import bags as bag_io
from pwan_ros.evaluation.run_record import RunRecord
from pwan_ros.io.trajectory import Trajectory
from pwan_ros.params import POINTS_TOPIC, REQUIRED, check, param

__all__ = ['ReplayConfig', 'ReplayError', 'replay']


class ReplayError(RuntimeError):
    """Replay could not run (no subscriber, unknown message type, ...)."""


@dataclass(frozen=True)
class ReplayConfig:
    """Replay parameters (CLI flags: same names with dashes); times in seconds."""

    bag: str = param(REQUIRED, 'rosbag2 directory to play')
    topics: tuple = param((), 'bag topics to play; empty = all')
    points_topic: str = param(
        POINTS_TOPIC,
        "the bag's scan topic (scans counted, latency measured); a bag without it whose one "
        'remap renames a topic to it plays that topic as the scans',
    )
    odom_topic: str = param('/odometry', "odometry topic to record; '' = record nothing")
    diagnostics_topic: str = param(
        '/diagnostics', "diagnostics topic to record; '' = ignore diagnostics"
    )
    rate: float = param(1.0, 'playback speed factor', 0.0, 1000.0, low_open=True)
    clock_hz: float = param(
        100.0,
        'rate of the generated /clock (bag time), if the bag has none',
        0.0,
        100_000.0,
        low_open=True,
    )
    reliability: str = param(
        'reliable',
        'QoS reliability of the played topics (a LiDAR driver: best_effort)',
        choices=('reliable', 'best_effort'),
    )
    depth: int = param(10, 'QoS history depth of the played topics', 1, 100_000)
    remap: tuple = param((), "'FROM:=TO' topic renames for playing")
    startup_timeout: float = param(
        60.0, "wait for the node's subscription and publisher (s)", 0.0, low_open=True
    )
    drain_timeout: float = param(
        10.0, 'stop this long without new odometry after the end (s)', 0.0, low_open=True
    )
    settle: float = param(0.5, 'wait after discovery before the first message (s)', 0.0)
    wait_for_pose: float = param(
        0.0,
        'after each scan, wait up to this long (s) for its pose before playing on '
        '(the bag clock pauses meanwhile): every scan is answered however slow the '
        'node is; 0 = sensor pace, scans arriving while the node is busy are dropped '
        'as on a robot',
        0.0,
        3600.0,
    )

    def __post_init__(self):
        check(self, rules=ReplayConfig._rules)

    def _rules(self):
        """The cross-field rules (:func:`pwan_ros.params.check`): ``(ok, field, allowed)``."""
        yield all(':=' in r for r in self.remap), 'remap', "entries 'FROM:=TO'"

    def renames(self) -> dict:
        return dict(r.split(':=', 1) for r in self.remap)


def message_class(msgtype: str):
    """rclpy class for 'pkg/msg/Name'; ReplayError if that package is not installed."""
    pkg, _, name = msgtype.split('/')
    try:
        return getattr(importlib.import_module(f'{pkg}.msg'), name)
    except (ImportError, AttributeError) as exc:
        raise ReplayError(
            f'message type {msgtype} is not available to rclpy here (install the '
            f'{pkg} interface package or leave the topic out with --topics)'
        ) from exc


def _header_stamp_ns(raw: bytes) -> int:
    """Header stamp of a CDR message whose first field is std_msgs/Header (after the 4-byte
    encapsulation)."""
    order = '<' if raw[1] == 1 else '>'
    sec, nsec = struct.unpack_from(order + 'iI', raw, 4)
    return sec * 1_000_000_000 + nsec


@dataclass
class _Recorder:
    lock: threading.Lock = field(default_factory=threading.Lock)
    published_wall: dict = field(default_factory=dict)  # scan stamp ns -> wall time published
    odom: dict = field(default_factory=dict)  # stamp ns -> 4x4
    latencies_ms: list = field(default_factory=list)
    node_latencies_ms: list = field(default_factory=list)
    node_scans_dropped: int | None = None
    diagnostics_last: dict = field(default_factory=dict)
    pwan_stamps: set = field(default_factory=set)  # scan stamps ns where full PWAN ran
    rejected_stamps: set = field(default_factory=set)  # ... rejected or re-anchored
    scan_notes: dict = field(default_factory=dict)  # stamp ns -> [path, ratio, message] of those
    last_odom_wall: float = 0.0


def _float(v: str):
    try:
        return float(v)
    except ValueError:
        return None


def replay(cfg: ReplayConfig, log=print) -> RunRecord:
    """Play ``cfg.bag`` over DDS and return what was recorded. Needs rclpy (initialised here)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from rclpy.signals import SignalHandlerOptions

    topics = bag_io.bag_topics(cfg.bag)
    renamed_to_scans = [a for a, b in cfg.renames().items() if b == cfg.points_topic]
    if cfg.points_topic not in topics and len(renamed_to_scans) == 1:
        # --remap /velodyne_points:=/points: the bag's scans are the topic played as the scans
        cfg = dataclasses.replace(cfg, points_topic=renamed_to_scans[0])
    bag_io.require_topic(cfg.bag, cfg.points_topic, [bag_io.CLOUD_TYPE])
    played = list(cfg.topics) if cfg.topics else sorted(topics)
    for t in played:
        bag_io.require_topic(cfg.bag, t)
    if cfg.points_topic not in played:
        raise ReplayError(
            f"scan topic '{cfg.points_topic}' is not among the played topics {played}"
        )
    classes = {t: message_class(topics[t].msgtype) for t in played}
    renames = cfg.renames()
    generate_clock = '/clock' not in played

    reliability = (
        ReliabilityPolicy.RELIABLE
        if cfg.reliability == 'reliable'
        else ReliabilityPolicy.BEST_EFFORT
    )
    qos = QoSProfile(
        depth=cfg.depth,
        reliability=reliability,
        history=HistoryPolicy.KEEP_LAST,
        durability=DurabilityPolicy.VOLATILE,
    )
    clock_qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    # /tf_static is latched (TRANSIENT_LOCAL) in ROS 2: late subscribers still get the transforms
    static_qos = QoSProfile(
        depth=100,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )
    rec_qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)

    # our argv is not ROS arguments (--remap A:=B would read as a deprecated rcl remap); no rclpy
    # signal handlers: Ctrl-C / SIGTERM raise KeyboardInterrupt in this thread (run_cli), which
    # unwinds through the finally blocks below, instead of rclpy shutting the context down under
    # the spinner thread and the publishers (thread tracebacks, "publisher's context is invalid")
    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = rclpy.create_node('pwan_replay')
        from rosgraph_msgs.msg import Clock

        special = {'/clock': clock_qos, '/tf_static': static_qos}
        pubs = {
            t: node.create_publisher(classes[t], renames.get(t, t), special.get(t, qos))
            for t in played
        }
        clock_pub = node.create_publisher(Clock, '/clock', clock_qos) if generate_clock else None
        rec = _Recorder()

        def on_odom(msg):
            now = time.monotonic()
            ns = bag_io.stamp_to_ns(msg.header.stamp)
            pose = bag_io.pose_from_msg(msg.pose.pose)
            with rec.lock:
                rec.odom[ns] = pose
                rec.last_odom_wall = now
                sent = rec.published_wall.get(ns)
                if sent is not None:
                    rec.latencies_ms.append((now - sent) * 1e3)

        def on_diag(msg):
            with rec.lock:
                for status in msg.status:
                    values = {kv.key: kv.value for kv in status.values}
                    rec.diagnostics_last.update(values)
                    if 'latency_ms' in values and _float(values['latency_ms']) is not None:
                        rec.node_latencies_ms.append(_float(values['latency_ms']))
                    if 'scans_dropped' in values and _float(values['scans_dropped']) is not None:
                        rec.node_scans_dropped = int(_float(values['scans_dropped']))
                    ns = bag_io.stamp_to_ns(msg.header.stamp)
                    if values.get('pwan_engaged') == 'true':
                        rec.pwan_stamps.add(ns)
                    if values.get('path') in ('rejected', 'reanchor'):
                        rec.rejected_stamps.add(ns)
                    if ns in rec.pwan_stamps or ns in rec.rejected_stamps:
                        ratio = _float(values.get('matched_ratio', ''))
                        rec.scan_notes[ns] = [values.get('path', ''), ratio, status.message]

        odom_sub = None
        if cfg.odom_topic:
            from nav_msgs.msg import Odometry

            odom_sub = node.create_subscription(Odometry, cfg.odom_topic, on_odom, rec_qos)
        if cfg.diagnostics_topic:
            from diagnostic_msgs.msg import DiagnosticArray

            node.create_subscription(DiagnosticArray, cfg.diagnostics_topic, on_diag, rec_qos)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        try:
            scan_pub = pubs[cfg.points_topic]
            deadline = time.monotonic() + cfg.startup_timeout
            log(
                f'replay: waiting up to {cfg.startup_timeout:g} s for a subscriber on '
                f"'{renames.get(cfg.points_topic, cfg.points_topic)}'"
                + (f" and a publisher on '{cfg.odom_topic}'" if odom_sub is not None else '')
            )
            while scan_pub.get_subscription_count() < 1 or (
                odom_sub is not None and odom_sub.get_publisher_count() < 1
            ):
                if time.monotonic() > deadline:
                    missing = (
                        f"no subscriber on '{renames.get(cfg.points_topic, cfg.points_topic)}'"
                        if scan_pub.get_subscription_count() < 1
                        else f"no publisher on '{cfg.odom_topic}'"
                    )
                    raise ReplayError(
                        f'{missing} after {cfg.startup_timeout:.0f} s: is the node running '
                        '(same ROS_DOMAIN_ID, topic names/remaps right)?'
                    )
                time.sleep(0.05)
            time.sleep(cfg.settle)
            log(f'replay: playing {", ".join(played)} from {cfg.bag} at rate {cfg.rate:g}')
            t_start = time.monotonic()
            counts = _play(cfg, pubs, clock_pub, rec, generate_clock, played)
            t_end = time.monotonic()
            n_scans = counts.get(cfg.points_topic, 0)
            if odom_sub is not None:
                while True:
                    with rec.lock:
                        answered = len(set(rec.odom) & set(rec.published_wall))
                        last = max(rec.last_odom_wall, t_end)
                    if answered >= n_scans or time.monotonic() - last > cfg.drain_timeout:
                        break
                    time.sleep(0.05)
            wall = time.monotonic() - t_start
        finally:
            executor.shutdown()
            spinner.join(timeout=5)
            node.destroy_node()
    finally:
        rclpy.try_shutdown()

    with rec.lock:
        stamps = sorted(rec.odom)
        est = Trajectory(
            np.array(stamps, dtype=np.float64) * 1e-9,
            np.array([rec.odom[s] for s in stamps]).reshape(-1, 4, 4),
        )
        return RunRecord(
            estimate=est,
            scans_published=n_scans,
            latencies_ms=list(rec.latencies_ms),
            node_latencies_ms=list(rec.node_latencies_ms),
            node_scans_dropped=rec.node_scans_dropped,
            mode='replay',
            wall_s=wall,
            bag=str(cfg.bag),
            topic=cfg.points_topic,
            diagnostics_last=dict(rec.diagnostics_last),
            pwan_stamps=[ns * 1e-9 for ns in sorted(rec.pwan_stamps)],
            rejected_stamps=[ns * 1e-9 for ns in sorted(rec.rejected_stamps)],
            scan_notes=[[ns * 1e-9, *rec.scan_notes[ns]] for ns in sorted(rec.scan_notes)],
        )


def _play(
    cfg: ReplayConfig, pubs, clock_pub, rec: _Recorder, generate_clock: bool, played
) -> dict:
    """Publish the bag's messages paced by their log times; returns per-topic counts."""
    from builtin_interfaces.msg import Time
    from rosgraph_msgs.msg import Clock

    def publish_clock(ns: int):
        clock_pub.publish(Clock(clock=Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)))

    counts: dict = {}
    t0_bag = t0_wall = None
    clock_period = 1.0 / (cfg.clock_hz * cfg.rate)  # wall seconds between generated clocks
    next_clock_wall = 0.0
    for topic, _, t_ns, raw in bag_io.iter_raw(cfg.bag, played):
        if t0_bag is None:
            t0_bag, t0_wall = t_ns, time.monotonic()
            next_clock_wall = t0_wall
        target = t0_wall + (t_ns - t0_bag) * 1e-9 / cfg.rate
        while True:
            now = time.monotonic()
            if generate_clock and next_clock_wall < target and next_clock_wall <= now:
                publish_clock(t0_bag + int(round((next_clock_wall - t0_wall) * cfg.rate * 1e9)))
                next_clock_wall += clock_period
                continue
            if now >= target:
                break
            wake = min(target, next_clock_wall) if generate_clock else target
            time.sleep(max(wake - now, 0.0))
        if generate_clock:
            publish_clock(t_ns)
        stamp_ns = _header_stamp_ns(raw) if topic == cfg.points_topic else None
        if stamp_ns is not None:
            with rec.lock:
                rec.published_wall[stamp_ns] = time.monotonic()
        pubs[topic].publish(raw)
        counts[topic] = counts.get(topic, 0) + 1
        if stamp_ns is not None and cfg.wait_for_pose > 0:
            waited = _wait_for_pose(rec, stamp_ns, cfg.wait_for_pose)
            t0_wall += waited  # the bag clock pauses while the node works
            next_clock_wall += waited
    if not counts:
        raise ReplayError(f'bag {cfg.bag} has no messages on {played}')
    return counts


def _wait_for_pose(rec: _Recorder, stamp_ns: int, timeout: float) -> float:
    """Wait until the pose of the scan stamped ``stamp_ns`` was received (or ``timeout`` s);
    returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with rec.lock:
            if stamp_ns in rec.odom:
                break
        time.sleep(0.002)
    return time.monotonic() - t0
