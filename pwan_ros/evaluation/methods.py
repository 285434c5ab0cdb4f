"""What an offline evaluation runs: its options, the methods (estimator + parameter variant) and
the pwan odometry's parameters (the node's parameters file, variants of it)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from pwan_ros.params import check, param

__all__ = ['Method', 'OfflineConfig', 'methods', 'odometry_config', 'parse_variant', 'read_params']

BUILT_IN = ('pwan', 'kiss_icp', 'icp')
#: the node names whose parameters a ROS 2 parameter file may give the odometry (later wins)
NODE_KEYS = ('/**', 'pwan_odometry', '/pwan_odometry')


@dataclass(frozen=True)
class OfflineConfig:
    """``pwan_evaluate --offline`` options (CLI flags: same names with dashes)."""

    estimator: tuple = param(
        ('pwan',),
        "estimators side by side (comma-separated): pwan (the node's odometry pipeline), "
        'kiss_icp, icp or module:factory',
    )
    params: str = param('', "the node's parameters file for pwan; '' = its defaults")
    workers: int = param(
        0, 'local Ray worker processes; 0 = all cores, 1 = one after another in process', 0, 4096
    )
    address: str = param(
        '', "a Ray cluster's address (auto, or ray://HOST:10001 with ray[client]); '' = local"
    )
    resume: bool = param(False, 'keep the runs whose complete results exist')
    rate_hz: float = param(
        10.0,
        'scan rate of a --scans folder whose pose file has no stamps (Hz)',
        0.0,
        1000.0,
        low_open=True,
    )

    def __post_init__(self):
        object.__setattr__(self, 'estimator', tuple(e.strip() for e in self.estimator))
        check(self, rules=OfflineConfig._rules)

    def _rules(self):
        names = self.estimator
        yield len(names) > 0, 'estimator', 'one or more'
        yield len(set(names)) == len(names), 'estimator', 'each once'
        for spec in names:
            ok = spec in BUILT_IN or re.fullmatch(r'[\w.]+:\w+', spec) is not None
            yield ok, 'estimator', "pwan, kiss_icp, icp or 'package.module:factory'"


@dataclass(frozen=True)
class Method:
    """estimator: 'pwan', 'kiss_icp', 'icp' or 'module:factory'; variant: ((name, value), ...)
    parameters of the pwan odometry changed from the parameters file."""

    estimator: str
    variant: tuple = ()

    @property
    def label(self) -> str:
        if not self.variant:
            return self.estimator
        return f'{self.estimator}[{",".join(f"{k}={v}" for k, v in self.variant)}]'

    @property
    def folder(self) -> str:
        """The label as a folder name (a value may hold '/': a path)."""
        return re.sub(r'[^\w.,=+\[\]-]', '_', self.label)


def methods(estimators: tuple, variants: list) -> list:
    """The methods: each estimator, and a pwan run per variant beside the plain one."""
    if variants and 'pwan' not in estimators:
        raise ValueError('--variant changes the pwan odometry: add pwan to --estimator')
    out = [Method(e) for e in estimators]
    out += [Method('pwan', v) for v in variants]
    labels = [m.label for m in out]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f'--variant {twice[0]} given twice (or as the defaults)')
    return out


def read_params(path) -> dict:
    """The pwan odometry's parameters from a YAML file: a ROS 2 parameter file (``node:
    {ros__parameters: {...}}``, as config/odometry.yaml; with several nodes, those of ``/**``
    and ``pwan_odometry``) or a flat mapping. ``use_sim_time`` is the node's and is dropped."""
    try:
        with open(path, encoding='utf-8') as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ValueError(f'--params {path}: cannot read ({exc.strerror})') from None
    except yaml.YAMLError:
        raise ValueError(f'--params {path}: not valid YAML') from None
    if not isinstance(data, dict):
        raise ValueError(f'--params {path}: expected a mapping of parameter names to values')
    nodes = {k: v for k, v in data.items() if isinstance(v, dict) and 'ros__parameters' in v}
    if nodes:
        if len(nodes) == 1:
            (only,) = nodes.values()
            data = only['ros__parameters'] or {}
        else:
            found = [nodes[k]['ros__parameters'] or {} for k in NODE_KEYS if k in nodes]
            if not found:
                raise ValueError(
                    f'--params {path}: no parameters of pwan_odometry (or /**) among '
                    f'{", ".join(nodes)}'
                )
            data = {k: v for part in found for k, v in part.items()}
    return {k: v for k, v in data.items() if k != 'use_sim_time'}


def parse_variant(text: str) -> tuple:
    """'name=value[,name=value]' -> ((name, value), ...), each value read as its parameter's
    type (a text parameter keeps its text: deskew=on is 'on')."""
    from pwan_ros.odometry.config import OdometryConfig
    from pwan_ros.params import value_type

    pairs = []
    for item in text.split(','):
        name, sep, value = (t.strip() for t in item.partition('='))
        if not sep or not name:
            raise ValueError(f'--variant {text!r}: expected name=value[,name=value]')
        if name not in OdometryConfig.specs():
            raise ValueError(f'--variant {text!r}: unknown parameter {name!r}')
        kind = value_type(OdometryConfig, name)[0]
        pairs.append((name, _typed(value, kind, text)))
    return tuple(pairs)


def _typed(value: str, kind: type, text: str):
    if kind is str:
        return value
    try:
        if kind is bool:
            parsed = yaml.safe_load(value)
            if not isinstance(parsed, bool):
                raise ValueError(value)
            return parsed
        if kind is tuple:
            return tuple(yaml.safe_load(value))
        return kind(value)
    except (ValueError, TypeError, yaml.YAMLError):
        raise ValueError(f'--variant {text!r}: {value!r} is not a {kind.__name__}') from None


def odometry_config(params: dict, variant: tuple = ()):
    """The OdometryConfig of ``params`` with ``variant`` applied (ConfigError names a bad one)."""
    from pwan_ros.odometry.config import OdometryConfig

    return OdometryConfig.from_dict({**params, **dict(variant)})
