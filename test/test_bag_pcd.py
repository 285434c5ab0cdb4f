"""PCD folders + pose files -> rosbag2, and the real BALM sequence end to end (slow)."""

import gzip
import json
import pathlib
import re
import struct

import numpy as np
import pytest
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import PointCloud2

from pwan_ros.io import bags as bag_io
from pwan_ros.cli import evaluate as evaluate_cli
from pwan_ros.cli import pcd2bag as pcd2bag_cli
from pwan_ros.io.pcd import PcdError, read_pcd
from pwan_ros.evaluation.offline import run_offline
from pwan_ros.evaluation.pcd_to_bag import ConvertConfig, convert
from pwan_ros.io.pointcloud2 import read_cloud
from pwan_ros.io.trajectory import Trajectory, pose_from_tq, write_kitti, write_tum

BALM = (
    pathlib.Path(__file__).resolve().parents[1] / '..' / 'shared' / 'data' / 'lidar' / 'balm_seq_a'
)
HEADER = (
    '# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS x y z intensity _ ring '
    'normal\nSIZE 4 4 4 4 1 2 4\nTYPE F F F F U U F\nCOUNT 1 1 1 1 2 1 3\nWIDTH {n}\nHEIGHT 1\n'
    'VIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {kind}\n'
)


def points(k, n=5):
    return [(k + i, -i * 0.5, 1.25, 10.0 * i, 7 + i, 0.0, 0.6, 0.8) for i in range(n)]


def write_pcd(path, pts, kind):
    head = HEADER.format(n=len(pts), kind=kind).encode()
    if kind == 'binary':
        body = b''.join(struct.pack('<ffff2xHfff', *p) for p in pts)
    else:
        body = ''.join(
            f'{p[0]} {p[1]} {p[2]} {p[3]} 0 0 {p[4]} {p[5]} {p[6]} {p[7]}\n' for p in pts
        ).encode()
    data = head + body
    path.write_bytes(gzip.compress(data) if path.suffix == '.gz' else data)


def test_read_pcd_binary_ascii_gz_with_padding(tmp_path):
    for name, kind in [('a.pcd', 'binary'), ('b.pcd.gz', 'binary'), ('c.pcd', 'ascii')]:
        write_pcd(tmp_path / name, points(3), kind)
        cloud = read_cloud(read_pcd(tmp_path / name))
        np.testing.assert_array_equal(cloud.xyz, np.array([p[:3] for p in points(3)], np.float32))
        assert cloud.extras.dtype.names == ('intensity', 'ring', 'normal')  # '_' padding dropped
        assert list(cloud.extras['ring']) == [7, 8, 9, 10, 11]
        np.testing.assert_allclose(cloud.extras['normal'][2], [0.0, 0.6, 0.8], rtol=1e-6)
    (tmp_path / 'bad.pcd').write_bytes(b'VERSION 0.7\nFIELDS x\n')
    with pytest.raises(PcdError, match='no DATA line'):
        read_pcd(tmp_path / 'bad.pcd')
    (tmp_path / 'short.pcd').write_bytes(HEADER.format(n=9, kind='binary').encode() + b'\0' * 10)
    with pytest.raises(PcdError, match='header promises 9 points'):
        read_pcd(tmp_path / 'short.pcd')


