"""Config dataclass <-> argparse: one ``--flag`` per field (same name with dashes)."""
from __future__ import annotations

import argparse
import dataclasses

__all__ = ['add_config_arguments', 'config_from_args']

_TYPES = {'int': int, 'float': float, 'str': str}


def add_config_arguments(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """Add ``--field-name`` for each field of dataclass ``cls`` (defaults and types from the field).

    bool fields become ``--flag/--no-flag``; tuple fields take comma-separated values.
    """
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = '--' + f.name.replace('_', '-')
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, '__name__', str(f.type))
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if type_name == 'bool':
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif type_name.startswith('tuple'):
            parser.add_argument(flag, type=lambda s: tuple(v for v in s.split(',') if v),
                                default=default, help=f'comma-separated, default {",".join(map(str, default))}')
        else:
            kind = _TYPES.get(type_name.replace(' | None', ''), str)
            parser.add_argument(flag, type=kind, default=default, help=f'default {default}')


def config_from_args(cls, args: argparse.Namespace, skip=()):
    """Build dataclass ``cls`` from parsed arguments (its own __post_init__ validates)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip})
