"""Shared fixtures: an isolated ROS 2 environment for tests that start real ROS processes."""
import os
import random
import sys

import pytest

# Wheel-based ROS installs live in the venv prefix; ament_index look-ups need it named.
# (A sourced system ROS sets AMENT_PREFIX_PATH itself.)
os.environ.setdefault('AMENT_PREFIX_PATH', sys.prefix)


def ros_subprocess_env(tmp_path, domain_id=None):
    """Environment for a ROS 2 child process: own DDS domain, loopback discovery, logs in tmp.

    Fast DDS's LARGE_DATA builtin transports are used so that big PointCloud2 messages
    travel reliably between processes (see ../shared/docs/ros2-from-pip.md).
    """
    env = dict(os.environ)
    # Let each child run the ROS wheels' bootstrap itself (never inherit another process's).
    env.pop('_ROS_WHEELS_BOOTSTRAP_COMPLETE', None)
    env['ROS_DOMAIN_ID'] = str(domain_id if domain_id is not None else random.randint(1, 100))
    env['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    env['ROS_LOCALHOST_ONLY'] = '0'
    env['RMW_IMPLEMENTATION'] = env.get('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp')
    env['FASTDDS_BUILTIN_TRANSPORTS'] = 'LARGE_DATA'
    env['ROS_HOME'] = str(tmp_path / 'ros_home')
    env['ROS_LOG_DIR'] = str(tmp_path / 'ros_log')
    env['PYTHONUNBUFFERED'] = '1'
    env.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    return env


@pytest.fixture
def ros_env(tmp_path):
    return ros_subprocess_env(tmp_path)
