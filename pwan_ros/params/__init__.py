"""Typed parameters: each config field declares its default, description and range once; config
validation, ROS parameter descriptors, CLI flags, YAML files and the docs tables are read from
it."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = [
    'FieldSpec',
    'REQUIRED',
    'param',
    'specs',
    'value_type',
    'problem',
    'check',
    'markdown_table',
    'ros_params_yaml',
]

#: ``param(REQUIRED, ...)``: a field without a default (a positional input such as a path)
REQUIRED = dataclasses.MISSING


@dataclass(frozen=True)
class FieldSpec:
    """Metadata of one config field.

    description: one line, with units (REP-103: metres, radians). low / high: inclusive numeric
    bounds (None: unbounded); low_open / high_open: that bound itself is excluded. choices:
    allowed strings.
    """

    description: str
    low: Optional[float] = None
    high: Optional[float] = None
    choices: Tuple[str, ...] = ()
    low_open: bool = False
    high_open: bool = False

    def range_text(self) -> str:
        """The allowed values in words: ``'a | b'``, ``'[0, 1]'``, ``'(0, 1]'``, ``'>= 1'`` or
        ``''``."""
        if self.choices:
            return ' | '.join(self.choices)
        if self.low is None and self.high is None:
            return ''
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return (
            f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
            f"{')' if self.high_open else ']'}"
        )


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e10 else f'{v:.6g}'


def param(
    default,
    description: str,
    low=None,
    high=None,
    choices=(),
    low_open: bool = False,
    high_open: bool = False,
):
    """A dataclass field carrying its :class:`FieldSpec` (``metadata['spec']``); ``default``
    :data:`REQUIRED` makes a field without a default."""
    spec = FieldSpec(description, low, high, tuple(choices), low_open, high_open)
    if default is REQUIRED:
        return dataclasses.field(metadata={'spec': spec})
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata={'spec': spec}
        )
    return dataclasses.field(default=default, metadata={'spec': spec})


def specs(cls) -> Dict[str, Tuple[Any, FieldSpec]]:
    """``name -> (default, FieldSpec)`` for every field of config dataclass ``cls`` that carries a
    spec (nested sub-configs do not); a required field's default is :data:`REQUIRED`."""
    out = {}
    for f in dataclasses.fields(cls):
        if 'spec' in f.metadata:
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else f.default_factory()
                if f.default_factory is not dataclasses.MISSING
                else REQUIRED
            )
            out[f.name] = (default, f.metadata['spec'])
    return out


@functools.lru_cache(maxsize=None)
def _hints(cls) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def value_type(cls, name: str) -> Tuple[type, bool]:
    """``(type, optional)`` of field ``name``: int, float, str, bool or tuple; optional when the
    annotation allows None."""
    hint = _hints(cls)[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional:
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint) or hint
    return origin, optional


def problem(cls, name: str, value: Any) -> Optional[str]:
    """What is wrong with ``value`` for field ``name`` of ``cls`` (``'expected ...'``), or None.

    Checks the type (an int is a valid float; a bool is not a number), finiteness and the spec's
    range and choices."""
    kind, optional = value_type(cls, name)
    spec = cls.__dataclass_fields__[name].metadata['spec']
    rng = spec.range_text()
    if value is None and optional:
        return None
    if kind is bool:
        return None if isinstance(value, bool) else 'expected true | false'
    if kind is str:
        if not isinstance(value, str):
            return f'expected {rng or "a string"}'
        return None if not spec.choices or value in spec.choices else f'expected {rng}'
    if kind in (int, float):
        is_int = isinstance(value, int) and not isinstance(value, bool)
        ok_type = is_int if kind is int else (is_int or isinstance(value, float))
        noun = 'an integer' if kind is int else 'a number'
        want = f'expected {noun}' + (
            f' {rng}' if rng.startswith(('<', '>')) else f' in {rng}' if rng else ''
        )
        if not ok_type or not math.isfinite(value):
            return want
        if spec.low is not None and (value < spec.low or (spec.low_open and value == spec.low)):
            return want
        if spec.high is not None and (
            value > spec.high or (spec.high_open and value == spec.high)
        ):
            return want
    return None


def check(config, error=ValueError, flags: bool = True) -> None:
    """Validate every spec'd field of dataclass instance ``config`` (call from ``__post_init__``).

    Raises ``error('--name-with-dashes: expected ...')`` (``flags``; CLI-facing configs) or
    ``error("invalid value ... for parameter 'name': expected ...")``; converts ints given for
    float fields to float (YAML / ROS may give 1 for 1.0)."""
    cls = type(config)
    for name in specs(cls):
        value = getattr(config, name)
        why = problem(cls, name, value)
        if why:
            if flags:
                raise error(f"--{name.replace('_', '-')} {value!r}: {why}")
            raise error(f"invalid value {value!r} for parameter '{name}': {why}")
        if (
            value_type(cls, name)[0] is float
            and isinstance(value, int)
            and not isinstance(value, bool)
        ):
            object.__setattr__(config, name, float(value))


def markdown_table(cls, prefix: str = '') -> str:
    """A Markdown table ``| name | default | range | description |`` of the fields of ``cls``
    (names as ``prefix + name``, e.g. ``'potential.'`` for a nested config)."""
    rows = ['| name | default | range | description |', '|---|---|---|---|']
    for name, (default, spec) in specs(cls).items():
        shown = (
            'required'
            if default is REQUIRED
            else "''"
            if default == ''
            else str(default).lower()
            if isinstance(default, bool)
            else default
        )
        cells = (f'`{prefix}{name}`', f'`{shown}`', spec.range_text(), spec.description)
        rows.append('| ' + ' | '.join(c.replace('|', '\\|') for c in cells) + ' |')
    return '\n'.join(rows) + '\n'


def ros_params_yaml(cls, node: str, header: str, aliases: Mapping[str, str] = None) -> str:
    """A ROS 2 parameter file ``{node: {ros__parameters: ...}}`` holding every field of ``cls`` at
    its default, each under a comment with its description and range. ``header``: leading comment
    lines (without ``#``)."""
    import textwrap

    import yaml

    out = [f'# {line}'.rstrip() for line in header.strip().splitlines()]
    out += [f'{node}:', '  ros__parameters:']
    for name, (default, spec) in specs(cls).items():
        rng = spec.range_text()
        text = spec.description + (f'; range {rng}' if rng and not spec.choices else '')
        out += textwrap.wrap(text, 96, initial_indent='    # ', subsequent_indent='    #   ')
        out.append('    ' + yaml.safe_dump({name: default}, default_flow_style=False).strip())
    return '\n'.join(out) + '\n'
