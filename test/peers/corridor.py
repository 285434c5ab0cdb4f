"""A synthetic corridor, the textbook degenerate case of scan matching: ground, two long walls 4 m
apart, a ceiling-less 3 m height and nine boxes against the walls (the only structure that pins
the axis along them), seen by a 32-beam spinning lidar (Open3D ray casting, 1 cm range noise),
1 m above the ground, moving ``step`` metres along x per scan. Shared by the odometry tests (in
process) and the scan driver (over DDS)."""

import numpy as np

BOXES = list(zip(np.linspace(-8.0, 88.0, 9), (1, -1) * 5))  # (x, wall side)


def _scene():
    import open3d as o3d

    def box(size, centre):
        mesh = o3d.geometry.TriangleMesh.create_box(*size)
        mesh.translate(np.asarray(centre, float) - np.asarray(size, float) / 2.0)
        return o3d.t.geometry.TriangleMesh.from_legacy(mesh)

    scene = o3d.t.geometry.RaycastingScene()
    scene.add_triangles(box((140.0, 8.0, 0.2), (40.0, 0.0, -0.1)))  # ground, top at z=0
    for side in (-1, 1):
        scene.add_triangles(box((140.0, 0.2, 3.0), (40.0, side * 2.1, 1.5)))
    for x, side in BOXES:  # 1.2 x 0.8 x 1.2 m
        scene.add_triangles(box((1.2, 0.8, 1.2), (x, side * 1.6, 0.6)))
    return scene


_SCENE = None


def corridor_scan(k: int, step: float = 0.3, seed: int = 0):
    """(xyz (n, 3) float32 in the sensor frame, T_world_sensor (4, 4)) of scan ``k``."""
    global _SCENE
    import open3d as o3d

    if _SCENE is None:
        _SCENE = _scene()
    rng = np.random.default_rng(seed + k)
    pose = np.eye(4)
    pose[:3, 3] = (k * step, 0.0, 1.0)
    elev = np.deg2rad(np.linspace(-25.0, 15.0, 32))
    azim = np.linspace(-np.pi, np.pi, 1024, endpoint=False)
    e, a = np.meshgrid(elev, azim, indexing='ij')
    dirs = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], -1).reshape(-1, 3)
    rays = np.concatenate([np.broadcast_to(pose[:3, 3], dirs.shape), dirs], 1)
    hit = _SCENE.cast_rays(o3d.core.Tensor(rays.astype(np.float32)))
    r = hit['t_hit'].numpy().astype(np.float64)
    keep = np.isfinite(r) & (r < 60.0)
    xyz = dirs[keep] * (r[keep] + rng.normal(0.0, 0.01, keep.sum()))[:, None]
    return xyz.astype(np.float32), pose
