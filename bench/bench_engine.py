"""Speed of the PWAN engine (Alg. 1 + fine-tune), side by side with a baseline core in one process.

The baseline is another checkout's ``pwan_ros/core`` (``--baseline DIR``, e.g. the a9638ec core:
``git worktree add /tmp/pwan_a9638ec a9638ec``), imported under another module name, so both run
on the same inputs in the same process, interleaved repeat by repeat, with 1 torch thread. Cases
(bunny bun045 -> bun000 from ../shared/data, jointly normalised, 2000 + 2000 random points):

  single       one start, the default registration
  tournament   starts=24, start_steps=60 (the multi-start for an unknown orientation)

Registrations on the CPU run on one thread (``threads=1``), on a GPU with the default threads
(``threads=0``: the host's threads run the fine-tune's nearest-neighbour searches there).
Prints per case the median CPU seconds of each core (wall seconds on a GPU), the speed-up over the
first core listed (the baseline; with ``--cpu-side`` on a GPU, this core on the CPU), the rotation
error, and the GFLOP/s the current adversarial stage reaches next to plain batched matrix products
of the network's shapes (how far from the arithmetic floor it still is).

    python bench/bench_engine.py --baseline /tmp/pwan_a9638ec --repeats 3
    python bench/bench_engine.py --baseline /tmp/pwan_a9638ec --device cuda    # on a GPU machine

``--also KEY=VALUE ...``: this core once more on the device with these configuration overrides
(e.g. ``finetune.nn=torch``), a row of its own in the same process.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    bunny_poses,
    key_values,
    print_table,
    rotation_error_deg,
    write_results,
)
from bench_rigid import make_pair  # noqa: E402

import pwan_ros.core as current  # noqa: E402

CASES = {'single': {}, 'tournament': {'starts': 24, 'start_steps': 60}}


def load_core(checkout: str, name: str = 'pwan_core_baseline'):
    """The ``pwan_ros/core`` package of another checkout, imported as ``name``."""
    path = os.path.join(os.path.abspath(checkout), 'pwan_ros', 'core')
    if not os.path.isfile(os.path.join(path, '__init__.py')):
        raise SystemExit(f'{checkout}: no pwan_ros/core package there')
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(path, '__init__.py'), submodule_search_locations=[path]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def config_of(core, seed: int, device: str, case: str, extra: dict):
    """The registration config of one run: ``case``'s settings, then ``extra`` (dotted keys)."""
    # the CPU on one thread (comparable across machines and with the baseline); on a GPU the
    # registration's own default (0: automatic), whose host threads run the fine-tune's searches
    threads = 1 if device == 'cpu' else 0
    values = {'seed': seed, 'threads': threads, 'device': device, **CASES[case], **extra}
    return core.RegistrationConfig.from_dict(values)


