"""Partial domain adaptation with PWAN (paper Sec. 5). Pure PyTorch, never imports rclpy.

Vocabulary: the *labelled* domain (all classes) is the paper's reference domain alpha, with
mass m_alpha >= 1; the *unlabelled* domain (a subset of the classes) is the paper's source
domain beta, with mass 1.
"""

from .config import AdaptConfig
from .data import FeatureSet, check_pair, load_npz, save_npz
from .errors import AdaptConfigError, AdaptError, AdaptInputError
from .runner import AdaptResult, run_adaptation
from .trainer import AdaptTrainer, UnlabelledPass, StepMetrics

__all__ = [
    'AdaptConfig',
    'AdaptConfigError',
    'AdaptError',
    'AdaptInputError',
    'AdaptResult',
    'AdaptTrainer',
    'UnlabelledPass',
    'FeatureSet',
    'StepMetrics',
    'check_pair',
    'load_npz',
    'run_adaptation',
    'save_npz',
]
