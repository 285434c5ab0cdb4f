"""Offline runs: feed a sequence's scans to an in-process estimator (no DDS), for batch evaluation.

An *estimator* is any callable ``estimate(points_xyz, stamp) -> pose``:
``points_xyz`` (N, 3) float array in the scan's frame (metres, NaNs removed), ``stamp`` the
scan's header stamp in seconds; ``pose`` the 4x4 ``T_odom_base`` of that scan (REP-105; the
first scan is usually identity), or ``None`` to skip (counted as dropped).

``load_estimator(spec)``: ``'pwan'`` is the product's odometry (:class:`PipelineOdometry`: the
node's pipeline with the node's parameters, in process); ``'icp'`` is the built-in baseline
below (Open3D point-to-plane scan-to-scan ICP with a constant-velocity guess); ``'kiss_icp'`` is
KISS-ICP's Python pipeline (installed by the setup; ``pip install kiss-icp``);
``'package.module:factory'`` imports ``factory`` and calls it without arguments to obtain the
estimator.
"""

from __future__ import annotations

import importlib
import inspect
import time
from typing import Callable

import numpy as np

from pwan_ros.evaluation.run_record import RunRecord
from pwan_ros.evaluation.sequences import Scan, SequenceSource
from pwan_ros.io.trajectory import Trajectory
from pwan_ros.params import POINTS_TOPIC

__all__ = [
    'Estimator',
    'IcpOdometry',
    'KissIcpOdometry',
    'PipelineOdometry',
    'kiss_icp_available',
    'load_estimator',
    'run_offline',
]

Estimator = Callable[[np.ndarray, float], 'np.ndarray | None']


#: fewer downsampled points than this are no scan for the ICP baseline (normals need neighbours)
MIN_ICP_POINTS = 10


class IcpOdometry:
    """Baseline scan-to-scan odometry: voxel downsampling + Open3D point-to-plane ICP.

    voxel: downsampling voxel size (m); max_corr: correspondence distance (m).
    """

    def __init__(self, voxel: float = 0.4, max_corr: float = 1.0, iterations: int = 30):
        import open3d as o3d

        self._o3d = o3d
        self.voxel, self.max_corr, self.iterations = voxel, max_corr, iterations
        self._prev = None
        self._pose = np.eye(4)
        self._motion = np.eye(4)

    def _cloud(self, xyz):
        o3d = self._o3d
        pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(xyz, dtype=np.float64)))
        pc = pc.voxel_down_sample(self.voxel)
        pc.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=3 * self.voxel, max_nn=20))
        return pc

    def __call__(self, xyz: np.ndarray, stamp: float) -> np.ndarray | None:
        """The pose at this scan, or None (dropped) for a scan with too few points to fit a
        plane to (an empty cloud of a blackout or a driver glitch)."""
        o3d = self._o3d
        if len(xyz) < MIN_ICP_POINTS:  # before Open3D, which warns on stdout about empty data
            return None
        cur = self._cloud(xyz)
        if len(cur.points) < MIN_ICP_POINTS:
            return None
        if self._prev is not None:
            reg = o3d.pipelines.registration.registration_icp(
                cur,
                self._prev,
                self.max_corr,
                self._motion,
                o3d.pipelines.registration.TransformationEstimationPointToPlane(),
                o3d.pipelines.registration.ICPConvergenceCriteria(max_iteration=self.iterations),
            )
            self._motion = reg.transformation  # T_prev_cur
            self._pose = self._pose @ self._motion
        self._prev = cur
        return self._pose.copy()


