"""ROS 2 node ``pwan_classifier`` (executable ``pwan_classifier_node``): the adapted classifier
on live features, closing the record -> adapt -> deploy loop.

A thin adapter over :mod:`pwan_ros.adaptation.deploy`: it converts messages and publishes; the
model logic lives there. Topics (relative names, remap them): subscribes ``features``
(std_msgs/Float32MultiArray, field ``data``: one feature vector per message, the format
``pwan_adapt_import`` reads from bags); publishes for each valid message, back to back,
``class_id`` (std_msgs/Int32, 0-based), ``confidence`` (std_msgs/Float32, softmax probability
of that class) and, when the run recorded class names, ``class_name`` (std_msgs/String). The
i-th message on each output topic belongs to the i-th valid input. A message of the wrong
length or with NaN/inf values is skipped with a warning (at most one per 5 s).

Parameters: :class:`pwan_ros.adaptation.deploy.ClassifierConfig` (read-only). A missing or
unusable model or an invalid parameter: one line on stderr, exit status 2, before ``ready``.
"""
from __future__ import annotations

import sys
import time
from typing import Dict

import numpy as np
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float32, Float32MultiArray, Int32, String

from pwan_ros.adaptation.deploy import ClassifierConfig, load_classifier
from pwan_ros.adaptation.errors import AdaptConfigError, AdaptError, AdaptInputError
from pwan_ros.ros.spin import spin_node
from pwan_ros.ros.params import declare_config

NAME = 'pwan_classifier'


class ClassifierNode(Node):
    """The ``pwan_classifier`` node. Raises AdaptError for invalid parameters or an unusable model."""

    def __init__(self, **kwargs):
        super().__init__(NAME, **kwargs)
        values, _ = declare_config(self, ClassifierConfig, read_only=True)
        cfg = self.config = ClassifierConfig(**values)
        if not cfg.model:
            raise AdaptConfigError("parameter 'model' is required: the model.ts written by pwan_adapt, "
                                   'e.g. -p model:=/path/to/output/model.ts')
        self.classifier = load_classifier(cfg.model, cfg.device)
        reliability = ReliabilityPolicy.RELIABLE if cfg.reliability == 'reliable' else ReliabilityPolicy.BEST_EFFORT
        qos = QoSProfile(depth=cfg.queue_depth, history=HistoryPolicy.KEEP_LAST, reliability=reliability)
        self.id_pub = self.create_publisher(Int32, 'class_id', cfg.queue_depth)
        self.conf_pub = self.create_publisher(Float32, 'confidence', cfg.queue_depth)
        self.name_pub = (self.create_publisher(String, 'class_name', cfg.queue_depth)
                         if self.classifier.class_names else None)
        self.sub = self.create_subscription(Float32MultiArray, 'features', self._on_features, qos)
        self.counts = dict(received=0, classified=0, skipped=0)
        self._warned: Dict[str, float] = {}
        c = self.classifier
        self.get_logger().info(
            f"{NAME} ready: model='{c.path}' dim={c.dim} classes={c.num_classes} device={c.device} "
            f'features={self.sub.topic_name} ({cfg.reliability}) -> class_id, confidence'
            + (', class_name' if self.name_pub is not None else ''))

    def _warn(self, key: str, text: str, period: float = 5.0) -> None:
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) >= period:
            self._warned[key] = now
            self.get_logger().warning(text)

    def _on_features(self, msg: Float32MultiArray) -> None:
        self.counts['received'] += 1
        try:
            pred = self.classifier.classify(np.asarray(msg.data, dtype=np.float32).ravel())
        except AdaptInputError as exc:
            self.counts['skipped'] += 1
            self._warn('input', f"features message skipped: {exc} ({self.counts['skipped']} skipped so far)")
            return
        except Exception as exc:  # never let one message kill the node
            self.counts['skipped'] += 1
            self._warn('internal', f'features message skipped after an internal error: {exc!r}')
            return
        self.id_pub.publish(Int32(data=pred.class_id))
        self.conf_pub.publish(Float32(data=pred.confidence))
        if self.name_pub is not None:
            self.name_pub.publish(String(data=pred.class_name))
        self.counts['classified'] += 1


def main(args=None) -> int:
    return spin_node(NAME, ClassifierNode, (AdaptError,), args)


if __name__ == '__main__':
    sys.exit(main())
