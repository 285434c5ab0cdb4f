"""``pwan_replay``: play a bag into a running node over DDS and record its odometry (see
:mod:`pwan_ros.evaluation.replay`)."""

from __future__ import annotations

import argparse
import pathlib
import sys

from pwan_ros.cli.args import add_config_arguments, config_from_args, run_cli
from pwan_ros.evaluation import replay as _replay
from pwan_ros.evaluation.replay import ReplayConfig, ReplayError, replay
from pwan_ros.io import bags as bag_io
from pwan_ros.io.atomic import check_output


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='pwan_replay', description=_replay.__doc__.split('\n\n')[0]
    )
    parser.add_argument(
        '--output', required=True, help='directory for run.json and trajectory_est.tum'
    )
    add_config_arguments(parser, ReplayConfig)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        cfg = config_from_args(ReplayConfig, args)
        check_output(args.output, directory=True)  # before the replay, not after it
        run = replay(cfg)
        path = run.save(pathlib.Path(args.output))
        med = run.median_latency_ms()
        print(
            f'replay: {run.scans_published} scans published, {run.scans} answered, '
            f'median latency {"n/a" if med is None else f"{med:.1f} ms"}, {run.wall_s:.1f} s'
        )
        print(f'run: {path}')
        return 0

    return run_cli('pwan_replay', body, (ValueError, bag_io.BagError, ReplayError))


if __name__ == '__main__':
    sys.exit(main())
