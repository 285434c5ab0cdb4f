"""PointCloud2 codec: layouts checked against byte strings built by hand with struct.pack."""

import struct

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from rosbags.typesys import Stores, get_typestore
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import Header

from pwan_ros.io import pointcloud2 as pc2
from pwan_ros.io.pointcloud2 import PointCloud2Error

TS = get_typestore(Stores.ROS2_JAZZY)
RB_CLOUD = TS.types['sensor_msgs/msg/PointCloud2']
RB_HEADER = TS.types['std_msgs/msg/Header']
RB_TIME = TS.types['builtin_interfaces/msg/Time']


class Cloud:
    """A bare object with the PointCloud2 attributes (the codec needs nothing more)."""

    def __init__(
        self, fields, point_step, data, width, height=1, row_step=None, is_bigendian=False
    ):
        self.fields = [pc2.FieldSpec(*f) for f in fields]
        self.point_step, self.width, self.height = point_step, width, height
        self.row_step = point_step * width if row_step is None else row_step
        self.data, self.is_bigendian = data, is_bigendian


# intensity f32 @0, ring u16 @4, (2 pad), x y z f32 @8..20, (4 pad), t f64 @24; point_step 32
ODD_FIELDS = [
    ('intensity', 0, pc2.FLOAT32, 1),
    ('ring', 4, pc2.UINT16, 1),
    ('x', 8, pc2.FLOAT32, 1),
    ('y', 12, pc2.FLOAT32, 1),
    ('z', 16, pc2.FLOAT32, 1),
    ('t', 24, pc2.FLOAT64, 1),
]
ODD_POINTS = [
    (0.5, 7, 1.0, 2.0, 3.0, 0.001),
    (12.25, 15, -4.5, 0.25, 8.0, 0.1),
    (99.0, 0, 100.0, -200.0, 0.125, 1e-9),
]


def odd_bytes(order):
    return b''.join(struct.pack(order + 'fH2xfff4xd', *p) for p in ODD_POINTS)


@pytest.mark.parametrize('order', ['<', '>'])
def test_odd_layout_with_padding_both_endiannesses(order):
    cloud = Cloud(ODD_FIELDS, 32, odd_bytes(order), width=3, is_bigendian=order == '>')
    got = pc2.read_cloud(cloud)
    expected_xyz = np.array([p[2:5] for p in ODD_POINTS], dtype=np.float32)
    assert got.xyz.dtype == np.float32
    np.testing.assert_array_equal(got.xyz, expected_xyz)
    assert got.extras.dtype.names == ('intensity', 'ring', 't')
    assert got.extras.dtype['ring'] == np.dtype(np.uint16) and got.extras.dtype['t'] == np.dtype(
        np.float64
    )
    np.testing.assert_array_equal(got.extras['intensity'], [p[0] for p in ODD_POINTS])
    np.testing.assert_array_equal(got.extras['ring'], [p[1] for p in ODD_POINTS])
    np.testing.assert_array_equal(got.extras['t'], [p[5] for p in ODD_POINTS])
    assert (got.height, got.width, list(got.index)) == (1, 3, [0, 1, 2])
    # read_points keeps the requested order and native byte order
    sel = pc2.read_points(cloud, ('t', 'x'))
    assert sel.dtype.names == ('t', 'x') and sel.dtype['t'].isnative
    np.testing.assert_array_equal(sel['x'], expected_xyz[:, 0])


def test_encode_matches_hand_packed_bytes_and_round_trips_extras():
    xyz = np.array([[1.0, 2.0, 3.0], [-4.5, 0.25, 8.0]])
    extras = np.zeros(2, dtype=[('intensity', np.float32), ('ring', np.uint16), ('t', np.float64)])
    extras['intensity'], extras['ring'], extras['t'] = [0.5, 12.25], [7, 15], [0.001, 0.1]
    for order, big in (('<', False), ('>', True)):
        enc = pc2.encode_cloud(xyz, extras, is_bigendian=big)
        expected = b''.join(struct.pack(order + 'ffffHd', *xyz[i], *extras[i]) for i in range(2))
        assert enc.point_step == 26 and enc.row_step == 52 and enc.is_bigendian is big
        assert enc.data.tobytes() == expected
        assert [(f.name, f.offset, f.datatype, f.count) for f in enc.fields] == [
            ('x', 0, 7, 1),
            ('y', 4, 7, 1),
            ('z', 8, 7, 1),
            ('intensity', 12, 7, 1),
            ('ring', 16, 4, 1),
            ('t', 18, 8, 1),
        ]
        back = pc2.read_cloud(enc)
        np.testing.assert_array_equal(back.xyz, xyz.astype(np.float32))
        np.testing.assert_array_equal(back.extras, extras)


