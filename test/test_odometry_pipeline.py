"""The registration pipeline behind pwan_odometry_node, in-process (no ROS)."""

import pathlib

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pwan_ros.odometry.keyframe_tracker import PreparedCloud, track
from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.odometry.motion_model import ConstantVelocityModel
from pwan_ros.core import RegistrationConfig
from pwan_ros.odometry.config import ConfigError, OdometryConfig
from pwan_ros.odometry.scan_filter import (
    automatic_voxel_size,
    filter_scan,
    isolated_voxels,
    voxel_grid,
)
from pwan_ros.odometry.pipeline import ScanError, OdometryPipeline
from pwan_ros.geometry.se3 import invert, make_transform, rotation_angle

SIM = dict(beams=16, azimuth_steps=720, moving_objects=2)


def pose_error(est, gt):
    d = invert(gt) @ est
    return np.degrees(rotation_angle(d)), np.linalg.norm(d[:3, 3])


def yaw(deg):
    return make_transform(Rotation.from_euler('z', deg, degrees=True).as_matrix(), np.zeros(3))


@pytest.fixture(scope='module')
def sim_scans():
    return list(simulate(SimConfig(scans=12, seed=2, **SIM)))


def test_voxel_grid_counts_and_centroids():
    pts = np.array([[0.1, 0.1, 0.1], [0.3, 0.3, 0.3], [1.2, 0.1, 0.1]])
    grid = voxel_grid(pts, 1.0)
    order = np.argsort(grid.centroids[:, 0])
    np.testing.assert_allclose(grid.centroids[order], [[0.2, 0.2, 0.2], [1.2, 0.1, 0.1]])
    np.testing.assert_array_equal(grid.counts[order], [2, 1])
    np.testing.assert_array_equal(grid.inverse, [grid.inverse[0]] * 2 + [grid.inverse[2]])


def test_isolated_returns_removed_only_when_noise_dominates():
    rng = np.random.default_rng(0)
    plane = np.column_stack(
        [rng.uniform(0, 10, 20000), rng.uniform(0, 10, 20000), np.zeros(20000)]
    )
    noise = rng.uniform(-20, 20, (10000, 3))
    clean = filter_scan(plane, 0.25, 10**6)
    assert clean.num_isolated_removed == 0
    dirty = filter_scan(np.vstack([plane, noise]), 0.25, 10**6)
    # the noise voxels outnumber the plane's before the rule; after it, the plane dominates
    assert dirty.num_isolated_removed > 9000
    assert np.mean(np.abs(dirty.points[:, 2]) < 1e-6) > 0.7  # from 14 % before
    # a cloud sparse everywhere (every return alone, no neighbours) is left as it is
    sparse = rng.uniform(-20, 20, (3000, 3))
    assert filter_scan(sparse, 0.25, 10**6).num_isolated_removed == 0
    # a sparse ring (returns 1.5 voxels apart, each alone in its voxel) has neighbours: kept
    a = np.linspace(0, 2 * np.pi, 400, endpoint=False)
    ring = np.column_stack([15 * np.cos(a), 15 * np.sin(a), np.zeros_like(a)])
    grid = voxel_grid(np.vstack([ring, plane]), 0.16)
    assert not isolated_voxels(grid)[grid.inverse[:400]].any()


def _reference_filter(points, voxel_size, max_points, rng):
    """The plain numpy filter the fast one replaced (np.unique voxel grid, all 26 neighbours of
    every single-return voxel searched, axis-0 medians): what filter_scan must return."""
    from itertools import product

    pts = points[np.isfinite(points).all(axis=1)]
    spread = np.linalg.norm(pts - np.median(pts, axis=0), axis=1)  # far rule: geometry.outliers
    far = spread > 50.0 * np.median(spread[spread > 0])
    pts = pts[~far]
    cells = np.floor(pts / voxel_size)
    cells -= cells.min(axis=0) - 1
    keys = cells.astype(np.int64)
    span = keys.max(axis=0) + 2
    flat = (keys[:, 0] * span[1] + keys[:, 1]) * span[2] + keys[:, 2]
    uniq, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    cent = (
        np.stack([np.bincount(inverse, pts[:, i], len(counts)) for i in range(3)], axis=1)
        / counts[:, None]
    )
    single = np.flatnonzero(counts == 1)
    removed = 0
    if len(single) > 0.2 * len(counts):
        nb = np.array([o for o in product((-1, 0, 1), repeat=3) if o != (0, 0, 0)])
        nk = (
            uniq[single][:, None] + ((nb[:, 0] * span[1] + nb[:, 1]) * span[2] + nb[:, 2])[None, :]
        )
        pos = np.minimum(np.searchsorted(uniq, nk), len(uniq) - 1)
        isolated = single[~(uniq[pos] == nk).any(axis=1)]
        if len(isolated) > 0.2 * len(counts) and len(pts) - len(isolated) >= 0.3 * len(pts):
            cent = np.delete(cent, isolated, axis=0)
            removed = len(isolated)
    if len(cent) > max_points:
        cent = cent[np.sort(rng.choice(len(cent), max_points, replace=False))]
    return cent, removed, int(far.sum())


@pytest.mark.parametrize('noise', [0.0, 0.5])
def test_fast_filter_equals_reference_numpy_filter(sim_scans, noise):
    """The fast path of filter_scan (one argsort, narrowed isolated-voxel search with early exit)
    returns the reference filter's points bit for bit, outliers, NaN and a far glitch included;
    on a real 32-beam scan too when ../shared/data is there."""
    rng = np.random.default_rng(4)
    scans = [s.xyz.astype(np.float64) for s in sim_scans[:3]]
    real = (
        pathlib.Path(__file__).resolve().parents[2]
        / 'shared/data/lidar/nuscenes_keyframes/scans/000010.npy'
    )
    if real.is_file():
        scans.append(np.load(real)[:, :3].astype(np.float64))
    for pts in scans:
        extra = rng.uniform(-60, 60, (int(noise * len(pts)), 3))
        cloud = np.vstack([pts, extra, [[np.nan, 0, 0], [1e19, 0, 0]]])
        voxel = automatic_voxel_size(pts)
        for cap in (10**6, 5000):
            fast = filter_scan(cloud, voxel, cap, rng=np.random.default_rng(7))
            ref, removed, far = _reference_filter(cloud, voxel, cap, np.random.default_rng(7))
            assert (fast.num_isolated_removed, fast.num_far) == (removed, far)
            if noise:
                assert removed > 0.5 * len(extra)  # the rule applied
            np.testing.assert_array_equal(fast.points, ref)


def test_scan_filter_and_core_share_the_far_rule(sim_scans):
    """One far-outlier rule (geometry.outliers): a return 60 median spreads out (inside the old
    scan rule's 100 x the median range) and a 1e19 m glitch are dropped by the scan filter and
    left out by the core alike; one at 40 spreads is kept by both."""
    from pwan_ros.core.preprocess import clean_points

    pts = sim_scans[0].xyz.astype(np.float64)
    med = np.median(pts, axis=0)
    spread = float(np.median(np.linalg.norm(pts - med, axis=1)))
    out = med + np.array([[60.0 * spread, 0, 0], [0, 40.0 * spread, 0], [1e19, 0, 0]])
    cloud = np.vstack([pts, out])
    f = filter_scan(cloud, 0.0, 10**6)
    with pytest.warns(RuntimeWarning, match='2 of'):
        core = clean_points(cloud, 'source')
    assert f.num_far == core.num_far == 2
    assert np.array_equal(f.points, cloud[core.core])


def test_automatic_voxel_size_ignores_far_outliers(sim_scans):
    pts = sim_scans[0].xyz.astype(float)
    v = automatic_voxel_size(pts)
    assert 0.1 < v < 1.0
    rng = np.random.default_rng(1)
    far = rng.uniform(-500, 500, (len(pts) // 2, 3))
    assert automatic_voxel_size(np.vstack([pts, far])) == pytest.approx(v, rel=0.25)


def test_filter_drops_nan_and_range_gate():
    pts = np.array([[np.nan, 0, 0], [1, 0, 0], [5, 0, 0], [50, 0, 0], [np.inf, 1, 1]])
    f = filter_scan(pts, 0.0, 100, min_range=2.0, max_range=10.0)
    assert (f.num_input, f.num_finite, f.num_in_range) == (5, 3, 1)
    np.testing.assert_allclose(f.points, [[5, 0, 0]])


def test_constant_velocity_model():
    m = ConstantVelocityModel(max_extrapolation=3.0, max_gap_s=0.2)
    np.testing.assert_allclose(m.predict(0.0), np.eye(4))
    step = yaw(10.0)
    step[:3, 3] = [1.0, 0.0, 0.0]
    m.update(np.eye(4), 0.0)
    m.update(step, 0.1)
    pred = m.predict(0.2)
    np.testing.assert_allclose(pred, step @ step, atol=1e-9)
    # a long gap is extrapolated at most 3 steps (rotation and translation scaled separately)
    three = yaw(30.0)
    three[:3, 3] = [3.0, 0.0, 0.0]
    np.testing.assert_allclose(m.predict(10.0), step @ three, atol=1e-9)
    m.hold(0.1)
    np.testing.assert_allclose(m.predict(0.3), step, atol=1e-12)
    # a blackout of up to max_gap_s is bridged at the last velocity: 1 s at 10 Hz = 10 steps
    m = ConstantVelocityModel()
    m.update(np.eye(4), 0.0)
    m.update(step, 0.1)
    ten = yaw(100.0)
    ten[:3, 3] = [10.0, 0.0, 0.0]
    np.testing.assert_allclose(m.predict(1.1), step @ ten, atol=1e-9)
    np.testing.assert_allclose(m.predict(5.0), step @ ten, atol=1e-9)


def test_config_validation_names_parameter():
    with pytest.raises(ConfigError, match="'keyframe_angle'"):
        OdometryConfig(keyframe_angle=-1.0)
    with pytest.raises(ConfigError, match="unknown parameter"):
        OdometryConfig.from_dict({'voxelsize': 0.2})
    with pytest.raises(ConfigError, match="'max_range'"):
        OdometryConfig(min_range=5.0, max_range=2.0)
    # the pose is odom_frame -> base_frame: one frame cannot be both
    with pytest.raises(ConfigError, match="'base_frame'"):
        OdometryConfig(base_frame='/odom')


def test_pipeline_tracks_simulated_drive(sim_scans):
    pipe = OdometryPipeline(OdometryConfig())
    gt0 = sim_scans[0].pose
    errors = []
    for s in sim_scans:
        est = pipe.process(s.xyz, s.stamp_ns * 1e-9)
        assert est.path in ('init', 'track') and est.accepted
        errors.append(pose_error(est.pose, invert(gt0) @ s.pose))
    errors = np.array(errors)
    assert errors[:, 0].max() < 0.3 and errors[:, 1].max() < 0.05, errors


def test_pipeline_rejects_bad_scans(sim_scans):
    pipe = OdometryPipeline(OdometryConfig())
    s = sim_scans[0]
    with pytest.raises(ScanError, match='finite points within the range gate'):
        pipe.process(np.full((100, 3), np.nan), 1.0)
    pipe.process(s.xyz, 2.0)
    with pytest.raises(ScanError, match='time went backwards'):
        pipe.process(s.xyz, 1.0)
    with pytest.raises(ScanError, match=r'\(N, 3\)'):
        pipe.process(np.zeros((10, 2)), 3.0)


@pytest.mark.parametrize('marker', ['zeros', 'ring'])
def test_no_return_points_at_the_sensor_change_nothing(sim_scans, marker):
    """Drivers put a beam without a return at the sensor: at (0, 0, 0) (Ouster), or on a ring
    at the beam origin, 1.5 cm out. A blank first frame (every point so) is skipped without
    fixing the voxel size, and scans with 45 % such points track as the clean ones do, at the
    same voxel size. (Before: the blank frame fixed a 0.02 m voxel and every scan after it was
    rejected; 45 % zeros made the real returns look like far glitches.)"""
    rng = np.random.default_rng(3)

    def at_sensor(n):
        if marker == 'zeros':
            return np.zeros((n, 3))
        a = rng.uniform(0.0, 2.0 * np.pi, n)
        return np.stack([0.015 * np.cos(a), 0.015 * np.sin(a), np.zeros(n)], axis=1)

    rows = [rng.random(len(s.xyz)) < 0.45 for s in sim_scans[:6]]

    def marked(k):
        out = sim_scans[k].xyz.astype(np.float64)
        out[rows[k]] = at_sensor(int(rows[k].sum()))
        return out

    # the same returns without the marked rows
    clean = OdometryPipeline(OdometryConfig())
    clean.process(sim_scans[0].xyz[~rows[0]], sim_scans[0].stamp_ns * 1e-9)
    pipe = OdometryPipeline(OdometryConfig())
    with pytest.raises(ScanError, match='range gate'):
        pipe.process(at_sensor(2000), sim_scans[0].stamp_ns * 1e-9 - 0.1)
    assert pipe.voxel_size == 0.0
    gt0 = sim_scans[0].pose
    for k, s in enumerate(sim_scans[:6]):
        est = pipe.process(marked(k), s.stamp_ns * 1e-9)
        assert est.accepted and est.path in ('init', 'track'), est.reason
        rot, trans = pose_error(est.pose, invert(gt0) @ s.pose)
        assert rot < 0.3 and trans < 0.05, (s.stamp_ns, rot, trans)
    assert pipe.voxel_size == clean.voxel_size
    assert pipe.voxel_size > 0.1  # a street's, not the 0.02 m floor


@pytest.mark.parametrize(
    'ref',
    [
        np.full((40, 3), np.nan),
        np.zeros((40, 3)),
        np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]),
        np.vstack([np.random.default_rng(0).uniform(-20, 20, (10, 3)), np.full((30, 3), np.nan)]),
    ],
    ids=['all_nan', 'all_zero', 'two_points', 'ten_finite'],
)
def test_an_unusable_reference_cloud_is_refused_at_start(ref):
    """A reference cloud with fewer than 30 usable points (at the largest automatic voxel, 1 m)
    is a ValueError when the pipeline is built (the node: one line, exit 2), never a crash on
    the first scan (all NaN: a segfault in the GICP; ten finite points: a C++ error per scan)."""
    with pytest.raises(ValueError, match='usable points'):
        OdometryPipeline(OdometryConfig(reference_cloud='map.ply'), reference_points=ref)


