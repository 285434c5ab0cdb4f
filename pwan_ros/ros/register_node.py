"""ROS 2 node ``pwan_register``: robust scan registration with PWAN.

A thin adapter over :class:`pwan_ros.odometry.pipeline.ScanPipeline`:
PointCloud2 -> numpy (pwan_ros.io.pointcloud2) -> pipeline -> Odometry, TF, aligned cloud,
diagnostics. The subscription callback only stores the newest scan (counting the one it
replaces as dropped); a worker thread registers scans, so callbacks never block.

Topics (relative names, remap them): subscribes ``points`` (sensor_msgs/PointCloud2) and
``/tf_static`` (when base_frame differs from the cloud frame); publishes ``odometry``
(nav_msgs/Odometry), ``/tf`` (odom_frame -> base_frame), ``aligned_points`` (the scan in
odom_frame) and ``/diagnostics``. Parameters: see :mod:`pwan_ros.odometry.config`.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
from typing import Dict, Optional, Tuple

import numpy as np
import rclpy
import rclpy.executors
from rclpy.exceptions import (InvalidParameterTypeException,
                              InvalidParameterValueException)
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import TransformStamped
from nav_msgs.msg import Odometry
from rcl_interfaces.msg import (FloatingPointRange, IntegerRange, ParameterDescriptor,
                                ParameterType)
from rclpy.node import Node
from rclpy.qos import (DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy)
from sensor_msgs.msg import PointCloud2
from tf2_msgs.msg import TFMessage

from pwan_ros.io import pointcloud2 as pc2
from pwan_ros.ros.args import params_file_problem
from pwan_ros.odometry.config import DESCRIPTIONS, ConfigError, OdometryConfig
from pwan_ros.odometry.pipeline import ScanError, ScanEstimate, ScanPipeline
from pwan_ros.geometry.se3 import from_quaternion, invert, project_rigid, to_quaternion

# Closed ranges for numeric parameters (descriptor ranges are shown by `ros2 param describe`).
_FLOAT_RANGES = {
    'mass_ratio': (0.0, 1.0), 'min_matched_ratio': (0.0, 1.0), 'ratio_drop': (0.0, 1.0),
    'distance_threshold': (0.0, 1000.0), 'voxel_size': (0.0, 100.0), 'min_range': (0.0, 1e4),
    'max_range': (0.0, 1e4), 'keyframe_distance': (0.0, 1e4), 'keyframe_angle': (0.0, math.pi),
    'time_budget_ms': (0.0, 1e6), 'pwan_time_budget_ms': (0.0, 1e7),
}
_INT_RANGES = {'max_points': (100, 10_000_000), 'source_points': (100, 10_000_000),
               'pwan_max_points': (50, 1_000_000),
               'recovery_yaw_starts': (1, 36), 'reanchor_after': (0, 1_000_000),
               'steps': (1, 1_000_000), 'potential_updates': (1, 10_000), 'seed': (0, 2**31 - 1)}


def _descriptor(name: str, default) -> ParameterDescriptor:
    d = ParameterDescriptor(name=name, description=DESCRIPTIONS[name], read_only=True)
    if isinstance(default, bool):
        d.type = ParameterType.PARAMETER_BOOL
    elif isinstance(default, int):
        d.type = ParameterType.PARAMETER_INTEGER
        lo, hi = _INT_RANGES[name]
        d.integer_range = [IntegerRange(from_value=lo, to_value=hi, step=0)]
    elif isinstance(default, float):
        d.type = ParameterType.PARAMETER_DOUBLE
        if name in _FLOAT_RANGES:
            lo, hi = _FLOAT_RANGES[name]
            d.floating_point_range = [FloatingPointRange(from_value=lo, to_value=hi, step=0.0)]
    else:
        d.type = ParameterType.PARAMETER_STRING
    return d


def _stamp_seconds(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def _matrix_from_transform(t) -> np.ndarray:
    q = (t.rotation.x, t.rotation.y, t.rotation.z, t.rotation.w)
    return from_quaternion(q, (t.translation.x, t.translation.y, t.translation.z))


class StaticFrames:
    """Static transforms received on /tf_static, looked up through chains of edges.

    Thread-safe: ``add`` runs in the executor's callback, ``lookup`` in the worker thread."""

    def __init__(self):
        self._edges: Dict[Tuple[str, str], np.ndarray] = {}
        self._lock = threading.Lock()

    def add(self, msg: TFMessage) -> None:
        for t in msg.transforms:
            parent, child = t.header.frame_id.lstrip('/'), t.child_frame_id.lstrip('/')
            try:
                m = _matrix_from_transform(t.transform)
            except ValueError:
                continue
            with self._lock:
                self._edges[(parent, child)] = m

    def lookup(self, target: str, source: str) -> Optional[np.ndarray]:
        """T_target_source (maps points in ``source`` into ``target``), or None if unknown."""
        if target == source:
            return np.eye(4)
        with self._lock:
            edges = list(self._edges.items())
        graph: Dict[str, list] = {}
        for (p, c), m in edges:
            graph.setdefault(p, []).append((c, m))              # T_p_c
            graph.setdefault(c, []).append((p, invert(m)))      # T_c_p
        frontier, seen = [(target, np.eye(4))], {target}
        while frontier:
            frame, t_target_frame = frontier.pop()
            for nxt, t_frame_nxt in graph.get(frame, ()):
                if nxt in seen:
                    continue
                t = t_target_frame @ t_frame_nxt
                if nxt == source:
                    return t
                seen.add(nxt)
                frontier.append((nxt, t))
        return None


