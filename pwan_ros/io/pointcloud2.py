"""Vectorised ``sensor_msgs/PointCloud2`` <-> numpy codec.

Same semantics as ``sensor_msgs_py.point_cloud2`` (which is not installable from PyPI) and
works on any object that has the PointCloud2 attributes: rclpy messages (``data`` is an
``array.array``), rosbags message dataclasses (``data`` is a numpy ``uint8`` array), or
anything else with ``height, width, fields, is_bigendian, point_step, row_step, data``.

Handled layouts: any field order and offsets, padding inside a point, row padding
(``row_step > width * point_step``), big- and little-endian data, organised clouds
(``height > 1``), all eight ``PointField`` datatypes and ``count > 1`` fields.

Reading::

    xyz = read_xyz(msg, skip_nans=True)              # (N, 3) float32 (float64 if x/y/z are)
    cloud = read_cloud(msg, skip_nans=True)          # xyz + other fields (intensity, ring, t...)
    pts = read_points(msg, ('x', 'y', 'intensity'))  # (N,) structured, like sensor_msgs_py
    extras = rotate_directions(cloud.extras, R)      # normal_x/y/z turned with the points

Writing (e.g. the aligned cloud, keeping intensity etc.)::

    out = create_cloud(header, new_xyz, cloud.extras)                      # rclpy message
    out = create_cloud(header, new_xyz, cloud.extras,
                       msg_cls=ts.types['sensor_msgs/msg/PointCloud2'])     # rosbags message

Every inconsistency raises :class:`PointCloud2Error` with a message naming the problem.
Points are in the message's ``header.frame_id``; this module does not touch headers.
"""

from __future__ import annotations

import array
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = [
    'PointCloud2Error',
    'FieldSpec',
    'DecodedCloud',
    'EncodedCloud',
    'INT8',
    'UINT8',
    'INT16',
    'UINT16',
    'INT32',
    'UINT32',
    'FLOAT32',
    'FLOAT64',
    'DATATYPE_TO_DTYPE',
    'field_specs',
    'point_dtype',
    'structured_view',
    'read_points',
    'read_xyz',
    'read_cloud',
    'DIRECTION_FIELDS',
    'rotate_directions',
    'encode_cloud',
    'create_cloud',
]

# sensor_msgs/msg/PointField datatype constants.
INT8, UINT8, INT16, UINT16, INT32, UINT32, FLOAT32, FLOAT64 = range(1, 9)

#: PointField datatype -> numpy dtype (native byte order; the codec applies endianness).
DATATYPE_TO_DTYPE = {
    INT8: np.dtype(np.int8),
    UINT8: np.dtype(np.uint8),
    INT16: np.dtype(np.int16),
    UINT16: np.dtype(np.uint16),
    INT32: np.dtype(np.int32),
    UINT32: np.dtype(np.uint32),
    FLOAT32: np.dtype(np.float32),
    FLOAT64: np.dtype(np.float64),
}
_KIND_SIZE_TO_DATATYPE = {(dt.kind, dt.itemsize): code for code, dt in DATATYPE_TO_DTYPE.items()}
_XYZ = ('x', 'y', 'z')


class PointCloud2Error(ValueError):
    """A PointCloud2 whose layout or data cannot be decoded/encoded (message says why)."""


@dataclass(frozen=True)
class FieldSpec:
    """One ``sensor_msgs/PointField``: byte ``offset`` inside a point, ``datatype`` code,
    ``count``."""

    name: str
    offset: int
    datatype: int
    count: int = 1


@dataclass(frozen=True)
class DecodedCloud:
    """A decoded cloud.

    xyz:    (N, 3) float coordinates in the message frame, metres.
    extras: (N,) structured array with every field except x/y/z, native byte order, packed
            (``count > 1`` fields are sub-arrays); zero fields when the cloud has only xyz.
    index:  (N,) int64 row-major index of each kept point in the ``height x width`` grid
            (differs from ``arange(N)`` only when ``skip_nans`` dropped points).
    height, width: grid shape of the message (``height > 1``: organised cloud).
    """

    xyz: np.ndarray
    extras: np.ndarray
    index: np.ndarray
    height: int
    width: int

    def __len__(self) -> int:
        return int(self.xyz.shape[0])


