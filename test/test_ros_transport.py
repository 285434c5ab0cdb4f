"""Real DDS between OS processes: a >=50k-point PointCloud2 and a TFMessage (Fast DDS)."""

import hashlib
import json
import pathlib
import subprocess
import sys

import pytest

from peers.dds_peer import make_points

PEER = pathlib.Path(__file__).parent / 'peers' / 'dds_peer.py'


@pytest.mark.ros
def test_pointcloud_and_tf_cross_process(tmp_path, ros_env):
    n = 60000
    out = tmp_path / 'received.json'
    receiver = subprocess.Popen(
        [sys.executable, str(PEER), 'receive', '--out', str(out), '--timeout', '40'], env=ros_env
    )
    publisher = subprocess.Popen(
        [sys.executable, str(PEER), 'publish', '--points', str(n), '--duration', '45'],
        env=ros_env,
        stdout=subprocess.DEVNULL,
    )
    try:
        rc = receiver.wait(timeout=60)
    finally:
        publisher.terminate()
        try:
            publisher.wait(timeout=20)
        except subprocess.TimeoutExpired:
            publisher.kill()
            publisher.wait()
            raise AssertionError('the publishing peer ignored SIGTERM for 20 s') from None
    got = json.loads(out.read_text())
    assert rc == 0, f'receiver got only {sorted(got)}'

    cloud = got['cloud']
    assert cloud['width'] * cloud['height'] == n
    assert cloud['point_step'] == 16
    assert cloud['fields'] == ['x', 'y', 'z', 'intensity']
    assert cloud['frame_id'] == 'lidar'
    assert cloud['sha256'] == hashlib.sha256(make_points(n).tobytes()).hexdigest()

    tf = got['tf']
    assert (tf['parent'], tf['child']) == ('odom', 'base_link')
    assert tf['translation'] == pytest.approx([1.5, -2.0, 0.25])
    assert tf['rotation'] == pytest.approx([0.0, 0.0, 0.3826834, 0.9238795], abs=1e-6)
    # The TFMessage built into the venv must carry upstream's type hash on the wire.
    assert got['tf_type_hashes'] == [
        'RIHS01_e369d0f05a23ae52508854b66f6aa0437f3449d652e8cbf22d5abe85d020f087'
    ]
