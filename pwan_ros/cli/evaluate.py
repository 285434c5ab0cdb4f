"""``pwan_evaluate``: ATE / RPE of an odometry run against ground truth (see
:mod:`pwan_ros.evaluation.metrics`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

from pwan_ros.cli.args import add_config_arguments, config_from_args, run_cli
from pwan_ros.evaluation import metrics as _metrics
from pwan_ros.evaluation.fleet import OfflineConfig
from pwan_ros.evaluation.metrics import (
    EvalConfig,
    EvaluationError,
    evaluate,
    format_table,
    load_ground_truth,
    write_outputs,
)
from pwan_ros.evaluation.run_record import RunRecord
from pwan_ros.io import bags as bag_io
from pwan_ros.io.atomic import check_output
from pwan_ros.io.trajectory import Trajectory, TrajectoryError, read_pose_file
from pwan_ros.params import POINTS_TOPIC, invalid


def _evaluate_one(
    args, cfg: EvalConfig, bag, output: pathlib.Path, run: RunRecord | None, est: Trajectory | None
) -> tuple[dict, pathlib.Path]:
    gt, source = load_ground_truth(bag, args.gt_topic, args.gt_file, args.frame, args.parent_frame)
    if est is None:
        est = run.estimate
    if run is None and bag is not None and args.topic in bag_io.bag_topics(bag):
        # a pose file evaluated against a bag: count the bag's scans to report dropped ones
        run = RunRecord(
            estimate=est,
            scans_published=bag_io.require_topic(bag, args.topic).count,
            mode='file',
            bag=str(bag),
            topic=args.topic,
        )
    result = evaluate(est, gt, cfg)
    return write_outputs(
        output, result, est, run, title=str(bag or args.est or ''), gt_source=source
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='pwan_evaluate', description=_metrics.__doc__.split('\n\n')[0]
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument('--run', help='run.json written by pwan_replay')
    src.add_argument(
        '--est', help='estimated trajectory: pose file (TUM, KITTI, 4x4 blocks) or a recorded bag'
    )
    src.add_argument(
        '--offline',
        action='store_true',
        help='run each --estimator in process on each sequence (--bag, --kitti, --scans)',
    )
    parser.add_argument('--bag', nargs='+', help='rosbag2 directory (several with --offline)')
    parser.add_argument('--topic', default=POINTS_TOPIC, help='PointCloud2 scan topic')
    parser.add_argument(
        '--gt-topic', default='/ground_truth', help='ground-truth topic in the bag'
    )
    parser.add_argument(
        '--est-topic', default='/odometry', help='odometry topic when --est is a bag'
    )
    parser.add_argument(
        '--corrected-topic',
        default='/pwan_odometry/corrected_odometry',
        help='when --est is a bag: final poses that replace those of --est-topic at the same '
        "stamps (scans first answered with a prediction during a recovery), if recorded; '' = "
        'ignore',
    )
    parser.add_argument('--gt-file', help='ground-truth pose file instead of --gt-topic')
    parser.add_argument(
        '--frame', help='child frame of the ground-truth poses (required for /tf topics)'
    )
    parser.add_argument('--parent-frame', help='parent frame filter for TF ground truth')
    parser.add_argument(
        '--max-scans',
        type=int,
        default=0,
        help='offline: stop after this many scans (0 = all, else >= 2)',
    )
    parser.add_argument('--output', default='evaluation', help='output directory')
    parser.add_argument(
        '--json', action='store_true', help='print the summary JSON instead of the table'
    )
    add_config_arguments(parser, EvalConfig)
    _add_offline_arguments(parser)
    return parser


def _add_offline_arguments(parser: argparse.ArgumentParser) -> None:
    """The sequences and options of --offline (pwan_ros.evaluation.fleet)."""
    parser.add_argument(
        '--kitti', nargs='+', default=[], help='offline: KITTI odometry sequence folders'
    )
    parser.add_argument(
        '--scans', nargs='+', default=[], help='offline: folders of .pcd/.pcd.gz/.npy scans'
    )
    parser.add_argument(
        '--poses', nargs='+', default=[], help='offline: the pose file of each --scans folder'
    )
    parser.add_argument(
        '--variant',
        action='append',
        default=[],
        help="offline: a variant of 'pwan', name=value[,name=value] (repeat for several)",
    )
    add_config_arguments(parser, OfflineConfig)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(
        'pwan_evaluate',
        lambda: _main(args),
        (ValueError, bag_io.BagError, EvaluationError, TrajectoryError),
    )


def _same_path(a, b) -> bool:
    """Whether two paths name the same file or folder (relative to here, links followed)."""
    return os.path.realpath(os.fspath(a)) == os.path.realpath(os.fspath(b))


def _main(args) -> int:
    cfg = config_from_args(EvalConfig, args)
    if args.max_scans < 0 or args.max_scans == 1:  # an evaluation needs 2 poses
        raise EvaluationError(
            invalid('max_scans', args.max_scans, 'expected 0 (all scans) or >= 2', flags=True)
        )
    check_output(args.output, directory=True)  # before any work
    bags = args.bag or [None]
    output = pathlib.Path(args.output)
    results = []
    if args.offline:
        return _offline(args, cfg, output)
    if args.run:
        run = RunRecord.load(args.run)
        if bags[0] and run.bag and not _same_path(bags[0], run.bag):
            print(
                f'pwan_evaluate: warning: {args.run} was recorded from {run.bag}, evaluated '
                f'against the ground truth of {bags[0]}',
                file=sys.stderr,
            )
        results.append(_evaluate_one(args, cfg, bags[0] or run.bag or None, output, run, None))
    else:
        if len(bags) > 1:
            raise EvaluationError('several --bag values need --offline')
        est_path = pathlib.Path(args.est)
        if (est_path / 'metadata.yaml').exists():  # a recorded bag, e.g. from ros2 bag record
            est = bag_io.read_trajectory(est_path, args.est_topic)
            topics = bag_io.bag_topics(est_path)
            if args.corrected_topic in topics and topics[args.corrected_topic].count:
                est = est.replaced_by(bag_io.read_trajectory(est_path, args.corrected_topic))
        else:
            est = read_pose_file(est_path)
        results.append(_evaluate_one(args, cfg, bags[0], output, None, est))
    _print_results(args, results)
    return 0


def _print_results(args, results) -> None:
    for summary, path in results:
        if args.json:
            print(json.dumps(summary, indent=2))
        elif 'matched' not in summary:  # a sequence without ground truth
            print(f"no ground truth: {summary['scans']} poses in {path.parent}")
        else:
            print(format_table(summary))
            print(f"trajectory: {summary['trajectory_tum']}\nplot: {summary['plot_png']}")
        # with --json stdout is the JSON alone (a parser reads it whole)
        print(f'summary: {path}', file=sys.stderr if args.json else sys.stdout)


def _offline(args, cfg: EvalConfig, output: pathlib.Path) -> int:
    """--offline: every (sequence, estimator) as a task (pwan_ros.evaluation.fleet); one task
    writes into --output, several into --output/SEQUENCE[/METHOD] plus the aggregate."""
    from pwan_ros.evaluation import aggregate as agg_mod
    from pwan_ros.evaluation.fleet import run_task, run_tasks

    offline = config_from_args(OfflineConfig, args)
    tasks = _tasks(args, offline, cfg, output)
    if len(tasks) == 1:
        summary = run_task(tasks[0], raise_errors=True).summary
        _print_results(args, [(summary, output / 'summary.json')])
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


def _tasks(args, offline: OfflineConfig, cfg: EvalConfig, output: pathlib.Path) -> list:
    """The (sequence, method) tasks of the command line, every input checked first."""
    from pwan_ros.evaluation.fleet import Method, Task, odometry_config, read_params

    sources = _sources(args, offline.rate_hz)
    params = read_params(offline.params) if offline.params else {}
    variants = [_variant(text) for text in args.variant] or [()]
    for variant in variants:  # a bad name or value: one line before any work
        odometry_config(params, variant)
    methods = [
        Method(e, v) for e in offline.estimator for v in (variants if e == 'pwan' else [()])
    ]
    tasks = []
    for src in sources:
        for m in methods:
            folder = output
            if len(sources) > 1:
                folder = folder / src.name
            if len(methods) > 1:
                folder = folder / m.label
            tasks.append(Task(src, m, str(folder), params, cfg, args.max_scans))
    return tasks


def _variant(text: str) -> tuple:
    """'name=value[,name=value]' -> ((name, value), ...), values read as YAML scalars."""
    import yaml

    pairs = []
    for item in text.split(','):
        name, sep, value = item.partition('=')
        if not sep or not name.strip():
            raise ValueError(f'--variant {text!r}: expected name=value[,name=value]')
        pairs.append((name.strip(), yaml.safe_load(value)))
    return tuple(pairs)


def _sources(args, rate_hz: float) -> list:
    """The sequences of --bag / --kitti / --scans + --poses, with unique names."""
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
    seen: dict = {}
    for k, src in enumerate(sources):
        n = seen[src.name] = seen.get(src.name, 0) + 1
        if n > 1:
            sources[k] = dataclasses.replace(src, name=f'{src.name}-{n}')
    return sources


if __name__ == '__main__':
    sys.exit(main())
