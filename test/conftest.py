"""Shared fixtures: an isolated ROS 2 environment for tests that start real ROS processes."""
import os
import pathlib
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


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory the test process cannot create files in: a 0555 directory, or for root (who
    writes through permissions) /proc/sys, which no process can write into."""
    d = tmp_path / 'readonly'
    d.mkdir()
    d.chmod(0o555)
    yield d if not os.access(d, os.W_OK) else pathlib.Path('/proc/sys')
    d.chmod(0o755)


def assert_one_line_failure(proc, code=2, contains=()):
    """A CLI failure by the package's contract: exit ``code``, one non-empty stderr line, no
    traceback, naming each of ``contains``."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert 'Traceback' not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    for text in contains:
        assert str(text) in lines[0], (text, lines[0])
