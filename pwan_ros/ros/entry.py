"""Console entry points of the long-running nodes (``setup.py``): a SIGINT or SIGTERM that
arrives while the node is still loading (importing torch and ROS takes seconds) ends it quietly
with status 0, as it does once the node runs (:func:`pwan_ros.ros.spin.spin_node` then takes the
signals over). Without this a Ctrl-C at start-up printed a KeyboardInterrupt traceback (status
130) and a SIGTERM killed it with 143. Light on purpose: nothing here imports rclpy or torch."""

from __future__ import annotations

import importlib
import signal


def _quiet_exit(signum, frame):
    raise SystemExit(0)


def _run(module: str) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _quiet_exit)
    return importlib.import_module(module).main()


def odometry_node() -> int:
    """``pwan_odometry_node``: :func:`pwan_ros.ros.odometry_node.main`."""
    return _run('pwan_ros.ros.odometry_node')


def classifier_node() -> int:
    """``pwan_classifier_node``: :func:`pwan_ros.ros.classifier_node.main`."""
    return _run('pwan_ros.ros.classifier_node')
