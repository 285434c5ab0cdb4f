"""``pwan_pcd2bag``: a folder of PCD scans + a pose file into a rosbag2 (see
:mod:`pwan_ros.evaluation.pcd_to_bag`)."""

from __future__ import annotations

import argparse
import sys

from pwan_ros.cli.args import add_config_arguments, config_from_args, run_cli
from pwan_ros.evaluation import pcd_to_bag as _convert
from pwan_ros.evaluation.pcd_to_bag import ConvertConfig, convert
from pwan_ros.io import bags as bag_io
from pwan_ros.io.pcd import PcdError
from pwan_ros.io.trajectory import TrajectoryError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='pwan_pcd2bag', description=_convert.__doc__.split('\n\n')[0]
    )
    add_config_arguments(parser, ConvertConfig)
    return parser


def _warnings_only(line: str) -> None:
    """The conversion's log: its warnings on stderr, the per-scan lines dropped."""
    if line.startswith('warning:'):
        print(f'pwan_pcd2bag: {line}', file=sys.stderr)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        res = convert(config_from_args(ConvertConfig, args), log=_warnings_only)
        print(
            f'wrote {res.bag}: {res.scans} scans, {res.mean_points:.0f} points/scan, '
            f'{res.duration_s:.1f} s'
        )
        return 0

    return run_cli('pwan_pcd2bag', body, (ValueError, PcdError, TrajectoryError, bag_io.BagError))


if __name__ == '__main__':
    sys.exit(main())
