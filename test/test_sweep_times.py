"""Per-point times from drivers are used for deskewing only when they describe one sweep at the
header stamp (pwan_ros.odometry.sweep_times); what is refused leaves the scan as it is."""

import numpy as np
import pytest

from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.geometry.se3 import invert
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.pipeline import OdometryPipeline
from pwan_ros.odometry.sweep_times import SweepClock

STAMP0 = 1_700_000_000.0
N = 2000
SWEEP = np.linspace(0.0, 0.0999, N)


def extras(field, dtype, values):
    out = np.zeros(N, dtype=[('intensity', np.float32), (field, dtype)])
    out[field] = values
    return out


def feed(clock, make, scans=6, period=0.1):
    """SweepTimes of ``scans`` scans at ``period``; make(k, stamp) -> extras."""
    return [clock.read(make(k, STAMP0 + k * period), STAMP0 + k * period) for k in range(scans)]


def test_valid_driver_fields_are_used():
    ouster = feed(SweepClock(), lambda k, s: extras('t', np.uint32, np.round(SWEEP * 1e9)))
    assert [t.status for t in ouster] == ['used'] * 6 and ouster[0].warning is None
    np.testing.assert_allclose(ouster[-1].offsets, SWEEP, atol=1e-9)
    assert ouster[-1].detail == 't (relative ns)'
    hesai = feed(SweepClock(), lambda k, s: extras('timestamp', np.float64, s + SWEEP))
    assert [t.status for t in hesai] == ['used'] * 6
    velodyne = feed(
        SweepClock(), lambda k, s: extras('time', np.float32, SWEEP - 0.1)
    )  # stamp at the end
    assert [t.status for t in velodyne] == ['used'] * 6


@pytest.mark.parametrize(
    'what, field, dtype, make',
    [
        ('velodyne 5 s off', 'time', np.float32, lambda k, s: SWEEP - 5.0),
        ('hesai 5 s off the header', 'timestamp', np.float64, lambda k, s: s + 5.0 + SWEEP),
        (
            'random times',
            'time',
            np.float32,
            lambda k, s: np.random.default_rng(k).uniform(-0.5, 0.5, N),
        ),
    ],
)
def test_fields_that_are_no_sweep_are_ignored_with_a_reason(what, field, dtype, make):
    times = feed(SweepClock(), lambda k, s: extras(field, dtype, make(k, s)))
    # from the second scan on the period (0.1 s) is known: a sweep lasts at most 0.15 s
    assert all(t.status == 'ignored' and t.offsets is None for t in times[1:]), (what, times)
    assert 'does not describe one sweep' in times[-1].warning and field in times[-1].warning
    assert 'not deskewing' in times[-1].warning


def test_times_jumping_back_and_forth_are_ignored():
    """Alternating +-0.7 s around the header at 1 Hz: within a sweep each, but the sweeps' times do
    not advance, so every other scan's field is refused (before: 'time went backwards; call
    reset()' and the scan skipped)."""
    times = feed(
        SweepClock(),
        lambda k, s: extras('time', np.float32, SWEEP + (0.7 if k % 2 == 0 else -0.7)),
        scans=6,
        period=1.0,
    )
    assert [t.status for t in times] == ['used', 'ignored'] * 3
    assert 'goes back' in times[1].warning


def test_points_without_a_time_are_kept_not_moved():
    values = SWEEP.copy()
    values[::4] = np.nan
    values[1::97] = np.inf
    t = SweepClock().read(extras('time', np.float64, values), STAMP0)
    assert t.status == 'used' and t.offsets.shape == (N,) and np.isfinite(t.offsets).all()
    bad = ~np.isfinite(values)
    np.testing.assert_allclose(t.offsets[bad], np.median(values[~bad]))
    assert f'{bad.sum()} points without a time' in t.detail


def test_off_and_absent():
    assert SweepClock('off').read(extras('t', np.uint32, 0), STAMP0).status == 'off'
    none = SweepClock('on').read(extras('ring', np.uint16, 0), STAMP0)
    assert none.status == 'none' and 'deskew=on' in none.warning
    assert SweepClock('auto').read(extras('ring', np.uint16, 0), STAMP0).warning is None


def test_odometry_with_a_time_field_5_s_off_stays_on_the_ground_truth():
    """A sweep drive whose 'time' field is shifted by -5 s (a Velodyne driver off by 5 s): the
    field is refused and the scans are registered as they are, exactly as without a time field
    (applied, the field put the end pose 9 m off the 1.85 m driven, status OK)."""
    cfg = SimConfig(scans=10, speed=1.0, sweep=True, beams=16, moving_objects=0, seed=3)
    pipeline, clock = OdometryPipeline(OdometryConfig(), None), SweepClock()
    scans = list(simulate(cfg))
    plain = OdometryPipeline(OdometryConfig(), None)
    poses, plain_poses, statuses = [], [], []
    for s in scans:
        stamp = s.stamp_ns * 1e-9
        offsets = s.extras['t'].astype(np.float64) * 1e-9 - 5.0  # the sweep, 5 s off
        field = np.zeros(len(offsets), dtype=[('time', np.float64)])
        field['time'] = offsets
        times = clock.read(field, stamp)
        statuses.append(times.status)
        poses.append(pipeline.process(s.xyz, stamp, times.offsets).pose)
        plain_poses.append(plain.process(s.xyz, stamp).pose)
    assert statuses == ['ignored'] * len(scans)
    np.testing.assert_allclose(
        np.array(poses), np.array(plain_poses), atol=1e-3
    )  # thread-order rounding
    gt = invert(scans[0].pose) @ scans[-1].pose
    est = invert(poses[0]) @ poses[-1]
    assert np.linalg.norm(gt[:3, 3]) > 0.8
    assert np.linalg.norm((invert(gt) @ est)[:3, 3]) < 0.5
