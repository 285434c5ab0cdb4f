"""Trajectory evaluation: ATE and RPE of an estimated odometry against ground truth.

Metrics (estimate and ground truth associated by stamp within ``max_dt`` seconds, with
``evo``):

- ATE (absolute trajectory error): translation error after aligning the estimate to the
  ground truth (``align``: ``se3`` = Kabsch/Umeyama rotation+translation without scale,
  ``origin`` = first poses coincide, ``none``); ``ate_rmse_m`` (also mean/median/max), metres.
- RPE per frame: error of the relative motion between consecutive matched poses;
  ``rpe_trans_m`` (RMSE, metres) and ``rpe_rot_deg`` (RMSE, degrees).
- RPE per distance (KITTI-style drift): per length of ``rpe_lengths`` and from each pose, the
  later pose whose ground-truth path distance from it is nearest the length, when within +-10 %
  (evo's ``filter_pairs_by_path``, ``all_pairs``): the relative translation error divided by
  that distance, mean in percent (``rpe_trans_pct``) and the relative rotation error per
  metre (``rpe_rot_deg_per_m``). Default lengths: 100..800 m on paths >= 1 km (KITTI), else
  10, 20, 30, 40, 50 % of the path length (none, and both metrics null, on a path without
  length such as a ground truth that never moves).

CLI (writes ``summary.json``, ``trajectory_est.tum``, ``trajectory.png`` into ``--output``)::

    pwan_evaluate --run OUT/run.json --bag BAG                  # after pwan_replay
    pwan_evaluate --est est.tum --gt-file gt.txt                # two pose files
    pwan_evaluate --est recorded_bag --bag BAG                  # /odometry from ros2 bag record
    pwan_evaluate --offline --bag BAG... | --kitti SEQ... [--estimator pwan,kiss_icp,...]
    options: --topic /points --gt-topic /ground_truth --frame base_link --align se3 --json
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from dataclasses import asdict, dataclass

import numpy as np

from pwan_ros.io import bags as bag_io
from pwan_ros.io.atomic import atomic_path, write_text
from pwan_ros.evaluation.run_record import RunRecord
from pwan_ros.io.trajectory import Trajectory, TrajectoryError, read_pose_file, write_tum
from pwan_ros.params import check, param

__all__ = [
    'EvalConfig',
    'EvalResult',
    'EvaluationError',
    'evaluate',
    'load_ground_truth',
    'make_summary',
    'write_outputs',
    'format_table',
    'track_losses',
    'SUMMARY_KEYS',
]

#: Keys every summary.json has (values may be null when not measurable, e.g. latency of a pose
#: file).
SUMMARY_KEYS = (
    'scans',
    'scans_dropped',
    'median_latency_ms',
    'ate_rmse_m',
    'rpe_trans_pct',
    'rpe_rot_deg_per_m',
)
ALIGN_MODES = ('se3', 'origin', 'none')


class EvaluationError(RuntimeError):
    """Evaluation impossible (no common stamps, too few poses, ...)."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation options (CLI flags: same names with dashes)."""

    align: str = param(
        'se3',
        'alignment of the estimate to the ground truth before ATE: se3 (Umeyama), origin '
        '(first poses), none',
        choices=ALIGN_MODES,
    )
    max_dt: float = param(0.01, 'stamp association tolerance (s)', 0.0, 10.0, low_open=True)
    rpe_lengths: tuple = param((), 'RPE segment lengths (m); empty = automatic (see module doc)')

    def __post_init__(self):
        check(self, rules=EvalConfig._rules)
        object.__setattr__(self, 'rpe_lengths', tuple(float(v) for v in self.rpe_lengths))

    def _rules(self):
        """The cross-field rules (:func:`pwan_ros.params.check`): ``(ok, field, allowed)``."""
        yield all(_positive(v) for v in self.rpe_lengths), 'rpe_lengths', 'distances > 0 (m)'


