"""Simulated LiDAR bags: valid rosbag2 for rosbags and rclpy, consistent ground truth."""

import numpy as np
import pytest
from nav_msgs.msg import Odometry
from rclpy.serialization import deserialize_message
from rosgraph_msgs.msg import Clock
from scipy.spatial import cKDTree
from sensor_msgs.msg import PointCloud2

from pwan_ros.io import bags as bag_io
from pwan_ros.cli import sim as sim_cli
from pwan_ros.evaluation.lidar_sim import SimConfig, _static_meshes, ground_truth_pose, simulate
from pwan_ros.io.pointcloud2 import read_cloud
from simbag import SMALL


def test_bag_is_readable_by_rosbags_and_decodable_by_rclpy(small_bag):
    topics = bag_io.bag_topics(small_bag)
    assert (
        topics['/points'].msgtype == 'sensor_msgs/msg/PointCloud2' and topics['/points'].count == 6
    )
    assert (
        topics['/ground_truth'].msgtype == 'nav_msgs/msg/Odometry'
        and topics['/ground_truth'].count == 6
    )
    assert topics['/clock'].count == 51  # 100 Hz over 0.5 s, both ends included
    assert (small_bag / 'metadata.yaml').exists() and list(small_bag.glob('*.mcap'))
    clouds, odoms, clocks = [], [], []
    for topic, _, t_ns, raw in bag_io.iter_raw(small_bag):
        if topic == '/points':
            clouds.append((t_ns, deserialize_message(raw, PointCloud2)))
        elif topic == '/ground_truth':
            odoms.append((t_ns, deserialize_message(raw, Odometry)))
        else:
            clocks.append(bag_io.stamp_to_ns(deserialize_message(raw, Clock).clock))
    assert clocks == sorted(clocks) and clocks[1] - clocks[0] == 10_000_000
    cfg = SimConfig(scans=6, **SMALL)
    for k, ((t_ns, cloud), (_, odom)) in enumerate(zip(clouds, odoms)):
        assert bag_io.stamp_to_ns(cloud.header.stamp) == t_ns == int(1.7e18) + k * 100_000_000
        assert cloud.header.frame_id == 'base_link' and cloud.height == 1
        assert [f.name for f in cloud.fields] == ['x', 'y', 'z', 'intensity', 'ring']
        decoded = read_cloud(cloud)
        assert 1000 < len(decoded) < 8 * 360
        assert decoded.extras['ring'].max() < 8 and np.isfinite(decoded.xyz).all()
        assert (odom.header.frame_id, odom.child_frame_id) == ('world', 'base_link')
        np.testing.assert_allclose(
            bag_io.pose_from_msg(odom.pose.pose), ground_truth_pose(k / 10.0, cfg)[0], atol=1e-9
        )
        assert odom.twist.twist.linear.x == pytest.approx(
            np.linalg.norm(ground_truth_pose(k / 10.0, cfg)[1]), rel=1e-3
        )


def test_ground_truth_puts_every_return_on_the_scene_surfaces():
    """Noise-free scans mapped with T_world_base lie on the scene's meshes; the inverse pose does
    not."""
    import open3d as o3d

    cfg = SimConfig(
        scans=3,
        beams=16,
        azimuth_steps=720,
        moving_objects=0,
        outliers=0.0,
        range_noise=0.0,
        dropout=0.0,
    )
    scene = o3d.t.geometry.RaycastingScene()
    for mesh, _ in _static_meshes(o3d, cfg, np.random.default_rng(cfg.seed)):
        scene.add_triangles(o3d.t.geometry.TriangleMesh.from_legacy(mesh))
    for scan in simulate(cfg):
        world = (scan.xyz @ scan.pose[:3, :3].T + scan.pose[:3, 3]).astype(np.float32)
        assert scene.compute_distance(o3d.core.Tensor(world)).numpy().max() < 2e-3
        inv = np.linalg.inv(scan.pose)
        wrong = (scan.xyz @ inv[:3, :3].T + inv[:3, 3]).astype(np.float32)
        assert np.median(scene.compute_distance(o3d.core.Tensor(wrong)).numpy()) > 0.05
    # consecutive scans see partly different geometry: fewer than all points of scan 2 are near
    # scan 0
    scans = list(simulate(SimConfig(scans=10, **SMALL)))
    world = [s.xyz @ s.pose[:3, :3].T + s.pose[:3, 3] for s in scans]
    d, _ = cKDTree(world[0]).query(world[9])
    assert 0.05 < np.mean(d > 1.0) < 0.9


