"""Triangle meshes in and out: PLY (plyfile) and Wavefront OBJ; the vertices are the points.

:func:`pwan_ros.io.point_files.read_mesh` -> :class:`Mesh` (vertices (V, 3) float64 in the file's
units, triangles (F, 3) int64 0-based, polygons fanned; ``None`` where the file has no faces).
:func:`pwan_ros.io.point_files.write_points` with ``triangles`` writes the vertices (NaN rows
kept: the input order is the contract) with the triangles whose vertices are all finite.

OBJ is parsed here: Open3D's reader rounds vertices to float32 (4500000.12 m -> 4500000.0) and
drops vertices no face uses; meshio's refuses any file whose normals outnumber its vertices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pwan_ros.core.errors import PwanInputError


@dataclass
class Mesh:
    vertices: np.ndarray  # (V, 3) float64
    triangles: Optional[np.ndarray]  # (F, 3) int64, 0-based; None: a point file


def _fan(polygons) -> np.ndarray:
    """(F, 3) triangles of polygons (lists of vertex indices) fanned from their first vertex."""
    tris = [(p[0], p[k], p[k + 1]) for p in polygons for k in range(1, len(p) - 1)]
    return np.asarray(tris, dtype=np.int64).reshape(-1, 3)


def _obj_index(token: str, count: int, path: str, line_no: int) -> int:
    """0-based vertex index of an OBJ face token ('7', '7/2', '7//3', '-1/..': relative)."""
    try:
        i = int(token.split('/')[0])
    except ValueError:
        raise PwanInputError(f'{path}:{line_no}: bad face index {token!r}') from None
    return i - 1 if i > 0 else count + i


def read_obj(path: str) -> Mesh:
    """Vertices ('v x y z ...', extra columns such as colours ignored) and faces ('f ...')."""
    verts, polys = [], []
    try:
        with open(path, 'r', errors='strict') as fh:
            for line_no, line in enumerate(fh, 1):
                parts = line.split()
                if not parts:
                    continue
                if parts[0] == 'v':
                    try:
                        verts.append([float(v) for v in parts[1:4]])
                    except ValueError:
                        bad = line.strip()
                        raise PwanInputError(f'{path}:{line_no}: bad vertex {bad!r}') from None
                    if len(verts[-1]) != 3:
                        raise PwanInputError(f'{path}:{line_no}: a vertex needs x y z')
                elif parts[0] == 'f':
                    polys.append([_obj_index(t, len(verts), path, line_no) for t in parts[1:]])
    except (OSError, UnicodeDecodeError) as exc:
        raise PwanInputError(f'{path}: cannot read ({exc})') from None
    if not verts:
        raise PwanInputError(f'{path}: no vertices in OBJ file')
    vertices = np.asarray(verts, dtype=np.float64)
    tris = _fan([p for p in polys if len(p) >= 3])
    if tris.size and (tris.min() < 0 or tris.max() >= len(vertices)):
        raise PwanInputError(f'{path}: a face refers to a vertex the file does not have')
    return Mesh(vertices, tris if tris.size else None)


def ply_triangles(ply, path: str, count: int) -> Optional[np.ndarray]:
    """(F, 3) triangles of a read PLY's face element (``vertex_indices`` / ``vertex_index``),
    None without faces; ``count`` vertices."""
    if 'face' not in ply:
        return None
    face = ply['face'].data
    names = face.dtype.names or ()
    key = next((k for k in ('vertex_indices', 'vertex_index') if k in names), None)
    if key is None or len(face) == 0:
        return None
    tris = _fan([list(p) for p in face[key] if len(p) >= 3])
    if tris.size and (tris.min() < 0 or tris.max() >= count):
        raise PwanInputError(f'{path}: a face refers to a vertex the file does not have')
    return tris if tris.size else None


def _kept_triangles(vertices: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    finite = np.isfinite(vertices).all(axis=1)
    return triangles[finite[triangles].all(axis=1)]


def write_mesh_file(fh, ext: str, vertices: np.ndarray, triangles: np.ndarray) -> None:
    """(V, 3) vertices and (F, 3) triangles to an open binary file as PLY (binary little-endian,
    double x y z, int32 vertex_indices) or OBJ (17 digits: every double back exactly)."""
    tris = _kept_triangles(vertices, triangles)
    if ext == '.ply':
        from plyfile import PlyData, PlyElement

        rows = np.empty(len(vertices), dtype=[('x', '<f8'), ('y', '<f8'), ('z', '<f8')])
        rows['x'], rows['y'], rows['z'] = vertices.T
        faces = np.empty(len(tris), dtype=[('vertex_indices', 'i4', (3,))])
        faces['vertex_indices'] = tris
        PlyData(
            [PlyElement.describe(rows, 'vertex'), PlyElement.describe(faces, 'face')],
            byte_order='<',
        ).write(fh)
        return
    np.savetxt(fh, vertices, fmt='v %.17g %.17g %.17g')
    np.savetxt(fh, tris + 1, fmt='f %d %d %d')
