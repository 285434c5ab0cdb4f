"""PWAN odometry, scan by scan: prepare -> predict -> register -> judge -> update -> estimate.

``OdometryPipeline.process(points, stamp)`` turns one scan (sensor frame, metres) into a pose of
the sensor in the odometry frame. Two paths produce poses:

* ``track``: the fast partial refinement (:mod:`pwan_ros.odometry.keyframe_tracker`) from a
  constant-velocity prediction, against the local map of the last ``local_map_keyframes``
  keyframes (:mod:`pwan_ros.odometry.keyframes`), kept until the next keyframe.
* ``pwan``: full PWAN (:mod:`pwan_ros.odometry.pwan_recovery`), used in ``mode='adaptive'`` at
  start-up against a reference cloud and whenever the trust policy (:mod:`pwan_ros.odometry.trust`)
  distrusts tracking, and in ``mode='pwan'`` for every scan (from the tracked pose when tracking
  trusts it). Its result re-initialises tracking.
  ``mode='tracking'`` never runs it (the baseline of the demo: what PWAN recovers).

A registration that matches too little is rejected — unless it agrees with the motion
prediction as closely as the recent scans did (a scan flooded with spurious returns matches few
of its points at the right pose; :meth:`TrustPolicy.agrees_with_motion`): the last good pose is
kept (and reported), the motion model stops extrapolating, and the next scan tries again. So is a
scan whose usable points collapse against the recent scans (a driver glitch, a half-delivered
scan), before it can become a keyframe. After ``reanchor_after`` consecutive rejections the next
scan becomes a new keyframe at the held pose (path 'reanchor'), so a keyframe that no longer
matches cannot make the odometry reject forever.

Each scan follows one recipe (``OdometryPipeline._process``): prepare the scan, predict its pose,
register it (no state changes), let the trust policy judge it (a :class:`~.trust.Verdict`, no
state changes), apply the verdict to the state (the one place it changes), build the estimate.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from pwan_ros.core.checks.verify import check_pose
from pwan_ros.geometry.se3 import invert, project_rigid, rotation_angle, transform_points
from pwan_ros.odometry.background import BackgroundRecovery, KeptScan, RecoveryOutcome
from pwan_ros.odometry.constraint import Constraint
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.deskew import deskew, motion_over
from pwan_ros.odometry.keyframe_tracker import MatchQuality, PreparedCloud, match_quality, track
from pwan_ros.odometry.keyframes import Keyframe, Keyframes
from pwan_ros.odometry.motion_model import ConstantVelocityModel
from pwan_ros.odometry.preprocess import MIN_POINTS, PreparedScan, ScanError, ScanPreparer
from pwan_ros.odometry.pwan_recovery import PwanAligner, RecoveryPlan, recover
from pwan_ros.odometry.scan_filter import filter_scan
from pwan_ros.odometry.trust import AGREEMENT_FLOOR_DEG, AGREEMENT_FLOOR_H, TrustPolicy, Verdict

__all__ = [
    'OdometryPipeline',
    'ScanEstimate',
    'ScanError',
    'Keyframe',
    'MIN_POINTS',
]


#: a scan stamped more than this many periods (the last step between accepted scans) after the
#: last accepted pose follows a gap (a stamp jump, a driver restart, dropped scans): its tracked
#: pose is judged by the self-check before it is trusted (a +1 s stamp jump in a corridor was
#: tracked 2.8 m ahead, accepted)
GAP_PERIODS = 3.0
#: small_gicp's threads with ``num_threads`` 0 (automatic): 31 against 47 ms a nuScenes scan with
#: 1, 2 idle cores
SMALL_GICP_THREADS = 2


@dataclass(frozen=True)
class ScanEstimate:
    """Result of one scan.

    pose: (4, 4) T_odom_sensor (for a rejected scan: the last good pose). path: 'init' (first
    scan defines odom), 'track', 'pwan', 'rejected', or 'reanchor' (a new keyframe at the held
    pose after ``reanchor_after`` rejections). accepted: whether ``pose`` comes from this scan.
    pwan_engaged: full PWAN ran for this scan. reason: why PWAN ran or the scan was rejected
    ('' otherwise). matched_ratio / median_residual: partial-matching quality against the
    keyframe (fraction of the scan's points within h; metres). num_points / num_input / num_far:
    points after filtering / received / dropped as far glitches. keyframe: index of the keyframe
    matched; new_keyframe: this scan became one. deskewed: motion-compensated with per-point times.
    aligned_points: affine / non-rigid modes only,
    (M, 3) deformed scan points in odom_frame (else None). status: the diagnostics level, 'ok',
    or 'warn' for a rejected, re-anchored or flagged scan. over_budget: ``latency_ms`` exceeded
    ``time_budget_ms`` on a path other than 'pwan' (whose budget is ``pwan_time_budget_ms``).
    weak: the constraint of a tracked pose the scan does not pin along some axis (flagged).
    path 'predicted': answered during a recovery running off the scan worker (``background``)
    with the constant-velocity prediction (not accepted); its final estimate comes with the
    recovery's outcome, with ``correction``: (m, deg) from the pose published live.
    """

    stamp: float
    pose: np.ndarray
    path: str
    accepted: bool
    pwan_engaged: bool
    reason: str
    matched_ratio: float
    median_residual: float
    iterations: int
    num_points: int
    num_input: int
    keyframe: int
    new_keyframe: bool
    latency_ms: float
    timings_ms: Dict[str, float] = field(default_factory=dict)
    aligned_points: Optional[np.ndarray] = None
    pwan_starts: int = 0
    num_far: int = 0
    deskewed: bool = False
    status: str = 'ok'
    over_budget: bool = False
    weak: Optional[Constraint] = None  # an accepted pose its scan does not pin along an axis
    correction: Optional[Tuple[float, float]] = None  # (m, deg) from the live pose

    @property
    def message(self) -> str:
        """One line for the diagnostics: the path, and the reason if any."""
        return self.path + (f': {self.reason}' if self.reason else '')


@dataclass(frozen=True)
class Registration:
    """The register stage's result: (4, 4) T_keyframe_scan (affine for a deformation) and how it
    was obtained. note: why full PWAN ran and what the self-checks said ('' if nothing).
    deviation: (m, deg) from the motion prediction, None without one. aligned_points: affine /
    non-rigid modes, (M, 3) deformed scan in odom_frame (else None)."""

    transform: np.ndarray
    quality: MatchQuality
    iterations: int = 0
    pwan_engaged: bool = False
    note: str = ''
    starts: int = 0
    deviation: Optional[tuple] = None
    aligned_points: Optional[np.ndarray] = None
    flagged: bool = False  # accepted, but published as WARN with a held pose's covariance
    weak: Optional[Constraint] = None  # tracked, but not pinned along an axis: WARN
    pending: bool = False  # tracking distrusted, full PWAN to run off the scan worker
    refused: str = ''  # a deformation the core's self-check refused: why (rejected, unpublished)


@dataclass(frozen=True)
class _Work:
    """One scan between its stages: stamp (s, the registered instant), header_stamp (s, as
    given), t_ref (s, the one after the other), deskewed, t0 (perf_counter s at the start),
    timings (ms), the prepared scan, the keyframe and the prediction init ((4, 4)
    T_keyframe_scan)."""

    stamp: float
    header_stamp: float
    t_ref: float
    deskewed: bool
    t0: float
    timings: Dict[str, float]
    scan: PreparedScan
    kf: Optional[Keyframe]
    init: Optional[np.ndarray]


class OdometryPipeline:
    """Stateful scan registration. Not thread-safe: call ``process`` from one thread.

    num_threads: threads of small_gicp (KD-trees, covariances, GICP); None = the config's
    ``num_threads`` (0: 2, the node's, :data:`SMALL_GICP_THREADS`)."""

    def __init__(
        self,
        config: OdometryConfig,
        reference_points: Optional[np.ndarray] = None,
        num_threads: Optional[int] = None,
        background: bool = False,
        on_recovered: Optional[Callable[[], None]] = None,
    ):
        self.config = config
        if num_threads is None:
            num_threads = config.num_threads or SMALL_GICP_THREADS
        self.num_threads = num_threads
        # mode 'adaptive': full-PWAN recoveries off the caller's thread (background.py), the
        # scans meanwhile answered with predictions; on_recovered() says an outcome is ready
        # (called on the recovery's thread: it must not collect the outcome itself)
        self.background = background and config.mode == 'adaptive'
        self._on_recovered = on_recovered
        self._recovery: Optional[BackgroundRecovery] = None
        self._outcomes: List[RecoveryOutcome] = []
        self.motion = ConstantVelocityModel()
        self.pwan = PwanAligner(config)
        self.trust = TrustPolicy(config)
        self.keyframes = Keyframes(config, self.num_threads, lambda: self.voxel_size)
        self._rng = np.random.default_rng(config.seed)
        self.preparer = ScanPreparer(config, self._rng, self.num_threads)
        self._reference_points = None
        if config.reference_cloud or reference_points is not None:
            if reference_points is None:
                raise ValueError('reference_cloud is set but no reference points were given')
            self._reference_points = usable_reference(reference_points, config.scan_voxel_size)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget all state (keyframes, motion, trust history, PWAN warm start); the next scan
        starts a new odometry. The voxel size, once chosen, is kept; a background recovery is
        abandoned (its outcome dropped)."""
        self._abandon_recovery()
        self._outcomes = []
        self._catching_up = False  # a background recovery re-tracks its kept scans
        self.motion.reset()
        self.pwan.reset()
        self.trust.reset()
        self.keyframes.reset()
        self._last_stamp: Optional[float] = None
        self._scan_index = 0

    @property
    def keyframe(self) -> Optional[Keyframe]:
        return self.keyframes.current

    @property
    def voxel_size(self) -> float:
        """Voxel size of the scans (m); 0 until the first scan when automatic."""
        return self.preparer.voxel_size

    @property
    def distance_threshold(self) -> float:
        """Partial-matching distance h (m): ``distance_threshold``, 0 = 2 x the voxel size."""
        return self.config.distance_threshold or 2.0 * self.voxel_size

    # ------------------------------------------------------------------ main entry
    def process(
        self, points: np.ndarray, stamp: float, offsets: Optional[np.ndarray] = None
    ) -> ScanEstimate:
        """Register one scan. points: (N, 3) sensor frame (metres), may contain NaN rows.
        stamp: seconds. offsets: (N,) acquisition time of each point in seconds from ``stamp``
        (None: unknown). With offsets (and ``deskew`` not 'off'), the scan is registered as a
        snapshot at its median point time: motion-compensated to that instant once there is a
        velocity to extrapolate (before, the raw sweep approximates it), and the pose returned is
        moved back to ``stamp`` with the velocity. The mid-sweep reference keeps a velocity error
        from shifting the registered cloud, so it cannot feed back into the next velocity (as
        KISS-ICP, which registers mid-sweep). Raises ScanError for a scan that cannot be
        registered.

        With ``background``, a scan that arrives while a recovery runs is answered at once with
        the prediction (path 'predicted') and re-tracked later (:meth:`take_outcomes`)."""
        if self._recovery is not None:
            predicted = self._recovery.keep(points, stamp, offsets)
            if predicted is not None:
                reason = f'recovering since the scan at {self._recovery.trigger_stamp:.3f} s'
                return _predicted(stamp, predicted, points, reason, pwan_engaged=False)
            self._collect()  # caught up: the state is this thread's again
        return self._register_scan(points, stamp, offsets)

    def take_outcomes(self) -> List[RecoveryOutcome]:
        """The outcomes of the background recoveries finished since the last call (each once)."""
        if self._recovery is not None and self._recovery.done:
            self._collect()
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    @property
    def recovering(self) -> bool:
        """A background recovery is running (or its outcome not collected)."""
        return self._recovery is not None

    def recovery_progress(self) -> Optional[Tuple[float, float, int]]:
        """(stamp (s) of the scan that started the running background recovery, seconds it has
        run, scans answered with predictions since), or None."""
        rec = self._recovery
        if rec is None:
            return None
        return rec.trigger_stamp, time.monotonic() - rec.started, rec.scans_kept

    def wait_recovery(self, timeout: Optional[float] = None) -> None:
        """Block until a running background recovery is done (tests, offline use)."""
        if self._recovery is not None:
            self._recovery.join(timeout)

    def close(self) -> None:
        """Stop a background recovery (shutdown); the pipeline stays usable."""
        self._abandon_recovery()

    def _register_scan(
        self, points: np.ndarray, stamp: float, offsets: Optional[np.ndarray]
    ) -> ScanEstimate:
        """:meth:`process` on this thread: deskew, register, and back to ``stamp``."""
        t_ref, deskewed = 0.0, False
        if offsets is not None and self.config.deskew != 'off':
            offsets = np.asarray(offsets, dtype=np.float64)
            if len(offsets) != len(points):
                raise ScanError(f'{len(offsets)} point times for {len(points)} points')
            finite = offsets[np.isfinite(offsets)]
            t_ref = float(np.median(finite)) if finite.size else 0.0
            velocity = self.motion.velocity()
            if velocity is not None:
                points, deskewed = deskew(points, offsets - t_ref, velocity), True
        return self._process(points, stamp, t_ref, deskewed)

    def _to_stamp(self, est: ScanEstimate, work: _Work) -> ScanEstimate:
        """The estimate of a scan registered ``work.t_ref`` s after its header stamp, moved back
        to it (the stamp exactly as given)."""
        if work.t_ref == 0.0:
            return est
        velocity = self.motion.velocity()
        pose = est.pose
        if velocity is not None:
            pose = pose @ invert(motion_over(velocity, work.t_ref))
        return dataclasses.replace(est, stamp=work.header_stamp, pose=pose)

    def _process(self, points: np.ndarray, stamp: float, t_ref: float, deskewed: bool):
        t0, timings, header_stamp = time.perf_counter(), {}, stamp
        stamp += t_ref
        scan = self._prepare(points, stamp, timings)  # raises ScanError before any state changes
        kf = self.keyframe or self._reference_keyframe()
        init = self._predict(kf, stamp)
        work = _Work(stamp, header_stamp, t_ref, deskewed, t0, timings, scan, kf, init)
        verdict = self.trust.screen(kf, len(scan.dense))  # decided before registering, or None
        reg = _unregistered(verdict) if verdict else self._register(work)
        if reg.pending:
            return self._defer(work, reg)
        return self._conclude(work, reg, verdict)

    def _conclude(self, work: _Work, reg: Registration, verdict: Optional[Verdict]):
        """Judge the registration (unless ``verdict`` was decided before), apply the verdict to
        the state, and build the scan's estimate."""
        if verdict is None and reg.refused:
            verdict = Verdict('reject', reg.refused)
        verdict = verdict or self.trust.judge(
            reg.quality,
            reg.note,
            reg.deviation,
            self.distance_threshold,
            deformed=reg.aligned_points is not None,
        )
        update = self._update(verdict, work.kf, work.scan, reg, work.stamp, work.timings)
        est = self._estimate(work, verdict, reg, update)
        return self._to_stamp(est, work)

    def _defer(self, work: _Work, tracked: Registration) -> ScanEstimate:
        """Start the recovery of this scan off the caller's thread; answer with the prediction."""
        live = self.motion.predict(work.stamp)
        est = _predicted(work.stamp, live, work.scan.dense, f'recovering: {tracked.note}')
        est = self._to_stamp(est, work)

        def recover() -> ScanEstimate:
            reg = self._recovered(work, tracked)
            return self._conclude(work, reg, None)

        self._recovery = BackgroundRecovery(
            recover,
            self._retrack,
            copy.deepcopy(self.motion),
            (est.stamp, est.pose),
            self._on_recovered,
        )
        return est

    def _retrack(self, kept: KeptScan) -> ScanEstimate:
        """A scan kept during a recovery, registered from the recovered state on the recovery's
        thread (tracking; full PWAN again, in line, where tracking is distrusted)."""
        self._catching_up = True
        try:
            return self._register_scan(kept.points, kept.stamp, kept.offsets)
        finally:
            self._catching_up = False

    def _collect(self) -> None:
        """The finished background recovery's outcome, kept for :meth:`take_outcomes`."""
        self._recovery.join()
        self._outcomes.append(self._recovery.outcome)
        self._recovery = None

    def _abandon_recovery(self) -> None:
        recovery, self._recovery = getattr(self, '_recovery', None), None
        if recovery is not None:
            self.pwan.abandon()
            recovery.abandon()
            recovery.join()
            self.pwan.resume()

    # ------------------------------------------------------------------ stages
    def _prepare(
        self, points: np.ndarray, stamp: float, timings: Dict[str, float]
    ) -> PreparedScan:
        """Check the stamp and preprocess the scan (raises ScanError before any state changes)."""
        t0 = time.perf_counter()
        if self._last_stamp is not None and stamp < self._last_stamp:
            raise ScanError(
                f'time went backwards ({stamp:.3f} s < {self._last_stamp:.3f} s); call reset()'
            )
        scan = self.preparer(points)
        timings['preprocess'] = (time.perf_counter() - t0) * 1e3
        self._last_stamp = stamp
        self._scan_index += 1
        return scan

    def _predict(self, kf: Optional[Keyframe], stamp: float) -> Optional[np.ndarray]:
        """The constant-velocity prediction as (4, 4) T_keyframe_scan; None without a keyframe."""
        return None if kf is None else invert(kf.pose) @ self.motion.predict(stamp)

    def _register(self, work: _Work) -> Registration:
        """Register the scan from the prediction ``work.init`` (T_keyframe_scan): track, and full
        PWAN when the trust policy distrusts tracking (or always in mode 'pwan'); a deformation
        of the scan to the reference cloud in the affine / non-rigid modes. Changes no state."""
        kf, scan, init, timings = work.kf, work.scan, work.init, work.timings
        if self.config.transform != 'rigid':
            return self._deform(kf, scan, init, timings)
        # mode 'pwan' tracks too: a pose tracking trusts is where PWAN starts, on a short
        # schedule (RecoveryPlan.close); PWAN's result is the answer
        reg = self._track(kf, scan, init, timings)
        if self.config.mode != 'pwan' and (not reg.note or self.config.mode == 'tracking'):
            return self._with_deviation(reg, init)
        if self.background and self.motion.pose is not None:
            if self._catching_up:  # already off the scan worker: recover in line
                return self._recovered(work, reg)
            return dataclasses.replace(reg, pending=True)  # off this thread (_defer)
        return self._recovered(work, reg)

    def _recovered(self, work: _Work, tracked: Registration) -> Registration:
        """Full PWAN (:meth:`_recover`) after ``tracked``, flagged when the sensor may have left
        the scan's reach."""
        reg = self._recover(work.kf, work.scan, work.init, tracked, work.timings)
        beyond = self._beyond_reach(work.scan)
        if beyond and reg.quality.matched_ratio > 0.0:  # not refused: flagged
            reg = dataclasses.replace(reg, note=f'{reg.note}; {beyond}', flagged=True)
        return self._with_deviation(reg, work.init)

    def _with_deviation(self, reg: Registration, init: np.ndarray) -> Registration:
        deviation = _deviation(init, reg.transform) if self.motion.predicting else None
        return dataclasses.replace(reg, deviation=deviation)

    def _track(
        self, kf: Keyframe, scan: PreparedScan, init: np.ndarray, timings: Dict[str, float]
    ) -> Registration:
        """The fast partial refinement; ``note`` says why the trust policy distrusts it."""
        t0 = time.perf_counter()
        capture = self._capture_range()
        tr = track(
            kf.local_map,
            scan.tracked,
            init,
            self.distance_threshold,
            num_threads=self.num_threads,
            capture=capture,
        )
        timings['track'] = (time.perf_counter() - t0) * 1e3
        note = self.trust.distrust(tr.quality, self.distance_threshold)
        gap = self._gap(capture)
        if not note and gap:
            # a wide search without a velocity can settle on a pose near the last one ("no
            # motion" on a road), an extrapolation across a stamp jump slides along a corridor:
            # the self-check judges the pose before it is trusted
            t1 = time.perf_counter()
            check = check_pose(transform_points(tr.transform, scan.dense), kf.local_map.points)
            timings['check'] = (time.perf_counter() - t1) * 1e3
            if check.status != 'ok':
                note = f'tracking across {gap} refused by its self-check: {check.reason}'
        if self._scan_index == 1 and kf.is_reference:
            note = 'start-up against the reference cloud' + (f' ({note})' if note else '')
        weak = tr.constraint if tr.constraint is not None and tr.constraint.degenerate else None
        return Registration(tr.transform, tr.quality, tr.iterations, note=note, weak=weak)

    def _recover(
        self,
        kf: Keyframe,
        scan: PreparedScan,
        init: np.ndarray,
        tracked: Registration,
        timings: Dict[str, float],
    ) -> Registration:
        """Full PWAN (multi-start, global when lost); the better of it and ``tracked`` by matched
        ratio wins. A recovery its self-check refuses matches nothing. Mode 'pwan': PWAN's result
        is the answer; it starts from ``tracked`` on a short schedule when tracking trusts it
        (close), else from the prediction ``init``."""
        pwan_mode = self.config.mode == 'pwan'
        close = pwan_mode and not tracked.note
        start = tracked.transform if close else init
        note = 'mode pwan' if pwan_mode else tracked.note
        deadline = time.perf_counter() + self.config.pwan_time_budget_ms * 1e-3
        good = self.trust.good_match()  # infinite without a history: then no global search either
        plan = RecoveryPlan(
            self.config.recovery_yaw_starts,
            good,
            deadline,
            self.num_threads,
            use_global=self.config.recovery_global and np.isfinite(good),
            settles=self._settles(init),
            close=_agreeing(start, self.distance_threshold) if close else None,
        )
        rec = recover(self.pwan, kf.local_map, scan.tracked, start, self.distance_threshold, plan)
        timings['pwan'], timings['polish'] = rec.pwan_ms, rec.polish_ms
        iterations = rec.iterations + tracked.iterations
        if rec.check is not None and rec.check.status != 'ok':
            # the recovery cannot vouch for its pose: nothing of this scan is accepted
            note += f'; recovery refused by its self-check: {rec.check.reason}'
            return Registration(rec.transform, _NOTHING, iterations, True, note, rec.starts)
        best = tracked
        if pwan_mode or rec.quality.matched_ratio >= tracked.quality.matched_ratio:
            best = Registration(rec.transform, rec.quality)
            if rec.origin == 'global':
                note += '; recovered by global registration (no initial pose)'
            elif rec.origin != 'prediction':
                note += f'; recovered from the {rec.origin} start'
        elif rec.global_status == 'refused':
            note += '; global registration refused'
        # a kept trusted start is vouched for as its tracked pose is: with its weak axis, if any
        weak = tracked.weak if pwan_mode and rec.check is None else None
        return Registration(
            best.transform, best.quality, iterations, True, note, rec.starts, weak=weak
        )

    def _deform(
        self, kf: Keyframe, scan: PreparedScan, init: np.ndarray, timings: Dict[str, float]
    ) -> Registration:
        """Affine / non-rigid registration of the scan to the fixed reference (full PWAN); a
        non-rigid one judged by the core's self-check (a refused one is rejected)."""
        t0 = time.perf_counter()
        deadline = t0 + self.config.pwan_time_budget_ms * 1e-3
        # a non-rigid result is judged as a deformation (core checks.deformation); the affine
        # check's held-in-every-direction test needs denser scans than the node registers
        judged = self.config.transform == 'nonrigid'
        result = self.pwan.align(
            scan.dense, kf.local_map.points, init, self.distance_threshold, deadline, judged
        )
        timings['pwan'] = (time.perf_counter() - t0) * 1e3
        quality = match_quality(
            kf.local_map, result.transformed_source, np.eye(4), self.distance_threshold
        )
        aligned = result.transformed_source @ kf.pose[:3, :3].T + kf.pose[:3, 3]
        refused = f'the self-check refused the deformation: {result.reason}'
        return Registration(
            result.transform,
            quality,
            result.iterations,
            True,
            starts=1,
            aligned_points=aligned,
            refused=refused if result.status != 'ok' else '',
        )

    def _settles(self, init: np.ndarray):
        """What ends a recovery's search early besides a good match: a result that the trust
        policy would accept as agreeing with the motion prediction (``init``, T_keyframe_scan),
        while the motion model extrapolates across no gap (a scan flooded with spurious returns
        matches too few points for a good match at any start; 5 starts took 7 s there). None
        after a gap: every start is tried."""
        if not self.motion.predicting or self._gap(self._capture_range()):
            return None
        least, h = self.config.min_matched_ratio, self.distance_threshold

        def settles(transform: np.ndarray, quality: MatchQuality) -> bool:
            deviation = _deviation(init, transform)
            return quality.matched_ratio >= least and self.trust.agrees_with_motion(deviation, h)

        return settles

    def _beyond_reach(self, scan: PreparedScan) -> str:
        """'' unless the sensor may have moved farther since the last accepted pose (``max_speed``
        x the time) than its scan reaches (the median range of its points): then the scan may
        not overlap the map at all, and a pose found there is flagged, not trusted."""
        if self.motion.stamp is None:
            return ''
        since = self._last_stamp - self.motion.stamp
        reach = float(np.median(np.linalg.norm(scan.dense, axis=1)))
        if self.config.max_speed * since <= reach:
            return ''
        return (
            f'flagged: in the {since:.3g} s since the last accepted pose the sensor may have '
            f'moved {self.config.max_speed * since:.3g} m, beyond the reach of its scan '
            f'({reach:.3g} m median range): the recovered pose is unconfirmed'
        )

    def _gap(self, capture: float) -> str:
        """What makes the scan follow a gap ('' if nothing): a search wider than 2h (no velocity
        to predict from), or a stamp more than :data:`GAP_PERIODS` periods (the last step
        between accepted scans) after the last accepted pose."""
        if capture > 2.0 * self.distance_threshold:
            return f'a {capture:.3g} m gap'
        period, since = self.motion.period, self._last_stamp - (self.motion.stamp or 0.0)
        if period and since > GAP_PERIODS * period:
            return f'a {since:.3g} s gap ({since / period:.0f} periods)'
        return ''

    def _capture_range(self) -> float:
        """How far (m) the scan may lie from the prediction: 2h while a velocity is extrapolated;
        without one (start-up, after a rejection or a hold) the distance the sensor can cover at
        ``max_speed`` since the last accepted pose."""
        if self.motion.predicting or self.motion.stamp is None:
            return 0.0
        return self.config.max_speed * max(self._last_stamp - self.motion.stamp, 0.0)

    def _update(
        self,
        verdict: Verdict,
        kf: Optional[Keyframe],
        scan: PreparedScan,
        reg: Registration,
        stamp: float,
        timings: Dict[str, float],
    ) -> Tuple[np.ndarray, bool]:
        """Apply the verdict to the state (keyframes, motion model, trust history): the one place
        a scan changes it. Returns the (4, 4) T_odom_sensor reported and whether the scan became
        a keyframe."""
        rigid = reg.aligned_points is None
        if verdict.action == 'init':  # the first scan defines odom
            pose = np.eye(4)
            self._start_keyframe(scan, pose, stamp)
            return pose, True
        if verdict.action == 'reanchor':  # restart tracking from this scan at the held pose
            pose = self.motion.pose if self.motion.pose is not None else kf.pose
            self.keyframes.clear_map()  # the old keyframes do not line up with the held pose
            self._start_keyframe(scan, pose, stamp)
            self.motion.hold(stamp)
            self.trust.reanchored(len(scan.dense))
            return pose.copy(), True
        if verdict.action == 'reject':  # keep the last good pose, stop extrapolating
            if rigid:  # (a deformation to the reference cloud never re-anchors: not counted)
                self.motion.hold(stamp)
                self.trust.rejected()
            last = self.motion.pose if self.motion.pose is not None else np.eye(4)
            return last.copy(), False
        if not rigid:  # the published pose is the rigid part of the deformation's affine part
            pose = kf.pose @ project_rigid(reg.transform)
            self.motion.update(pose, stamp)
            return pose, False
        # accepted; by_motion (only agreeing with the prediction): a scan flooded with spurious
        # returns never becomes a keyframe, and the motion model keeps extrapolating through it
        by_motion = verdict.by_motion
        pose = project_rigid(kf.pose @ reg.transform)  # orthonormal poses: no compounding drift
        self.motion.update(pose, stamp)
        if reg.pwan_engaged and self.config.mode == 'adaptive' and not by_motion:
            self.motion.hold(stamp)  # a recovered jump is not a velocity to extrapolate
        self.trust.accepted(reg.quality, len(scan.dense), reg.deviation, by_motion)
        new_kf = not by_motion and self.keyframes.due(reg.transform)
        if new_kf:
            t0 = time.perf_counter()
            self.keyframes.start(scan.dense, pose, lambda: scan.keyframe_cloud(self.num_threads))
            timings['map'] = (time.perf_counter() - t0) * 1e3
        return pose, new_kf

    def _estimate(
        self, work: _Work, verdict: Verdict, reg: Registration, update: tuple
    ) -> ScanEstimate:
        """The scan's :class:`ScanEstimate` (latency from ``work.t0``); update: (pose, whether it
        started a keyframe), :meth:`_update`'s."""
        stamp, scan, timings, deskewed = work.stamp, work.scan, work.timings, work.deskewed
        pose, new_keyframe = update
        accepted = verdict.action != 'reject'  # a re-anchored scan starts a keyframe: accepted
        path = _PATHS[verdict.action]
        if verdict.action == 'accept' and reg.pwan_engaged:
            path = 'pwan'
        weak = reg.weak if verdict.action == 'accept' else None
        reason = '; '.join(r for r in (verdict.reason, weak and weak.describe()) if r)
        latency_ms = (time.perf_counter() - work.t0) * 1e3
        filt = scan.filtered
        current = self.keyframes.current
        return ScanEstimate(
            stamp=stamp,
            pose=pose,
            path=path,
            accepted=accepted,
            pwan_engaged=reg.pwan_engaged,
            reason=reason,
            matched_ratio=reg.quality.matched_ratio,
            median_residual=reg.quality.median_residual,
            iterations=reg.iterations,
            num_points=len(filt.points),
            num_input=filt.num_input,
            num_far=filt.num_far,
            keyframe=current.index if current is not None else -1,
            new_keyframe=new_keyframe,
            latency_ms=latency_ms,
            timings_ms=timings,
            aligned_points=reg.aligned_points if accepted else None,
            pwan_starts=reg.starts,
            deskewed=deskewed,
            status='ok'
            if accepted and path != 'reanchor' and not (reg.flagged or weak)
            else 'warn',
            over_budget=path != 'pwan' and latency_ms > self.config.time_budget_ms,
            weak=weak,
        )

    # ------------------------------------------------------------------ keyframes
    def _start_keyframe(self, scan: PreparedScan, pose: np.ndarray, stamp: float) -> None:
        self.keyframes.start(scan.dense, pose, lambda: scan.keyframe_cloud(self.num_threads))
        self.motion.update(pose, stamp)

    def _reference_keyframe(self) -> Optional[Keyframe]:
        """The reference cloud as the fixed keyframe (once the voxel size is known), or None."""
        if self._reference_points is None:
            return None
        ref = filter_scan(
            self._reference_points, self.voxel_size, self.config.scan_max_points * 4, rng=self._rng
        ).points
        return self.keyframes.set_reference(PreparedCloud.build(ref, self.num_threads))


def usable_reference(points: np.ndarray, voxel_size: float = 0.0) -> np.ndarray:
    """The finite rows of a reference cloud (N, 3) (map frame, metres), checked to keep at least
    ``MIN_POINTS`` points through the scan filter at ``voxel_size`` (0 = automatic: at the
    largest automatic size, 1 m), so that it registers at any voxel size the scans choose.
    Raises ValueError (one line) otherwise."""
    ref = np.asarray(points, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[1] != 3:
        raise ValueError(f'the reference cloud must hold 3-D points, got shape {ref.shape}')
    ref = ref[np.isfinite(ref).all(axis=1)]
    voxel = voxel_size if voxel_size > 0.0 else 1.0
    usable = len(filter_scan(ref, voxel, len(ref) + 1).points) if len(ref) else 0
    if usable < MIN_POINTS:
        raise ValueError(
            f'the reference cloud has {usable} usable points at a {voxel:g} m voxel '
            f'({len(ref)} finite of {len(points)}), need {MIN_POINTS}'
        )
    return ref


def _agreeing(start: np.ndarray, h: float):
    """Whether a (4, 4) T_keyframe_scan is ``start`` to within the floors of the trust policy's
    agreement test (a twentieth of the distance threshold ``h``, a quarter degree): the same
    basin, polished to the same pose."""

    def agrees(transform: np.ndarray) -> bool:
        metres, degrees = _deviation(start, transform)
        return metres <= AGREEMENT_FLOOR_H * h and degrees <= AGREEMENT_FLOOR_DEG

    return agrees


def _deviation(predicted: np.ndarray, registered: np.ndarray) -> tuple:
    """(metres, degrees) between two (4, 4) T_keyframe_scan."""
    d = invert(predicted) @ registered
    return float(np.linalg.norm(d[:3, 3])), float(np.degrees(rotation_angle(d)))


#: the quality reported for scans that define a keyframe themselves, and for unmatched ones
_PERFECT = MatchQuality(1.0, 0.0)
_NOTHING = MatchQuality(0.0, float('inf'))
#: the estimate's path for each verdict ('accept': 'track', or 'pwan' when full PWAN ran)
_PATHS = {'init': 'init', 'accept': 'track', 'reject': 'rejected', 'reanchor': 'reanchor'}


def _unregistered(verdict: Verdict) -> Registration:
    """The stand-in registration of a scan judged before registering: a new keyframe matches
    itself, a collapsed scan nothing."""
    quality = _PERFECT if verdict.action in ('init', 'reanchor') else _NOTHING
    return Registration(np.eye(4), quality)


def _predicted(
    stamp: float, pose: np.ndarray, points: np.ndarray, reason: str, pwan_engaged: bool = True
) -> ScanEstimate:
    """The live answer for a scan during a background recovery: (4, 4) T_odom_sensor ``pose``
    predicted, not measured (not accepted, WARN)."""
    n = int(np.isfinite(np.asarray(points)).all(axis=1).sum())
    return ScanEstimate(
        stamp=stamp,
        pose=np.array(pose, dtype=np.float64),
        path='predicted',
        accepted=False,
        pwan_engaged=pwan_engaged,
        reason=reason,
        matched_ratio=0.0,
        median_residual=float('inf'),
        iterations=0,
        num_points=n,
        num_input=len(points),
        keyframe=-1,
        new_keyframe=False,
        latency_ms=0.0,
        status='warn',
    )
