"""Per-point times of the common LiDAR drivers and motion compensation (deskew)."""

import numpy as np
import pytest

from pwan_ros.evaluation.lidar_sim import SimConfig, _static_meshes, simulate
from pwan_ros.geometry.se3 import invert
from pwan_ros.io.point_times import PointTimesError, point_times
from pwan_ros.io.pointcloud2 import create_cloud, read_cloud
from pwan_ros.odometry.deskew import deskew, motion_over, velocity_of

STAMP = 1_700_000_000.25
N = 1000
SWEEP = np.linspace(0.0, 0.0999, N)  # seconds from the stamp


def cloud_with(field, dtype, values):
    """A real PointCloud2 (rclpy) with xyz, intensity and the time field, decoded again."""
    from std_msgs.msg import Header

    extras = np.zeros(N, dtype=[('intensity', np.float32), (field, dtype)])
    extras[field] = values
    header = Header()
    header.stamp.sec, header.stamp.nanosec = 1_700_000_000, 250_000_000
    xyz = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
    return read_cloud(create_cloud(header, xyz, extras))


@pytest.mark.parametrize(
    'field, dtype, values, convention',
    [
        ('t', np.uint32, np.round(SWEEP * 1e9), 'relative ns'),  # Ouster
        ('time', np.float32, SWEEP - 0.05, 'relative s'),  # Velodyne (around the stamp)
        ('timestamp', np.float64, STAMP + SWEEP, 'absolute s'),  # Hesai
        ('offset_time', np.uint32, np.round(SWEEP * 1e9), 'relative ns'),  # Livox
        ('time_stamp', np.float64, (STAMP + SWEEP) * 1e9, 'absolute ns'),
        ('t', np.float64, SWEEP * 1e9, 'relative ns'),  # ns stored as float
    ],
)
def test_point_times_of_driver_conventions(field, dtype, values, convention):
    cloud = cloud_with(field, dtype, values)
    times = point_times(cloud.extras, STAMP)
    assert times.field == field and times.convention == convention
    expected = SWEEP - 0.05 if field == 'time' else SWEEP
    # float32 s: 6e-9 s ulp at 0.1 s; float64 at the epoch: 2.4e-7 s (s) / 256 ns (ns) ulp
    atol = 1e-6 if convention.startswith('absolute') or dtype == np.float32 else 1e-9
    np.testing.assert_allclose(times.offsets, expected, atol=atol)


def test_point_times_absent_and_unusable():
    assert point_times(cloud_with('intensity2', np.float32, 0.0).extras, STAMP) is None
    with pytest.raises(PointTimesError, match="'time'"):
        point_times(
            cloud_with('time', np.float64, np.linspace(0, 5e10, N)).extras, STAMP
        )  # 50 s sweep
    with pytest.raises(PointTimesError, match='no finite'):
        point_times(cloud_with('t', np.float32, np.nan).extras, STAMP)
    # simulator time starting at 0: relative times near a small stamp stay relative
    small = point_times(cloud_with('t', np.float32, SWEEP).extras, 3.2)
    assert small.convention == 'relative s'


def test_deskew_puts_a_moving_sweep_back_on_the_scene():
    """A sweep at 10 m/s (simulated per sector from the true poses): with the true velocity,
    deskewed points mapped by the pose at the stamp lie on the scene's surfaces (sub-cm);
    uncompensated they are smeared by centimetres to decimetres."""
    import open3d as o3d

    cfg = SimConfig(
        scans=3,
        speed=10.0,
        sweep=True,
        moving_objects=0,
        outliers=0.0,
        range_noise=0.0,
        dropout=0.0,
        beams=16,
    )
    scene = o3d.t.geometry.RaycastingScene()
    for mesh, _ in _static_meshes(o3d, cfg, np.random.default_rng(cfg.seed)):
        scene.add_triangles(o3d.t.geometry.TriangleMesh.from_legacy(mesh))
    scans = list(simulate(cfg))
    sc = scans[2]
    assert sc.extras.dtype.names == ('intensity', 'ring', 't')
    offsets = point_times(sc.extras, sc.stamp_ns * 1e-9).offsets
    assert 0.0 <= offsets.min() and 0.09 < offsets.max() < 0.1
    velocity = velocity_of(invert(scans[1].pose) @ sc.pose, 1.0 / cfg.rate_hz)
    assert velocity.linear[0] == pytest.approx(10.0, rel=0.05)

    def distances(points):
        world = points @ sc.pose[:3, :3].T + sc.pose[:3, 3]
        return scene.compute_distance(o3d.core.Tensor(world.astype(np.float32))).numpy()

    raw, fixed = distances(sc.xyz.astype(float)), distances(deskew(sc.xyz, offsets, velocity))
    assert np.percentile(fixed, 90) < 0.03 and np.median(fixed) < 0.005, np.percentile(
        fixed, [50, 90]
    )
    assert np.percentile(raw, 90) > 5 * np.percentile(fixed, 90)
    # the point model is the motion model's: a point fired dt later is moved by motion_over(dt)
    p = np.array([[3.0, -1.0, 0.5]])
    dt = 0.04
    np.testing.assert_allclose(
        deskew(p, np.array([dt]), velocity)[0],
        (motion_over(velocity, dt) @ [3.0, -1.0, 0.5, 1])[:3],
    )
    nan = deskew(np.array([[np.nan, 0.0, 0.0]]), np.array([0.01]), velocity)
    assert np.isnan(nan).any()


def test_pipeline_reports_poses_at_the_stamp_and_off_ignores_times():
    """With point times the pipeline registers mid-sweep and returns poses at the header stamp:
    over a 10 m/s drive the relative motion between scans equals the ground truth's at the stamps;
    deskew='off' ignores the times."""
    from pwan_ros.odometry.config import OdometryConfig
    from pwan_ros.odometry.pipeline import OdometryPipeline

    scans = list(simulate(SimConfig(scans=8, speed=10.0, sweep=True, beams=16, moving_objects=0)))
    for mode in ('auto', 'off'):
        pipe = OdometryPipeline(OdometryConfig(deskew=mode))
        ests = [
            pipe.process(
                s.xyz, s.stamp_ns * 1e-9, point_times(s.extras, s.stamp_ns * 1e-9).offsets
            )
            for s in scans
        ]
        assert [e.deskewed for e in ests] == (
            [False, False] + [True] * 6 if mode == 'auto' else [False] * 8
        )
        assert [e.stamp for e in ests] == [s.stamp_ns * 1e-9 for s in scans]
        for a, b, sa, sb in zip(ests[2:], ests[3:], scans[2:], scans[3:]):
            err = invert(invert(sa.pose) @ sb.pose) @ (invert(a.pose) @ b.pose)
            assert np.linalg.norm(err[:3, 3]) < 0.05, (mode, err)
    with pytest.raises(Exception, match='point times for'):
        OdometryPipeline(OdometryConfig()).process(scans[0].xyz, 1.0, np.zeros(3))
