"""Many sequences and methods at once: one task per (sequence, method), in process or on Ray.

A task runs one estimator offline over one sequence (:func:`run_task`) and writes its folder:
``trajectory_est.tum`` and ``trajectory_est.kitti`` (the poses; the KITTI file in the sequence's
pose-file convention: camera 0's for a KITTI sequence), ``run.json``, ``config.yaml`` (the exact
parameters: a ROS 2 parameter file for ``pwan``, usable with the node), with ground truth
``trajectory.png``, and ``summary.json`` last. A fleet task (``Task.owned``) writes into a
temporary folder renamed into place when complete, so a folder is whole or absent; ``resume``
keeps a folder whose summary names the same sequence (its path), method and scan limit. A
failed task returns its one-line reason (:mod:`pwan_ros.evaluation.parallel` runs many).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Optional

import yaml

from pwan_ros.evaluation.methods import Method, odometry_config
from pwan_ros.evaluation.metrics import SUMMARY_KEYS, EvalConfig, evaluate, write_outputs
from pwan_ros.evaluation.sequences import SequenceSource
from pwan_ros.io.atomic import read_json, write_json, write_text
from pwan_ros.io.trajectory import Trajectory, write_kitti

__all__ = ['Task', 'TaskResult', 'complete', 'run_task']

SUMMARY = 'summary.json'


@dataclass(frozen=True)
class Task:
    """One run: ``method`` over ``source``, written into ``output``; ``params``: the pwan
    odometry's parameters (name -> value) before the variant; ``max_scans``: 0 = all; ``owned``:
    the folder is the task's own (a fleet's), written whole or not at all."""

    source: SequenceSource
    method: Method
    output: str
    params: dict = field(default_factory=dict)
    eval_config: EvalConfig = EvalConfig()
    max_scans: int = 0
    owned: bool = False

    def identity(self) -> dict:
        """What a summary records of the run that made it (``resume`` compares it)."""
        return {
            'sequence': self.source.name,
            'method': self.method.label,
            'source': self.source.path,
            'max_scans': self.max_scans,
        }


@dataclass
class TaskResult:
    """sequence / method: names; summary: the run's summary.json (None: failed); error: why it
    failed, one line; resumed: its complete folder was kept (``resume``)."""

    sequence: str
    method: str
    folder: str
    summary: Optional[dict] = None
    error: str = ''
    resumed: bool = False

    @property
    def ok(self) -> bool:
        return self.summary is not None


def complete(task: Task) -> Optional[dict]:
    """The summary of ``task``'s finished run in its folder (the same sequence, method and scan
    limit), or None (absent, unreadable, or another run's)."""
    try:
        summary = read_json(pathlib.Path(task.output) / SUMMARY)
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or any(k not in summary for k in SUMMARY_KEYS):
        return None
    same = all(summary.get(k) == v for k, v in task.identity().items())
    return summary if same else None


def run_task(task: Task, raise_errors: bool = False) -> TaskResult:
    """Run one task (in this process) and write its folder; a failure is returned (or raised,
    with ``raise_errors``)."""
    out = pathlib.Path(task.output)
    result = TaskResult(task.source.name, task.method.label, str(out))
    try:
        result.summary = _run(task, out)
    except Exception as exc:  # one line, the other tasks go on
        if raise_errors:
            raise
        result.error = f'{type(exc).__name__}: {exc}'.splitlines()[0]
    return result


def _estimator(method: Method, params: dict) -> tuple:
    """(estimator, its exact parameters as a YAML-ready dict)."""
    from pwan_ros.evaluation.offline import KissIcpOdometry, load_estimator

    if method.estimator == 'pwan':
        # one thread: a task has one CPU, and its numbers are then the same alone or in a fleet
        config = odometry_config(params, method.variant).replace(num_threads=1)
        exact = {k: list(v) if isinstance(v, tuple) else v for k, v in config.to_dict().items()}
        return load_estimator('pwan', config), {'pwan_odometry': {'ros__parameters': exact}}
    if method.estimator == 'kiss_icp':
        kiss = KissIcpOdometry(num_threads=1)  # one thread: reproducible to the last bit
        return kiss, {'estimator': 'kiss_icp', 'max_range': kiss.max_range, 'deskew': False}
    return load_estimator(method.estimator), {'estimator': method.estimator}


def _run(task: Task, out: pathlib.Path) -> dict:
    from pwan_ros.evaluation.offline import run_offline

    estimator, exact = _estimator(task.method, task.params)
    gt = task.source.ground_truth()  # first: a bad pose file costs no run
    run = run_offline(task.source, estimator, max_scans=task.max_scans or None)
    with _staged(out, task.owned) as folder:
        run.save(folder)
        poses = task.source.in_pose_file_frame(run.estimate.poses)
        write_kitti(folder / 'trajectory_est.kitti', Trajectory(run.estimate.stamps, poses))
        write_text(folder / 'config.yaml', yaml.safe_dump(exact, sort_keys=False))
        if gt is None:  # no ground truth (a KITTI test sequence): the run's facts only
            summary = _unevaluated(run) | task.identity()
            write_json(folder / SUMMARY, summary)
            return summary
        result = evaluate(run.estimate, gt, task.eval_config)
        title = f'{task.source.name}: {task.method.label}'
        summary, _ = write_outputs(folder, result, run.estimate, run, title, **task.identity())
    return summary


@contextlib.contextmanager
def _staged(out: pathlib.Path, owned: bool):
    """The folder to write into: ``out`` itself, or (``owned``) a temporary sibling renamed to
    ``out`` when the block completes (an earlier ``out`` replaced), removed when it fails."""
    if not owned:
        yield out
        return
    tmp = out.with_name(f'.{out.name}.partial')
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def _unevaluated(run) -> dict:
    return {
        'scans': run.scans,
        'scans_dropped': run.scans_dropped,
        'median_latency_ms': run.median_latency_ms(),
        'ate_rmse_m': None,
        'rpe_trans_pct': None,
        'rpe_rot_deg_per_m': None,
        'scans_published': run.scans_published,
        'run_wall_s': run.wall_s,
        'ground_truth': None,
    }