def _positive(text) -> bool:
    """Whether ``text`` (a number or its text) is a finite number > 0."""
    try:
        return math.isfinite(float(text)) and float(text) > 0
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class EvalResult:
    """Metrics (see module doc) and the associated, aligned trajectories for plotting."""

    matched: int
    path_length_m: float
    duration_s: float | None  # None: poses without stamps, matched line by line
    ate_rmse_m: float
    ate_mean_m: float
    ate_median_m: float
    ate_max_m: float
    rpe_trans_m: float | None
    rpe_rot_deg: float | None
    rpe_trans_pct: float | None
    rpe_rot_deg_per_m: float | None
    rpe_lengths_m: tuple
    rpe_pairs: int
    align: str
    gt: Trajectory  # associated ground truth
    est_aligned: Trajectory  # associated estimate after alignment
    ate_errors: np.ndarray  # (matched,) metres

    def metrics(self) -> dict:
        """The scalar metrics as a JSON-ready dict."""
        return {
            k: v for k, v in asdict(self).items() if k not in ('gt', 'est_aligned', 'ate_errors')
        } | {'rpe_lengths_m': list(self.rpe_lengths_m)}


#: a scan whose motion since the previous answered scan is off by more than either bound lost track
LOST_TRANS_M = 0.25
LOST_ROT_DEG = 2.5


def track_losses(
    result: EvalResult, trans_m: float = LOST_TRANS_M, rot_deg: float = LOST_ROT_DEG
) -> np.ndarray:
    """Stamps (s) of the matched poses whose relative motion since the previous matched pose is
    off by more than ``trans_m`` metres or ``rot_deg`` degrees: where the estimate lost track (a
    rejected scan that holds the last pose during motion counts too)."""
    n = result.matched
    if n < 2:
        return np.zeros(0)
    t_err, r_err = _relative_errors(
        result.gt.poses, result.est_aligned.poses, [(k, k + 1) for k in range(n - 1)]
    )
    return result.gt.stamps[1:][(t_err > trans_m) | (r_err > rot_deg)]


def _evo(traj: Trajectory):
    from evo.core.trajectory import PoseTrajectory3D

    return PoseTrajectory3D(poses_se3=list(traj.poses), timestamps=traj.stamps.copy())


def _rot_deg(r: np.ndarray) -> np.ndarray:
    """Rotation angle(s) in degrees of (..., 3, 3) matrices."""
    c = (np.trace(r, axis1=-2, axis2=-1) - 1.0) / 2.0
    return np.degrees(np.arccos(np.clip(c, -1.0, 1.0)))


def _relative_errors(gt: np.ndarray, est: np.ndarray, pairs) -> tuple[np.ndarray, np.ndarray]:
    """Translation (m) and rotation (deg) of E = (Q_i^-1 Q_j)^-1 (P_i^-1 P_j) for index pairs."""
    i, j = np.array(pairs).T
    q_rel = np.linalg.inv(gt[i]) @ gt[j]
    p_rel = np.linalg.inv(est[i]) @ est[j]
    e = np.linalg.inv(q_rel) @ p_rel
    return np.linalg.norm(e[:, :3, 3], axis=1), _rot_deg(e[:, :3, :3])


def _auto_lengths(path_length: float) -> tuple:
    if path_length >= 1000.0:
        return tuple(float(v) for v in range(100, 801, 100))
    # none on a path (almost) without length: RPE per metre is undefined there
    return tuple(v for v in (round(path_length * f, 3) for f in (0.1, 0.2, 0.3, 0.4, 0.5)) if v)


