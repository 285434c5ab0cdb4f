"""Simulated indoor views: depth-camera fragments of a room, ray-cast with Open3D (metres).

What an RGB-D scan of part of a room looks like (3DMatch-style fragments): a camera at one
position turns through ``span`` degrees of yaw, and its depth images are fused into one cloud in
the camera's frame at the middle yaw (x forward, y left, z up; the sensor at the origin). Two
views from different places overlap partially; :func:`view_pair` returns them with the ground
truth T_a_b.

Rooms: ``'furnished'`` is an L-shaped 8 x 6 m room with a 3 x 2.5 m alcove, a desk, an office
chair, a bookshelf with books, a sofa, a round table, a plant, a floor lamp, a bed, a cabinet, a
radiator, a window niche, a door frame and a column; ``'box'`` is a plain 8 x 6 m box with six
pieces of box furniture, nearly symmetric under a half turn (the hard case for global
registration without viewpoints).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

__all__ = ['ROOMS', 'DepthCamera', 'room_meshes', 'render_view', 'view_pair']

ROOMS = ('furnished', 'box')
HEIGHT = 2.7


def _rz(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _box(o3d, size, center, yaw=0.0):
    mesh = o3d.geometry.TriangleMesh.create_box(*size)
    mesh.translate(-np.asarray(size, dtype=float) / 2.0)
    mesh.rotate(_rz(yaw), center=(0, 0, 0))
    return mesh.translate(center)


def _cylinder(o3d, radius, height, center):
    return o3d.geometry.TriangleMesh.create_cylinder(
        radius=radius, height=height, resolution=24
    ).translate(center)


def _shell(o3d, t=0.1, h=HEIGHT) -> list:
    """Floor, ceiling and walls of the 8 x 6 m main room (x in [-4, 4], y in [-3, 3])."""
    return [
        _box(o3d, (8, 6, t), (0, 0, -t / 2)),
        _box(o3d, (8, 6, t), (0, 0, h + t / 2)),
        _box(o3d, (t, 6, h), (-4 - t / 2, 0, h / 2)),
        _box(o3d, (8, t, h), (0, -3 - t / 2, h / 2)),
    ]


def _furnished(o3d) -> list:
    t, h = 0.1, HEIGHT
    m = _shell(o3d)
    # the alcove (x in [1, 4], y in [3, 5.5]) and the walls around it
    m += [
        _box(o3d, (3, 2.5, t), (2.5, 4.25, -t / 2)),
        _box(o3d, (3, 2.5, t), (2.5, 4.25, h + t / 2)),
        _box(o3d, (t, 8.5, h), (4 + t / 2, 1.25, h / 2)),
        _box(o3d, (5, t, h), (-1.5, 3 + t / 2, h / 2)),
        _box(o3d, (3, t, h), (2.5, 5.5 + t / 2, h / 2)),
        _box(o3d, (t, 2.5, h), (1 - t / 2, 4.25, h / 2)),
    ]
    # window niche, door frame
    m += [
        _box(o3d, (1.6, 0.35, 0.08), (-1.8, -2.85, 0.9)),
        _box(o3d, (1.8, 0.1, 0.15), (-1.8, -2.95, 2.1)),
        _box(o3d, (0.08, 0.1, 2.1), (-3.95, -1.0, 1.05)),
        _box(o3d, (0.08, 0.1, 2.1), (-3.95, -2.0, 1.05)),
        _box(o3d, (0.08, 1.1, 0.1), (-3.95, -1.5, 2.15)),
    ]
    # desk with legs and a monitor, office chair
    m += [
        _box(o3d, (1.6, 0.8, 0.04), (2.9, -2.4, 0.74)),
        _box(o3d, (0.6, 0.05, 0.38), (2.9, -2.65, 1.0)),
        _box(o3d, (0.08, 0.08, 0.2), (2.9, -2.65, 0.86)),
    ]
    m += [
        _box(o3d, (0.05, 0.05, 0.72), (2.9 + dx, -2.4 + dy, 0.36))
        for dx in (-0.75, 0.75)
        for dy in (-0.35, 0.35)
    ]
    m += [
        _cylinder(o3d, 0.25, 0.08, (2.6, -1.6, 0.48)),
        _cylinder(o3d, 0.03, 0.45, (2.6, -1.6, 0.23)),
        _box(o3d, (0.45, 0.05, 0.5), (2.6, -1.38, 0.8), 0.2),
    ]
    # bookshelf with books of different heights
    m += [_box(o3d, (0.35, 1.6, 0.03), (-3.8, 1.5, z)) for z in (0.4, 0.8, 1.2, 1.6, 2.0)]
    m += [_box(o3d, (0.35, 0.03, 2.0), (-3.8, 1.5 + s * 0.8, 1.0)) for s in (-1, 1)]
    rng = np.random.default_rng(5)
    for z in (0.4, 0.8, 1.2, 1.6):
        y = 0.75
        while y < 2.2:
            w, hb = rng.uniform(0.03, 0.09), rng.uniform(0.18, 0.36)
            m.append(_box(o3d, (0.25, w, hb), (-3.82, y, z + 0.015 + hb / 2)))
            y += w + rng.uniform(0.0, 0.05)
    # sofa, round table, plant, floor lamp, bed, cabinet, radiator, column
    m += [
        _box(o3d, (2.0, 0.9, 0.42), (-1.2, 2.4, 0.21)),
        _box(o3d, (2.0, 0.2, 0.45), (-1.2, 2.85, 0.65)),
        _box(o3d, (0.2, 0.9, 0.25), (-2.3, 2.4, 0.55)),
        _box(o3d, (0.2, 0.9, 0.25), (-0.1, 2.4, 0.55)),
    ]
    m += [
        _cylinder(o3d, 0.45, 0.04, (-1.2, 1.2, 0.45)),
        _cylinder(o3d, 0.04, 0.43, (-1.2, 1.2, 0.22)),
    ]
    m += [
        _cylinder(o3d, 0.18, 0.35, (0.4, 2.6, 0.17)),
        o3d.geometry.TriangleMesh.create_sphere(radius=0.4, resolution=16).translate(
            (0.4, 2.6, 0.75)
        ),
    ]
    m += [
        _cylinder(o3d, 0.015, 1.6, (-3.3, -2.5, 0.8)),
        o3d.geometry.TriangleMesh.create_cone(radius=0.22, height=0.3, resolution=24).translate(
            (-3.3, -2.5, 1.55)
        ),
        _cylinder(o3d, 0.15, 0.02, (-3.3, -2.5, 0.01)),
    ]
    m += [
        _box(o3d, (2.0, 1.4, 0.5), (2.8, 4.6, 0.25)),
        _box(o3d, (2.0, 0.1, 1.0), (2.8, 5.4, 0.5)),
        _box(o3d, (0.5, 1.2, 0.9), (3.7, 1.0, 0.45)),
        _box(o3d, (1.2, 0.1, 0.6), (-1.8, -2.93, 0.45)),
        _cylinder(o3d, 0.2, h, (0.3, -0.6, h / 2)),
    ]
    return m


def _box_room(o3d) -> list:
    t, h = 0.1, HEIGHT
    m = _shell(o3d) + [
        _box(o3d, (t, 6, h), (4 + t / 2, 0, h / 2)),
        _box(o3d, (8, t, h), (0, 3 + t / 2, h / 2)),
    ]
    return m + [
        _box(o3d, (1.6, 0.8, 0.75), (2.8, -1.5, 0.375)),
        _box(o3d, (0.4, 1.2, 2.0), (-3.75, 1.8, 1.0)),
        _box(o3d, (2.0, 0.9, 0.45), (-1.0, 2.5, 0.225)),
        _box(o3d, (1.0, 0.6, 0.5), (-2.5, -2.6, 0.25)),
        _box(o3d, (0.3, 0.3, h), (1.0, 2.85, h / 2)),
        _box(o3d, (1.2, 0.6, 0.75), (0.0, -0.3, 0.375), 0.3),
    ]


def room_meshes(kind: str = 'furnished') -> list:
    """The room's Open3D triangle meshes (world frame, metres, floor at z = 0)."""
    import open3d as o3d

    if kind not in ROOMS:
        raise ValueError(f'room must be one of {ROOMS}, got {kind!r}')
    return _furnished(o3d) if kind == 'furnished' else _box_room(o3d)


