"""Typed parameters: each config field declares its default, description and range once; config
validation, ROS parameter descriptors, CLI flags, YAML files and the docs tables are read from
it. Every config validates in its ``__post_init__`` with :func:`check`: the field specs, then its
few cross-field rules, each failure one line naming the parameter, its value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

__all__ = [
    'ParamSpec',
    'POINTS_TOPIC',
    'ODOMETRY_READY',
    'REQUIRED',
    'FORMATS',
    'param',
    'specs',
    'value_type',
    'problem',
    'check',
    'invalid',
    'markdown_table',
    'ros_params_yaml',
]

#: the default scan topic (sensor_msgs/PointCloud2) of every tool and launch file
POINTS_TOPIC = '/points'
#: how the odometry node's log line saying it listens begins (launch starts a bag player on it)
ODOMETRY_READY = 'pwan_odometry ready:'

#: ``param(REQUIRED, ...)``: a field without a default (a positional input such as a path)
REQUIRED = dataclasses.MISSING


def _is_device(value: str) -> bool:
    return value in ('auto', 'cpu', 'cuda') or (value[:5] == 'cuda:' and value[5:].isdigit())


#: a ROS 2 topic name as rcl validates it, without substitutions (``~``, ``{node}``), which no
#: node expands in a bag: tokens of letters, digits and _ (not starting with a digit) joined by /
_TOPIC = re.compile(r'/?[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*')


#: string formats a field may require (``ParamSpec.fmt``): name -> (test, the allowed values in
#: words)
FORMATS: Dict[str, Tuple[Callable[[str], bool], str]] = {
    'device': (_is_device, 'auto | cpu | cuda | cuda:N'),
    'frame_id': (lambda v: not v.startswith('/'), 'a frame id without a leading slash'),
    'frame_name': (
        lambda v: bool(v) and not v.startswith('/'),
        'a frame id (not empty, no leading slash)',
    ),
    'topic': (
        lambda v: _TOPIC.fullmatch(v) is not None,
        'a ROS topic name such as /points (letters, digits, _ and /)',
    ),
}


@dataclass(frozen=True)
class ParamSpec:
    """Metadata of one config field.

    description: one line, with units (REP-103: metres, radians). low / high: inclusive numeric
    bounds (None: unbounded; for a tuple field, the bounds of each element); low_open /
    high_open: that bound itself is excluded. choices: allowed strings. fmt: a string format of
    :data:`FORMATS` (e.g. ``'device'``).
    """

    description: str
    low: Optional[float] = None
    high: Optional[float] = None
    choices: Tuple[str, ...] = ()
    low_open: bool = False
    high_open: bool = False
    fmt: str = ''

    def range_text(self) -> str:
        """The allowed values in words: ``'a | b'``, ``'[0, 1]'``, ``'(0, 1]'``, ``'>= 1'`` or
        ``''``."""
        if self.choices:
            return ' | '.join(self.choices)
        if self.fmt:
            return FORMATS[self.fmt][1]
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
    fmt: str = '',
):
    """A dataclass field carrying its :class:`ParamSpec` (``metadata['spec']``); ``default``
    :data:`REQUIRED` makes a field without a default."""
    if fmt and fmt not in FORMATS:
        raise ValueError(f'unknown format {fmt!r} (known: {", ".join(FORMATS)})')
    spec = ParamSpec(description, low, high, tuple(choices), low_open, high_open, fmt)
    if default is REQUIRED:
        return dataclasses.field(metadata={'spec': spec})
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata={'spec': spec}
        )
    return dataclasses.field(default=default, metadata={'spec': spec})


def specs(cls) -> Dict[str, Tuple[Any, ParamSpec]]:
    """``name -> (default, ParamSpec)`` for every field of config dataclass ``cls`` that carries a
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


def element_types(cls, name: str) -> Tuple[type, ...]:
    """Element types of a ``Tuple[...]`` field (``Tuple[int, int]`` -> ``(int, int)``; ``()`` for
    a bare ``tuple`` or ``Tuple[x, ...]``)."""
    hint = _hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args and typing.get_origin(hint) is not tuple:  # Optional[Tuple[...]]
        hint = args[0]
    inner = typing.get_args(hint)
    return () if not inner or Ellipsis in inner else tuple(inner)