def align_poses(est: np.ndarray, gt: np.ndarray, mode: str) -> np.ndarray:
    """Estimated poses (N, 4, 4) mapped into the ground-truth frame.

    se3: the rotation+translation minimising the position error (Kabsch/Umeyama without
    scale; well defined also for straight-line paths, where evo's Umeyama refuses);
    origin: the first estimated pose onto the first ground-truth pose; none: unchanged.
    """
    if mode == 'none':
        return est.copy()
    if mode == 'origin':
        return gt[0] @ np.linalg.inv(est[0]) @ est
    x, y = est[:, :3, 3], gt[:, :3, 3]
    mx, my = x.mean(axis=0), y.mean(axis=0)
    u, _, vt = np.linalg.svd((x - mx).T @ (y - my))
    d = np.sign(np.linalg.det(vt.T @ u.T)) or 1.0
    r = vt.T @ np.diag([1.0, 1.0, d]) @ u.T
    t = np.eye(4)
    t[:3, :3], t[:3, 3] = r, my - r @ mx
    return t @ est


def _check_pair(est: Trajectory, gt: Trajectory) -> None:
    """EvaluationError when the two trajectories cannot be matched."""
    if len(est) < 2 or len(gt) < 2:
        raise EvaluationError(
            f'need at least 2 poses in each trajectory (estimate {len(est)}, ground truth '
            f'{len(gt)})'
        )
    if est.stamped != gt.stamped:
        stamped, plain = (
            ('estimate', 'ground truth') if est.stamped else ('ground truth', 'estimate')
        )
        raise EvaluationError(
            f'the {stamped} has stamps but the {plain} has none (KITTI or plain 4x4 poses, one '
            'per line): they cannot be matched; give both with stamps (TUM, a bag) or both '
            'without (matched line by line)'
        )
    if not est.stamped and len(est) != len(gt):
        raise EvaluationError(
            f'poses without stamps are matched line by line, but the estimate has {len(est)} '
            f'and the ground truth {len(gt)}'
        )


def _associated(est: Trajectory, gt: Trajectory, max_dt: float) -> tuple:
    """(ground truth, estimate) as evo trajectories, matched by stamp within ``max_dt`` s."""
    from evo.core import sync

    try:
        ref_s, est_s = sync.associate_trajectories(_evo(gt), _evo(est), max_diff=max_dt)
    except sync.SyncException as exc:
        raise EvaluationError(
            f'no estimated pose has a ground-truth pose within {max_dt} s (estimate '
            f'{est.stamps[0]:.3f}..{est.stamps[-1]:.3f} s, ground truth {gt.stamps[0]:.3f}..'
            f'{gt.stamps[-1]:.3f} s); check --gt-topic/--gt-file and the stamps'
        ) from exc
    if ref_s.num_poses < 2:
        raise EvaluationError(
            f'only {ref_s.num_poses} pose matched the ground truth within {max_dt} s'
        )
    return ref_s, est_s


def _drift(gt_poses: np.ndarray, est_poses: np.ndarray, lengths) -> tuple:
    """([translation error %], [rotation error deg/m]) of every pose pair about each of
    ``lengths`` (m) of ground-truth path apart (evo's pairs, within 10 % of the length)."""
    from evo.core.filters import filter_pairs_by_path

    dist = np.concatenate(
        [[0.0], np.cumsum(np.linalg.norm(np.diff(gt_poses[:, :3, 3], axis=0), axis=1))]
    )
    pct, deg_per_m = [], []
    for length in lengths:
        pairs = filter_pairs_by_path(list(gt_poses), length, 0.1 * length, all_pairs=True)
        if not pairs:
            continue
        seg = np.array([dist[j] - dist[i] for i, j in pairs])
        pairs = [p for p, s in zip(pairs, seg) if s > 0]  # per metre of no distance: undefined
        if not pairs:
            continue
        seg = seg[seg > 0]
        te, re = _relative_errors(gt_poses, est_poses, pairs)
        pct.extend(100.0 * te / seg)
        deg_per_m.extend(re / seg)
    return pct, deg_per_m


