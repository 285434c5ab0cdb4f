"""The table of a fleet evaluation: one row per (sequence, method), the means per method.

Columns: ATE RMSE (m, se3-aligned by default), RPE per frame (m, deg), RPE drift (% and deg/m
over the lengths each sequence has: see :mod:`pwan_ros.evaluation.metrics`), median ms per
scan, scans answered of those offered. ``write_aggregate`` writes ``aggregate.json``,
``aggregate.md`` (the table) and ``aggregate.png`` (ATE per sequence and method) atomically.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from pwan_ros.evaluation.metrics import format_optional, save_figure
from pwan_ros.io.atomic import write_text

__all__ = ['COLUMNS', 'aggregate', 'format_aggregate', 'write_aggregate']

#: (header, summary key, format)
COLUMNS = (
    ('ATE m', 'ate_rmse_m', '.3f'),
    ('RPE m/frame', 'rpe_trans_m', '.3f'),
    ('RPE deg/frame', 'rpe_rot_deg', '.3f'),
    ('drift %', 'rpe_trans_pct', '.2f'),
    ('drift deg/m', 'rpe_rot_deg_per_m', '.4f'),
    ('ms/scan', 'median_latency_ms', '.1f'),
)


def aggregate(results: list) -> dict:
    """{'rows': [...], 'means': [...], 'failed': [...]} of TaskResults: a row per finished run
    (sequence, method, the COLUMNS' keys, scans, scans_published), the mean of each column per
    method (``runs``: its finished runs; the metrics over the ``measured`` ones, those with
    ground truth), the failed runs. Compare means only over the same sequences (no failure)."""
    rows = []
    for r in results:
        if r.ok:
            s = r.summary
            row = {'sequence': r.sequence, 'method': r.method}
            row |= {key: s.get(key) for _, key, _ in COLUMNS}
            row |= {'scans': s['scans'], 'scans_published': s.get('scans_published', s['scans'])}
            rows.append(row)
    means = []
    for method in dict.fromkeys(r['method'] for r in rows):
        mine = [r for r in rows if r['method'] == method]
        measured = [r for r in mine if r['ate_rmse_m'] is not None]
        mean = {'method': method, 'runs': len(mine), 'measured': len(measured)}
        for _, key, _ in COLUMNS:
            values = [r[key] for r in (mine if key == 'median_latency_ms' else measured)]
            values = [v for v in values if v is not None]
            mean[key] = float(np.mean(values)) if values else None
        mean['scans'] = sum(r['scans'] for r in mine)
        mean['scans_published'] = sum(r['scans_published'] for r in mine)
        means.append(mean)
    failed = [
        {'sequence': r.sequence, 'method': r.method, 'error': r.error} for r in results if not r.ok
    ]
    return {'rows': rows, 'means': means, 'failed': failed}


def format_aggregate(agg: dict) -> str:
    """The table as Markdown: the runs, then the means per method, then the failures."""
    head = ['sequence', 'method'] + [h for h, _, _ in COLUMNS] + ['scans']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]

    def cells(row, first):
        values = [format_optional(row[key], spec) for _, key, spec in COLUMNS]
        return [first, row['method'], *values, f"{row['scans']}/{row['scans_published']}"]

    for row in agg['rows']:
        lines.append('| ' + ' | '.join(cells(row, row['sequence'])) + ' |')
    for mean in agg['means']:
        runs = (
            f"{mean['measured']} of {mean['runs']} runs"
            if mean['measured'] < mean['runs']
            else f"{mean['runs']} runs"
        )
        lines.append('| ' + ' | '.join(cells(mean, f'**mean** ({runs})')) + ' |')
    if agg['failed']:
        lines.append('')
        lines += [f"FAILED {f['sequence']} / {f['method']}: {f['error']}" for f in agg['failed']]
    return '\n'.join(lines)


def write_aggregate(agg: dict, output) -> pathlib.Path:
    """aggregate.md, aggregate.png, then aggregate.json (last) into ``output``; its path."""
    output = pathlib.Path(output)
    write_text(output / 'aggregate.md', format_aggregate(agg) + '\n')
    if agg['rows']:
        _plot(agg, output / 'aggregate.png')
    path = output / 'aggregate.json'
    write_text(path, json.dumps(agg, indent=2))
    return path


def _plot(agg: dict, path: pathlib.Path) -> None:
    """Grouped bars: ATE RMSE per sequence, one bar per method (missing: no bar)."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    sequences = list(dict.fromkeys(r['sequence'] for r in agg['rows']))
    methods = [m['method'] for m in agg['means']]
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(sequences) * len(methods)), 4.5))
    x = np.arange(len(sequences))
    for k, method in enumerate(methods):
        ate = {r['sequence']: r['ate_rmse_m'] for r in agg['rows'] if r['method'] == method}
        values = [ate.get(s) if ate.get(s) is not None else np.nan for s in sequences]
        ax.bar(x + (k - (len(methods) - 1) / 2) * width, values, width, label=method)
    ax.set_xticks(x, sequences, rotation=30, ha='right')
    ax.set_ylabel('ATE RMSE [m]')
    ax.grid(axis='y', alpha=0.3)
    ax.legend(loc='best')
    save_figure(fig, path, 'ATE per sequence and method')
