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
    corrected_topic: str = param(
        '/pwan_odometry/corrected_odometry',
        'topic of the final estimates of scans the node first answered with a prediction '
        "(during a recovery); they replace those in the trajectory; '' = ignore",
    )
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
    """What the replay hears, filled by the subscriptions' callbacks (spinner thread)."""

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
    corrected: dict = field(default_factory=dict)  # stamp ns -> 4x4 final estimate
    predicted_stamps: set = field(default_factory=set)  # answered live with a prediction
    final_stamps: set = field(default_factory=set)  # scans whose estimate is final
    awaited: set = field(default_factory=set)  # ... whose final pose is on the corrected topic
    finals_announced: bool = False  # the node says which estimates are final

    def on_corrected(self, msg) -> None:
        """A final estimate that replaces the prediction published live for its scan."""
        with self.lock:
            self.corrected[bag_io.stamp_to_ns(msg.header.stamp)] = bag_io.pose_from_msg(
                msg.pose.pose
            )
            self.last_odom_wall = time.monotonic()

    def settled(self, stamp_ns: int) -> bool:
        """The scan has its pose, and it is final (or the node does not say)."""
        with self.lock:
            if stamp_ns not in self.odom:
                return False
            if not self.finals_announced:
                return True
            return stamp_ns in self.final_stamps and (
                stamp_ns not in self.awaited or stamp_ns in self.corrected
            )

    def unsettled(self) -> int:
        """Scans answered with a prediction whose final estimate has not come yet."""
        with self.lock:
            missing = self.awaited - set(self.corrected)
            return len(self.predicted_stamps - self.final_stamps) + len(missing)

    def on_odom(self, msg) -> None:
        """An odometry answer: its pose, and the latency from its scan's publication."""
        now = time.monotonic()
        ns = bag_io.stamp_to_ns(msg.header.stamp)
        pose = bag_io.pose_from_msg(msg.pose.pose)
        with self.lock:
            self.odom[ns] = pose
            self.last_odom_wall = now
            sent = self.published_wall.get(ns)
            if sent is not None:
                self.latencies_ms.append((now - sent) * 1e3)

    def on_diag(self, msg) -> None:
        """The node's diagnostics: its latency, dropped scans, and the scans PWAN engaged on or
        that were rejected."""
        with self.lock:
            for status in msg.status:
                values = {kv.key: kv.value for kv in status.values}
                self.diagnostics_last.update(values)
                if 'latency_ms' in values and _float(values['latency_ms']) is not None:
                    self.node_latencies_ms.append(_float(values['latency_ms']))
                if 'scans_dropped' in values and _float(values['scans_dropped']) is not None:
                    self.node_scans_dropped = int(_float(values['scans_dropped']))
                ns = bag_io.stamp_to_ns(msg.header.stamp)
                self._on_final(ns, values)
                if values.get('pwan_engaged') == 'true':
                    self.pwan_stamps.add(ns)
                if values.get('path') in ('rejected', 'reanchor'):
                    self.rejected_stamps.add(ns)
                if ns in self.pwan_stamps or ns in self.rejected_stamps:
                    ratio = _float(values.get('matched_ratio', ''))
                    self.scan_notes[ns] = [values.get('path', ''), ratio, status.message]

    def _on_final(self, ns: int, values: dict) -> None:
        """(under the lock) whether the node says the scan's estimate is final."""
        if 'recovering_s' in values:  # a recovery still running: the node is at work
            self.last_odom_wall = time.monotonic()
        if 'final' not in values:
            return
        self.finals_announced = True
        if values['final'] == 'true':
            self.final_stamps.add(ns)
            self.last_odom_wall = time.monotonic()
        if values.get('corrected') == 'true':  # its pose comes on the corrected topic
            self.awaited.add(ns)
        if values.get('path') == 'predicted':
            self.predicted_stamps.add(ns)

    def answered(self) -> int:
        """Published scans with an odometry answer."""
        with self.lock:
            return len(set(self.odom) & set(self.published_wall))

    def record(self, cfg: 'ReplayConfig', n_scans: int, wall: float) -> RunRecord:
        """What was recorded, as a :class:`RunRecord`."""
        with self.lock:
            stamps = sorted(self.odom)
            final = {**self.odom, **{s: p for s, p in self.corrected.items() if s in self.odom}}
            est = Trajectory(
                np.array(stamps, dtype=np.float64) * 1e-9,
                np.array([final[s] for s in stamps]).reshape(-1, 4, 4),
            )
            replaced = sorted(set(self.corrected) & set(self.odom))
            return RunRecord(
                estimate=est,
                scans_published=n_scans,
                latencies_ms=list(self.latencies_ms),
                node_latencies_ms=list(self.node_latencies_ms),
                node_scans_dropped=self.node_scans_dropped,
                mode='replay',
                wall_s=wall,
                bag=str(cfg.bag),
                topic=cfg.points_topic,
                diagnostics_last=dict(self.diagnostics_last),
                pwan_stamps=[ns * 1e-9 for ns in sorted(self.pwan_stamps)],
                rejected_stamps=[ns * 1e-9 for ns in sorted(self.rejected_stamps)],
                scan_notes=[[ns * 1e-9, *self.scan_notes[ns]] for ns in sorted(self.scan_notes)],
                predicted_stamps=[ns * 1e-9 for ns in sorted(self.predicted_stamps)],
                live_poses=[[ns * 1e-9, *self.odom[ns].ravel().tolist()] for ns in replaced],
            )