def evaluate(est: Trajectory, gt: Trajectory, cfg: EvalConfig = EvalConfig()) -> EvalResult:
    """ATE and RPE of ``est`` against ``gt`` (both T_parent_child, stamps in seconds)."""
    logging.getLogger('evo').setLevel(logging.WARNING)
    _check_pair(est, gt)
    ref_s, est_s = _associated(est, gt, cfg.max_dt)
    gt_poses = np.array(ref_s.poses_se3)
    est_poses = np.array(est_s.poses_se3)
    aligned_poses = align_poses(est_poses, gt_poses, cfg.align)
    ate = np.linalg.norm(aligned_poses[:, :3, 3] - gt_poses[:, :3, 3], axis=1)
    consecutive = [(k, k + 1) for k in range(gt_poses.shape[0] - 1)]
    t_err, r_err = _relative_errors(gt_poses, est_poses, consecutive)
    gt_traj = Trajectory(ref_s.timestamps, gt_poses, gt.stamped)
    path = gt_traj.path_length()
    lengths = cfg.rpe_lengths or _auto_lengths(path)
    pct, deg_per_m = _drift(gt_poses, est_poses, lengths)
    return EvalResult(
        matched=int(ref_s.num_poses),
        path_length_m=path,
        duration_s=float(gt_traj.stamps[-1] - gt_traj.stamps[0]) if gt.stamped else None,
        ate_rmse_m=float(np.sqrt(np.mean(ate**2))),
        ate_mean_m=float(np.mean(ate)),
        ate_median_m=float(np.median(ate)),
        ate_max_m=float(np.max(ate)),
        rpe_trans_m=float(np.sqrt(np.mean(t_err**2))),
        rpe_rot_deg=float(np.sqrt(np.mean(r_err**2))),
        rpe_trans_pct=float(np.mean(pct)) if pct else None,
        rpe_rot_deg_per_m=float(np.mean(deg_per_m)) if deg_per_m else None,
        rpe_lengths_m=tuple(lengths),
        rpe_pairs=len(pct),
        align=cfg.align,
        gt=gt_traj,
        est_aligned=Trajectory(ref_s.timestamps, aligned_poses, gt.stamped),
        ate_errors=ate,
    )


def load_ground_truth(
    bag=None,
    gt_topic: str = '/ground_truth',
    gt_file=None,
    frame: str | None = None,
    parent: str | None = None,
) -> tuple[Trajectory, str]:
    """(ground truth, description) from a pose file (TUM/KITTI/4x4 blocks) or a bag topic."""
    if gt_file:
        try:
            return read_pose_file(gt_file), f'file {gt_file}'
        except TrajectoryError as exc:
            raise EvaluationError(str(exc)) from exc
    if bag is None:
        raise EvaluationError('no ground truth: pass --gt-file or a --bag with --gt-topic')
    return bag_io.read_trajectory(bag, gt_topic, frame=frame, parent=parent), f'{bag} {gt_topic}'


def make_summary(result: EvalResult, run: RunRecord | None = None, **extra) -> dict:
    """The summary dict (keys SUMMARY_KEYS first, then the other metrics and run facts)."""
    out = {
        'scans': run.scans if run else result.matched,
        'scans_dropped': run.scans_dropped if run else None,
        'median_latency_ms': run.median_latency_ms() if run else None,
        'ate_rmse_m': result.ate_rmse_m,
        'rpe_trans_pct': result.rpe_trans_pct,
        'rpe_rot_deg_per_m': result.rpe_rot_deg_per_m,
    }
    out.update(result.metrics())
    if run is not None:
        out.update(
            {
                'scans_published': run.scans_published,
                'median_node_latency_ms': run.median_node_latency_ms(),
                'node_scans_dropped': run.node_scans_dropped,
                'mode': run.mode,
                'run_wall_s': run.wall_s,
                'bag': run.bag,
                'topic': run.topic,
            }
        )
    out.update(extra)
    return out


