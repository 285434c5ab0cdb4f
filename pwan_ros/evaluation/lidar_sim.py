"""Simulated spinning-LiDAR sequences written as rosbag2 directories (the package's demo data).

A procedural street scene (ground, building walls with gaps, boxes, poles, parked cars) is
ray-cast with Open3D's ``RaycastingScene`` from a sensor that moves along a smooth S-shaped
path with a little roll/pitch sway. Each scan has range noise, random dropouts, spurious
outlier points and a few moving objects (pedestrians, cars) that are not in the previous
scan at the same place, so consecutive scans overlap only partially. ``stress=True`` adds the
events real robots meet (:data:`STRESS_EVENTS`): a burst of spurious returns, a sensor blackout
during a fast turn, a glitch scan with far points.

Frames (REP-105): ground truth is ``T_world_base`` (parent ``world``, child ``base_link``);
the LiDAR sits at the base_link origin, so clouds are in ``base_link`` (metres). Bag topics:

- ``/points``        sensor_msgs/PointCloud2, fields x y z intensity (float32) ring (uint16)
- ``/ground_truth``  nav_msgs/Odometry (pose + body-frame twist)
- ``/clock``         rosgraph_msgs/Clock at ``clock_hz``

CLI: ``pwan_sim --output BAG_DIR [--scans 80 --rate-hz 10 ...]`` (flags = SimConfig fields).
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from pwan_ros.io import bags as bag_io
from pwan_ros.io.pointcloud2 import create_cloud
from pwan_ros.params import POINTS_TOPIC, check, param
from pwan_ros.odometry.preprocess import MIN_POINTS

__all__ = [
    'SimConfig',
    'SimScan',
    'SimResult',
    'STRESS_EVENTS',
    'stress_event',
    'ground_truth_pose',
    'simulate',
    'write_sim_bag',
]

EXTRAS_DTYPE = np.dtype([('intensity', np.float32), ('ring', np.uint16)])
#: the extra fields of a ``sweep`` scan: + per-point time (ns since the header stamp)
SWEEP_DTYPE = np.dtype([('intensity', np.float32), ('ring', np.uint16), ('t', np.uint32)])
#: a ``sweep`` revolution is simulated as this many azimuth sectors, each fired from the pose
#: of its own instant (a 4 degree sector lasts 1.1 ms at 10 Hz)
SWEEP_SECTORS = 90

#: the stress events of ``SimConfig(stress=True)``, at fractions of the sequence duration:
#: ``burst``: spurious returns (rain, dust) of 50-100 % of the real returns, for 3 scans;
#: ``turn``: the platform yaws by ``TURN_RAD`` within ``TURN_S`` seconds while the sensor is
#: blacked out (no scans), so the next scan is far from any constant-velocity prediction;
#: ``glitch``: one scan carries 10 returns kilometres away (a driver glitch).
STRESS_EVENTS = {'burst': 0.3, 'turn': 0.55, 'glitch': 0.8}
BURST_SCANS = 3
TURN_RAD = np.deg2rad(70.0)
TURN_S = 1.0
GLITCH_POINTS = 10


@dataclass(frozen=True)
class SimConfig:
    """Simulation parameters (CLI flags: same names with dashes); lengths in metres."""

    scans: int = param(80, 'number of scans in the bag', 1, 1_000_000)
    rate_hz: float = param(10.0, 'scan rate (Hz)', 0.0, 1000.0, low_open=True)
    beams: int = param(24, 'vertical channels of the simulated LiDAR', 1, 1024)
    azimuth_steps: int = param(720, 'rays per channel and revolution', 1, 100_000)
    fov_up_deg: float = param(
        12.0, 'upper edge of the vertical field of view (degrees)', -90.0, 90.0, low_open=True
    )
    fov_down_deg: float = param(
        -22.0,
        'lower edge of the vertical field of view (degrees; below fov_up_deg)',
        -90.0,
        90.0,
        high_open=True,
    )
    max_range: float = param(
        60.0, 'maximum range (m); returns beyond are dropped', 0.0, 10_000.0, low_open=True
    )
    range_noise: float = param(0.02, 'standard deviation of Gaussian range noise (m)', 0.0, 100.0)
    dropout: float = param(0.05, 'fraction of returns dropped at random', 0.0, 1.0, high_open=True)
    outliers: float = param(
        0.01, 'spurious points as a fraction of returns', 0.0, 1.0, high_open=True
    )
    moving_objects: int = param(4, 'pedestrians and cars moving through the scene', 0, 1000)
    speed: float = param(3.0, 'sensor speed along the path (m/s)', 0.0, 1000.0, low_open=True)
    seed: int = param(0, 'random seed of scene, noise and objects', 0, 2**32 - 1)
    start_time: float = param(1.7e9, 'stamp of the first scan (s since the epoch)', 0.0)
    clock_hz: float = param(
        100.0, '/clock messages per second of bag time', 0.0, 100_000.0, low_open=True
    )
    frame_id: str = param(
        'base_link', 'frame of the clouds (the sensor, REP-105 base_link)', fmt='frame_name'
    )
    world_frame: str = param('world', 'parent frame of the ground truth poses', fmt='frame_name')
    points_topic: str = param(
        POINTS_TOPIC, 'topic of the clouds (sensor_msgs/PointCloud2)', fmt='topic'
    )
    gt_topic: str = param(
        '/ground_truth', 'topic of the ground truth (nav_msgs/Odometry)', fmt='topic'
    )
    sweep: bool = param(
        False,
        'the sensor moves during each revolution (in SWEEP_SECTORS steps) and every '
        "point carries its time in a 't' field (uint32 ns since the header stamp, the Ouster "
        'convention): the distortion deskewing removes',
    )
    stress: bool = param(
        False,
        'add the stress events of a real drive (see STRESS_EVENTS): a burst of spurious '
        'returns, a sensor blackout during a fast turn, a glitch scan with far points',
    )

    def __post_init__(self):
        check(self, rules=SimConfig._rules)

    def _rules(self):
        """The cross-field rules (:func:`pwan_ros.params.check`): ``(ok, field, allowed)``."""
        yield self.fov_down_deg < self.fov_up_deg, 'fov_down_deg', 'a number below --fov-up-deg'
        yield from bag_io.topic_rules(self.points_topic, 'points_topic', self.gt_topic)
        yield (
            not self.stress or self.scans / self.rate_hz >= 4.0,
            'scans',
            f'>= {int(np.ceil(4.0 * self.rate_hz))} with --stress (a drive of at least 4 s at '
            f'{self.rate_hz:g} Hz keeps its events apart)',
        )


@dataclass(frozen=True)
class SimScan:
    """One scan: ``xyz`` (N, 3) float32 in base_link, ``extras`` (N,) intensity/ring, ``pose``
    T_world_base; ``event``: the stress event it carries ('' / 'burst' / 'glitch'); ``blackout``:
    the sensor delivered nothing (the scan is not written to the bag, its ground truth is);
    ``returns``: its points on surfaces (before the spurious ones); ``nearest``: the range of
    the nearest surface hit, within max_range or not (m; inf: none)."""

    stamp_ns: int
    xyz: np.ndarray
    extras: np.ndarray
    pose: np.ndarray
    event: str = ''
    blackout: bool = False
    returns: int = 0
    nearest: float = float('inf')


def stress_event(k: int, cfg: SimConfig) -> tuple[str, bool]:
    """(event, blackout) of scan ``k`` (see STRESS_EVENTS); ('', False) without ``cfg.stress``."""
    if not cfg.stress:
        return '', False
    centre = round(STRESS_EVENTS['turn'] * cfg.scans)  # the scan at the middle of the turn
    blackout = abs(k - centre) < round(
        0.5 * TURN_S * cfg.rate_hz
    )  # TURN_S from the last scan before to the next
    burst0 = int(round(STRESS_EVENTS['burst'] * cfg.scans))
    if burst0 <= k < burst0 + BURST_SCANS:
        return 'burst', blackout
    if k == int(round(STRESS_EVENTS['glitch'] * cfg.scans)):
        return 'glitch', blackout
    return '', blackout


def _turn_yaw(s, cfg: SimConfig):
    """Yaw (rad) the stress turn adds at time s: a smooth step of TURN_RAD over TURN_S seconds."""
    if not cfg.stress:
        return 0.0
    u = np.clip((s - STRESS_EVENTS['turn'] * cfg.scans / cfg.rate_hz) / TURN_S + 0.5, 0.0, 1.0)
    return TURN_RAD * u * u * (3.0 - 2.0 * u)


@dataclass(frozen=True)
class SimResult:
    """What :func:`write_sim_bag` wrote."""

    bag: pathlib.Path
    scans: int
    mean_points: float
    path_length_m: float
    seconds: float


# --------------------------------------------------------------------------- trajectory


def _path(s: np.ndarray, cfg: SimConfig):
    """Position (.., 3) at time s (seconds since start) on an S-shaped path through the street."""
    x = -0.5 * cfg.speed * cfg.scans / cfg.rate_hz + cfg.speed * s
    y = 2.0 * np.sin(2 * np.pi * s / 6.0)
    z = 1.8 + 0.05 * np.sin(2 * np.pi * s / 2.3)
    return np.stack([x, y, z], axis=-1)


def _rot(roll, pitch, yaw) -> np.ndarray:
    cr, sr, cp, sp, cy, sy = (
        np.cos(roll),
        np.sin(roll),
        np.cos(pitch),
        np.sin(pitch),
        np.cos(yaw),
        np.sin(yaw),
    )
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


def ground_truth_pose(s: float, cfg: SimConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T_world_base 4x4, body-frame linear velocity m/s, body-frame angular velocity rad/s) at
    time s."""
    h = 1e-3
    p0, p1, p2 = _path(np.array([s - h, s, s + h]), cfg)
    vel = (p2 - p0) / (2 * h)

    def attitude(t):
        d = (_path(np.array(t + h), cfg) - _path(np.array(t - h), cfg)) / (2 * h)
        return _rot(
            0.02 * np.sin(2 * np.pi * t / 3.1),
            0.015 * np.sin(2 * np.pi * t / 4.3),
            np.arctan2(d[1], d[0]) + _turn_yaw(t, cfg),
        )

    rot = attitude(s)
    pose = np.eye(4)
    pose[:3, :3], pose[:3, 3] = rot, p1
    dr = attitude(s + h) @ attitude(s - h).T  # world-frame rotation over 2h
    omega_world = np.array([dr[2, 1] - dr[1, 2], dr[0, 2] - dr[2, 0], dr[1, 0] - dr[0, 1]]) / (
        4 * h
    )
    return pose, rot.T @ vel, rot.T @ omega_world