@dataclass(frozen=True)
class EncodedCloud:
    """The payload fields of a PointCloud2 (everything but the header)."""

    height: int
    width: int
    fields: tuple[FieldSpec, ...]
    is_bigendian: bool
    point_step: int
    row_step: int
    data: np.ndarray  # (row_step * height,) uint8
    is_dense: bool


# ----------------------------------------------------------------------------- layout


def field_specs(fields: Iterable[Any]) -> tuple[FieldSpec, ...]:
    """Normalise PointField-like objects (rclpy, rosbags, FieldSpec, 4-tuples) to FieldSpec."""
    out = []
    for f in fields:
        if isinstance(f, FieldSpec):
            out.append(f)
        elif isinstance(f, tuple):
            out.append(FieldSpec(*f))
        else:
            out.append(FieldSpec(str(f.name), int(f.offset), int(f.datatype), int(f.count)))
    return tuple(out)


def point_dtype(fields: Iterable[Any], point_step: int, is_bigendian: bool = False) -> np.dtype:
    """Structured dtype (itemsize ``point_step``) describing one point of the given layout.

    Raises PointCloud2Error for unsupported datatypes, non-positive counts, duplicate names
    and fields extending past ``point_step``.
    """
    specs = field_specs(fields)
    point_step = int(point_step)
    if point_step <= 0 and specs:
        raise PointCloud2Error(f'point_step must be positive, got {point_step}')
    order = '>' if is_bigendian else '<'
    names, formats, offsets = [], [], []
    for f in specs:
        if f.datatype not in DATATYPE_TO_DTYPE:
            raise PointCloud2Error(
                f"field '{f.name}' has unsupported datatype {f.datatype} (expected 1..8, "
                "INT8..FLOAT64)"
            )
        if f.count < 1:
            raise PointCloud2Error(f"field '{f.name}' has count {f.count} (must be >= 1)")
        if not f.name:
            raise PointCloud2Error('a field has an empty name')
        if f.name in names:
            raise PointCloud2Error(f"duplicate field name '{f.name}'")
        base = DATATYPE_TO_DTYPE[f.datatype].newbyteorder(order)
        size = base.itemsize * f.count
        if f.offset < 0 or f.offset + size > point_step:
            raise PointCloud2Error(
                f"field '{f.name}' occupies bytes [{f.offset}, {f.offset + size}) but "
                f'point_step is {point_step}'
            )
        names.append(f.name)
        formats.append(base if f.count == 1 else np.dtype((base, (f.count,))))
        offsets.append(f.offset)
    try:
        return np.dtype(
            {
                'names': names,
                'formats': formats,
                'offsets': offsets,
                'itemsize': max(point_step, 0),
            }
        )
    except (ValueError, TypeError) as exc:  # overlapping fields and the like
        raise PointCloud2Error(f'invalid field layout: {exc}') from exc


