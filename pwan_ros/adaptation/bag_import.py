"""Import image features recorded in a rosbag2 into the ``.npz`` format of :mod:`.data`.

One message per image on the features topic (e.g. ``std_msgs/msg/Float32MultiArray``, field
``data``). Labels come from a parallel topic (the i-th label message belongs to the i-th
feature message, e.g. ``std_msgs/msg/Int32``; field ``data``) or from a field of the feature
message itself (``--label-field``, e.g. ``layout.dim.0.label`` holding a class name). String
labels are mapped to ids by ``class_names`` (given, or sorted unique names). Uses ``rosbags``
(no ROS install needed); types come from the bag, else from the Jazzy type store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .data import save_npz
from .errors import AdaptInputError, AdaptOutputError
from pwan_ros.io.atomic import OutputError, check_output


def _get(msg: Any, path: str, topic: str) -> Any:
    obj = msg
    for part in path.split('.'):
        if part.isdigit() and isinstance(obj, (list, tuple, np.ndarray)):
            i = int(part)
            if i >= len(obj):
                raise AdaptInputError(
                    f"topic {topic}: field path '{path}': index {i} out of range"
                )
            obj = obj[i]
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            raise AdaptInputError(
                f"topic {topic}: message {type(msg).__name__} has no field '{path}'"
            )
    return obj


def _read(reader, topic: str) -> Tuple[str, List[Any]]:
    """(message type, deserialised messages) of ``topic``."""
    conns = [c for c in reader.connections if c.topic == topic]
    if not conns:
        have = ', '.join(sorted({c.topic for c in reader.connections})) or 'no topics'
        raise AdaptInputError(f'topic {topic} is not in the bag (it has: {have})')
    msgtype = conns[0].msgtype
    return msgtype, [
        reader.deserialize(raw, conn.msgtype)
        for conn, _, raw in reader.messages(connections=conns)
    ]


def _feature_row(msg: Any, field: str, topic: str, msgtype: str) -> np.ndarray:
    """The feature vector in ``msg.<field>`` as float64 (D,); errors name the message type."""
    value = _get(msg, field, topic)
    expect = 'expected one feature vector per message, e.g. std_msgs/msg/Float32MultiArray'
    raw = np.asarray(value)
    if raw.ndim == 0:
        raise AdaptInputError(
            f"topic {topic} ({msgtype}): field '{field}' holds one value, not a feature "
            f'vector (a label topic?); {expect}'
        )
    if raw.dtype == np.uint8 and not msgtype.endswith('MultiArray'):
        raise AdaptInputError(
            f"topic {topic} ({msgtype}): field '{field}' holds raw bytes, not a feature "
            f'vector; {expect}'
        )
    try:
        row = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise AdaptInputError(
            f"topic {topic} ({msgtype}): field '{field}' is not a numeric array; {expect}"
        ) from None
    return row.ravel()


def _features(feats: list, field: str, topic: str, msgtype: str) -> np.ndarray:
    """(n, D) float32 features of the messages ``feats``: one fixed-length finite vector each."""
    if not feats:
        raise AdaptInputError(f'topic {topic} has no messages')
    rows = [_feature_row(m, field, topic, msgtype) for m in feats]
    dims = {r.size for r in rows}
    if len(dims) != 1:
        shown = sorted(dims)[:5]
        raise AdaptInputError(
            f"topic {topic} ({msgtype}): field '{field}' has different lengths across messages "
            f'({", ".join(map(str, shown))}{"..." if len(dims) > 5 else ""})'
            '; expected one fixed-length feature vector per message'
        )
    if 0 in dims:
        raise AdaptInputError(f'topic {topic}: feature vectors are empty')
    features = np.stack(rows).astype(np.float32)
    if not np.isfinite(features).all():
        raise AdaptInputError(f'topic {topic}: features contain NaN or infinite values')
    return features


def _labels(raw_labels: list, names: Optional[list]) -> tuple:
    """(labels (n,) int64, class names): strings numbered by ``names`` (sorted when None), or
    non-negative integer class ids."""
    if all(isinstance(v, str) for v in raw_labels):
        names = names or sorted(set(raw_labels))
        index = {n: i for i, n in enumerate(names)}
        unknown = sorted(set(raw_labels) - set(index))
        if unknown:
            raise AdaptInputError(f'labels {unknown} are not in class_names {names}')
        return np.array([index[v] for v in raw_labels], dtype=np.int64), names
    try:
        arr = np.asarray(raw_labels, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise AdaptInputError(f'labels are neither integers nor strings: {exc}') from exc
    if arr.ndim != 1 or not np.all(arr == np.round(arr)) or (arr < 0).any():
        raise AdaptInputError(
            'labels must be non-negative integers (0-based class ids), one per message'
        )
    labels = arr.astype(np.int64)
    if names is not None and labels.max() >= len(names):
        raise AdaptInputError(
            f'label {int(labels.max())} out of range for {len(names)} class_names'
        )
    return labels, names


def import_bag(
    bag,
    features_topic: str,
    output,
    features_field: str = 'data',
    label_topic: Optional[str] = None,
    label_field: Optional[str] = None,
    class_names: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """Read the bag and write ``output`` (.npz, atomic). Returns ``{rows, dim, labelled, ...}``."""
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    if not os.path.exists(bag):
        raise AdaptInputError(f'bag {bag} does not exist')
    try:
        check_output(output)  # before reading the bag
    except OutputError as exc:
        raise AdaptOutputError(str(exc)) from None
    try:
        with AnyReader([Path(bag)], default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
            msgtype, feats = _read(reader, features_topic)
            label_msgs = _read(reader, label_topic)[1] if label_topic else None
    except AdaptInputError:
        raise
    except Exception as exc:  # rosbags raises several unrelated types for unreadable bags
        raise AdaptInputError(f'cannot read bag {bag}: {exc}') from exc
    features = _features(feats, features_field, features_topic, msgtype)
    raw_labels = None
    if label_msgs is not None:
        if len(label_msgs) != len(feats):
            raise AdaptInputError(
                f'{len(feats)} messages on {features_topic} but {len(label_msgs)} on '
                f'{label_topic}: label messages must pair one-to-one with feature messages'
            )
        raw_labels = [_get(m, label_field or 'data', label_topic) for m in label_msgs]
    elif label_field:
        raw_labels = [_get(m, label_field, features_topic) for m in feats]
    names = list(class_names) if class_names else None
    labels, names = (None, names) if raw_labels is None else _labels(raw_labels, names)
    try:
        save_npz(output, features, labels, names)
    except OSError as exc:
        raise AdaptOutputError(f'{output}: {exc.strerror or exc}') from None
    return {
        'output': os.path.abspath(output),
        'rows': int(features.shape[0]),
        'dim': int(features.shape[1]),
        'labelled': labels is not None,
        'class_names': names,
    }
