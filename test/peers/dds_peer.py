"""A stand-alone ROS 2 process for transport tests: publishes or receives a big
PointCloud2 and a TFMessage over real DDS.

  python dds_peer.py publish --points N --duration S
  python dds_peer.py receive --out result.json --timeout S
"""

import argparse
import hashlib
import json
import signal
import sys
import threading
import time

import numpy as np
import rclpy
from geometry_msgs.msg import TransformStamped
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy, DurabilityPolicy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import PointCloud2, PointField
from tf2_msgs.msg import TFMessage

QOS = QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
TF_QOS = QoSProfile(
    depth=100, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE
)


def make_points(n):
    """Deterministic (n, 4) float32 x, y, z, intensity."""
    rng = np.random.default_rng(1234)
    return rng.normal(size=(n, 4)).astype(np.float32)


def make_cloud(points, stamp):
    msg = PointCloud2()
    msg.header.frame_id = 'lidar'
    msg.header.stamp = stamp
    msg.height = 1
    msg.width = points.shape[0]
    msg.fields = [
        PointField(name=name, offset=4 * i, datatype=PointField.FLOAT32, count=1)
        for i, name in enumerate(('x', 'y', 'z', 'intensity'))
    ]
    msg.is_bigendian = False
    msg.point_step = 16
    msg.row_step = 16 * points.shape[0]
    msg.is_dense = True
    msg.data = points.tobytes()
    return msg


def make_tf(stamp):
    t = TransformStamped()
    t.header.frame_id = 'odom'
    t.header.stamp = stamp
    t.child_frame_id = 'base_link'
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (
        1.5,
        -2.0,
        0.25,
    )
    t.transform.rotation.z, t.transform.rotation.w = 0.3826834, 0.9238795
    return TFMessage(transforms=[t])


#: set by SIGINT / SIGTERM
STOP = threading.Event()


def publish(args):
    node = Node('dds_peer_publisher')
    cloud_pub = node.create_publisher(PointCloud2, 'cloud', QOS)
    tf_pub = node.create_publisher(TFMessage, '/tf', TF_QOS)
    points = make_points(args.points)
    end = time.monotonic() + args.duration
    while time.monotonic() < end and not STOP.is_set():
        stamp = node.get_clock().now().to_msg()
        cloud_pub.publish(make_cloud(points, stamp))
        tf_pub.publish(make_tf(stamp))
        rclpy.spin_once(node, timeout_sec=0.2)
    node.destroy_node()


def receive(args):
    node = Node('dds_peer_receiver')
    got = {}

    def on_cloud(msg):
        if 'cloud' in got:
            return
        data = np.frombuffer(msg.data, dtype=np.uint8)
        got['cloud'] = {
            'width': msg.width,
            'height': msg.height,
            'point_step': msg.point_step,
            'fields': [f.name for f in msg.fields],
            'frame_id': msg.header.frame_id,
            'sha256': hashlib.sha256(data.tobytes()).hexdigest(),
        }

    def on_tf(msg):
        if 'tf' in got:
            return
        t = msg.transforms[0]
        got['tf'] = {
            'parent': t.header.frame_id,
            'child': t.child_frame_id,
            'translation': [
                t.transform.translation.x,
                t.transform.translation.y,
                t.transform.translation.z,
            ],
            'rotation': [
                t.transform.rotation.x,
                t.transform.rotation.y,
                t.transform.rotation.z,
                t.transform.rotation.w,
            ],
        }
        infos = node.get_publishers_info_by_topic('/tf')
        got['tf_type_hashes'] = sorted({str(i.topic_type_hash) for i in infos})

    node.create_subscription(PointCloud2, 'cloud', on_cloud, QOS)
    node.create_subscription(TFMessage, '/tf', on_tf, TF_QOS)
    end = time.monotonic() + args.timeout
    while time.monotonic() < end and not ('cloud' in got and 'tf' in got):
        rclpy.spin_once(node, timeout_sec=0.1)
    with open(args.out, 'w') as f:
        json.dump(got, f)
    node.destroy_node()
    return 0 if ('cloud' in got and 'tf' in got) else 3


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('publish')
    p.add_argument('--points', type=int, default=60000)
    p.add_argument('--duration', type=float, default=30.0)
    r = sub.add_parser('receive')
    r.add_argument('--out', required=True)
    r.add_argument('--timeout', type=float, default=30.0)
    args = parser.parse_args()
    # SIGTERM / SIGINT end the loops at their next turn (as the product's nodes do): rclpy's own
    # handlers can leave the process waiting in its shutdown
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: STOP.set())
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    try:
        rc = publish(args) if args.cmd == 'publish' else receive(args)
    finally:
        rclpy.try_shutdown()
    sys.exit(rc or 0)


if __name__ == '__main__':
    main()
