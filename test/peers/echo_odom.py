"""A stand-in registration node for replay tests: answers each scan with ground-truth odometry.

Subscribes ``points`` (PointCloud2, decoded with the package codec) and ``/ground_truth``
(nav_msgs/Odometry); for every scan whose stamp has a ground-truth pose it publishes
``odometry`` (frame odom -> base_link, pose relative to the first answered scan, plus a
translation scaled by ``1 + --drift``: a known scale drift) and a
``/diagnostics`` status with latency_ms, scans_dropped, points and sim_lag_s (node clock
minus scan stamp; with use_sim_time this checks the replayed /clock).

  python echo_odom.py --drop-every K --drift D --ros-args -p use_sim_time:=true
"""

import argparse
import sys
import time

import numpy as np
import rclpy.utilities
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import PointCloud2

from pwan_ros.io.bags import pose_from_msg, stamp_to_ns
from pwan_ros.io.pointcloud2 import read_xyz
from pwan_ros.io.trajectory import tq_from_pose
from pwan_ros.ros.spin import spin_node

QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)


class Echo(Node):
    def __init__(self, drop_every, drift):
        super().__init__('pwan_odometry')
        self.drop_every, self.drift = drop_every, drift
        self.gt, self.scans, self.first = {}, {}, None
        self.seen = self.dropped = 0
        self.odom_pub = self.create_publisher(Odometry, 'odometry', QOS)
        self.diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', QOS)
        self.create_subscription(PointCloud2, 'points', self.on_points, QOS)
        self.create_subscription(Odometry, '/ground_truth', self.on_gt, QOS)

    def on_points(self, msg):
        t0 = time.perf_counter()
        self.seen += 1
        if self.drop_every and self.seen % self.drop_every == 0:
            self.dropped += 1
            return
        ns = stamp_to_ns(msg.header.stamp)
        self.scans[ns] = (msg.header.stamp, read_xyz(msg, skip_nans=True).shape[0], t0)
        self.answer(ns)

    def on_gt(self, msg):
        ns = stamp_to_ns(msg.header.stamp)
        self.gt[ns] = pose_from_msg(msg.pose.pose)
        self.answer(ns)

    def answer(self, ns):
        if ns not in self.gt or ns not in self.scans:
            return
        stamp, n_points, t0 = self.scans.pop(ns)
        pose = self.gt[ns]
        if self.first is None:
            self.first = pose
        rel = np.linalg.inv(self.first) @ pose
        rel[:3, 3] *= 1.0 + self.drift
        t, q = tq_from_pose(rel)
        out = Odometry()
        out.header.stamp, out.header.frame_id, out.child_frame_id = stamp, 'odom', 'base_link'
        p, o = out.pose.pose.position, out.pose.pose.orientation
        p.x, p.y, p.z = map(float, t[0])
        o.x, o.y, o.z, o.w = map(float, q[0])
        self.odom_pub.publish(out)
        lag = (self.get_clock().now().nanoseconds - ns) * 1e-9
        values = {
            'latency_ms': (time.perf_counter() - t0) * 1e3,
            'scans_dropped': self.dropped,
            'points': n_points,
            'sim_lag_s': lag,
        }
        diag = DiagnosticArray()
        diag.header.stamp = stamp
        diag.status = [
            DiagnosticStatus(
                level=DiagnosticStatus.OK,
                name='pwan_odometry: registration',
                message='ok',
                hardware_id='echo',
                values=[KeyValue(key=k, value=str(v)) for k, v in values.items()],
            )
        ]
        self.diag_pub.publish(diag)


def main():
    argv = rclpy.utilities.remove_ros_args(sys.argv)
    parser = argparse.ArgumentParser()
    parser.add_argument('--drop-every', type=int, default=0)
    parser.add_argument('--drift', type=float, default=0.0)
    args = parser.parse_args(argv[1:])
    # the product's spin loop: its own signal flag, no KeyboardInterrupt inside the executor
    # (with rclpy.spin and rclpy's handlers it once ignored SIGTERM for 20 s in CI)
    ros = sys.argv[sys.argv.index('--ros-args') :] if '--ros-args' in sys.argv else []
    node = lambda: Echo(args.drop_every, args.drift)  # noqa: E731
    sys.exit(spin_node('echo_odom', node, (), [sys.argv[0], *ros]))


if __name__ == '__main__':
    main()
