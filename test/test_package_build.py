"""The package builds with colcon like any ROS 2 ament_python package and is found in the
ament index; the tf2_msgs interface in this environment is upstream's."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TF_HASH = 'RIHS01_e369d0f05a23ae52508854b66f6aa0437f3449d652e8cbf22d5abe85d020f087'


@pytest.mark.build
def test_colcon_build_installs_executables(colcon_install):
    lib = colcon_install / 'pwan_ros' / 'lib' / 'pwan_ros'
    for exe in ('pwan_odometry_node', 'pwan_adapt_node', 'pwan_register', 'pwan_demo'):
        assert (lib / exe).is_file(), exe
    for old in ('register_node', 'pwan-register', 'adapt_node'):  # names of no release
        assert not (lib / old).exists(), old
    share = colcon_install / 'pwan_ros' / 'share' / 'pwan_ros'
    assert (share / 'package.xml').is_file()
    for f in (
        'launch/odometry.launch.py',
        'launch/register.launch.py',
        'config/odometry.yaml',
        'rviz/pwan_odometry.rviz',
    ):
        assert (share / f).is_file(), f


@pytest.mark.build
def test_ament_index_finds_package(colcon_install):
    code = (
        'from ament_index_python.packages import get_package_share_directory, '
        'get_packages_with_prefixes; '
        'print(get_package_share_directory("pwan_ros")); '
        'print("pwan_ros" in get_packages_with_prefixes())'
    )
    env = dict(os.environ, AMENT_PREFIX_PATH=str(colcon_install / 'pwan_ros'))
    env.pop('_ROS_WHEELS_BOOTSTRAP_COMPLETE', None)
    out = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(colcon_install / 'pwan_ros' / 'share' / 'pwan_ros'), 'True']


def test_tf2_msgs_type_hash_is_upstream():
    """The TFMessage type description installed here hashes like upstream's, and like the
    one rosbags (an independent implementation) computes for its Jazzy type store."""
    from ament_index_python.packages import get_package_share_directory
    from rosbags.typesys import Stores, get_typestore
    import json

    share = get_package_share_directory('tf2_msgs')
    desc = json.loads((pathlib.Path(share) / 'msg' / 'TFMessage.json').read_text())
    hashes = {h['type_name']: h['hash_string'] for h in desc['type_hashes']}
    assert hashes['tf2_msgs/msg/TFMessage'] == TF_HASH
    store = get_typestore(Stores.ROS2_JAZZY)
    assert store.hash_rihs01('tf2_msgs/msg/TFMessage') == TF_HASH
