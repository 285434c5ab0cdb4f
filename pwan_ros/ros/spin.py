"""The ``main`` of a long-running node: argument checks, spin, clean exit codes.

Exit 0 on Ctrl-C / SIGTERM / shutdown; 2 with one line on stderr for an unusable
``--params-file``, malformed ``--ros-args`` or parameters the node rejects (``errors``).
"""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence, Tuple, Type

import rclpy
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.executors import ExternalShutdownException

from pwan_ros.ros.args import params_file_problem


def spin_node(prog: str, make_node: Callable[[], object], errors: Tuple[Type[BaseException], ...],
              args: Optional[Sequence[str]] = None, error_prefix: str = '') -> int:
    """Init rclpy with ``args``, build the node with ``make_node()`` and spin it; returns the exit code.
    ``errors``: the node's configuration errors, printed as ``prog: error_prefix message``."""
    problem = params_file_problem(sys.argv if args is None else args)
    if problem:
        print(f'{prog}: {problem}', file=sys.stderr)
        return 2
    try:
        rclpy.init(args=args)
    except Exception as exc:  # rcl's argument errors (RCLError) are multi-line C messages
        print(f"{prog}: invalid ROS arguments: {str(exc).splitlines()[0] if str(exc) else exc!r}", file=sys.stderr)
        return 2
    node = None
    try:
        node = make_node()
        rclpy.spin(node)
    except tuple(errors) + (InvalidParameterTypeException, InvalidParameterValueException) as exc:
        print(f'{prog}: {error_prefix}{exc}', file=sys.stderr)
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0
