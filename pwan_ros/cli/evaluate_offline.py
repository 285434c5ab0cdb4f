"""``pwan_evaluate --offline``: every (sequence, method) as a task (:mod:`pwan_ros.evaluation.
fleet`), every input checked before any run. One task writes into ``--output``; several into
``--output/SEQUENCE/METHOD`` (each whole or absent), then the aggregate."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from pwan_ros.evaluation.metrics import EvalConfig, EvaluationError

__all__ = ['offline_main']


def offline_main(args, cfg: EvalConfig, output: pathlib.Path, print_results) -> int:
    """Run the tasks of the command line; ``print_results([(summary, path)])`` prints one run's
    table. Exit code: 0, or 1 when a run of several failed (the others kept)."""
    from pwan_ros.cli.args import config_from_args
    from pwan_ros.evaluation import aggregate as agg_mod
    from pwan_ros.evaluation.fleet import complete, run_task
    from pwan_ros.evaluation.methods import OfflineConfig
    from pwan_ros.evaluation.parallel import run_tasks

    offline = config_from_args(OfflineConfig, args)
    tasks = _tasks(args, offline, cfg, output)
    if len(tasks) == 1:
        summary = complete(tasks[0]) if offline.resume else None
        if summary is not None:
            _log(f'{tasks[0].source.name} / {tasks[0].method.label}: complete, kept (--resume)')
        else:
            summary = run_task(tasks[0], raise_errors=True).summary
        print_results(args, [(summary, output / 'summary.json')])
        return 0
    results = run_tasks(tasks, offline.workers, offline.address, offline.resume, log=_log)
    agg = agg_mod.aggregate(results)
    path = agg_mod.write_aggregate(agg, output)
    print(json.dumps(agg, indent=2) if args.json else agg_mod.format_aggregate(agg))
    print(f'aggregate: {path}', file=sys.stderr if args.json else sys.stdout)
    for f in agg['failed']:
        print(
            f"pwan_evaluate: {f['sequence']} / {f['method']} failed: {f['error']}", file=sys.stderr
        )
    return 1 if agg['failed'] else 0


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _tasks(args, offline, cfg: EvalConfig, output: pathlib.Path) -> list:
    """The tasks: sequences x methods, their folders; raises ValueError for a bad input."""
    from pwan_ros.evaluation.fleet import Task
    from pwan_ros.evaluation.methods import methods, odometry_config, parse_variant, read_params

    params = read_params(offline.params) if offline.params else {}
    variants = [parse_variant(text) for text in args.variant]
    for variant in [(), *variants]:  # a bad name or value: one line before any work
        odometry_config(params, variant)
    runs = methods(offline.estimator, variants)
    _check_estimators(offline.estimator)
    sources = _sources(args, offline.rate_hz)
    output = output.resolve()  # Ray workers write from their own folders
    if len(sources) * len(runs) == 1:
        return [Task(sources[0], runs[0], str(output), params, cfg, args.max_scans)]
    return [
        Task(src, m, str(output / src.name / m.folder), params, cfg, args.max_scans, owned=True)
        for src in sources
        for m in runs
    ]


def _check_estimators(estimators: tuple) -> None:
    """The estimators other than pwan can be made (KISS-ICP installed, a factory loads)."""
    from pwan_ros.evaluation.offline import kiss_icp_available, load_estimator

    for spec in estimators:
        if spec == 'kiss_icp' and not kiss_icp_available():
            raise ValueError(
                '--estimator kiss_icp: KISS-ICP is not installed (pip install kiss-icp)'
            )
        if ':' in spec:
            load_estimator(spec)


def _sources(args, rate_hz: float) -> list:
    """The sequences of --bag / --kitti / --scans + --poses, each checked, with unique names."""
    from pwan_ros.evaluation.sequences import SequenceSource

    if len(args.scans) != len(args.poses):
        raise EvaluationError(
            f'{len(args.scans)} --scans folders but {len(args.poses)} --poses files (one each)'
        )
    gt = dict(gt_topic=args.gt_topic, gt_frame=args.frame, gt_parent=args.parent_frame)
    sources = [
        SequenceSource('bag', b, poses=args.gt_file or '', topic=args.topic, **gt)
        for b in args.bag or []
    ]
    sources += [SequenceSource('kitti', k, poses=args.gt_file or '') for k in args.kitti]
    sources += [
        SequenceSource('folder', d, poses=p, rate_hz=rate_hz)
        for d, p in zip(args.scans, args.poses)
    ]
    if not sources:
        raise EvaluationError('--offline needs sequences: --bag, --kitti or --scans with --poses')
    if args.gt_file and len(sources) > 1:
        raise EvaluationError('--gt-file is the ground truth of one sequence: give one')
    inputs = [(s.kind, s.path, s.poses) for s in sources]
    twice = next((s for s, key in zip(sources, inputs) if inputs.count(key) > 1), None)
    if twice is not None:
        raise EvaluationError(f'sequence {twice.path} given twice')
    for src in sources:
        src.check()
    return _unique_names(sources)


def _unique_names(sources: list) -> list:
    """The sources, a repeated name suffixed -2, -3, ... (never another source's own name)."""
    own = {s.name for s in sources}
    used: set = set()
    out = []
    for src in sources:
        name, n = src.name, 1
        while name in used or (name != src.name and name in own):
            n += 1
            name = f'{src.name}-{n}'
        used.add(name)
        out.append(dataclasses.replace(src, name=name) if name != src.name else src)
    return out
