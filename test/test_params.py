"""One source per parameter: every config field carries a description and range, and the ROS
parameters, CLI flags, YAML files and docs tables come from it (or fail here)."""

import argparse
import dataclasses
import importlib
import importlib.util
import math
import pathlib

import pytest
import yaml

from pwan_ros.adaptation.config import AdaptConfig, AdaptConfigError, AdaptIO
from pwan_ros.cli.demo import DemoConfig
from pwan_ros.core import (
    CoherenceConfig,
    FineTuneConfig,
    PotentialConfig,
    PwanInputError,
    RegistrationConfig,
)
from pwan_ros.core.config import GlobalConfig
from pwan_ros.adaptation.deploy import ClassifierConfig
from pwan_ros.evaluation.lidar_sim import SimConfig
from pwan_ros.evaluation.metrics import EvalConfig
from pwan_ros.evaluation.pcd_to_bag import ConvertConfig
from pwan_ros.evaluation.replay import ReplayConfig
from pwan_ros.odometry.config import ConfigError, OdometryConfig
from pwan_ros.params import REQUIRED, ParamSpec, specs, value_type

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = [
    (OdometryConfig, ConfigError),
    (RegistrationConfig, PwanInputError),
    (AdaptConfig, AdaptConfigError),
    (AdaptIO, AdaptConfigError),
    (PotentialConfig, PwanInputError),
    (CoherenceConfig, PwanInputError),
    (FineTuneConfig, PwanInputError),
    (GlobalConfig, PwanInputError),
    (ClassifierConfig, AdaptConfigError),
    (SimConfig, ValueError),
    (ReplayConfig, ValueError),
    (ConvertConfig, ValueError),
    (EvalConfig, ValueError),
    (DemoConfig, ValueError),
]
#: the command-line tools whose flags are generated from a config (module, config)
CLI_CONFIGS = [
    ('sim', SimConfig),
    ('replay', ReplayConfig),
    ('pcd2bag', ConvertConfig),
    ('evaluate', EvalConfig),
    ('demo', DemoConfig),
]


def _make(cls, **values):
    """``cls(**values)`` with its required fields filled in and its paired bounds kept apart."""
    base = {name: 'x' for name, (default, _) in specs(cls).items() if default is REQUIRED}
    if cls is SimConfig:  # fov_down_deg < fov_up_deg
        base.update(
            {'fov_down_deg': -90.0}
            if 'fov_up_deg' in values
            else {'fov_up_deg': 90.0}
            if 'fov_down_deg' in values
            else {}
        )
    return cls(**{**base, **values})


