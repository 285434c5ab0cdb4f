"""Read and write point files: .npy .ply .pcd .xyz .txt .csv .obj (text/ply/pcd also gzipped).

Returns / accepts (N, 2) or (N, 3) float64 arrays in the file's units. PCD is read by the
package's one PCD reader (:mod:`pwan_ros.io.pcd`: every DATA kind, also for bags), PLY by
plyfile (lazily imported; a truncated payload is refused), OBJ's vertices by
:mod:`pwan_ros.io.mesh`, text formats through numpy. PLY (by plyfile) and PCD are written as
Open3D writes them, but a failed write raises; PLY and OBJ with the source's triangles when given.
Problems raise :class:`pwan_ros.core.errors.PwanInputError` with a readable message.
"""

from __future__ import annotations

import gzip
import io
import os
import warnings

import numpy as np

from pwan_ros.io.atomic import OutputError, atomic_path, check_output
from pwan_ros.core.errors import PwanInputError

READ_EXTENSIONS = ('.npy', '.ply', '.pcd', '.xyz', '.txt', '.csv', '.obj')
WRITE_EXTENSIONS = ('.npy', '.ply', '.pcd', '.xyz', '.txt', '.csv', '.obj')


def _split_ext(path: str):
    low = path.lower()
    gz = low.endswith('.gz')
    if gz:
        low = low[:-3]
    return os.path.splitext(low)[1], gz


def _read_text(data: str, path: str) -> np.ndarray:
    lines = [ln for ln in data.splitlines() if ln.strip() and not ln.lstrip().startswith('#')]
    if not lines:
        raise PwanInputError(f'{path}: no points in file')
    delim = ',' if ',' in lines[0] else None
    header = None
    first = lines[0].replace(',', ' ').split()
    try:
        [float(v) for v in first]
    except ValueError:
        header = [h.strip().lower() for h in (lines[0].split(',') if delim else lines[0].split())]
        lines = lines[1:]
    if not lines:
        raise PwanInputError(f'{path}: no points in file')
    try:
        arr = np.loadtxt(io.StringIO('\n'.join(lines)), delimiter=delim, ndmin=2, dtype=np.float64)
    except ValueError as exc:
        raise PwanInputError(f'{path}: cannot parse numbers ({exc})') from None
    if header is not None and all(k in header for k in ('x', 'y')):
        cols = [header.index(k) for k in ('x', 'y', 'z') if k in header]
        return arr[:, cols]
    if arr.shape[1] > 3:
        return arr[:, :3]
    return arr


def _read_ply_file(path: str, gz: bool, faces: bool = False):
    """x, y(, z) of the PLY vertices (N, 2|3) float64, read by plyfile: a payload shorter than
    its header promises is refused (Open3D's reader pads it with zeros and prints to stdout).
    faces: a :class:`~pwan_ros.io.mesh.Mesh` with the file's triangles instead."""
    from plyfile import PlyData, PlyParseError

    try:
        with gzip.open(path, 'rb') if gz else open(path, 'rb') as fh, warnings.catch_warnings():
            # an ASCII element of no rows (a mesh's `element face 0`) is no news
            warnings.filterwarnings('ignore', 'loadtxt: input contained no data')
            ply = PlyData.read(fh, mmap=False)
        vertex = ply['vertex'].data
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise PwanInputError(f'{path}: cannot read ({exc})') from None
    except KeyError:
        raise PwanInputError(f'{path}: PLY file has no vertex element') from None
    except (PlyParseError, ValueError, UnicodeDecodeError) as exc:
        raise PwanInputError(f'{path}: not a readable PLY file ({exc})') from None
    names = vertex.dtype.names or ()
    if not {'x', 'y'} <= set(names):
        raise PwanInputError(f'{path}: PLY vertices have no x/y properties ({" ".join(names)})')
    pts = np.stack([vertex[c].astype(np.float64) for c in ('x', 'y', 'z') if c in names], axis=1)
    if pts.size == 0:
        raise PwanInputError(f'{path}: no points read (empty PLY file)')
    if faces:
        from pwan_ros.io.mesh import Mesh, ply_triangles

        return Mesh(pts, ply_triangles(ply, path, len(pts)))
    return pts


def _read_pcd_xyz(path: str) -> np.ndarray:
    """x, y, z of a PCD file through the package's one PCD reader
    (:func:`pwan_ros.io.pcd.read_pcd`)."""
    from pwan_ros.io.pcd import PcdError, read_pcd
    from pwan_ros.io.pointcloud2 import PointCloud2Error, read_xyz

    try:
        pts = read_xyz(read_pcd(path), dtype=np.float64)
    except (PcdError, PointCloud2Error) as exc:
        raise PwanInputError(str(exc) if str(exc).startswith(path) else f'{path}: {exc}') from None
    if pts.size == 0:
        raise PwanInputError(f'{path}: no points read (empty PCD file)')
    return pts


