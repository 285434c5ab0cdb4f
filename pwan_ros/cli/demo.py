"""The package's main demo: what PWAN buys on a drive with the events real robots meet.

Steps: (1) generate the demo bag once (cached in ``OUTPUT/demo_bag``, regenerated when the
simulation settings change): a simulated LiDAR drive with stress events (``--stress``: a burst
of spurious returns, a sensor blackout during a fast turn, a glitch scan with far points, moving
objects); (2) run the bag through the node (``--node-cmd``; default the installed
``pwan_odometry_node`` with ``config/odometry.yaml`` and ``use_sim_time:=true``) over DDS with
``pwan_replay`` (its own DDS domain), recording ``/odometry`` and ``/diagnostics``: (a) the
default ``adaptive`` mode, and with ``--compare`` (b) the same at the sensor's pace (the replay
does not wait for poses: a recovery runs off the scan worker, scans meanwhile answered with
predictions and re-tracked after it), (c) the node with ``mode:=tracking`` (PWAN recovery off)
and (d) KISS-ICP in-process when it is installed; (3) evaluate every run
against the bag's ``/ground_truth`` and print one table (ATE, RPE, scans answered, scans where
PWAN engaged, scans that lost track, median latency). Outputs: ``trajectory.png`` (marks where
PWAN engaged and where each run lost track), ``trajectory_est.tum`` (run a), ``summary.json``
(run a's metrics, ``scans_pwan_engaged`` and a ``baselines`` object with the other runs); the
last line is ``summary: OUTPUT/summary.json``.

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

    output: str = param(
        'results/demo', 'folder of the demo outputs (bag cache, trajectories, report)'
    )
    scans: int = param(80, 'scans in the generated bag (10 Hz)', 2, 100_000)
    seed: int = param(0, 'simulation seed', 0, 2**32 - 1)
    node_cmd: str = param(
        '', "node command line; '' = the installed pwan_odometry_node with config/odometry.yaml"
    )
    odom_topic: str = param('/odometry', 'odometry topic of the node')
    rate: float = param(1.0, 'replay speed factor', 0.0, 1000.0, low_open=True)
    startup_timeout: float = param(120.0, 'wait for the node to come up (s)', 0.0, low_open=True)
    drain_timeout: float = param(
        15.0, 'stop this long without new odometry after the bag ends (s)', 0.0, low_open=True
    )
    regenerate: bool = param(False, 'rebuild the cached bag')
    wait_for_pose: float = param(
        15.0,
        'the replay waits up to this long (s) for the pose of each scan before '
        'playing on, so every scan is answered however long a PWAN recovery takes on '
        'this machine (latency still measured); 0 = sensor pace, scans arriving while '
        'the node is busy are dropped',
        0.0,
        3600.0,
    )
    stress: bool = param(
        True,
        'stress events in the drive: a burst of spurious returns, a sensor blackout '
        'during a fast turn, a glitch scan with far points',
    )
    compare: bool = param(
        True,
        'also run the bag at the sensor pace without waiting for poses, with tracking '
        'only (PWAN off) and with KISS-ICP (when installed), side by side',
    )

    def __post_init__(self):
        check(self)


def _params_file() -> pathlib.Path | None:
    """config/odometry.yaml from the source tree or the installed share directory."""
    here = pathlib.Path(__file__).resolve().parents[2] / 'config' / 'odometry.yaml'
    if here.exists():
        return here
    try:
        from ament_index_python.packages import get_package_share_directory

        share = pathlib.Path(get_package_share_directory('pwan_ros')) / 'config' / 'odometry.yaml'
        return share if share.exists() else None
    except Exception:  # package not in the ament index (plain pip install)
        return None


def default_node_command() -> list[str]:
    """The registration node executable (installed script, else ``python -m``) with its params
    file."""
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


def _sim_config(cfg: DemoConfig):
    from pwan_ros.evaluation.lidar_sim import SimConfig

    return SimConfig(scans=cfg.scans, seed=cfg.seed, stress=cfg.stress)


def _ensure_bag(sim, cfg: DemoConfig, out: pathlib.Path, log) -> pathlib.Path:
    from pwan_ros.evaluation.lidar_sim import write_sim_bag

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
    log(
        f'demo: {res.scans} scans, {res.mean_points:.0f} points/scan, path '
        f'{res.path_length_m:.1f} m ({res.seconds:.1f} s)'
    )
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


def _replay_into_node(
    node_cmd: list,
    bag: pathlib.Path,
    run_dir: pathlib.Path,
    logs: pathlib.Path,
    env: dict,
    cfg: DemoConfig,
    name: str,
):
    """Start the node, replay the bag into it over DDS, stop it; returns the RunRecord."""
    from pwan_ros.evaluation.run_record import RunRecord

    if run_dir.exists():
        shutil.rmtree(run_dir)
    node_log_path, replay_log_path = logs / f'{name}.node.log', logs / f'{name}.replay.log'
    with open(node_log_path, 'w') as node_log:
        node = subprocess.Popen(node_cmd, env=env, stdout=node_log, stderr=subprocess.STDOUT)
        try:
            replay_cmd = [
                sys.executable,
                '-m',
                'pwan_ros.cli.replay',
                '--bag',
                str(bag),
                '--output',
                str(run_dir),
                '--odom-topic',
                cfg.odom_topic,
                '--rate',
                str(cfg.rate),
                '--startup-timeout',
                str(cfg.startup_timeout),
                '--drain-timeout',
                str(cfg.drain_timeout),
                '--wait-for-pose',
                str(cfg.wait_for_pose if name != 'sensor_rate' else 0.0),
            ]
            with open(replay_log_path, 'w') as replay_log:
                replayer = subprocess.Popen(
                    replay_cmd, env=env, stdout=replay_log, stderr=subprocess.STDOUT
                )
                try:
                    while replayer.poll() is None:
                        if node.poll() is not None:
                            raise DemoError(
                                f'the node exited early (code {node.returncode}); last lines of '
                                f'{node_log_path}:\n{_tail(node_log_path)}'
                            )
                        time.sleep(0.2)
                finally:  # also on Ctrl-C: no replayer left running
                    _stop(replayer)
            if replayer.returncode != 0:
                raise DemoError(
                    f'replay failed (code {replayer.returncode}); last lines of '
                    f'{replay_log_path}:\n{_tail(replay_log_path)}'
                )
        finally:
            _stop(node)
    run = RunRecord.load(run_dir / 'run.json')
    if run.scans < 2:
        raise DemoError(
            f'the node answered {run.scans} of {run.scans_published} scans on {cfg.odom_topic}; '
            f'see {node_log_path}'
        )
    return run


def _events(sim) -> list:
    """The stress events of the simulated drive as [(label, t0, t1)] seconds from the first
    scan."""
    from pwan_ros.evaluation.lidar_sim import stress_event

    spans: dict = {}
    for k in range(sim.scans):
        event, blackout = stress_event(k, sim)
        for label in (
            [{'burst': 'spurious burst', 'glitch': 'far glitch'}[event]] if event else []
        ) + (['blackout + fast turn'] if blackout else []):
            t = k / sim.rate_hz
            t0, t1 = spans.get(label, (t, t))
            spans[label] = (min(t0, t), max(t1, t))
    return sorted(((label, t0, t1) for label, (t0, t1) in spans.items()), key=lambda e: e[1])


def run_demo(cfg: DemoConfig, log=print) -> pathlib.Path:
    """Run all steps; returns the summary.json path."""
    from pwan_ros.evaluation.compare import format_comparison
    from pwan_ros.evaluation.metrics import load_ground_truth
    from pwan_ros.ros.env import isolated_ros_env

    out = pathlib.Path(check_output(cfg.output, directory=True)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sim = _sim_config(cfg)
    bag = _ensure_bag(sim, cfg, out, log)
    gt, source = load_ground_truth(bag, '/ground_truth')
    env = isolated_ros_env(out / 'logs')
    (out / 'logs').mkdir(exist_ok=True)
    node_cmd = shlex.split(cfg.node_cmd) if cfg.node_cmd else default_node_command()
    runs = [_one_run(step, (bag, gt, sim), (out, env), cfg, log) for step in _plan(cfg, node_cmd)]
    path, tum, png = _write_summary(runs, (gt, source), sim, out, shlex.join(node_cmd))
    log(format_comparison(runs))
    log(f'trajectory: {tum}')
    log(f'plot: {png}')
    log(f'summary: {path}')
    return path


def _plan(cfg: DemoConfig, node_cmd: list) -> list:
    """One entry per run: (key in summary.json, label, node command or None = the in-process
    KISS-ICP)."""
    plan = [('adaptive', 'PWAN adaptive (default)', node_cmd)]
    if cfg.compare:
        tracking = node_cmd + ['--ros-args', '-p', 'mode:=tracking']
        plan += [
            # the same node with the replay not waiting for poses: scans at the sensor's pace,
            # a PWAN recovery off the scan worker answered meanwhile with predictions
            ('sensor_rate', 'PWAN adaptive, sensor pace', node_cmd),
            ('tracking_only', 'tracking only (PWAN off)', tracking),
            ('kiss_icp', 'KISS-ICP', None),
        ]
    return plan


def _one_run(step: tuple, data: tuple, where: tuple, cfg: DemoConfig, log):
    """One run of the plan (``step``) on ``data`` = (bag, ground truth, sim config), logs and
    outputs in ``where`` = (output folder, ROS environment): a summarised run."""
    from pwan_ros.evaluation.compare import skipped_run, summarise_run
    from pwan_ros.evaluation.offline import KissIcpOdometry, kiss_icp_available, run_offline

    (name, label, cmd), (bag, gt, sim), (out, env) = step, data, where
    t0 = time.monotonic()
    if cmd is None:
        if not kiss_icp_available():
            log(f'demo: {label}: skipped, not installed (pip install kiss-icp)')
            return skipped_run(name, label, 'not installed (pip install kiss-icp)')
        log(f'demo: {label}: running in-process on {bag}')
        record = run_offline(bag, KissIcpOdometry(max_range=sim.max_range))
    else:
        log(f'demo: {label}: {shlex.join(cmd)}  (logs in {out / "logs"})')
        run_dir = out / ('run' if name == 'adaptive' else f'run_{name}')
        record = _replay_into_node(cmd, bag, run_dir, out / 'logs', env, cfg, name)
    log(
        f'demo: {label}: {record.scans}/{record.scans_published} scans answered in '
        f'{time.monotonic() - t0:.1f} s'
    )
    return summarise_run(name, label, record, gt)


def _write_summary(runs: list, truth: tuple, sim, out: pathlib.Path, node_cmd: str) -> tuple:
    """The main run's trajectory (TUM), the comparison plot and summary.json (written last: its
    presence means the set is complete); returns their paths (summary, trajectory, plot). truth:
    (ground truth, where it came from)."""
    from pwan_ros.evaluation.compare import plot_comparison
    from pwan_ros.evaluation.metrics import make_summary
    from pwan_ros.io.trajectory import write_tum

    gt, source = truth
    main = runs[0]
    tum = write_tum(out / 'trajectory_est.tum', main.run.estimate)
    png = plot_comparison(
        runs,
        gt,
        out / 'trajectory.png',
        _events(sim),
        title=f'pwan_ros demo: simulated LiDAR drive, {sim.scans} scans'
        + (' with stress events' if sim.stress else ''),
    )
    summary = make_summary(
        main.result,
        main.run,
        title='pwan_ros demo (simulated LiDAR)',
        gt_source=source,
        node_cmd=node_cmd,
        trajectory_tum=str(tum),
        plot_png=str(png),
        scans_pwan_engaged=main.metrics()['scans_pwan_engaged'],
        scans_lost_track=main.metrics()['scans_lost_track'],
        stress_events=[{'event': e, 'start_s': a, 'end_s': b} for e, a, b in _events(sim)],
        baselines={r.name: r.metrics() for r in runs[1:]},
    )
    path = out / 'summary.json'
    write_text(path, json.dumps(summary, indent=2))
    return path, tum, png


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
