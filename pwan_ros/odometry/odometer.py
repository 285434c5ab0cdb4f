"""What the odometry publishes (REP-105), from the pipeline's sensor poses; no ROS.

:class:`Odometer` wraps :class:`~pwan_ros.odometry.pipeline.OdometryPipeline` with the policy a
robot sees: ``odom`` is the base pose at the start; a change of the cloud's frame restarts the
pipeline from the last base pose (odom stays continuous), a timeline that restarted
(:data:`RESTART_SCANS` scans in a row stamped more than :data:`OUT_OF_ORDER_S` before the last
one, or the caller saying so: a bag or driver restarted) resets odom to the current pose, any
other scan stamped before the last one, or like the last one, is skipped; the base pose is
the sensor pose composed with the static ``T_base_sensor``; the twist is the base-frame velocity
between accepted scans; the pose covariance comes from the match quality.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
from scipy.spatial.transform import Rotation

from pwan_ros.geometry.se3 import invert, project_rigid
from pwan_ros.odometry.pipeline import OdometryPipeline, ScanError, ScanEstimate

#: a scan stamped up to this long (s) before the last one is late (delivered out of order, stamp
#: jitter) and skipped; further back, time was restarted (a bag looped, a driver restarted) and
#: odometry resets. Twice the longest sweep period in use (2 Hz). A scan stamped like the last
#: one is skipped as well: the search range and the motion model divide by the time between
#: scans, so equal stamps let a moved scan pass as standing still (4.5 m off on nuScenes).
OUT_OF_ORDER_S = 1.0
#: consecutive scans, in order among themselves, on a timeline more than OUT_OF_ORDER_S before
#: the last scan after which odometry believes time restarted and resets; fewer are skipped as
#: invalid (one scan stamped 0 among good ones reset odom to the origin and lost 1.8 m for good)
RESTART_SCANS = 3
#: notice keys that are errors (the node logs them and publishes the scan's status as ERROR)
ERROR_NOTICES = ('time',)


@dataclass(frozen=True)
class Mount:
    """Where a cloud's frame sits on the robot: ``base`` (the frame the odometry reports) and
    ``t_base_sensor`` (4, 4), or ``skip`` = (key, message, short reason) when the scan cannot be
    used (no frame, the base is odom_frame, no or an invalid static transform)."""

    base: str = ''
    t_base_sensor: Optional[np.ndarray] = None
    skip: Optional[Tuple[str, str, str]] = None


def sensor_mount(base_frame: str, odom_frame: str, frame: str, graph, invalid: dict) -> Mount:
    """The :class:`Mount` of a cloud in ``frame`` for the ``base_frame`` / ``odom_frame``
    parameters, from the static transforms ``graph`` (a FrameGraph) and the reasons of the
    invalid ones (``invalid``: (parent, child) -> why)."""
    frame = frame.lstrip('/')
    if not frame:
        return Mount(
            skip=('frame', 'PointCloud2 without header.frame_id skipped', 'cloud without frame_id')
        )
    base = base_frame or frame
    if base == odom_frame.lstrip('/'):
        text = (
            f"the cloud's frame '{frame}' is odom_frame: set base_frame, or odom_frame to "
            'another name (the pose is odom_frame -> base frame); scan skipped'
        )
        return Mount(skip=('frame', text, f"cloud frame '{frame}' is odom_frame"))
    t_base_sensor = graph.lookup(base, frame)
    if t_base_sensor is not None:
        return Mount(base, t_base_sensor)
    why = next(
        (f'{a} -> {b}: {r}' for (a, b), r in invalid.items() if {a, b} & {base, frame}), None
    )
    if why:
        text = f'invalid static transform on /tf_static ({why}), ignored; scan skipped'
        return Mount(skip=('tf', text, f'invalid static transform {why}'))
    text = f'no static transform {base} -> {frame} on /tf_static yet; scan skipped'
    return Mount(skip=('tf', text, f'missing static transform {base} -> {frame}'))


class SourceError(ScanError):
    """A scan from another source than the one followed (another frame on the topic)."""


@dataclass(frozen=True)
class OdometryUpdate:
    """One registered scan, ready to publish.

    T_odom_base / T_odom_sensor: (4, 4) poses in odom_frame (for a rejected scan: the held pose).
    twist: (linear (3,) m/s, angular (3,) rad/s) in the base frame, or None (unknown: first scan
    after a start or reset, or a rejected scan). pose_covariance: 36 floats, row-major 6x6 over
    (x, y, z, roll, pitch, yaw), inflated as for a held pose when the scan restarted the
    registration (its pose is carried over, not measured). deformed_points: affine / non-rigid
    modes, (M, 3) deformed scan in odom_frame (else None). estimate: the pipeline's result.
    notices: [(key, text)] of restarts and resets this scan caused, for the log.
    """

    T_odom_base: np.ndarray
    T_odom_sensor: np.ndarray
    twist: Optional[Tuple[np.ndarray, np.ndarray]]
    pose_covariance: List[float]
    deformed_points: Optional[np.ndarray]
    estimate: ScanEstimate
    notices: List[Tuple[str, str]]


class Odometer:
    """Odometry of one sensor: ``update(points, stamp, frame, T_base_sensor)`` per scan."""

    def __init__(self, pipeline: OdometryPipeline):
        self.pipeline = pipeline
        self.resets = 0  # restarts and resets so far
        self._base0 = np.eye(4)  # T_odom_base at the start of the current pipeline run
        self._t_base_sensor: Optional[np.ndarray] = None  # the mount of the last scan's frame
        self._last_pose = np.eye(4)  # last accepted T_odom_base
        self._frame: Optional[str] = None
        self._last_stamp: Optional[float] = None
        self._pose_stamp: Optional[float] = None
        self._rewound: List[float] = []  # consecutive scans stamped well before the last one
        self._time_restarted = False  # the caller saw the clock go back (time_restarted())
        self._foreign: List[str] = []  # consecutive scans in a frame other than _frame

    def time_restarted(self) -> None:
        """The clock went back (``/clock`` of a bag that looped): the next scan stamped before
        the last one resets odometry at once."""
        self._time_restarted = True

    def update(
        self,
        points: np.ndarray,
        stamp: float,
        frame: str,
        t_base_sensor: np.ndarray,
        offsets: Optional[np.ndarray] = None,
    ) -> OdometryUpdate:
        """Register one scan. points: (N, 3) in ``frame`` (metres); stamp: seconds; t_base_sensor:
        (4, 4) ``T_base_frame``; offsets: (N,) per-point times in seconds from ``stamp`` (deskew).
        Raises :class:`~pwan_ros.odometry.pipeline.ScanError` for a scan that cannot be registered
        (state unchanged except for a restart it triggered)."""
        self._check_source(frame)
        notices = self._check_stamp(stamp)
        if self._frame is not None and frame != self._frame:
            notices.append(
                (
                    'frame_change',
                    f"cloud frame changed from '{self._frame}' to '{frame}' ({RESTART_SCANS} "
                    'scans in a row): restarting registration from the last pose',
                )
            )
            self._restart(keep_pose=True)
        if notices and notices[0][0] == 'time':
            self._restart(keep_pose=False)
        self._frame = frame
        est = self.pipeline.process(points, stamp, offsets)
        self._last_stamp = stamp
        self._t_base_sensor = t_base_sensor
        return self._published(est, t_base_sensor, notices)

    def corrections(self) -> List[OdometryUpdate]:
        """The final estimates of the scans a finished background recovery settled (the scan
        that started it, then the scans answered with predictions meanwhile, re-tracked), in
        stamp order; each ``estimate.correction`` is (m, deg) from the pose published live.
        [] while none finished."""
        mount = self._t_base_sensor if self._t_base_sensor is not None else np.eye(4)
        return [
            self._published(est, mount, [])
            for outcome in self.pipeline.take_outcomes()
            for est in outcome.estimates
        ]

    def _published(
        self, est: ScanEstimate, t_base_sensor: np.ndarray, notices: List[Tuple[str, str]]
    ) -> OdometryUpdate:
        """The scan's estimate in odom_frame, with its twist and covariance."""
        stamp = est.stamp
        # est.pose: the sensor's motion since the run began, when the base was at _base0
        t_odom_run = self._base0 @ t_base_sensor  # T_odom_sensor at the start of the run
        t_odom_base = project_rigid(t_odom_run @ est.pose @ invert(t_base_sensor))
        twist = None
        if est.accepted:
            if self._pose_stamp is not None and stamp > self._pose_stamp:
                delta = invert(self._last_pose) @ t_odom_base
                dt = stamp - self._pose_stamp
                twist = (delta[:3, 3] / dt, Rotation.from_matrix(delta[:3, :3]).as_rotvec() / dt)
            if self._pose_stamp is None or stamp > self._pose_stamp:
                self._last_pose, self._pose_stamp = t_odom_base, stamp
        deformed = None
        if est.aligned_points is not None:
            deformed = est.aligned_points @ t_odom_run[:3, :3].T + t_odom_run[:3, 3]
        return OdometryUpdate(
            t_odom_base,
            t_odom_base @ t_base_sensor,
            twist,
            pose_covariance(
                est,
                self.pipeline.distance_threshold,
                held=bool(notices) or (est.status == 'warn' and est.weak is None),
                rotation=(t_odom_base @ t_base_sensor)[:3, :3],
            ),
            deformed,
            est,
            notices,
        )

    def _check_source(self, frame: str) -> None:
        """Raise :class:`SourceError` for a scan in another frame than the one followed, until
        :data:`RESTART_SCANS` in a row are in that frame (then the frame changed: the caller
        restarts from the last pose); two sources interleaved on one topic never get there."""
        if self._frame is None or frame == self._frame:
            self._foreign = []
            return
        self._foreign = [f for f in self._foreign if f == frame] + [frame]
        if len(self._foreign) >= RESTART_SCANS:
            self._foreign = []
            return
        raise SourceError(
            f"scan in frame '{frame}' while following frame '{self._frame}': two sources on "
            f"the topic, or the driver's frame changed (odometry follows '{frame}' after "
            f'{RESTART_SCANS} scans in a row in it); skipped'
        )

    def _check_stamp(self, stamp: float) -> List[Tuple[str, str]]:
        """Raise ScanError for a scan stamped like the last one or out of order; ``[('time',
        why)]`` when the timeline restarted (odometry resets), else []."""
        last = self._last_stamp
        if last is None or stamp > last:
            self._rewound.clear()
            self._time_restarted = False
            return []
        if stamp == last:
            raise ScanError(
                f'scan stamped {stamp:.6f} s like the last one (a repeated message, or a driver '
                'that does not stamp its scans): skipped'
            )
        if last - stamp <= OUT_OF_ORDER_S:
            raise ScanError(
                f'scan stamped {(last - stamp) * 1e3:.1f} ms before the last one (late, out of '
                'order): skipped'
            )
        if self._rewound and stamp <= self._rewound[-1]:
            self._rewound.clear()  # not in order among themselves: no timeline
        self._rewound.append(stamp)
        if self._time_restarted:
            why = 'the clock went back'
        elif len(self._rewound) >= RESTART_SCANS:
            why = f'{len(self._rewound)} scans in a row on the earlier timeline'
        else:
            raise ScanError(
                f'scan stamped {last - stamp:.3f} s before the last one ({stamp:.3f} < '
                f'{last:.3f} s): skipped as out of order; odometry resets only when '
                f'{RESTART_SCANS} scans in a row follow the earlier time'
            )
        self._rewound.clear()
        self._time_restarted = False
        return [
            (
                'time',
                f'time went backwards ({stamp:.3f} < {last:.3f} s; {why}): the timeline '
                'restarted (a bag looped, a driver restarted), resetting odometry at this scan',
            )
        ]

    def _restart(self, keep_pose: bool) -> None:
        """keep_pose: the new pipeline run starts at the last base pose (odom continuous, also
        when the new cloud frame has another mount); otherwise odom restarts at the current
        pose."""
        self.resets += 1
        self.pipeline.close()  # a background recovery ends first: it writes the motion model
        last, mount = self.pipeline.motion.pose, self._t_base_sensor
        if not keep_pose:
            self._base0 = np.eye(4)
        elif last is not None and mount is not None:
            self._base0 = project_rigid(self._base0 @ mount @ last @ invert(mount))
        self.pipeline.reset()
        self._last_stamp = self._pose_stamp = None
        if not keep_pose:
            self._last_pose = np.eye(4)