@dataclass(frozen=True)
class DepthCamera:
    """An RGB-D camera's depth images: ``pixels`` (width, height) over ``hfov_deg`` x
    ``vfov_deg``, tilted by ``pitch_deg``, range noise ``noise`` (m), returns in (0.3,
    ``max_range``) m; a fragment fuses ``frames`` of them at yaws spread over its span."""

    frames: int = 7
    hfov_deg: float = 58.0
    vfov_deg: float = 45.0
    pixels: Tuple[int, int] = (120, 90)
    noise: float = 0.005
    max_range: float = 6.0
    pitch_deg: float = -11.5


def render_view(
    meshes: list,
    position,
    yaw_deg: float,
    span_deg: float = 120.0,
    seed: int = 0,
    camera: DepthCamera = DepthCamera(),
) -> np.ndarray:
    """A fragment (n, 3) in the camera frame at yaw ``yaw_deg`` (the sensor at the origin, z up):
    ``camera.frames`` depth images from ``position`` (world, m) at yaws spread over ``span_deg``,
    fused on a 2 cm voxel grid."""
    frames, hfov_deg, vfov_deg, pixels, noise, max_range, pitch_deg = dataclasses.astuple(camera)
    import open3d as o3d

    scene = o3d.t.geometry.RaycastingScene()
    for mesh in meshes:
        scene.add_triangles(o3d.t.geometry.TriangleMesh.from_legacy(mesh))
    rng = np.random.default_rng(seed)
    pos = np.asarray(position, dtype=float)
    az = np.radians(np.linspace(-hfov_deg / 2, hfov_deg / 2, pixels[0]))
    el = np.radians(np.linspace(-vfov_deg / 2, vfov_deg / 2, pixels[1]) + pitch_deg)
    e, a = np.meshgrid(el, az, indexing='ij')
    rays = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], -1).reshape(-1, 3)
    out: List[np.ndarray] = []
    for yaw in np.radians(yaw_deg + np.linspace(-span_deg / 2, span_deg / 2, frames)):
        d = rays @ _rz(yaw).T
        hit = scene.cast_rays(
            o3d.core.Tensor(np.hstack([np.broadcast_to(pos, d.shape), d]).astype(np.float32))
        )
        t = hit['t_hit'].numpy().astype(float)
        ok = np.isfinite(t) & (t > 0.3) & (t < max_range)
        out.append(pos + d[ok] * (t[ok] + rng.normal(0.0, noise, ok.sum()))[:, None])
    world = np.asarray(
        o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.vstack(out)))
        .voxel_down_sample(0.02)
        .points
    )
    return (world - pos) @ _rz(np.radians(yaw_deg))


def view_pair(
    kind: str,
    a: Tuple[Tuple[float, float, float], float],
    b: Tuple[Tuple[float, float, float], float],
    span_deg: float = 120.0,
    seed: int = 0,
):
    """(view_a, view_b, T_a_b): fragments from ``a`` = (position, yaw_deg) and ``b`` of room
    ``kind``, each in its camera frame, and the pose of b's camera in a's (4, 4)."""
    meshes = room_meshes(kind)
    views, poses = [], []
    for k, (pos, yaw) in enumerate((a, b)):
        views.append(render_view(meshes, pos, yaw, span_deg, seed + k))
        pose = np.eye(4)
        pose[:3, :3], pose[:3, 3] = _rz(np.radians(yaw)), pos
        poses.append(pose)
    return views[0], views[1], np.linalg.inv(poses[0]) @ poses[1]
