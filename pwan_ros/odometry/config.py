"""Typed, validated configuration of the scan registration pipeline and node.

Field names are the ROS parameter names of ``register_node`` (and YAML keys of
``config/register.yaml``). Where a name also exists in :class:`pwan_ros.core.RegistrationConfig`
it means the same thing. Lengths in metres, angles in radians (REP-103). A value of 0 for
``voxel_size`` / ``distance_threshold`` means "automatic" (ROS parameters have no None).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping

MODES = ('adaptive', 'pwan')
TRANSFORMS = ('rigid', 'affine', 'nonrigid')
DIVERGENCES = ('mass', 'distance')
RELIABILITIES = ('auto', 'best_effort', 'reliable')


class ConfigError(ValueError):
    """An invalid parameter value; the message names the parameter and the allowed values."""


@dataclass(frozen=True)
class OdometryConfig:
    """Parameters of the registration pipeline (one per ROS parameter).

    mode: 'adaptive' (fast partial tracking, full PWAN when tracking is lost or untrustworthy)
        or 'pwan' (full PWAN on every scan, warm-started).
    transform / divergence / mass_ratio / steps / potential_updates / device / seed: passed to
        the PWAN core (see pwan_ros.core.RegistrationConfig). Non-rigid and affine transforms
        need ``reference_cloud`` (a scan-to-scan motion is rigid).
    distance_threshold: h in metres: correspondences farther than h do not count (the partial
        selection of the tracker, d-PWAN's threshold, and the matched ratio). 0: 2 x voxel_size.
    voxel_size: voxel-grid downsampling of each scan, metres. 0: automatic, 3.5 % of the median
        range of the first scan (isolated returns ignored), clamped to [0.02, 1.0] m.
    max_points: cap on points per scan after downsampling (random subset; huge clouds); a
        scan that becomes a keyframe keeps this many.
    source_points: points of each scan used to track it against the keyframe (random subset
        of the downsampled scan; the tracking cost is linear in it).
    pwan_max_points: cap on points per set for the full-PWAN path (its cost is linear in it).
    min_range / max_range: range gate in metres around the sensor (0: off).
    recovery_yaw_starts: full PWAN starts from the prediction and, if that does not match well,
        from the prediction turned by k x 360/n degrees about the sensor's z axis (n starts).
    min_matched_ratio: a registration matching fewer of the scan's points (within h) than this
        is rejected outright; tracking is also untrustworthy when the ratio falls below
        ``ratio_drop`` x the median of recent trusted scans.
    keyframe_distance / keyframe_angle: motion from the keyframe (m / rad) that starts a new one.
    odom_frame / base_frame: REP-105 frames of the published pose; base_frame '' = the cloud's
        frame_id. publish_tf: broadcast odom_frame -> base_frame on /tf.
    reliability: QoS reliability of the ``points`` subscription. 'auto' (default): best effort
        (depth 1, matches every publisher: lidar drivers publish best effort with the sensor-data
        profile) until the topic's publishers are all seen to be reliable (a bag player), then
        reliable (depth 5) -- like rosbag2's recorder, it adapts to the publishers, because a
        best-effort subscription loses clouds of ~1 MB and more from a reliable publisher under
        Fast DDS (measured). 'best_effort' / 'reliable': fixed; 'reliable' never matches a
        best-effort driver.
    reanchor_after: after this many consecutive rejected scans (the keyframe no longer matches:
        e.g. it was made from a bad scan, or the scene changed), the next scan becomes a new
        keyframe at the held pose and tracking resumes from there (path 'reanchor'; the motion
        during the rejected scans is not recovered). 0: never.
    reference_cloud: file (.ply .pcd .xyz .txt .csv .npy) to align every scan to instead of the
        previous scans (e.g. a part or a prior map), in odom_frame coordinates.
    time_budget_ms: per-scan time budget of the tracking path; the PWAN path is bounded by
        ``max(time_budget_ms, pwan_time_budget_ms)``.
    """

    mode: str = 'adaptive'
    transform: str = 'rigid'
    divergence: str = 'mass'
    mass_ratio: float = 0.8
    distance_threshold: float = 0.0
    voxel_size: float = 0.0
    max_points: int = 10000
    source_points: int = 10000
    pwan_max_points: int = 1500
    steps: int = 400
    potential_updates: int = 5
    device: str = 'auto'
    seed: int = 0
    min_range: float = 0.0
    max_range: float = 0.0
    recovery_yaw_starts: int = 4
    min_matched_ratio: float = 0.3
    ratio_drop: float = 0.6
    keyframe_distance: float = 1.0
    keyframe_angle: float = 0.2618
    odom_frame: str = 'odom'
    base_frame: str = ''
    publish_tf: bool = True
    reliability: str = 'auto'
    reanchor_after: int = 5
    reference_cloud: str = ''
    time_budget_ms: float = 100.0
    pwan_time_budget_ms: float = 20000.0

    def __post_init__(self):
        def check(ok, name, allowed):
            if not ok:
                raise ConfigError(f"invalid value {getattr(self, name)!r} for parameter '{name}': "
                                  f'expected {allowed}')

        def number(name):
            v = getattr(self, name)
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        check(self.mode in MODES, 'mode', ' | '.join(MODES))
        check(self.transform in TRANSFORMS, 'transform', ' | '.join(TRANSFORMS))
        check(self.divergence in DIVERGENCES, 'divergence', ' | '.join(DIVERGENCES))
        check(self.reliability in RELIABILITIES, 'reliability', ' | '.join(RELIABILITIES))
        check(number('mass_ratio') and 0.0 < self.mass_ratio <= 1.0, 'mass_ratio', 'a number in (0, 1]')
        for name in ('distance_threshold', 'voxel_size', 'min_range', 'max_range',
                     'keyframe_distance', 'keyframe_angle'):
            check(number(name) and getattr(self, name) >= 0.0, name, 'a number >= 0')
        check(self.max_range == 0.0 or self.max_range > self.min_range, 'max_range',
              '0 (off) or a number > min_range')
        for name in ('min_matched_ratio', 'ratio_drop'):
            check(number(name) and 0.0 <= getattr(self, name) <= 1.0, name, 'a number in [0, 1]')
        for name, low in (('max_points', 100), ('source_points', 100), ('pwan_max_points', 50),
                          ('steps', 1),
                          ('recovery_yaw_starts', 1), ('reanchor_after', 0),
                          ('potential_updates', 1), ('seed', 0)):
            v = getattr(self, name)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= low, name, f'an integer >= {low}')
        check(isinstance(self.device, str) and (self.device in ('auto', 'cpu', 'cuda')
                                                or self.device.startswith('cuda:')),
              'device', "auto | cpu | cuda | cuda:N")
        for name in ('time_budget_ms', 'pwan_time_budget_ms'):
            check(number(name) and getattr(self, name) > 0.0, name, 'a number > 0')
        for name in ('odom_frame', 'base_frame', 'reference_cloud'):
            check(isinstance(getattr(self, name), str), name, 'a string')
        check(bool(self.odom_frame) and not self.odom_frame.startswith('/'), 'odom_frame',
              'a non-empty frame id without a leading slash')
        check(not self.base_frame.startswith('/'), 'base_frame', 'a frame id without a leading slash')
        check(isinstance(self.publish_tf, bool), 'publish_tf', 'true | false')
        check(self.transform == 'rigid' or bool(self.reference_cloud), 'transform',
              "'rigid' unless reference_cloud is set (scan-to-scan motion is rigid)")

    def replace(self, **changes: Any) -> 'OdometryConfig':
        return dataclasses.replace(self, **changes)

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


# One-line descriptions of the parameters, used for ROS parameter descriptors and docs.
DESCRIPTIONS: Dict[str, str] = {
    'mode': 'adaptive: fast partial tracking + full PWAN on loss; pwan: full PWAN every scan',
    'transform': 'rigid | affine | nonrigid (the last two need reference_cloud)',
    'divergence': 'mass (m-PWAN, mass_ratio) | distance (d-PWAN, distance_threshold)',
    'mass_ratio': 'fraction of the smaller point set that must be matched (m-PWAN), (0, 1]',
    'distance_threshold': 'partial-matching distance h in metres; 0 = 2 x voxel_size',
    'voxel_size': 'voxel-grid downsampling in metres; 0 = automatic from the first scan',
    'max_points': 'cap on points per scan after downsampling (keyframes keep this many)',
    'source_points': 'points of each scan used to track it against the keyframe',
    'pwan_max_points': 'cap on points per set used by full PWAN',
    'steps': 'maximum PWAN transform updates per registration',
    'potential_updates': 'potential-network updates per transform update (u of Alg. 1)',
    'device': 'auto | cpu | cuda | cuda:N (auto: CUDA when available)',
    'seed': 'random seed of PWAN (sampling and network initialisation)',
    'min_range': 'drop points closer than this to the sensor (m); 0 = off',
    'max_range': 'drop points farther than this from the sensor (m); 0 = off',
    'recovery_yaw_starts': 'PWAN starts turned about the sensor z axis when recovering (1 = prediction only)',
    'min_matched_ratio': 'registrations matching a smaller fraction of the scan are rejected',
    'ratio_drop': 'tracking is untrustworthy below this fraction of the recent matched ratio',
    'keyframe_distance': 'translation from the keyframe (m) that starts a new keyframe',
    'keyframe_angle': 'rotation from the keyframe (rad) that starts a new keyframe',
    'odom_frame': 'fixed frame of the published pose (REP-105)',
    'base_frame': "moving frame of the published pose; '' = the cloud's frame_id",
    'publish_tf': 'broadcast odom_frame -> base_frame on /tf',
    'reliability': 'QoS reliability of the points subscription: auto (best effort, reliable once all '
                   'publishers are reliable) | best_effort | reliable (misses best-effort drivers)',
    'reanchor_after': 'consecutive rejected scans after which the next scan becomes a new keyframe '
                      'at the held pose (0 = never)',
    'reference_cloud': 'point file to align every scan to instead of the previous scans',
    'time_budget_ms': 'per-scan time budget of the tracking path (ms)',
    'pwan_time_budget_ms': 'time budget of one full-PWAN registration (ms)',
}
