"""A minimal node that hears ``points`` through
:class:`pwan_ros.ros.scan_subscription.ScanSubscription` (the odometry node's subscription) and
answers each scan at once with an Odometry carrying its stamp: the start-up race of the
subscription, without the cost of registering scans.

  python scan_listener.py --reliability auto
"""

import argparse
import sys

from nav_msgs.msg import Odometry
from rclpy.node import Node
from sensor_msgs.msg import PointCloud2

from pwan_ros.ros.scan_subscription import ScanSubscription
from pwan_ros.ros.spin import spin_node


class Listener(Node):
    def __init__(self, reliability):
        super().__init__('scan_listener')
        self.pub = self.create_publisher(Odometry, 'odometry', 50)
        self.points = ScanSubscription(self, PointCloud2, 'points', reliability, self.on_points)

    def on_points(self, msg):
        odom = Odometry()
        odom.header.stamp = msg.header.stamp
        odom.header.frame_id = 'odom'
        self.pub.publish(odom)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--reliability', default='auto')
    args = ap.parse_args()
    return spin_node('scan_listener', lambda: Listener(args.reliability), (), args=[])


if __name__ == '__main__':
    sys.exit(main())