def plot(result: EvalResult, path, title: str = '') -> pathlib.Path:
    """PNG: top view (x, y) of ground truth and aligned estimate; ATE and per-frame RPE over
    time."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 5))
    g, e = result.gt.positions, result.est_aligned.positions
    ax0.plot(g[:, 0], g[:, 1], 'k-', lw=2, label='ground truth')
    ax0.plot(e[:, 0], e[:, 1], 'r--', lw=1.5, label=f'estimate ({result.align} aligned)')
    ax0.plot(g[0, 0], g[0, 1], 'ko')
    ax0.set_aspect('equal', adjustable='datalim')
    ax0.set_xlabel('x [m]')
    ax0.set_ylabel('y [m]')
    ax0.set_title('trajectory, top view')
    ax0.legend(loc='best')
    t = result.gt.stamps - result.gt.stamps[0]
    ax1.plot(t, result.ate_errors, 'b-', label=f'ATE [m] (RMSE {result.ate_rmse_m:.3f})')
    step = np.linalg.inv(result.gt.poses[:-1]) @ result.gt.poses[1:]
    est_step = np.linalg.inv(result.est_aligned.poses[:-1]) @ result.est_aligned.poses[1:]
    rpe = np.linalg.norm((np.linalg.inv(step) @ est_step)[:, :3, 3], axis=1)
    ax1.plot(t[1:], rpe, 'g-', label='RPE per frame [m]')
    ax1.set_xlabel('time [s]' if result.gt.stamped else 'pose (no stamps)')
    ax1.set_ylabel('error [m]')
    ax1.set_title('error over time')
    ax1.grid(alpha=0.3)
    ax1.legend(loc='best')
    return save_figure(fig, path, title)


def save_figure(fig, path, title: str = '') -> pathlib.Path:
    """Lay out ``fig`` (with ``title``), write it as a PNG atomically to ``path`` and close it."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = pathlib.Path(path)
    try:
        with atomic_path(path, suffix='.png') as tmp:
            fig.savefig(tmp, dpi=90, format='png')
    finally:
        plt.close(fig)
    return path


def write_outputs(
    output,
    result: EvalResult,
    est: Trajectory,
    run: RunRecord | None = None,
    title: str = '',
    **extra,
) -> tuple[dict, pathlib.Path]:
    """Write trajectory_est.tum, trajectory.png and summary.json into ``output``; (summary, json
    path)."""
    output = pathlib.Path(output)
    tum = write_tum(output / 'trajectory_est.tum', est)
    png = plot(result, output / 'trajectory.png', title)
    summary = make_summary(result, run, trajectory_tum=str(tum), plot_png=str(png), **extra)
    path = output / 'summary.json'
    write_text(path, json.dumps(summary, indent=2))  # last: its presence means the set is complete
    return summary, path


def format_optional(v, spec: str) -> str:
    """``v`` formatted with ``spec``, 'n/a' for None (a metric a run cannot measure)."""
    return 'n/a' if v is None else format(v, spec)


def format_table(summary: dict) -> str:
    """A short human-readable table of a summary."""
    fmt = format_optional
    rows = [
        (
            'scans (answered / dropped)',
            f"{summary['scans']} / {fmt(summary['scans_dropped'], 'd')}",
        ),
        ('median latency', f"{fmt(summary['median_latency_ms'], '.1f')} ms"),
        (
            'ATE RMSE',
            f"{summary['ate_rmse_m']:.3f} m  (align {summary['align']}, {summary['matched']} "
            "poses)",
        ),
        (
            'RPE per frame',
            f"{fmt(summary['rpe_trans_m'], '.3f')} m, {fmt(summary['rpe_rot_deg'], '.3f')} deg",
        ),
        (
            'RPE drift',
            f"{fmt(summary['rpe_trans_pct'], '.2f')} %, "
            f"{fmt(summary['rpe_rot_deg_per_m'], '.4f')} deg/m (lengths "
            f"{', '.join(f'{v:g}' for v in summary['rpe_lengths_m'])} m)",
        ),
        (
            'path',
            f"{summary['path_length_m']:.1f} m "
            + (
                f"in {summary['duration_s']:.1f} s"
                if summary['duration_s'] is not None
                else f"over {summary['matched']} poses (no stamps)"
            ),
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return '\n'.join(f'{k:<{width}}  {v}' for k, v in rows)
