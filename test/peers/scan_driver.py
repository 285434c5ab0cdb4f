"""Drives a running ``pwan_odometry_node`` over DDS in lock-step and records what it answers.

For each scan of a scenario it publishes a PointCloud2 on ``points``, then waits until the
node has answered that scan (its DiagnosticArray carrying the scan's stamp: the node publishes
it for every scan, after the scan's pose, TF and aligned cloud) before publishing the next, so
results do not depend on the speed of the machine. Everything the node published is written to a
JSON file (the driver keeps listening while it publishes, and 0.5 s after the last scan).

  python scan_driver.py --scenario sim --scans 12 --out result.json
  python scan_driver.py --scenario bad --out result.json

The scenarios' scans are simulated here, or read from ``--messages FILE``, written beforehand
by :func:`save_messages` (test_odometry_node's ``drive`` makes them in the test's process, where
the simulator is already imported: the simulator's imports take seconds of every driver's start).
"""

import argparse
import json
import pathlib
import base64
import sys
import time

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import Header
from geometry_msgs.msg import TransformStamped
from rclpy.qos import DurabilityPolicy
from tf2_msgs.msg import TFMessage

from pwan_ros.io import pointcloud2 as pc2

SIM = dict(beams=16, azimuth_steps=720, moving_objects=2, seed=3)


def header(stamp_ns, frame='base_link'):
    h = Header()
    h.stamp.sec, h.stamp.nanosec = divmod(int(stamp_ns), 1_000_000_000)
    h.frame_id = frame
    return h


def sim_messages(n):
    """(label, message, ground-truth pose) for n simulated scans."""
    from pwan_ros.evaluation.lidar_sim import SimConfig, simulate

    for s in simulate(SimConfig(scans=n, **SIM)):
        yield 'scan', pc2.create_cloud(header(s.stamp_ns), s.xyz, s.extras), s.pose


def stress_messages(n):
    """The demo's drive (32 beams) with its stress events but the burst of spurious returns: the
    scans after the blackout's fast turn need full PWAN."""
    from pwan_ros.evaluation.lidar_sim import SimConfig, simulate

    for s in simulate(SimConfig(scans=n, stress=True)):
        if not s.blackout and s.event != 'burst':
            yield 'scan', pc2.create_cloud(header(s.stamp_ns), s.xyz, s.extras), s.pose


def sweep_messages(n):
    """n scans of a fast drive (10 m/s) whose points carry their time ('t', uint32 ns, Ouster)."""
    from pwan_ros.evaluation.lidar_sim import SimConfig, simulate

    for s in simulate(SimConfig(scans=n, sweep=True, speed=10.0, **SIM)):
        yield 'scan', pc2.create_cloud(header(s.stamp_ns), s.xyz, s.extras), s.pose