def _as_bytes(data: Any) -> np.ndarray:
    """msg.data (array.array, bytes, numpy uint8, list of ints) -> 1-D uint8 array (no copy if
    possible)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        return np.asarray(data, dtype=np.uint8).reshape(-1)


def structured_view(cloud: Any) -> np.ndarray:
    """All fields of ``cloud`` as a (height, width) structured array in the message byte order.

    A zero-copy, read-only view of ``cloud.data`` (row padding is skipped via strides).
    Raises PointCloud2Error if ``data`` does not hold exactly ``row_step * height`` bytes or
    ``row_step < width * point_step``.
    """
    height, width = int(cloud.height), int(cloud.width)
    point_step, row_step = int(cloud.point_step), int(cloud.row_step)
    dtype = point_dtype(cloud.fields, point_step, bool(cloud.is_bigendian))
    data = _as_bytes(cloud.data)
    if height < 0 or width < 0:
        raise PointCloud2Error(f'negative size height={height} width={width}')
    if height * width == 0:
        if data.size not in (0, row_step * height):
            raise PointCloud2Error(
                f'empty cloud (height={height}, width={width}) carries {data.size} data bytes'
            )
        return np.empty((height, width), dtype=dtype)
    if row_step < width * point_step:
        raise PointCloud2Error(
            f'row_step {row_step} is smaller than width*point_step = {width}*{point_step} = '
            f'{width * point_step}'
        )
    if data.size != row_step * height:
        raise PointCloud2Error(
            f'data has {data.size} bytes but row_step*height = {row_step}*{height} = '
            f'{row_step * height}'
        )
    view = np.ndarray(
        shape=(height, width), dtype=dtype, buffer=data, offset=0, strides=(row_step, point_step)
    )
    view.flags.writeable = False
    return view


def _native(dt: np.dtype) -> np.dtype:
    """Native-byte-order copy of a scalar or sub-array dtype."""
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return np.dtype((base.newbyteorder('='), shape))
    return dt.newbyteorder('=')


def _packed_native(view: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Copy the named fields of a structured array into a packed, native-order (N,) array."""
    flat = view.reshape(-1)
    out = np.empty(flat.shape[0], dtype=[(n, _native(view.dtype.fields[n][0])) for n in names])
    for n in names:
        out[n] = flat[n]
    return out


