"""A kidnapped robot: the next scan is metres beyond the prediction and turned 135 deg. The
recovery finds it (with ``recovery_global``, the default, the global registration is tried when no
yaw start matches well), and the global registration alone, from no initial pose and with the
sensors' free space (``viewpoints='origin'``: scan and keyframe map in their sensors' frames),
finds it too. Whether the yaw starts alone find it depends on the machine's floating point (on
one machine they slide metres along the street and are accepted, on another the 90 deg start
lands on the truth), so that is not asserted."""

import itertools

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.geometry.se3 import invert, make_transform, rotation_angle
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.pipeline import OdometryPipeline
from pwan_ros.odometry.pwan_recovery import PwanAligner


@pytest.mark.heavy
def test_global_recovery_finds_a_kidnapped_robot():
    # the first 15 scans of a 40-scan drive (the generator makes them in order: the rest unused)
    scans = list(
        itertools.islice(
            simulate(SimConfig(scans=40, beams=16, azimuth_steps=720, moving_objects=2, seed=2)),
            15,
        )
    )
    turn = make_transform(Rotation.from_euler('z', 135, degrees=True).as_matrix(), np.zeros(3))
    kid = scans[14]  # 2.7 m beyond scan 5 and turned 135 deg
    t_odom_kid = invert(scans[0].pose) @ kid.pose @ turn
    # the default local map (3 keyframes; one keyframe's map is tracked against in
    # test_odometry_pipeline's local-map test); no time budget: the test is about what recovery
    # can do, not how fast this machine is
    pipe = OdometryPipeline(OdometryConfig(pwan_time_budget_ms=600000.0))
    assert pipe.config.local_map_keyframes == 3
    for s in scans[:6]:
        pipe.process(s.xyz, s.stamp_ns * 1e-9)
    keyframe = pipe.keyframes.current
    est = pipe.process(kid.xyz.astype(float) @ turn[:3, :3], kid.stamp_ns * 1e-9)
    err = invert(t_odom_kid) @ est.pose
    assert est.pwan_engaged and est.accepted, est.reason
    assert np.degrees(rotation_angle(err)) < 0.5 and np.linalg.norm(err[:3, 3]) < 0.05, est.reason
    # the global registration alone, as the recovery calls it: the scan onto the keyframe's map
    scan = kid.xyz.astype(float) @ turn[:3, :3]
    scan = scan[np.isfinite(scan).all(1)]
    res = PwanAligner(OdometryConfig()).align_global(scan, keyframe.local_map.points)
    err = invert(invert(keyframe.pose) @ t_odom_kid) @ res.transform
    assert res.status == 'ok', res.reason
    assert np.degrees(rotation_angle(err)) < 1.0 and np.linalg.norm(err[:3, 3]) < 0.15, err
    assert all(c['free_space'] is not None for c in res.candidates)
