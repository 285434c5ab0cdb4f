"""A scan publisher that starts sending the moment it sees a subscription, as bag players and
eager drivers do, and counts which scans were answered (an Odometry carrying the scan's stamp).

  python startup_publisher.py --reliability reliable --scans 8 --out result.json

Each scan is a stationary simulated scan with a new stamp. After each scan the publisher waits
up to ``--answer-timeout`` seconds for its odometry, then sends the next one either way, so a
lost scan costs a timeout but never stops the run. ``--linger S``: the publisher then stays up
for S seconds without sending (a driver that stopped).
"""

import argparse
import json
import sys
import time

import numpy as np
import rclpy
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header

from pwan_ros.io import pointcloud2 as pc2


def scan_points(n_points: int, source: str) -> np.ndarray:
    """``n_points`` points (float32, metres): a simulated scan tiled with millimetre jitter, or
    uniform random points in a 40 m box (a payload for listeners that do not register)."""
    if source == 'random':
        return np.random.default_rng(0).uniform(-20, 20, (n_points, 3)).astype(np.float32)
    from pwan_ros.evaluation.lidar_sim import SimConfig, simulate

    xyz = next(iter(simulate(SimConfig(scans=1, beams=16, azimuth_steps=720, seed=3)))).xyz
    reps = max(1, int(np.ceil(n_points / len(xyz))))
    rng = np.random.default_rng(0)
    tiled = np.concatenate(
        [xyz + rng.normal(0, 1e-3, xyz.shape).astype(np.float32) for _ in range(reps)]
    )
    return tiled[:n_points]


class Publisher(Node):
    def __init__(self, reliability: str):
        super().__init__('startup_publisher')
        rel = (
            ReliabilityPolicy.RELIABLE
            if reliability == 'reliable'
            else ReliabilityPolicy.BEST_EFFORT
        )
        # rosbag2's player: reliable, keep last; a driver's sensor-data profile: best effort, depth
        # 5
        self.pub = self.create_publisher(
            PointCloud2,
            'points',
            QoSProfile(
                depth=5 if rel == ReliabilityPolicy.BEST_EFFORT else 100,
                history=HistoryPolicy.KEEP_LAST,
                reliability=rel,
            ),
        )
        self.answered = set()
        self.create_subscription(Odometry, 'odometry', self.on_odom, 50)

    def on_odom(self, msg):
        self.answered.add(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--reliability', choices=('reliable', 'best_effort'), required=True)
    ap.add_argument('--scans', type=int, default=8)
    ap.add_argument('--points', type=int, default=40000)
    ap.add_argument('--source', choices=('sim', 'random'), default='sim')
    ap.add_argument('--answer-timeout', type=float, default=8.0)
    ap.add_argument('--match-timeout', type=float, default=60.0)
    ap.add_argument('--out', required=True)
    ap.add_argument(
        '--linger', type=float, default=0.0, help='seconds to stay up, silent, after the scans'
    )
    args = ap.parse_args()
    xyz = scan_points(args.points, args.source)
    rclpy.init()
    node = Publisher(args.reliability)
    sent = []
    try:
        deadline = time.monotonic() + args.match_timeout
        while node.pub.get_subscription_count() == 0 and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.005)
        if node.pub.get_subscription_count() == 0:
            print('no subscription to points', file=sys.stderr)
            sys.exit(3)
        stamp = 1_700_000_000_000_000_000
        for _ in range(args.scans):
            stamp += 100_000_000
            h = Header(frame_id='lidar')
            h.stamp.sec, h.stamp.nanosec = divmod(stamp, 1_000_000_000)
            node.pub.publish(pc2.create_cloud(h, xyz))
            sent.append(stamp)
            end = time.monotonic() + args.answer_timeout
            while stamp not in node.answered and time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.01)
        end = time.monotonic() + args.linger  # a driver that stopped sending, still there
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
    finally:
        with open(args.out, 'w') as f:
            json.dump({'sent': sent, 'answered': sorted(node.answered & set(sent))}, f)
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == '__main__':
    main()