def _float(v: str):
    try:
        return float(v)
    except ValueError:
        return None


def replay(cfg: ReplayConfig, log=print) -> RunRecord:
    """Play ``cfg.bag`` over DDS and return what was recorded. Needs rclpy (initialised here)."""
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    cfg, played, classes = _resolved(cfg)
    # our argv is not ROS arguments (--remap A:=B would read as a deprecated rcl remap); no rclpy
    # signal handlers: Ctrl-C / SIGTERM raise KeyboardInterrupt in this thread (run_cli), which
    # unwinds through the finally blocks below, instead of rclpy shutting the context down under
    # the spinner thread and the publishers (thread tracebacks, "publisher's context is invalid")
    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    try:
        return _replay_on(rclpy.create_node('pwan_replay'), cfg, played, classes, log)
    finally:
        rclpy.try_shutdown()


def _resolved(cfg: ReplayConfig) -> tuple:
    """(cfg with the scan topic a remap names, the topics played, their message classes);
    ReplayError / a bag error when the bag lacks what is asked."""
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
    return cfg, played, {t: message_class(topics[t].msgtype) for t in played}


def _qos(cfg: ReplayConfig) -> dict:
    """QoS profiles: 'played' (the bag's topics), '/clock', '/tf_static' (latched, as in ROS 2:
    late subscribers still get the transforms) and 'recorded' (what the replay listens to)."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    reliability = (
        ReliabilityPolicy.RELIABLE
        if cfg.reliability == 'reliable'
        else ReliabilityPolicy.BEST_EFFORT
    )
    return {
        'played': QoSProfile(
            depth=cfg.depth,
            reliability=reliability,
            history=HistoryPolicy.KEEP_LAST,
            durability=DurabilityPolicy.VOLATILE,
        ),
        '/clock': QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
        '/tf_static': QoSProfile(
            depth=100,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        ),
        'recorded': QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE),
    }


def _replay_on(node, cfg: ReplayConfig, played: list, classes: dict, log) -> RunRecord:
    """The replay through ``node``: publishers, subscriptions, a spinner thread, then
    :func:`_run`."""
    from rclpy.executors import SingleThreadedExecutor
    from rosgraph_msgs.msg import Clock

    qos, renames = _qos(cfg), cfg.renames()
    generate_clock = '/clock' not in played
    pubs = {
        t: node.create_publisher(classes[t], renames.get(t, t), qos.get(t, qos['played']))
        for t in played
    }
    clock_pub = node.create_publisher(Clock, '/clock', qos['/clock']) if generate_clock else None
    rec = _Recorder()
    odom_sub = None
    if cfg.odom_topic:
        from nav_msgs.msg import Odometry

        odom_sub = node.create_subscription(Odometry, cfg.odom_topic, rec.on_odom, qos['recorded'])
    if cfg.diagnostics_topic:
        from diagnostic_msgs.msg import DiagnosticArray

        node.create_subscription(
            DiagnosticArray, cfg.diagnostics_topic, rec.on_diag, qos['recorded']
        )
    if cfg.odom_topic and cfg.corrected_topic:
        from nav_msgs.msg import Odometry

        node.create_subscription(Odometry, cfg.corrected_topic, rec.on_corrected, qos['recorded'])
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        _wait_for_node(cfg, pubs[cfg.points_topic], odom_sub, log)
        log(f'replay: playing {", ".join(played)} from {cfg.bag} at rate {cfg.rate:g}')
        t_start = time.monotonic()
        counts = _play(cfg, pubs, clock_pub, rec, played)
        n_scans = counts.get(cfg.points_topic, 0)
        if odom_sub is not None:
            _drain(cfg, rec, n_scans, time.monotonic())
        return rec.record(cfg, n_scans, time.monotonic() - t_start)
    finally:
        executor.shutdown()
        spinner.join(timeout=5)
        node.destroy_node()


def _wait_for_node(cfg: ReplayConfig, scan_pub, odom_sub, log) -> None:
    """Wait until the scan topic has a subscriber and the odometry topic a publisher (no scan is
    lost to discovery), then ``cfg.settle`` seconds; ReplayError after ``startup_timeout``."""
    scans = cfg.renames().get(cfg.points_topic, cfg.points_topic)
    deadline = time.monotonic() + cfg.startup_timeout
    log(
        f"replay: waiting up to {cfg.startup_timeout:g} s for a subscriber on '{scans}'"
        + (f" and a publisher on '{cfg.odom_topic}'" if odom_sub is not None else '')
    )
    while scan_pub.get_subscription_count() < 1 or (
        odom_sub is not None and odom_sub.get_publisher_count() < 1
    ):
        if time.monotonic() > deadline:
            missing = (
                f"no subscriber on '{scans}'"
                if scan_pub.get_subscription_count() < 1
                else f"no publisher on '{cfg.odom_topic}'"
            )
            raise ReplayError(
                f'{missing} after {cfg.startup_timeout:.0f} s: is the node running '
                '(same ROS_DOMAIN_ID, topic names/remaps right)?'
            )
        time.sleep(0.05)
    time.sleep(cfg.settle)


def _drain(cfg: ReplayConfig, rec: _Recorder, n_scans: int, t_end: float) -> None:
    """After the last message: wait until every scan has its odometry and every prediction its
    final estimate, or ``drain_timeout`` seconds pass without a new one."""
    while True:
        with rec.lock:
            last = max(rec.last_odom_wall, t_end)
        done = rec.answered() >= n_scans and not rec.unsettled()
        if done or time.monotonic() - last > cfg.drain_timeout:
            return
        time.sleep(0.05)


def _play(cfg: ReplayConfig, pubs, clock_pub, rec: _Recorder, played) -> dict:
    """Publish the bag's messages paced by their log times, and the bag time on /clock at
    ``clock_hz`` when ``clock_pub`` is given (the bag has no /clock); returns per-topic
    counts."""
    from builtin_interfaces.msg import Time
    from rosgraph_msgs.msg import Clock

    def publish_clock(ns: int):
        clock_pub.publish(Clock(clock=Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)))

    generate_clock = clock_pub is not None
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
    """Wait until the pose of the scan stamped ``stamp_ns`` was received and is final (a node
    that answered with a prediction during a recovery says when its final estimate is out), or
    ``timeout`` s; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if rec.settled(stamp_ns):
            break
        time.sleep(0.002)
    return time.monotonic() - t0