# --------------------------------------------------------------------------- scene


def _box(o3d, size, center, yaw=0.0):
    mesh = o3d.geometry.TriangleMesh.create_box(*size)
    mesh.translate(-np.asarray(size) / 2.0)
    mesh.rotate(_rot(0.0, 0.0, yaw), center=(0, 0, 0))
    mesh.translate(center)
    return mesh


def _static_meshes(o3d, cfg: SimConfig, rng: np.random.Generator):
    """(mesh, reflectivity) of the static scene; the street runs along x, |y| < 12."""
    half = 0.5 * cfg.speed * cfg.scans / cfg.rate_hz + 40.0
    items = [(_box(o3d, (2 * half, 60.0, 0.2), (0.0, 0.0, -0.1)), 0.25)]  # ground, top at z=0
    for side in (-1, 1):  # building fronts with gaps and varying setback
        x = -half
        while x < half:
            length = rng.uniform(8.0, 20.0)
            depth = rng.uniform(6.0, 12.0)
            setback = rng.uniform(11.0, 15.0)
            height = rng.uniform(5.0, 15.0)
            items.append(
                (
                    _box(
                        o3d,
                        (length, depth, height),
                        (x + length / 2, side * (setback + depth / 2), height / 2),
                    ),
                    rng.uniform(0.4, 0.8),
                )
            )
            x += length + rng.uniform(2.0, 6.0)
    for _ in range(int(half / 2.5)):  # poles along both kerbs
        x, side = rng.uniform(-half, half), rng.choice([-1, 1])
        pole = o3d.geometry.TriangleMesh.create_cylinder(radius=0.12, height=5.0, resolution=12)
        pole.translate((x, side * rng.uniform(5.0, 6.5), 2.5))
        items.append((pole, 0.9))
    for _ in range(int(half / 4.0)):  # parked cars / boxes
        x, side = rng.uniform(-half, half), rng.choice([-1, 1])
        size = (rng.uniform(1.0, 4.5), rng.uniform(1.0, 2.0), rng.uniform(0.8, 1.8))
        items.append(
            (
                _box(
                    o3d,
                    size,
                    (x, side * rng.uniform(7.0, 10.0), size[2] / 2),
                    rng.uniform(-0.3, 0.3),
                ),
                rng.uniform(0.3, 1.0),
            )
        )
    return items


