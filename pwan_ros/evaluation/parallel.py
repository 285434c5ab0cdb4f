"""Run fleet tasks (:mod:`pwan_ros.evaluation.fleet`) one after another in this process, or as
Ray tasks (one CPU each, the odometry on one thread) on a local Ray of ``workers`` processes or
the cluster at ``address``; progress a line per finished task; ``resume`` keeps complete runs.
"""

from __future__ import annotations

import os
from typing import Callable

from pwan_ros.evaluation.fleet import TaskResult, complete, run_task

__all__ = ['run_tasks']


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
        kept = complete(task) if resume else None
        if kept is not None:
            results[i] = TaskResult(kept['sequence'], kept['method'], task.output, kept, '', True)
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
        address=address or 'local',  # a new local Ray, not one already running here
        num_cpus=None if address else workers,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,  # not its notes (auth tokens, a local instance started)
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
