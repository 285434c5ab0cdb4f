"""What the package's launch files share (``launch/*.launch.py``).

``ros2 launch`` logs the death of a node and still returns 0, so a script cannot tell a node
that refused its parameters (one line, exit 2) from a run that went well. :func:`required`
makes such an exit end the launch with exit code 1. :func:`after_output` starts actions once a
process has said something (a bag player once the node is ready).
"""

from __future__ import annotations

import difflib

from launch.actions import RegisterEventHandler
from launch.event_handlers import OnProcessExit, OnProcessIO
from launch.logging import get_logger


def required(node, executable: str) -> RegisterEventHandler:
    """An event handler for ``node``: when it exits with a non-zero code while the launch is not
    shutting down (not after Ctrl-C), the launch stops everything it started, prints one
    ``[ERROR]`` line naming ``executable`` and returns 1."""

    def on_exit(event, context):
        if event.returncode not in (0, None) and not context.is_shutdown:
            raise RuntimeError(
                f'{executable} exited with code {event.returncode} (its reason is above); '
                'stopping the launch'
            )

    return RegisterEventHandler(OnProcessExit(target_action=node, on_exit=on_exit))


def after_output(process, text: str, actions) -> RegisterEventHandler:
    """An event handler that starts ``actions`` once, when ``process`` first prints ``text`` (on
    stdout or stderr, where ROS logs go): e.g. a bag player started only once the node it feeds
    says it is ready, so the first scans are not played into a node still loading."""
    seen = {'tail': '', 'fired': False}

    def on_output(event):
        if seen['fired']:
            return None
        chunk = seen['tail'] + event.text.decode(errors='replace')
        if text not in chunk:
            seen['tail'] = chunk[-len(text) :]  # a line split across two reads
            return None
        seen['fired'] = True
        return list(actions)

    return RegisterEventHandler(
        OnProcessIO(target_action=process, on_stdout=on_output, on_stderr=on_output)
    )


def warn_misspelled(context, declared, launch_file: str) -> None:
    """One warning per launch argument given that is not ``declared`` but close to one of them
    (``base_fram:=...``): ``ros2 launch`` accepts any ``name:=value`` and ignores the unknown
    ones. Others are left alone: a launch that includes this one may set its own."""
    for name in sorted(set(context.launch_configurations) - set(declared)):
        close = difflib.get_close_matches(name, declared, n=1, cutoff=0.75)
        if close:
            get_logger(launch_file).warning(
                f'launch argument {name!r} is not one of {launch_file} (ignored): did you mean '
                f'{close[0]!r}? (ros2 launch pwan_ros {launch_file} --show-args)'
            )