def _movers(cfg: SimConfig, rng: np.random.Generator):
    """Moving objects: (size, start xy, velocity xy)."""
    half = 0.5 * cfg.speed * cfg.scans / cfg.rate_hz
    out = []
    for k in range(cfg.moving_objects):
        if k % 2 == 0:  # car in the opposite lane
            size, vel = (4.2, 1.8, 1.5), (-rng.uniform(4.0, 8.0), 0.0)
            start = (rng.uniform(0.0, half + 20.0), -rng.uniform(3.5, 4.5))
        else:  # pedestrian crossing
            size, vel = (
                (0.5, 0.5, 1.75),
                (rng.uniform(-0.5, 0.5), rng.choice([-1, 1]) * rng.uniform(1.0, 1.6)),
            )
            start = (rng.uniform(-half, half), -np.sign(vel[1]) * 8.0)
        out.append((size, np.array(start), np.array(vel)))
    return out


def _ray_directions(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """Unit ray directions (beams*azimuth_steps, 3) in the sensor frame and their ring index."""
    elev = np.deg2rad(np.linspace(cfg.fov_down_deg, cfg.fov_up_deg, cfg.beams))
    azim = np.linspace(-np.pi, np.pi, cfg.azimuth_steps, endpoint=False)
    e, a = np.meshgrid(elev, azim, indexing='ij')
    dirs = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], axis=-1).reshape(
        -1, 3
    )
    ring = np.repeat(np.arange(cfg.beams, dtype=np.uint16), cfg.azimuth_steps)
    return dirs, ring


