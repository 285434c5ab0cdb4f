"""PWAN registration core: pure Python / numpy / PyTorch, no ROS imports.

Public API::

    register(source, reference, config=None, init=None, potential_state=None) -> RegistrationResult
    refine(source, reference, init=None, config=None) -> RegistrationResult
    estimate_discrepancy(reference, source, divergence, mass=..., distance_threshold=...)
        -> DiscrepancyEstimate
    exact_mass_discrepancy / exact_distance_discrepancy / exact_w1 (POT linear programs)
"""

from .config import CoherenceConfig, FineTuneConfig, PotentialConfig, RegistrationConfig
from .discrepancy import DiscrepancyEstimate, estimate_discrepancy
from .errors import PwanInputError
from .exact import ExactDiscrepancy, exact_distance_discrepancy, exact_mass_discrepancy, exact_w1
from .result import RegistrationResult
from .api import refine, register

__all__ = [
    'CoherenceConfig',
    'DiscrepancyEstimate',
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