def test_double_xyz_keeps_precision():
    pts = [(500000.123456789, 4000000.987654321, 12.000000001), (-1e-12, 3.0, 7.5)]
    data = b''.join(struct.pack('<ddd', *p) for p in pts)
    cloud = Cloud(
        [('x', 0, pc2.FLOAT64, 1), ('y', 8, pc2.FLOAT64, 1), ('z', 16, pc2.FLOAT64, 1)],
        24,
        data,
        2,
    )
    xyz = pc2.read_xyz(cloud)
    assert xyz.dtype == np.float64
    np.testing.assert_array_equal(xyz, np.array(pts))
    assert pc2.read_xyz(cloud, dtype=np.float32).dtype == np.float32
    enc = pc2.encode_cloud(xyz, xyz_dtype=np.float64)
    assert enc.data.tobytes() == data and enc.fields[0].datatype == pc2.FLOAT64


def test_organised_two_rows_with_row_padding_and_nans():
    nan = float('nan')
    rows = [
        [(0.0, 0.0, 1.0, 10), (1.0, 0.0, 1.0, 11), (2.0, 0.0, 1.0, 12)],
        [(0.0, 1.0, 1.0, 20), (nan, nan, nan, 21), (2.0, 1.0, 1.0, 22)],
    ]
    pad = b'\xab' * 8  # row padding garbage must be ignored
    data = b''.join(b''.join(struct.pack('<fffB3x', *p) for p in row) + pad for row in rows)
    fields = [
        ('x', 0, pc2.FLOAT32, 1),
        ('y', 4, pc2.FLOAT32, 1),
        ('z', 8, pc2.FLOAT32, 1),
        ('ring', 12, pc2.UINT8, 1),
    ]
    cloud = Cloud(fields, 16, data, width=3, height=2, row_step=3 * 16 + 8)
    full = pc2.read_cloud(cloud)
    assert (full.height, full.width, len(full)) == (2, 3, 6)
    assert np.isnan(full.xyz[4]).all()
    np.testing.assert_array_equal(full.extras['ring'], [10, 11, 12, 20, 21, 22])
    kept = pc2.read_cloud(cloud, skip_nans=True)
    assert list(kept.index) == [0, 1, 2, 3, 5]
    np.testing.assert_array_equal(kept.extras['ring'], [10, 11, 12, 20, 22])
    np.testing.assert_array_equal(kept.xyz[4], [2.0, 1.0, 1.0])
    grid = pc2.read_points(cloud, ('x', 'ring'), reshape_organized=True)
    assert grid.shape == (2, 3) and grid['ring'][1, 2] == 22
    assert pc2.read_xyz(cloud, skip_nans=True).shape == (5, 3)
    # skip_nans in read_points looks only at the selected fields
    assert pc2.read_points(cloud, ('ring',), skip_nans=True).shape == (6,)
    assert pc2.read_points(cloud, ('y', 'ring'), skip_nans=True).shape == (5,)
    # encoding an (H, W, 3) grid keeps it organised; NaN makes it non-dense
    enc = pc2.encode_cloud(full.xyz.reshape(2, 3, 3), full.extras)
    assert (enc.height, enc.width, enc.is_dense) == (2, 3, False)
    np.testing.assert_array_equal(pc2.read_cloud(enc).extras, full.extras)


def test_all_datatypes_and_count_fields():
    layout = [
        ('x', 0, 7, 1),
        ('y', 4, 7, 1),
        ('z', 8, 7, 1),
        ('i8', 12, 1, 1),
        ('u8', 13, 2, 1),
        ('i16', 14, 3, 1),
        ('u16', 16, 4, 1),
        ('i32', 18, 5, 1),
        ('u32', 22, 6, 1),
        ('f64', 26, 8, 1),
        ('normal', 34, 7, 3),
    ]
    fmt = 'fffbBhHiIdfff'
    pts = [
        (1.0, 2.0, 3.0, -128, 255, -32768, 65535, -(2**31), 2**32 - 1, 1e300, 0.0, 0.6, 0.8),
        (4.0, 5.0, 6.0, 127, 0, 32767, 0, 2**31 - 1, 0, -2.5, 1.0, 0.0, 0.0),
    ]
    for order in '<>':
        data = b''.join(struct.pack(order + fmt, *p) for p in pts)
        cloud = Cloud(layout, 46, data, 2, is_bigendian=order == '>')
        got = pc2.read_cloud(cloud)
        assert [
            got.extras.dtype[n].str[1:] for n in ('i8', 'u8', 'i16', 'u16', 'i32', 'u32', 'f64')
        ] == ['i1', 'u1', 'i2', 'u2', 'i4', 'u4', 'f8']
        assert got.extras.dtype['normal'].shape == (3,)
        for k, name in enumerate(('i8', 'u8', 'i16', 'u16', 'i32', 'u32', 'f64')):
            assert list(got.extras[name]) == [p[3 + k] for p in pts]
        np.testing.assert_array_equal(
            got.extras['normal'], np.array([p[10:] for p in pts], np.float32)
        )
        # re-encoding with the same endianness reproduces the original bytes exactly
        enc = pc2.encode_cloud(got.xyz, got.extras, is_bigendian=order == '>')
        assert enc.data.tobytes() == data
        assert [(f.name, f.offset, f.datatype, f.count) for f in enc.fields] == layout


