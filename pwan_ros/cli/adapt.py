"""``pwan_adapt``: partial domain adaptation of a classifier on recorded features (PWAN).

  pwan_adapt --labelled L.npz --unlabelled U.npz [--config adapt.yaml] [--steps N]
             [--method pwan|source_only|wgan] [--seed S] [--device D] --output DIR [--json]
             [--check C.npz]

Every field of :class:`pwan_ros.adaptation.AdaptConfig` is also a flag (``--batch-size``,
``--lambda1`` ...). Precedence: defaults < ``--config`` YAML < flags. ``--resume`` continues
from ``DIR/checkpoints/latest.pt``. Exit status: 0 done, 2 bad input/config or an output that
cannot be written (one line on stderr), 130 interrupted (checkpoint written).

``pwan_adapt_import``: convert features recorded in a rosbag2 into the ``.npz`` input format.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import List, Optional

from pwan_ros.adaptation.config import AdaptConfig, AdaptIO, split_yaml
from pwan_ros.adaptation.errors import AdaptError
from pwan_ros.cli.args import short_help
from pwan_ros.params import specs

#: the paths of a run (:class:`AdaptIO`); the YAML may give them, a flag overrides it
_PATHS = ('labelled', 'unlabelled', 'output')


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ('1', 'true', 'yes', 'on'):
        return True
    if t in ('0', 'false', 'no', 'off'):
        return False
    raise argparse.ArgumentTypeError(f'expected true/false, got {text!r}')


#: the options ``pwan_adapt --help`` shows (``--help-all``: every field of AdaptConfig)
ESSENTIAL = (
    'labelled',
    'unlabelled',
    'output',
    'check',
    'config',
    'resume',
    'json',
    'quiet',
    'method',
    'steps',
    'safeguard',
    'device',
    'seed',
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='pwan_adapt',
        allow_abbrev=False,  # a flag is its field's name, never a prefix of one
        description='Partial domain adaptation with PWAN '
        '(labelled domain: all classes; unlabelled domain: a subset). --help shows the options '
        'most runs need, --help-all every one.',
    )
    io = specs(AdaptIO)
    for name in _PATHS:
        p.add_argument('--' + name, help=io[name][1].description)
    p.add_argument('--check', help=io['check'][1].description)
    p.add_argument('--config', help='YAML file (flat keys or a ROS parameter file)')
    p.add_argument('--resume', action='store_true', help=io['resume'][1].description)
    p.add_argument(
        '--json', action='store_true', help='print the summary as one JSON object on stdout'
    )
    p.add_argument('--quiet', action='store_true', help='no progress bar')
    g = p.add_argument_group('adaptation options (also YAML keys and ROS parameters)')
    for name, (default, spec) in AdaptConfig.specs().items():
        typ = _bool if isinstance(default, bool) else type(default)
        kw = {'choices': spec.choices} if spec.choices else {}
        g.add_argument(
            '--' + name.replace('_', '-'),
            dest=name,
            type=typ,
            default=None,
            help=f'{spec.description} (default {default})',
            **kw,
        )
    short_help(p, ESSENTIAL)
    return p


class Progress:
    """A one-line progress bar on stderr (only when it is a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.last = total, enabled and sys.stderr.isatty(), 0.0
        self.t0 = time.monotonic()

    def __call__(self, trainer, metrics) -> None:
        now = time.monotonic()
        done = metrics.step + 1
        if not self.enabled or (now - self.last < 0.2 and done < self.total):
            return
        self.last = now
        frac = done / self.total
        bar = '#' * int(30 * frac)
        sys.stderr.write(
            f'\r[{bar:<30s}] {done}/{self.total} loss={metrics.loss:.3f} '
            f'm_alpha={metrics.m_alpha:.2f} {now - self.t0:.0f}s '
        )
        if done >= self.total:
            sys.stderr.write('\n')
        sys.stderr.flush()


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except KeyboardInterrupt:  # before training started (loading inputs): nothing written
        print('pwan_adapt: interrupted', file=sys.stderr)
        return 130


def _main(args) -> int:
    try:
        values, io = ({}, {}) if args.config is None else split_yaml(args.config)
        for key in (*_PATHS, 'check'):
            if getattr(args, key) is None and io.get(key):
                setattr(args, key, str(io[key]))
        missing = [k for k in _PATHS if not getattr(args, k)]
        if missing:
            raise AdaptError('missing required option(s): ' + ', '.join('--' + m for m in missing))
        values.update(
            {k: getattr(args, k) for k in AdaptConfig.specs() if getattr(args, k) is not None}
        )
        config = AdaptConfig.from_mapping(values)
        from pwan_ros.adaptation.runner import run_adaptation

        stop = {'flag': False}

        def on_signal(signum, frame):
            stop['flag'] = True

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            result = run_adaptation(
                config,
                args.labelled,
                args.unlabelled,
                args.output,
                resume=args.resume,
                on_step=Progress(config.steps, not args.quiet and not args.json),
                should_stop=lambda: stop['flag'],
                log=lambda s: print(s, file=sys.stderr),
                check=args.check,
            )
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    except AdaptError as exc:
        print(f'pwan_adapt: error: {exc}', file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        acc = '' if result.accuracy is None else f' accuracy={result.accuracy:.4f}'
        dep = '' if result.deployed is None else f' deployed={result.deployed}'
        if result.deployed == 'source_only' and result.source_only_model:
            dep += f' ({result.source_only_model})'
        print(
            f'{"done" if result.completed else "interrupted"}: {result.steps_done}/{result.steps} '
            f'steps{dep}{acc} -> {result.output_dir}',
            file=sys.stderr,
        )
    return 0 if result.completed else 130


def import_main(argv: Optional[List[str]] = None) -> int:
    """``pwan_adapt_import BAG --features-topic T [--label-topic L | --label-field F] --output
    X.npz``.

    Exit status: 0 written, 2 bad input or unwritable output (one line), 130 interrupted (nothing
    written)."""
    p = argparse.ArgumentParser(
        prog='pwan_adapt_import',
        description='Convert image features recorded in a '
        'rosbag2 (one message per image) into the pwan_adapt .npz format.',
    )
    p.add_argument('bag', help='rosbag2 directory (sqlite3 or mcap)')
    p.add_argument(
        '--features-topic', required=True, help='topic with one feature vector per message'
    )
    p.add_argument(
        '--features-field',
        default='data',
        help='numeric array field of that message (dotted path)',
    )
    p.add_argument(
        '--label-topic', help='parallel topic with one label per feature message (same order)'
    )
    p.add_argument(
        '--label-field',
        help='label field (dotted path): in the label-topic message, or in the '
        'feature message when no label topic is given; integers or class-name strings',
    )
    p.add_argument(
        '--class-names', nargs='*', help='class names in id order (maps string labels to ids)'
    )
    p.add_argument('--output', required=True, help='output .npz')
    args = p.parse_args(argv)
    from pwan_ros.adaptation.bag_import import import_bag

    try:
        info = import_bag(
            args.bag,
            args.features_topic,
            args.output,
            features_field=args.features_field,
            label_topic=args.label_topic,
            label_field=args.label_field,
            class_names=args.class_names,
        )
    except AdaptError as exc:
        print(f'pwan_adapt_import: error: {exc}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('pwan_adapt_import: interrupted', file=sys.stderr)
        return 130
    print(json.dumps(info))
    return 0


if __name__ == '__main__':
    sys.exit(main())
