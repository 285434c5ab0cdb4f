"""Many sequences and methods at once: one task per (sequence, method), in process or on Ray.

A task runs one estimator offline over one sequence (:func:`run_task`) and writes its folder:
``trajectory_est.tum`` and ``trajectory_est.kitti`` (the poses, TUM and KITTI formats),
``run.json``, ``config.yaml`` (the exact parameters: a ROS 2 parameter file for ``pwan``, usable
with the node), ``trajectory.png`` and ``summary.json`` last (its presence means the folder is
complete: ``resume`` skips such tasks). A failed task is reported with its one-line reason and
the others go on. :func:`run_tasks` runs them one after another, or as Ray tasks (one CPU and
one torch thread each) on a local Ray of ``workers`` processes or the cluster at ``address``.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import yaml

from pwan_ros.evaluation.metrics import EvalConfig, evaluate, write_outputs
from pwan_ros.evaluation.sequences import SequenceSource
from pwan_ros.io.atomic import read_json, write_json, write_text
from pwan_ros.io.trajectory import write_kitti
from pwan_ros.params import check, param

__all__ = [
    'Method',
    'OfflineConfig',
    'Task',
    'TaskResult',
    'odometry_config',
    'read_params',
    'run_tasks',
]

SUMMARY = 'summary.json'


@dataclass(frozen=True)
class OfflineConfig:
    """``pwan_evaluate --offline`` options (CLI flags: same names with dashes)."""

    estimator: tuple = param(
        ('pwan',),
        "estimators side by side (comma-separated): pwan (the node's odometry pipeline), "
        'kiss_icp, icp or module:factory',
    )
    params: str = param('', "the node's parameters file for pwan; '' = its defaults")
    workers: int = param(
        0, 'local Ray worker processes; 0 = all cores, 1 = one after another in process', 0, 4096
    )
    address: str = param('', "a Ray cluster's address (auto, ray://HOST:10001); '' = local")
    resume: bool = param(False, 'keep the runs whose summary.json exists')
    rate_hz: float = param(
        10.0,
        'scan rate of a --scans folder whose pose file has no stamps (Hz)',
        0.0,
        1000.0,
        low_open=True,
    )

    def __post_init__(self):
        check(self, rules=lambda c: [(len(c.estimator) > 0, 'estimator', 'one or more')])


@dataclass(frozen=True)
class Method:
    """estimator: 'pwan', 'kiss_icp', 'icp' or 'module:factory'; variant: ((name, value), ...)
    parameters of the pwan odometry changed from the parameters file."""

    estimator: str
    variant: tuple = ()

    @property
    def label(self) -> str:
        if not self.variant:
            return self.estimator
        return f'{self.estimator}[{",".join(f"{k}={v}" for k, v in self.variant)}]'


@dataclass(frozen=True)
class Task:
    """One run: ``method`` over ``source``, written into ``output``; ``params``: the pwan
    odometry's parameters (name -> value) before the variant; ``max_scans``: 0 = all."""

    source: SequenceSource
    method: Method
    output: str
    params: dict = field(default_factory=dict)
    eval_config: EvalConfig = EvalConfig()
    max_scans: int = 0


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


def read_params(path) -> dict:
    """The pwan odometry's parameters from a YAML file: a ROS 2 parameter file (``node:
    {ros__parameters: {...}}``, as config/odometry.yaml) or a flat mapping. ``use_sim_time`` is
    the node's, not the odometry's, and is dropped."""
    try:
        with open(path, encoding='utf-8') as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ValueError(f'--params {path}: cannot read ({exc.strerror})') from None
    except yaml.YAMLError:
        raise ValueError(f'--params {path}: not valid YAML') from None
    if isinstance(data, dict) and len(data) == 1:
        (only,) = data.values()
        if isinstance(only, dict) and 'ros__parameters' in only:
            data = only['ros__parameters'] or {}
    if not isinstance(data, dict):
        raise ValueError(f'--params {path}: expected a mapping of parameter names to values')
    return {k: v for k, v in data.items() if k != 'use_sim_time'}


def odometry_config(params: dict, variant: tuple = ()):
    """The OdometryConfig of ``params`` with ``variant`` applied (ConfigError names a bad one)."""
    from pwan_ros.odometry.config import OdometryConfig

    return OdometryConfig.from_dict({**params, **dict(variant)})


def complete(task: Task) -> bool:
    """Whether ``task``'s folder holds a finished run (its summary.json, written last)."""
    return (pathlib.Path(task.output) / SUMMARY).is_file()


