"""ROS parameters from a config dataclass's field specs (:mod:`pwan_ros.params`): one declaration
per field, with the spec's description, range and choices in its ``ParameterDescriptor`` (shown by
``ros2 param describe``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType
from rclpy.node import Node
from rclpy.parameter import Parameter

from pwan_ros.params import FieldSpec, specs

_TYPES = {
    bool: ParameterType.PARAMETER_BOOL,
    int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE,
    str: ParameterType.PARAMETER_STRING,
}
_UNSET = {
    bool: Parameter.Type.BOOL,
    int: Parameter.Type.INTEGER,
    float: Parameter.Type.DOUBLE,
    str: Parameter.Type.STRING,
}


#: YAML reads these words as booleans, so ``-p NAME:=off`` arrives as False: a string parameter
#: whose choices include them also accepts the boolean and maps it back to the word
_YAML_WORDS = {True: ('on', 'yes', 'true'), False: ('off', 'no', 'false')}


def _yaml_word(spec: FieldSpec, value: bool):
    """The choice of ``spec`` that YAML turned into the boolean ``value`` (None if none)."""
    return next((c for c in (spec.choices or ()) if c in _YAML_WORDS[value]), None)


def descriptor(
    name: str, default: Any, spec: FieldSpec, read_only: bool = False
) -> ParameterDescriptor:
    """The descriptor of parameter ``name``: type from ``default``, description (with the choices)
    and range from ``spec``. A string with on/off-like choices is dynamically typed (see
    ``_YAML_WORDS``)."""
    d = ParameterDescriptor(name=name, read_only=read_only, type=_TYPES[type(default)])
    if isinstance(default, str) and (_yaml_word(spec, True) or _yaml_word(spec, False)):
        d.dynamic_typing = True
    d.description = spec.description + (
        f" (one of: {', '.join(spec.choices)})" if spec.choices else ''
    )
    if spec.low is not None and spec.high is not None:
        if isinstance(default, int) and not isinstance(default, bool):
            d.integer_range = [
                IntegerRange(from_value=int(spec.low), to_value=int(spec.high), step=0)
            ]
        elif isinstance(default, float):
            d.floating_point_range = [
                FloatingPointRange(from_value=float(spec.low), to_value=float(spec.high), step=0.0)
            ]
    return d


def declare_config(
    node: Node, cls, read_only: bool = False, renamed: Mapping[str, str] = None
) -> Tuple[Dict[str, Any], List[str]]:
    """Declare one ROS parameter per spec'd field of ``cls``; returns ``({name: value}, notes)``.

    ``renamed`` (old name -> new name): the old names are declared too, typed but without a value,
    so that a parameter file or ``-p`` still using one is honoured: its value becomes the new
    parameter's value, over any value the new name has (the shipped YAML lists every new name, so
    an old name on top of it was set on purpose). ``notes``: one line per old name used, for the
    log. Type and range errors raise rclpy's InvalidParameterTypeException /
    InvalidParameterValueException."""
    table = specs(cls)
    inherited: Dict[str, Any] = {}
    notes: List[str] = []
    for old, new in (renamed or {}).items():
        default, spec = table[new]
        d = descriptor(
            old,
            default,
            FieldSpec(
                f"deprecated, renamed '{new}': {spec.description}",
                spec.low,
                spec.high,
                spec.choices,
                spec.low_open,
            ),
            read_only,
        )
        node.declare_parameter(old, _UNSET[type(default)], d)
        given = node.get_parameter_or(old, None)
        if given is not None and given.type_ != Parameter.Type.NOT_SET:
            inherited[new] = given.value
            notes.append(
                f"parameter '{old}' was renamed '{new}' (the old name stops working in the next "
                f"release); using {new}={given.value!r}"
            )
    values: Dict[str, Any] = {}
    for name, (default, spec) in table.items():
        start = inherited.get(name, default)
        value = node.declare_parameter(
            name,
            start,
            descriptor(name, default, spec, read_only),
            ignore_override=name in inherited,
        ).value
        if isinstance(default, str) and isinstance(value, bool) and _yaml_word(spec, value):
            value = _yaml_word(spec, value)  # -p deskew:=off arrives as False
        values[name] = value
    return values, notes