def test_normals_turn_with_the_cloud_and_other_fields_stay():
    """A cloud moved into odom (the node's aligned cloud) turns PCL's normal_x/y/z with its points;
    intensity is left alone and the input is not changed."""
    extras = np.zeros(
        2,
        dtype=[
            ('intensity', np.float32),
            ('normal_x', np.float32),
            ('normal_y', np.float32),
            ('normal_z', np.float32),
        ],
    )
    extras['intensity'] = [7.0, 9.0]
    extras['normal_x'], extras['normal_y'] = [1.0, 0.0], [0.0, 1.0]
    yaw90 = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    out = pc2.rotate_directions(extras, yaw90)
    normals = np.stack([out['normal_x'], out['normal_y'], out['normal_z']], axis=1)
    np.testing.assert_allclose(normals, [[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]], atol=1e-7)
    np.testing.assert_array_equal(out['intensity'], [7.0, 9.0])
    assert out.dtype == extras.dtype and extras['normal_x'][0] == 1.0
    plain = np.zeros(2, dtype=[('intensity', np.float32)])
    assert pc2.rotate_directions(plain, yaw90) is plain


def test_rclpy_and_rosbags_messages_interoperate():
    rng = np.random.default_rng(0)
    xyz = rng.normal(size=(1000, 3)).astype(np.float32)
    extras = np.zeros(1000, dtype=[('intensity', np.float32), ('ring', np.uint16)])
    extras['intensity'] = rng.uniform(size=1000)
    extras['ring'] = rng.integers(0, 64, size=1000)
    msg = pc2.create_cloud(Header(frame_id='lidar'), xyz, extras)
    assert isinstance(msg, PointCloud2) and isinstance(msg.fields[0], PointField)
    assert msg.header.frame_id == 'lidar' and msg.is_dense
    # rclpy -> CDR -> rosbags dataclass -> codec
    rb = TS.deserialize_cdr(serialize_message(msg), 'sensor_msgs/msg/PointCloud2')
    assert isinstance(rb.data, np.ndarray)
    got = pc2.read_cloud(rb)
    np.testing.assert_array_equal(got.xyz, xyz)
    np.testing.assert_array_equal(got.extras, extras)
    # rosbags dataclass built by the codec -> CDR -> rclpy message -> codec
    header = RB_HEADER(stamp=RB_TIME(sec=3, nanosec=4), frame_id='lidar')
    rb_msg = pc2.create_cloud(header, xyz, extras, msg_cls=RB_CLOUD)
    assert type(rb_msg) is RB_CLOUD
    back = deserialize_message(
        bytes(TS.serialize_cdr(rb_msg, 'sensor_msgs/msg/PointCloud2')), PointCloud2
    )
    assert back.header.stamp.sec == 3 and back.point_step == 18
    got = pc2.read_cloud(back)
    np.testing.assert_array_equal(got.xyz, xyz)
    np.testing.assert_array_equal(got.extras, extras)


def test_empty_cloud():
    enc = pc2.encode_cloud(np.zeros((0, 3)))
    assert (enc.width, enc.data.size) == (0, 0)
    got = pc2.read_cloud(enc, skip_nans=True)
    assert got.xyz.shape == (0, 3) and len(got.extras) == 0


XYZ_FIELDS = [('x', 0, 7, 1), ('y', 4, 7, 1), ('z', 8, 7, 1)]