def simulate(cfg: SimConfig) -> Iterator[SimScan]:
    """Yield the scans of the sequence (deterministic for a given config)."""
    import open3d as o3d

    rng = np.random.default_rng(cfg.seed)
    static = [
        (o3d.t.geometry.TriangleMesh.from_legacy(m), r) for m, r in _static_meshes(o3d, cfg, rng)
    ]
    movers = _movers(cfg, rng)
    dirs, ring = _ray_directions(cfg)
    # sweep: the sector (0..SWEEP_SECTORS-1) of every ray, in firing (azimuth) order
    sector = (np.arange(dirs.shape[0]) % cfg.azimuth_steps) * SWEEP_SECTORS // cfg.azimuth_steps
    for k in range(cfg.scans):
        s = k / cfg.rate_hz
        scene, refl = _scene(o3d, static, movers, s)
        pose, _, _ = ground_truth_pose(s, cfg)
        origins, world_dirs = _world_rays(cfg, s, pose, dirs, sector)
        rays = np.hstack([origins, world_dirs]).astype(np.float32)
        hit = scene.cast_rays(o3d.core.Tensor(rays))
        xyz, extras = _returns(cfg, hit, (dirs, world_dirs, ring, sector), refl, rng)
        returns = xyz.shape[0]
        event, blackout = stress_event(k, cfg)
        xyz, extras = _with_spurious(cfg, event, xyz, extras, rng)
        stamp_ns = int(round(cfg.start_time * 1e9)) + int(round(s * 1e9))
        hits = hit['t_hit'].numpy()
        hits = hits[np.isfinite(hits)]
        yield SimScan(
            stamp_ns=stamp_ns,
            xyz=xyz.astype(np.float32),
            extras=extras,
            pose=pose,
            event=event,
            blackout=blackout,
            returns=returns,
            nearest=float(hits.min()) if hits.size else float('inf'),
        )


