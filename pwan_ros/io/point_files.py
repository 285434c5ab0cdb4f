"""Read and write point files: .npy .ply .pcd .xyz .txt .csv (text/ply/pcd also gzip-compressed).

Returns / accepts (N, 2) or (N, 3) float64 arrays in the file's units. PCD is read by the
package's one PCD reader (:mod:`pwan_ros.io.pcd`: every DATA kind, also for bags), PLY by a
header check and numpy (Open3D, imported lazily and silenced, only for PLY layouts with lists
before the vertices), text formats through numpy; PLY/PCD are written as Open3D writes them.
Problems raise :class:`pwan_ros.core.errors.PwanInputError` with a readable message.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tempfile

import numpy as np

from pwan_ros.io.atomic import OutputError, atomic_path, check_output
from pwan_ros.core.errors import PwanInputError

READ_EXTENSIONS = ('.npy', '.ply', '.pcd', '.xyz', '.txt', '.csv')
WRITE_EXTENSIONS = ('.npy', '.ply', '.pcd', '.xyz', '.txt', '.csv')


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


_PLY_TYPES = {
    'char': 'i1',
    'int8': 'i1',
    'uchar': 'u1',
    'uint8': 'u1',
    'short': 'i2',
    'int16': 'i2',
    'ushort': 'u2',
    'uint16': 'u2',
    'int': 'i4',
    'int32': 'i4',
    'uint': 'u4',
    'uint32': 'u4',
    'float': 'f4',
    'float32': 'f4',
    'double': 'f8',
    'float64': 'f8',
}
_PLY_ORDER = {'ascii': '', 'binary_little_endian': '<', 'binary_big_endian': '>'}


def _quiet_o3d():
    """Open3D's console messages (warnings on stdout) silenced: stdout stays ours (--json)."""
    import open3d as o3d

    return o3d.utility.VerbosityContextManager(o3d.utility.VerbosityLevel.Error)


def _ply_header(data: bytes, path: str):
    """``(format, elements, payload offset)`` of a PLY file; elements: ``[(name, count,
    [(property, type code, list count type code or None)])]`` in file order."""
    end = data.find(b'end_header')
    if not data.startswith(b'ply') or end < 0:
        raise PwanInputError(f'{path}: not a PLY file (no ply ... end_header header)')
    nl = data.find(b'\n', end)
    start = len(data) if nl < 0 else nl + 1
    fmt, elements = None, []
    try:
        for line in data[:end].decode('ascii').splitlines()[1:]:
            words = line.split()
            if not words or words[0] in ('comment', 'obj_info'):
                continue
            if words[0] == 'format':
                fmt = words[1]
            elif words[0] == 'element':
                elements.append((words[1], int(words[2]), []))
                if elements[-1][1] < 0:
                    raise ValueError(f'element {words[1]} count {words[2]}')
            elif words[0] == 'property' and words[1] == 'list':
                elements[-1][2].append((words[4], _PLY_TYPES[words[3]], _PLY_TYPES[words[2]]))
            elif words[0] == 'property':
                elements[-1][2].append((words[2], _PLY_TYPES[words[1]], None))
            else:
                raise ValueError(f'unexpected line {line!r}')
        if fmt not in _PLY_ORDER:
            raise ValueError(f'format {fmt}')
    except (UnicodeDecodeError, ValueError, IndexError, KeyError) as exc:
        raise PwanInputError(f'{path}: malformed PLY header ({exc})') from None
    return fmt, elements, start


def _read_ply(data: bytes, path: str):
    """x, y(, z) of the PLY vertices, (N, 2|3) float64, or None for a layout left to Open3D
    (list properties in the vertex element, or before it in a binary file). A payload shorter
    than the header promises is refused (Open3D would pad it with zeros)."""
    fmt, elements, start = _ply_header(data, path)
    names = [e[0] for e in elements]
    if 'vertex' not in names:
        raise PwanInputError(f'{path}: PLY file has no vertex element')
    k = names.index('vertex')
    props = [p[0] for p in elements[k][2]]
    if not {'x', 'y'} <= set(props):
        raise PwanInputError(f'{path}: PLY vertices have no x/y properties ({" ".join(props)})')
    cols = [props.index(c) for c in ('x', 'y', 'z') if c in props]
    order = _PLY_ORDER[fmt]
    if not order:
        return _read_ply_ascii(data[start:], elements, k, cols, path)
    least = sum(  # payload bytes the header promises, each list counted as empty
        n * sum(np.dtype(lc or tc).itemsize for _, tc, lc in pr) for _, n, pr in elements
    )
    if len(data) - start < least:
        raise PwanInputError(
            f'{path}: truncated PLY file ({len(data) - start} data bytes, the header promises '
            f'at least {least})'
        )
    if any(lc for _, _, pr in elements[: k + 1] for _, _, lc in pr):
        return None
    before = elements[:k]
    offset = start + sum(n * sum(np.dtype(tc).itemsize for _, tc, _ in pr) for _, n, pr in before)
    try:
        dtype = np.dtype([(f'p{i}', order + tc) for i, (_, tc, _) in enumerate(elements[k][2])])
    except (TypeError, ValueError) as exc:
        raise PwanInputError(f'{path}: malformed PLY header ({exc})') from None
    rows = np.frombuffer(data, dtype=dtype, count=elements[k][1], offset=offset)
    return np.stack([rows[f'p{c}'].astype(np.float64) for c in cols], axis=1)