@pytest.mark.heavy
def test_pwan_recovers_where_tracking_fails(sim_scans):
    """Heavy spurious returns (100 % of the scan's points, uniform in its bounding box) in
    three scans and a sudden 60 degree turn: partial tracking alone converges to a wrong pose;
    the pipeline detects it, engages full PWAN and recovers."""
    jump = yaw(60.0)
    rng = np.random.default_rng(0)
    # no time budget: the test is about what recovery can do, not how fast this machine is
    pipe = OdometryPipeline(OdometryConfig(pwan_time_budget_ms=600000.0))
    gt0 = sim_scans[0].pose
    engaged, after = [], []
    for k, s in enumerate(sim_scans):
        pose, xyz = s.pose, s.xyz.astype(float)
        if k >= 6:
            pose, xyz = pose @ jump, xyz @ jump[:3, :3]
        if k in (6, 7, 8):
            lo, hi = xyz.min(axis=0), xyz.max(axis=0)
            xyz = np.vstack([xyz, rng.uniform(lo, hi, (len(xyz), 3))])
        gt = invert(gt0) @ pose
        if k == 6:
            # what plain tracking from the prediction gives on the jump scan
            kf = pipe.keyframe
            scan = PreparedCloud.build(filter_scan(xyz, pipe.voxel_size, 10000).points)
            tr = track(
                kf.local_map,
                scan,
                invert(kf.pose) @ pipe.motion.predict(s.stamp_ns * 1e-9),
                pipe.distance_threshold,
            )
            assert pose_error(kf.pose @ tr.transform, gt)[0] > 5.0
        est = pipe.process(xyz, s.stamp_ns * 1e-9)
        engaged.append(est.pwan_engaged)
        if k >= 6:
            after.append(pose_error(est.pose, gt))
    print(
        f'PWAN engaged on {sum(engaged)} of {len(engaged)} scans: '
        f'{np.flatnonzero(engaged).tolist()}'
    )
    assert engaged[6] and 1 <= sum(engaged) <= 3
    after = np.array(after)
    assert after[:, 0].max() < 0.5 and after[:, 1].max() < 0.1, after


def test_tracking_mode_never_runs_pwan_and_keeps_the_wrong_pose(sim_scans):
    """mode='tracking' (the demo's baseline): the same 60 degree jump is distrusted but PWAN never
    runs, so the pose after it is wrong (what the adaptive mode recovers, test above)."""
    jump = yaw(60.0)
    pipe = OdometryPipeline(OdometryConfig(mode='tracking'))
    gt0 = sim_scans[0].pose
    errors = []
    for k, s in enumerate(sim_scans):
        pose, xyz = s.pose, s.xyz.astype(float)
        if k >= 6:
            pose, xyz = pose @ jump, xyz @ jump[:3, :3]
        est = pipe.process(xyz, s.stamp_ns * 1e-9)
        assert not est.pwan_engaged and est.timings_ms.get('pwan') is None
        errors.append(pose_error(est.pose, invert(gt0) @ pose)[0])
    assert max(errors[:6]) < 0.5 and min(errors[6:]) > 5.0, errors


@pytest.mark.heavy
def test_reference_cloud_start_up_and_tracking(sim_scans):
    """Scans aligned to a fixed reference (a prior map in odom coordinates), starting with an
    unknown 90 degree heading: start-up engages PWAN with turned starts, then tracking."""
    ref = np.vstack(
        [s.xyz.astype(float) @ s.pose[:3, :3].T + s.pose[:3, 3] for s in sim_scans[:3]]
    )
    offset = yaw(90.0)
    ref = ref @ offset[:3, :3].T  # map frame turned by 90 deg about z
    pipe = OdometryPipeline(
        OdometryConfig(reference_cloud='map.ply', pwan_time_budget_ms=600000.0),
        reference_points=ref,
    )
    for k in (3, 4, 5):
        s = sim_scans[k]
        est = pipe.process(s.xyz, s.stamp_ns * 1e-9)
        assert est.accepted, est.reason
        if k == 3:
            assert est.pwan_engaged and 'start-up' in est.reason
        rot, trans = pose_error(est.pose, offset @ s.pose)
        assert rot < 0.5 and trans < 0.1, (k, rot, trans)


def test_poses_stay_orthonormal():
    """Rigid inverses use the transpose: a pose that drifts from orthonormal compounds the
    drift scan by scan (it wrecked tracking after ~30 scans). Poses are re-orthonormalised."""
    m = ConstantVelocityModel()
    skewed = yaw(20.0)
    skewed[:3, :3] *= 1.0 + 1e-3
    m.update(np.eye(4), 0.0)
    m.update(skewed, 0.1)
    r = m.pose[:3, :3]
    np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-12)
    p = m.predict(0.2)[:3, :3]
    np.testing.assert_allclose(p @ p.T, np.eye(3), atol=1e-12)
    rng = np.random.default_rng(0)
    pts = np.column_stack(
        [rng.uniform(0, 10, 3000), rng.uniform(0, 10, 3000), rng.uniform(0, 3, 3000)]
    )
    cloud = PreparedCloud.build(filter_scan(pts, 0.3, 10000).points)
    init = np.eye(4)
    init[:3, :3] *= 1.0 + 1e-3
    t = track(cloud, cloud, init, 0.6).transform[:3, :3]
    np.testing.assert_allclose(t @ t.T, np.eye(3), atol=1e-12)