def glitch_messages(n):
    """Simulated scans; scan 4 carries 10 extra points at 1e19-3e38 m (a driver glitch) and scan 6
    keeps only an eighth of its returns (a half-delivered scan)."""
    from pwan_ros.evaluation.lidar_sim import SimConfig, simulate

    rng = np.random.default_rng(0)
    for k, s in enumerate(simulate(SimConfig(scans=n, **SIM))):
        xyz, extras = s.xyz, s.extras
        label = 'scan'
        if k == 4:
            far = (
                rng.choice([-1.0, 1.0], (10, 3))
                * rng.uniform(1.0, 3.0, (10, 3))
                * np.array([1e19, 1e30, 1e38])
            ).astype(np.float32)
            xyz = np.vstack([xyz, far])
            extras = None if extras is None else np.concatenate([extras, extras[:10]])
            label = 'far_glitch'
        elif k == 6:
            xyz = xyz[: len(xyz) // 8]
            extras = None if extras is None else extras[: len(xyz)]
            label = 'collapsed'
        yield label, pc2.create_cloud(header(s.stamp_ns), xyz, extras), s.pose


def bad_messages():
    """Valid scans interleaved with every kind of bad input the node must survive."""
    from pwan_ros.evaluation.lidar_sim import SimConfig, simulate

    scans = list(simulate(SimConfig(scans=6, **SIM)))

    def cloud(k, frame='base_link', stamp=None):
        s = scans[k]
        return pc2.create_cloud(
            header(s.stamp_ns if stamp is None else stamp, frame), s.xyz, s.extras
        )

    # a driver spinning up: every return at the sensor (no-return points), before the first scan
    blank = pc2.create_cloud(
        header(scans[0].stamp_ns - 100_000_000), np.zeros((2000, 3), np.float32)
    )
    yield 'blank', blank, None
    yield 'scan', cloud(0), scans[0].pose
    empty = pc2.create_cloud(header(scans[0].stamp_ns + 10_000_000), np.zeros((0, 3), np.float32))
    yield 'empty', empty, None
    no_z = PointCloud2(
        header=header(scans[0].stamp_ns + 20_000_000),
        height=1,
        width=2,
        fields=[
            PointField(name='x', offset=0, datatype=PointField.FLOAT32, count=1),
            PointField(name='y', offset=4, datatype=PointField.FLOAT32, count=1),
        ],
        is_bigendian=False,
        point_step=8,
        row_step=16,
        is_dense=True,
        data=np.zeros(4, np.float32).tobytes(),
    )
    yield 'no_z', no_z, None
    nan = pc2.create_cloud(
        header(scans[0].stamp_ns + 30_000_000), np.full((500, 3), np.nan, np.float32)
    )
    yield 'all_nan', nan, None
    bad_type = PointCloud2(
        header=header(scans[0].stamp_ns + 40_000_000),
        height=1,
        width=1,
        fields=[
            PointField(name=n, offset=4 * i, datatype=42, count=1) for i, n in enumerate('xyz')
        ],
        is_bigendian=False,
        point_step=12,
        row_step=12,
        is_dense=True,
        data=bytes(12),
    )
    yield 'bad_datatype', bad_type, None
    truncated = cloud(1, stamp=scans[0].stamp_ns + 50_000_000)
    truncated.data = bytes(truncated.data)[:100]
    yield 'truncated', truncated, None
    no_frame = cloud(1, frame='')
    no_frame.header.stamp.nanosec += 1000
    yield 'no_frame', no_frame, None
    in_odom = cloud(1, frame='odom')  # a cloud already in the odom frame: no pose to estimate
    in_odom.header.stamp.nanosec += 2000
    yield 'odom_frame', in_odom, None
    with_nans = scans[1].xyz.copy()
    with_nans[::3] = np.nan
    yield (
        'scan_with_nans',
        pc2.create_cloud(header(scans[1].stamp_ns), with_nans, scans[1].extras),
        scans[1].pose,
    )
    # A huge cloud: the scan repeated with millimetre jitter (must be downsampled, not choke).
    rng = np.random.default_rng(0)
    big = np.concatenate(
        [
            scans[2].xyz + rng.normal(0, 1e-3, scans[2].xyz.shape).astype(np.float32)
            for _ in range(20)
        ]
    )
    yield 'huge', pc2.create_cloud(header(scans[2].stamp_ns), big), scans[2].pose
    yield 'scan', cloud(3), scans[3].pose
    yield 'late', cloud(2, stamp=scans[3].stamp_ns - 1_000_000), None  # 1 ms before the last
    # one corrupt stamp 5 s back, one stamp 0: skipped, odometry goes on (no reset)
    yield 'time_backwards', cloud(1, stamp=scans[1].stamp_ns - 5_000_000_000), None
    yield 'stamp_zero', cloud(3, stamp=0), None
    # the data little-endian, the flag big-endian: named as such
    swapped = cloud(3, stamp=scans[3].stamp_ns + 50_000_000)
    swapped.is_bigendian = True
    yield 'wrong_byte_order', swapped, None
    yield 'scan_after_glitch', cloud(4), scans[4].pose
    # another frame: skipped as another source until 3 scans in a row, then followed
    for i in (1, 2):
        other = cloud(5, frame='other_lidar', stamp=scans[4].stamp_ns + i * 20_000_000)
        yield f'other_source_{i}', other, None
    yield 'frame_change', cloud(5, frame='other_lidar'), scans[5].pose


def corridor_gap_messages(n):
    """n corridor scans 0.3 m apart (peers/corridor.py) stamped 10 Hz, the stamps jumping 1 s
    forward from scan n - 3 on while the scans keep their step."""
    from corridor import corridor_scan

    for k in range(n):
        xyz, pose = corridor_scan(k)
        stamp = 1_700_000_000_000_000_000 + k * 100_000_000 + (k >= n - 3) * 1_000_000_000
        yield ('gap' if k >= n - 3 else 'scan'), pc2.create_cloud(header(stamp), xyz), pose


def interleaved_messages(n, label, frame='base_link'):
    """n simulated scans in 'base_link', each followed 10 ms later by the same scan in ``frame``
    labelled ``label``: 'second' (a second driver in frame 'second_lidar') or 'writer2' (the
    driver started twice: the same frame, published by the Driver's second writer)."""
    for first_label, msg, pose in sim_messages(n):
        yield first_label, msg, pose
        other = pc2.read_cloud(msg)
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec + 10_000_000
        yield label, pc2.create_cloud(header(stamp, frame), other.xyz), None


def deform_object():
    """(reference, scan) of scenario 'deform': a 4 m object 10 m ahead (knobbed blob, metres) and
    another sample of it, bent."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from _core_shapes import knobbed_blob

    ref = knobbed_blob(1500, 0) * 2.0 + np.array([10.0, 0.0, 0.0])
    src = knobbed_blob(1500, 1) * 2.0 + np.array([10.0, 0.0, 0.0])
    return ref, src + np.outer(0.15 * np.sin(src[:, 0] - 10.0), [0.0, 0.0, 1.0])


def deform_messages():
    """Scenario 'deform' (the node with reference_cloud = deform_object()'s reference, transform
    nonrigid): the bent scan ('bent'), then the object 70 m away, where nothing fits ('far')."""
    _, bent = deform_object()
    for k, (label, pts) in enumerate((('bent', bent), ('far', bent + [60.0, 40.0, 0.0]))):
        cloud = pc2.create_cloud(header(1_000_000_000 * (k + 1)), pts.astype(np.float32))
        yield label, cloud, None


SCENARIOS = (
    'sim',
    'bad',
    'glitch',
    'sweep',
    'stress',
    'two_sources',
    'two_writers',
    'corridor_gap',
    'deform',
)


def messages(scenario, scans):
    """(label, message, ground-truth pose or None) of each scan of ``scenario``, in order."""
    return {
        'sim': lambda: sim_messages(scans),
        'bad': bad_messages,
        'glitch': lambda: glitch_messages(scans),
        'sweep': lambda: sweep_messages(scans),
        'stress': lambda: stress_messages(scans),
        'two_sources': lambda: interleaved_messages(scans, 'second', 'second_lidar'),
        'corridor_gap': lambda: corridor_gap_messages(scans),
        'two_writers': lambda: interleaved_messages(scans, 'writer2'),
        'deform': deform_messages,
    }[scenario]()


def save_messages(path, msgs):
    """Write (label, message, pose) triples for ``--messages``: JSON, each message CDR-serialised
    in base64."""
    rows = [
        (
            label,
            base64.b64encode(serialize_message(msg)).decode('ascii'),
            None if pose is None else np.asarray(pose).tolist(),
        )
        for label, msg, pose in msgs
    ]
    pathlib.Path(path).write_text(json.dumps(rows))


def load_messages(path):
    """The (label, PointCloud2, pose) triples :func:`save_messages` wrote (JSON: nothing in it
    executes)."""
    rows = json.loads(pathlib.Path(path).read_text())
    return [
        (label, deserialize_message(base64.b64decode(raw), PointCloud2), pose)
        for label, raw, pose in rows
    ]


class Driver(Node):
    def __init__(self, sensor_qos=False, second_writer=False):
        super().__init__('scan_driver')
        qos = QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE)
        # a lidar driver publishes with the sensor-data profile (best effort); a bag player
        # reliably
        self.pub = self.create_publisher(
            PointCloud2, 'points', qos_profile_sensor_data if sensor_qos else qos
        )
        # a second writer on the same topic (scenario two_writers: messages labelled 'writer2')
        self.pub2 = self.create_publisher(PointCloud2, 'points', qos) if second_writer else None
        self.answers = {}  # stamp_ns -> {'odom': ..., 'diag': ...}, of the scans published
        self.published = set()  # their stamps (the node's own statuses, e.g. silence, are not)
        self.tf = []
        self.aligned = []
        self.create_subscription(Odometry, 'odometry', self.on_odom, 50)
        self.create_subscription(
            Odometry, '/pwan_odometry/corrected_odometry', self.on_corrected, 50
        )
        self.create_subscription(DiagnosticArray, '/diagnostics', self.on_diag, 50)
        self.create_subscription(TFMessage, '/tf', self.on_tf, 100)
        self.create_subscription(PointCloud2, 'aligned_points', self.on_aligned, qos)

    @staticmethod
    def key(stamp):
        return stamp.sec * 1_000_000_000 + stamp.nanosec

    def on_odom(self, msg):
        if self.key(msg.header.stamp) not in self.published:
            return
        p, q = msg.pose.pose.position, msg.pose.pose.orientation
        self.answers.setdefault(self.key(msg.header.stamp), {})['odom'] = {
            'frame': msg.header.frame_id,
            'child': msg.child_frame_id,
            'position': [p.x, p.y, p.z],
            'orientation': [q.x, q.y, q.z, q.w],
            'covariance_xx': msg.pose.covariance[0],
        }

    def on_corrected(self, msg):
        """The final estimate of a scan first answered with a prediction (a recovery ran)."""
        if self.key(msg.header.stamp) not in self.published:
            return
        p, q = msg.pose.pose.position, msg.pose.pose.orientation
        self.answers.setdefault(self.key(msg.header.stamp), {})['corrected'] = {
            'position': [p.x, p.y, p.z],
            'orientation': [q.x, q.y, q.z, q.w],
        }

    def on_diag(self, msg):
        if self.key(msg.header.stamp) not in self.published:
            return
        st = msg.status[0]
        answer = self.answers.setdefault(self.key(msg.header.stamp), {})
        answer['diag'] = {
            'level': int.from_bytes(st.level, 'little')
            if isinstance(st.level, bytes)
            else int(st.level),
            'message': st.message,
            'values': {kv.key: kv.value for kv in st.values},
        }
        answer.setdefault('diags', []).append(answer['diag'])

    def unsettled(self):
        """Scans answered with a prediction whose final diagnostics (and corrected pose, when
        they say there is one) have not come yet."""
        return [
            k
            for k, a in self.answers.items()
            if any(d['values'].get('path') == 'predicted' for d in a.get('diags', []))
            and not any(d['values'].get('final') == 'true' for d in a['diags'])
            or any(d['values'].get('corrected') == 'true' for d in a.get('diags', []))
            and 'corrected' not in a
        ]

    def on_tf(self, msg):
        for t in msg.transforms:
            self.tf.append([t.header.frame_id, t.child_frame_id, self.key(t.header.stamp)])

    def on_aligned(self, msg):
        cloud = pc2.read_cloud(msg)
        self.aligned.append(
            {
                'stamp': self.key(msg.header.stamp),
                'frame': msg.header.frame_id,
                'points': len(cloud),
                'fields': [f.name for f in msg.fields],
                'xyz_mean': cloud.xyz.mean(axis=0).tolist() if len(cloud) else None,
            }
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--scenario', choices=SCENARIOS, required=True)
    ap.add_argument(
        '--messages',
        help="the scenario's scans from this file (save_messages) instead of simulating them",
    )
    ap.add_argument(
        '--sensor-qos',
        action='store_true',
        help='publish with the sensor-data QoS profile (best effort), as lidar drivers do',
    )
    ap.add_argument('--scans', type=int, default=12)
    ap.add_argument(
        '--burst',
        action='store_true',
        help='publish every scan 10 ms apart without waiting, then wait for the last answer',
    )
    ap.add_argument('--out', required=True)
    ap.add_argument('--timeout', type=float, default=60.0, help='seconds to wait per scan')
    ap.add_argument(
        '--settle',
        type=float,
        default=0.05,
        help="seconds to listen after a scan's diagnostics before the next scan",
    )
    ap.add_argument(
        '--static-tf',
        nargs=5,
        metavar=('PARENT', 'CHILD', 'X', 'Y', 'Z'),
        help='publish a static transform (translation only) on /tf_static first',
    )
    args = ap.parse_args()
    rclpy.init()
    node = Driver(args.sensor_qos, second_writer=args.scenario == 'two_writers')
    sent = []
    if args.static_tf:
        parent, child, x, y, z = args.static_tf
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        static_pub = node.create_publisher(TFMessage, '/tf_static', latched)
        t = TransformStamped()
        t.header.frame_id, t.child_frame_id = parent, child
        t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (
            float(x),
            float(y),
            float(z),
        )
        t.transform.rotation.w = 1.0
        static_pub.publish(TFMessage(transforms=[t]))
    try:
        deadline = time.monotonic() + 30.0
        while (
            node.pub.get_subscription_count() == 0 or node.count_publishers('odometry') == 0
        ) and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.1)
        if node.pub.get_subscription_count() == 0:
            print('pwan_odometry_node did not subscribe to points', file=sys.stderr)
            sys.exit(3)
        time.sleep(0.5)
        msgs = (
            load_messages(args.messages) if args.messages else messages(args.scenario, args.scans)
        )
        if args.burst:  # every scan 10 ms apart, then wait for the last one's answer
            msgs = list(msgs)
            for label, msg, pose in msgs:
                key = Driver.key(msg.header.stamp)
                node.published.add(key)
                node.pub.publish(msg)
                gt = None if pose is None else np.asarray(pose).tolist()
                sent.append({'label': label, 'stamp': key, 'gt': gt})
                time.sleep(0.01)
                rclpy.spin_once(node, timeout_sec=0.0)
            msgs = []
            end = time.monotonic() + args.timeout
            while sent[-1]['stamp'] not in node.answers and time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.05)
            t_end = time.monotonic() + 0.5  # its other outputs
            while time.monotonic() < t_end:
                rclpy.spin_once(node, timeout_sec=0.05)
        for label, msg, pose in msgs:
            key = Driver.key(msg.header.stamp)
            node.published.add(key)
            (node.pub2 if label == 'writer2' else node.pub).publish(msg)
            end = time.monotonic() + args.timeout
            while 'diag' not in node.answers.get(key, {}) and time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.05)
            t_end = time.monotonic() + args.settle  # the scan's other outputs, sent before
            while time.monotonic() < t_end:
                rclpy.spin_once(node, timeout_sec=0.05)
            sent.append(
                {
                    'label': label,
                    'stamp': key,
                    'gt': None if pose is None else np.asarray(pose).tolist(),
                }
            )
        end = time.monotonic() + args.timeout  # the final estimates of predicted scans
        while node.unsettled() and time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
        t_end = time.monotonic() + 0.5
        while time.monotonic() < t_end:
            rclpy.spin_once(node, timeout_sec=0.05)
    finally:
        with open(args.out, 'w') as f:
            json.dump(
                {
                    'sent': sent,
                    'answers': {str(k): v for k, v in node.answers.items()},
                    'tf': node.tf,
                    'aligned': node.aligned,
                },
                f,
            )
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == '__main__':
    main()
