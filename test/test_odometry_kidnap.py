"""A kidnapped robot: the next scan is metres beyond the prediction and turned 135 deg. The yaw
starts of the PWAN recovery slide along the street to a wrong pose that matches well enough to
be accepted; with ``recovery_global`` (default) the global registration (no initial pose) finds
the right one."""
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.geometry.se3 import invert, make_transform, rotation_angle
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.pipeline import OdometryPipeline


@pytest.mark.heavy
def test_global_recovery_finds_a_kidnapped_robot():
    scans = list(simulate(SimConfig(scans=40, beams=16, azimuth_steps=720, moving_objects=2, seed=2)))
    turn = make_transform(Rotation.from_euler('z', 135, degrees=True).as_matrix(), np.zeros(3))
    errors = {}
    # tracking against the newest keyframe only: there the yaw starts fail on this jump (against
    # the default local map of 3 keyframes they find it, checked last)
    for use_global in (True, False, 'default'):
        # no time budget: the test is about what recovery can do, not how fast this machine is
        cfg = OdometryConfig(pwan_time_budget_ms=600000.0)
        if use_global != 'default':
            cfg = OdometryConfig(recovery_global=use_global, pwan_time_budget_ms=600000.0, local_map_keyframes=1)
        pipe = OdometryPipeline(cfg)
        for s in scans[:6]:
            pipe.process(s.xyz, s.stamp_ns * 1e-9)
        kid = scans[14]                        # 2.7 m beyond scan 5 and turned 135 deg
        est = pipe.process(kid.xyz.astype(float) @ turn[:3, :3], kid.stamp_ns * 1e-9)
        err = invert(invert(scans[0].pose) @ kid.pose @ turn) @ est.pose
        errors[use_global] = (np.degrees(rotation_angle(err)), np.linalg.norm(err[:3, 3]))
        assert est.pwan_engaged and est.accepted
        if use_global is True:
            assert 'global registration' in est.reason, est.reason
    assert errors[True][0] < 0.5 and errors[True][1] < 0.05, errors
    assert errors[False][1] > 1.0, errors      # what the yaw starts alone return: accepted, metres off
    assert errors['default'][0] < 0.5 and errors['default'][1] < 0.05, errors