def _gen_params():
    spec = importlib.util.spec_from_file_location('gen_params', ROOT / 'tools' / 'gen_params.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize('cls', [c for c, _ in CONFIGS], ids=lambda c: c.__name__)
def test_every_field_has_a_description_and_a_range(cls):
    nested = {'potential', 'coherence', 'finetune', 'global_search'}
    for f in dataclasses.fields(cls):
        if f.name in nested:
            continue
        assert isinstance(f.metadata.get('spec'), ParamSpec), (
            f'{cls.__name__}.{f.name} has no spec'
        )
        spec = f.metadata['spec']
        assert len(spec.description) > 10, f'{cls.__name__}.{f.name}: description too short'
        kind, _ = value_type(cls, f.name)
        if kind in (int, float):
            assert spec.low is not None, (
                f'{cls.__name__}.{f.name}: numeric field without a lower bound'
            )


@pytest.mark.parametrize('cls,error', CONFIGS, ids=lambda c: getattr(c, '__name__', ''))
def test_validation_agrees_with_the_spec_range(cls, error):
    """The bounds in the descriptions (and ROS descriptors) are the bounds the config enforces."""
    for name, (default, spec) in specs(cls).items():
        kind, _ = value_type(cls, name)
        if kind not in (int, float) or spec.low is None:
            continue
        step = 1 if kind is int else max(abs(spec.low) * 1e-6, 1e-9)
        with pytest.raises(error):
            _make(cls, **{name: kind(spec.low - step) if not spec.low_open else kind(spec.low)})
        ok = spec.low + (step if spec.low_open else 0)
        if cls is AdaptConfig and name in ('anneal', 'm0') and ok > 0:  # 0 (auto) or >= 1
            ok = 1.0
        _make(cls, **{name: kind(ok)})
        if spec.high is not None:
            over = spec.high + (1 if kind is int else max(abs(spec.high) * 1e-6, 1e-9))
            with pytest.raises(error):
                _make(cls, **{name: kind(over)})
            if spec.high_open:
                with pytest.raises(error):
                    _make(cls, **{name: kind(spec.high)})
            else:
                _make(cls, **{name: kind(spec.high)})
    for name, (default, spec) in specs(cls).items():
        if spec.choices:
            with pytest.raises(error):
                _make(cls, **{name: 'no-such-' + name})


def test_generated_yaml_and_docs_are_current():
    stale = [
        rel for rel, text in _gen_params().expected().items() if (ROOT / rel).read_text() != text
    ]
    assert stale == [], (
        f'stale generated files (run .venv/bin/python tools/gen_params.py): {stale}'
    )


def test_odometry_yaml_holds_exactly_the_node_parameters_at_their_defaults():
    params = yaml.safe_load((ROOT / 'config' / 'odometry.yaml').read_text())['pwan_odometry'][
        'ros__parameters'
    ]
    assert list(params) == list(specs(OdometryConfig))
    assert OdometryConfig.from_dict(params) == OdometryConfig()


def test_adapt_yaml_holds_exactly_the_node_parameters_at_their_defaults():
    params = yaml.safe_load((ROOT / 'config' / 'adapt.yaml').read_text())['adapt_node'][
        'ros__parameters'
    ]
    assert list(params) == list(specs(AdaptIO)) + list(specs(AdaptConfig))
    assert AdaptConfig.from_mapping({k: params[k] for k in specs(AdaptConfig)}) == AdaptConfig()
    assert AdaptIO(**{k: params[k] for k in specs(AdaptIO)}) == AdaptIO()


@pytest.mark.parametrize(
    'cls,error,name,value,words',
    [
        (RegistrationConfig, PwanInputError, 'max_points', 2, 'an integer >= 3'),
        (RegistrationConfig, PwanInputError, 'device', 'tpu', 'auto | cpu | cuda | cuda:N'),
        (PotentialConfig, PwanInputError, 'hidden', (0, 4), '2 integers >= 1'),
        (PotentialConfig, PwanInputError, 'betas', (0.5, 1.0), '2 numbers in [0, 1)'),
        (OdometryConfig, ConfigError, 'device', 'gpu', 'auto | cpu | cuda | cuda:N'),
        (OdometryConfig, ConfigError, 'odom_frame', '/odom', 'no leading slash'),
        (AdaptConfig, AdaptConfigError, 'steps', 0, 'an integer in [1, 10000000]'),
        (AdaptConfig, AdaptConfigError, 'device', 'gpu7', 'auto | cpu | cuda | cuda:N'),
        (AdaptConfig, AdaptConfigError, 'm0', 0.5, '0 (estimate) or a number >= 1'),
        (ClassifierConfig, AdaptConfigError, 'device', 'cuda:x', 'auto | cpu | cuda | cuda:N'),
    ],
)
def test_an_invalid_value_is_one_line_naming_parameter_value_and_range(
    cls, error, name, value, words
):
    prefix = 'potential.' if cls is PotentialConfig else ''
    with pytest.raises(error) as info:
        _make(cls, **{name: value})
    text = str(info.value)
    assert text.startswith(f"invalid value {value!r} for parameter '{prefix}{name}': expected")
    assert words in text and '\n' not in text, text


def test_cross_field_rules_name_the_parameter():
    with pytest.raises(PwanInputError, match=r"^invalid value 1\.0 for parameter 'mass': "):
        RegistrationConfig(mass=1.0, mass_ratio=0.5)
    with pytest.raises(ConfigError, match=r"parameter 'max_range': expected 0 \(off\) or"):
        OdometryConfig(min_range=5.0, max_range=2.0)
    with pytest.raises(ConfigError, match=r"parameter 'transform': expected 'rigid' unless"):
        OdometryConfig(transform='affine')
    assert PotentialConfig(hidden=[8, 8], betas=[0, 0.5]) == PotentialConfig(
        hidden=(8, 8), betas=(0.0, 0.5)
    )


def _flags(parser: argparse.ArgumentParser):
    return {
        a.dest: a
        for a in parser._actions
        if a.option_strings and a.dest not in ('help', 'help_all')
    }


def _help_text(parser: argparse.ArgumentParser, action) -> str:
    """An option's help as ``--help-all`` shows it (``--help`` may leave it out)."""
    full = [a for a in parser._actions if '--help-all' in a.option_strings]
    return full[0].hidden.get(action, action.help) if full else action.help


def test_pwan_register_flags_are_the_core_fields_with_library_defaults():
    from pwan_ros.cli.register import _NO_FLAG, _config, _parser

    from pwan_ros.core.config import _SECTIONS

    parser = _parser()
    flags = _flags(parser)
    table = dict(specs(RegistrationConfig))
    for section, cls in _SECTIONS.items():  # --finetune.max-iterations etc.: from_dict's keys
        table.update({f'{section}.{k}': v for k, v in specs(cls).items()})
    for dest, action in flags.items():
        if dest in (
            'output',
            'json',
            'quiet',
            'global_init',
            'init',
            'viewpoints',
        ):  # register(init=, viewpoints=)
            continue
        assert dest in table, f'--{dest} is not a RegistrationConfig field'
        assert table[dest][1].description.replace('%', '%%') in _help_text(parser, action)
        assert '--' + dest.replace('_', '-') in action.option_strings
        assert action.default is None  # unset flags keep the library default
    assert set(table) - set(flags) == set(_NO_FLAG)
    assert _config(parser.parse_args(['a', 'b', '-q'])) == RegistrationConfig()


def test_pwan_adapt_flags_are_the_adapt_fields():
    from pwan_ros.cli.adapt import build_parser

    parser = build_parser()
    flags = _flags(parser)
    for name, (default, spec) in specs(AdaptConfig).items():
        assert name in flags, f'AdaptConfig.{name} has no pwan_adapt flag'
        help_text = _help_text(parser, flags[name]) or ''
        assert spec.description.replace('%', '%%') in help_text, name


@pytest.mark.parametrize('module,cls', CLI_CONFIGS, ids=[m for m, _ in CLI_CONFIGS])
def test_tool_flags_are_the_config_fields_with_their_descriptions(module, cls):
    """pwan_sim / pwan_replay / pwan_pcd2bag / pwan_evaluate / pwan_demo: one flag per field,
    its help led by the field's description, its default the config's default."""
    parser = importlib.import_module(f'pwan_ros.cli.{module}').build_parser()
    flags = _flags(parser)
    for name, (default, spec) in specs(cls).items():
        assert name in flags, f'{cls.__name__}.{name} has no --{name.replace("_", "-")} flag'
        action = flags[name]
        help_text = _help_text(parser, action) or ''
        assert help_text.startswith(spec.description.replace('%', '%%')), name
        if default is REQUIRED:
            assert action.required, name
        else:
            assert action.default == default, name


@pytest.mark.parametrize('old', ['voxel_size', 'max_points', 'steps'])
def test_names_of_no_release_are_refused(old):
    """voxel_size / max_points / steps (now scan_voxel_size, scan_max_points, pwan_steps) are
    unknown parameters: one line naming them."""
    with pytest.raises(ConfigError, match=rf'^unknown parameter\(s\): {old}$'):
        OdometryConfig.from_dict({old: 1})


@pytest.mark.parametrize(
    'module,argv,flag',
    [
        ('register', ['a', 'b', '--distance', '0.1'], '--distance'),
        ('register', ['a', 'b', '--voxel', '0.1'], '--voxel'),
        ('adapt', ['--batch_size', '8'], '--batch_size'),
        ('adapt', ['--potential_lr', '0.1'], '--potential_lr'),
    ],
)
def test_old_flags_are_refused(module, argv, flag, capsys):
    mod = importlib.import_module(f'pwan_ros.cli.{module}')
    parser = mod._parser() if module == 'register' else mod.build_parser()
    with pytest.raises(SystemExit) as info:
        parser.parse_args(argv)
    assert info.value.code == 2
    assert f'unrecognized arguments: {flag}' in capsys.readouterr().err


def test_old_executables_and_aliases_are_gone():
    setup = (ROOT / 'setup.py').read_text()
    for old in ('register_node', 'pwan-register', 'pwan-adapt', 'pwan-demo', "'adapt_node'"):
        assert old not in setup, old
    import pwan_ros.odometry.pipeline as pipeline

    assert not hasattr(pipeline, 'ScanPipeline')


def test_shared_names_mean_the_same_in_odometry_and_core():
    """A name in both OdometryConfig and RegistrationConfig is passed through unchanged to the core
    (no name with two meanings: the node's own preprocessing is scan_*, the core's under
    pwan_*)."""
    from pwan_ros.odometry.pwan_recovery import core_config

    shared = set(specs(OdometryConfig)) & set(specs(RegistrationConfig))
    assert shared == {
        'transform',
        'divergence',
        'mass_ratio',
        'distance_threshold',
        'potential_updates',
        'device',
        'seed',
        'compile',
    }
    odo = OdometryConfig(
        divergence='distance',
        mass_ratio=0.6,
        potential_updates=7,
        device='cpu',
        seed=3,
        pwan_steps=123,
        pwan_max_points=321,
        compile='on',
    )
    core = core_config(odo, h=0.4)
    for name in shared - {'distance_threshold'}:
        assert getattr(core, name) == getattr(odo, name), name
    assert (core.steps, core.max_points, core.distance_threshold) == (123, 321, 0.4)


@pytest.mark.ros
def test_ros_parameters_carry_the_spec_descriptions_and_ranges(ros_env, monkeypatch):
    """The running nodes' parameter descriptors are the specs (no parameter without one)."""
    import rclpy
    from pwan_ros.ros.adapt_node import AdaptNode
    from pwan_ros.ros.odometry_node import OdometryNode

    for key in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE'):
        monkeypatch.setenv(key, ros_env[key])
    rclpy.init()
    try:
        for node, table in (
            (OdometryNode(), specs(OdometryConfig)),
            (AdaptNode(), {**specs(AdaptConfig), **specs(AdaptIO)}),
        ):
            declared = set(node._parameters) - {'use_sim_time', 'start_type_description_service'}
            assert declared == set(table)
            for name in declared:
                default, spec = table[name]
                d = node.describe_parameter(name)
                assert spec.description in d.description, name
                rng = list(d.integer_range) + list(d.floating_point_range)
                if spec.low is not None and spec.high is not None:
                    assert (
                        len(rng) == 1
                        and math.isclose(rng[0].from_value, spec.low)
                        and math.isclose(rng[0].to_value, spec.high)
                    ), name
            node.destroy_node()
    finally:
        rclpy.try_shutdown()
