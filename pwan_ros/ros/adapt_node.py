"""``adapt_node``: the offline adaptation trainer as a ROS 2 node (thin adapter, no training code).

Parameters: every :class:`pwan_ros.adaptation.AdaptConfig` field (same names as the CLI flags
and the keys of ``config/adapt.yaml``) plus ``labelled``, ``unlabelled``, ``output`` (paths),
``resume`` (bool) and ``progress_interval`` (steps between status messages). Publishes
``diagnostic_msgs/DiagnosticArray`` on ``/diagnostics`` (status name ``adapt_node: training``;
key/values step, steps, loss, ce, w1, entropy, m_alpha, lr, state, and after evaluations
unlabelled_entropy / accuracy; the final one also deployed / deployed_reason: which model
model.ts holds, adapted or source_only, and why; source_only_model: mlp or linear), writes the
outputs of :func:`run_adaptation`, and exits when done (status 0). SIGINT/SIGTERM stop training
after the current step, write ``checkpoints/latest.pt`` and exit 0; invalid parameters or
inputs, or an output that cannot be written (read-only or full disk), exit 2 with a clear log
line (and ``state: error`` on /diagnostics once training was started).
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any, Dict, List, Optional

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import ParameterDescriptor, ParameterType
from rclpy.node import Node

from pwan_ros.adaptation.config import AdaptConfig, AdaptIO
from pwan_ros.adaptation.errors import AdaptError
from pwan_ros.params import specs
from pwan_ros.ros.args import argument_problem
from pwan_ros.ros.params import descriptor, undeclared
from pwan_ros.ros.spin import init_rclpy, rcl_message

STATUS_NAME = 'adapt_node: training'


class AdaptNode(Node):
    """Declares and validates the parameters; :meth:`run` trains and publishes progress."""

    def __init__(self):
        super().__init__('adapt_node')
        self._born = time.monotonic()
        self.errors: List[str] = []
        self._last_status: Optional[tuple] = None
        values: Dict[str, Any] = {}
        for name, (default, spec) in {**specs(AdaptConfig), **specs(AdaptIO)}.items():
            values[name] = self._declare(name, default, descriptor(name, default, spec))
        io = {name: values.pop(name) for name in specs(AdaptIO)}
        invalid = {e.split("'")[1] for e in self.errors}  # declared, refused: not unknown
        self.errors += [
            f"unknown parameter '{name}'" for name in undeclared(self) if name not in invalid
        ]
        for name in ('labelled', 'unlabelled', 'output'):
            if not io[name]:
                self.errors.append(
                    f"parameter '{name}' is required (a path), e.g. -p {name}:=/path"
                )
        for name, value in values.items():  # every field on its own: all problems are listed
            try:
                AdaptConfig.from_mapping({name: value})
            except AdaptError as exc:
                self.errors.append(str(exc))
        self.config: Optional[AdaptConfig] = None
        if not self.errors:
            try:
                self.config = AdaptConfig.from_mapping(values)
            except AdaptError as exc:
                self.errors.append(f'invalid parameters: {exc}')
        self.io = io
        self.resume, self.interval = bool(io['resume']), int(io['progress_interval'] or 20)
        self.pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.stop_requested = False

    def _declare(self, name: str, default: Any, desc: ParameterDescriptor) -> Any:
        """Declare one parameter; a wrong type or an out-of-range override becomes an error line
        and the default is used so that the remaining parameters are still checked."""
        try:
            return self.declare_parameter(name, default, desc).value
        except Exception as exc:  # rclpy's exception classes differ between distros
            if 'Type' in type(exc).__name__:
                kind = {
                    ParameterType.PARAMETER_DOUBLE: 'a double',
                    ParameterType.PARAMETER_INTEGER: 'an integer',
                    ParameterType.PARAMETER_BOOL: 'a bool',
                    ParameterType.PARAMETER_STRING: 'a string',
                }[desc.type]
                self.errors.append(f"invalid parameter '{name}': expects {kind}")
            else:
                self.errors.append(
                    f"invalid parameter '{name}': out of range{self._range_text(desc)} ({exc})"
                )
            return default

    @staticmethod
    def _range_text(d: ParameterDescriptor) -> str:
        for r in list(d.integer_range) + list(d.floating_point_range):
            return f' [{r.from_value}, {r.to_value}]'
        return ''

    # ------------------------------------------------------------------ publishing
    def publish_status(self, level: int, message: str, values: Dict[str, Any]) -> None:
        self._last_status = (level, message, values)
        arr = DiagnosticArray()
        arr.header.stamp = self.get_clock().now().to_msg()
        st = DiagnosticStatus(
            level=level, name=STATUS_NAME, message=message, hardware_id='pwan_ros'
        )
        st.values = [KeyValue(key=k, value=str(v)) for k, v in values.items()]
        arr.status = [st]
        self.pub.publish(arr)

    def run(self) -> int:
        from pwan_ros.adaptation.runner import run_adaptation

        cfg = self.config
        last_eval: Dict[str, Any] = {}
        started = []

        def on_step(trainer, m):
            if not started:  # the inputs are read: announce it, then wait for a monitor
                started.append(True)
                self.get_logger().info(
                    f"training {cfg.method} for {cfg.steps} steps -> {self.io['output']}"
                )
                # a monitor already listening (rqt, a test) gets the progress from the first
                # step: a short training otherwise ended before DDS had matched it
                self._await_subscriber(2.0)
            if (m.step + 1) % self.interval == 0 or m.step + 1 == cfg.steps:
                vals = {
                    'state': 'training',
                    'step': m.step + 1,
                    'steps': cfg.steps,
                    'loss': f'{m.loss:.6g}',
                    'ce': f'{m.ce:.6g}',
                    'w1': f'{m.w1:.6g}',
                    'entropy': f'{m.entropy:.6g}',
                    'm_alpha': f'{m.m_alpha:.6g}',
                    'lr': f'{m.lr:.6g}',
                    **last_eval,
                }
                self.publish_status(DiagnosticStatus.OK, f'step {m.step + 1}/{cfg.steps}', vals)
                rclpy.spin_once(self, timeout_sec=0.0)

        def on_eval(trainer, res):
            last_eval['unlabelled_entropy'] = f'{res.mean_entropy:.6g}'
            if res.accuracy is not None:
                last_eval['accuracy'] = f'{res.accuracy:.6g}'

        try:
            result = run_adaptation(
                cfg,
                self.io['labelled'],
                self.io['unlabelled'],
                self.io['output'],
                resume=self.resume,
                on_step=on_step,
                on_eval=on_eval,
                should_stop=lambda: self.stop_requested,
                log=lambda s: self.get_logger().info(s),
                check=self.io['check'],
            )
        except AdaptError as exc:
            self.get_logger().error(str(exc))
            self.publish_status(DiagnosticStatus.ERROR, str(exc), {'state': 'error'})
            self._flush()
            return 2
        state = 'done' if result.completed else 'interrupted'
        vals = {
            'state': state,
            'step': result.steps_done,
            'steps': result.steps,
            'summary': result.summary_path,
            'checkpoint': result.checkpoint_path,
        }
        if result.predictions_path:
            vals['predictions'] = result.predictions_path
        if result.accuracy is not None:
            vals['accuracy'] = f'{result.accuracy:.6g}'
        if result.deployed is not None:
            vals.update(deployed=result.deployed, deployed_reason=result.deployed_reason)
        if result.source_only_model is not None:
            vals['source_only_model'] = result.source_only_model
        self.publish_status(DiagnosticStatus.OK, state, vals)
        self.get_logger().info(
            f'{state} at step {result.steps_done}/{result.steps}; summary {result.summary_path}'
        )
        self._flush()
        return 0

    def _await_subscriber(self, seconds: float) -> None:
        """Spin until /diagnostics has a matched subscriber, at most ``seconds``."""
        wait_until = time.monotonic() + seconds
        while self.pub.get_subscription_count() == 0 and time.monotonic() < wait_until:
            rclpy.spin_once(self, timeout_sec=0.05)

    def _flush(self, seconds: float = 1.0, repeats: int = 3, discovery_s: float = 5.0) -> None:
        """Give DDS time to deliver the last (final) status before the process exits, publishing it
        ``repeats`` times over ``seconds``: a single sample sent just before the writer goes away
        was occasionally lost on a loaded machine (seen once in CI). A node that fails at once
        (unwritable output) may not have matched its subscribers yet: until ``discovery_s`` after
        its start, wait for a first one, then publish the status again. After a signal, half a
        second and no wait: ``ros2 launch`` escalates to SIGTERM 5 s after Ctrl-C (before: up to
        6 s here when nothing subscribed to /diagnostics)."""
        if self.stop_requested:
            seconds, discovery_s = min(seconds, 0.5), 0.0
        self._await_subscriber(discovery_s - (time.monotonic() - self._born))
        if self._last_status is not None:
            self.publish_status(*self._last_status)
        end = time.monotonic() + seconds
        next_pub, sent = time.monotonic() + seconds / repeats, 1
        while time.monotonic() < end:
            rclpy.spin_once(self, timeout_sec=0.05)
            if sent < repeats and time.monotonic() >= next_pub and self._last_status is not None:
                self.publish_status(*self._last_status)
                sent += 1
                next_pub += seconds / repeats


def main(args: Optional[List[str]] = None) -> int:
    argv = args if args is not None else sys.argv
    problem = argument_problem(argv)
    if problem:
        print(f'adapt_node: {problem}', file=sys.stderr)
        return 2
    try:
        init_rclpy(argv)
    except Exception as exc:  # rclpy raises its own error types for malformed --ros-args
        print(f'adapt_node: invalid ROS arguments: {rcl_message(exc)}', file=sys.stderr)
        return 2
    node = AdaptNode()
    handlers = {}
    try:

        def on_signal(signum, frame):
            node.stop_requested = True
            node.get_logger().info(f'signal {signum}: stopping after the current step')

        for s in (signal.SIGINT, signal.SIGTERM):
            handlers[s] = signal.signal(s, on_signal)
        if node.errors:
            for e in node.errors:
                node.get_logger().error(e)
            rc = 2
        else:
            rc = node.run()
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
        for s, h in handlers.items():
            signal.signal(s, h)
    return rc


if __name__ == '__main__':
    sys.exit(main())
