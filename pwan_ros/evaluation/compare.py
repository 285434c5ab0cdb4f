"""Several odometry runs over the same bag, side by side: one table, one plot.

Each run (:class:`RunSummary`) is evaluated against the same ground truth
(:func:`pwan_ros.evaluation.metrics.evaluate`); the table has ATE / RPE, scans answered, scans
where full PWAN engaged, scans that lost track (:func:`~pwan_ros.evaluation.metrics.track_losses`)
and the median latency. The plot (top view + ATE over time) marks where PWAN engaged, where each
run lost track, and the stress events of the drive (spans in seconds from the first scan).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np

from pwan_ros.evaluation.metrics import (
    EvalResult,
    evaluate,
    format_optional,
    save_figure,
    track_losses,
)
from pwan_ros.evaluation.run_record import RunRecord
from pwan_ros.io.trajectory import Trajectory

__all__ = ['RunSummary', 'summarise_run', 'skipped_run', 'format_comparison', 'plot_comparison']

#: the metrics every run reports (None where a run cannot measure one)
RUN_KEYS = (
    'scans',
    'scans_published',
    'scans_pwan_engaged',
    'scans_lost_track',
    'ate_rmse_m',
    'rpe_trans_m',
    'rpe_rot_deg',
    'rpe_trans_pct',
    'rpe_rot_deg_per_m',
    'median_latency_ms',
    'p95_latency_ms',
    'max_latency_ms',
    'scans_predicted',
    'ate_live_rmse_m',
)


@dataclass(frozen=True)
class RunSummary:
    """One run: ``name`` (JSON key), ``label`` (table/plot), its evaluation (None if skipped), its
    record, the stamps (s) where it lost track, ``skipped``: why it did not run ('' if it
    ran), and ``live``: the evaluation of the poses published live, where the node answered
    scans with predictions that final estimates replaced (else None)."""

    name: str
    label: str
    result: EvalResult | None
    run: RunRecord | None
    losses: np.ndarray
    skipped: str = ''
    live: EvalResult | None = None

    def metrics(self) -> dict:
        """The RUN_KEYS of this run (or ``{'skipped': why}``)."""
        if self.skipped:
            return {'skipped': self.skipped}
        r, run = self.result, self.run
        pwan = len(run.pwan_stamps) if run.mode == 'replay' else None
        return {
            'scans': run.scans,
            'scans_published': run.scans_published,
            'scans_pwan_engaged': pwan,
            'scans_lost_track': int(len(self.losses)),
            'ate_rmse_m': r.ate_rmse_m,
            'rpe_trans_m': r.rpe_trans_m,
            'rpe_rot_deg': r.rpe_rot_deg,
            'rpe_trans_pct': r.rpe_trans_pct,
            'rpe_rot_deg_per_m': r.rpe_rot_deg_per_m,
            'median_latency_ms': run.median_latency_ms(),
            'p95_latency_ms': run.latency_percentile_ms(95.0),
            'max_latency_ms': float(max(run.latencies_ms)) if run.latencies_ms else None,
            'scans_predicted': len(run.predicted_stamps) if run.mode == 'replay' else None,
            'ate_live_rmse_m': self.live.ate_rmse_m if self.live is not None else r.ate_rmse_m,
        }


def summarise_run(name: str, label: str, run: RunRecord, gt: Trajectory) -> RunSummary:
    """Evaluate ``run`` against ``gt`` (se3-aligned ATE, RPE, track losses; the final estimates,
    and the live poses where they differ)."""
    result = evaluate(run.estimate, gt)
    live = evaluate(run.live_estimate(), gt) if run.live_poses else None
    return RunSummary(name, label, result, run, track_losses(result), live=live)


def skipped_run(name: str, label: str, why: str) -> RunSummary:
    return RunSummary(name, label, None, None, np.zeros(0), skipped=why)


def format_comparison(runs: list[RunSummary]) -> str:
    """The side-by-side table (one row per run)."""
    fmt = format_optional
    head = (
        'run',
        'answered',
        'PWAN engaged',
        'lost track',
        'predicted',
        'ATE RMSE final / live [m]',
        'RPE [%]',
        'RPE [deg/m]',
        'latency median / p95 / max [ms]',
    )
    rows = []
    for r in runs:
        if r.skipped:  # the reason spans the other columns
            rows.append((r.label, f'skipped: {r.skipped}'))
            continue
        m = r.metrics()
        rows.append(
            (
                r.label,
                f"{m['scans']}/{m['scans_published']}",
                fmt(m['scans_pwan_engaged'], 'd'),
                str(m['scans_lost_track']),
                fmt(m['scans_predicted'], 'd'),
                f"{m['ate_rmse_m']:.3f} / {m['ate_live_rmse_m']:.3f}",
                fmt(m['rpe_trans_pct'], '.2f'),
                fmt(m['rpe_rot_deg_per_m'], '.4f'),
                ' / '.join(
                    fmt(m[k], '.0f')
                    for k in ('median_latency_ms', 'p95_latency_ms', 'max_latency_ms')
                ),
            )
        )
    full = [head] + [row for row in rows if len(row) == len(head)]
    widths = [max(len(row[0]) for row in [head] + rows)] + [
        max(len(row[i]) for row in full) for i in range(1, len(head))
    ]
    line = lambda row: '  '.join(f'{str(v):<{w}}' for v, w in zip(row, widths)).rstrip()  # noqa: E731
    return '\n'.join([line(head), line(['-' * w for w in widths])] + [line(r) for r in rows])


def _at(traj: Trajectory, stamps) -> np.ndarray:
    """Rows of ``traj`` (indices) nearest to ``stamps``."""
    if len(stamps) == 0:
        return np.zeros(0, dtype=int)
    return np.clip(np.searchsorted(traj.stamps, np.asarray(stamps) - 1e-6), 0, len(traj) - 1)


def plot_comparison(
    runs: list[RunSummary], gt: Trajectory, path, events=(), title: str = ''
) -> pathlib.Path:
    """PNG: top view of the ground truth and every run and the position error of every run over
    time, both aligned at the first pose; triangles: scans where PWAN engaged; crosses: scans
    that lost track; shaded: ``events`` [(label, t0, t1)] in seconds from the first ground-truth
    pose."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    colours = ['tab:red', 'tab:blue', 'tab:green', 'tab:purple']
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(14, 5.5))
    g = gt.positions
    ax0.plot(g[:, 0], g[:, 1], 'k-', lw=2.5, alpha=0.6, label='ground truth')
    t_start = gt.stamps[0]
    for (label, t0, t1), shade in zip(events, ('0.85', '0.75', '0.9', '0.8')):
        ax1.axvspan(t0, max(t1, t0 + 0.05), color=shade, alpha=0.6)
        ax1.text(
            t0,
            0.02,
            label,
            transform=ax1.get_xaxis_transform(),
            rotation=90,
            va='bottom',
            ha='right',
            fontsize=8,
        )
        k = _at(gt, [t_start + t0])
        ax0.annotate(label, g[k[0], :2], fontsize=8, xytext=(4, -10), textcoords='offset points')
    for r, colour in zip([r for r in runs if not r.skipped], colours):
        # aligned at the first pose (not se3 as the ATE): a run follows the ground truth until it
        # loses track, and the plot shows where
        g_r, e_r = r.result.gt.poses, r.run.estimate.poses[_at(r.run.estimate, r.result.gt.stamps)]
        est = g_r[0] @ np.linalg.inv(e_r[0]) @ e_r
        e = est[:, :3, 3]
        err = np.linalg.norm(e - g_r[:, :3, 3], axis=1)
        ax0.plot(e[:, 0], e[:, 1], '-', color=colour, lw=1.3, label=r.label)
        t = r.result.gt.stamps - t_start
        ax1.plot(
            t, err, '-', color=colour, lw=1.3, label=f'{r.label} (ATE {r.result.ate_rmse_m:.3f} m)'
        )
        lost = _at(r.result.gt, r.losses)
        ax0.plot(e[lost, 0], e[lost, 1], 'x', color=colour, ms=8, mew=2)
        ax1.plot(t[lost], err[lost], 'x', color=colour, ms=8, mew=2)
        if r.run.pwan_stamps:
            eng = _at(r.result.gt, r.run.pwan_stamps)
            ax0.plot(e[eng, 0], e[eng, 1], '^', color=colour, mfc='none', ms=9)
            ax1.plot(t[eng], err[eng], '^', color=colour, mfc='none', ms=9)
    ax0.plot([], [], 'k^', mfc='none', label='PWAN engaged')
    ax0.plot([], [], 'kx', label='lost track')
    ax0.set_aspect('equal', adjustable='datalim')
    ax0.set_xlabel('x [m]')
    ax0.set_ylabel('y [m]')
    ax0.set_title('trajectories (aligned at the first scan), top view')
    ax0.legend(loc='best', fontsize=8)
    ax1.set_xlabel('time [s]')
    ax1.set_ylabel('position error [m]')
    ax1.set_yscale('symlog', linthresh=0.05)
    ax1.set_title('position error over time (aligned at the first scan)')
    ax1.grid(alpha=0.3)
    ax1.legend(loc='upper left', fontsize=8)
    return save_figure(fig, path, title)
