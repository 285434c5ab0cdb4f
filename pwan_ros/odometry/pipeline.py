"""PWAN odometry, scan by scan: preprocess -> register against a keyframe -> trust -> pose (no
ROS).

``OdometryPipeline.process(points, stamp)`` turns one scan (sensor frame, metres) into a pose of
the sensor in the odometry frame. Two paths produce poses:

* ``track``: the fast partial refinement (:mod:`pwan_ros.odometry.keyframe_tracker`) from a
  constant-velocity prediction, against the local map of the last ``local_map_keyframes``
  keyframes (:mod:`pwan_ros.odometry.keyframes`), kept until the next keyframe.
* ``pwan``: full PWAN (:mod:`pwan_ros.odometry.pwan_recovery`), used in ``mode='adaptive'`` at
  start-up against a reference cloud and whenever the trust policy (:mod:`pwan_ros.odometry.trust`)
  distrusts tracking, and in ``mode='pwan'`` for every scan. Its result re-initialises tracking.
  ``mode='tracking'`` never runs it (the baseline of the demo: what PWAN recovers).

A registration that matches too little is rejected — unless it agrees with the motion prediction as
closely as the recent scans did (a scan flooded with spurious returns matches few of its points
at the right pose; :meth:`TrustPolicy.agrees_with_motion`): the last good pose is kept (and
reported), the motion model stops extrapolating, and the next scan tries again. So is a scan whose
usable points collapse against the recent scans (a driver glitch, a half-delivered scan), before it
can become a keyframe. After ``reanchor_after`` consecutive rejections the next scan becomes a new
keyframe at the held pose (path 'reanchor'), so a keyframe that no longer matches cannot make the
odometry reject forever.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from pwan_ros.core.verify import check_pose
from pwan_ros.geometry.se3 import invert, project_rigid, rotation_angle, transform_points
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.deskew import deskew, motion_over
from pwan_ros.odometry.keyframe_tracker import MatchQuality, PreparedCloud, match_quality, track
from pwan_ros.odometry.keyframes import Keyframe, Keyframes
from pwan_ros.odometry.motion_model import ConstantVelocityModel
from pwan_ros.odometry.preprocess import MIN_POINTS, PreparedScan, ScanError, ScanPreparer
from pwan_ros.odometry.pwan_recovery import PwanAligner, recover
from pwan_ros.odometry.scan_filter import filter_scan
from pwan_ros.odometry.trust import TrustPolicy

__all__ = [
    'OdometryPipeline',
    'ScanEstimate',
    'ScanError',
    'Keyframe',
    'MIN_POINTS',
]


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
    (M, 3) deformed scan points in odom_frame (else None).
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


@dataclass
class _Outcome:
    """A registration of the current scan: T_keyframe_scan and how it was obtained."""

    transform: np.ndarray
    quality: MatchQuality
    iterations: int = 0
    pwan_engaged: bool = False
    reason: str = ''
    starts: int = 0


class OdometryPipeline:
    """Stateful scan registration. Not thread-safe: call ``process`` from one thread.

    num_threads: threads of small_gicp (KD-trees, covariances, GICP); 2 by default (nuScenes
    keyframes, 2 idle cores: 31 ms per scan against 47 ms with 1). With more than one thread
    small_gicp's parallel sums make results differ in the last bits from run to run; 1 makes them
    bit-reproducible."""

    def __init__(
        self,
        config: OdometryConfig,
        reference_points: Optional[np.ndarray] = None,
        num_threads: int = 2,
    ):
        self.config = config
        self.num_threads = num_threads
        self.motion = ConstantVelocityModel()
        self.pwan = PwanAligner(config)
        self.trust = TrustPolicy(config)
        self.keyframes = Keyframes(config, num_threads, lambda: self.voxel_size)
        self._rng = np.random.default_rng(config.seed)
        self.preparer = ScanPreparer(config, self._rng, num_threads)
        self._reference_points = None
        if config.reference_cloud or reference_points is not None:
            if reference_points is None:
                raise ValueError('reference_cloud is set but no reference points were given')
            ref = np.asarray(reference_points, dtype=np.float64)
            if ref.ndim != 2 or ref.shape[1] != 3 or len(ref) < MIN_POINTS:
                raise ValueError(f'reference cloud must be (N>={MIN_POINTS}, 3), got {ref.shape}')
            self._reference_points = ref
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget all state (keyframes, motion, trust history, PWAN warm start); the next scan
        starts a new odometry. The voxel size, once chosen, is kept."""
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
        registered."""
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
        est = self._process(points, stamp + t_ref, deskewed)
        if t_ref == 0.0:
            return est
        velocity = self.motion.velocity()
        pose = est.pose if velocity is None else est.pose @ invert(motion_over(velocity, t_ref))
        return dataclasses.replace(est, stamp=stamp, pose=pose)

    def _process(self, points: np.ndarray, stamp: float, deskewed: bool) -> ScanEstimate:
        t0 = time.perf_counter()
        if self._last_stamp is not None and stamp < self._last_stamp:
            raise ScanError(
                f'time went backwards ({stamp:.3f} s < {self._last_stamp:.3f} s); call reset()'
            )
        scan = self.preparer(points)
        timings = {'preprocess': (time.perf_counter() - t0) * 1e3}
        self._last_stamp = stamp
        self._scan_index += 1
        done = _Finisher(stamp, scan, t0, timings, self.keyframes, deskewed)
        kf = self.keyframe or self._reference_keyframe()
        if kf is None:  # the first scan defines odom
            return done(
                self._start_keyframe(scan, np.eye(4), stamp), 'init', _Outcome(np.eye(4), _PERFECT)
            )
        if self.trust.should_reanchor() and not kf.is_reference:
            return self._reanchor(scan, stamp, done)
        init = invert(kf.pose) @ self.motion.predict(stamp)
        collapse = self.trust.collapsed(len(scan.dense))
        if collapse:
            return self._reject(stamp, done, _Outcome(init, _NOTHING, reason=collapse))
        if self.config.transform != 'rigid':
            return self._deform(kf, scan, init, done)
        outcome = self._register(kf, scan, init, timings)
        deviation = _deviation(init, outcome.transform) if self.motion.predicting else None
        floor = self.trust.acceptance_floor()
        ratio = outcome.quality.matched_ratio
        if ratio < floor:
            why = f'matched ratio {ratio:.2f} < required {floor:.2f}'
            if (
                ratio >= self.config.min_matched_ratio
                and deviation is not None
                and self.trust.agrees_with_motion(deviation, self.distance_threshold)
            ):
                outcome.reason = (
                    why + f', accepted: agrees with the motion prediction ({deviation[0]:.3f} m, '
                    f'{deviation[1]:.2f} deg)' + (f' ({outcome.reason})' if outcome.reason else '')
                )
                return self._accept(kf, scan, stamp, outcome, done, deviation, by_motion=True)
            outcome.reason = why + (f' ({outcome.reason})' if outcome.reason else '')
            return self._reject(stamp, done, outcome)
        return self._accept(kf, scan, stamp, outcome, done, deviation)

    # ------------------------------------------------------------------ stages
    def _register(
        self, kf: Keyframe, scan: PreparedScan, init: np.ndarray, timings: Dict[str, float]
    ) -> _Outcome:
        """Track from the prediction; full PWAN when the trust policy distrusts the result (or
        always in mode 'pwan'). The better of the two by matched ratio wins."""
        best = None
        if self.config.mode in ('adaptive', 'tracking'):
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
            best = _Outcome(
                tr.transform,
                tr.quality,
                tr.iterations,
                reason=self.trust.distrust(tr.quality, self.distance_threshold),
            )
            if not best.reason and capture > 2.0 * self.distance_threshold:
                # a gap with no velocity to predict from: a wide search can settle on a pose near
                # the last one ("no motion" on a road); the self-check judges it before it is
                # trusted
                t1 = time.perf_counter()
                check = check_pose(transform_points(tr.transform, scan.dense), kf.local_map.points)
                timings['check'] = (time.perf_counter() - t1) * 1e3
                if check.status != 'ok':
                    best.reason = (
                        f'tracking across a {capture:.3g} m gap refused by its self-check: '
                        f'{check.reason}'
                    )
            if self._scan_index == 1 and kf.is_reference:
                best.reason = 'start-up against the reference cloud' + (
                    f' ({best.reason})' if best.reason else ''
                )
            if not best.reason or self.config.mode == 'tracking':
                return best
        reason = best.reason if best else 'mode pwan'
        deadline = time.perf_counter() + self.config.pwan_time_budget_ms * 1e-3
        good = self.trust.good_match()  # infinite without a history: then no global search either
        rec = recover(
            self.pwan,
            kf.local_map,
            scan.tracked,
            init,
            self.distance_threshold,
            self.config.recovery_yaw_starts,
            good,
            deadline,
            self.num_threads,
            use_global=self.config.recovery_global and np.isfinite(good),
        )
        timings['pwan'], timings['polish'] = rec.pwan_ms, rec.polish_ms
        iterations = rec.iterations + (best.iterations if best else 0)
        if rec.check is not None and rec.check.status != 'ok':
            # the recovery cannot vouch for its pose: nothing of this scan is accepted
            reason += f'; recovery refused by its self-check: {rec.check.reason}'
            return _Outcome(rec.transform, _NOTHING, iterations, True, reason, rec.starts)
        if best is None or rec.quality.matched_ratio >= best.quality.matched_ratio:
            best = _Outcome(rec.transform, rec.quality)
            if rec.origin == 'global':
                reason += '; recovered by global registration (no initial pose)'
            elif rec.origin != 'prediction':
                reason += f'; recovered from the {rec.origin} start'
        elif rec.global_status == 'refused':
            reason += '; global registration refused'
        return _Outcome(best.transform, best.quality, iterations, True, reason, rec.starts)

    def _capture_range(self) -> float:
        """How far (m) the scan may lie from the prediction: 2h while a velocity is extrapolated;
        without one (start-up, after a rejection or a hold) the distance the sensor can cover at
        ``max_speed`` since the last accepted pose."""
        if self.motion.predicting or self.motion.stamp is None:
            return 0.0
        return self.config.max_speed * max(self._last_stamp - self.motion.stamp, 0.0)

    def _accept(
        self,
        kf: Keyframe,
        scan: PreparedScan,
        stamp: float,
        outcome: _Outcome,
        done,
        deviation: Optional[tuple] = None,
        by_motion: bool = False,
    ) -> ScanEstimate:
        """Accept ``outcome``. ``by_motion``: accepted below the quality floor because it agrees
        with the motion prediction; such a scan (flooded with spurious returns) never becomes a
        keyframe, and the motion model keeps extrapolating through it."""
        pose = project_rigid(
            kf.pose @ outcome.transform
        )  # orthonormal poses: no compounding drift
        self.motion.update(pose, stamp)
        if outcome.pwan_engaged and self.config.mode == 'adaptive' and not by_motion:
            self.motion.hold(stamp)  # a recovered jump is not a velocity to extrapolate
        self.trust.accepted(outcome.quality, len(scan.dense), deviation, by_motion)
        new_kf = not by_motion and self.keyframes.due(outcome.transform)
        if new_kf:
            t0 = time.perf_counter()
            self.keyframes.start(scan.dense, pose, lambda: scan.keyframe_cloud(self.num_threads))
            done.timings['map'] = (time.perf_counter() - t0) * 1e3
        return done(
            pose, 'pwan' if outcome.pwan_engaged else 'track', outcome, new_keyframe=new_kf
        )

    def _reject(self, stamp: float, done, outcome: _Outcome) -> ScanEstimate:
        """Keep the last good pose, stop extrapolating, count the rejection."""
        self.motion.hold(stamp)
        self.trust.rejected()
        last = self.motion.pose if self.motion.pose is not None else np.eye(4)
        return done(last.copy(), 'rejected', outcome, accepted=False)

    def _reanchor(self, scan: PreparedScan, stamp: float, done) -> ScanEstimate:
        """The keyframe has stopped matching: restart tracking from this scan at the held pose."""
        pose = self.motion.pose if self.motion.pose is not None else self.keyframe.pose
        why = (
            f're-anchored on this scan after {self.trust.rejections} rejected scans '
            '(motion since not recovered)'
        )
        self.keyframes.clear_map()  # the old keyframes do not line up with the held pose
        self._start_keyframe(scan, pose, stamp)
        self.motion.hold(stamp)
        self.trust.reanchored(len(scan.dense))
        return done(pose.copy(), 'reanchor', _Outcome(np.eye(4), _PERFECT, reason=why))

    def _start_keyframe(self, scan: PreparedScan, pose: np.ndarray, stamp: float) -> np.ndarray:
        self.keyframes.start(scan.dense, pose, lambda: scan.keyframe_cloud(self.num_threads))
        self.motion.update(pose, stamp)
        return np.array(pose, dtype=np.float64)

    def _reference_keyframe(self) -> Optional[Keyframe]:
        """The reference cloud as the fixed keyframe (once the voxel size is known), or None."""
        if self._reference_points is None:
            return None
        ref = filter_scan(
            self._reference_points, self.voxel_size, self.config.scan_max_points * 4, rng=self._rng
        ).points
        return self.keyframes.set_reference(PreparedCloud.build(ref, self.num_threads))

    def _deform(self, kf: Keyframe, scan: PreparedScan, init: np.ndarray, done) -> ScanEstimate:
        """Affine / non-rigid registration of the scan to the fixed reference (full PWAN); the
        published pose is the rigid part of the deformation's affine part."""
        t0 = time.perf_counter()
        deadline = t0 + self.config.pwan_time_budget_ms * 1e-3
        result = self.pwan.align(
            scan.dense, kf.local_map.points, init, self.distance_threshold, deadline
        )
        done.timings['pwan'] = (time.perf_counter() - t0) * 1e3
        quality = match_quality(
            kf.local_map, result.transformed_source, np.eye(4), self.distance_threshold
        )
        outcome = _Outcome(result.transform, quality, result.iterations, True, starts=1)
        if quality.matched_ratio < self.config.min_matched_ratio:
            outcome.reason = (
                f'matched ratio {quality.matched_ratio:.2f} < min_matched_ratio '
                f'{self.config.min_matched_ratio:.2f}'
            )
            last = self.motion.pose if self.motion.pose is not None else np.eye(4)
            return done(last.copy(), 'rejected', outcome, accepted=False)
        pose = kf.pose @ project_rigid(result.transform)
        self.motion.update(pose, self._last_stamp)
        aligned = result.transformed_source @ kf.pose[:3, :3].T + kf.pose[:3, 3]
        return done(pose, 'pwan', outcome, aligned_points=aligned)