def _read_ply_ascii(body: bytes, elements, k: int, cols, path: str) -> np.ndarray:
    """The vertex rows of an ASCII PLY payload (one element per line; no list in the vertex)."""
    lines = [ln for ln in body.splitlines() if ln.strip()]
    skip = sum(n for _, n, _ in elements[:k])
    n, width = elements[k][1], len(elements[k][2])
    rows = lines[skip : skip + n]
    if len(rows) < n:
        raise PwanInputError(
            f'{path}: truncated PLY file ({len(rows)} of {n} vertex lines after the header)'
        )
    if any(lc for _, _, lc in elements[k][2]):
        return None
    try:
        values = np.array(b' '.join(rows).split(), dtype=np.float64)
    except ValueError as exc:
        raise PwanInputError(f'{path}: cannot parse PLY vertex data ({exc})') from None
    if values.size != n * width:
        raise PwanInputError(
            f'{path}: {values.size} PLY vertex values, expected {n} vertices x {width}'
        )
    return values.reshape(n, width)[:, cols] if n else np.zeros((0, len(cols)))


def _read_ply_file(path: str, gz: bool) -> np.ndarray:
    try:
        if gz:
            with gzip.open(path, 'rb') as fh:
                data = fh.read()
        else:
            with open(path, 'rb') as fh:
                data = fh.read()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise PwanInputError(f'{path}: cannot read ({exc})') from None
    pts = _read_ply(data, path)
    if pts is None:
        return _read_o3d(path, '.ply', gz)
    if pts.size == 0:
        raise PwanInputError(f'{path}: no points read (empty PLY file)')
    return pts


def _read_o3d(path: str, ext: str, gz: bool) -> np.ndarray:
    import open3d as o3d

    tmp = None
    try:
        if gz:
            fd, tmp = tempfile.mkstemp(suffix=ext)
            with os.fdopen(fd, 'wb') as out, gzip.open(path, 'rb') as src:
                shutil.copyfileobj(src, out)
            target = tmp
        else:
            target = path
        with _quiet_o3d():
            pcd = o3d.io.read_point_cloud(
                target, format=ext[1:], remove_nan_points=False, remove_infinite_points=False
            )
        pts = np.asarray(pcd.points, dtype=np.float64)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise PwanInputError(f'{path}: cannot read ({exc})') from None
    finally:
        if tmp is not None:
            os.unlink(tmp)
    if pts.size == 0:
        raise PwanInputError(
            f'{path}: no points read (unreadable or empty {ext[1:].upper()} file)'
        )
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


def read_points(path: str) -> np.ndarray:
    """Read an (N, 2|3) point array from ``path`` (format from the extension, optional .gz)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise PwanInputError(f'{path}: is a directory, expected a point file')
    if not os.path.isfile(path):
        raise PwanInputError(f'{path}: no such file')
    if os.path.getsize(path) == 0:
        raise PwanInputError(f'{path}: empty file')
    ext, gz = _split_ext(path)
    if ext not in READ_EXTENSIONS:
        raise PwanInputError(
            f'{path}: unsupported extension (use {", ".join(READ_EXTENSIONS)}, optionally .gz)'
        )
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
    ext, gz = _split_ext(path)
    if gz or ext not in WRITE_EXTENSIONS:
        raise PwanInputError(
            f'{path}: unsupported output extension (use {", ".join(WRITE_EXTENSIONS)})'
        )
    try:
        return check_output(path)
    except OutputError as exc:
        raise PwanInputError(str(exc)) from None


def _cloud_header(ext: str, n: int) -> bytes:
    """The header Open3D writes for n points: binary little-endian, PLY x y z as double, PCD
    as float32."""
    if ext == '.ply':
        return (
            f'ply\nformat binary_little_endian 1.0\ncomment Created by pwan_ros\n'
            f'element vertex {n}\nproperty double x\nproperty double y\nproperty double z\n'
            'end_header\n'
        ).encode()
    return (
        '# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\n'
        f'TYPE F F F\nCOUNT 1 1 1\nWIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\n'
        'DATA binary\n'
    ).encode()


def write_points(path: str, points: np.ndarray, interrupted=None) -> None:
    """Write (N, 2|3) points to ``path`` (.npy .ply .pcd .xyz .txt .csv by extension), atomically:
    a temporary sibling renamed into place when complete, so a failure leaves no partial file.
    interrupted: optional callable; when it returns True after the write, the file is discarded
    and KeyboardInterrupt raised (a Ctrl-C during the write)."""
    path = check_output_path(path)
    pts = np.asarray(points, dtype=np.float64)
    ext, _ = _split_ext(path)
    try:
        with atomic_path(path, suffix='.tmp' + ext) as tmp:
            if ext == '.npy':
                with open(tmp, 'wb') as fh:
                    np.save(fh, pts)
            elif ext in ('.ply', '.pcd'):
                p3 = pts if pts.shape[1] == 3 else np.hstack((pts, np.zeros((pts.shape[0], 1))))
                with open(tmp, 'wb') as fh:  # a failed write raises (Open3D's writer does not)
                    fh.write(_cloud_header(ext, len(p3)))
                    fh.write(p3.astype('<f8' if ext == '.ply' else '<f4').tobytes())
            else:
                np.savetxt(tmp, pts, delimiter=',' if ext == '.csv' else ' ', fmt='%.9g')
            if interrupted is not None and interrupted():
                raise KeyboardInterrupt
    except OSError as exc:
        raise PwanInputError(f'{path}: cannot write ({exc.strerror or exc})') from None
