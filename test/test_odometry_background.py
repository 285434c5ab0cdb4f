"""A full-PWAN recovery off the scan worker (``OdometryPipeline(background=True)``, the node's
pipeline): the scans that arrive while it runs are answered at once with predictions, kept, and
re-tracked from the recovered pose when it returns. The recovery is held at a gate the test
opens, so what happens meanwhile does not depend on the machine's speed."""

import threading

import numpy as np
import pytest

from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.odometry.background import correction
from pwan_ros.geometry.se3 import invert, rotation_angle
from pwan_ros.odometry import pipeline as pipeline_module
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.pipeline import OdometryPipeline


@pytest.fixture(scope='module')
def drive():
    """The demo's drive (32 beams, 10 Hz) with its stress events; the blackout's scans never
    arrive, so the fast turn across it needs full PWAN."""
    return [s for s in simulate(SimConfig(scans=40, stress=True)) if not s.blackout]


@pytest.fixture
def gate(monkeypatch):
    """Recoveries on the background thread wait until the returned event is set (abandoned
    meanwhile on a reset); the threads of the calls are recorded."""
    opened, entered = threading.Event(), []
    real = pipeline_module.recover

    def held(aligner, *args):
        entered.append(threading.current_thread().name)
        while entered[-1] == 'pwan_recovery' and not opened.wait(0.01):
            aligner.raise_if_cancelled()
        return real(aligner, *args)

    monkeypatch.setattr(pipeline_module, 'recover', held)
    opened.entered = entered
    return opened


def error(pose, scan, first):
    """(m, deg) of a T_odom_sensor from the truth, relative to the first scan."""
    d = invert(invert(first.pose) @ scan.pose) @ pose
    return np.linalg.norm(d[:3, 3]), np.degrees(rotation_angle(d))


def feed(pipe, scans):
    return [pipe.process(s.xyz.astype(np.float64), s.stamp_ns * 1e-9) for s in scans]


def test_scans_answered_while_a_recovery_runs_and_retracked_after(drive, gate):
    pipe = OdometryPipeline(OdometryConfig(), num_threads=1, background=True)
    # the burst of spurious returns left out: the scan after the blackout's turn triggers
    live = feed(pipe, drive[:13] + drive[15:26])
    k = next(i for i, e in enumerate(live) if e.path == 'predicted')
    trigger, kept = live[k], live[k + 1 :]
    # the scan that needs PWAN is answered with the prediction, the recovery runs elsewhere
    assert trigger.pwan_engaged and not trigger.accepted and trigger.status == 'warn'
    assert 'recovering' in trigger.reason
    # every later scan is answered at once, predicted, while the recovery is held
    assert len(kept) >= 5 and all(e.path == 'predicted' for e in kept), [e.path for e in kept]
    assert all(not e.accepted and e.status == 'warn' for e in kept)
    assert pipe.recovering and pipe.take_outcomes() == []
    gate.set()
    pipe.wait_recovery(600)
    assert set(gate.entered) == {'pwan_recovery'}  # full PWAN ran on the recovery's thread
    (outcome,) = pipe.take_outcomes()
    assert not outcome.errors, outcome.errors
    final = outcome.estimates
    # the trigger recovered by PWAN, every kept scan re-tracked from there, in order
    assert [e.stamp for e in final] == [e.stamp for e in live[k:]]
    paths = [e.path for e in final]
    assert paths[0] == 'pwan' and set(paths) <= {'pwan', 'track'}, paths
    assert paths.count('track') >= len(paths) - 3, paths  # tracking; PWAN where it is lost
    for est, scan in zip(final, (drive[:13] + drive[15:26])[k:]):
        m, deg = error(est.pose, scan, drive[0])
        assert m < 0.1 and deg < 1.0, (est.stamp, m, deg)
    # the correction is the move from the pose published live
    for est, prediction in zip(final, live[k:]):
        assert est.correction == correction(prediction.pose, est.pose)
    assert outcome.correction() == final[-1].correction and final[-1].correction[1] > 10.0
    # tracking goes on from the re-tracked state
    assert not pipe.recovering
    assert [e.path for e in feed(pipe, drive[26:28])] == ['track', 'track']


def test_a_reset_during_a_recovery_abandons_it(drive, gate):
    pipe = OdometryPipeline(OdometryConfig(), background=True)
    live = feed(pipe, drive[:13] + drive[15:22])
    assert 'predicted' in [e.path for e in live] and pipe.recovering
    pipe.reset()  # a time or frame restart: the held recovery stops at its next step
    assert not pipe.recovering and pipe.take_outcomes() == []
    # that recovery only: PWAN in line (start-up against a reference cloud) runs again
    pipe.pwan.raise_if_cancelled()
    gate.set()
    assert [e.path for e in feed(pipe, drive[:3])] == ['init', 'track', 'track']


def test_a_recovery_that_fails_leaves_the_predictions_and_odometry_goes_on(drive, monkeypatch):
    opened = threading.Event()

    def broken(*args):  # fails once the scans after the trigger are kept
        opened.wait()
        raise RuntimeError('out of memory')

    monkeypatch.setattr(pipeline_module, 'recover', broken)
    pipe = OdometryPipeline(OdometryConfig(), background=True)
    live = feed(pipe, drive[:20])
    k = next(i for i, e in enumerate(live) if e.path == 'predicted')
    opened.set()
    pipe.wait_recovery(600)
    outcomes = pipe.take_outcomes()
    assert outcomes and 'out of memory' in outcomes[0].errors[0]
    # no final pose for the trigger: its prediction stays, flagged; the scans kept meanwhile
    # are still re-tracked (from the last trusted state), and odometry goes on
    settled = [e.stamp for o in outcomes for e in o.estimates]
    assert live[k].stamp not in settled and live[k].status == 'warn'
    kept = [e.stamp for e in live[k + 1 :]]
    assert settled and settled == sorted(settled) and set(settled) <= set(kept), (k, outcomes)
    assert not pipe.recovering


def test_the_backlog_of_a_recovery_is_bounded():
    """Scans kept past MAX_BACKLOG: the oldest keep their predictions, the newest are
    re-tracked, so a long recovery's memory and catch-up stay bounded."""
    from pwan_ros.odometry.background import MAX_BACKLOG, BackgroundRecovery
    from pwan_ros.odometry.motion_model import ConstantVelocityModel
    from pwan_ros.odometry.pipeline import _predicted

    opened = threading.Event()

    def recover():
        opened.wait()
        return _predicted(0.0, np.eye(4), np.zeros((1, 3)), 'recovered')

    def retrack(kept):
        return _predicted(kept.stamp, kept.live_pose, kept.points, 're-tracked')

    rec = BackgroundRecovery(recover, retrack, ConstantVelocityModel(), (0.0, np.eye(4)))
    for k in range(1, MAX_BACKLOG + 21):
        assert rec.keep(np.zeros((1, 3)), float(k), None) is not None
    opened.set()
    rec.join(60)
    stamps = [e.stamp for e in rec.outcome.estimates]
    assert rec.done and stamps == [0.0] + [float(k) for k in range(21, MAX_BACKLOG + 21)]
    assert rec.keep(np.zeros((1, 3)), 1e3, None) is None  # caught up: the caller registers