def _number_problem(spec: ParamSpec, kind: type, value: Any) -> Optional[str]:
    """What is wrong with number ``value`` for a field of type ``kind`` (int or float), or None."""
    rng = spec.range_text()
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
    if spec.high is not None and (value > spec.high or (spec.high_open and value == spec.high)):
        return want
    return None


def problem(cls, name: str, value: Any) -> Optional[str]:
    """What is wrong with ``value`` for field ``name`` of ``cls`` (``'expected ...'``), or None.

    Checks the type (an int is a valid float; a bool is not a number), finiteness, the spec's
    range, choices and format; a ``Tuple[...]`` field: its length and each element."""
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
        if spec.fmt and not FORMATS[spec.fmt][0](value):
            return f'expected {rng}'
        return None if not spec.choices or value in spec.choices else f'expected {rng}'
    if kind in (int, float):
        return _number_problem(spec, kind, value)
    if kind is tuple:
        types = element_types(cls, name)
        if not types:
            return None if isinstance(value, (tuple, list)) else 'expected a list'
        noun = {int: 'integers', float: 'numbers'}.get(types[0], 'values')
        want = f'expected {len(types)} {noun}' + (
            f' {rng}' if rng.startswith(('<', '>')) else f' in {rng}' if rng else ''
        )
        if not isinstance(value, (tuple, list)) or len(value) != len(types):
            return want
        if any(_number_problem(spec, t, v) for t, v in zip(types, value) if t in (int, float)):
            return want
    return None


def invalid(name: str, value: Any, expected: str, flags: bool = False) -> str:
    """The one-line message of an invalid value: ``"invalid value V for parameter 'name':
    expected ..."`` or, for a command-line tool (``flags``), ``'--name-with-dashes V: expected
    ...'``."""
    if flags:
        return f"--{name.replace('_', '-')} {value!r}: {expected}"
    return f"invalid value {value!r} for parameter '{name}': {expected}"


def check(
    config,
    error=ValueError,
    flags: bool = True,
    prefix: str = '',
    rules: Optional[Callable[[Any], Iterable[Tuple[bool, str, str]]]] = None,
) -> None:
    """Validate dataclass instance ``config`` (call from ``__post_init__``): every spec'd field,
    then the cross-field ``rules(config)``: ``(ok, field name, allowed values in words)`` triples.

    Raises ``error`` with the one line of :func:`invalid` (``flags``: CLI-facing configs;
    ``prefix``: a nested section's key, e.g. ``'potential.'``). Converts ints given for float
    fields to float (YAML / ROS may give 1 for 1.0) and lists given for tuple fields to tuples."""
    cls = type(config)
    for name in specs(cls):
        value = getattr(config, name)
        why = problem(cls, name, value)
        if why:
            raise error(invalid(prefix + name, value, why, flags))
        kind = value_type(cls, name)[0]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(config, name, float(value))
        elif kind is tuple and isinstance(value, (list, tuple)):
            types = element_types(cls, name) or (None,) * len(value)
            object.__setattr__(
                config, name, tuple(float(v) if t is float else v for t, v in zip(types, value))
            )
    for ok, name, expected in rules(config) if rules is not None else ():
        if not ok:
            value = getattr(config, name)
            raise error(invalid(prefix + name, value, 'expected ' + expected, flags))


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


def ros_params_yaml(classes, node: str, header: str) -> str:
    """A ROS 2 parameter file ``{node: {ros__parameters: ...}}`` holding every field of config
    class ``classes`` (or of each class of a sequence, in order) at its default, each under a
    comment with its description and range. ``header``: leading comment lines (without ``#``)."""
    import textwrap

    import yaml

    out = [f'# {line}'.rstrip() for line in header.strip().splitlines()]
    out += [f'{node}:', '  ros__parameters:']
    for cls in classes if isinstance(classes, (list, tuple)) else (classes,):
        for name, (default, spec) in specs(cls).items():
            rng = spec.range_text()
            text = spec.description + (
                f'; range {rng}' if rng and not (spec.choices or spec.fmt) else ''
            )
            out += textwrap.wrap(text, 96, initial_indent='    # ', subsequent_indent='    #   ')
            out.append('    ' + yaml.safe_dump({name: default}, default_flow_style=False).strip())
    return '\n'.join(out) + '\n'
