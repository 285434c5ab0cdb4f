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
    stops = {signal.SIGINT, signal.SIGTERM}
    for sig in stops:
        signal.signal(sig, _quiet_exit)
    # a signal during the imports is held until they are done: raised inside an extension
    # module's initialisation (numpy's C core), SystemExit came out as an ImportError traceback
    # with status 1
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        node = importlib.import_module(module)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    return node.main()


def odometry_node() -> int:
    """``pwan_odometry_node``: :func:`pwan_ros.ros.odometry_node.main`."""
    return _run('pwan_ros.ros.odometry_node')


def classifier_node() -> int:
    """``pwan_classifier_node``: :func:`pwan_ros.ros.classifier_node.main`."""
    return _run('pwan_ros.ros.classifier_node')
