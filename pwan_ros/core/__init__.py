"""PWAN registration core: pure Python / numpy / PyTorch, no ROS imports.

Public API::

    register(source, reference, config=None, init=None, potential_state=None) -> RegistrationResult
    refine(source, reference, init=None, config=None) -> RegistrationResult
    estimate_discrepancy(reference, source, divergence, mass=..., distance_threshold=...,
        settings=EstimatorSettings(...)) -> DiscrepancyEstimate
    exact_mass_discrepancy / exact_distance_discrepancy / exact_w1 (POT linear programs)

The floor plan, one layer per folder, each importing only those below it::

    api.py            register() / refine(): the stages, in order
    decide.py         mass at the overlap, the global search's confirmation, a deformation judged
    global_search/    unknown pose: hypotheses, chosen by the partial objective, refused or not
    local/            the fit from an init: Alg. 1 (one start / tournament) + fine-tune, assembly
    checks/           the self-check of a pose, the rival step, the mass a pose shows, free space
    finetune/         the fine-tune family: objective, stage, soft (CPD) stage, GICP polish
    pwan/             the paper's maths: potential, gradients, Alg. 1, transforms, KR, exact LP
    config.py, problem.py, result.py, preprocess.py, nearest.py, reference_cache.py, device.py,
    errors.py         what every layer shares
"""

import importlib

#: each public name -> the module that defines it, imported on first use (PEP 562): a program
#: that only reads the configuration (pwan_sim, a script) does not pay PyTorch's import (2 s of
#: CPU on a small core)
_WHERE = {
    'CoherenceConfig': '.config',
    'FineTuneConfig': '.config',
    'PotentialConfig': '.config',
    'RegistrationConfig': '.config',
    'PwanInputError': '.errors',
    'DiscrepancyEstimate': '.pwan.discrepancy',
    'EstimatorSettings': '.pwan.discrepancy',
    'estimate_discrepancy': '.pwan.discrepancy',
    'ExactDiscrepancy': '.pwan.exact',
    'exact_distance_discrepancy': '.pwan.exact',
    'exact_mass_discrepancy': '.pwan.exact',
    'exact_w1': '.pwan.exact',
    'RegistrationResult': '.result',
    'refine': '.api',
    'register': '.api',
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    'CoherenceConfig',
    'DiscrepancyEstimate',
    'EstimatorSettings',
    'ExactDiscrepancy',
    'FineTuneConfig',
    'PotentialConfig',
    'PwanInputError',
    'RegistrationConfig',
    'RegistrationResult',
    'estimate_discrepancy',
    'exact_distance_discrepancy',
    'exact_mass_discrepancy',
    'exact_w1',
    'refine',
    'register',
]
