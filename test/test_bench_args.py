"""The benchmarks' KEY=VALUE overrides (bench/common.key_values: bench_engine --also,
bench_nonrigid --also / --set, bench_lidar --baseline-set) reach the config as the user meant."""

import pathlib
import sys

import pytest

from pwan_ros.core import RegistrationConfig


def _key_values(items):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'bench'))
    from common import key_values

    return key_values(items)


def test_words_yaml_reads_as_booleans_stay_words():
    """compile=off is the choice 'off' (YAML 1.1 would read False and the config refuse it);
    true / false, numbers and lists are still typed."""
    kv = _key_values(['compile=off', 'cuda_graphs=false', 'steps=50', 'finetune.nn=torch'])
    assert kv == {'compile': 'off', 'cuda_graphs': False, 'steps': 50, 'finetune.nn': 'torch'}
    cfg = RegistrationConfig.from_dict({'transform': 'rigid', **kv})
    assert (cfg.compile, cfg.cuda_graphs, cfg.steps) == ('off', False, 50)
    assert cfg.finetune.nn == 'torch'
    assert _key_values(['verbose=True', 'x=[1, 2]', 'y=yes']) == {
        'verbose': True,
        'x': [1, 2],
        'y': 'yes',
    }


def test_item_without_equals_ends_with_one_line():
    with pytest.raises(SystemExit, match="expected KEY=VALUE, got 'steps'"):
        _key_values(['steps'])