def _nan_mask(arr: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """(N,) True where any float value of the named fields is NaN."""
    bad = np.zeros(arr.shape[0], dtype=bool)
    for n in names:
        col = arr[n]
        if col.dtype.kind == 'f':
            bad |= np.isnan(col).reshape(col.shape[0], -1).any(axis=1)
    return bad


# ----------------------------------------------------------------------------- reading


def read_points(
    cloud: Any,
    field_names: Sequence[str] | None = None,
    skip_nans: bool = False,
    reshape_organized: bool = False,
) -> np.ndarray:
    """Selected fields of every point as a structured array (native byte order, packed).

    Like ``sensor_msgs_py.point_cloud2.read_points``: ``field_names=None`` reads all fields;
    ``skip_nans`` drops points with a NaN in any selected float field. Returns shape (N,)
    in row-major grid order, or (height, width) with ``reshape_organized`` (not together
    with ``skip_nans``).
    """
    view = structured_view(cloud)
    names = list(view.dtype.names or ()) if field_names is None else list(field_names)
    missing = [n for n in names if n not in (view.dtype.names or ())]
    if missing:
        raise PointCloud2Error(
            f'cloud has no field(s) {missing}; fields: {list(view.dtype.names or ())}'
        )
    out = _packed_native(view, names)
    if skip_nans:
        if reshape_organized:
            raise PointCloud2Error('reshape_organized cannot be combined with skip_nans')
        out = out[~_nan_mask(out, names)]
    elif reshape_organized:
        out = out.reshape(view.shape)
    return out


def _xyz_from_view(view: np.ndarray, dtype: Any) -> np.ndarray:
    names = view.dtype.names or ()
    missing = [n for n in _XYZ if n not in names]
    if missing:
        raise PointCloud2Error(f'cloud has no {"/".join(missing)} field(s); fields: {list(names)}')
    for n in _XYZ:
        if view.dtype.fields[n][0].subdtype is not None:
            raise PointCloud2Error(f"field '{n}' has count > 1; x, y and z must be scalars")
    if dtype is None:
        wide = any(view.dtype.fields[n][0].itemsize == 8 for n in _XYZ)
        dtype = np.float64 if wide else np.float32
    flat = view.reshape(-1)
    xyz = np.empty((flat.shape[0], 3), dtype=dtype)
    for i, n in enumerate(_XYZ):
        xyz[:, i] = flat[n]
    return xyz


def read_xyz(cloud: Any, skip_nans: bool = False, dtype: Any = None) -> np.ndarray:
    """x, y, z of every point as an (N, 3) float array (metres, message frame).

    ``dtype=None`` gives float64 if any of x/y/z is stored as FLOAT64, else float32.
    ``skip_nans`` drops points whose x, y or z is NaN. Raises PointCloud2Error if x, y or z
    is missing.
    """
    xyz = _xyz_from_view(structured_view(cloud), dtype)
    if skip_nans:
        xyz = xyz[~np.isnan(xyz).any(axis=1)]
    return xyz


def stamp_seconds(stamp) -> float:
    """A header stamp (builtin_interfaces/Time, rclpy or rosbags) in seconds, as the odometry
    reads it: ``sec + nanosec * 1e-9`` (other roundings of the same stamp differ in the last
    bits, and the motion model divides by the time between scans)."""
    return stamp.sec + stamp.nanosec * 1e-9


def read_cloud(cloud: Any, skip_nans: bool = False, dtype: Any = None) -> DecodedCloud:
    """xyz plus every other field (carried as ``extras``) of a cloud; see :class:`DecodedCloud`.

    ``skip_nans`` drops points whose x, y or z is NaN (from xyz, extras and index alike).
    """
    view = structured_view(cloud)
    xyz = _xyz_from_view(view, dtype)
    extra_names = [n for n in (view.dtype.names or ()) if n not in _XYZ]
    extras = _packed_native(view, extra_names)
    index = np.arange(xyz.shape[0], dtype=np.int64)
    if skip_nans:
        keep = ~np.isnan(xyz).any(axis=1)
        if not keep.all():
            xyz, extras, index = xyz[keep], extras[keep], index[keep]
    return DecodedCloud(
        xyz=xyz, extras=extras, index=index, height=view.shape[0], width=view.shape[1]
    )


#: a point is a plausible measurement when each coordinate is 0 or of magnitude within this
#: range (m): read in the wrong byte order, float coordinates scatter over 1e-30..1e30 or NaN
PLAUSIBLE_M = (1e-6, 1e6)
#: points sampled to judge a cloud's byte order
BYTE_ORDER_SAMPLE = 1000


def _plausible_fraction(xyz: np.ndarray) -> float:
    """Fraction of the rows of ``xyz`` (k, 3) that are not all zero (no-return points read the
    same in both byte orders) whose coordinates are each 0 or within :data:`PLAUSIBLE_M`."""
    with np.errstate(invalid='ignore', over='ignore'):
        a = np.abs(xyz.astype(np.float64))
        rows = ~(a == 0).all(axis=1)
        ok = ((a == 0) | ((a >= PLAUSIBLE_M[0]) & (a <= PLAUSIBLE_M[1]))).all(axis=1)
    return float(ok[rows].mean()) if rows.any() else 1.0


def check_byte_order(cloud: Any, xyz: np.ndarray) -> None:
    """Raise PointCloud2Error when ``cloud``'s ``is_bigendian`` flag does not match its data:
    most of its decoded points ``xyz`` (N, 3) are no measurement (NaN, or coordinates outside
    :data:`PLAUSIBLE_M`) while nearly all are, read in the other byte order. Only the first
    :data:`BYTE_ORDER_SAMPLE` points are looked at."""
    k = min(len(xyz), BYTE_ORDER_SAMPLE)
    if not k or _plausible_fraction(xyz[:k]) >= 0.5:
        return
    flipped = types.SimpleNamespace(
        **{n: getattr(cloud, n) for n in ('height', 'width', 'fields', 'point_step', 'row_step')},
        data=cloud.data,
        is_bigendian=not bool(cloud.is_bigendian),
    )
    try:
        other = _xyz_from_view(structured_view(flipped), None)[:k]
    except PointCloud2Error:
        return
    if _plausible_fraction(other) >= 0.9:
        raise PointCloud2Error(
            f'is_bigendian is {bool(cloud.is_bigendian)} but the data are '
            f"{'little' if cloud.is_bigendian else 'big'}-endian: read as flagged, "
            f'{1 - _plausible_fraction(xyz[:k]):.0%} of the points are NaN or beyond '
            f"{PLAUSIBLE_M[1]:g} m / below {PLAUSIBLE_M[0]:g} m, byte-swapped they are not (fix "
            "the driver's is_bigendian flag)"
        )


#: extra fields that are 3-D directions in the cloud's frame (PCL's point normals): a cloud
#: moved into another frame turns them with its points (:func:`rotate_directions`)
DIRECTION_FIELDS = (('normal_x', 'normal_y', 'normal_z'),)


def rotate_directions(extras: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """``extras`` (N,) structured with every :data:`DIRECTION_FIELDS` triple it holds turned
    by ``rotation`` (3, 3) (as points are: v' = R v); a copy when there is one, else
    ``extras``. Other fields (intensity, ring, time) are left as they are."""
    names = extras.dtype.names or ()
    triples = [t for t in DIRECTION_FIELDS if all(n in names for n in t)]
    if not triples:
        return extras
    out = extras.copy()
    for t in triples:
        v = np.stack([extras[n].astype(np.float64) for n in t], axis=1) @ rotation.T
        for i, n in enumerate(t):
            out[n] = v[:, i]
    return out


# ----------------------------------------------------------------------------- writing


def _datatype_of(dt: np.dtype, name: str) -> tuple[int, int, np.dtype]:
    """(PointField datatype, count, scalar dtype) for a numpy field dtype."""
    count = 1
    if dt.subdtype is not None:
        dt, shape = dt.subdtype
        if len(shape) != 1:
            raise PointCloud2Error(
                f"field '{name}' must be scalar or 1-D sub-array, got shape {shape}"
            )
        count = int(shape[0])
    code = _KIND_SIZE_TO_DATATYPE.get((dt.kind, dt.itemsize))
    if code is None:
        raise PointCloud2Error(
            f"field '{name}' has dtype {dt} which PointField cannot represent "
            '(int8/16/32, uint8/16/32, float32/64 only)'
        )
    return code, count, dt


def encode_cloud(
    xyz: np.ndarray,
    extras: np.ndarray | None = None,
    *,
    xyz_dtype: Any = np.float32,
    is_bigendian: bool = False,
    is_dense: bool | None = None,
) -> EncodedCloud:
    """Pack points into PointCloud2 payload fields (x, y, z first, then the ``extras`` fields).

    xyz:    (N, 3) (unorganised, height 1) or (H, W, 3) (organised) coordinates, metres.
    extras: optional structured array with N (or H*W / (H, W)) rows, e.g. ``DecodedCloud.extras``;
            fields named x, y or z are not allowed there.
    xyz_dtype: float32 (default) or float64 storage of x/y/z.
    is_dense: default True when no coordinate is NaN/inf.
    Fields are packed without padding; ``row_step = width * point_step``.
    """
    xyz = np.asarray(xyz)
    if xyz.ndim == 2 and xyz.shape[1] == 3:
        height, width = 1, xyz.shape[0]
    elif xyz.ndim == 3 and xyz.shape[2] == 3:
        height, width = xyz.shape[0], xyz.shape[1]
    else:
        raise PointCloud2Error(f'xyz must have shape (N, 3) or (H, W, 3), got {xyz.shape}')
    n = height * width
    xyz_dtype = np.dtype(xyz_dtype)
    if xyz_dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise PointCloud2Error(f'xyz_dtype must be float32 or float64, got {xyz_dtype}')
    order = '>' if is_bigendian else '<'
    names, formats, specs = list(_XYZ), [xyz_dtype.newbyteorder(order)] * 3, []
    code = FLOAT32 if xyz_dtype.itemsize == 4 else FLOAT64
    for i, name in enumerate(_XYZ):
        specs.append(FieldSpec(name, i * xyz_dtype.itemsize, code, 1))
    offset = 3 * xyz_dtype.itemsize
    if extras is not None:
        extras = np.asarray(extras)
        if extras.dtype.names is None:
            raise PointCloud2Error('extras must be a numpy structured array (named fields)')
        extras = extras.reshape(-1)
        if extras.shape[0] != n:
            raise PointCloud2Error(f'extras has {extras.shape[0]} rows but xyz has {n} points')
        for name in extras.dtype.names:
            if name in _XYZ:
                raise PointCloud2Error(
                    f"extras must not contain field '{name}' (xyz is passed separately)"
                )
            fcode, count, base = _datatype_of(extras.dtype.fields[name][0], name)
            names.append(name)
            base = base.newbyteorder(order)
            formats.append(base if count == 1 else np.dtype((base, (count,))))
            specs.append(FieldSpec(name, offset, fcode, count))
            offset += base.itemsize * count
    packed = np.empty(n, dtype=np.dtype({'names': names, 'formats': formats}))
    flat_xyz = xyz.reshape(n, 3)
    for i, name in enumerate(_XYZ):
        packed[name] = flat_xyz[:, i]
    if extras is not None:
        for name in extras.dtype.names:
            packed[name] = extras[name]
    if is_dense is None:
        is_dense = bool(np.isfinite(flat_xyz).all())
    return EncodedCloud(
        height=height,
        width=width,
        fields=tuple(specs),
        is_bigendian=bool(is_bigendian),
        point_step=offset,
        row_step=offset * width,
        data=packed.view(np.uint8).reshape(-1),
        is_dense=bool(is_dense),
    )


def _is_rclpy_class(cls: type) -> bool:
    return hasattr(cls, 'get_fields_and_field_types')


def _point_field_class(msg_cls: type) -> type:
    """The PointField class matching a PointCloud2 class (rclpy or rosbags typestore)."""
    if _is_rclpy_class(msg_cls):
        from sensor_msgs.msg import PointField

        return PointField
    ann = getattr(msg_cls, '__annotations__', {}).get('fields')
    if isinstance(ann, str) and ann.startswith('list[') and ann.endswith(']'):
        found = getattr(sys.modules.get(msg_cls.__module__), ann[5:-1], None)
        if isinstance(found, type):
            return found
    raise PointCloud2Error(f'cannot find the PointField class for {msg_cls!r}; pass field_cls=')


def create_cloud(
    header: Any,
    xyz: np.ndarray,
    extras: np.ndarray | None = None,
    *,
    msg_cls: type | None = None,
    field_cls: type | None = None,
    xyz_dtype: Any = np.float32,
    is_bigendian: bool = False,
    is_dense: bool | None = None,
) -> Any:
    """Build a PointCloud2 message of class ``msg_cls`` from xyz (+ extra fields).

    msg_cls: default rclpy's ``sensor_msgs.msg.PointCloud2``; a rosbags typestore class
             (``ts.types['sensor_msgs/msg/PointCloud2']``) also works. ``field_cls`` (the
             PointField class) is found automatically for both.
    header:  a Header of the same message family (frame_id = the frame of ``xyz``).
    Other arguments as in :func:`encode_cloud`.
    """
    enc = encode_cloud(
        xyz, extras, xyz_dtype=xyz_dtype, is_bigendian=is_bigendian, is_dense=is_dense
    )
    if msg_cls is None:
        from sensor_msgs.msg import PointCloud2

        msg_cls = PointCloud2
    if field_cls is None:
        field_cls = _point_field_class(msg_cls)
    fields = [
        field_cls(name=f.name, offset=f.offset, datatype=f.datatype, count=f.count)
        for f in enc.fields
    ]
    if _is_rclpy_class(msg_cls):
        data = array.array('B')
        data.frombytes(enc.data)  # one memcpy; rclpy's setter accepts array.array('B') as is
    else:
        data = enc.data
    return msg_cls(
        header=header,
        height=enc.height,
        width=enc.width,
        fields=fields,
        is_bigendian=enc.is_bigendian,
        point_step=enc.point_step,
        row_step=enc.row_step,
        data=data,
        is_dense=enc.is_dense,
    )
