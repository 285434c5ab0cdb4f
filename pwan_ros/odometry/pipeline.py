"""Scan-to-keyframe registration pipeline: preprocess -> register -> pose (no ROS).

``ScanPipeline.process(points, stamp)`` turns one scan (sensor frame, metres) into a pose of
the sensor in the odometry frame. Two paths produce poses:

* ``track``: the fast partial refinement (:mod:`pwan_ros.odometry.keyframe_tracker`) from a
  constant-velocity prediction, against a keyframe that is kept for many scans.
* ``pwan``: full PWAN (:mod:`pwan_ros.odometry.pwan_recovery`), used in ``mode='adaptive'`` at start-up
  against a reference cloud and whenever tracking is lost or untrustworthy (matched ratio
  below ``min_matched_ratio``, or collapsing below ``ratio_drop`` x its recent median, or the
  residual jumping), and in ``mode='pwan'`` for every scan. Its result re-initialises tracking.

A registration that matches too little is rejected: the last good pose is kept (and
reported), the motion model stops extrapolating, and the next scan tries again. So is a scan
whose usable points collapse (fewer than ``POINT_COLLAPSE_RATIO`` x the median of the recent
accepted scans: a driver glitch, a half-delivered scan), before it can become a keyframe. After
``reanchor_after`` consecutive rejections the next scan becomes a new keyframe at the held pose
(path 'reanchor'), so a keyframe that no longer matches cannot make the odometry reject forever.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Deque, Dict, Optional

import numpy as np

from pwan_ros.odometry.keyframe_tracker import MatchQuality, PreparedCloud, track
from pwan_ros.odometry.motion_model import ConstantVelocityModel
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.pwan_recovery import PwanAligner
from pwan_ros.odometry.scan_filter import automatic_voxel_size, filter_scan
from scipy.spatial.transform import Rotation

from pwan_ros.geometry.se3 import invert, make_transform, project_rigid, rotation_angle, translation_norm

MIN_POINTS = 30
#: a scan keeping fewer usable points than this fraction of the recent accepted scans' median is
#: rejected (its content collapsed; registering it would match the few survivors "well")
POINT_COLLAPSE_RATIO = 0.3


class ScanError(ValueError):
    """A scan that cannot be registered at all (e.g. no valid points); the pipeline state is
    unchanged and the caller should count and report it."""


@dataclass
class Keyframe:
    """A registered scan that later scans are tracked against. pose: (4, 4) T_odom_keyframe."""

    cloud: PreparedCloud
    pose: np.ndarray
    index: int
    is_reference: bool = False


@dataclass(frozen=True)
class ScanEstimate:
    """Result of one scan.

    pose: (4, 4) T_odom_sensor (for a rejected scan: the last good pose). path: 'init' (first
    scan defines odom), 'track', 'pwan', 'rejected', or 'reanchor' (a new keyframe at the held
    pose after ``reanchor_after`` rejections). num_far: finite returns dropped as far glitches.
    accepted: whether ``pose`` comes from
    this scan. pwan_engaged: full PWAN ran for this scan. reason: why PWAN ran or the scan was
    rejected ('' otherwise). matched_ratio / median_residual: partial-matching quality against
    the keyframe (fraction of the scan's points within h; metres). aligned_points: non-rigid /
    affine modes only, (M, 3) deformed scan points in odom_frame (else None).
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
    affine: Optional[np.ndarray] = None
    pwan_starts: int = 0
    num_far: int = 0


class ScanPipeline:
    """Stateful scan registration. Not thread-safe: call ``process`` from one thread."""

    def __init__(self, config: OdometryConfig, reference_points: Optional[np.ndarray] = None,
                 num_threads: int = 2):
        self.config = config
        self.num_threads = num_threads
        self.motion = ConstantVelocityModel()
        self.pwan = PwanAligner(config)
        self._rng = np.random.default_rng(config.seed)
        self._reference_points = None
        if config.reference_cloud or reference_points is not None:
            if reference_points is None:
                raise ValueError('reference_cloud is set but no reference points were given')
            ref = np.asarray(reference_points, dtype=np.float64)
            if ref.ndim != 2 or ref.shape[1] != 3 or len(ref) < MIN_POINTS:
                raise ValueError(f'reference cloud must be (N>={MIN_POINTS}, 3), got {ref.shape}')
            self._reference_points = ref
        self.voxel_size = config.voxel_size
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget all state (keyframes, motion, PWAN warm start); the next scan starts a new odometry."""
        self.motion.reset()
        self.pwan.reset()
        self.keyframe: Optional[Keyframe] = None
        self._ratios: Deque[float] = collections.deque(maxlen=10)
        self._residuals: Deque[float] = collections.deque(maxlen=10)
        self._sizes: Deque[int] = collections.deque(maxlen=10)
        self._last_stamp: Optional[float] = None
        self._rejections = 0
        self._scan_index = 0
        self._keyframe_count = 0
        if self._reference_points is not None and self.voxel_size > 0.0:
            self._set_reference_keyframe()

    @property
    def h(self) -> float:
        """Partial-matching distance (m)."""
        return self.config.distance_threshold or 2.0 * self.voxel_size

    def _set_reference_keyframe(self) -> None:
        ref = filter_scan(self._reference_points, self.voxel_size, self.config.max_points * 4,
                          rng=self._rng).points
        self.keyframe = Keyframe(PreparedCloud.build(ref, self.num_threads), np.eye(4), 0, True)

    # ------------------------------------------------------------------ main entry
    def process(self, points: np.ndarray, stamp: float) -> ScanEstimate:
        """Register one scan. points: (N, 3) sensor frame (metres), may contain NaN rows.
        stamp: seconds. Raises ScanError for a scan with too few valid points."""
        t_start = time.perf_counter()
        timings: Dict[str, float] = {}
        if self._last_stamp is not None and stamp < self._last_stamp:
            raise ScanError(f'time went backwards ({stamp:.3f} s < {self._last_stamp:.3f} s); '
                            'call reset()')
        cfg = self.config
        pts = np.asarray(points)
        if pts.ndim != 2 or pts.shape[1] != 3:
            raise ScanError(f'expected (N, 3) points, got shape {pts.shape}')
        if self.voxel_size <= 0.0:
            finite = pts[np.isfinite(pts).all(axis=1)]
            if len(finite) < MIN_POINTS:
                raise ScanError(f'scan has {len(finite)} valid points, need {MIN_POINTS}')
            self.voxel_size = automatic_voxel_size(finite)
            if self._reference_points is not None:
                self._set_reference_keyframe()
        try:
            filt = filter_scan(pts, self.voxel_size, cfg.max_points, cfg.min_range, cfg.max_range,
                               rng=self._rng)
        except ValueError as exc:
            raise ScanError(str(exc)) from None
        if len(filt.points) < MIN_POINTS:
            raise ScanError(f'scan has {len(filt.points)} usable points after filtering '
                            f'({filt.num_input} received, {filt.num_finite} finite), '
                            f'need {MIN_POINTS}')
        # The scan is tracked with a subset of its points; the whole downsampled scan is
        # prepared (covariances, KD-tree) only when it becomes a keyframe.
        dense = filt.points
        if len(dense) > cfg.source_points:
            dense_idx = np.sort(self._rng.choice(len(dense), cfg.source_points, replace=False))
            scan = PreparedCloud.build(dense[dense_idx], self.num_threads)
        else:
            scan = PreparedCloud.build(dense, self.num_threads)
        timings['preprocess'] = (time.perf_counter() - t_start) * 1e3
        self._last_stamp = stamp
        self._scan_index += 1

        def finish(**kw) -> ScanEstimate:
            return ScanEstimate(stamp=stamp, num_points=len(filt.points), num_input=filt.num_input,
                                num_far=filt.num_far,
                                keyframe=self.keyframe.index if self.keyframe else -1,
                                latency_ms=(time.perf_counter() - t_start) * 1e3,
                                timings_ms=timings, **kw)

        if self.keyframe is None:
            # The first scan defines the odometry frame.
            self.keyframe = Keyframe(self._keyframe_cloud(scan, dense), np.eye(4),
                                     self._new_keyframe_id())
            self.motion.update(np.eye(4), stamp)
            return finish(pose=np.eye(4), path='init', accepted=True, pwan_engaged=False,
                          reason='', matched_ratio=1.0, median_residual=0.0, iterations=0,
                          new_keyframe=True)

        kf = self.keyframe
        if cfg.reanchor_after and self._rejections >= cfg.reanchor_after and not kf.is_reference:
            # The keyframe has stopped matching: restart tracking from this scan at the held pose.
            pose = self.motion.pose if self.motion.pose is not None else kf.pose
            self.keyframe = Keyframe(self._keyframe_cloud(scan, dense), pose.copy(), self._new_keyframe_id())
            self.motion.update(pose, stamp)
            self.motion.hold(stamp)
            why = f're-anchored on this scan after {self._rejections} rejected scans (motion since not recovered)'
            self._rejections = 0
            self._forget_history()
            self._sizes.append(len(dense))
            return finish(pose=pose.copy(), path='reanchor', accepted=True, pwan_engaged=False, reason=why,
                          matched_ratio=1.0, median_residual=0.0, iterations=0, new_keyframe=True)
        prediction = self.motion.predict(stamp)
        init = invert(kf.pose) @ prediction
        collapse = self._collapsed(len(dense))
        if collapse:
            return self._reject(stamp, finish, collapse, 0.0, float('inf'), 0, False, 0)
        if cfg.transform != 'rigid':
            return self._process_deformable(scan, dense, init, timings, finish)

        candidate = None
        starts = 0
        reason = ''
        pwan_engaged = False
        iterations = 0
        if cfg.mode == 'adaptive':
            t0 = time.perf_counter()
            tr = track(kf.cloud, scan, init, self.h, num_threads=self.num_threads)
            quality = tr.quality
            timings['track'] = (time.perf_counter() - t0) * 1e3
            candidate, iterations = (tr.transform, quality), tr.iterations
            reason = self._distrust(quality)
            if self._scan_index == 1 and kf.is_reference:
                reason = 'start-up against the reference cloud' + (f' ({reason})' if reason else '')
        else:
            reason = 'mode pwan'
        if reason:
            pwan_engaged = True
            best, its, starts = self._pwan_with_starts(kf, scan, init, timings)
            iterations += its
            if candidate is None or best[1].matched_ratio >= candidate[1].matched_ratio:
                candidate = best

        transform, quality = candidate
        path = 'pwan' if pwan_engaged else 'track'
        floor = self._acceptance_floor()
        if quality.matched_ratio < floor:
            why = (f'matched ratio {quality.matched_ratio:.2f} < required {floor:.2f}'
                   + (f' ({reason})' if reason else ''))
            return self._reject(stamp, finish, why, quality.matched_ratio, quality.median_residual,
                                iterations, pwan_engaged, starts)

        pose = project_rigid(kf.pose @ transform)   # keep poses orthonormal: no compounding drift
        self.motion.update(pose, stamp)
        if pwan_engaged and cfg.mode == 'adaptive':
            self.motion.hold(stamp)   # a recovered jump is not a velocity to extrapolate
        self._rejections = 0
        self._ratios.append(quality.matched_ratio)
        self._residuals.append(quality.median_residual)
        self._sizes.append(len(dense))
        new_kf = self._maybe_new_keyframe(scan, dense, pose, transform)
        return finish(pose=pose, path=path, accepted=True, pwan_engaged=pwan_engaged,
                      reason=reason, pwan_starts=starts, matched_ratio=quality.matched_ratio,
                      median_residual=quality.median_residual, iterations=iterations,
                      new_keyframe=new_kf)

    # ------------------------------------------------------------------ helpers
    def _reject(self, stamp: float, finish, why: str, ratio: float, residual: float, iterations: int,
                pwan_engaged: bool, starts: int) -> ScanEstimate:
        """Keep the last good pose, stop extrapolating, count the rejection."""
        self.motion.hold(stamp)
        self._rejections += 1
        if self._rejections >= 3:
            # The scene may have changed for good: stop comparing with the old scans.
            self._forget_history()
        last = self.motion.pose if self.motion.pose is not None else np.eye(4)
        return finish(pose=last.copy(), path='rejected', accepted=False, pwan_engaged=pwan_engaged,
                      reason=why, pwan_starts=starts, matched_ratio=ratio, median_residual=residual,
                      iterations=iterations, new_keyframe=False)

    def _forget_history(self) -> None:
        self._ratios.clear()
        self._residuals.clear()
        self._sizes.clear()

    def _collapsed(self, size: int) -> str:
        """Why the scan's usable point count collapsed against the recent scans ('' if not)."""
        if len(self._sizes) >= 3:
            ref = float(np.median(self._sizes))
            if size < POINT_COLLAPSE_RATIO * ref:
                return f'usable points collapsed ({size} vs recent {ref:.0f})'
        return ''

    def _pwan_with_starts(self, kf: Keyframe, scan: PreparedCloud, init: np.ndarray,
                          timings: Dict[str, float]):
        """Full PWAN from the prediction, then from rotations of it about the sensor's z axis
        (REP-103: z up), each polished by the partial tracker; the best by matched ratio is
        returned. Starts stop at pwan_time_budget_ms. Returns ((T_kf_scan, quality), iterations)."""
        cfg = self.config
        n = cfg.recovery_yaw_starts
        yaws = [0.0] + [2.0 * np.pi * k / n for k in range(1, n)]
        yaws = sorted(yaws, key=lambda a: min(a, 2.0 * np.pi - a))   # nearest first
        # With a history of good matches, the first start that matches about as well ends the
        # search; without one (start-up), every start is tried and the best one kept.
        good = max(self._acceptance_floor(), 0.9 * float(np.median(self._ratios))) \
            if self._ratios else float('inf')
        deadline = time.perf_counter() + cfg.pwan_time_budget_ms * 1e-3
        best, iterations = None, 0
        timings['pwan'] = timings['polish'] = 0.0
        for k, yaw in enumerate(yaws):
            start = init @ make_transform(Rotation.from_rotvec([0.0, 0.0, yaw]).as_matrix(), np.zeros(3))
            t0 = time.perf_counter()
            result = self.pwan.align(scan.points, kf.cloud.points, start, self.h, deadline)
            timings['pwan'] += (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            tr = track(kf.cloud, scan, result.transform, self.h, num_threads=self.num_threads)
            timings['polish'] += (time.perf_counter() - t0) * 1e3
            iterations += result.iterations + tr.iterations
            if best is None or tr.quality.matched_ratio > best[1].matched_ratio:
                best = (tr.transform, tr.quality)
            if best[1].matched_ratio >= good or time.perf_counter() > deadline:
                break
        return best, iterations, k + 1

    def _distrust(self, q: MatchQuality) -> str:
        """Why the tracking result is not trusted ('' if it is)."""
        cfg = self.config
        if q.matched_ratio < cfg.min_matched_ratio:
            return f'tracking lost (matched ratio {q.matched_ratio:.2f})'
        if len(self._ratios) >= 3:
            ref = float(np.median(self._ratios))
            if q.matched_ratio < cfg.ratio_drop * ref:
                return f'matched ratio collapsed ({q.matched_ratio:.2f} vs recent {ref:.2f})'
            res = float(np.median(self._residuals))
            if q.median_residual > 2.0 * res + 0.25 * self.h:
                return f'residual jump ({q.median_residual:.3f} m vs recent {res:.3f} m)'
        return ''

    def _acceptance_floor(self) -> float:
        """Smallest matched ratio accepted: min_matched_ratio, raised to ratio_drop x the recent
        median once there is a history (a result far below recent quality is not trusted,
        whichever path produced it)."""
        floor = self.config.min_matched_ratio
        if len(self._ratios) >= 3:
            floor = max(floor, self.config.ratio_drop * float(np.median(self._ratios)))
        return floor

    def _new_keyframe_id(self) -> int:
        self._keyframe_count += 1
        return self._keyframe_count

    def _keyframe_cloud(self, scan: PreparedCloud, dense: np.ndarray) -> PreparedCloud:
        return scan if len(scan) == len(dense) else PreparedCloud.build(dense, self.num_threads)

    def _maybe_new_keyframe(self, scan: PreparedCloud, dense: np.ndarray, pose: np.ndarray,
                            t_kf_scan: np.ndarray) -> bool:
        if self.keyframe.is_reference:
            return False
        cfg = self.config
        if (translation_norm(t_kf_scan) >= cfg.keyframe_distance
                or rotation_angle(t_kf_scan) >= cfg.keyframe_angle):
            self.keyframe = Keyframe(self._keyframe_cloud(scan, dense), pose, self._new_keyframe_id())
            return True
        return False

    def _process_deformable(self, scan: PreparedCloud, points: np.ndarray, init: np.ndarray,
                            timings: Dict[str, float], finish) -> ScanEstimate:
        """Affine / non-rigid registration of the scan to the fixed reference (full PWAN)."""
        t0 = time.perf_counter()
        deadline = time.perf_counter() + self.config.pwan_time_budget_ms * 1e-3
        result = self.pwan.align(points, self.keyframe.cloud.points, init, self.h, deadline)
        timings['pwan'] = (time.perf_counter() - t0) * 1e3
        aligned = result.transformed_source
        _, sq = self.keyframe.cloud.tree.batch_nearest_neighbor_search(aligned)
        dist = np.sqrt(np.asarray(sq, dtype=np.float64))
        inl = dist <= self.h
        ratio = float(inl.mean())
        med = float(np.median(dist[inl])) if inl.any() else float('inf')
        accepted = ratio >= self.config.min_matched_ratio
        kf_pose = self.keyframe.pose
        if accepted:
            # The published pose is the rigid part of the (affine part of the) deformation.
            pose = kf_pose @ project_rigid(result.transform)
            self.motion.update(pose, self._last_stamp)
        else:
            pose = self.motion.pose if self.motion.pose is not None else np.eye(4)
        return finish(pose=pose.copy(), path='pwan' if accepted else 'rejected',
                      accepted=accepted, pwan_engaged=True,
                      reason='' if accepted else
                      f'matched ratio {ratio:.2f} < min_matched_ratio '
                      f'{self.config.min_matched_ratio:.2f}',
                      matched_ratio=ratio, median_residual=med, iterations=result.iterations,
                      new_keyframe=False, pwan_starts=1,
                      aligned_points=(aligned @ kf_pose[:3, :3].T + kf_pose[:3, 3]) if accepted
                      else None,
                      affine=kf_pose @ result.transform)