def test_noise_outliers_and_determinism():
    cfg = SimConfig(scans=2, **SMALL)
    a, b = list(simulate(cfg)), list(simulate(cfg))
    np.testing.assert_array_equal(a[1].xyz, b[1].xyz)
    clean = list(
        simulate(SimConfig(scans=2, beams=8, azimuth_steps=360, dropout=0.0, outliers=0.0))
    )
    assert len(a[0].xyz) < len(clean[0].xyz)  # dropouts remove more than the 1 % outliers add
    other_seed = list(simulate(SimConfig(scans=2, seed=1, **SMALL)))
    assert len(other_seed[0].xyz) != len(a[0].xyz) or not np.array_equal(
        other_seed[0].xyz, a[0].xyz
    )


def test_cli_and_validation(tmp_path, capsys):
    out = tmp_path / 'bag'
    assert (
        sim_cli.main(
            ['--output', str(out), '--scans', '2', '--beams', '4', '--azimuth-steps', '90']
        )
        == 0
    )
    assert 'wrote' in capsys.readouterr().out and bag_io.bag_topics(out)['/points'].count == 2
    assert sim_cli.main(['--output', str(out), '--scans', '2']) == 2
    assert 'already exists' in capsys.readouterr().err
    assert sim_cli.main(['--output', str(tmp_path / 'b2'), '--dropout', '1.5']) == 2
    assert '--dropout 1.5: expected a number in [0, 1)' in capsys.readouterr().err
    with pytest.raises(ValueError, match=r'--scans 0: expected an integer in \[1, '):
        SimConfig(scans=0)


def test_stress_events_burst_blackout_turn_and_glitch(tmp_path):
    """stress=True: a burst of 50-100 % spurious returns for 3 scans, no scans during the 1 s
    blackout (ground truth kept) while the platform yaws 70 deg, one scan with 10 far points."""
    from pwan_ros.evaluation.lidar_sim import (
        BURST_SCANS,
        GLITCH_POINTS,
        STRESS_EVENTS,
        TURN_RAD,
        stress_event,
        write_sim_bag,
    )

    small = dict(beams=8, azimuth_steps=180, moving_objects=0, outliers=0.0, dropout=0.0)
    cfg = SimConfig(scans=40, stress=True, **small)
    plain = {s.stamp_ns: s for s in simulate(SimConfig(scans=40, **small))}
    scans = list(simulate(cfg))
    events = [stress_event(k, cfg) for k in range(40)]
    assert [k for k, (e, _) in enumerate(events) if e == 'burst'] == list(
        range(12, 12 + BURST_SCANS)
    )
    assert [k for k, (e, _) in enumerate(events) if e == 'glitch'] == [32]
    blackout = [k for k, (_, b) in enumerate(events) if b]
    assert blackout == list(range(18, 27))  # 1 s between the last scan before and the first after
    for k, scan in enumerate(scans):
        far = np.linalg.norm(scan.xyz, axis=1) > 500.0
        if scan.event == 'glitch':
            assert far.sum() == GLITCH_POINTS
        else:
            assert not far.any()
        if scan.event == 'burst':
            n_real = len(plain[scan.stamp_ns].xyz)
            assert 1.45 * n_real <= len(scan.xyz) <= 2.05 * n_real
    # the turn: heading 70 deg off the plain drive after it, unchanged before it
    yaw = lambda p: np.arctan2(p[1, 0], p[0, 0])  # noqa: E731
    for k, d in ((10, 0.0), (35, TURN_RAD)):
        diff = yaw(scans[k].pose) - yaw(plain[scans[k].stamp_ns].pose)
        assert abs((diff - d + np.pi) % (2 * np.pi) - np.pi) < 1e-6
    res = write_sim_bag(tmp_path / 'bag', cfg)
    topics = bag_io.bag_topics(tmp_path / 'bag')
    assert res.scans == topics['/points'].count == 40 - len(blackout)
    assert topics['/ground_truth'].count == 40
    assert STRESS_EVENTS['turn'] == 0.55
    with pytest.raises(ValueError, match='at least 4 s'):
        SimConfig(scans=20, stress=True)


def test_a_range_that_leaves_no_scan_is_refused(tmp_path, capsys):
    """--max-range below the nearest surface (every return dropped) is one line and exit 2, and
    no bag is left; a range that reaches the surfaces writes the bag."""
    out = tmp_path / 'bag'
    assert sim_cli.main(['--output', str(out), '--max-range', '0.5', '--scans', '3']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '--max-range 0.5: scan 0 has 0 returns on surfaces' in err[0]
    assert 'raise --max-range' in err[0] and not out.exists()
    args = ['--output', str(out), '--max-range', '30', '--scans', '3', '--beams', '8']
    assert sim_cli.main(args + ['--azimuth-steps', '360']) == 0
    assert out.exists()
