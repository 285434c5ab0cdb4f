"""ROS parameters from a config dataclass's field specs (:mod:`pwan_ros.params`): one declaration
per field, with the spec's description, range and choices in its ``ParameterDescriptor`` (shown by
``ros2 param describe``)."""

from __future__ import annotations

from typing import Any, Dict, List

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType
from rclpy.exceptions import InvalidParameterTypeException
from rclpy.node import Node
from rclpy.parameter import Parameter

from pwan_ros.params import ParamSpec, specs

_TYPES = {
    bool: ParameterType.PARAMETER_BOOL,
    int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE,
    str: ParameterType.PARAMETER_STRING,
}


#: YAML reads these words as booleans, so ``-p NAME:=off`` arrives as False: a string parameter
#: whose choices include them also accepts the boolean and maps it back to the word
_YAML_WORDS = {True: ('on', 'yes', 'true'), False: ('off', 'no', 'false')}


def _yaml_word(spec: ParamSpec, value: bool):
    """The choice of ``spec`` that YAML turned into the boolean ``value`` (None if none)."""
    return next((c for c in (spec.choices or ()) if c in _YAML_WORDS[value]), None)


def descriptor(
    name: str, default: Any, spec: ParamSpec, read_only: bool = False
) -> ParameterDescriptor:
    """The descriptor of parameter ``name``: type from ``default``, description (with the choices)
    and range from ``spec``. A string with on/off-like choices is dynamically typed (see
    ``_YAML_WORDS``)."""
    d = ParameterDescriptor(name=name, read_only=read_only, type=_TYPES[type(default)])
    if isinstance(default, str) and (_yaml_word(spec, True) or _yaml_word(spec, False)):
        d.dynamic_typing = True
    if isinstance(default, float):  # -p scan_voxel_size:=1 arrives as an integer
        d.dynamic_typing = True
    d.description = spec.description + (
        f" (one of: {', '.join(spec.choices)})"
        if spec.choices
        else f' ({spec.range_text()})'
        if spec.fmt
        else ''
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


#: parameters every node has or may be given besides its own (rclpy, rcl)
_ROS_PARAMETERS = ('use_sim_time', 'start_type_description_service')


def undeclared(node: Node) -> List[str]:
    """Names given to ``node`` (a parameter file, ``-p``) that it did not declare: a misspelt or
    unknown parameter, which rclpy would otherwise ignore without a word. ``qos_overrides.*``
    are rclpy's own."""
    given = getattr(node, '_parameter_overrides', {})  # rclpy has no public accessor
    return sorted(
        name
        for name in given
        if not node.has_parameter(name)
        and name not in _ROS_PARAMETERS
        and not name.startswith('qos_overrides.')
    )


def _double(node: Node, name: str, value: Any) -> float:
    """A double parameter's value: an integer is taken as the double it names (``-p
    scan_voxel_size:=1``); any other type raises InvalidParameterTypeException, as a statically
    typed parameter would."""
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise InvalidParameterTypeException(node.get_parameter(name), Parameter.Type.DOUBLE)


def declare_config(node: Node, cls, read_only: bool = False) -> Dict[str, Any]:
    """Declare one ROS parameter per spec'd field of ``cls``; returns ``{name: value}``.

    Type and range errors raise rclpy's InvalidParameterTypeException /
    InvalidParameterValueException."""
    values: Dict[str, Any] = {}
    for name, (default, spec) in specs(cls).items():
        value = node.declare_parameter(
            name, default, descriptor(name, default, spec, read_only)
        ).value
        if isinstance(default, str) and isinstance(value, bool) and _yaml_word(spec, value):
            value = _yaml_word(spec, value)  # -p deskew:=off arrives as False
        if isinstance(default, float):
            value = _double(node, name, value)
        values[name] = value
    return values
