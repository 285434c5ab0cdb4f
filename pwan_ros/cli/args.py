"""Config dataclass <-> argparse: one ``--flag`` per field (same name with dashes)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
from typing import Callable, Iterable, Tuple, Type

from pwan_ros.io.atomic import os_error_text

__all__ = ['add_config_arguments', 'config_from_args', 'run_cli', 'os_error_text', 'short_help']

_TYPES = {'int': int, 'float': float, 'str': str}


def add_config_arguments(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """Add ``--field-name`` for each field of dataclass ``cls`` (defaults and types from the
    field).

    bool fields become ``--flag/--no-flag``; tuple fields take comma-separated values; fields
    without a default are required flags.
    """
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = '--' + f.name.replace('_', '-')
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, '__name__', str(f.type))
        spec = f.metadata.get('spec')  # a pwan_ros.params field: its description leads the help
        lead = f'{spec.description}; ' if spec is not None else ''
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            parser.add_argument(flag, required=True, help=(lead + 'required').replace('%', '%%'))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if type_name == 'bool':
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=(lead + f'default {default}').replace('%', '%%'),
            )
        elif type_name.startswith('tuple'):
            parser.add_argument(
                flag,
                type=lambda s: tuple(v for v in s.split(',') if v),
                default=default,
                help=(lead + f'comma-separated, default {",".join(map(str, default))}').replace(
                    '%', '%%'
                ),
            )
        else:
            kind = _TYPES.get(type_name.replace(' | None', ''), str)
            parser.add_argument(
                flag,
                type=kind,
                default=default,
                help=(lead + f'default {default}').replace('%', '%%'),
            )


def config_from_args(cls, args: argparse.Namespace, skip=()):
    """Build dataclass ``cls`` from parsed arguments (its own __post_init__ validates)."""
    return cls(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip}
    )


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt like SIGINT (main thread only), so both unwind the same
    way: atomic outputs delete their temporaries on the way out."""
    try:
        old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread
        old = None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def run_cli(
    prog: str, body: Callable[[], int], errors: Tuple[Type[BaseException], ...] = ()
) -> int:
    """Run a command's ``body`` with the package's failure contract.

    ``errors`` (the command's own bad-input types) and any ``OSError`` (a missing input, a full or
    read-only disk) print one line ``prog: error: ...`` and return 2; Ctrl-C or SIGTERM print
    ``prog: interrupted`` and return 130. Outputs are written atomically
    (:mod:`pwan_ros.io.atomic`), so either way nothing half-written is left behind."""
    try:
        with _sigterm_as_interrupt():
            return body()
    except KeyboardInterrupt:
        print(f'{prog}: interrupted', file=sys.stderr)
        return 130
    except OSError as exc:
        print(f'{prog}: error: {os_error_text(exc)}', file=sys.stderr)
        return 2
    except errors as exc:
        print(f'{prog}: error: {exc}', file=sys.stderr)
        return 2


class _HelpAll(argparse.Action):
    """``--help-all``: every option's help (those ``--help`` leaves out restored), then exit."""

    def __init__(self, option_strings, dest, hidden=None, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.hidden = hidden or {}

    def __call__(self, parser, namespace, values, option_string=None):
        for action, text in self.hidden.items():
            action.help = text
        parser.print_help()
        parser.exit()


def short_help(parser: argparse.ArgumentParser, essential: Iterable[str]) -> None:
    """``--help`` lists the options a user needs (their ``dest`` in ``essential``, and the
    positionals); ``--help-all`` lists every option. Options left out still work."""
    keep = set(essential) | {'help'}
    options = [a for a in parser._actions if a.option_strings and a.dest != 'help']
    hidden = {}
    for action in options:
        if action.dest not in keep:
            hidden[action] = action.help
            action.help = argparse.SUPPRESS
    parser.add_argument(
        '--help-all',
        action=_HelpAll,
        hidden=hidden,
        help=f'show all {len(options)} options and exit',
    )
