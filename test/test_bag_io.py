"""bag_io: trajectories from every supported message type, both storages, clear errors."""

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer

from pwan_ros.io import bags as bag_io
from pwan_ros.io.bags import BagError, BagWriter, read_trajectory
from pwan_ros.evaluation.replay import ReplayError, message_class
from pwan_ros.io.trajectory import pose_from_tq

T = bag_io.typestore().types


def poses(n=4):
    return pose_from_tq(
        [[k, 0.5 * k, 0.1] for k in range(n)],
        [[0, 0, np.sin(0.1 * k), np.cos(0.1 * k)] for k in range(n)],
    )


def transform(stamp_ns, pose, parent, child):
    t = pose[:3, 3]
    from pwan_ros.io.trajectory import tq_from_pose

    _, q = tq_from_pose(pose)
    return T['geometry_msgs/msg/TransformStamped'](
        header=bag_io.header(stamp_ns, parent),
        child_frame_id=child,
        transform=T['geometry_msgs/msg/Transform'](
            translation=T['geometry_msgs/msg/Vector3'](x=t[0], y=t[1], z=t[2]),
            rotation=T['geometry_msgs/msg/Quaternion'](x=q[0, 0], y=q[0, 1], z=q[0, 2], w=q[0, 3]),
        ),
    )


@pytest.mark.parametrize('storage', ['mcap', 'sqlite3'])
def test_trajectories_from_all_pose_types(tmp_path, storage):
    ps = poses()
    stamps = [10_000_000_000 + k * 50_000_000 for k in range(4)]
    with BagWriter(tmp_path / 'bag', storage=storage) as w:
        for ns, p in zip(stamps, ps):
            w.write('/odom', ns, bag_io.odometry(ns, p, 'odom', 'base_link'))
            pose_msg = bag_io.odometry(ns, p, 'map', 'x').pose.pose
            w.write(
                '/pose',
                ns,
                T['geometry_msgs/msg/PoseStamped'](header=bag_io.header(ns, 'map'), pose=pose_msg),
            )
            w.write(
                '/pose_cov',
                ns,
                T['geometry_msgs/msg/PoseWithCovarianceStamped'](
                    header=bag_io.header(ns, 'map'),
                    pose=T['geometry_msgs/msg/PoseWithCovariance'](
                        pose=pose_msg, covariance=np.zeros(36)
                    ),
                ),
            )
            w.write(
                '/tf',
                ns,
                T['tf2_msgs/msg/TFMessage'](
                    transforms=[
                        transform(ns, np.eye(4), 'base_link', 'lidar'),
                        transform(ns, p, 'map', 'base_link'),
                    ]
                ),
            )
    assert (tmp_path / 'bag' / 'metadata.yaml').exists()
    expected_stamps = np.array(stamps) * 1e-9
    for topic, kwargs in [
        ('/odom', {}),
        ('/pose', {}),
        ('/pose_cov', {}),
        ('/tf', {'frame': 'base_link'}),
        ('/tf', {'frame': 'base_link', 'parent': 'map'}),
    ]:
        traj = read_trajectory(tmp_path / 'bag', topic, **kwargs)
        np.testing.assert_allclose(traj.poses, ps, atol=1e-12)
        np.testing.assert_allclose(traj.stamps, expected_stamps)
    lidar = read_trajectory(tmp_path / 'bag', '/tf', frame='lidar')
    np.testing.assert_allclose(lidar.poses, np.tile(np.eye(4), (4, 1, 1)), atol=1e-12)
    with pytest.raises(BagError, match="TF topic: pass the child frame"):
        read_trajectory(tmp_path / 'bag', '/tf')
    with pytest.raises(BagError, match="no poses for frame 'camera'"):
        read_trajectory(tmp_path / 'bag', '/tf', frame='camera')
    with pytest.raises(BagError, match="child frame 'base_link', not 'imu'"):
        read_trajectory(tmp_path / 'bag', '/odom', frame='imu')


def test_missing_wrong_and_empty_topics(tmp_path, small_bag):
    with pytest.raises(
        BagError, match="has no topic '/velodyne_points'; topics: .*/points \\[sensor_msgs"
    ):
        bag_io.require_topic(small_bag, '/velodyne_points')
    with pytest.raises(
        BagError, match="'/points' .* has type sensor_msgs/msg/PointCloud2; expected"
    ):
        read_trajectory(small_bag, '/points')
    empty = tmp_path / 'empty'
    writer = Writer(empty, version=8, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    writer.add_connection('/points', 'sensor_msgs/msg/PointCloud2', typestore=bag_io.typestore())
    writer.close()
    with pytest.raises(BagError, match="'/points' in .* has no messages"):
        bag_io.require_topic(empty, '/points')
    no_topics = tmp_path / 'no_topics'
    writer = Writer(no_topics, version=8, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    writer.close()
    with pytest.raises(BagError, match="has no topic '/points'; topics: none"):
        bag_io.require_topic(no_topics, '/points')


def test_unreadable_bags(tmp_path, small_bag):
    with pytest.raises(BagError, match='does not exist'):
        bag_io.bag_topics(tmp_path / 'nope')
    (tmp_path / 'plain').mkdir()
    with pytest.raises(BagError, match='not a rosbag2 directory'):
        bag_io.bag_topics(tmp_path / 'plain')
    corrupt = tmp_path / 'corrupt'
    corrupt.mkdir()
    (corrupt / 'metadata.yaml').write_text((small_bag / 'metadata.yaml').read_text())
    mcap = next(small_bag.glob('*.mcap'))
    (corrupt / mcap.name).write_bytes(b'this is not an mcap file' * 10)
    with pytest.raises(BagError, match='cannot open bag|error reading'):
        list(bag_io.iter_raw(corrupt))
    (corrupt / 'metadata.yaml').write_text(': not yaml [')
    with pytest.raises(BagError, match='cannot open bag'):
        bag_io.bag_topics(corrupt)
    with pytest.raises(BagError, match='already exists'):
        BagWriter(small_bag)


def test_unknown_message_types_for_replay():
    assert message_class('sensor_msgs/msg/PointCloud2').__name__ == 'PointCloud2'
    with pytest.raises(ReplayError, match='my_robot_msgs/msg/Custom is not available to rclpy'):
        message_class('my_robot_msgs/msg/Custom')
