"""PCD (Point Cloud Library) files -> PointCloud2 payloads, keeping every field.

Supports PCD v0.5-0.7 with ``DATA ascii`` and ``DATA binary`` (optionally gzip-compressed,
``*.pcd.gz``); all TYPE/SIZE combinations PointField can represent (I/U 1, 2, 4 bytes;
F 4, 8 bytes), COUNT > 1 fields and PCL's ``_`` padding fields (dropped from the field list,
their bytes kept as padding) and ``DATA binary_compressed`` (PCL's LZF-compressed, field by
field layout; decompressed with ``python-neo-lzf``), organised clouds (``HEIGHT`` > 1) kept.
Coordinates are in the sensor frame, metres; ``VIEWPOINT`` is ignored.
"""

from __future__ import annotations

import gzip
import pathlib
import struct
from dataclasses import dataclass

import numpy as np

from pwan_ros.io.pointcloud2 import DATATYPE_TO_DTYPE, EncodedCloud, FieldSpec

__all__ = ['PcdError', 'PcdHeader', 'read_pcd']

_PCD_TYPES = {
    ('I', 1): 1,
    ('U', 1): 2,
    ('I', 2): 3,
    ('U', 2): 4,
    ('I', 4): 5,
    ('U', 4): 6,
    ('F', 4): 7,
    ('F', 8): 8,
}


class PcdError(ValueError):
    """A PCD file that cannot be read (message names the file and problem)."""


@dataclass(frozen=True)
class PcdHeader:
    fields: tuple
    sizes: tuple
    types: tuple
    counts: tuple
    width: int
    height: int
    points: int
    data: str


def _parse_header(raw: bytes, path) -> tuple[PcdHeader, int]:
    entries, pos = {}, 0
    while True:
        end = raw.find(b'\n', pos)
        if end < 0:
            raise PcdError(f'{path}: PCD header has no DATA line')
        line = raw[pos:end].decode('ascii', errors='replace').strip()
        pos = end + 1
        if not line or line.startswith('#'):
            continue
        key, *vals = line.split()
        entries[key.upper()] = vals
        if key.upper() == 'DATA':
            break
    try:
        fields = tuple(entries['FIELDS'])
        n = len(fields)
        sizes = tuple(int(v) for v in entries['SIZE'])
        types = tuple(v.upper() for v in entries['TYPE'])
        counts = tuple(int(v) for v in entries.get('COUNT', ['1'] * n))
        width, height = int(entries['WIDTH'][0]), int(entries.get('HEIGHT', ['1'])[0])
        points = int(entries.get('POINTS', [width * height])[0])
        data = entries['DATA'][0].lower()
    except (KeyError, IndexError, ValueError) as exc:
        raise PcdError(f'{path}: malformed PCD header ({exc})') from exc
    if not (len(sizes) == len(types) == len(counts) == n):
        raise PcdError(f'{path}: FIELDS/SIZE/TYPE/COUNT lengths differ')
    if min(width, height, points) < 0 or min(counts, default=1) < 1:
        raise PcdError(
            f'{path}: malformed PCD header (WIDTH {width}, HEIGHT {height}, POINTS {points}, '
            f'COUNT {" ".join(map(str, counts))})'
        )
    named = [f for f in fields if f != '_']
    if len(set(named)) != len(named):
        raise PcdError(f'{path}: FIELDS names a field twice ({" ".join(fields)})')
    for name, count in zip(fields, counts):
        if name in ('x', 'y', 'z') and count != 1:
            raise PcdError(f"{path}: field '{name}' has COUNT {count}, expected 1")
    return PcdHeader(fields, sizes, types, counts, width, height, points, data), pos


def _layout(h: PcdHeader, path) -> tuple[list[FieldSpec], int, np.dtype]:
    specs, names, formats, offsets, offset = [], [], [], [], 0
    for name, size, kind, count in zip(h.fields, h.sizes, h.types, h.counts):
        code = _PCD_TYPES.get((kind, size))
        if code is None:
            raise PcdError(
                f"{path}: field '{name}' has TYPE {kind} SIZE {size}, which PointCloud2 cannot "
                "hold"
            )
        if name != '_':
            specs.append(FieldSpec(name, offset, code, count))
            base = DATATYPE_TO_DTYPE[code].newbyteorder('<')
            names.append(name)
            formats.append(base if count == 1 else np.dtype((base, (count,))))
            offsets.append(offset)
        offset += size * count
    return (
        specs,
        offset,
        np.dtype({'names': names, 'formats': formats, 'offsets': offsets, 'itemsize': offset}),
    )


