"""Atomic file writes: every output is written to a temporary sibling and renamed into place."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

import numpy as np


@contextlib.contextmanager
def atomic_path(path) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success rename it to ``path``, else delete it."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix='.tmp', dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, 'w', encoding='utf-8') as fh:
            fh.write(text)


def write_json(path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + '\n')


def write_npy(path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, 'wb') as fh:
            np.save(fh, array)