@contextlib.contextmanager
def _one_torch_thread():
    """One torch thread while a task runs (tasks share the cores; results do not depend on the
    number of tasks)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_task(task: Task, raise_errors: bool = False) -> TaskResult:
    """Run one task (in this process) and write its folder; a failure is returned (or raised,
    with ``raise_errors``)."""
    out = pathlib.Path(task.output)
    result = TaskResult(task.source.name, task.method.label, str(out))
    try:
        with _one_torch_thread():
            result.summary = _run(task, out)
    except Exception as exc:  # one line, the other tasks go on
        if raise_errors:
            raise
        result.error = f'{type(exc).__name__}: {exc}'.splitlines()[0]
    return result


def _run(task: Task, out: pathlib.Path) -> dict:
    from pwan_ros.evaluation.offline import KissIcpOdometry, load_estimator, run_offline

    method = task.method
    if method.estimator == 'pwan':
        # one thread: a task has one CPU, and its numbers are then the same alone or in a fleet
        config = odometry_config(task.params, method.variant).replace(num_threads=1)
        estimator = load_estimator('pwan', config)
        exact = {'pwan_odometry': {'ros__parameters': _plain(config.to_dict())}}
    elif method.estimator == 'kiss_icp':
        estimator = KissIcpOdometry(num_threads=1)  # one thread: reproducible to the last bit
        exact = {'estimator': 'kiss_icp', 'max_range': estimator.max_range, 'deskew': False}
    else:
        estimator = load_estimator(method.estimator)
        exact = {'estimator': method.estimator}
    run = run_offline(task.source, estimator, max_scans=task.max_scans or None)
    gt = task.source.ground_truth()  # before writing: a bad pose file leaves no half folder
    run.save(out)
    write_kitti(out / 'trajectory_est.kitti', run.estimate)
    write_text(out / 'config.yaml', yaml.safe_dump(exact, sort_keys=False))
    extra = {'sequence': task.source.name, 'method': method.label}
    if gt is None:  # no ground truth (a KITTI test sequence): the run's facts only
        summary = _unevaluated(run) | extra
        write_json(out / SUMMARY, summary)
        return summary
    result = evaluate(run.estimate, gt, task.eval_config)
    title = f'{task.source.name}: {method.label}'
    summary, _ = write_outputs(out, result, run.estimate, run, title=title, **extra)
    return summary


def _plain(values: dict) -> dict:
    """A config dict as YAML-ready values (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


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


def _resumed(task: Task) -> TaskResult:
    out = pathlib.Path(task.output)
    return TaskResult(
        task.source.name, task.method.label, str(out), read_json(out / SUMMARY), resumed=True
    )


def run_tasks(
    tasks: list,
    workers: int = 0,
    address: str = '',
    resume: bool = False,
    log: Callable[[str], None] = print,
) -> list:
    """Run ``tasks`` (results in the same order). workers: local Ray processes (0 = all cores;
    1 = one after another in this process, no Ray); address: a Ray cluster's (workers then
    unused); resume: keep complete folders. Without Ray installed, runs them one after another
    (said once)."""
    results: dict = {}
    pending = []
    for i, task in enumerate(tasks):
        if resume and complete(task):
            results[i] = _resumed(task)
            log(f'{task.source.name} / {task.method.label}: complete, kept (--resume)')
        else:
            pending.append(i)
    workers = workers or os.cpu_count() or 1
    if pending and (address or (workers > 1 and len(pending) > 1)) and _ray_or_say(address, log):
        results.update(_on_ray([tasks[i] for i in pending], pending, workers, address, log))
    else:
        for n, i in enumerate(pending, 1):
            log(f'[{n}/{len(pending)}] {tasks[i].source.name} / {tasks[i].method.label} ...')
            results[i] = run_task(tasks[i])
            log(_progress(results[i], n, len(pending)))
    return [results[i] for i in range(len(tasks))]


def _ray_or_say(address: str, log) -> bool:
    import importlib.util

    if importlib.util.find_spec('ray') is not None:
        return True
    if address:
        raise ValueError("--address needs Ray: pip install 'pwan_ros[cluster]' (or ray)")
    log("Ray is not installed (pip install 'pwan_ros[cluster]'): running one after another")
    return False


def _on_ray(tasks: list, index: list, workers: int, address: str, log) -> dict:
    import logging

    import ray

    ray.init(
        address=address or None,
        num_cpus=None if address else workers,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    try:
        cpus = int(ray.cluster_resources().get('CPU', 0))
        log(f'Ray: {len(tasks)} tasks on {cpus} CPUs ({address or "local"})')
        remote = ray.remote(num_cpus=1, max_retries=0)(run_task)
        refs = {remote.remote(task): k for k, task in enumerate(tasks)}
        out, n = {}, 0
        while refs:
            (ref,), _ = ray.wait(list(refs), num_returns=1)
            k = refs.pop(ref)
            try:
                res = ray.get(ref)
            except Exception as exc:  # the worker process died (memory, a signal)
                task = tasks[k]
                reason = f'{type(exc).__name__}: {exc}'.splitlines()[0]
                res = TaskResult(task.source.name, task.method.label, task.output, error=reason)
            n += 1
            out[index[k]] = res
            log(_progress(res, n, len(tasks)))
        return out
    finally:
        ray.shutdown()


def _progress(res: TaskResult, n: int, total: int) -> str:
    head = f'[{n}/{total}] {res.sequence} / {res.method}: '
    if not res.ok:
        return head + f'FAILED: {res.error}'
    s = res.summary
    ate = s.get('ate_rmse_m')
    ate_text = 'no ground truth' if ate is None else f'ATE {ate:.3f} m'
    ms = s.get('median_latency_ms')
    ms_text = '' if ms is None else f', {ms:.0f} ms/scan'
    return head + f'{ate_text}, {s["scans"]}/{s.get("scans_published", s["scans"])} scans{ms_text}'