class RegisterNode(Node):
    """The ``pwan_register`` node. Raises ConfigError for invalid parameters."""

    def __init__(self, **kwargs):
        super().__init__('pwan_register', **kwargs)
        defaults = OdometryConfig()
        values = {}
        for f in dataclasses.fields(OdometryConfig):
            default = getattr(defaults, f.name)
            self.declare_parameter(f.name, default, _descriptor(f.name, default))
            values[f.name] = self.get_parameter(f.name).value
        self.config = OdometryConfig.from_dict(values)   # raises ConfigError
        cfg = self.config
        from pwan_ros.core.device import resolve_device
        from pwan_ros.core.errors import PwanInputError
        try:
            resolve_device(cfg.device)      # 'cuda' without CUDA fails here, not on every scan
        except PwanInputError as exc:
            raise ConfigError(f"invalid value '{cfg.device}' for parameter 'device': {exc}") from None

        reference = None
        if cfg.reference_cloud:
            from pwan_ros.io.point_files import read_points
            try:
                reference = read_points(cfg.reference_cloud)
            except Exception as exc:  # unreadable / corrupt file: a configuration error
                raise ConfigError(f"cannot read reference_cloud '{cfg.reference_cloud}': {exc}")
            if reference.ndim != 2 or reference.shape[1] != 3:
                raise ConfigError(f"reference_cloud '{cfg.reference_cloud}' must hold 3-D points, "
                                  f'got shape {reference.shape}')
        self.pipeline = ScanPipeline(cfg, reference)
        self.static_frames = StaticFrames()

        # best effort (depth 1) matches drivers publishing with the sensor-data profile and
        # reliable publishers (bag players) alike; a reliable subscription misses the former.
        # 'auto' switches to reliable once every publisher on the topic is reliable.
        self._points_sub = None
        self._subscribe_points(ReliabilityPolicy.RELIABLE if cfg.reliability == 'reliable'
                               else ReliabilityPolicy.BEST_EFFORT)
        if cfg.reliability == 'auto':
            self.create_timer(0.5, self._adapt_reliability)
        static_qos = QoSProfile(depth=100, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                                reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(TFMessage, '/tf_static', self.static_frames.add, static_qos)
        self.odom_pub = self.create_publisher(Odometry, 'odometry', 10)
        self.cloud_pub = self.create_publisher(PointCloud2, 'aligned_points', 5)
        self.diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.tf_pub = (self.create_publisher(TFMessage, '/tf', 100) if cfg.publish_tf else None)

        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: Optional[Tuple[PointCloud2, float]] = None
        self._stop = False
        self.counts = dict(received=0, processed=0, dropped=0, invalid=0, rejected=0,
                           pwan_engaged=0, reanchored=0, resets=0, over_budget=0)
        self._frame: Optional[str] = None
        self._origin = np.eye(4)        # T_odom_sensor-start of the current pipeline run
        self._last_pose = np.eye(4)     # last published T_odom_base
        self._last_stamp: Optional[float] = None
        self._pose_stamp: Optional[float] = None
        self._warned: Dict[str, float] = {}
        self._worker = threading.Thread(target=self._run, name='pwan_register_worker', daemon=True)
        self._worker.start()
        self.get_logger().info(
            f'pwan_register ready: mode={cfg.mode} transform={cfg.transform} '
            f'divergence={cfg.divergence} device={cfg.device} reliability={cfg.reliability}'
            + (f" reference_cloud='{cfg.reference_cloud}'" if cfg.reference_cloud else ''))

    # ------------------------------------------------------------------ QoS
    def _subscribe_points(self, reliability: ReliabilityPolicy) -> None:
        if self._points_sub is not None:
            self.destroy_subscription(self._points_sub)
        reliable = reliability == ReliabilityPolicy.RELIABLE
        qos = QoSProfile(depth=5 if reliable else 1, history=HistoryPolicy.KEEP_LAST, reliability=reliability)
        self._points_sub = self.create_subscription(PointCloud2, 'points', self._on_points, qos)
        self._points_reliability = reliability

    def _adapt_reliability(self) -> None:
        """reliability 'auto': reliable when all publishers of the points topic are reliable (bag
        players), else best effort (drivers; also matches reliable publishers)."""
        infos = self.get_publishers_info_by_topic(self._points_sub.topic_name)
        if not infos:
            return
        want = (ReliabilityPolicy.RELIABLE
                if all(i.qos_profile.reliability == ReliabilityPolicy.RELIABLE for i in infos)
                else ReliabilityPolicy.BEST_EFFORT)
        if want != self._points_reliability:
            self.get_logger().info(f"points publishers are {'all reliable' if want == ReliabilityPolicy.RELIABLE else 'best effort'}: subscribing "
                                   f"{'reliable' if want == ReliabilityPolicy.RELIABLE else 'best effort'}")
            self._subscribe_points(want)

    # ------------------------------------------------------------------ callbacks
    def _on_points(self, msg: PointCloud2) -> None:
        with self._lock:
            self.counts['received'] += 1
            if self._pending is not None:
                self.counts['dropped'] += 1
            self._pending = (msg, time.perf_counter())
            self._wake.notify()

    def _warn(self, key: str, text: str, period: float = 5.0) -> None:
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) >= period:
            self._warned[key] = now
            self.get_logger().warning(text)

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        while True:
            with self._lock:
                while self._pending is None and not self._stop:
                    self._wake.wait(0.5)
                if self._stop:
                    return
                msg, t_received = self._pending
                self._pending = None
            try:
                self._handle(msg, t_received)
            except Exception as exc:  # never let one scan kill the node
                if self._stop or not self.context.ok():
                    return            # shutting down: publishers are gone
                self._count(invalid=1)
                self._warn('internal', f'scan skipped after an internal error: {exc!r}')
                try:
                    self._publish_diagnostics(msg.header.stamp, DiagnosticStatus.ERROR,
                                              f'internal error: {exc}', {})
                except Exception:
                    pass

    def _handle(self, msg: PointCloud2, t_received: float) -> None:
        cfg = self.config
        frame = msg.header.frame_id.lstrip('/')
        stamp = _stamp_seconds(msg.header.stamp)
        try:
            cloud = pc2.read_cloud(msg)
        except pc2.PointCloud2Error as exc:
            self._count(invalid=1)
            self._warn('decode', f'invalid PointCloud2 skipped: {exc}')
            self._publish_diagnostics(msg.header.stamp, DiagnosticStatus.WARN,
                                      f'invalid cloud: {exc}', {})
            return
        if not frame:
            self._count(invalid=1)
            self._warn('frame', 'PointCloud2 without header.frame_id skipped')
            self._publish_diagnostics(msg.header.stamp, DiagnosticStatus.WARN,
                                      'cloud without frame_id', {})
            return
        base = cfg.base_frame or frame
        t_base_sensor = self.static_frames.lookup(base, frame)
        if t_base_sensor is None:
            self._count(invalid=1)
            self._warn('tf', f"no static transform {base} -> {frame} on /tf_static yet; "
                             'scan skipped')
            self._publish_diagnostics(msg.header.stamp, DiagnosticStatus.WARN,
                                      f'missing static transform {base} -> {frame}', {})
            return
        if self._frame is not None and frame != self._frame:
            self._warn('frame_change', f"cloud frame changed from '{self._frame}' to '{frame}': "
                                       'restarting registration from the last pose', 0.0)
            self._restart(keep_pose=True)
        if self._last_stamp is not None and stamp < self._last_stamp:
            self._warn('time', f'time went backwards ({stamp:.3f} < {self._last_stamp:.3f} s): '
                               'resetting odometry', 0.0)
            self._restart(keep_pose=False)
        self._frame = frame

        try:
            est = self.pipeline.process(cloud.xyz, stamp)
        except ScanError as exc:
            self._count(invalid=1)
            self._warn('scan', f'scan skipped: {exc}')
            self._publish_diagnostics(msg.header.stamp, DiagnosticStatus.WARN, str(exc), {})
            return
        self._last_stamp = stamp
        self._count(processed=1, pwan_engaged=int(est.pwan_engaged), rejected=int(not est.accepted),
                    reanchored=int(est.path == 'reanchor'),
                    over_budget=int(est.path != 'pwan' and est.latency_ms > cfg.time_budget_ms))

        # T_odom_base: odom is the base pose at the start of the run (REP-105).
        t_sensor_base = invert(t_base_sensor)
        pose = project_rigid(self._origin @ est.pose)
        t_odom_base = t_base_sensor @ pose @ t_sensor_base
        dt = stamp - self._pose_stamp if self._pose_stamp is not None else 0.0
        twist = None
        if est.accepted and dt > 0:
            delta = invert(self._last_pose) @ t_odom_base
            twist = (delta[:3, 3] / dt, _rotvec(delta) / dt)
        if est.accepted:
            self._last_pose, self._pose_stamp = t_odom_base, stamp
        self._publish_pose(msg.header.stamp, base, t_odom_base, est, twist)
        self._publish_aligned(msg, cloud, est, t_odom_base @ t_base_sensor)
        level = DiagnosticStatus.OK if est.accepted and est.path != 'reanchor' else DiagnosticStatus.WARN
        latency = (time.perf_counter() - t_received) * 1e3
        text = est.path + (f': {est.reason}' if est.reason else '')
        self._publish_diagnostics(msg.header.stamp, level, text, {
            'latency_ms': f'{latency:.2f}', 'processing_ms': f'{est.latency_ms:.2f}',
            'path': est.path, 'accepted': str(est.accepted).lower(),
            'pwan_engaged': str(est.pwan_engaged).lower(), 'pwan_starts': str(est.pwan_starts),
            'matched_ratio': f'{est.matched_ratio:.4f}',
            'median_residual_m': f'{est.median_residual:.4f}',
            'iterations': str(est.iterations), 'num_points': str(est.num_points),
            'num_input_points': str(est.num_input), 'num_far_points': str(est.num_far),
            'keyframe': str(est.keyframe),
            'voxel_size_m': f'{self.pipeline.voxel_size:.4f}',
            'distance_threshold_m': f'{self.pipeline.h:.4f}',
            **{f'{k}_ms': f'{v:.2f}' for k, v in est.timings_ms.items()},
        })

    def _count(self, **increments: int) -> None:
        """Add to the scan counters (shared with the subscription callback)."""
        with self._lock:
            for k, v in increments.items():
                self.counts[k] += v

    def _restart(self, keep_pose: bool) -> None:
        self._count(resets=1)
        self._origin = (self._origin @ self.pipeline.motion.pose
                        if keep_pose and self.pipeline.motion.pose is not None else np.eye(4))
        self.pipeline.reset()
        self._last_stamp = None
        self._pose_stamp = None
        if not keep_pose:
            self._last_pose = np.eye(4)

    # ------------------------------------------------------------------ publishing
    def _publish_pose(self, stamp, base: str, t: np.ndarray, est: ScanEstimate, twist) -> None:
        cfg = self.config
        q = to_quaternion(t)
        odom = Odometry()
        odom.header.stamp = stamp
        odom.header.frame_id = cfg.odom_frame
        odom.child_frame_id = base
        p = odom.pose.pose
        p.position.x, p.position.y, p.position.z = (float(v) for v in t[:3, 3])
        p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w = (float(v) for v in q)
        odom.pose.covariance = _covariance(est, self.pipeline.h)
        if twist is not None:
            lin, ang = twist
            odom.twist.twist.linear.x, odom.twist.twist.linear.y, odom.twist.twist.linear.z = (
                float(v) for v in lin)
            odom.twist.twist.angular.x, odom.twist.twist.angular.y, odom.twist.twist.angular.z = (
                float(v) for v in ang)
        else:
            odom.twist.covariance = [0.0] * 36
            for i in range(6):
                odom.twist.covariance[7 * i] = -1.0   # unknown
        self.odom_pub.publish(odom)
        if self.tf_pub is not None:
            tf = TransformStamped()
            tf.header = odom.header
            tf.child_frame_id = base
            tf.transform.translation.x = p.position.x
            tf.transform.translation.y = p.position.y
            tf.transform.translation.z = p.position.z
            tf.transform.rotation = p.orientation
            self.tf_pub.publish(TFMessage(transforms=[tf]))

    def _publish_aligned(self, msg: PointCloud2, cloud: pc2.DecodedCloud, est: ScanEstimate,
                         t_odom_sensor: np.ndarray) -> None:
        if self.cloud_pub.get_subscription_count() == 0:
            return
        header = type(msg.header)()
        header.stamp = msg.header.stamp
        header.frame_id = self.config.odom_frame
        if est.aligned_points is not None:
            # Deformable modes: the deformed (downsampled) scan, in odom_frame already.
            xyz = self._origin[:3, :3] @ est.aligned_points.T
            out = pc2.create_cloud(header, (xyz.T + self._origin[:3, 3]).astype(np.float32))
        else:
            keep = np.isfinite(cloud.xyz).all(axis=1)
            xyz = cloud.xyz[keep].astype(np.float64) @ t_odom_sensor[:3, :3].T + t_odom_sensor[:3, 3]
            out = pc2.create_cloud(header, xyz.astype(np.float32), cloud.extras[keep])
        self.cloud_pub.publish(out)

    def _publish_diagnostics(self, stamp, level, message: str, values: Dict[str, str]) -> None:
        status = DiagnosticStatus()
        status.level = level
        status.name = 'pwan_register: scan registration'
        status.hardware_id = self.config.base_frame or (self._frame or '')
        status.message = message
        with self._lock:
            snapshot = dict(self.counts)
        counts = {k if k in ('resets', 'over_budget') else f'scans_{k}': str(v)
                  for k, v in snapshot.items()}
        status.values = [KeyValue(key=k, value=v) for k, v in {**values, **counts,
                                                                 'mode': self.config.mode}.items()]
        arr = DiagnosticArray()
        arr.header.stamp = stamp
        arr.status = [status]
        self.diag_pub.publish(arr)

    def destroy_node(self):
        with self._lock:
            self._stop = True
            self._wake.notify()
        self.pipeline.pwan.cancel()       # a running PWAN registration stops at its next step
        self._worker.join(timeout=30.0)
        return super().destroy_node()


