"""What one run of an odometry estimator over a bag produced (replayed over DDS or offline).

Saved as ``run.json`` next to the estimated trajectory (TUM) so that evaluation can be
repeated without re-running anything.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import asdict, dataclass, field

import numpy as np

from .trajectory import Trajectory, read_tum, write_tum

__all__ = ['RunRecord']


@dataclass
class RunRecord:
    """One run.

    estimate: the estimated trajectory (odometry poses at the scan stamps, seconds).
    scans_published: scans offered to the estimator (replayed or read).
    latencies_ms: per answered scan, wall time from publishing (or reading) the scan to
        receiving (or computing) its pose, milliseconds.
    node_latencies_ms: latency_ms values the node reported on /diagnostics (may be empty).
    node_scans_dropped: the node's last reported scans_dropped (None if never reported).
    mode: 'replay' or 'offline'; wall_s: run duration, seconds.
    """

    estimate: Trajectory
    scans_published: int
    latencies_ms: list[float] = field(default_factory=list)
    node_latencies_ms: list[float] = field(default_factory=list)
    node_scans_dropped: int | None = None
    mode: str = 'replay'
    wall_s: float = 0.0
    bag: str = ''
    topic: str = ''
    diagnostics_last: dict = field(default_factory=dict)

    @property
    def scans(self) -> int:
        """Scans that got a pose."""
        return len(self.estimate)

    @property
    def scans_dropped(self) -> int:
        """Scans offered but never answered with a pose."""
        return max(self.scans_published - self.scans, 0)

    def median_latency_ms(self) -> float | None:
        return float(np.median(self.latencies_ms)) if self.latencies_ms else None

    def median_node_latency_ms(self) -> float | None:
        return float(np.median(self.node_latencies_ms)) if self.node_latencies_ms else None

    def save(self, directory) -> pathlib.Path:
        """Write ``trajectory_est.tum`` and ``run.json`` into ``directory``; returns run.json."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tum = write_tum(directory / 'trajectory_est.tum', self.estimate)
        data = {k: v for k, v in asdict(self).items() if k != 'estimate'}
        data['trajectory_tum'] = tum.name
        path = directory / 'run.json'
        path.write_text(json.dumps(data, indent=2))
        return path

    @classmethod
    def load(cls, path) -> 'RunRecord':
        """Read a ``run.json`` written by :meth:`save` (the TUM file next to it)."""
        path = pathlib.Path(path)
        data = json.loads(path.read_text())
        tum = path.parent / data.pop('trajectory_tum')
        return cls(estimate=read_tum(tum) if tum.stat().st_size else Trajectory(np.zeros(0), np.zeros((0, 4, 4))),
                   **data)