class KissIcpOdometry:
    """KISS-ICP (Vizzo et al. 2023, its Python package, default configuration): scan-to-local-map
    point-to-point ICP with an adaptive threshold. ``max_range`` (m) as KISS-ICP's own setting
    (its voxel size follows as max_range / 100). Scans carry no per-point times here, so it
    runs without deskewing. ``num_threads``: its registration's threads (0 = all cores, its
    default; 1 makes a run reproducible to the last bit). Raises ImportError with the install
    line when kiss-icp is missing."""

    def __init__(self, max_range: float = 100.0, num_threads: int = 0):
        try:
            from kiss_icp.config import KISSConfig
            from kiss_icp.kiss_icp import KissICP
        except ImportError as exc:
            raise ImportError(f'KISS-ICP is not installed (pip install kiss-icp): {exc}') from None
        cfg = KISSConfig()
        cfg.data.max_range = float(max_range)
        cfg.data.deskew = False
        cfg.mapping.voxel_size = cfg.data.max_range / 100.0  # what KISS-ICP's own pipeline sets
        cfg.registration.max_num_threads = int(num_threads)
        self.max_range = float(max_range)
        self._odometry = KissICP(cfg)

    def __call__(self, xyz: np.ndarray, stamp: float) -> np.ndarray:
        pts = np.asarray(xyz, dtype=np.float64)
        self._odometry.register_frame(pts, np.zeros(len(pts)))
        return np.asarray(self._odometry.last_pose, dtype=np.float64).copy()


class PipelineOdometry:
    """The product's odometry in process: the node's :class:`~pwan_ros.odometry.odometer.Odometer`
    over :class:`~pwan_ros.odometry.pipeline.OdometryPipeline` with the node's parameters
    (``config``), per-point times read as the node reads them, the base frame through the
    sequence's static transforms. Recoveries run on the caller's thread (as the node's when the
    replay waits for each pose). With ``config.num_threads`` 1 (the fleet's) a run is
    reproducible to the last bit. Returns ``T_odom_base`` of each scan (the held pose of a
    rejected one), or None for a scan the node skips."""

    takes_scans = True  # run_offline hands it whole Scans and the sequence's static frames

    def __init__(self, config=None):
        from pwan_ros.odometry.config import OdometryConfig
        from pwan_ros.odometry.odometer import Odometer
        from pwan_ros.odometry.pipeline import OdometryPipeline
        from pwan_ros.geometry.frame_graph import FrameGraph
        from pwan_ros.odometry.sweep_times import SweepClock

        self.config = config or OdometryConfig()
        reference = None
        if self.config.reference_cloud:
            from pwan_ros.io.point_files import read_points

            reference = read_points(self.config.reference_cloud)
        pipeline = OdometryPipeline(self.config, reference)
        self.odometer = Odometer(pipeline)
        self.sweep_clock = SweepClock(self.config.deskew)
        self.frames = FrameGraph()

    def use_frames(self, frames) -> None:
        """The sequence's static transforms (a FrameGraph)."""
        self.frames = frames

    def process_scan(self, scan: Scan) -> np.ndarray | None:
        from pwan_ros.odometry.odometer import sensor_mount
        from pwan_ros.odometry.pipeline import ScanError

        cfg = self.config
        mount = sensor_mount(cfg.base_frame, cfg.odom_frame, scan.frame, self.frames, {})
        if mount.skip is not None:
            if not scan.frame:  # the node skips a cloud without a frame
                return None
            # the sequence's /tf_static is complete: no later scan can be used either
            if mount.skip[0] == 'tf':
                base = cfg.base_frame or scan.frame
                raise ValueError(f'no static transform {base} <- {scan.frame} (/tf_static)')
            raise ValueError(mount.skip[1].removesuffix('; scan skipped'))
        times = self.sweep_clock.read(scan.extras, scan.stamp)
        try:
            update = self.odometer.update(
                scan.xyz, scan.stamp, scan.frame, mount.t_base_sensor, times.offsets
            )
        except ScanError:  # the node skips it (and says why)
            return None
        return update.T_odom_base

    def __call__(self, xyz: np.ndarray, stamp: float) -> np.ndarray | None:
        frame = self.config.base_frame or 'base_link'
        return self.process_scan(Scan(xyz, stamp, np.zeros(len(xyz), dtype=[]), frame))