def test_read_pcd_with_fields_of_mixed_widths(tmp_path):
    """x stored as float64 and y, z as float32 (SIZE 8 4 4), and the other way round with a NaN
    (SIZE 4 8 8): each field read with its own type (before: a numpy traceback, and a wrong
    is_dense)."""
    pts = np.array([[4.0e6 + 0.125, 2.5, -1.0], [4.0e6 + 1.5, 3.0, np.nan], [4.0e6, 0.0, 7.25]])
    for sizes, types in (((8, 4, 4), '<f8 <f4 <f4'), ((4, 8, 8), '<f4 <f8 <f8')):
        dtype = np.dtype([(c, t) for c, t in zip('xyz', types.split())])
        rec = np.zeros(3, dtype)
        for i, c in enumerate('xyz'):
            rec[c] = pts[:, i]
        path = tmp_path / f'mixed{sizes[0]}.pcd'
        head = (
            f'VERSION 0.7\nFIELDS x y z\nSIZE {" ".join(map(str, sizes))}\nTYPE F F F\n'
            'COUNT 1 1 1\nWIDTH 3\nHEIGHT 1\nPOINTS 3\nDATA binary\n'
        )
        path.write_bytes(head.encode() + rec.tobytes())
        enc = read_pcd(path)
        assert not enc.is_dense
        xyz = read_cloud(enc).xyz.astype(np.float64)
        expected = np.stack([rec[c].astype(np.float64) for c in 'xyz'], axis=1)
        np.testing.assert_array_equal(xyz, expected)


def test_read_pcd_binary_compressed(tmp_path):
    """PCL's binary_compressed layout (LZF, one field after the other, padding included), an
    organised 4 x 5 cloud: the same payload as the file written as DATA binary, every field under
    its own name, the grid kept (before, through Open3D: normal_x/y/z became 'normals', rgb
    'colors', the grid was lost). Also a file Open3D writes; cut or corrupt data: one line."""
    import lzf
    import open3d as o3d

    pts = points(2, n=20)
    rows = np.frombuffer(b''.join(struct.pack('<ffff2xHfff', *p) for p in pts), np.uint8)
    rows = rows.reshape(20, -1)
    head = HEADER.format(n=20, kind='{kind}').replace('WIDTH 20\nHEIGHT 1', 'WIDTH 5\nHEIGHT 4')
    (tmp_path / 'plain.pcd').write_bytes(head.format(kind='binary').encode() + rows.tobytes())
    columns, off = [], 0
    for width in (4, 4, 4, 4, 2, 2, 12):  # SIZE x COUNT of each field, in header order
        columns.append(rows[:, off : off + width].tobytes())
        off += width
    plain = b''.join(columns)
    packed = lzf.compress(plain)
    body = struct.pack('<II', len(packed), len(plain)) + packed
    (tmp_path / 'c.pcd').write_bytes(head.format(kind='binary_compressed').encode() + body)
    ref, got = read_pcd(tmp_path / 'plain.pcd'), read_pcd(tmp_path / 'c.pcd')
    assert (got.height, got.width) == (ref.height, ref.width) == (4, 5)
    assert got.fields == ref.fields and got.point_step == ref.point_step
    np.testing.assert_array_equal(got.data, ref.data)
    cloud = read_cloud(got)
    assert cloud.extras.dtype.names == ('intensity', 'ring', 'normal')
    assert list(cloud.extras['ring'][:3]) == [7, 8, 9]

    pc = o3d.t.geometry.PointCloud()
    xyz = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32) * 20
    pc.point.positions = o3d.core.Tensor(xyz)
    pc.point.intensity = o3d.core.Tensor(np.arange(50, dtype=np.float32)[:, None])
    o3d.t.io.write_point_cloud(str(tmp_path / 'o3d.pcd'), pc, compressed=True)
    assert b'DATA binary_compressed' in (tmp_path / 'o3d.pcd').read_bytes()[:400]
    cloud = read_cloud(read_pcd(tmp_path / 'o3d.pcd'))
    np.testing.assert_array_equal(cloud.xyz, xyz)
    np.testing.assert_array_equal(cloud.extras['intensity'], np.arange(50))

    cases = (
        (body[:-5], 'cut short'),
        (body[:8] + bytes(len(packed)), 'corrupt'),
        (struct.pack('<II', len(packed), len(plain) + 4) + packed, 'header promises 20 points'),
    )
    for i, (bad, words) in enumerate(cases):
        path = tmp_path / f'bad{i}.pcd'
        path.write_bytes(head.format(kind='binary_compressed').encode() + bad)
        with pytest.raises(PcdError, match=f'^{re.escape(str(path))}: .*{words}'):
            read_pcd(path)