@pytest.mark.heavy
def test_pwan_mode_reuses_the_keyframe_reference(sim_scans):
    """mode='pwan': the keyframe's k-d tree and normals are prepared once per keyframe and reused
    by the scans registered against it; the poses equal those of a pipeline that prepares them
    for every scan (the core's results are bit-identical, test_core_register.py; the tracker's
    polish runs on 2 threads and varies in the last bits from run to run)."""
    cfg = OdometryConfig(mode='pwan', pwan_time_budget_ms=600000.0, pwan_steps=60)
    kept, fresh = OdometryPipeline(cfg), OdometryPipeline(cfg)
    fresh.pwan.reference_cache = None
    keyframes = set()
    for s in sim_scans[:4]:
        against = kept.keyframe.index if kept.keyframe is not None else None
        a = kept.process(s.xyz, s.stamp_ns * 1e-9)
        b = fresh.process(s.xyz, s.stamp_ns * 1e-9)
        assert a.path == b.path and a.keyframe == b.keyframe
        np.testing.assert_allclose(a.pose, b.pose, rtol=0, atol=1e-9)
        if a.path == 'pwan':
            keyframes.add(against)
    cache = kept.pwan.reference_cache
    assert cache.builds == len(keyframes) and cache.hits >= 2


def _rooms(seed=0):
    """Four rooms side by side along x (A..D, 6 m each: ground and three turned boxes), and a fifth
    (E) far away; ``scan(names, at, rng)`` samples the named rooms' surfaces afresh (a new scan)
    and returns them in the frame of a sensor at x = ``at`` (only those rooms are 'visible')."""
    rng = np.random.default_rng(seed)
    rooms = {}
    for k, name in enumerate('ABCDE'):
        x0 = -12.0 + 6.0 * k + (40.0 if name == 'E' else 0.0)
        boxes = [
            (
                np.array([x0 + rng.uniform(1, 5), rng.uniform(-2, 2), 0.0]),
                rng.uniform(0.4, 1.5, 3),
                rng.uniform(0, np.pi),
            )
            for _ in range(3)
        ]
        rooms[name] = (x0, boxes)

    def surface(corner, u, v, n, rng):
        a, b = rng.uniform(0, 1, (2, n))
        return corner + a[:, None] * u + b[:, None] * v

    def scan(names, at, rng):
        pts = []
        for name in names:
            x0, boxes = rooms[name]
            pts.append(
                surface(
                    np.array([x0, -3.0, 0.0]),
                    np.array([6.0, 0, 0]),
                    np.array([0, 6.0, 0]),
                    2000,
                    rng,
                )
            )
            for centre, size, turn in boxes:
                r = Rotation.from_euler('z', turn).as_matrix()
                ex, ey, ez = (r[:, i] * size[i] for i in range(3))
                base = centre - 0.5 * ex - 0.5 * ey
                for corner, u, v in (
                    (base, ex, ez),
                    (base + ey, ex, ez),
                    (base, ey, ez),
                    (base + ex, ey, ez),
                    (base + ez, ex, ey),
                ):
                    pts.append(surface(corner, u, v, 600, rng))
        p = np.vstack(pts) + rng.normal(0, 0.005, (sum(len(q) for q in pts), 3))
        return p - [at, 0.0, 0.0]

    return scan