def check_input_path(path) -> str:
    """``path`` as str when it is a non-empty regular file of a readable extension, else
    :class:`PwanInputError` with one line."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise PwanInputError(f'{path}: is a directory, expected a point file')
    if not os.path.isfile(path):
        raise PwanInputError(f'{path}: no such file')
    if os.path.getsize(path) == 0:
        raise PwanInputError(f'{path}: empty file')
    ext, _ = _split_ext(path)
    if ext not in READ_EXTENSIONS:
        raise PwanInputError(
            f'{path}: unsupported extension (use {", ".join(READ_EXTENSIONS)}, optionally .gz)'
        )
    return path


def read_mesh(path: str):
    """The points of any point file (:func:`read_points`) as a :class:`~pwan_ros.io.mesh.Mesh`,
    with the triangles of a PLY / OBJ mesh (None for the other formats)."""
    from pwan_ros.io.mesh import Mesh, read_obj

    path = check_input_path(path)
    ext, gz = _split_ext(path)
    if ext == '.ply':
        return _read_ply_file(path, gz, faces=True)
    if ext == '.obj' and not gz:
        return read_obj(path)
    return Mesh(read_points(path), None)


def read_points(path: str) -> np.ndarray:
    """Read an (N, 2|3) point array from ``path`` (format from the extension, optional .gz)."""
    path = check_input_path(path)
    ext, gz = _split_ext(path)
    if ext == '.npy':
        if gz:
            raise PwanInputError(f'{path}: compressed .npy is not supported')
        try:
            with open(path, 'rb') as fh:
                valid = fh.read(6) == b'\x93NUMPY'
            arr = np.load(path, allow_pickle=False) if valid else None
        except (OSError, ValueError, EOFError) as exc:
            raise PwanInputError(f'{path}: cannot read ({exc})') from None
        if arr is None:
            raise PwanInputError(f'{path}: not a valid .npy file (no NumPy header)')
        arr = np.asarray(arr)
        if arr.dtype.kind not in 'fiu':
            raise PwanInputError(f'{path}: not a numeric array')
        return arr.astype(np.float64)
    if ext == '.pcd':
        return _read_pcd_xyz(path)
    if ext == '.ply':
        return _read_ply_file(path, gz)
    if ext == '.obj':
        if gz:
            raise PwanInputError(f'{path}: compressed .obj is not supported')
        from pwan_ros.io.mesh import read_obj

        return read_obj(path).vertices
    try:
        if gz:
            with gzip.open(path, 'rt') as fh:
                data = fh.read()
        else:
            with open(path, 'r') as fh:
                data = fh.read()
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise PwanInputError(f'{path}: cannot read ({exc})') from None
    return _read_text(data, path)


def check_output_path(path: str) -> str:
    """Validate an output point file path before any work: a supported extension and a
    writable location. Raises :class:`PwanInputError` with one line."""
    path = os.fspath(path)
    if not path:
        raise PwanInputError('empty output path')
    if os.path.isdir(path):
        raise PwanInputError(f'{path}: is a directory (give a file, e.g. {path}/moved.ply)')
    ext, gz = _split_ext(path)
    if gz or ext not in WRITE_EXTENSIONS:
        raise PwanInputError(
            f'{path}: unsupported output extension (use {", ".join(WRITE_EXTENSIONS)})'
        )
    try:
        return check_output(path)
    except OutputError as exc:
        raise PwanInputError(str(exc)) from None


def _pcd_header(n: int) -> bytes:
    """A binary PCD header for n points of little-endian double x y z (float32 would round map
    coordinates: 0.25 m at 4.5e6 m, a UTM northing)."""
    return (
        '# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS x y z\nSIZE 8 8 8\n'
        f'TYPE F F F\nCOUNT 1 1 1\nWIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\n'
        'DATA binary\n'
    ).encode()


def _write_ply(fh, points: np.ndarray) -> None:
    """(N, 3) points as a binary little-endian PLY of double x, y, z (as Open3D writes them)."""
    from plyfile import PlyData, PlyElement

    rows = np.empty(len(points), dtype=[('x', '<f8'), ('y', '<f8'), ('z', '<f8')])
    rows['x'], rows['y'], rows['z'] = points.T
    PlyData([PlyElement.describe(rows, 'vertex')], byte_order='<').write(fh)


def write_points(path: str, points: np.ndarray, interrupted=None, triangles=None) -> None:
    """Write (N, 2|3) points to ``path`` (.npy .ply .pcd .xyz .txt .csv .obj by extension),
    atomically: a temporary sibling renamed into place when complete, so a failure leaves no
    partial file. triangles: (F, 3) 0-based vertex indices written with them to .ply / .obj (those
    touching a non-finite point left out). interrupted: optional callable; when it returns True
    after the write, the file is discarded and KeyboardInterrupt raised (a Ctrl-C during it)."""
    path = check_output_path(path)
    pts = np.asarray(points, dtype=np.float64)
    ext, _ = _split_ext(path)
    try:
        with atomic_path(path, suffix='.tmp' + ext) as tmp:
            if ext == '.npy':
                with open(tmp, 'wb') as fh:
                    np.save(fh, pts)
            elif ext in ('.ply', '.pcd', '.obj'):
                p3 = pts if pts.shape[1] == 3 else np.hstack((pts, np.zeros((pts.shape[0], 1))))
                with open(tmp, 'wb') as fh:  # a failed write raises (Open3D's writer does not)
                    if ext == '.obj' or (ext == '.ply' and triangles is not None):
                        from pwan_ros.io.mesh import write_mesh_file

                        tris = np.zeros((0, 3), np.int64) if triangles is None else triangles
                        write_mesh_file(fh, ext, p3, np.asarray(tris, dtype=np.int64))
                    elif ext == '.ply':
                        _write_ply(fh, p3)
                    else:
                        fh.write(_pcd_header(len(p3)))
                        fh.write(p3.astype('<f8').tobytes())
            else:
                # 17 digits: every double back exactly (9 left 1 cm at a UTM northing)
                np.savetxt(tmp, pts, delimiter=',' if ext == '.csv' else ' ', fmt='%.17g')
            if interrupted is not None and interrupted():
                raise KeyboardInterrupt
    except OSError as exc:
        raise PwanInputError(f'{path}: cannot write ({exc.strerror or exc})') from None
