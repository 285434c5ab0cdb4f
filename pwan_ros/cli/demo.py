"""The package's main demo: simulated LiDAR bag -> PWAN odometry node (over DDS) -> evaluation.

Steps: (1) generate the demo bag once (cached in ``OUTPUT/demo_bag``, regenerated when the
simulation settings change), (2) start the node (``--node-cmd``; default the installed
``pwan_odometry_node`` with ``config/odometry.yaml`` and ``use_sim_time:=true``), (3) replay the
bag into it with ``pwan_replay`` (its own DDS domain, LARGE_DATA transports), recording
``/odometry`` and ``/diagnostics``, (4) evaluate against the bag's ``/ground_truth``, print a
table; the last line is ``summary: OUTPUT/summary.json``.

    python -m pwan_ros.cli.demo --output results/demo [--scans 80] [--rate 1.0] [--node-cmd "..."]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from pwan_ros.io.atomic import check_output, write_text
from pwan_ros.cli.args import add_config_arguments, config_from_args, run_cli
from pwan_ros.params import check, param

__all__ = ['DemoConfig', 'DemoError', 'run_demo', 'default_node_command', 'main']


class DemoError(RuntimeError):
    """A demo step failed (message says which and where its log is)."""


@dataclass(frozen=True)
class DemoConfig:
    """Demo options (CLI flags: same names with dashes)."""

    output: str = param('results/demo', 'folder of the demo outputs (bag cache, trajectories, report)')
    scans: int = param(80, 'scans in the generated bag (10 Hz)', 2, 100_000)
    seed: int = param(0, 'simulation seed', 0, 2**32 - 1)
    node_cmd: str = param('', "node command line; '' = the installed pwan_odometry_node with config/odometry.yaml")
    odom_topic: str = param('/odometry', 'odometry topic of the node')
    rate: float = param(1.0, 'replay speed factor', 0.0, 1000.0, low_open=True)
    startup_timeout: float = param(120.0, 'wait for the node to come up (s)', 0.0, low_open=True)
    drain_timeout: float = param(15.0, 'stop this long without new odometry after the bag ends (s)', 0.0,
                                 low_open=True)
    regenerate: bool = param(False, 'rebuild the cached bag')

    def __post_init__(self):
        check(self)


def _params_file() -> pathlib.Path | None:
    """config/odometry.yaml from the source tree or the installed share directory."""
    here = pathlib.Path(__file__).resolve().parents[1] / 'config' / 'odometry.yaml'
    if here.exists():
        return here
    try:
        from ament_index_python.packages import get_package_share_directory
        share = pathlib.Path(get_package_share_directory('pwan_ros')) / 'config' / 'odometry.yaml'
        return share if share.exists() else None
    except Exception:  # package not in the ament index (plain pip install)
        return None


def default_node_command() -> list[str]:
    """The registration node executable (installed script, else ``python -m``) with its params file."""
    exe = None
    for d in (pathlib.Path(sys.executable).parent, pathlib.Path(sys.prefix) / 'lib' / 'pwan_ros'):
        if (d / 'pwan_odometry_node').exists():
            exe = [str(d / 'pwan_odometry_node')]
            break
    if exe is None:
        found = shutil.which('pwan_odometry_node')
        exe = [found] if found else [sys.executable, '-m', 'pwan_ros.ros.odometry_node']
    cmd = exe + ['--ros-args']
    params = _params_file()
    if params is not None:
        cmd += ['--params-file', str(params)]
    return cmd + ['-p', 'use_sim_time:=true']


def _ensure_bag(cfg: DemoConfig, out: pathlib.Path, log) -> pathlib.Path:
    from pwan_ros.evaluation.lidar_sim import SimConfig, write_sim_bag
    sim = SimConfig(scans=cfg.scans, seed=cfg.seed)
    bag, stamp = out / 'demo_bag', out / 'demo_bag.config.json'
    wanted = json.dumps(dataclasses.asdict(sim), sort_keys=True)
    if bag.exists() and not cfg.regenerate and stamp.exists() and stamp.read_text() == wanted:
        log(f'demo: using cached bag {bag}')
        return bag
    if bag.exists():
        shutil.rmtree(bag)
    log(f'demo: generating {cfg.scans} simulated scans into {bag} ...')
    res = write_sim_bag(bag, sim)
    write_text(stamp, wanted)
    log(f'demo: {res.scans} scans, {res.mean_points:.0f} points/scan, path {res.path_length_m:.1f} m '
        f'({res.seconds:.1f} s)')
    return bag


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: pathlib.Path, n: int = 15) -> str:
    try:
        return '\n'.join(path.read_text(errors='replace').splitlines()[-n:])
    except OSError:
        return ''


def run_demo(cfg: DemoConfig, log=print) -> pathlib.Path:
    """Run all steps; returns the summary.json path."""
    from pwan_ros.evaluation.metrics import evaluate, format_table, load_ground_truth, write_outputs
    from pwan_ros.ros.env import isolated_ros_env
    from pwan_ros.evaluation.run_record import RunRecord

    out = pathlib.Path(check_output(cfg.output, directory=True)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    bag = _ensure_bag(cfg, out, log)
    env = isolated_ros_env(out / 'logs')
    node_cmd = shlex.split(cfg.node_cmd) if cfg.node_cmd else default_node_command()
    run_dir = out / 'run'
    if run_dir.exists():
        shutil.rmtree(run_dir)
    log(f'demo: starting node: {shlex.join(node_cmd)}  (log {out / "node.log"})')
    t0 = time.monotonic()
    with open(out / 'node.log', 'w') as node_log:
        node = subprocess.Popen(node_cmd, env=env, stdout=node_log, stderr=subprocess.STDOUT)
        try:
            replay_cmd = [sys.executable, '-m', 'pwan_ros.cli.replay', '--bag', str(bag), '--output', str(run_dir),
                          '--odom-topic', cfg.odom_topic, '--rate', str(cfg.rate),
                          '--startup-timeout', str(cfg.startup_timeout), '--drain-timeout', str(cfg.drain_timeout)]
            with open(out / 'replay.log', 'w') as replay_log:
                replayer = subprocess.Popen(replay_cmd, env=env, stdout=replay_log, stderr=subprocess.STDOUT)
                try:
                    while replayer.poll() is None:
                        if node.poll() is not None:
                            raise DemoError(f'the node exited early (code {node.returncode}); last lines of '
                                            f'{out / "node.log"}:\n{_tail(out / "node.log")}')
                        time.sleep(0.2)
                finally:  # also on Ctrl-C: no replayer left running
                    _stop(replayer)
            if replayer.returncode != 0:
                raise DemoError(f'replay failed (code {replayer.returncode}); last lines of {out / "replay.log"}:\n'
                                f'{_tail(out / "replay.log")}')
        finally:
            _stop(node)
    run = RunRecord.load(run_dir / 'run.json')
    log(f'demo: replayed {run.scans_published} scans in {time.monotonic() - t0:.1f} s')
    if run.scans < 2:
        raise DemoError(f'the node answered {run.scans} of {run.scans_published} scans on {cfg.odom_topic}; '
                        f'see {out / "node.log"}')
    gt, source = load_ground_truth(bag, '/ground_truth')
    result = evaluate(run.estimate, gt)
    summary, path = write_outputs(out, result, run.estimate, run, title='pwan_ros demo (simulated LiDAR)',
                                  gt_source=source, node_cmd=shlex.join(node_cmd))
    log(format_table(summary))
    log(f"trajectory: {summary['trajectory_tum']}")
    log(f"plot: {summary['plot_png']}")
    log(f'summary: {path}')
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='pwan_demo', description=__doc__.split('\n\n')[0])
    add_config_arguments(parser, DemoConfig)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        run_demo(config_from_args(DemoConfig, args))
        return 0
    return run_cli('pwan_demo', body, (ValueError, DemoError, RuntimeError))


if __name__ == '__main__':
    os.environ.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    sys.exit(main())
