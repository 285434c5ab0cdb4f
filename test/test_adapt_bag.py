"""Importing features recorded in a rosbag2 (written with rosbags, as a robot would record
them)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from pwan_ros.adaptation import AdaptInputError, load_npz
from pwan_ros.cli.adapt import import_main
from pwan_ros.adaptation.bag_import import import_bag

TS = get_typestore(Stores.ROS2_JAZZY)
F32 = TS.types['std_msgs/msg/Float32MultiArray']
DIM = TS.types['std_msgs/msg/MultiArrayDimension']
LAYOUT = TS.types['std_msgs/msg/MultiArrayLayout']
I32 = TS.types['std_msgs/msg/Int32']
IMPORT = pathlib.Path(sys.executable).parent / 'pwan_adapt_import'


def write_bag(
    path, feats, labels=None, names=None, storage=StoragePlugin.SQLITE3, label_count=None
):
    with Writer(path, version=9, storage_plugin=storage) as w:
        cf = w.add_connection('/features', F32.__msgtype__, typestore=TS)
        cl = (
            w.add_connection('/label', I32.__msgtype__, typestore=TS)
            if labels is not None
            else None
        )
        for i, row in enumerate(feats):
            label = '' if names is None else names[i]
            msg = F32(
                layout=LAYOUT(
                    dim=[DIM(label=label, size=row.size, stride=row.size)], data_offset=0
                ),
                data=row.astype(np.float32),
            )
            t = 1_000_000 * (i + 1)
            w.write(cf, t, TS.serialize_cdr(msg, F32.__msgtype__))
            if cl is not None and i < (label_count if label_count is not None else len(feats)):
                w.write(cl, t + 1, TS.serialize_cdr(I32(data=int(labels[i])), I32.__msgtype__))


def test_import_label_topic_and_label_field(tmp_path, capsys):
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(25, 12)).astype(np.float32)
    labels = np.arange(25) % 4
    write_bag(tmp_path / 'bag_topic', feats, labels, storage=StoragePlugin.MCAP)
    info = import_bag(
        tmp_path / 'bag_topic', '/features', tmp_path / 'a.npz', label_topic='/label'
    )
    assert info['rows'] == 25 and info['dim'] == 12 and info['labelled']
    fs = load_npz(tmp_path / 'a.npz', require_labels=True)
    np.testing.assert_array_equal(fs.features, feats)
    np.testing.assert_array_equal(fs.labels, labels)

    names = ['mug', 'bike', 'mug', 'laptop', 'bike'] * 5
    write_bag(tmp_path / 'bag_field', feats, names=names)
    rc = import_main(
        [
            str(tmp_path / 'bag_field'),
            '--features-topic',
            '/features',
            '--label-field',
            'layout.dim.0.label',
            '--output',
            str(tmp_path / 'b.npz'),
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out)['class_names'] == ['bike', 'laptop', 'mug']
    fs = load_npz(tmp_path / 'b.npz')
    assert fs.class_names == ['bike', 'laptop', 'mug']
    np.testing.assert_array_equal(
        fs.labels, [{'bike': 0, 'laptop': 1, 'mug': 2}[n] for n in names]
    )

    info = import_bag(tmp_path / 'bag_field', '/features', tmp_path / 'c.npz')  # unlabelled
    assert not info['labelled'] and load_npz(tmp_path / 'c.npz').labels is None


def test_import_errors(tmp_path):
    feats = np.ones((6, 3), np.float32)
    write_bag(tmp_path / 'short', feats, np.zeros(6), label_count=4)
    with pytest.raises(AdaptInputError, match='6 messages on /features but 4 on /label'):
        import_bag(tmp_path / 'short', '/features', tmp_path / 'x.npz', label_topic='/label')
    with pytest.raises(
        AdaptInputError, match=r'topic /nope is not in the bag \(it has: /features, /label\)'
    ):
        import_bag(tmp_path / 'short', '/nope', tmp_path / 'x.npz')
    with pytest.raises(AdaptInputError, match="no field 'layout.nothing'"):
        import_bag(
            tmp_path / 'short', '/features', tmp_path / 'x.npz', label_field='layout.nothing'
        )
    with pytest.raises(
        AdaptInputError,
        match=r"/label \(std_msgs/msg/Int32\): field 'data' holds one value, not a feature vector",
    ):  # the label topic given as the features
        import_bag(tmp_path / 'short', '/label', tmp_path / 'x.npz')
    bad = feats.copy()
    bad[2, 1] = np.nan
    write_bag(tmp_path / 'nan', bad)
    with pytest.raises(AdaptInputError, match='NaN'):
        import_bag(tmp_path / 'nan', '/features', tmp_path / 'x.npz')
    assert not (tmp_path / 'x.npz').exists()
    proc = subprocess.run(
        [
            str(IMPORT),
            str(tmp_path / 'missing'),
            '--features-topic',
            '/f',
            '--output',
            str(tmp_path / 'x.npz'),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr
