"""Atomic file writes for the adaptation outputs (see :mod:`pwan_ros.io.atomic`)."""

from pwan_ros.io.atomic import (
    OutputError,
    atomic_path,
    check_output,
    os_error_text,
    write_bytes,
    write_json,
    write_npy,
    write_text,
)

__all__ = [
    'OutputError',
    'atomic_path',
    'check_output',
    'os_error_text',
    'write_bytes',
    'write_json',
    'write_npy',
    'write_text',
]