def test_local_map_tracks_against_the_recent_keyframes_union():
    """local_map_keyframes > 1: scans are tracked against the union of the last N keyframes. The
    keyframes see rooms A+B, B+C, C+D (each overlaps only the one before); a scan that sees only
    room A overlaps only the oldest keyframe. With N = 3 it is tracked, with N = 1 (the newest
    keyframe, C+D) it is lost. A re-anchor starts a new map; a reference cloud stays the
    keyframe."""
    scan = _rooms()
    views = [('AB', 0.0), ('BC', 0.2), ('CD', 0.4), ('A', 0.6)]
    base = dict(mode='tracking', scan_voxel_size=0.2, keyframe_distance=0.1, reanchor_after=2)
    results = {}
    for n in (1, 3):
        pipe = OdometryPipeline(OdometryConfig(local_map_keyframes=n, **base))
        rng = np.random.default_rng(1)
        for k, (names, at) in enumerate(views):
            est = pipe.process(scan(names, at, rng), 0.1 * k)
            if k < 3:
                assert est.accepted and est.new_keyframe, (n, k, est.reason)
                assert pipe.keyframe.map_keyframes == min(k + 1, n)
        results[n] = (est, pipe)
    lost, (est, pipe) = results[1][0], results[3]
    assert not lost.accepted and lost.matched_ratio < 0.1, lost.reason
    assert est.path == 'track' and est.matched_ratio > 0.9, est.reason
    rot, trans = pose_error(est.pose, make_transform(np.eye(3), [0.6, 0, 0]))
    assert rot < 0.2 and trans < 0.02, (rot, trans)
    # the map of the last 3 keyframes (B+C, C+D, A), downsampled: about the four rooms once
    kf = pipe.keyframe
    assert kf.map_keyframes == 3 and len(kf.local_map) <= pipe.config.scan_max_points
    room = len(filter_scan(scan('A', 0.0, np.random.default_rng(2)), 0.2, 10**6).points)
    assert 3.0 * room < len(kf.local_map) < 5.0 * room, (len(kf.local_map), room)

    # two rejected scans (room E matches nothing), then a re-anchor: a new map of one keyframe
    rng = np.random.default_rng(3)
    paths = [pipe.process(scan('E', 0.6, rng), 0.4 + 0.1 * k).path for k in range(3)]
    assert paths == ['rejected', 'rejected', 'reanchor']
    assert pipe.keyframe.map_keyframes == 1 and len(pipe.keyframe.local_map) < 1.5 * room
    est = pipe.process(scan('E', 0.8, rng), 0.7)
    assert est.accepted and est.new_keyframe and pipe.keyframe.map_keyframes == 2

    # a reference cloud stays the keyframe, whatever local_map_keyframes says
    ref = scan('ABCD', 0.0, np.random.default_rng(4))
    pipe = OdometryPipeline(
        OdometryConfig(local_map_keyframes=3, reference_cloud='map.ply', **base),
        reference_points=ref,
    )
    for k, (names, at) in enumerate(views):
        est = pipe.process(scan(names, at, rng), 0.1 * k)
        assert est.accepted and pipe.keyframe.is_reference and pipe.keyframe.index == 0, (
            k,
            est.reason,
        )
        rot, trans = pose_error(est.pose, make_transform(np.eye(3), [at, 0, 0]))
        assert rot < 0.2 and trans < 0.02, (k, rot, trans)


@pytest.mark.parametrize('max_speed, tracks', [(10.0, True), (0.0, False)])
def test_first_steps_of_a_fast_slow_rate_sensor_are_captured(max_speed, tracks):
    """A 2 Hz sensor moving 8 m/s: 4 m between scans and no velocity known at start-up (the
    nuScenes keyframes). Tracking searches as far as max_speed x dt, coarse to fine, and gets the
    first steps right; with the plain 2h gate (max_speed 0) it settled near standing still (4 m
    short per step, accepted)."""
    scans = list(simulate(SimConfig(scans=5, seed=2, rate_hz=2.0, speed=8.0, **SIM)))
    pipe = OdometryPipeline(OdometryConfig(max_speed=max_speed))
    gt0 = scans[0].pose
    errors = []
    for s in scans:
        est = pipe.process(s.xyz, s.stamp_ns * 1e-9)
        errors.append(pose_error(est.pose, invert(gt0) @ s.pose)[1])
    assert np.linalg.norm((invert(gt0) @ scans[-1].pose)[:3, 3]) > 12.0
    if tracks:
        assert max(errors) < 0.1, errors
    else:
        assert max(errors) > 1.0, errors


@pytest.mark.heavy
@pytest.mark.parametrize('dropped', [range(1, 6), range(20, 25)])
def test_scans_dropped_at_speed_are_bridged(dropped):
    """A car at 9 m/s and 10 Hz that loses 5 scans (0.5 s, 4.5 m): at start-up, before any
    velocity is known, and mid-run. Every pose after the gap is right (the issue's real car
    registered such a start-up gap as 0.9 m forward or backwards, accepted)."""
    scans = [
        s
        for k, s in enumerate(simulate(SimConfig(scans=32, speed=9.0, beams=32, seed=1)))
        if k not in dropped
    ]
    pipe = OdometryPipeline(OdometryConfig())
    gt0 = scans[0].pose
    for s in scans:
        est = pipe.process(s.xyz, s.stamp_ns * 1e-9)
        assert est.accepted and est.path == 'track' or est.path == 'init', (est.path, est.reason)
        assert pose_error(est.pose, invert(gt0) @ s.pose)[1] < 0.1


def test_estimate_carries_the_diagnostics_status_and_time_budget(sim_scans):
    """The odometry's policy reaches the node in the estimate: 'ok' for an accepted scan, 'warn'
    for a rejected one, with a one-line message; over_budget on a tracking path past
    time_budget_ms (never on the full-PWAN path, which has its own budget)."""
    pipe = OdometryPipeline(OdometryConfig(mode='tracking', time_budget_ms=1e-3))
    for s in sim_scans[:4]:
        est = pipe.process(s.xyz, s.stamp_ns * 1e-9)
        assert est.status == 'ok' and est.message == est.path and est.over_budget
    noise = np.random.default_rng(0).uniform(-40.0, 40.0, (5000, 3))
    est = pipe.process(noise, sim_scans[4].stamp_ns * 1e-9)
    assert est.path == 'rejected' and est.status == 'warn'
    assert est.message == f'rejected: {est.reason}' and est.reason.startswith('matched ratio')
    relaxed = OdometryPipeline(OdometryConfig(mode='tracking'))
    est = relaxed.process(sim_scans[0].xyz, 0.0)
    assert est.path == 'init' and not est.over_budget


