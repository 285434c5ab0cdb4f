"""Atomic outputs: every file or directory is written under a temporary sibling name and renamed
into place only when complete, so an interrupted or failed run never leaves a complete-looking
but truncated output. Final permissions follow the process umask (like ``open(path, 'w')``).

``check_output(path)`` validates an output path before any work starts (parent writable, not a
directory where a file is expected), raising :class:`OutputError` with a one-line message.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator

import numpy as np


class OutputError(ValueError):
    """An output that cannot be written (message names the path and the reason)."""


def _umask() -> int:
    """The process umask, read without changing it (Linux), else by the set-and-restore idiom."""
    try:
        with open('/proc/self/status') as fh:
            for line in fh:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _chmod_default(path: str, directory: bool = False) -> None:
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def os_error_text(exc: OSError) -> str:
    """``path: reason`` for an OSError (e.g. ``/data/out: File too large``), one line."""
    reason = exc.strerror or str(exc)
    return f'{exc.filename}: {reason}' if exc.filename else reason


def check_output(path, directory: bool = False, must_not_exist: bool = False) -> str:
    """Validate an output path before the work starts; returns it as ``str``.

    directory: the output is a directory (else a file). must_not_exist: refuse an existing path
    (rosbag2 writers need a new directory). Missing parent directories are fine (created on
    write) as long as the nearest existing ancestor is a writable directory; a file is made and
    removed there (or in the existing output directory) to prove it."""
    path = os.fspath(path)
    if not path:
        raise OutputError('empty output path')
    if os.path.lexists(path):
        if must_not_exist:
            raise OutputError(f'{path}: already exists')
        if directory and not os.path.isdir(path):
            raise OutputError(f'{path}: exists and is not a directory')
        if not directory and os.path.isdir(path):
            raise OutputError(f'{path}: is a directory')
    # where the first file will be made: inside an existing output directory, else in the
    # nearest existing ancestor
    parent = os.path.abspath(path)
    if not (directory and os.path.isdir(parent)):
        parent = os.path.dirname(parent)
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputError(f'{path}: {parent} is not a directory')
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f'{path}: {parent} is not writable')
    try:  # a file system that refuses new files (/proc, /sys, full quotas) for root as well
        fd, probe = tempfile.mkstemp(prefix='.pwan-probe.', dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f'{path}: cannot create files in {parent} ({exc.strerror})') from None
    return path


@contextlib.contextmanager
def atomic_path(path, suffix: str = '.tmp') -> Iterator[str]:
    """Yield a temporary file path next to ``path`` (ending in ``suffix``, for writers that pick
    the format from the extension); on success rename it to ``path`` (umask permissions), on any
    exception (KeyboardInterrupt included) delete it and re-raise."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix='.' + os.path.basename(path) + '.', suffix=suffix, dir=directory
    )
    os.close(fd)
    try:
        yield tmp
        _chmod_default(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if exc.filename in (None, tmp):  # a failed write() names no file: name the output
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None
        raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path) -> Iterator[str]:
    """Yield a temporary directory path (not yet existing, for writers that create their own
    directory, e.g. rosbag2) next to ``path``; on success rename it to ``path``, which must not
    exist; on any exception remove it and re-raise."""
    path = os.fspath(path).rstrip(os.sep) or os.sep
    if os.path.lexists(path):
        raise OutputError(f'{path}: already exists')
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    holder = tempfile.mkdtemp(prefix='.' + os.path.basename(path) + '.', suffix='.tmp', dir=parent)
    tmp = os.path.join(holder, os.path.basename(path))
    try:
        yield tmp
        if os.path.isdir(tmp):
            _chmod_default(tmp, directory=True)
        os.rename(tmp, path)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, 'w', encoding='utf-8') as fh:
            fh.write(text)


def write_json(path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + '\n')


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, 'wb') as fh:
            fh.write(data)


def write_npy(path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, 'wb') as fh:
            np.save(fh, array)


def read_json(path) -> Any:
    """Parse a JSON file; problems raise :class:`ValueError` naming the file (missing, a
    directory, unreadable, not JSON)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f'{path}: is a directory, expected a JSON file')
    try:
        with open(path, encoding='utf-8') as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise ValueError(f'{path}: no such file') from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f'{path}: cannot read ({exc.strerror if isinstance(exc, OSError) else exc})'
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f'{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})'
        ) from None
