"""Checks of a node's command line before rclpy sees it (no rclpy import).

rcl rejects a missing or malformed ``--params-file`` with a multi-line C error that rclpy turns
into a traceback, and ignores arguments outside ``--ros-args`` (a node started with
``--params-file f.yaml`` or ``name:=value`` without it would run on its defaults);
:func:`argument_problem` finds those cases first and names them.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import yaml


def argument_problem(argv: Sequence[str]) -> Optional[str]:
    """One line describing the first unusable argument of a node's ``argv`` (argv[0] is the
    program): one outside ``--ros-args`` (the node takes no arguments of its own), or an unusable
    ``--params-file`` (:func:`params_file_problem`); None if all are fine."""
    in_ros = False
    for arg in list(argv)[1:]:
        if arg == '--ros-args':
            in_ros = True
        elif arg == '--' and in_ros:
            in_ros = False
        elif not in_ros:
            return (
                f"unknown argument '{arg}': ROS arguments go after --ros-args "
                '(e.g. --ros-args -p name:=value --params-file file.yaml)'
            )
    return params_file_problem(argv)


def params_file_problem(argv: Sequence[str]) -> Optional[str]:
    """One line describing the first unusable ``--params-file`` in ``argv`` (None if all are fine):
    missing, a directory, unreadable, not YAML, or not a mapping of node names to parameters."""
    args = list(argv)
    in_ros = False
    for i, arg in enumerate(args):
        if arg == '--ros-args':
            in_ros = True
        elif arg == '--':
            in_ros = False
        elif in_ros and arg == '--params-file':
            if i + 1 >= len(args):
                return '--params-file needs a file name'
            path = args[i + 1]
            if os.path.isdir(path):
                return f'params file {path}: is a directory'
            if not os.path.exists(path):
                return f'params file {path}: no such file'
            try:
                with open(path, encoding='utf-8') as fh:
                    data = yaml.safe_load(fh)
            except OSError as exc:
                return f'params file {path}: cannot read ({exc.strerror})'
            except (yaml.YAMLError, UnicodeDecodeError) as exc:
                where = getattr(exc, 'problem_mark', None)
                at = f' at line {where.line + 1}' if where is not None else ''
                return f'params file {path}: not valid YAML{at}'
            if not isinstance(data, dict) or not all(
                isinstance(v, dict) and isinstance(v.get('ros__parameters', {}), dict)
                for v in data.values()
            ):
                return (
                    f'params file {path}: expected a YAML mapping of node names to '
                    "{ros__parameters: {name: value}}"
                )
    return None
