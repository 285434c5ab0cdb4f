"""Compute-device selection and thread policy (torch is imported here, never at package import)."""

from __future__ import annotations

import os

import torch

from pwan_ros.params import FORMATS

from .errors import PwanInputError


def resolve_device(name: str) -> torch.device:
    """Map ``'auto'`` / ``'cpu'`` / ``'cuda'`` / ``'cuda:N'`` to a :class:`torch.device`.

    ``'auto'`` is the CPU: on an H200 the CUDA path of these small networks (a few thousand
    points, hidden widths of tens) is host-bound, 1.6-2.6x faster than one CPU thread on a
    registration and 1.5x in ``pwan`` mode odometry, after 1-3 s of graph capture on the first
    registration of each shape set (docs/benchmarks.md, device check). ``'cuda'`` /
    ``'cuda:N'`` run there on request; asking for CUDA without one is an error. The configs
    validate the name with the same rule (``pwan_ros.params.FORMATS['device']``).
    """
    valid, allowed = FORMATS['device']
    name = str(name).strip().lower()
    if not valid(name):
        raise PwanInputError(f"unknown device '{name}' (expected {allowed})")
    if name in ('auto', 'cpu'):
        return torch.device('cpu')
    if not torch.cuda.is_available():
        raise PwanInputError(f"device '{name}' requested but CUDA is not available")
    return torch.device(name)


def default_threads() -> int:
    """Intra-op threads for CPU runs: 1 on machines with <= 2 cores, else half the cores, at most
    4.

    A single potential network is a small MLP on a few thousand points: a second thread gains only
    1.1-1.35x on an idle 2-core CPU and loses up to 10x when the cores are shared (measured). The
    24-start ensemble is compute-bound and a second thread halves it on an idle 2-core CPU, but two
    such processes side by side ran 5-10x slower than with one thread each (measured), so the
    default stays 1 there; set ``threads`` explicitly on a dedicated machine."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    return 1 if n <= 2 else max(1, min(4, n // 2))


def resolve_threads(threads: int) -> int:
    """The threads a registration uses on the host (torch's intra-op threads and the fine-tune's
    nearest-neighbour searches) for the ``threads`` setting: itself, or :func:`default_threads`
    for 0."""
    return int(threads) if threads and threads > 0 else default_threads()


class thread_scope:
    """Context manager setting ``torch.set_num_threads`` for a call and restoring it after."""

    def __init__(self, threads: int):
        self.threads = resolve_threads(threads)
        self._old = None

    def __enter__(self):
        self._old = torch.get_num_threads()
        if self._old != self.threads:
            torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc):
        if self._old is not None and torch.get_num_threads() != self._old:
            torch.set_num_threads(self._old)
        return False
