"""Typed, validated configuration of PWAN odometry: the single source of every parameter.

Each field carries its default, description and range (:func:`pwan_ros.params.param`); the ROS
parameters of the ``pwan_odometry`` node, the keys of ``config/odometry.yaml`` and the docs
table are generated from it. Lengths in metres, angles in radians (REP-103).

Names shared with :class:`pwan_ros.core.RegistrationConfig` mean the same thing (``transform``,
``divergence``, ``mass_ratio``, ``potential_updates``, ``device``, ``seed``, ``compile``);
``distance_threshold`` is the same distance h, but its automatic value differs: 0 here = 2 x
``scan_voxel_size`` (None in the core = 2 x the median nearest-neighbour spacing), and the core
always receives the resolved metres. ``pwan_<name>`` is the core's ``<name>`` for the full-PWAN
path (``pwan_steps`` =
``steps``, ``pwan_max_points`` = ``max_points``); ``scan_<name>`` is per-scan preprocessing, which
the core does not do the same way (``scan_voxel_size`` 0 = automatic, never off).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping

from pwan_ros.core.config import RegistrationConfig
from pwan_ros.params import check, param, specs

#: the core's ``compile`` field, passed through unchanged (one description)
_CORE_COMPILE = specs(RegistrationConfig)['compile'][1]

MODES = ('adaptive', 'pwan', 'tracking')
TRANSFORMS = ('rigid', 'affine', 'nonrigid')
DIVERGENCES = ('mass', 'distance')
DESKEW_MODES = ('auto', 'on', 'off')
RELIABILITIES = ('auto', 'best_effort', 'reliable')


class ConfigError(ValueError):
    """An invalid parameter value; the message names the parameter and the allowed values."""


@dataclass(frozen=True)
class OdometryConfig:
    """Parameters of PWAN odometry (:class:`pwan_ros.odometry.pipeline.OdometryPipeline` and the
    ``pwan_odometry`` node), one per ROS parameter. See each field's spec (``specs()``)."""

    mode: str = param(
        'adaptive',
        'adaptive: fast partial tracking against a keyframe, full PWAN when tracking is lost or '
        'untrustworthy; pwan: full PWAN on every scan, from the tracked pose on a short '
        'schedule where tracking trusts it (0.2-0.5 s such a scan on a CPU); '
        'tracking: tracking only, PWAN never runs (a baseline that shows what PWAN recovers)',
        choices=MODES,
    )
    transform: str = param(
        'rigid',
        'transform of the PWAN core; affine and nonrigid need reference_cloud '
        '(a scan-to-scan motion is rigid)',
        choices=TRANSFORMS,
    )
    divergence: str = param(
        'distance',
        'distance: d-PWAN, match pairs within distance_threshold (needs no '
        'overlap guess: after a blackout or along a corridor the overlap is unknown); mass: '
        'm-PWAN, match mass_ratio of the smaller set (can slide a scan along a street when the '
        'true overlap is below mass_ratio)',
        choices=DIVERGENCES,
    )
    mass_ratio: float = param(
        0.8, 'fraction of the smaller point set matched by m-PWAN', 0.0, 1.0, low_open=True
    )
    distance_threshold: float = param(
        0.0,
        'partial-matching distance h (m): pairs farther apart do not count '
        '(tracking, d-PWAN, matched ratio); 0 = 2 x scan_voxel_size',
        0.0,
        1000.0,
    )
    deskew: str = param(
        'auto',
        'motion compensation of each scan with the constant-velocity model: auto = when '
        'the cloud has a per-point time field (t, time, timestamp, offset_time: Ouster, Velodyne, '
        'Hesai, Livox conventions), on = the same but warn when a cloud has none, off',
        choices=DESKEW_MODES,
    )
    scan_voxel_size: float = param(
        0.0,
        'voxel-grid downsampling of each scan (m); 0 = automatic: 3.5 % of the '
        "median range of the first registered scan's returns within the range gate (isolated "
        'returns ignored), clamped to [0.02, 1.0] m',
        0.0,
        100.0,
    )
    scan_max_points: int = param(
        10000,
        'cap on points per scan after downsampling (random subset); a keyframe keeps this many',
        100,
        10_000_000,
    )
    source_points: int = param(
        5000,
        'points of each scan tracked against the keyframe (random subset; the '
        'tracking cost is linear in it; thousands already fix the 6 degrees of freedom)',
        100,
        10_000_000,
    )
    pwan_max_points: int = param(
        1500,
        "cap on points per set for full PWAN (the core's max_points; its cost is linear in it)",
        50,
        1_000_000,
    )
    pwan_steps: int = param(
        400,
        "maximum transform updates of one full-PWAN registration (the core's steps)",
        1,
        1_000_000,
    )
    potential_updates: int = param(
        3, 'potential-network updates per transform update (u of Alg. 1)', 1, 10_000
    )
    device: str = param(
        'auto',
        'compute device of PWAN: auto = the CPU, cpu, cuda or cuda:N (the rates to expect on '
        'each: docs/odometry.md)',
        fmt='device',
    )
    seed: int = param(0, 'random seed of PWAN and of the point subsets', 0, 2**31 - 1)
    num_threads: int = param(
        0,
        "CPU threads of the registration, small_gicp's (tracking, maps) and PWAN's; 0 = "
        'automatic: small_gicp 2 (31 against 47 ms a nuScenes scan), PWAN 1 on up to 2 cores, '
        'else half the cores, at most 4; 1 = results reproducible to the last bit (parallel sums '
        'differ in the last bits from run to run, which odometry can grow to centimetres)',
        0,
        256,
    )
    compile: str = param('auto', _CORE_COMPILE.description, choices=_CORE_COMPILE.choices)
    min_range: float = param(
        0.1,
        'drop points closer than this to the sensor (m; 0 = off). No lidar or depth camera '
        "measures there: such points are drivers' no-return encodings (zeros, a ring at the "
        'beam origin) or the robot itself',
        0.0,
        1e4,
    )
    max_range: float = param(
        0.0, 'drop points farther than this from the sensor (m); 0 = off', 0.0, 1e4
    )
    recovery_yaw_starts: int = param(
        4,
        'full PWAN starts from the prediction and, if that does not match well, '
        'from it turned by k x 360/n degrees about the sensor z axis (n starts)',
        1,
        36,
    )
    recovery_global: bool = param(
        True,
        'when no start of a full-PWAN recovery matches well, also register from no '
        'initial pose (FPFH hypotheses chosen by the partial objective; a kidnapped '
        'robot, a jump far beyond the prediction); kept unless it is refused',
    )
    min_matched_ratio: float = param(
        0.3,
        "registrations matching a smaller fraction of the scan's points "
        '(within h) are rejected and the last good pose is kept',
        0.0,
        1.0,
    )
    ratio_drop: float = param(
        0.6,
        'a matched ratio below ratio_drop x the median of recent accepted scans '
        'makes tracking untrustworthy (full PWAN runs) and is never accepted',
        0.0,
        1.0,
    )
    max_speed: float = param(
        10.0,
        'fastest the sensor moves (m/s): while no velocity is known (start-up, after '
        'a rejected scan) tracking searches as far as max_speed x the time since the '
        'last accepted scan, coarse to fine',
        0.0,
        1e3,
    )
    keyframe_distance: float = param(
        1.0, 'translation from the keyframe (m) that starts a new keyframe', 0.0, 1e4
    )
    keyframe_angle: float = param(
        0.2618, 'rotation from the keyframe (rad) that starts a new keyframe', 0.0, math.pi
    )
    local_map_keyframes: int = param(
        3,
        'recent keyframes whose union (voxel-downsampled, capped at scan_max_points) '
        'the scans are tracked against (1 = the newest keyframe only); a re-anchor '
        'starts a new map; ignored with reference_cloud',
        1,
        50,
    )
    odom_frame: str = param(
        'odom', 'fixed frame of the published pose (REP-105)', fmt='frame_name'
    )
    base_frame: str = param(
        '',
        "moving frame of the published pose; '' = the cloud's frame_id, otherwise a "
        'static transform base_frame -> cloud frame must be on /tf_static',
        fmt='frame_id',
    )
    publish_tf: bool = param(True, 'broadcast odom_frame -> base_frame on /tf')
    reliability: str = param(
        'auto',
        'QoS reliability of the points subscription: auto = a reliable and a '
        'best-effort reader together, so bag players (reliable) and lidar drivers (best '
        'effort) are both heard from their first scan; reliable never matches a '
        'best-effort driver',
        choices=RELIABILITIES,
    )
    reanchor_after: int = param(
        5,
        'consecutive rejected scans after which the next scan becomes a new keyframe '
        'at the held pose (the motion in between is not recovered); 0 = never',
        0,
        1_000_000,
    )
    reference_cloud: str = param(
        '',
        'point file (.ply .pcd .xyz .txt .csv .npy) in odom_frame to align every '
        "scan to instead of the previous scans (a part, a prior map); '' = none",
    )
    time_budget_ms: float = param(
        100.0,
        'per-scan time budget of the tracking path (ms); scans over it are '
        'counted in the diagnostics',
        0.0,
        1e6,
        low_open=True,
    )
    pwan_time_budget_ms: float = param(
        20000.0,
        'time budget of one full-PWAN recovery, all yaw starts (ms)',
        0.0,
        1e7,
        low_open=True,
    )

    def __post_init__(self):
        check(self, ConfigError, flags=False, rules=OdometryConfig._rules)

    def _rules(self):
        """The cross-field rules (:func:`pwan_ros.params.check`): ``(ok, field, allowed)``."""
        yield (
            self.max_range == 0.0 or self.max_range > self.min_range,
            'max_range',
            '0 (off) or a number > min_range',
        )
        yield (
            self.base_frame.lstrip('/') != self.odom_frame.lstrip('/'),
            'base_frame',
            'a frame other than odom_frame (the pose is odom_frame -> base_frame)',
        )
        yield (
            self.transform == 'rigid' or bool(self.reference_cloud),
            'transform',
            "'rigid' unless reference_cloud is set (scan-to-scan motion is rigid)",
        )

    def replace(self, **changes: Any) -> 'OdometryConfig':
        return dataclasses.replace(self, **changes)

    @classmethod
    def specs(cls):
        """``name -> (default, ParamSpec)`` of every parameter."""
        return specs(cls)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> 'OdometryConfig':
        """Build from a mapping (e.g. a YAML file's ros__parameters); unknown keys are errors."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f'unknown parameter(s): {", ".join(unknown)}')
        return cls(**dict(values))

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)
