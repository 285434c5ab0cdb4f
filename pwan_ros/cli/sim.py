"""``pwan_sim``: a simulated LiDAR drive into a rosbag2 (see
:mod:`pwan_ros.evaluation.lidar_sim`)."""

from __future__ import annotations

import argparse
import sys

from pwan_ros.cli.args import add_config_arguments, config_from_args, run_cli, short_help
from pwan_ros.evaluation import lidar_sim as _sim
from pwan_ros.evaluation.lidar_sim import SimConfig, write_sim_bag
from pwan_ros.io import bags as bag_io


#: the options ``pwan_sim --help`` shows (``--help-all``: every field of SimConfig)
ESSENTIAL = ('output', 'storage', 'scans', 'rate_hz', 'speed', 'outliers', 'seed', 'stress')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='pwan_sim', description=_sim.__doc__.split('\n\n')[0])
    parser.add_argument('--output', required=True, help='rosbag2 directory to create')
    parser.add_argument('--storage', choices=('mcap', 'sqlite3'), default='mcap')
    add_config_arguments(parser, SimConfig)
    short_help(parser, ESSENTIAL)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        res = write_sim_bag(args.output, config_from_args(SimConfig, args), storage=args.storage)
        print(
            f'wrote {res.bag}: {res.scans} scans, {res.mean_points:.0f} points/scan on average, '
            f'path {res.path_length_m:.1f} m, {res.seconds:.1f} s'
        )
        return 0

    return run_cli('pwan_sim', body, (ValueError, bag_io.BagError))


if __name__ == '__main__':
    sys.exit(main())
