"""ROS 2 node ``pwan_classifier`` (executable ``pwan_classifier_node``): the adapted classifier
on live features, closing the record -> adapt -> deploy loop.

A thin adapter over :mod:`pwan_ros.adaptation.deploy`: it converts messages and publishes; the
model logic lives there. Topics (relative names, remap them): subscribes ``features``
(std_msgs/Float32MultiArray, field ``data``: one feature vector per message, the format
``pwan_adapt_import`` reads from bags); publishes for each valid message, back to back,
``class_id`` (std_msgs/Int32, 0-based), ``confidence`` (std_msgs/Float32, softmax probability
of that class) and, when the run recorded class names, ``class_name`` (std_msgs/String), and
``prediction`` (std_msgs/String, one JSON object naming the input it answers: ``index`` (0-based
count of feature messages this node received), ``seq`` (the input's DDS publication sequence
number), ``stamp_ns`` (its source timestamp), ``class_id``, ``confidence``, ``class_name``). A
message of the wrong length or with NaN/inf values is skipped with a warning (at most one per 5 s).
Inputs lost before the callback (a burst larger than ``queue_depth``) show as gaps in the
publishers' sequence numbers: they are counted, warned about and reported with the other counts
on ``/diagnostics`` (status ``pwan_classifier``) every ``status_period`` seconds and at exit.

Parameters: :class:`pwan_ros.adaptation.deploy.ClassifierConfig` (read-only). A missing or
unusable model or an invalid parameter: one line on stderr, exit status 2, before ``ready``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Dict

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float32, Float32MultiArray, Int32, String

from pwan_ros.adaptation.deploy import ClassifierConfig, load_classifier
from pwan_ros.adaptation.errors import AdaptConfigError, AdaptError, AdaptInputError
from pwan_ros.ros.spin import spin_node
from pwan_ros.ros.params import declare_config, undeclared

NAME = 'pwan_classifier'


class ClassifierNode(Node):
    """The ``pwan_classifier`` node. Raises AdaptError for invalid parameters or an unusable
    model."""

    def __init__(self, **kwargs):
        super().__init__(NAME, **kwargs)
        values = declare_config(self, ClassifierConfig, read_only=True)
        unknown = undeclared(self)
        if unknown:
            raise AdaptConfigError(f'unknown parameter(s): {", ".join(unknown)}')
        cfg = self.config = ClassifierConfig(**values)
        if not cfg.model:
            raise AdaptConfigError(
                "parameter 'model' is required: the model.ts written by pwan_adapt, "
                'e.g. -p model:=/path/to/output/model.ts'
            )
        self.classifier = load_classifier(cfg.model, cfg.device)
        reliability = (
            ReliabilityPolicy.RELIABLE
            if cfg.reliability == 'reliable'
            else ReliabilityPolicy.BEST_EFFORT
        )
        qos = QoSProfile(
            depth=cfg.queue_depth, history=HistoryPolicy.KEEP_LAST, reliability=reliability
        )
        self.id_pub = self.create_publisher(Int32, 'class_id', cfg.queue_depth)
        self.conf_pub = self.create_publisher(Float32, 'confidence', cfg.queue_depth)
        self.name_pub = (
            self.create_publisher(String, 'class_name', cfg.queue_depth)
            if self.classifier.class_names
            else None
        )
        self.pred_pub = self.create_publisher(String, 'prediction', cfg.queue_depth)
        self.sub = self.create_subscription(Float32MultiArray, 'features', self._on_features, qos)
        self.diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.counts = dict(received=0, classified=0, skipped=0, dropped=0)
        self._last_seq = None
        self._reported = dict(self.counts)
        self._warned: Dict[str, float] = {}
        # on the steady clock: the status keeps coming under use_sim_time, /clock or not
        self.timer = self.create_timer(
            cfg.status_period, self.publish_status, clock=Clock(clock_type=ClockType.STEADY_TIME)
        )
        c = self.classifier
        self.get_logger().info(
            f"{NAME} ready: model='{c.path}' dim={c.dim} classes={c.num_classes} "
            f"device={c.device} features={self.sub.topic_name} ({cfg.reliability}, depth "
            f"{cfg.queue_depth}) -> class_id, confidence"
            + (', class_name' if self.name_pub is not None else '')
            + ', prediction'
        )

    def _warn(self, key: str, text: str, period: float = 5.0) -> None:
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) >= period:
            self._warned[key] = now
            self.get_logger().warning(text)

    def _count_gap(self, info) -> None:
        """Count inputs lost before this callback: gaps in the publisher's sequence numbers (a
        number that goes back means another or a restarted publisher: no gap is counted)."""
        seq = None if info is None else info.get('publication_sequence_number')
        if not seq or seq >= 2**63:  # 0 / all ones: the middleware does not report it
            return
        if self._last_seq is not None and seq > self._last_seq + 1:
            lost = seq - self._last_seq - 1
            self.counts['dropped'] += lost
            self._warn(
                'dropped',
                f"{lost} features message(s) lost before classification ({self.counts['dropped']} "
                f'so far): the input arrives faster than it is classified; raise queue_depth '
                f'(now {self.config.queue_depth}) or the publisher\'s history depth',
                period=1.0,
            )
        self._last_seq = seq

    def _on_features(self, msg: Float32MultiArray, info: dict) -> None:
        index = self.counts['received']
        self.counts['received'] += 1
        self._count_gap(info)
        try:
            pred = self.classifier.classify(np.asarray(msg.data, dtype=np.float32).ravel())
        except AdaptInputError as exc:
            self.counts['skipped'] += 1
            self._warn(
                'input',
                f"features message {index} skipped: {exc} ({self.counts['skipped']} skipped so "
                "far)",
            )
            return
        except Exception as exc:  # never let one message kill the node
            self.counts['skipped'] += 1
            self._warn(
                'internal', f'features message {index} skipped after an internal error: {exc!r}'
            )
            return
        self.id_pub.publish(Int32(data=pred.class_id))
        self.conf_pub.publish(Float32(data=pred.confidence))
        if self.name_pub is not None:
            self.name_pub.publish(String(data=pred.class_name))
        seq = None if info is None else info.get('publication_sequence_number')
        stamp = None if info is None else info.get('source_timestamp')
        self.pred_pub.publish(
            String(
                data=json.dumps(
                    {
                        'index': index,
                        'seq': seq,
                        'stamp_ns': stamp,
                        'class_id': pred.class_id,
                        'confidence': pred.confidence,
                        'class_name': pred.class_name,
                    },
                    allow_nan=False,
                )
            )
        )
        self.counts['classified'] += 1

    def publish_status(self) -> None:
        """Counts on /diagnostics (WARN while messages are being dropped or skipped)."""
        new_loss = (
            self.counts['dropped'] > self._reported['dropped']
            or self.counts['skipped'] > self._reported['skipped']
        )
        self._reported = dict(self.counts)
        st = DiagnosticStatus(name=NAME, hardware_id=self.get_fully_qualified_name())
        st.level = DiagnosticStatus.WARN if new_loss else DiagnosticStatus.OK
        st.message = (
            f"{self.counts['dropped']} dropped, {self.counts['skipped']} skipped"
            if new_loss
            else 'ok'
        )
        st.values = [KeyValue(key=k, value=str(v)) for k, v in self.counts.items()]
        arr = DiagnosticArray(status=[st])
        arr.header.stamp = self.get_clock().now().to_msg()
        self.diag_pub.publish(arr)

    def destroy_node(self):
        """At exit: the final counts as one log line and one last status message."""
        c = self.counts
        try:
            self.publish_status()
        except Exception:  # context already shut down: the log line still reports
            pass
        self.get_logger().info(
            f"{NAME}: received {c['received']}, classified {c['classified']}, skipped "
            f"{c['skipped']}, dropped {c['dropped']}"
        )
        return super().destroy_node()


def main(args=None) -> int:
    return spin_node(NAME, ClassifierNode, (AdaptError,), args)


if __name__ == '__main__':
    sys.exit(main())
