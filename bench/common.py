"""Shared helpers of the benchmark scripts (data loading, ground truth, metrics, tables).

Not part of the package; the data directory is always an argument (default ../shared/data).
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from typing import Dict, List, Sequence

import numpy as np
import yaml

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..')))

from pwan_ros.io.point_files import read_points  # noqa: E402

BUNNY_PAIRS = [
    ('bun000', 'bun045'),
    ('bun045', 'bun090'),
    ('bun090', 'bun180'),
    ('bun180', 'bun270'),
    ('bun270', 'bun315'),
    ('bun315', 'bun000'),
    ('chin', 'bun000'),
    ('bun180', 'bun315'),
]


def quat_matrix(qx, qy, qz, qw):
    """Rotation matrix R(q) of a quaternion given as (qx, qy, qz, qw)."""
    q = np.array([qw, qx, qy, qz], dtype=float)
    q /= np.linalg.norm(q)
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def bunny_poses(data_dir: str) -> Dict[str, np.ndarray]:
    """4x4 world poses p_world = R(q)^T p + t from bun.conf (convention in the data README)."""
    poses = {}
    with open(os.path.join(data_dir, 'rigid', 'stanford_bunny', 'bun.conf')) as fh:
        for line in fh:
            parts = line.split()
            if parts and parts[0] == 'bmesh':
                name = parts[1].replace('.ply', '')
                t = np.array(list(map(float, parts[2:5])))
                r = quat_matrix(*map(float, parts[5:9]))
                pose = np.eye(4)
                pose[:3, :3] = r.T
                pose[:3, 3] = t
                poses[name] = pose
    return poses


def load_bunny(data_dir: str, name: str) -> np.ndarray:
    return read_points(os.path.join(data_dir, 'rigid', 'stanford_bunny', name + '.ply.gz'))


def rotation_error_deg(r_est: np.ndarray, r_true: np.ndarray) -> float:
    c = (np.trace(r_est @ r_true.T) - 1.0) / 2.0
    return float(np.degrees(np.arccos(np.clip(c, -1.0, 1.0))))


def voxel(points: np.ndarray, size: float) -> np.ndarray:
    from pwan_ros.core.preprocess import voxel_downsample

    return voxel_downsample(points, size)


def summarise(errors: Sequence[float], times: Sequence[float], success: float) -> Dict[str, float]:
    e = np.asarray(errors, dtype=float)
    return {
        'median': float(np.median(e)),
        'std': float(np.std(e)),
        'success': float(np.mean(e < success)),
        'n': int(e.size),
        'time_s': float(np.mean(times)),
    }


def write_results(out_dir: str, name: str, rows: List[dict], summary: List[dict]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name + '.json'), 'w') as fh:
        json.dump({'rows': rows, 'summary': summary}, fh, indent=1)
    if rows:
        keys = sorted({k for r in rows for k in r})
        with open(os.path.join(out_dir, name + '.csv'), 'w', newline='') as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


def print_table(summary: List[dict], cols: Sequence[str], title: str) -> None:
    print(f'\n## {title}')
    print('| ' + ' | '.join(cols) + ' |')
    print('|' + '---|' * len(cols))
    for s in summary:
        cells = []
        for c in cols:
            v = s.get(c, '')
            cells.append(f'{v:.3g}' if isinstance(v, float) else str(v))
        print('| ' + ' | '.join(cells) + ' |')
    sys.stdout.flush()


class Timer:
    """Wall time ``s`` and process CPU time ``cpu`` (all threads) of a block."""

    def __enter__(self):
        self.t = time.perf_counter()
        self.c = time.process_time()
        return self

    def __exit__(self, *a):
        self.s = time.perf_counter() - self.t
        self.cpu = time.process_time() - self.c


def key_values(pairs: Sequence[str]) -> dict:
    """``KEY=VALUE`` command-line items as a dict, each value read as YAML (numbers, booleans,
    lists, strings), except that only true / false are booleans: YAML 1.1 reads on / off / yes /
    no as booleans too, and ``compile=off`` must stay the word; an item without ``=`` ends the
    script with one line."""
    out = {}
    for kv in pairs:
        key, sep, value = kv.partition('=')
        if not sep:
            raise SystemExit(f'expected KEY=VALUE, got {kv!r}')
        parsed = yaml.safe_load(value)
        if isinstance(parsed, bool) and value.strip().lower() not in ('true', 'false'):
            parsed = value.strip()
        out[key] = parsed
    return out
