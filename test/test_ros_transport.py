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


def test_the_writer_followed_on_a_topic():
    """Two writers interleaved (sequence numbers 1, 2, 3 ... and 1, 2, 3 ...): the first is
    followed, every sample of the second is another writer's; a writer restarted after falling
    silent (over 3 of its periods) is followed at once; a new writer streaming alone is followed
    after SWITCH_AFTER samples in a row; samples without a sequence number pass."""
    from pwan_ros.ros.scan_subscription import SWITCH_AFTER, WriterFollower

    w, t = WriterFollower(), 0.0
    for k in range(1, 6):
        t += 0.1
        assert w.follows(100 + k, t)  # the first writer, 10 Hz
        assert not w.follows(k, t + 0.01)  # the second writer
    assert w.follows(1, t + 5.0)  # restarted after 5 s: followed at once
    assert w.follows(2, t + 5.1) and not w.follows(0 + 1, t + 5.11)
    w2 = WriterFollower()
    for k in range(1, 4):
        w2.follows(50 + k, 0.1 * k)
    new = [w2.follows(k, 0.35 + 0.01 * k) for k in range(1, SWITCH_AFTER + 2)]  # no silence
    assert new == [False] * (SWITCH_AFTER - 1) + [True, True]
    assert w2.follows(None, 1.0) and w2.follows(0, 1.0)