@pytest.mark.parametrize(
    'count,n,body,msg',
    [
        ('1 1 1', 2, b'1 2 3\n4 abc 6\n', 'cannot parse ascii data'),
        ('1 1 1', -5, b'1 2 3\n', 'POINTS -5'),
        ('2 1 1', 2, b'1 2 3 7\n4 5 6 8\n', "field 'x' has COUNT 2, expected 1"),
    ],
)
def test_malformed_pcd_is_one_line_naming_the_file(tmp_path, capsys, count, n, body, msg):
    """A non-numeric ascii value, a negative POINTS, a multi-valued x: PcdError naming the file
    (not a bare ValueError); pwan_pcd2bag prints it as one line, exit 2, no bag."""
    scans = tmp_path / 'scans'
    scans.mkdir()
    head = (
        '# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\n'
        f'COUNT {count}\nWIDTH 2\nHEIGHT 1\nPOINTS {n}\nDATA ascii\n'
    )
    bad = scans / 'scan0.pcd'
    bad.write_bytes(head.encode() + body)
    with pytest.raises(PcdError, match=f'^{re.escape(str(bad))}: .*{re.escape(msg)}'):
        read_pcd(bad)
    (tmp_path / 'poses.tum').write_text('0 0 0 0 0 0 0 1\n1 0 0 0 0 0 0 1\n')
    argv = ['--scans', str(scans), '--poses', str(tmp_path / 'poses.tum')]
    assert pcd2bag_cli.main(argv + ['--output', str(tmp_path / 'bag')]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f'pwan_pcd2bag: error: {bad}: ') and msg in err[0]
    assert not (tmp_path / 'bag').exists()


def test_convert_folder_with_tum_and_kitti_poses(tmp_path, capsys):
    scans = tmp_path / 'scans'
    scans.mkdir()
    for k in (3, 1, 2):  # pose index from the file name (BALM convention)
        write_pcd(scans / f'scan{k}.pcd', points(k), 'binary')
    traj = Trajectory(
        50.0 + 0.5 * np.arange(5),
        pose_from_tq([[k, 2.0 * k, 0.0] for k in range(5)], [[0, 0, 0, 1]] * 5),
    )
    write_tum(tmp_path / 'poses.tum', traj)
    res = convert(
        ConvertConfig(
            scans=str(scans),
            poses=str(tmp_path / 'poses.tum'),
            output=str(tmp_path / 'bag'),
            frame_id='lidar',
        ),
        log=lambda *a: None,
    )
    assert res.scans == 3 and res.duration_s == pytest.approx(1.0)
    clouds = [
        (t, deserialize_message(raw, PointCloud2))
        for _, _, t, raw in bag_io.iter_raw(tmp_path / 'bag', ['/points'])
    ]
    assert [t for t, _ in clouds] == [50_500_000_000, 51_000_000_000, 51_500_000_000]
    for k, (_, msg) in zip((1, 2, 3), clouds):
        assert msg.header.frame_id == 'lidar'
        np.testing.assert_array_equal(
            read_cloud(msg).xyz[:, 0], np.arange(k, k + 5, dtype=np.float32)
        )
    gt = bag_io.read_trajectory(tmp_path / 'bag', '/ground_truth', frame='lidar')
    np.testing.assert_allclose(gt.poses, traj.poses[1:4])
    # KITTI poses have no stamps: --rate-hz makes them; --match order pairs sorted files with poses
    # 0..2
    write_kitti(tmp_path / 'poses.kitti', traj)
    rc = pcd2bag_cli.main(
        [
            '--scans',
            str(scans),
            '--poses',
            str(tmp_path / 'poses.kitti'),
            '--output',
            str(tmp_path / 'bag2'),
            '--match',
            'order',
            '--rate-hz',
            '4',
        ]
    )
    assert rc == 0 and 'wrote' in capsys.readouterr().out
    gt2 = bag_io.read_trajectory(tmp_path / 'bag2', '/ground_truth')
    np.testing.assert_allclose(gt2.stamps, [0.0, 0.25, 0.5])
    np.testing.assert_allclose(gt2.poses, traj.poses[:3], atol=1e-9)
    rc = pcd2bag_cli.main(
        [
            '--scans',
            str(tmp_path / 'none'),
            '--poses',
            str(tmp_path / 'poses.tum'),
            '--output',
            str(tmp_path / 'bag3'),
        ]
    )
    assert rc == 2 and 'does not exist' in capsys.readouterr().err
    write_pcd(scans / 'scan9.pcd', points(9), 'binary')
    rc = pcd2bag_cli.main(
        [
            '--scans',
            str(scans),
            '--poses',
            str(tmp_path / 'poses.tum'),
            '--output',
            str(tmp_path / 'b4'),
        ]
    )
    assert rc == 2 and 'scan9.pcd: pose index beyond the 5 poses' in capsys.readouterr().err