def _rotvec(t: np.ndarray) -> np.ndarray:
    from scipy.spatial.transform import Rotation
    return Rotation.from_matrix(t[:3, :3]).as_rotvec()


def _covariance(est: ScanEstimate, h: float):
    """Row-major 6x6 pose covariance from the match quality (heuristic, documented in the
    README): position sigma = residual / sqrt(matched points), inflated 1e3 x for a held pose."""
    matched = max(est.matched_ratio * est.num_points, 1.0)
    res = est.median_residual if math.isfinite(est.median_residual) else h
    sigma_t = max(res, 1e-3) / math.sqrt(matched) * 10.0
    sigma_r = sigma_t / 5.0
    if not est.accepted:
        sigma_t, sigma_r = sigma_t * 1e3, sigma_r * 1e3
    cov = [0.0] * 36
    for i in range(3):
        cov[7 * i] = sigma_t ** 2
        cov[7 * (i + 3)] = sigma_r ** 2
    return cov


def main(args=None) -> int:
    problem = params_file_problem(sys.argv if args is None else args)
    if problem:
        print(f'pwan_register: {problem}', file=sys.stderr)
        return 2
    try:
        rclpy.init(args=args)
    except Exception as exc:  # rcl's argument errors (RCLError) are multi-line C messages
        print(f"pwan_register: invalid ROS arguments: {str(exc).splitlines()[0] if str(exc) else exc!r}",
              file=sys.stderr)
        return 2
    node = None
    try:
        node = RegisterNode()
        rclpy.spin(node)
    except (ConfigError, InvalidParameterTypeException, InvalidParameterValueException) as exc:
        print(f'pwan_register: invalid parameters: {exc}', file=sys.stderr)
        return 2
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