def test_a_cancelled_registration_is_abandoned(sim_scans):
    """After cancel() (the node shutting down) a running registration stops at its next step by
    raising, and later ones do not start: no fine-tune or self-check is run for a scan nobody
    will see (pwan mode took 3.7-4.5 s to exit, close to ros2 launch's 5 s)."""
    import threading

    from pwan_ros.odometry.pwan_recovery import PwanAligner, RegistrationCancelled

    pts = filter_scan(sim_scans[0].xyz.astype(float), 0.5, 4000).points
    aligner = PwanAligner(OdometryConfig(mode='pwan', pwan_steps=100000))
    threading.Timer(1.0, aligner.cancel).start()  # while its adversarial stage runs
    with pytest.raises(RegistrationCancelled):
        aligner.align(pts, pts, yaw(5.0))
    with pytest.raises(RegistrationCancelled):
        aligner.align_global(pts, pts)


def test_recovery_moves_to_the_self_checks_better_pose(sim_scans, monkeypatch):
    """A recovery whose polish stopped 3 m along the street (as a flooded scan's did in the
    demo, one run in four) is not refused when the self-check finds the clearly better pose next
    to it: the result is polished from there and judged in its place."""
    from types import SimpleNamespace

    from pwan_ros.odometry import pwan_recovery

    s0, s1 = sim_scans[0], sim_scans[1]
    kf = PreparedCloud.build(filter_scan(s0.xyz.astype(float), 0.5, 10000).points)
    scan = PreparedCloud.build(filter_scan(s1.xyz.astype(float), 0.5, 10000).points)
    truth = invert(s0.pose) @ s1.pose
    slid = truth @ make_transform(np.eye(3), np.array([3.0, 0.0, 0.0]))
    aligner = SimpleNamespace(
        align=lambda *a, **k: SimpleNamespace(transform=slid, iterations=0),
        raise_if_cancelled=lambda: None,
    )
    real_track, calls = pwan_recovery.track, []

    def track_stuck_once(*args, **kwargs):  # the first polish ends where it started
        calls.append(args[2])
        return real_track(*args, **dict(kwargs, max_iterations=1 if len(calls) == 1 else 30))

    monkeypatch.setattr(pwan_recovery, 'track', track_stuck_once)
    plan = pwan_recovery.RecoveryPlan(1, float('inf'), float('inf'))
    rec = pwan_recovery.recover(aligner, kf, scan, truth, 1.0, plan)
    assert len(calls) == 2, "no polish from the self-check's better pose"
    assert rec.check.status == 'ok' and rec.origin == 'self-check rival of the prediction'
    deg, metres = pose_error(rec.transform, truth)
    assert metres < 0.1 and deg < 0.5, (deg, metres)


@pytest.mark.heavy
def test_an_affine_scan_of_the_reference_is_aligned():
    """transform 'affine' with a reference cloud (a 4 m object 10 m away): a scan of it stretched
    10 %, sheared and moved comes back accepted with its deformed points on the reference."""
    from scipy.spatial import cKDTree

    from _core_shapes import knobbed_blob

    centre = np.array([10.0, 0.0, 0.0])
    ref = knobbed_blob(1500, 0) * 2.0 + centre
    a = np.array([[1.1, 0.05, 0.0], [0.0, 0.95, 0.0], [0.0, 0.0, 1.0]])
    scan = (knobbed_blob(1500, 1) * 2.0) @ a.T + centre + [0.3, 0.2, 0.0]
    config = OdometryConfig(
        reference_cloud='map.ply', transform='affine', pwan_time_budget_ms=600000.0
    )
    est = OdometryPipeline(config, reference_points=ref).process(scan, 0.0)
    assert est.accepted and est.aligned_points is not None, est.reason
    assert np.median(cKDTree(ref).query(est.aligned_points)[0]) < 0.1