def kiss_icp_available() -> bool:
    """Whether the optional ``kiss-icp`` package can be imported."""
    import importlib.util

    return importlib.util.find_spec('kiss_icp') is not None


def load_estimator(spec: str, config=None) -> Estimator:
    """'pwan' (with ``config``, an OdometryConfig), 'icp', 'kiss_icp' or 'module:factory'
    (factory() returns the estimator callable)."""
    if spec == 'pwan':
        return PipelineOdometry(config)
    if spec == 'icp':
        return IcpOdometry()
    if spec == 'kiss_icp':
        try:
            return KissIcpOdometry()
        except ImportError as exc:
            raise ValueError(str(exc)) from None
    module, sep, attr = spec.partition(':')
    if not sep or not module or not attr:
        raise ValueError(
            f"--estimator must be 'pwan', 'icp', 'kiss_icp' or 'package.module:factory', got "
            f'{spec!r}'
        )
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f'cannot load estimator {spec!r}: {exc}') from exc
    if not _callable_with(factory, 0):
        raise ValueError(f'--estimator {spec}: {attr} is not a factory callable without arguments')
    estimate = factory()
    if not _callable_with(estimate, 2):
        raise ValueError(
            f'--estimator {spec}: {attr}() returned {type(estimate).__name__}, not an estimator '
            'callable as estimate(points_xyz, stamp)'
        )
    return estimate


def _callable_with(obj, n_args: int) -> bool:
    """Whether ``obj`` can be called with ``n_args`` positional arguments (as far as its
    signature tells; one without a readable signature is given the benefit of the doubt)."""
    if not callable(obj):
        return False
    try:
        inspect.signature(obj).bind(*[None] * n_args)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins)
        pass
    return True


def run_offline(
    source, estimate: Estimator, topic: str = POINTS_TOPIC, max_scans: int | None = None
) -> RunRecord:
    """Run ``estimate`` on every scan of ``source`` (a SequenceSource, or a bag path read on
    ``topic``) in order; latency = the estimator's wall time per scan."""
    if not isinstance(source, SequenceSource):
        source = SequenceSource('bag', str(source), topic=topic)
    if getattr(estimate, 'takes_scans', False):
        estimate.use_frames(source.static_frames())
    stamps, poses, latencies = [], [], []
    published = 0
    t_start = time.perf_counter()
    for scan in source.scans():
        if max_scans is not None and published >= max_scans:
            break
        published += 1
        if scan.invalid:  # a cloud the node skips: no pose
            continue
        t0 = time.perf_counter()
        pose = _estimated(estimate, scan, published)
        latencies.append((time.perf_counter() - t0) * 1e3)
        if pose is None:
            continue
        pose = np.asarray(pose, dtype=np.float64)
        if pose.shape != (4, 4):
            raise ValueError(f'estimator returned shape {pose.shape}, expected (4, 4)')
        stamps.append(scan.stamp)
        poses.append(pose)
    est = Trajectory.from_unsorted(
        np.array(stamps, dtype=np.float64), np.array(poses).reshape(-1, 4, 4)
    )
    return RunRecord(
        estimate=est,
        scans_published=published,
        latencies_ms=latencies,
        mode='offline',
        wall_s=time.perf_counter() - t_start,
        bag=source.path,
        topic=source.topic if source.kind == 'bag' else '',
    )


def _estimated(estimate: Estimator, scan: Scan, k: int):
    """The estimator's pose of scan number ``k`` (1-based); its failure as one line naming the
    scan, not the estimator's traceback."""
    try:
        if getattr(estimate, 'takes_scans', False):
            return estimate.process_scan(scan)
        xyz = scan.xyz[np.isfinite(scan.xyz).all(axis=1)]
        return estimate(xyz, scan.stamp)
    except Exception as e:
        raise ValueError(
            f'the estimator failed on scan {k} (stamp {scan.stamp:.6f} s, {len(scan.xyz)} '
            f'points): {type(e).__name__}: {e}'
        ) from e
