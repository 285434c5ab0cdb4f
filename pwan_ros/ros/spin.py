"""The ``main`` of a long-running node: argument checks, spin, clean exit codes.

Exit 0 on Ctrl-C / SIGTERM / shutdown; 2 with one line on stderr for an unusable
``--params-file``, malformed ``--ros-args`` or parameters the node rejects (``errors``).

Signals are the node's own, not rclpy's: SIGINT and SIGTERM only set a flag that the spin loop
checks at least every :data:`POLL_S` seconds. No KeyboardInterrupt is ever raised into the
executor or a callback, where it can leave an entity's handle held and make the shutdown that
follows wait on it (seen: about one replay in ten, the node ignored the first SIGINT after the
bag ended); a signal ends the node promptly, also when it was started with SIGINT ignored (a
background job of a non-interactive shell).
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import warnings
from typing import Callable, Optional, Sequence, Tuple, Type

import rclpy
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

from pwan_ros.ros.args import argument_problem


def log_warnings(node) -> None:
    """Python warnings (numpy, torch, the core's RuntimeWarnings) go through ``node``'s logger,
    each text once, instead of raw to stderr."""
    seen = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = f'{category.__name__}: {message}'
        if text not in seen:
            seen.add(text)
            node.get_logger().warning(text)

    warnings.showwarning = show


def spin_node(
    prog: str,
    make_node: Callable[[], object],
    errors: Tuple[Type[BaseException], ...],
    args: Optional[Sequence[str]] = None,
    error_prefix: str = '',
) -> int:
    """Init rclpy with ``args``, build the node with ``make_node()`` and spin it; returns the exit
    code. ``errors``: the node's configuration errors, printed as ``prog: error_prefix
    message``."""
    problem = argument_problem(sys.argv if args is None else args)
    if problem:
        print(f'{prog}: {problem}', file=sys.stderr)
        return 2
    try:
        init_rclpy(args)
    except Exception as exc:  # rcl's argument errors (RCLError) are multi-line C messages
        print(f'{prog}: invalid ROS arguments: {rcl_message(exc)}', file=sys.stderr)
        return 2
    node = None
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda signum, frame: stop.set())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        node = make_node()
        log_warnings(node)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        while not stop.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=POLL_S)
    except tuple(errors) + (InvalidParameterTypeException, InvalidParameterValueException) as exc:
        print(f'{prog}: {error_prefix}{exc}', file=sys.stderr)
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


#: longest time (s) between two looks at the stop flag
POLL_S = 0.2


def rcl_message(exc: BaseException) -> str:
    """The first line of an rcl error without rcl's C trailer (``Error: error not set, at
    /project/src/rcl/arguments.c:380``, quotes)."""
    text = str(exc).splitlines()[0] if str(exc) else repr(exc)
    text = re.sub(r'(\.? Error: [^,]*)?, at /\S+:\d+\W*$', '', text)
    return text.strip().strip('"')


def init_rclpy(args) -> None:
    """rclpy.init without rclpy's own signal handlers: the caller handles SIGINT / SIGTERM (the
    loop above polls a flag; a CLI lets KeyboardInterrupt unwind its main thread). rclpy's
    handlers would shut the context down under running threads and publishers."""
    try:
        from rclpy.signals import SignalHandlerOptions
    except ImportError:  # older rclpy: its handlers stay, the loop still polls
        rclpy.init(args=args)
        return
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