def _scene(o3d, static: list, movers: list, s: float) -> tuple:
    """(the raycasting scene at time ``s``, the reflectivity of each of its meshes)."""
    scene = o3d.t.geometry.RaycastingScene()
    refl = []
    for mesh, r in static:
        scene.add_triangles(mesh)
        refl.append(r)
    for size, start, vel in movers:
        xy = start + vel * s
        mesh = _box(o3d, size, (xy[0], xy[1], size[2] / 2), np.arctan2(vel[1], vel[0]))
        scene.add_triangles(o3d.t.geometry.TriangleMesh.from_legacy(mesh))
        refl.append(0.6)
    return scene, refl


def _world_rays(cfg: SimConfig, s: float, pose, dirs, sector) -> tuple:
    """(origins, directions) of the rays in the world: from the scan's pose, or with ``sweep``
    each sector from the pose of its instant within the revolution."""
    if not cfg.sweep:
        world_dirs = dirs @ pose[:3, :3].T
        return np.broadcast_to(pose[:3, 3], world_dirs.shape), world_dirs
    sector_poses = [
        ground_truth_pose(s + j / (SWEEP_SECTORS * cfg.rate_hz), cfg)[0]
        for j in range(SWEEP_SECTORS)
    ]
    rot = np.stack([p[:3, :3] for p in sector_poses])[sector]
    world_dirs = np.einsum('nij,nj->ni', rot, dirs)
    return np.stack([p[:3, 3] for p in sector_poses])[sector], world_dirs


def _returns(cfg: SimConfig, hit, rays: tuple, refl: list, rng) -> tuple:
    """(xyz (n, 3) in the sensor frame, extras) of the rays that hit within range and were not
    dropped, with range noise; rays = (sensor directions, world directions, ring, sector)."""
    dirs, world_dirs, ring, sector = rays
    rng_m = hit['t_hit'].numpy().astype(np.float64)
    geom = hit['geometry_ids'].numpy()
    normals = hit['primitive_normals'].numpy()
    keep = (
        np.isfinite(rng_m) & (rng_m < cfg.max_range) & (rng.random(rng_m.shape[0]) >= cfg.dropout)
    )
    r = rng_m[keep] + rng.normal(0.0, cfg.range_noise, keep.sum())
    xyz = dirs[keep] * r[:, None]
    cos_inc = np.abs(np.einsum('ij,ij->i', normals[keep], world_dirs[keep]))
    intensity = 100.0 * np.asarray(refl)[geom[keep]] * (0.3 + 0.7 * cos_inc) / (1.0 + 0.01 * r)
    extras = np.empty(xyz.shape[0], dtype=SWEEP_DTYPE if cfg.sweep else EXTRAS_DTYPE)
    extras['intensity'], extras['ring'] = intensity, ring[keep]
    if cfg.sweep:
        extras['t'] = np.round(sector[keep] * (1e9 / (SWEEP_SECTORS * cfg.rate_hz))).astype(
            np.uint32
        )
    return xyz, extras