def test_match_order_compares_numbers_in_names_as_numbers(tmp_path, capsys):
    """--match order on unpadded names (scan0 ... scan11): scan10 is the 11th scan, not the 3rd
    (a plain sort paired it with pose 2: ATE 0.81 m instead of 0.048 m on nuScenes, exit 0);
    fewer scans than poses is said."""
    scans = tmp_path / 'scans'
    scans.mkdir()
    for k in range(12):
        write_pcd(scans / f'scan{k}.pcd', points(k), 'binary')
    traj = Trajectory(
        10.0 + 0.5 * np.arange(14),
        pose_from_tq([[k, 0.0, 0.0] for k in range(14)], [[0, 0, 0, 1]] * 14),
    )
    write_kitti(tmp_path / 'poses.kitti', traj)
    argv = ['--scans', str(scans), '--poses', str(tmp_path / 'poses.kitti'), '--match', 'order']
    assert pcd2bag_cli.main(argv + ['--output', str(tmp_path / 'bag')]) == 0
    err = capsys.readouterr().err
    assert 'warning: 12 scans for 14 poses' in err and 'first 12 poses' in err
    clouds = [
        deserialize_message(raw, PointCloud2)
        for _, _, _, raw in bag_io.iter_raw(tmp_path / 'bag', ['/points'])
    ]
    assert [float(read_cloud(m).xyz[0, 0]) for m in clouds] == list(range(12))
    gt = bag_io.read_trajectory(tmp_path / 'bag', '/ground_truth')
    np.testing.assert_allclose(gt.poses, traj.poses[:12], atol=1e-9)


def test_convert_refuses_unusable_poses_and_pairings(tmp_path, capsys):
    """Negative or repeated stamps, a KITTI rotation that is not one, two scans on one pose: one
    line naming the file (and line), exit 2, no bag left behind."""
    scans = tmp_path / 'scans'
    scans.mkdir()
    for k in range(3):
        write_pcd(scans / f'{k:06d}.pcd', points(k), 'binary')
    twice = tmp_path / 'twice'
    twice.mkdir()
    for name in ('a_1.pcd', 'b_1.pcd'):
        write_pcd(twice / name, points(1), 'binary')
    tum = '{} 0 0 0 0 0 0 1\n'
    (tmp_path / 'neg.tum').write_text(''.join(tum.format(s) for s in (-5.0, -4.9, -4.8)))
    (tmp_path / 'dup.tum').write_text(''.join(tum.format(s) for s in (1.0, 2.0, 2.0)))
    (tmp_path / 'ok.tum').write_text(''.join(tum.format(s) for s in (1.0, 2.0, 3.0)))
    kitti = '1 0 0 0 0 1 0 0 0 0 1 0\n'
    (tmp_path / 'bad.kitti').write_text(
        kitti + '# a comment\n' + kitti.replace('0 1 0\n', '0 2 0\n')
    )
    cases = [
        (scans, 'neg.tum', ['neg.tum', 'stamp -5 s', '000000.pcd']),
        (scans, 'dup.tum', ['dup.tum', 'stamp 2 repeats on lines 2, 3']),
        (scans, 'bad.kitti', ['bad.kitti:3', 'not a rotation']),
        (twice, 'ok.tum', ['a_1.pcd and b_1.pcd both map to pose 1']),
    ]
    for folder, poses, words in cases:
        out = tmp_path / 'bag'
        argv = ['--scans', str(folder), '--poses', str(tmp_path / poses), '--output', str(out)]
        assert pcd2bag_cli.main(argv + ['--match', 'order'] * (poses == 'bad.kitti')) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        for word in words:
            assert word in err[0], (word, err[0])
        assert not out.exists() and not list(tmp_path.glob('bag*')), poses