def read_pcd(path) -> EncodedCloud:
    """Read a .pcd / .pcd.gz file into PointCloud2 payload fields (little-endian)."""
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
        if path.suffix.lower() == '.gz':
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise PcdError(f'cannot read {path}: {exc}') from exc
    header, start = _parse_header(raw, path)
    specs, step, dtype = _layout(header, path)
    n = header.points
    if header.data == 'binary_compressed':
        data = _decompress(raw[start:], header, step, path)
    elif header.data == 'binary':
        body = np.frombuffer(raw, dtype=np.uint8, offset=start)
        if body.size < n * step:
            raise PcdError(
                f'{path}: {body.size} data bytes, header promises {n} points x {step} bytes'
            )
        data = body[: n * step].copy()
    elif header.data == 'ascii':
        cols = sum(header.counts)
        try:
            values = np.array(raw[start:].split(), dtype=np.float64)
        except ValueError as exc:
            raise PcdError(f'{path}: cannot parse ascii data ({exc})') from None
        if values.size != n * cols:
            raise PcdError(f'{path}: {values.size} ascii values, expected {n} points x {cols}')
        values = values.reshape(n, cols)
        arr = np.zeros(n, dtype=dtype)
        col = 0
        for name, count in zip(header.fields, header.counts):
            if name != '_':
                arr[name] = values[:, col] if count == 1 else values[:, col : col + count]
            col += count
        data = arr.view(np.uint8).reshape(-1).copy()
    else:
        raise PcdError(f'{path}: unknown DATA kind {header.data!r}')
    height, width = (header.height, header.width) if header.height * header.width == n else (1, n)
    if not {'x', 'y', 'z'} <= {s.name for s in specs}:
        raise PcdError(f'{path}: PCD has no x/y/z fields (fields: {list(header.fields)})')
    xyz = (
        np.stack(
            [
                np.ndarray(  # each with its own type (SIZE 8 4 4 exists)
                    n, dtype=dtype[c], buffer=data, offset=dtype.fields[c][1], strides=(step,)
                ).astype(np.float64)
                for c in 'xyz'
            ],
            axis=1,
        )
        if n
        else np.zeros((0, 3))
    )
    return EncodedCloud(
        height=height,
        width=width,
        fields=tuple(specs),
        is_bigendian=False,
        point_step=step,
        row_step=step * width,
        data=data,
        is_dense=bool(np.isfinite(xyz).all()),
    )


def _decompress(body: bytes, h: PcdHeader, step: int, path) -> np.ndarray:
    """The point-major bytes (n * step,) of a ``binary_compressed`` body: uint32 compressed and
    uncompressed sizes, then LZF data holding each field's values for all points in turn (PCL's
    layout, padding fields included)."""
    import lzf

    n = h.points
    if len(body) < 8:
        raise PcdError(f'{path}: binary_compressed data is cut short (no size words)')
    packed, size = struct.unpack('<II', body[:8])
    if size != n * step:
        raise PcdError(
            f'{path}: binary_compressed data holds {size} bytes, header promises {n} points x '
            f'{step} bytes'
        )
    if len(body) - 8 < packed:
        raise PcdError(
            f'{path}: binary_compressed data is cut short ({len(body) - 8} of {packed} bytes)'
        )
    plain = lzf.decompress(bytes(body[8 : 8 + packed]), size) if size else b''
    if plain is None or len(plain) != size:
        raise PcdError(f'{path}: binary_compressed data is corrupt (LZF could not decompress it)')
    columns = np.frombuffer(plain, dtype=np.uint8)
    data = np.empty((n, step), dtype=np.uint8)
    offset = 0  # of the field in a point
    for fsize, count in zip(h.sizes, h.counts):
        width = fsize * count
        data[:, offset : offset + width] = columns[n * offset : n * (offset + width)].reshape(
            n, width
        )
        offset += width
    return data.reshape(-1)
