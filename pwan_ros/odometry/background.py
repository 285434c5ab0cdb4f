"""A full-PWAN recovery off the scan worker, and the scans that arrive while it runs.

When tracking is distrusted, :class:`~pwan_ros.odometry.pipeline.OdometryPipeline` (built with
``background=True``, as the node builds it) hands the recovery of that scan (the *trigger*) to a
:class:`BackgroundRecovery`: its own thread runs full PWAN and then re-tracks, from the
recovered pose, every scan kept meanwhile (tracking; full PWAN in line where tracking is
distrusted again), until none is left; only then does
the pipeline's state belong to the scan worker again. Meanwhile each new scan is answered at
once with the constant-velocity prediction of the last trusted motion (:meth:`keep`), flagged
as predicted. The outcome (:class:`RecoveryOutcome`: the final estimate of the trigger and of
each kept scan, with the size of its correction from what was published live) is taken once.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import numpy as np

from pwan_ros.geometry.se3 import invert, rotation_angle
from pwan_ros.odometry.motion_model import ConstantVelocityModel
from pwan_ros.odometry.preprocess import ScanError
from pwan_ros.odometry.pwan_recovery import RegistrationCancelled

#: scans kept for re-tracking at most: past it the oldest keep their predictions (flagged), so
#: the memory and the lag of a recovery stay bounded when scans come faster than they re-track
MAX_BACKLOG = 50


@dataclass(frozen=True)
class KeptScan:
    """A scan that arrived during a recovery: points (N, 3) sensor frame (m), stamp (s), per-point
    time offsets (N,) or None, and live_pose: the (4, 4) T_odom_sensor published for it."""

    points: np.ndarray
    stamp: float
    offsets: Optional[np.ndarray]
    live_pose: np.ndarray


@dataclass
class RecoveryOutcome:
    """What one background recovery produced. estimates: the final
    :class:`~pwan_ros.odometry.pipeline.ScanEstimate` of the trigger, then of each kept scan
    re-tracked (stamp order; a scan that could not be registered is left out), each with its
    ``correction`` (m, deg) from the pose published live. errors: what went wrong ('' lines)."""

    estimates: List = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    def correction(self) -> Optional[Tuple[float, float]]:
        """(m, deg) of the last accepted estimate from its live pose, None if none was."""
        moved = [e.correction for e in self.estimates if e.accepted and e.correction]
        return moved[-1] if moved else None


def correction(live: np.ndarray, final: np.ndarray) -> Tuple[float, float]:
    """(metres, degrees) between two (4, 4) poses of one scan."""
    d = invert(live) @ final
    return float(np.linalg.norm(d[:3, 3])), float(np.degrees(rotation_angle(d)))


class BackgroundRecovery:
    """One recovery on its own thread. ``recover()`` returns the trigger's final estimate;
    ``retrack(kept)`` the final estimate of a kept scan (raises ScanError to leave it out);
    ``motion``: a copy of the motion model at the trigger (the predictions); ``trigger``:
    (stamp (s), the live (4, 4) T_odom_sensor of the trigger); ``on_done()`` is called from the
    thread when the outcome is ready."""

    def __init__(
        self,
        recover: Callable[[], object],
        retrack: Callable[[KeptScan], object],
        motion: ConstantVelocityModel,
        trigger: Tuple[float, np.ndarray],
        on_done: Optional[Callable[[], None]] = None,
    ):
        self._recover, self._retrack, self._on_done = recover, retrack, on_done
        self.motion = motion
        self.trigger_stamp, self._trigger_live = trigger
        self._lock = threading.Lock()
        self._kept: List[KeptScan] = []
        self._last_stamp = self.trigger_stamp
        self._caught_up = False
        self._abandoned = False
        self._finished = threading.Event()  # the outcome is complete (set before on_done)
        self.started = time.monotonic()
        self.scans_kept = 0  # scans answered with a prediction so far
        self.outcome = RecoveryOutcome()
        self._thread = threading.Thread(target=self._run, name='pwan_recovery', daemon=True)
        self._thread.start()

    def keep(self, points: np.ndarray, stamp: float, offsets) -> Optional[np.ndarray]:
        """Keep a scan that arrived while recovering; returns its predicted (4, 4) T_odom_sensor,
        or None once the recovery has caught up (the caller registers the scan itself). Raises
        ScanError for a scan stamped before the last one."""
        with self._lock:
            if self._caught_up:
                return None
            if stamp <= self._last_stamp:
                raise ScanError(
                    f'time went backwards ({stamp:.3f} s <= {self._last_stamp:.3f} s) during '
                    'a recovery; skipped'
                )
            pose = self.motion.predict(stamp)
            self._kept.append(KeptScan(points, stamp, offsets, pose))
            del self._kept[:-MAX_BACKLOG]
            self.scans_kept += 1
            self._last_stamp = stamp
            return pose

    @property
    def done(self) -> bool:
        """The outcome is complete (the thread ends at once)."""
        return self._finished.is_set()

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    def abandon(self) -> None:
        """Re-track no further kept scan (an odometry reset: the outcome will be dropped)."""
        with self._lock:
            self._abandoned = True

    def _run(self) -> None:
        try:
            try:
                self._add(self._recover(), self._trigger_live)
            except RegistrationCancelled:
                raise
            except Exception as exc:  # the trigger keeps its flagged prediction
                self.outcome.errors.append(f'recovery failed: {exc!r}')
            self._catch_up()
        except RegistrationCancelled:
            self.outcome.errors.append('cancelled')
        except Exception as exc:  # never a silent pose: the live predictions stay flagged
            self.outcome.errors.append(f'recovery failed: {exc!r}')
        finally:
            with self._lock:
                self._caught_up = True
            self._finished.set()
            if self._on_done is not None:
                self._on_done()

    def _catch_up(self) -> None:
        """Re-track the kept scans, the ones arriving meanwhile too, until none is left."""
        while True:
            with self._lock:
                if not self._kept or self._abandoned:
                    self._caught_up = True
                    return
                kept = self._kept.pop(0)
            try:
                self._add(self._retrack(kept), kept.live_pose)
            except RegistrationCancelled:
                raise
            except Exception as exc:  # its prediction stays (flagged); the next scans go on
                self.outcome.errors.append(f'scan at {kept.stamp:.3f} s: {exc}')

    def _add(self, estimate, live: np.ndarray) -> None:
        moved = correction(live, estimate.pose)
        self.outcome.estimates.append(dataclasses.replace(estimate, correction=moved))