def test_convert_takes_upper_case_extensions(tmp_path):
    """Scans named FULL0.PCD / full1.Pcd.GZ are found (extensions in any case) and keep their
    pose order."""
    scans = tmp_path / 'scans'
    scans.mkdir()
    write_pcd(scans / 'FULL0.PCD', points(0), 'binary')
    write_pcd(scans / 'full1.pcd', points(1), 'binary')
    (scans / 'full1.Pcd.GZ').write_bytes(gzip.compress((scans / 'full1.pcd').read_bytes()))
    (scans / 'full1.pcd').unlink()
    write_tum(tmp_path / 'p.tum', Trajectory(np.array([1.0, 2.0]), np.tile(np.eye(4), (2, 1, 1))))
    res = convert(
        ConvertConfig(scans=str(scans), poses=str(tmp_path / 'p.tum'), output=str(tmp_path / 'b')),
        log=lambda *a: None,
    )
    assert res.scans == 2


@pytest.mark.slow
def test_balm_sequence_to_bag_and_offline_evaluation(tmp_path, capsys):
    """The real BALM scans (../shared/data) through the converter and the offline ICP baseline."""
    bag = tmp_path / 'balm_bag'
    assert (
        pcd2bag_cli.main(
            [
                '--scans',
                str(BALM),
                '--poses',
                str(BALM / 'alidarPose.csv'),
                '--output',
                str(bag),
                '--frame-id',
                'lidar',
            ]
        )
        == 0
    )
    topics = bag_io.bag_topics(bag)
    assert topics['/points'].count == 10 and topics['/ground_truth'].count == 10
    first = next(m for _, m in bag_io.iter_decoded(bag, '/points'))
    assert 76000 < first.width < 91000 and [f.name for f in first.fields][:4] == [
        'x',
        'y',
        'z',
        'intensity',
    ]
    out = tmp_path / 'eval'
    assert (
        evaluate_cli.main(
            ['--offline', '--bag', str(bag), '--output', str(out), '--frame', 'lidar']
            + ['--estimator', 'icp']
        )
        == 0
    )
    assert capsys.readouterr().out.strip().splitlines()[-1] == f'summary: {out / "summary.json"}'
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['scans'] == 10 and summary['scans_dropped'] == 0
    # the reference poses are good to ~5-15 cm; scan-to-scan ICP must agree within that
    assert summary['ate_rmse_m'] < 0.15
    assert summary['path_length_m'] == pytest.approx(2.9, abs=0.2)


