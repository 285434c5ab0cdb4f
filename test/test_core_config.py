"""Configuration validation of the PWAN core."""

import subprocess
import sys

import pytest

from pwan_ros.core import (
    CoherenceConfig,
    FineTuneConfig,
    PotentialConfig,
    PwanInputError,
    RegistrationConfig,
)


def test_defaults_are_valid_and_frozen():
    cfg = RegistrationConfig()
    assert cfg.transform == 'rigid' and cfg.divergence == 'mass'
    assert cfg.effective_mass_ratio == 0.8
    with pytest.raises(Exception):
        cfg.steps = 3  # frozen


@pytest.mark.parametrize(
    'kwargs',
    [
        {'transform': 'similarity'},
        {'divergence': 'kl'},
        {'mass': -1.0},
        {'mass_ratio': 0.0},
        {'mass_ratio': 1.5},
        {'distance_threshold': 0.0},
        {'distance_threshold': float('nan')},
        {'voxel_size': -0.1},
        {'steps': -1},
        {'potential_updates': 0},
        {'max_points': 2},
        {'mass': 10.0, 'mass_ratio': 0.5},
        {'seed': -3},
        {'starts': 0},
        {'lr_transform': 0.0},
    ],
)
def test_invalid_values_raise(kwargs):
    with pytest.raises(PwanInputError):
        RegistrationConfig(**kwargs)


def test_sub_configs_validate():
    with pytest.raises(PwanInputError):
        PotentialConfig(hidden=(0, 4))
    with pytest.raises(PwanInputError):
        PotentialConfig(h_mode='magic')
    with pytest.raises(PwanInputError):
        CoherenceConfig(rho=-1.0)
    with pytest.raises(PwanInputError):
        FineTuneConfig(max_iterations=0)


def test_from_dict_nested_and_unknown_keys():
    cfg = RegistrationConfig.from_dict(
        {
            'transform': 'affine',
            'potential.lr': 1e-3,
            'coherence': {'rho': 1.0},
            'finetune.max_iterations': 5,
        }
    )
    assert cfg.transform == 'affine'
    assert (
        cfg.potential.lr == 1e-3 and cfg.coherence.rho == 1.0 and cfg.finetune.max_iterations == 5
    )
    assert cfg.replace(seed=4).seed == 4
    with pytest.raises(PwanInputError, match='unknown'):
        RegistrationConfig.from_dict({'stepz': 3})
    with pytest.raises(PwanInputError, match='unknown'):
        RegistrationConfig.from_dict({'potential.width': 3})


def test_programs_that_do_not_register_do_not_import_torch():
    """pwan_sim, pwan_evaluate, pwan_replay and a user reading the configuration pay no PyTorch
    import (2 s of CPU a process on a small core); ``pwan_ros.core``'s names still resolve."""
    code = (
        'import sys\n'
        'import pwan_ros.cli.sim, pwan_ros.cli.evaluate, pwan_ros.cli.replay\n'
        'from pwan_ros.core import RegistrationConfig, PwanInputError\n'
        'RegistrationConfig()\n'
        'assert "torch" not in sys.modules, "torch imported"\n'
        'import pwan_ros.core as core\n'
        'from pwan_ros.core.api import register\n'
        'assert core.register is register and "register" in dir(core)\n'
        'assert set(core.__all__) <= set(dir(core))\n'
    )
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
