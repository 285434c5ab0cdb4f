"""What one run of an odometry estimator over a bag produced (replayed over DDS or offline).

Saved as ``run.json`` next to the estimated trajectory (TUM) so that evaluation can be
repeated without re-running anything.
"""

from __future__ import annotations

import pathlib
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from pwan_ros.io.atomic import read_json, write_json
from pwan_ros.io.trajectory import Trajectory, read_tum, write_tum

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
    pwan_stamps / rejected_stamps: scan stamps (s) where the node reported on /diagnostics that
        full PWAN ran / the scan was rejected or re-anchored (empty for other estimators).
    scan_notes: for each of those scans, [stamp (s), path, matched ratio, the node's message]
        (why PWAN ran, why it was accepted or rejected), in stamp order.
    predicted_stamps: scan stamps (s) the node answered live with a prediction (a recovery ran
        off its scan worker); live_poses: [stamp (s), 16 floats of the (4, 4) pose row-major]
        of the scans whose live pose ``estimate`` replaced by a final estimate.
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
    pwan_stamps: list[float] = field(default_factory=list)
    rejected_stamps: list[float] = field(default_factory=list)
    scan_notes: list[list] = field(default_factory=list)
    predicted_stamps: list[float] = field(default_factory=list)
    live_poses: list[list] = field(default_factory=list)

    def live_estimate(self) -> Trajectory:
        """The trajectory as published live (predictions where the final estimate differs)."""
        poses = self.estimate.poses.copy()
        for row in self.live_poses:
            k = int(np.argmin(np.abs(self.estimate.stamps - row[0])))
            poses[k] = np.asarray(row[1:], dtype=np.float64).reshape(4, 4)
        return Trajectory(self.estimate.stamps.copy(), poses)

    def latency_percentile_ms(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else None

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
        """Write ``trajectory_est.tum`` then ``run.json`` into ``directory`` (each atomically, the
        record last, so a ``run.json`` always has its trajectory); returns run.json."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tum = write_tum(directory / 'trajectory_est.tum', self.estimate)
        data = {k: v for k, v in asdict(self).items() if k != 'estimate'}
        data['trajectory_tum'] = tum.name
        path = directory / 'run.json'
        write_json(path, data)
        return path

    @classmethod
    def load(cls, path) -> 'RunRecord':
        """Read a ``run.json`` written by :meth:`save` (the TUM file next to it).

        Raises ValueError naming the file when it is missing, not JSON, or not a run record."""
        path = pathlib.Path(path)
        data = read_json(path)
        if not isinstance(data, dict):
            raise ValueError(f'{path}: not a run record (expected a JSON object)')
        missing = [k for k in ('trajectory_tum', 'scans_published') if k not in data]
        if missing:
            raise ValueError(f'{path}: not a run record (missing {", ".join(missing)})')
        known = {f.name for f in fields(cls)} - {'estimate'}
        unknown = sorted(set(data) - known - {'trajectory_tum'})
        if unknown:
            raise ValueError(f'{path}: not a run record (unknown keys {", ".join(unknown)})')
        if not isinstance(data['scans_published'], int) or not isinstance(
            data['trajectory_tum'], str
        ):
            raise ValueError(
                f'{path}: not a run record (scans_published must be an integer, '
                'trajectory_tum a file name)'
            )
        tum = path.parent / data.pop('trajectory_tum')
        if not tum.is_file():
            raise ValueError(f'{path}: its trajectory {tum} is missing')
        estimate = (
            read_tum(tum) if tum.stat().st_size else Trajectory(np.zeros(0), np.zeros((0, 4, 4)))
        )
        try:
            return cls(estimate=estimate, **data)
        except TypeError as exc:
            raise ValueError(f'{path}: not a run record ({exc})') from None
