"""``pwan_register SRC REF``: register two point files with PWAN and print the transform.

Exit status 0 on success, 2 on bad input (message on stderr, no traceback), 3 when the result is
refused (the self-check, or ``--global``'s own tests, cannot vouch for the pose: the reason on
stderr; the best guess is still printed and written), 1 on unexpected errors.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings
from typing import List, Optional

import numpy as np

from pwan_ros.cli.args import short_help
from pwan_ros.core.errors import PwanInputError
from pwan_ros.io.point_files import check_output_path, read_points, write_points


#: core fields without a flag: verbose is --quiet's opposite
_NO_FLAG = ('verbose',)
#: the options ``--help`` shows (``--help-all``: every field of RegistrationConfig)
ESSENTIAL = (
    'transform',
    'divergence',
    'mass',
    'mass_ratio',
    'distance_threshold',
    'voxel_size',
    'starts',
    'global_init',
    'init',
    'viewpoints',
    'device',
    'seed',
    'output',
    'json',
    'quiet',
)


def _flags():
    """``(key, config class, field name)`` of every flag: the fields of RegistrationConfig, then
    those of its sections as ``section.field`` (``--finetune.max-iterations``), the keys of
    :meth:`RegistrationConfig.from_dict`."""
    from pwan_ros.core.config import _SECTIONS, RegistrationConfig
    from pwan_ros.params import specs

    out = [(name, RegistrationConfig, name) for name in specs(RegistrationConfig)]
    for section, cls in _SECTIONS.items():
        out += [(f'{section}.{name}', cls, name) for name in specs(cls)]
    return [f for f in out if f[0] not in _NO_FLAG]


def _parser() -> argparse.ArgumentParser:
    from pwan_ros.params import element_types, specs, value_type

    p = argparse.ArgumentParser(
        prog='pwan_register',
        allow_abbrev=False,  # a flag is its field's name, never a prefix of one
        description='Register SRC onto REF with a Partial Wasserstein Adversarial Network (PWAN). '
        'Files: .ply .pcd .xyz .txt .csv .npy .obj (N x 3 or N x 2; text/ply/pcd may be .gz; '
        "a mesh's vertices are its points). "
        "Lengths are in the files' units. Every option is a field of "
        'pwan_ros.core.RegistrationConfig (same name, same default); the fields of its sections '
        'are --section.field (--finetune.max-iterations, --potential.hidden A B). --help shows '
        'the options most runs need, --help-all every one.',
    )
    p.add_argument('source', metavar='SRC', help='source point file (moved)')
    p.add_argument('reference', metavar='REF', help='reference point file (fixed)')
    for key, cls, name in _flags():
        default, spec = specs(cls)[name]
        kind, _ = value_type(cls, name)
        rng = spec.range_text()
        text = (
            spec.description
            + (f'; range {rng}' if rng and not spec.choices else '')
            + f' (default {default})'
        ).replace('%', '%%')
        flags = ['--' + key.replace('_', '-')]
        if kind is bool:
            p.add_argument(
                *flags, dest=key, action=argparse.BooleanOptionalAction, default=None, help=text
            )
            continue
        meta = name.upper()
        extra = {'type': kind} if spec.choices else {'type': kind, 'metavar': meta}
        if kind is tuple:  # e.g. --potential.hidden 32 32
            elements = element_types(cls, name)
            extra = {'type': elements[0], 'nargs': len(elements), 'metavar': meta}
        p.add_argument(
            *flags, dest=key, default=None, help=text, choices=spec.choices or None, **extra
        )
    p.add_argument(
        '--output',
        '-o',
        help='write the transformed source (input order) to .npy/.ply/.pcd/.txt/.xyz/.csv/.obj; '
        "a mesh source to .ply/.obj keeps its faces (the deformed mesh)",
    )
    p.add_argument('--json', action='store_true', help='print one JSON object on stdout')
    p.add_argument('--quiet', '-q', action='store_true', help='no progress on stderr')
    p.add_argument(
        '--global',
        dest='global_init',
        action='store_true',
        help="unknown initial pose (3-D rigid): init='global', feature hypotheses chosen and "
        "refined by the partial objective (RegistrationConfig.global_search)",
    )
    p.add_argument(
        '--init',
        metavar='POSE_FILE',
        help='a prior pose SRC -> REF to start from: a 4x4 (or its top 3x4) as text, .npy, or '
        "the .json that --json prints; a refusal that asks for a prior pose is settled by one",
    )
    p.add_argument(
        '--viewpoints',
        choices=['origin'],
        help="with --global: 'origin' = each file is in its sensor's frame (a ROS scan, an RGB-D "
        'fragment); poses that put one cloud where the other sensor saw free space are rejected',
    )
    short_help(p, ESSENTIAL)
    return p


def _config(args):
    """The core config of the given flags (the others keep the library defaults)."""
    from pwan_ros.core.config import RegistrationConfig

    values = {}
    for key, _, _ in _flags():
        value = getattr(args, key, None)
        if value is not None:
            values[key] = tuple(value) if isinstance(value, list) else value
    values['verbose'] = not args.quiet
    given = [f'--{k.replace("_", "-")}' for k in ('mass', 'mass_ratio') if k in values]
    if values.get('divergence') == 'distance' and given:
        warnings.warn(
            f"{' and '.join(given)} set the mass type's matched mass (m-PWAN); --divergence "
            'distance matches the pairs closer than --distance-threshold and ignores it'
        )
    return RegistrationConfig.from_dict(values)


class _Interrupt:
    """SIGINT/SIGTERM as a flag: the registration stops at its next step (``should_stop``) and
    nothing is written, instead of an exception thrown into the middle of torch and Open3D work.
    A second signal exits at once."""

    def __init__(self, prog: str):
        self.prog = prog
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (tests calling main() from a thread)
                pass
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    def _handle(self, signum, frame):
        if self.requested:
            _hard_exit(self.prog, 130)
        self.requested = True

    def __call__(self) -> bool:
        return self.requested


def _hard_exit(prog: str, code: int) -> None:
    """Exit without interpreter teardown (torch / Open3D worker threads can crash it)."""
    print(f'{prog}: interrupted', file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file (links followed; either may not exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    prog = 'pwan_register'
    with _Interrupt(prog) as interrupted:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                config = _config(args)
                _check_output(args)  # before any work
                mesh, res = _register(args, config, interrupted)
            if interrupted():
                raise KeyboardInterrupt
            for w in caught:
                print(f'{prog}: warning: {w.message}', file=sys.stderr)
            if args.output:
                if not args.quiet:
                    print(f'[pwan] writing {args.output}', file=sys.stderr)
                out = np.full(mesh.vertices.shape, np.nan)
                out[res.source_valid] = res.transformed_source
                write_points(args.output, out, interrupted, mesh.triangles)
        except PwanInputError as exc:
            print(f'{prog}: error: {exc}', file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            _hard_exit(prog, 130)
    summary = _summary(res, args, config)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary, res, args, config)
    if res.status != 'ok':
        print(f'{prog}: refused: {res.reason}', file=sys.stderr)
        return 3
    return 0


def _check_output(args) -> None:
    """The output path can be written and is neither input file (PwanInputError)."""
    if args.output is None:
        return
    check_output_path(args.output)  # '' too: an unset variable in a script
    for role, given in (('source', args.source), ('reference', args.reference)):
        if _same_file(args.output, given):
            raise PwanInputError(f'{args.output}: output is the {role} file; choose another path')


def _register(args, config, interrupted) -> tuple:
    """(the source as read: its points, and its triangles when a mesh; the registration's
    result)."""
    from pwan_ros.io.point_files import read_mesh

    mesh = read_mesh(args.source)
    src = mesh.vertices
    ref = read_points(args.reference)
    from pwan_ros.core import register

    if not args.quiet:
        print(
            f'[pwan] registering {args.source} ({src.shape[0]} pts) onto '
            f'{args.reference} ({ref.shape[0]} pts)',
            file=sys.stderr,
        )
    if args.viewpoints and not args.global_init:
        raise PwanInputError('--viewpoints needs --global')
    if args.init and args.global_init:
        raise PwanInputError('--init gives the pose and --global searches for it: choose one')
    if args.global_init and config.transform != 'rigid':
        raise PwanInputError(
            '--global finds a rigid pose: run it rigidly with --output moved.ply, '
            f'then --transform {config.transform} on moved.ply'
        )
    init = 'global' if args.global_init else None
    if args.init:
        from pwan_ros.io.pose_file import read_pose

        init = read_pose(args.init, src.shape[1], rigid=config.transform == 'rigid')
    res = register(
        src,
        ref,
        config,
        init=init,
        should_stop=interrupted,
        viewpoints=args.viewpoints,
    )
    return mesh, res


def _summary(res, args, config) -> dict:
    """The result as the JSON object ``--json`` prints (2-D transforms as a 4x4 acting on
    (x, y, 0))."""
    t4 = res.transform
    if res.transform.shape[0] == 3:
        t4 = np.eye(4)
        t4[:2, :2] = res.transform[:2, :2]
        t4[:2, 3] = res.transform[:2, 2]
    summary = {
        'transform': [[float(v) for v in row] for row in t4],
        'time_s': round(float(res.time_s), 4),
        'num_source': res.num_source,
        'num_reference': res.num_reference,
        'matched_ratio': round(float(res.matched_ratio), 6),
        'converged': bool(res.converged),
        # non-rigid: `transform` is the deformation's affine part; --output has the moved points
        'transform_type': config.transform,
        'output': args.output if args.output else None,
        'status': res.status,
        'reason': res.reason,
        'check': res.check.as_dict() if res.check is not None else None,
        'timings': {k: round(float(v), 4) for k, v in res.timings.items()},
    }
    if args.global_init:
        summary.update(
            overlap=round(float(res.overlap), 6), confidence=round(float(res.confidence), 6)
        )
    return summary


def _print_summary(summary: dict, res, args, config) -> None:
    """The result for a person, on stdout."""
    np.set_printoptions(precision=6, suppress=True)
    part = ', affine part' if config.transform == 'nonrigid' else ''
    print(f'transform (SRC -> REF frame{part}):')
    print(np.array(summary['transform']))
    print(
        f"time {summary['time_s']:.3f} s, source {res.num_source} pts, reference "
        f"{res.num_reference} pts, matched {100 * res.matched_ratio:.1f} %, converged "
        f"{res.converged}"
    )
    if args.output:
        print(f'wrote {args.output}')
    if args.global_init:
        print(f'global: overlap {100 * res.overlap:.1f} %, confidence {res.confidence:.2f}')
    print(f'status: {res.status}' + (f' ({res.reason})' if res.reason else ''))


if __name__ == '__main__':  # pragma: no cover
    sys.exit(main())
