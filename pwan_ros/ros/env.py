"""Environment for ROS 2 processes started by pwan_ros tools (demo, tests): own DDS domain,
localhost-only discovery, Fast DDS LARGE_DATA transports (large PointCloud2 messages travel
reliably between processes), logs in a given directory instead of ``~/.ros``."""

from __future__ import annotations

import os
import pathlib
import random
import sys

__all__ = ['isolated_ros_env']


def isolated_ros_env(log_dir, domain_id: int | None = None, base: dict | None = None) -> dict:
    """A copy of ``base`` (default ``os.environ``) prepared for a child ROS 2 process.

    domain_id: ROS_DOMAIN_ID; default a random one in 101..199 (tests use 1..100).
    """
    env = dict(os.environ if base is None else base)
    env.pop('_ROS_WHEELS_BOOTSTRAP_COMPLETE', None)  # each child runs the wheels' bootstrap itself
    env['ROS_DOMAIN_ID'] = str(domain_id if domain_id is not None else random.randint(101, 199))
    env['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    env.pop(
        'ROS_LOCALHOST_ONLY', None
    )  # deprecated in Jazzy; the range variable above replaces it
    env.setdefault('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp')
    env['FASTDDS_BUILTIN_TRANSPORTS'] = 'LARGE_DATA'
    log_dir = pathlib.Path(log_dir)
    env['ROS_HOME'] = str(log_dir / 'ros_home')
    env['ROS_LOG_DIR'] = str(log_dir / 'ros_log')
    env['PYTHONUNBUFFERED'] = '1'
    env.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    return env
