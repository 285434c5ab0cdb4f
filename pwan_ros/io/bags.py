"""Reading and writing rosbag2 directories (mcap or sqlite3) without ROS, via ``rosbags``.

Messages are rosbags dataclasses of the ROS 2 Jazzy typestore (``TYPESTORE``); their CDR
bytes are what rclpy's ``serialize_message`` produces, so bags written here play in
``ros2 bag play`` and decode with ``rclpy.serialization.deserialize_message``.

Ground truth can come from topics of type nav_msgs/Odometry, geometry_msgs/PoseStamped,
PoseWithCovarianceStamped, TransformStamped or tf2_msgs/TFMessage (``frame`` selects the
child frame there). Stamps are header stamps in seconds; poses are ``T_parent_child``.

Every failure (missing path, not a bag, corrupt file, missing topic, wrong type, empty
topic) raises :class:`BagError` naming the bag and the problem.
"""

from __future__ import annotations

import contextlib
import pathlib
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from pwan_ros.io.trajectory import Trajectory, pose_from_tq, tq_from_pose

__all__ = [
    'BagError',
    'TopicInfo',
    'typestore',
    'BagWriter',
    'bag_topics',
    'require_topic',
    'iter_raw',
    'iter_decoded',
    'read_trajectory',
    'stamp_to_ns',
    'ns_to_stamp',
    'header',
    'odometry',
    'clock',
    'topic_rules',
    'pose_from_msg',
    'TRAJECTORY_TYPES',
    'CLOUD_TYPE',
]

CLOUD_TYPE = 'sensor_msgs/msg/PointCloud2'
TRAJECTORY_TYPES = (
    'nav_msgs/msg/Odometry',
    'geometry_msgs/msg/PoseStamped',
    'geometry_msgs/msg/PoseWithCovarianceStamped',
    'geometry_msgs/msg/TransformStamped',
    'tf2_msgs/msg/TFMessage',
)
_TYPESTORE = None


class BagError(RuntimeError):
    """A bag that cannot be read or written as asked (message names bag and problem)."""


def typestore():
    """The rosbags ROS 2 Jazzy typestore (created once)."""
    global _TYPESTORE
    if _TYPESTORE is None:
        from rosbags.typesys import Stores, get_typestore

        _TYPESTORE = get_typestore(Stores.ROS2_JAZZY)
    return _TYPESTORE