def pose_covariance(
    est: ScanEstimate, h: float, held: bool = False, rotation: Optional[np.ndarray] = None
) -> List[float]:
    """Row-major 6x6 pose covariance from the match quality (a heuristic, see docs/odometry.md):
    position sigma = 10 x median residual / sqrt(matched points) (m), rotation sigma a fifth of it
    (rad); both sigmas x 1e3 (the covariance x 1e6) for a held pose (a rejected scan, or
    ``held``: one that restarted the registration). A pose its scan does not pin along an axis
    (``est.weak``, in the sensor frame; ``rotation``: (3, 3) R_odom_sensor) gets, along that
    axis, the sigma times the square root of the constraint's condition number, at least h."""
    matched = max(est.matched_ratio * est.num_points, 1.0)
    res = est.median_residual if math.isfinite(est.median_residual) else h
    sigma_t = max(res, 1e-3) / math.sqrt(matched) * 10.0
    sigma_r = sigma_t / 5.0
    if held or not est.accepted:
        sigma_t, sigma_r = sigma_t * 1e3, sigma_r * 1e3
    cov = np.zeros((6, 6))
    cov[:3, :3] = sigma_t**2 * np.eye(3)
    cov[3:, 3:] = sigma_r**2 * np.eye(3)
    if est.weak is not None and est.accepted:
        axis = est.weak.axis if rotation is None else rotation @ est.weak.axis
        weak = max(sigma_t * math.sqrt(min(est.weak.condition, 1e12)), h)
        cov[:3, :3] += (weak**2 - sigma_t**2) * np.outer(axis, axis)
    return cov.ravel().tolist()