def _deviation(predicted: np.ndarray, registered: np.ndarray) -> tuple:
    """(metres, degrees) between two (4, 4) T_keyframe_scan."""
    d = invert(predicted) @ registered
    return float(np.linalg.norm(d[:3, 3])), float(np.degrees(rotation_angle(d)))


#: the quality reported for scans that define a keyframe themselves, and for unmatched ones
_PERFECT = MatchQuality(1.0, 0.0)
_NOTHING = MatchQuality(0.0, float('inf'))


class _Finisher:
    """Builds the :class:`ScanEstimate` of one scan (latency and keyframe taken at the call)."""

    def __init__(
        self,
        stamp: float,
        scan: PreparedScan,
        t0: float,
        timings: Dict[str, float],
        keyframes: Keyframes,
        deskewed: bool = False,
    ):
        self.stamp, self.scan, self.t0, self.timings, self.keyframes = (
            stamp,
            scan,
            t0,
            timings,
            keyframes,
        )
        self.deskewed = deskewed

    def __call__(
        self,
        pose: np.ndarray,
        path: str,
        outcome: _Outcome,
        accepted: bool = True,
        new_keyframe: Optional[bool] = None,
        aligned_points: Optional[np.ndarray] = None,
    ) -> ScanEstimate:
        filt = self.scan.filtered
        return ScanEstimate(
            stamp=self.stamp,
            pose=pose,
            path=path,
            accepted=accepted,
            pwan_engaged=outcome.pwan_engaged,
            reason=outcome.reason,
            matched_ratio=outcome.quality.matched_ratio,
            median_residual=outcome.quality.median_residual,
            iterations=outcome.iterations,
            num_points=len(filt.points),
            num_input=filt.num_input,
            num_far=filt.num_far,
            keyframe=self.keyframes.current.index if self.keyframes.current is not None else -1,
            new_keyframe=path in ('init', 'reanchor') if new_keyframe is None else new_keyframe,
            latency_ms=(time.perf_counter() - self.t0) * 1e3,
            timings_ms=self.timings,
            aligned_points=aligned_points,
            pwan_starts=outcome.starts,
            deskewed=self.deskewed,
        )