def stamp_to_ns(stamp: Any) -> int:
    """builtin_interfaces/Time (rclpy or rosbags) -> integer nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def ns_to_stamp(ns: int):
    """Integer nanoseconds -> rosbags builtin_interfaces/Time."""
    ns = int(ns)
    return typestore().types['builtin_interfaces/msg/Time'](
        sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000
    )


def header(stamp_ns: int, frame_id: str):
    """rosbags std_msgs/Header."""
    return typestore().types['std_msgs/msg/Header'](stamp=ns_to_stamp(stamp_ns), frame_id=frame_id)


def odometry(
    stamp_ns: int,
    pose: np.ndarray,
    frame_id: str,
    child_frame_id: str,
    linear_velocity=(0.0, 0.0, 0.0),
    angular_velocity=(0.0, 0.0, 0.0),
):
    """rosbags nav_msgs/Odometry with ``pose`` = T_frame_child (4x4); twist in the child frame."""
    types = typestore().types
    t, q = tq_from_pose(pose)
    vec = types['geometry_msgs/msg/Vector3']
    pose_msg = types['geometry_msgs/msg/Pose'](
        position=types['geometry_msgs/msg/Point'](x=t[0, 0], y=t[0, 1], z=t[0, 2]),
        orientation=types['geometry_msgs/msg/Quaternion'](
            x=q[0, 0], y=q[0, 1], z=q[0, 2], w=q[0, 3]
        ),
    )
    twist = types['geometry_msgs/msg/Twist'](
        linear=vec(*map(float, linear_velocity)), angular=vec(*map(float, angular_velocity))
    )
    return types['nav_msgs/msg/Odometry'](
        header=header(stamp_ns, frame_id),
        child_frame_id=child_frame_id,
        pose=types['geometry_msgs/msg/PoseWithCovariance'](pose=pose_msg, covariance=np.zeros(36)),
        twist=types['geometry_msgs/msg/TwistWithCovariance'](twist=twist, covariance=np.zeros(36)),
    )


def clock(stamp_ns: int):
    """rosbags rosgraph_msgs/Clock."""
    return typestore().types['rosgraph_msgs/msg/Clock'](clock=ns_to_stamp(stamp_ns))


def topic_rules(points_topic: str, points_name: str, gt_topic: str):
    """Cross-field rules (:func:`pwan_ros.params.check`) of a bag writer's cloud and ground-truth
    topics: one message type per topic, so they differ and neither is ``/clock``."""
    flag = '--' + points_name.replace('_', '-')
    yield points_topic != '/clock', points_name, 'a topic other than /clock (the bag clock)'
    yield gt_topic != '/clock', 'gt_topic', 'a topic other than /clock (the bag clock)'
    yield (
        gt_topic != points_topic,
        'gt_topic',
        f'a topic other than {flag} {points_topic} (one message type per topic)',
    )


class BagWriter:
    """Write a rosbag2 directory (mcap by default) message by message, atomically.

    ``with BagWriter(path) as w: w.write(topic, stamp_ns, msg)`` -- topics are added on
    first use from the message's type. ``path`` must not exist yet (rosbag2 convention). The bag
    is written under a temporary sibling directory and renamed to ``path`` only when the ``with``
    block completes: a failed or interrupted conversion (an exception, Ctrl-C, a full disk)
    leaves no bag at all, never a complete-looking truncated one.
    """

    def __init__(self, path, storage: str = 'mcap'):
        from rosbags.rosbag2 import StoragePlugin
        from pwan_ros.io.atomic import OutputError, check_output

        plugins = {'mcap': StoragePlugin.MCAP, 'sqlite3': StoragePlugin.SQLITE3}
        if storage not in plugins:
            raise BagError(f'unknown storage {storage!r}; use one of {sorted(plugins)}')
        try:  # the path as given ('' is no path, not '.')
            check_output(path, directory=True, must_not_exist=True)
        except OutputError as exc:
            why = '; rosbag2 writers need a new directory' if 'already exists' in str(exc) else ''
            raise BagError(f'{exc}{why}') from None
        self.path = pathlib.Path(path)
        self._plugin = plugins[storage]
        self._writer = None
        self._atomic = None
        self._connections = {}
        self.counts: dict[str, int] = {}

    def __enter__(self) -> 'BagWriter':
        from rosbags.rosbag2 import Writer
        from pwan_ros.io.atomic import atomic_dir

        self._atomic = atomic_dir(self.path)
        tmp = self._atomic.__enter__()
        try:
            self._writer = Writer(pathlib.Path(tmp), version=8, storage_plugin=self._plugin)
            self._writer.open()
        except BaseException:
            self._atomic.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            with self._named_errors():
                self._writer.close()
        except BaseException:
            self._atomic.__exit__(*sys.exc_info())
            if exc[0] is None:
                raise
            return
        self._atomic.__exit__(*exc)

    @contextlib.contextmanager
    def _named_errors(self):
        """An OSError from the storage layer without a file name (a failed write(): full disk)
        is re-raised naming the bag."""
        try:
            yield
        except OSError as exc:
            if exc.filename is None:
                raise OSError(exc.errno, exc.strerror or str(exc), str(self.path)) from None
            raise

    def write(self, topic: str, stamp_ns: int, msg: Any) -> None:
        with self._named_errors():
            conn = self._connections.get(topic)
            if conn is None:
                conn = self._writer.add_connection(topic, msg.__msgtype__, typestore=typestore())
                self._connections[topic] = conn
            self._writer.write(
                conn, int(stamp_ns), typestore().serialize_cdr(msg, msg.__msgtype__)
            )
        self.counts[topic] = self.counts.get(topic, 0) + 1


@dataclass(frozen=True)
class TopicInfo:
    """A topic of a bag: message type and number of messages."""

    topic: str
    msgtype: str
    count: int


def _open(path):
    from rosbags.highlevel import AnyReader

    path = pathlib.Path(path)
    if not path.exists():
        raise BagError(f'bag {path} does not exist')
    if path.is_dir() and not (path / 'metadata.yaml').exists():
        raise BagError(f'{path} is not a rosbag2 directory (no metadata.yaml)')
    try:  # AnyReader() itself refuses a file of no known storage format
        reader = AnyReader([path], default_typestore=typestore())
        reader.open()
    except Exception as exc:  # rosbags raises several types for unreadable/corrupt bags
        raise BagError(f'cannot open bag {path}: {type(exc).__name__}: {exc}') from exc
    return reader


def bag_topics(path) -> dict[str, TopicInfo]:
    """Topics of a bag: ``{topic: TopicInfo}``."""
    reader = _open(path)
    try:
        out = {}
        for conn in reader.connections:
            prev = out.get(conn.topic)
            count = (prev.count if prev else 0) + int(conn.msgcount)
            out[conn.topic] = TopicInfo(conn.topic, conn.msgtype, count)
        return out
    finally:
        reader.close()


def require_topic(path, topic: str, msgtypes: Sequence[str] | None = None) -> TopicInfo:
    """TopicInfo of ``topic``; BagError if absent, of another type, or without messages."""
    topics = bag_topics(path)
    if topic not in topics:
        listing = ', '.join(f'{t.topic} [{t.msgtype}]' for t in topics.values()) or 'none'
        raise BagError(f"bag {path} has no topic '{topic}'; topics: {listing}")
    info = topics[topic]
    if msgtypes is not None and info.msgtype not in msgtypes:
        raise BagError(
            f"topic '{topic}' in {path} has type {info.msgtype}; expected one of {list(msgtypes)}"
        )
    if info.count == 0:
        raise BagError(f"topic '{topic}' in {path} has no messages (empty)")
    return info


def iter_raw(path, topics: Sequence[str] | None = None) -> Iterator[tuple[str, str, int, bytes]]:
    """(topic, msgtype, bag log time ns, CDR bytes) in log-time order (all topics if None)."""
    reader = _open(path)
    try:
        conns = [c for c in reader.connections if topics is None or c.topic in topics]
        try:
            for conn, t_ns, raw in reader.messages(connections=conns):
                yield conn.topic, conn.msgtype, int(t_ns), bytes(raw)
        except BagError:
            raise
        except Exception as exc:
            raise BagError(f'error reading {path}: {type(exc).__name__}: {exc}') from exc
    finally:
        reader.close()


def iter_decoded(
    path, topic: str, msgtypes: Sequence[str] | None = None
) -> Iterator[tuple[int, Any]]:
    """(bag log time ns, rosbags message) of one topic; checks the topic first (require_topic)."""
    info = require_topic(path, topic, msgtypes)
    store = typestore()
    for _, msgtype, t_ns, raw in iter_raw(path, [topic]):
        try:
            yield t_ns, store.deserialize_cdr(raw, msgtype)
        except KeyError as exc:
            raise BagError(
                f"bag {path}: message type {info.msgtype} of '{topic}' is unknown to the "
                'ROS 2 Jazzy typestore'
            ) from exc
        except Exception as exc:
            raise BagError(
                f"bag {path}: cannot decode a '{topic}' message: {type(exc).__name__}: {exc}"
            ) from exc


def pose_from_msg(pose_msg: Any) -> np.ndarray:
    """4x4 from geometry_msgs/Pose or Transform (position/translation + orientation/rotation)."""
    p = getattr(pose_msg, 'position', None) or getattr(pose_msg, 'translation')
    q = getattr(pose_msg, 'orientation', None) or getattr(pose_msg, 'rotation')
    return pose_from_tq([p.x, p.y, p.z], [q.x, q.y, q.z, q.w])


def _pose_of(msg: Any, msgtype: str, frame: str | None, parent: str | None):
    """(stamp_ns, 4x4) entries of one trajectory message (several for TFMessage)."""
    if msgtype == 'nav_msgs/msg/Odometry':
        return [(stamp_to_ns(msg.header.stamp), pose_from_msg(msg.pose.pose))]
    if msgtype == 'geometry_msgs/msg/PoseWithCovarianceStamped':
        return [(stamp_to_ns(msg.header.stamp), pose_from_msg(msg.pose.pose))]
    if msgtype == 'geometry_msgs/msg/PoseStamped':
        return [(stamp_to_ns(msg.header.stamp), pose_from_msg(msg.pose))]
    transforms = [msg] if msgtype == 'geometry_msgs/msg/TransformStamped' else msg.transforms
    return [
        (stamp_to_ns(t.header.stamp), pose_from_msg(t.transform))
        for t in transforms
        if (frame is None or t.child_frame_id == frame)
        and (parent is None or t.header.frame_id == parent)
    ]


def read_trajectory(
    path, topic: str, frame: str | None = None, parent: str | None = None
) -> Trajectory:
    """Poses of one topic as a Trajectory (header stamps, seconds).

    frame:  child frame to keep (required for tf2_msgs/TFMessage topics such as /tf; for other
            types, messages whose child_frame_id differs are rejected with BagError).
    parent: optional parent frame filter for TF topics.
    """
    info = require_topic(path, topic, TRAJECTORY_TYPES)
    if info.msgtype == 'tf2_msgs/msg/TFMessage' and frame is None:
        raise BagError(
            f"'{topic}' is a TF topic: pass the child frame (--frame) whose pose is wanted"
        )
    stamps, poses = [], []
    for _, msg in iter_decoded(path, topic, TRAJECTORY_TYPES):
        if (
            frame is not None
            and info.msgtype == 'nav_msgs/msg/Odometry'
            and msg.child_frame_id != frame
        ):
            raise BagError(
                f"'{topic}' holds poses of child frame '{msg.child_frame_id}', not '{frame}'"
            )
        for ns, pose in _pose_of(msg, info.msgtype, frame, parent):
            stamps.append(ns * 1e-9)
            poses.append(pose)
    if not stamps:
        raise BagError(
            f"no poses for frame '{frame}' (parent {parent or 'any'}) on '{topic}' in {path}"
        )
    return Trajectory.from_unsorted(stamps, poses)