def _with_spurious(cfg: SimConfig, event: str, xyz, extras, rng) -> tuple:
    """The scan with its spurious returns: ``cfg.outliers`` of its points (a burst: 50-100 %),
    or, on a glitch, :data:`GLITCH_POINTS` kilometres away."""
    fraction = rng.uniform(0.5, 1.0) if event == 'burst' else cfg.outliers
    n_out = int(round(fraction * xyz.shape[0]))
    if event == 'glitch':
        n_out = GLITCH_POINTS
    if not n_out:
        return xyz, extras
    d = rng.normal(size=(n_out, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    reach = (1e3, 1e4) if event == 'glitch' else (1.0, 0.5 * cfg.max_range)
    out_xyz = d * rng.uniform(*reach, (n_out, 1))
    out_ex = np.empty(n_out, dtype=extras.dtype)
    out_ex['intensity'] = rng.uniform(0.0, 5.0, n_out)
    out_ex['ring'] = rng.integers(0, cfg.beams, n_out)
    if cfg.sweep:
        out_ex['t'] = rng.integers(0, int(1e9 / cfg.rate_hz), n_out)
    return np.vstack([xyz, out_xyz]), np.concatenate([extras, out_ex])


def write_sim_bag(path, cfg: SimConfig = SimConfig(), storage: str = 'mcap') -> SimResult:
    """Simulate ``cfg`` and write the rosbag2 directory ``path`` (must not exist)."""
    t0 = time.perf_counter()
    store = bag_io.typestore()
    cloud_cls = store.types['sensor_msgs/msg/PointCloud2']
    start_ns = int(round(cfg.start_time * 1e9))
    end_ns = start_ns + int(round((cfg.scans - 1) / cfg.rate_hz * 1e9))
    clock_step = int(round(1e9 / cfg.clock_hz))
    next_clock = start_ns
    n_points, positions = [], []
    with bag_io.BagWriter(path, storage=storage) as writer:
        for k, scan in enumerate(simulate(cfg)):
            if not scan.blackout and scan.returns < MIN_POINTS:
                raise ValueError(
                    f'--max-range {cfg.max_range:g}: scan {k} has {scan.returns} returns on '
                    f'surfaces (a scan needs {MIN_POINTS}; its nearest surface is '
                    f'{scan.nearest:.3g} m away): raise --max-range'
                )
            while next_clock <= scan.stamp_ns:
                writer.write('/clock', next_clock, bag_io.clock(next_clock))
                next_clock += clock_step
            s = (scan.stamp_ns - start_ns) * 1e-9
            _, lin, ang = ground_truth_pose(s, cfg)
            writer.write(
                cfg.gt_topic,
                scan.stamp_ns,
                bag_io.odometry(scan.stamp_ns, scan.pose, cfg.world_frame, cfg.frame_id, lin, ang),
            )
            positions.append(scan.pose[:3, 3])
            if scan.blackout:
                continue
            msg = create_cloud(
                bag_io.header(scan.stamp_ns, cfg.frame_id),
                scan.xyz,
                scan.extras,
                msg_cls=cloud_cls,
            )
            writer.write(cfg.points_topic, scan.stamp_ns, msg)
            n_points.append(scan.xyz.shape[0])
        while next_clock <= end_ns:
            writer.write('/clock', next_clock, bag_io.clock(next_clock))
            next_clock += clock_step
    length = (
        float(np.linalg.norm(np.diff(np.array(positions), axis=0), axis=1).sum())
        if len(positions) > 1
        else 0.0
    )
    return SimResult(
        bag=pathlib.Path(path),
        scans=len(n_points),
        mean_points=float(np.mean(n_points)),
        path_length_m=length,
        seconds=time.perf_counter() - t0,
    )
