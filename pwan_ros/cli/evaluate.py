"""``pwan_evaluate``: ATE / RPE of an odometry run against ground truth (see
:mod:`pwan_ros.evaluation.metrics`)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from pwan_ros.cli.args import add_config_arguments, config_from_args, run_cli
from pwan_ros.evaluation import metrics as _metrics
from pwan_ros.evaluation.methods import OfflineConfig
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
        from pwan_ros.cli.evaluate_offline import offline_main

        return offline_main(args, cfg, output, _print_results)
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


if __name__ == '__main__':
    sys.exit(main())