def test_the_close_schedule_is_the_tail_of_the_full_one():
    """A start tracking trusts enters the learning-rate schedule where the rate is
    CLOSE_LR_FRACTION of the first: its rates are the full schedule's last ones, as Alg. 1 draws
    them, with CLOSE_UPDATES potential updates a step and no fine-tune (the pipeline tracks from
    it). A schedule of one rate (one step, or a flat one) keeps its steps."""
    from pwan_ros.odometry.pwan_recovery import CLOSE_LR_FRACTION, CLOSE_UPDATES, close_schedule

    def rates(c):  # as run_alg1 computes them
        decay = (c.lr_transform_final / c.lr_transform) ** (1.0 / max(c.steps - 1, 1))
        return c.lr_transform * decay ** np.arange(c.steps)

    full = RegistrationConfig(steps=400)
    short = close_schedule(full)
    assert short.lr_transform == pytest.approx(full.lr_transform * CLOSE_LR_FRACTION, rel=0.01)
    assert short.steps < full.steps and short.potential_updates == CLOSE_UPDATES
    assert not short.finetune.enabled and not short.finetune.polish  # tracking polishes
    np.testing.assert_allclose(rates(short), rates(full)[-short.steps :], rtol=1e-9)
    for one_rate in (RegistrationConfig(steps=1), RegistrationConfig(lr_transform_final=1e-2)):
        out = close_schedule(one_rate)
        assert (out.steps, out.lr_transform) == (one_rate.resolved().steps, 1e-2)


def test_a_trusted_start_left_or_outdone_is_judged(sim_scans, monkeypatch):
    """RecoveryPlan.close vouches only for the first start's result that still agrees with the
    trusted pose: a result 3 m away from it, or a yaw start's that wins, is judged by the
    self-check."""
    from types import SimpleNamespace

    from pwan_ros.odometry import pwan_recovery
    from pwan_ros.odometry.pipeline import _agreeing

    s0, s1 = sim_scans[0], sim_scans[1]
    kf = PreparedCloud.build(filter_scan(s0.xyz.astype(float), 0.5, 10000).points)
    scan = PreparedCloud.build(filter_scan(s1.xyz.astype(float), 0.5, 10000).points)
    truth = invert(s0.pose) @ s1.pose
    slid = truth @ make_transform(np.eye(3), np.array([3.0, 0.0, 0.0]))
    real_track = pwan_recovery.track
    # the polish stays where PWAN left it (one iteration), so the test decides where that is
    monkeypatch.setattr(
        pwan_recovery, 'track', lambda *a, **k: real_track(*a, **dict(k, max_iterations=1))
    )

    def recovered(results, yaw_starts=1):
        poses = iter(results)
        aligner = SimpleNamespace(
            align=lambda *a, **k: SimpleNamespace(transform=next(poses), iterations=0),
            raise_if_cancelled=lambda: None,
        )
        plan = pwan_recovery.RecoveryPlan(
            yaw_starts, float('inf'), float('inf'), close=_agreeing(truth, 1.0)
        )
        return pwan_recovery.recover(aligner, kf, scan, truth, 1.0, plan)

    assert recovered([truth]).check is None  # kept: vouched for by tracking's trust
    assert recovered([slid]).check is not None  # left the trusted pose
    outdone = recovered([slid, truth], yaw_starts=2)
    assert outdone.origin.startswith('yaw') and outdone.check is not None


@pytest.mark.heavy
def test_pwan_mode_starts_from_a_trusted_track(sim_scans, monkeypatch):
    """mode='pwan': where tracking trusts its pose, PWAN starts there (with the previous scan's
    network) on the short schedule and, keeping that pose, is vouched for by tracking's trust (no
    self-check, as a tracked pose in mode 'adaptive'); a scan tracking distrusts runs the full
    schedule from the prediction and is judged by the self-check. Every pose is right."""
    from pwan_ros.odometry import pwan_recovery

    runs, checks = [], []
    real_register, real_check = pwan_recovery.register, pwan_recovery.check_pose

    def register(source, reference, config, **kwargs):
        runs.append((config, kwargs['potential_state'] is not None))
        return real_register(source, reference, config, **kwargs)

    def check_pose(*args, **kwargs):
        checks.append(len(runs))
        return real_check(*args, **kwargs)

    monkeypatch.setattr(pwan_recovery, 'register', register)
    monkeypatch.setattr(pwan_recovery, 'check_pose', check_pose)
    pipe = OdometryPipeline(OdometryConfig(mode='pwan', pwan_time_budget_ms=600000.0))
    real_distrust = pipe.trust.distrust
    scans = sim_scans[:5]
    for k, s in enumerate(scans):
        distrusted = k == 4  # the last scan: tracking distrusts its pose, whatever it is
        monkeypatch.setattr(
            pipe.trust,
            'distrust',
            (lambda q, h: 'distrusted by the test') if distrusted else real_distrust,
        )
        before = len(runs)
        est = pipe.process(s.xyz.astype(float), s.stamp_ns * 1e-9)
        deg, metres = pose_error(invert(scans[0].pose) @ s.pose, est.pose)
        assert est.accepted and deg < 0.5 and metres < 0.1, (k, est.reason, deg, metres)
        if k < 2:
            continue  # the first scan defines odom; the second has no velocity yet
        ((config, warm),) = runs[before:]
        if distrusted:
            assert config.lr_transform == RegistrationConfig().lr_transform and warm
            assert checks and checks[-1] == len(runs), 'a distrusted start was not judged'
        else:
            assert config.lr_transform < RegistrationConfig().lr_transform and warm
            assert not checks or checks[-1] < len(runs), 'a kept trusted pose was re-judged'