def network_flops(config, res, dim: int = 3) -> float:
    """Floating-point operations of the adversarial stage of ``res`` (current engine's work):
    a potential update is forward + backward (3 passes) over the two batches, plus the penalty's
    tangent rows (gp_points x d) on the first update of each step and every u-th warm-up update;
    a transform step is a forward + input backward (2 passes) over the source batch."""
    cfg = config.resolved()
    h1, h2 = cfg.potential.hidden
    per_point = 2.0 * (dim * h1 + h1 * h2 + h2 * 2 * h2 + 2 * h2 * h2 + 2 * h2)
    u = cfg.potential_updates
    rows = 2 * cfg.batch_size
    steps = res.iterations
    warm = max(res.potential_updates - steps * u, 0)
    gp_updates = steps + -(-warm // u)
    tangents = cfg.potential.gp_points * dim
    return per_point * (
        3 * rows * res.potential_updates + 3 * tangents * gp_updates + 2 * cfg.batch_size * steps
    )


def matmul_gflops(config, device: str, repeats: int = 300) -> float:
    """GFLOP/s of the network's largest batched product (2*h2 -> h2 over 1024 rows) in a loop."""
    import torch

    h1, h2 = config.resolved().potential.hidden
    a = torch.randn(1, 1024, 2 * h2, device=device)
    b = torch.randn(1, 2 * h2, h2, device=device)
    for _ in range(10):
        torch.bmm(a, b)
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.bmm(a, b)
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    return 2.0 * 1024 * 2 * h2 * h2 * repeats / (time.perf_counter() - t0) / 1e9


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('--data', default='../shared/data')
    p.add_argument('--results', default='results/engine')
    p.add_argument(
        '--baseline', help='checkout whose pwan_ros/core is the baseline (omit: current only)'
    )
    p.add_argument('--cases', nargs='+', default=list(CASES), choices=list(CASES))
    p.add_argument('--points', type=int, default=2000)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--device', default='cpu')
    p.add_argument(
        '--also',
        nargs='+',
        metavar='KEY=VALUE',
        help='also run this core on the device with these configuration overrides',
    )
    p.add_argument(
        '--cpu-side',
        action='store_true',
        help='also run this core on the CPU (1 thread) in the same process: the GPU speed-up',
    )
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    # name -> (core module, device, config overrides); the first entry is the reference of the
    # speed-up column
    cores = {'current': (current, args.device, {})}
    if args.also:
        extra = key_values(args.also)
        cores['current[' + ','.join(args.also) + ']'] = (current, args.device, extra)
    if args.baseline:
        cores = {'baseline': (load_core(args.baseline), args.device, {}), **cores}
    if args.cpu_side and args.device != 'cpu':
        cores = {'current@cpu': (current, 'cpu', {}), **cores}
    # CPU seconds measure the work on a CPU; on a GPU the host waits, so wall seconds count
    clock = 'cpu_s' if args.device == 'cpu' else 'wall_s'
    ref_name = next(iter(cores))
    poses = bunny_poses(args.data)
    src_n, ref_n, _, _, gt = make_pair(args.data, 'bun045', 'bun000', poses, 0.0, 0)
    rows, summary, warmup = [], [], []
    for case in args.cases:
        # on a GPU the first registration of a shape set builds its graphs (torch.compile, CUDA
        # graphs): timed once apart, as the warm-up a node pays on its first scan
        for name, (core, device, extra) in cores.items():
            if device != 'cpu':
                cfg = config_of(core, 99, device, case, extra)
                w0 = time.perf_counter()
                core.register(src_n[: args.points], ref_n[: args.points], cfg)
                warmup.append({'case': case, 'core': name, 'warmup_s': time.perf_counter() - w0})
                print(warmup[-1], flush=True)
        for rep in range(args.repeats):
            rng = np.random.default_rng(rep)
            src = src_n[rng.choice(len(src_n), args.points, replace=False)]
            ref = ref_n[rng.choice(len(ref_n), args.points, replace=False)]
            for name, (core, device, extra) in cores.items():
                cfg = config_of(core, rep, device, case, extra)
                c0, w0 = time.process_time(), time.perf_counter()
                res = core.register(src, ref, cfg)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                row = {
                    'case': case,
                    'core': name,
                    'device': device,
                    'repeat': rep,
                    'cpu_s': cpu,
                    'wall_s': wall,
                    'rot_err_deg': rotation_error_deg(res.transform[:3, :3], gt[:3, :3]),
                    'steps': res.iterations,
                    'updates': res.potential_updates,
                    'adversarial_s': res.timings['adversarial'],
                    'finetune_s': res.timings['finetune'],
                }
                if core is current:
                    row['gflops'] = (
                        network_flops(cfg, res) / max(res.timings['adversarial'], 1e-9) / 1e9
                    )
                rows.append(row)
                print(row, flush=True)
        med = {}
        for name in cores:
            sel = [r for r in rows if r['case'] == case and r['core'] == name]
            med[name] = {
                k: float(np.median([r[k] for r in sel]))
                for k in (
                    'cpu_s',
                    'wall_s',
                    'rot_err_deg',
                    'adversarial_s',
                    'finetune_s',
                    'steps',
                    'updates',
                )
            }
            if cores[name][0] is current:
                med[name]['gflops'] = float(np.median([r['gflops'] for r in sel]))
        for name in cores:
            entry = {'case': case, 'core': name, 'device': cores[name][1], **med[name]}
            if len(cores) > 1:
                entry['speedup'] = med[ref_name][clock] / med[name][clock]
            summary.append(entry)
    cfg = current.RegistrationConfig()
    ref_rate = matmul_gflops(cfg, args.device)
    print_table(
        summary,
        [
            'case',
            'core',
            'device',
            'cpu_s',
            'wall_s',
            'speedup',
            'rot_err_deg',
            'steps',
            'updates',
            'adversarial_s',
            'finetune_s',
            'gflops',
        ],
        f'PWAN engine, bunny 045->000, {args.points} + {args.points} points, '
        f"{'1 thread' if args.device == 'cpu' else 'default threads'}, "
        f'{args.device} (median of {args.repeats}; speedup = {ref_name} {clock} / this); '
        'plain bmm of the network shapes: '
        f'{ref_rate:.1f} GFLOP/s',
    )
    if warmup:
        print_table(warmup, ['case', 'core', 'warmup_s'], 'first registration (graph build), s')
    write_results(
        args.results, 'bench_engine', rows, summary + warmup + [{'matmul_gflops': ref_rate}]
    )


if __name__ == '__main__':
    main()
