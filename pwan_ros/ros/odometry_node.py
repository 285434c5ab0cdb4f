"""ROS 2 node ``pwan_odometry`` (executable ``pwan_odometry_node``): PWAN odometry from scans.

A thin adapter over :class:`pwan_ros.odometry.odometer.Odometer`: PointCloud2 -> numpy
(pwan_ros.io.pointcloud2) -> odometer -> Odometry, TF, aligned cloud, diagnostics; the node
converts messages and publishes, the odometry policy (acceptance, the diagnostics level, the time
budget) lives in :mod:`pwan_ros.odometry`. The subscription callback only stores the newest scan
(counting the one it replaces as dropped); a worker thread registers scans, so callbacks never
block.

Topics (relative names, remap them): subscribes ``points`` (sensor_msgs/PointCloud2) and
``/tf_static`` (when base_frame differs from the cloud frame); publishes ``odometry``
(nav_msgs/Odometry), ``/tf`` (odom_frame -> base_frame), ``aligned_points`` (the scan in
odom_frame) and ``/diagnostics``. Parameters: see :mod:`pwan_ros.odometry.config`.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Deque, Dict, Optional, Tuple

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import TransformStamped
from nav_msgs.msg import Odometry
from rclpy.clock import Clock, ClockType, JumpThreshold
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import PointCloud2
from tf2_msgs.msg import TFMessage

from pwan_ros.geometry.frame_graph import FrameGraph
from pwan_ros.geometry.se3 import to_quaternion, transform_points
from pwan_ros.io import pointcloud2 as pc2
from pwan_ros.odometry.config import ConfigError, OdometryConfig
from pwan_ros.odometry.odometer import (
    ERROR_NOTICES,
    OUT_OF_ORDER_S,
    Odometer,
    OdometryUpdate,
    SourceError,
    sensor_mount,
)
from pwan_ros.odometry.pipeline import OdometryPipeline, ScanError
from pwan_ros.odometry.sweep_times import SweepClock
from pwan_ros.ros.scan_subscription import ScanSubscription
from pwan_ros.ros.spin import spin_node
from pwan_ros.params import ODOMETRY_READY
from pwan_ros.ros.params import declare_config, undeclared


#: diagnostics level of each ScanEstimate.status
_LEVELS = {'ok': DiagnosticStatus.OK, 'warn': DiagnosticStatus.WARN}
#: registered scans over whose arrivals (the scan and those dropped before it) the drop rate is
#: given
DROP_WINDOW = 20
#: seconds between the statuses of a recovery running off the scan worker
RECOVERY_BEAT_S = 1.0
#: seconds without a scan after which the node says so (log and /diagnostics WARN, naming the
#: topic and its publishers), again every that long while the silence lasts
SILENCE_S = 5.0


#: the scan counters of the diagnostics
_COUNTS = (
    'received',
    'processed',
    'dropped',
    'invalid',
    'rejected',
    'pwan_engaged',
    'reanchored',
    'resets',
    'over_budget',
    'predicted',
    'corrected',
)


def _pipeline(cfg: OdometryConfig, on_recovered) -> OdometryPipeline:
    """The node's pipeline, its device and reference cloud checked first (ConfigError: 'cuda'
    without CUDA fails here, not on every scan; an unreadable or unusable reference cloud).
    Recoveries run off the scan worker; ``on_recovered()`` is called when one finished."""
    from pwan_ros.core.device import resolve_device
    from pwan_ros.core.errors import PwanInputError

    try:
        resolve_device(cfg.device)
    except PwanInputError as exc:
        raise ConfigError(f"invalid value '{cfg.device}' for parameter 'device': {exc}") from None
    reference = None
    if cfg.reference_cloud:
        from pwan_ros.io.point_files import read_points

        try:
            reference = read_points(cfg.reference_cloud)
        except Exception as exc:  # unreadable / corrupt file: a configuration error
            raise ConfigError(f"cannot read reference_cloud '{cfg.reference_cloud}': {exc}")
    try:
        return OdometryPipeline(cfg, reference, background=True, on_recovered=on_recovered)
    except ValueError as exc:  # an unusable reference cloud (pipeline.usable_reference)
        raise ConfigError(f"reference_cloud '{cfg.reference_cloud}': {exc}") from None


class OdometryNode(Node):
    """The ``pwan_odometry`` node. Raises ConfigError for invalid parameters."""

    def __init__(self, **kwargs):
        super().__init__('pwan_odometry', **kwargs)
        values = declare_config(self, OdometryConfig, read_only=True)
        unknown = undeclared(self)
        if unknown:
            raise ConfigError(f'unknown parameter(s): {", ".join(unknown)}')
        self.config = OdometryConfig.from_dict(values)  # raises ConfigError
        cfg = self.config
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._recovered = False  # a background recovery finished: its corrections to publish
        self._beat_at = 0.0  # the next status of a running recovery (time.monotonic())
        self._live_stamps: Dict[float, object] = {}  # predicted scans: stamp (s) -> header stamp
        self.pipeline = _pipeline(cfg, self._on_recovered)
        self.odometer = Odometer(self.pipeline)
        self.static_frames = FrameGraph()
        self.invalid_static: Dict[Tuple[str, str], str] = {}  # (parent, child) -> why
        self.sweep_clock = SweepClock(cfg.deskew)  # which per-point times to deskew with

        # 'auto': one reliable and one best-effort reader, so that bag players and drivers are both
        # heard from their first scan (see pwan_ros.ros.scan_subscription)
        self.points = ScanSubscription(
            self,
            PointCloud2,
            'points',
            cfg.reliability,
            self._on_points,
            other_writer=self._on_other_writer,
        )
        static_qos = QoSProfile(
            depth=100,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
            reliability=ReliabilityPolicy.RELIABLE,
        )
        self.create_subscription(
            TFMessage,
            '/tf_static',
            lambda m: self.static_frames.add_message(m, self.invalid_static),
            static_qos,
        )
        self.odom_pub = self.create_publisher(Odometry, 'odometry', 10)
        # the final estimates of scans answered with predictions during a recovery
        self.corrected_pub = self.create_publisher(Odometry, '~/corrected_odometry', 100)
        self.cloud_pub = self.create_publisher(PointCloud2, 'aligned_points', 5)
        self.diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.tf_pub = self.create_publisher(TFMessage, '/tf', 100) if cfg.publish_tf else None

        self._pending: Optional[Tuple[PointCloud2, float]] = None
        self._stop = False
        self.counts = dict.fromkeys(_COUNTS, 0)
        self._dropped_seen = 0  # counts['dropped'] at the last registered scan
        self._arrivals: Deque[Tuple[int, int]] = collections.deque(maxlen=DROP_WINDOW)
        self._frame = ''  # the last cloud frame (diagnostics hardware_id)
        self._warned: Dict[str, float] = {}
        # /clock going back (a bag that looped, use_sim_time): the timeline restarted
        self._jump = self.get_clock().create_jump_callback(
            JumpThreshold(
                min_forward=None,
                min_backward=Duration(nanoseconds=-int(OUT_OF_ORDER_S * 1e9)),
                on_clock_change=False,
            ),
            post_callback=lambda jump: self.odometer.time_restarted(),
        )
        self._worker = threading.Thread(target=self._run, name='pwan_odometry_worker', daemon=True)
        self._worker.start()
        self.get_logger().info(
            f'{ODOMETRY_READY} points={self.points.topic_name} mode={cfg.mode} '
            f'transform={cfg.transform} '
            f'divergence={cfg.divergence} device={cfg.device} reliability={cfg.reliability}'
            + (f" reference_cloud='{cfg.reference_cloud}'" if cfg.reference_cloud else '')
        )

    # ------------------------------------------------------------------ callbacks
    def _on_points(self, msg: PointCloud2) -> None:
        with self._lock:
            self.counts['received'] += 1
            if self._pending is not None:
                self.counts['dropped'] += 1
            self._pending = (msg, time.perf_counter())
            self._wake.notify()

    def _on_recovered(self) -> None:
        """A background recovery finished (its thread): wake the worker to publish it."""
        with self._lock:
            self._recovered = True
            self._wake.notify()

    def _on_other_writer(self, msg: PointCloud2) -> None:
        """A scan from a second writer on the topic: skipped, an ERROR (every 5 s)."""
        with self._lock:
            self.counts['received'] += 1
        self._source_error(
            msg,
            f"two writers publish on {self.points.topic_name} (frame '{msg.header.frame_id}'): "
            "following the first, skipping the other's scans (a driver started twice, or a "
            'second sensor on the same topic)',
        )

    def _source_error(self, msg: PointCloud2, text: str) -> None:
        """A scan from another source: counted invalid, an ERROR log (at most every 5 s) and an
        ERROR status."""
        self._count(invalid=1)
        now = time.monotonic()
        if now - self._warned.get('source', -1e9) >= 5.0:
            self._warned['source'] = now
            self.get_logger().error(text)
        self._publish_diagnostics(msg.header.stamp, DiagnosticStatus.ERROR, text, {})

    def _warn(self, key: str, text: str, period: float = 5.0) -> None:
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) >= period:
            self._warned[key] = now
            self.get_logger().warning(text)

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        quiet_since = time.monotonic()  # the start, then the last scan
        report_at = quiet_since + SILENCE_S
        while True:
            with self._lock:
                while self._pending is None and not self._recovered and not self._stop:
                    self._wake.wait(0.5)
                    if self._pending is None and self._due(report_at):
                        break
                if self._stop:
                    return
                pending, self._pending = self._pending, None
                recovered, self._recovered = self._recovered, False
            if recovered:
                self._guarded(self._publish_corrections)
            if pending is None:
                now = time.monotonic()
                if self.pipeline.recovering and now >= self._beat_at:
                    self._beat_at = now + RECOVERY_BEAT_S
                    self._guarded(self._report_recovery)
                if now >= report_at:  # silence: say so, and again every SILENCE_S
                    report_at = now + SILENCE_S
                    self._report_silence(now - quiet_since)
                continue
            msg, t_received = pending
            quiet_since = time.monotonic()
            report_at = quiet_since + SILENCE_S
            if not self._guarded(lambda: self._handle(msg, t_received), msg.header.stamp):
                return

    def _due(self, report_at: float) -> bool:
        """A report is due: the silence's, or the running recovery's (every RECOVERY_BEAT_S)."""
        now = time.monotonic()
        return now >= report_at or (self.pipeline.recovering and now >= self._beat_at)

    def _report_recovery(self) -> None:
        """A WARN status while a recovery runs off the scan worker: since when, for how long,
        how many scans were answered with predictions meanwhile."""
        progress = self.pipeline.recovery_progress()
        if progress is None:
            return
        stamp, seconds, kept = progress
        text = (
            f'recovering: full PWAN for the scan at {stamp:.3f} s running off the scan worker '
            f'for {seconds:.1f} s; {kept} scan(s) since answered with predictions, to be '
            're-tracked when it returns'
        )
        values = {'recovering_s': f'{seconds:.1f}', 'scans_waiting': str(kept)}
        self._publish_diagnostics(self._now(), DiagnosticStatus.WARN, text, values)

    def _guarded(self, work, stamp=None) -> bool:
        """Run ``work()``; an internal error is counted, logged (every 5 s) and published as an
        ERROR, never kills the node. False when shutting down (the worker ends)."""
        try:
            work()
        except Exception as exc:  # never let one scan kill the node
            if self._stop or not self.context.ok():
                return False  # shutting down: publishers are gone
            self._count(invalid=1)
            self._warn('internal', f'scan skipped after an internal error: {exc!r}')
            try:
                self._publish_diagnostics(
                    stamp or self._now(), DiagnosticStatus.ERROR, f'internal error: {exc}', {}
                )
            except Exception:
                pass
        return True

    def _skip(self, msg: PointCloud2, key: str, text: str, status: str) -> None:
        """A scan that cannot be used: counted (``scans_invalid``), a warning (at most every 5 s
        per ``key``) and a WARN status ``status``."""
        self._count(invalid=1)
        self._warn(key, text)
        self._publish_diagnostics(msg.header.stamp, DiagnosticStatus.WARN, status, {})

    def _report_silence(self, seconds: float) -> None:
        """No scan for ``seconds``: one log line and a WARN status naming the topic and how many
        publishers it has (some: their type or QoS does not match; none: nothing publishes)."""
        try:
            topic = self.points.topic_name
            publishers = self.count_publishers(topic)
            with self._lock:
                received = self.counts['received']
            if not publishers:
                why = 'nothing publishes there (check the topic name or remapping)'
            elif received:  # it was heard before: the source stopped or its data stopped coming
                why = (
                    f'{publishers} publisher(s), {received} scan(s) received so far (the driver '
                    'or player paused, stopped sending or its data no longer arrives)'
                )
            else:
                why = (
                    f'{publishers} publisher(s) but no sensor_msgs/PointCloud2 received yet '
                    '(check the message type, the QoS and the transport)'
                )
            text = f'no scan on {topic} for {seconds:.0f} s: {why}'
            self._warn('silence', text, 0.0)
            self._publish_diagnostics(self._now(), DiagnosticStatus.WARN, text, {})
        except Exception:  # shutting down
            pass

    def _now(self):
        """The node's clock as a stamp; the wall clock while sim time has no /clock yet (its
        time is 0)."""
        now = self.get_clock().now()
        if now.nanoseconds == 0:
            now = Clock(clock_type=ClockType.SYSTEM_TIME).now()
        return now.to_msg()

    def _handle(self, msg: PointCloud2, t_received: float) -> None:
        """One scan: decoded, its frames resolved, registered, and its pose, aligned cloud and
        diagnostics published (or skipped with a reason)."""
        self._publish_corrections()  # a recovery that finished before this scan comes first
        stamp = pc2.stamp_seconds(msg.header.stamp)
        try:
            cloud = pc2.read_cloud(msg)
            pc2.check_byte_order(msg, cloud.xyz)
        except pc2.PointCloud2Error as exc:
            self._skip(
                msg, 'decode', f'invalid PointCloud2 skipped: {exc}', f'invalid cloud: {exc}'
            )
            return
        frames = self._frames(msg)
        if frames is None:
            return
        frame, base, t_base_sensor = frames
        times = self.sweep_clock.read(cloud.extras, stamp)
        if times.warning:
            self._warn('deskew', times.warning, 30.0)
        try:
            update = self.odometer.update(cloud.xyz, stamp, frame, t_base_sensor, times.offsets)
        except SourceError as exc:  # two sources on the topic: an error, said every 5 s
            self._source_error(msg, str(exc))
            return
        except ScanError as exc:
            self._skip(msg, 'scan', f'scan skipped: {exc}', str(exc))
            return
        finally:
            with self._lock:
                self.counts['resets'] = self.odometer.resets
        self._frame = frame
        errors = [text for key, text in update.notices if key in ERROR_NOTICES]
        for key, text in update.notices:
            if key in ERROR_NOTICES:
                self.get_logger().error(text)
            else:
                self._warn(key, text, 0.0)
        est = update.estimate
        behind = self._falling_behind()
        self._count(
            processed=1,
            pwan_engaged=int(est.pwan_engaged),
            rejected=int(not est.accepted and est.path != 'predicted'),
            reanchored=int(est.path == 'reanchor'),
            over_budget=int(est.over_budget or bool(behind)),
            predicted=int(est.path == 'predicted'),
        )
        if est.path == 'predicted':  # its final estimate comes with the recovery's outcome
            self._live_stamps[est.stamp] = msg.header.stamp
        self._settle_leftovers()  # (a restart by this scan abandoned a recovery)
        self._publish_pose(msg.header.stamp, base, update)
        self._publish_aligned(msg, cloud, update)
        latency = (time.perf_counter() - t_received) * 1e3
        # a scan that restarted the registration (frame change, time reset) carries its pose over
        level = DiagnosticStatus.WARN if update.notices or behind else _LEVELS[est.status]
        self._publish_diagnostics(
            msg.header.stamp,
            DiagnosticStatus.ERROR if errors else level,
            '; '.join(
                [text for _, text in update.notices] + [est.message] + [behind] * bool(behind)
            ),
            self._scan_values(est, latency, times),
        )

    def _falling_behind(self) -> str:
        """'' unless scans were dropped (replaced while the worker was busy) since the last
        registered scan: then the drop rate over the last :data:`DROP_WINDOW` arrivals and what
        to do, also logged (at most every 5 s)."""
        with self._lock:
            dropped = self.counts['dropped']
        new, self._dropped_seen = dropped - self._dropped_seen, dropped
        self._arrivals.append((new + 1, new))
        if not new:
            return ''
        arrived, lost = (sum(v) for v in zip(*self._arrivals))
        advice = (
            "mode 'pwan' runs full PWAN on every scan: use mode 'adaptive', or a GPU (device cuda)"
            if self.config.mode == 'pwan'
            else 'lower scan_max_points or raise scan_voxel_size, or use a faster machine'
        )
        text = (
            f'slower than the sensor: {lost} of the last {arrived} scans dropped '
            f'({lost / arrived:.0%}) while the node was busy; {advice}'
        )
        self._warn('behind', text)
        return text

    def _frames(self, msg: PointCloud2):
        """(the cloud's frame, the base frame, T_base_sensor from /tf_static) of a scan, or None
        when it is skipped (:func:`~pwan_ros.odometry.odometer.sensor_mount` says why)."""
        cfg = self.config
        frame = msg.header.frame_id.lstrip('/')
        mount = sensor_mount(
            cfg.base_frame, cfg.odom_frame, frame, self.static_frames, self.invalid_static
        )
        if mount.skip is not None:
            self._skip(msg, *mount.skip)
            return None
        return frame, mount.base, mount.t_base_sensor

    def _scan_values(self, est, latency: float, times) -> dict:
        """The diagnostics key values of a registered scan."""
        return {
            'latency_ms': f'{latency:.2f}',
            'processing_ms': f'{est.latency_ms:.2f}',
            'path': est.path,
            'accepted': str(est.accepted).lower(),
            'pwan_engaged': str(est.pwan_engaged).lower(),
            'pwan_starts': str(est.pwan_starts),
            'final': str(est.path != 'predicted').lower(),
            'deskewed': str(est.deskewed).lower(),
            'point_times': times.status,
            'point_times_detail': times.detail,
            'matched_ratio': f'{est.matched_ratio:.4f}',
            'median_residual_m': f'{est.median_residual:.4f}',
            'iterations': str(est.iterations),
            'num_points': str(est.num_points),
            'num_input_points': str(est.num_input),
            'num_far_points': str(est.num_far),
            'keyframe': str(est.keyframe),
            'voxel_size_m': f'{self.pipeline.voxel_size:.4f}',
            'distance_threshold_m': f'{self.pipeline.distance_threshold:.4f}',
            **{f'{k}_ms': f'{v:.2f}' for k, v in est.timings_ms.items()},
        }

    def _count(self, **increments: int) -> None:
        """Add to the scan counters (shared with the subscription callback)."""
        with self._lock:
            for k, v in increments.items():
                self.counts[k] += v

    # ------------------------------------------------------------------ publishing
    def _publish_pose(self, stamp, base: str, update: OdometryUpdate) -> None:
        odom = self._odometry_msg(stamp, base, update)
        self.odom_pub.publish(odom)
        if self.tf_pub is not None:
            p = odom.pose.pose
            tf = TransformStamped()
            tf.header = odom.header
            tf.child_frame_id = base
            tf.transform.translation.x = p.position.x
            tf.transform.translation.y = p.position.y
            tf.transform.translation.z = p.position.z
            tf.transform.rotation = p.orientation
            self.tf_pub.publish(TFMessage(transforms=[tf]))

    def _odometry_msg(self, stamp, base: str, update: OdometryUpdate) -> Odometry:
        """The nav_msgs/Odometry of an update: pose, covariance, twist (unknown: -1)."""
        t = update.T_odom_base
        q = to_quaternion(t)
        odom = Odometry()
        odom.header.stamp = stamp
        odom.header.frame_id = self.config.odom_frame
        odom.child_frame_id = base
        p = odom.pose.pose
        p.position.x, p.position.y, p.position.z = (float(v) for v in t[:3, 3])
        p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w = (float(v) for v in q)
        odom.pose.covariance = update.pose_covariance
        if update.twist is not None:
            lin, ang = update.twist
            v, w = odom.twist.twist.linear, odom.twist.twist.angular
            v.x, v.y, v.z = (float(x) for x in lin)
            w.x, w.y, w.z = (float(x) for x in ang)
        else:
            odom.twist.covariance = [-1.0 if i % 7 == 0 else 0.0 for i in range(36)]  # unknown
        return odom

    def _publish_corrections(self) -> None:
        """The final estimates of a finished background recovery: for each scan it settled,
        the re-tracked pose on ``~/corrected_odometry`` (accepted ones; a scan it could not
        settle keeps its flagged prediction) and its diagnostics (``final``, the correction)."""
        updates = self.odometer.corrections()
        base = self.config.base_frame or self._frame
        for update in updates:
            est = update.estimate
            stamp = self._live_stamps.pop(est.stamp, None)
            if stamp is None:  # (not a scan answered live with a prediction)
                continue
            settled = est.accepted and est.path in ('track', 'pwan')
            if settled:
                self.corrected_pub.publish(self._odometry_msg(stamp, base, update))
            self._count(corrected=int(settled), rejected=int(not est.accepted))
            moved = est.correction or (float('nan'), float('nan'))
            text = f're-tracked after the recovery: {est.message}; ' + (
                f'corrected by {moved[0]:.3f} m, {moved[1]:.2f} deg'
                if settled
                else 'the prediction stays (flagged)'
            )
            values = {
                'path': est.path,
                'accepted': str(est.accepted).lower(),
                'pwan_engaged': str(est.pwan_engaged).lower(),
                'final': 'true',
                'corrected': str(settled).lower(),
                'matched_ratio': f'{est.matched_ratio:.4f}',
                'correction_m': f'{moved[0]:.4f}',
                'correction_deg': f'{moved[1]:.3f}',
            }
            self._publish_diagnostics(stamp, _LEVELS[est.status], text, values)
        self._settle_leftovers()

    def _settle_leftovers(self) -> None:
        """Once no recovery runs, the predicted scans it did not settle (its PWAN failed, a
        scan it could not use or skipped, a reset abandoned it) keep their predictions as
        final: a WARN status each says so."""
        if self.pipeline.recovering:
            return
        leftovers, self._live_stamps = self._live_stamps, {}
        for stamp in leftovers.values():
            text = 'the recovery did not settle this scan: its prediction stays (flagged)'
            values = {'path': 'predicted', 'final': 'true', 'corrected': 'false'}
            self._publish_diagnostics(stamp, DiagnosticStatus.WARN, text, values)

    def _publish_aligned(
        self, msg: PointCloud2, cloud: pc2.DecodedCloud, update: OdometryUpdate
    ) -> None:
        if self.cloud_pub.get_subscription_count() == 0:
            return
        if self.config.transform != 'rigid' and update.deformed_points is None:
            return  # a rejected (refused) deformation: the scan is not aligned to anything
        header = type(msg.header)()
        header.stamp = msg.header.stamp
        header.frame_id = self.config.odom_frame
        if update.deformed_points is not None:  # affine / non-rigid: the deformed scan
            out = pc2.create_cloud(header, update.deformed_points.astype(np.float32))
        else:
            keep = np.isfinite(cloud.xyz).all(axis=1)
            xyz = transform_points(update.T_odom_sensor, cloud.xyz[keep].astype(np.float64))
            extras = pc2.rotate_directions(cloud.extras[keep], update.T_odom_sensor[:3, :3])
            out = pc2.create_cloud(header, xyz.astype(np.float32), extras)
        self.cloud_pub.publish(out)

    def _publish_diagnostics(self, stamp, level, message: str, values: Dict[str, str]) -> None:
        status = DiagnosticStatus()
        status.level = level
        status.name = 'pwan_odometry: scan registration'
        status.hardware_id = self.config.base_frame or self._frame
        status.message = message
        with self._lock:
            snapshot = dict(self.counts)
        counts = {
            k if k in ('resets', 'over_budget') else f'scans_{k}': str(v)
            for k, v in snapshot.items()
        }
        status.values = [
            KeyValue(key=k, value=v)
            for k, v in {**values, **counts, 'mode': self.config.mode}.items()
        ]
        arr = DiagnosticArray()
        arr.header.stamp = stamp
        arr.status = [status]
        self.diag_pub.publish(arr)

    def destroy_node(self):
        with self._lock:
            self._stop = True
            self._wake.notify()
        self.pipeline.pwan.cancel()  # a running PWAN registration stops at its next step
        self._worker.join(timeout=30.0)
        self.pipeline.close()  # and a background recovery
        return super().destroy_node()


def main(args=None) -> int:
    return spin_node('pwan_odometry', OdometryNode, (ConfigError,), args, 'invalid parameters: ')


if __name__ == '__main__':
    sys.exit(main())