@pytest.mark.parametrize(
    'cloud, pattern',
    [
        (Cloud([('x', 0, 7, 1), ('y', 4, 7, 1)], 8, bytes(16), 2), 'no z field'),
        (Cloud(XYZ_FIELDS + [('w', 12, 9, 1)], 16, bytes(32), 2), 'unsupported datatype 9'),
        (Cloud(XYZ_FIELDS + [('w', 12, 0, 1)], 16, bytes(32), 2), 'unsupported datatype 0'),
        (Cloud(XYZ_FIELDS, 12, bytes(20), 2), 'data has 20 bytes but row_step\\*height'),
        (Cloud(XYZ_FIELDS, 12, bytes(24), 2, height=2), 'data has 24 bytes'),
        (Cloud(XYZ_FIELDS + [('t', 8, 8, 1)], 12, bytes(24), 2), "'t' occupies bytes \\[8, 16\\)"),
        (Cloud(XYZ_FIELDS, 12, bytes(24), 2, row_step=20), 'row_step 20 is smaller'),
        (Cloud(XYZ_FIELDS + [('x', 0, 7, 1)], 12, bytes(24), 2), "duplicate field name 'x'"),
        (Cloud(XYZ_FIELDS + [('n', 0, 7, 0)], 12, bytes(24), 2), 'count 0'),
        (
            Cloud([('x', 0, 7, 2), ('y', 8, 7, 1), ('z', 12, 7, 1)], 16, bytes(32), 2),
            "'x' has count > 1",
        ),
    ],
)
def test_decode_errors(cloud, pattern):
    with pytest.raises(PointCloud2Error, match=pattern):
        pc2.read_cloud(cloud)


def test_read_points_unknown_field():
    cloud = Cloud(XYZ_FIELDS, 12, bytes(24), 2)
    with pytest.raises(PointCloud2Error, match=r"no field\(s\) \['intensity'\]"):
        pc2.read_points(cloud, ('x', 'intensity'))


def test_encode_errors():
    with pytest.raises(PointCloud2Error, match='shape'):
        pc2.encode_cloud(np.zeros((4, 2)))
    with pytest.raises(PointCloud2Error, match='3 rows but xyz has 4'):
        pc2.encode_cloud(np.zeros((4, 3)), np.zeros(3, dtype=[('i', np.float32)]))
    with pytest.raises(PointCloud2Error, match='int64'):
        pc2.encode_cloud(np.zeros((4, 3)), np.zeros(4, dtype=[('i', np.int64)]))
    with pytest.raises(PointCloud2Error, match="must not contain field 'x'"):
        pc2.encode_cloud(np.zeros((4, 3)), np.zeros(4, dtype=[('x', np.float32)]))
    with pytest.raises(PointCloud2Error, match='structured'):
        pc2.encode_cloud(np.zeros((4, 3)), np.zeros(4))
    with pytest.raises(PointCloud2Error, match='float32 or float64'):
        pc2.encode_cloud(np.zeros((4, 3)), xyz_dtype=np.int32)


def test_a_wrong_byte_order_flag_is_named():
    """A little-endian cloud flagged big-endian (and the reverse) decodes to NaN and 1e-30..1e38
    coordinates: check_byte_order says the flag is wrong (before: 'voxel_size too small for a
    cloud spanning 3e26'); a right flag, a cloud of zeros (no returns) and real far points pass."""
    rng = np.random.default_rng(0)
    xyz = rng.normal(0.0, 20.0, (5000, 3)).astype(np.float32)  # metres
    for big in (False, True):
        cloud = pc2.create_cloud(Header(frame_id='lidar'), xyz, is_bigendian=big)
        pc2.check_byte_order(cloud, pc2.read_cloud(cloud).xyz)
        cloud.is_bigendian = not big
        with pytest.raises(pc2.PointCloud2Error, match=f'is_bigendian is {not big} but the data'):
            pc2.check_byte_order(cloud, pc2.read_cloud(cloud).xyz)
    for ok in (np.zeros((100, 3), np.float32), xyz * 1000.0):  # no returns; 20 km, flag right
        cloud = pc2.create_cloud(Header(frame_id='lidar'), ok)
        pc2.check_byte_order(cloud, pc2.read_cloud(cloud).xyz)


def test_node_warnings_go_through_its_logger_once():
    """Python warnings raised while a node runs (numpy, torch, the core) are logged by the node's
    logger, each text once, not printed raw to stderr."""
    import warnings

    from pwan_ros.ros.spin import log_warnings

    class Logger:
        lines = []

        def warning(self, text):
            self.lines.append(text)

    class Node:
        logger = Logger()

        def get_logger(self):
            return self.logger

    node = Node()
    saved = warnings.showwarning
    try:
        log_warnings(node)
        with warnings.catch_warnings():
            warnings.simplefilter('always')
            warnings.showwarning = saved  # catch_warnings restores it: set it inside
            log_warnings(node)
            for _ in range(3):
                warnings.warn('mean of empty slice', RuntimeWarning)
    finally:
        warnings.showwarning = saved
    assert node.logger.lines == ['RuntimeWarning: mean of empty slice']