def corner(shift, n=600, seed=0):
    """Points (PCD rows of :func:`points`' layout) on three walls of a 4 m corner, seen from a
    sensor ``shift`` metres along x."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.0, 4.0, size=(n, 2))
    walls = np.concatenate(
        [np.c_[u[:, 0], u[:, 1], 0 * u[:, 0]], np.c_[u[:, 0], 0 * u[:, 0], u[:, 1]]]
        + [np.c_[0 * u[:, 0], u[:, 0], u[:, 1]]]
    )
    walls[:, 0] -= shift
    return [(x, y, z, 0.0, 0, 0.0, 0.0, 1.0) for x, y, z in walls]


def test_offline_icp_drops_an_empty_scan_and_json_is_stdout_alone(tmp_path, capsys):
    """An empty cloud among the scans (a blackout, a driver glitch) is a dropped scan for the
    ICP baseline, not a traceback (Open3D: 'PointToPlaneICP requires target pointcloud to have
    normals', exit 1); an estimator that raises is one line naming the scan; --json prints the
    JSON alone on stdout."""
    scans = tmp_path / 'scans'
    scans.mkdir()
    for k in range(4):
        write_pcd(scans / f'{k:06d}.pcd', [] if k == 2 else corner(0.1 * k, seed=k), 'binary')
    traj = Trajectory(
        0.1 * np.arange(4),
        pose_from_tq([[0.1 * k, 0.0, 0.0] for k in range(4)], [[0, 0, 0, 1]] * 4),
    )
    write_tum(tmp_path / 'poses.tum', traj)
    convert(
        ConvertConfig(
            scans=str(scans), poses=str(tmp_path / 'poses.tum'), output=str(tmp_path / 'b')
        ),
        log=lambda *a: None,
    )
    argv = ['--offline', '--bag', str(tmp_path / 'b'), '--estimator', 'icp', '--json']
    assert evaluate_cli.main(argv + ['--output', str(tmp_path / 'e')]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert out.err.strip() == f'summary: {tmp_path / "e" / "summary.json"}'
    assert summary['scans_published'] == 4 and summary['scans'] == 3
    assert summary['scans_dropped'] == 1
    assert summary['ate_rmse_m'] < 0.01

    def broken(xyz, stamp):
        raise RuntimeError('no normals')

    with pytest.raises(ValueError, match=r'^the estimator failed on scan 1 \(stamp 0.000000 s'):
        run_offline(tmp_path / 'b', broken)


def test_npy_scans_become_clouds_and_bad_ones_are_one_line(tmp_path, capsys):
    """A folder of .npy scans (N x 4: x y z intensity, metres; nuScenes' keyframe layout)
    converts directly (before: 'no .pcd/.pcd.gz files'); an array that is no scan, or a pickle,
    is one line naming the file, exit 2."""
    scans = tmp_path / 'scans'
    scans.mkdir()
    rng = np.random.default_rng(0)
    arrays = [rng.normal(scale=20.0, size=(50 + k, 4)) for k in range(3)]
    for k, a in enumerate(arrays):
        np.save(scans / f'{k:06d}.npy', a)
    traj = Trajectory(
        0.5 * np.arange(3),
        pose_from_tq([[2.0 * k, 0.0, 0.0] for k in range(3)], [[0, 0, 0, 1]] * 3),
    )
    write_tum(tmp_path / 'poses.tum', traj)
    argv = ['--scans', str(scans), '--poses', str(tmp_path / 'poses.tum')]
    assert pcd2bag_cli.main(argv + ['--output', str(tmp_path / 'bag')]) == 0
    clouds = [
        read_cloud(deserialize_message(raw, PointCloud2))
        for _, _, _, raw in bag_io.iter_raw(tmp_path / 'bag', ['/points'])
    ]
    assert len(clouds) == 3
    for cloud, a in zip(clouds, arrays):
        np.testing.assert_allclose(cloud.xyz, a[:, :3].astype(np.float32))
        np.testing.assert_allclose(cloud.extras['intensity'], a[:, 3].astype(np.float32))
    capsys.readouterr()
    np.save(scans / '000001.npy', np.zeros((5, 2)))
    assert pcd2bag_cli.main(argv + ['--output', str(tmp_path / 'bag2')]) == 2
    err = capsys.readouterr().err
    assert '000001.npy: a scan is an (N, 3) or (N, 4+) array of numbers' in err
    np.save(scans / '000001.npy', np.array([{'a': 1}], dtype=object), allow_pickle=True)
    assert pcd2bag_cli.main(argv + ['--output', str(tmp_path / 'bag3')]) == 2
    assert '000001.npy: not a readable .npy array' in capsys.readouterr().err
    assert not (tmp_path / 'bag2').exists() and not (tmp_path / 'bag3').exists()
