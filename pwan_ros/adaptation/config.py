"""Typed configuration of the adaptation trainer and its run's inputs and outputs.

Field names are also the CLI flags (``--batch-size`` <-> ``batch_size``), the ROS parameter
names of ``adapt_node`` and the YAML keys of ``config/adapt.yaml`` (generated from the specs by
``tools/gen_params.py``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

import yaml

from pwan_ros.params import ParamSpec, check, param, specs

from .errors import AdaptConfigError

METHODS = ('pwan', 'source_only', 'wgan')
INPUT_NORMS = ('standard', 'zscore', 'l2', 'l2_standard', 'l2_zscore', 'none')


@dataclass(frozen=True)
class AdaptConfig:
    """Hyper-parameters of :class:`pwan_ros.adaptation.trainer.AdaptTrainer` (paper Sec. 5).

    Vocabulary: the *labelled* domain is the paper's reference domain (all classes, mass
    m_alpha >= 1); the *unlabelled* domain is the paper's source domain (a subset of classes).
    """

    method: str = param(
        'pwan',
        'pwan (partial alignment), source_only (lambda1=lambda2=0) or '
        'wgan (complete alignment: m_alpha=1, unconstrained potential)',
        choices=METHODS,
    )
    steps: int = param(1000, 'number of training steps T', 1, 10_000_000)
    batch_size: int = param(
        64, 'mini-batch size on each domain (labelled side stratified by class)', 2, 65536
    )
    bottleneck_dim: int = param(
        256, 'width of the bottleneck T_theta (features -> bottleneck_dim)', 2, 65536
    )
    potential_hidden: int = param(
        256, 'hidden width of the potential network f_w (2 hidden layers)', 2, 65536
    )
    dropout: float = param(0.0, 'dropout on the bottleneck output during training', 0.0, 0.95)
    input_norm: str = param(
        'zscore',
        'input standardisation, fitted on the labelled rows and saved in model.ts: '
        'zscore (per column (x - mean) / std; columns constant on the labelled rows are ignored), '
        'standard (x - mean over one common scale: unchanged by rotations, scalings, shifts), '
        'l2 (per row), l2_zscore / l2_standard (l2 first) or none',
        choices=INPUT_NORMS,
    )
    lr: float = param(
        1e-3,
        'base learning rate of Adam for theta, nu; schedule lr*(1+10p)^-0.75, p=step/steps',
        1e-8,
        10.0,
    )
    lr_l1_reference: float = param(
        817.0,
        'the first bottleneck layer learns at lr * min(1, lr_l1_reference / L), L = mean L1 norm '
        'of the standardised labelled rows: one Adam step moves its outputs by up to lr * L, so '
        'wider or unnormalised features would take larger steps; 817 = a row of 1024 '
        'unit-variance Gaussian columns (the widths the defaults were set on); 0 = off',
        0.0,
        1e12,
    )
    potential_lr: float = param(
        1e-3, 'learning rate of RMSprop for the potential network w', 1e-8, 10.0
    )
    weight_decay: float = param(5e-4, 'L2 weight decay of Adam for theta, nu', 0.0, 1.0)
    lambda1: float = param(1.0, 'weight of the partial W1 alignment term', 0.0, 1e6)
    lambda2: float = param(0.1, 'weight of the entropy of unlabelled predictions', 0.0, 1e6)
    gp_weight: float = param(10.0, 'weight of the one-sided gradient penalty on f_w', 0.0, 1e6)
    potential_updates: int = param(5, 'potential-network updates u per training step', 1, 1000)
    m0: float = param(
        0.0,
        'initial m_alpha (>= 1); 0 = estimate |classes| / |estimated present classes|',
        0.0,
        1e6,
    )
    anneal: float = param(
        0.0,
        'annealing factor s >= 1 (per step) of m_alpha = m0 * s^step; 0 = 10^(1/steps), '
        'i.e. m_alpha reaches 10 m0 at the last step',
        0.0,
        2.0,
    )
    max_m_alpha: float = param(1e4, 'upper bound of m_alpha', 1.0, 1e12)
    warmup_steps: int = param(
        200, 'source-only warm-up steps before alignment, mu and m0 estimation', 0, 10_000_000
    )
    weight_interval: int = param(
        500, 'steps between re-estimations of the class weights mu', 1, 10_000_000
    )
    reweight: bool = param(True, 'reweight labelled cross-entropy by mu (pwan only)')
    soft_weights: bool = param(
        True, 'estimate mu from mean softmax probabilities (true) or hard predictions'
    )
    safeguard: bool = param(
        True,
        'train a source-only model alongside (same architecture; and a logistic regression '
        'after it, chosen when the held-out labelled rows show it better) and deploy it instead '
        'of the adapted one when the adapted model is not predicted to be better (no unlabelled '
        'labels used; see docs/adaptation.md)',
    )
    holdout_fraction: float = param(
        0.1,
        'fraction of each class of labelled rows held out from training to '
        'validate the models (safeguard only)',
        0.0,
        0.5,
    )
    safeguard_margin: float = param(
        0.02,
        'safeguard: tolerated loss of held-out accuracy and gain of '
        'estimated-outlier-class mass of the adapted model over source-only',
        0.0,
        1.0,
    )
    min_agreement: float = param(
        0.8,
        'safeguard: least fraction of unlabelled rows on which the adapted and '
        'source-only models must agree',
        0.0,
        1.0,
    )
    check_alpha: float = param(
        0.05,
        'check rows (the check file): significance of the one-sided exact sign test on the rows '
        'the two candidates disagree on; the adapted candidate is deployed when it is shown '
        'better at this level, source-only when shown worse, otherwise the label-free decision '
        'stands; also the level at which the held-out labelled rows must show the linear '
        'source-only model better to choose it (safeguard)',
        1e-9,
        0.5,
    )
    eval_interval: int = param(
        250,
        'steps between full passes over the unlabelled set (metrics, best checkpoint)',
        1,
        10_000_000,
    )
    checkpoint_interval: int = param(500, 'steps between latest-checkpoint writes', 1, 10_000_000)
    memory_limit_mb: float = param(
        1024.0,
        'feature arrays larger than this are memory-mapped and streamed, not loaded',
        1.0,
        1e9,
    )
    eval_batch: int = param(
        4096, 'rows per batch when streaming a whole domain through the network', 1, 10_000_000
    )
    seed: int = param(0, 'random seed (initialisation, sampling, dropout)', 0, 2**31 - 1)
    device: str = param('auto', 'compute device; auto = CUDA when available', fmt='device')
    threads: int = param(
        0, 'CPU threads for torch during the run (0 = leave torch\'s default)', 0, 1024
    )
    plots: bool = param(True, 'write PNG plots (losses, m_alpha, class weights, 2-D projection)')

    def __post_init__(self):
        check(self, AdaptConfigError, flags=False, rules=AdaptConfig._rules)

    def _rules(self):
        """The cross-field rules (:func:`pwan_ros.params.check`): ``(ok, field, allowed)``."""
        yield not 0.0 < self.anneal < 1.0, 'anneal', '0 (automatic) or a number >= 1'
        yield not 0.0 < self.m0 < 1.0, 'm0', '0 (estimate) or a number >= 1'

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], base: Optional['AdaptConfig'] = None
    ) -> 'AdaptConfig':
        """Config from a dict (YAML keys / ROS parameters); unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise AdaptConfigError(f"unknown parameter(s): {', '.join(unknown)}")
        base = base if base is not None else cls()
        return dataclasses.replace(base, **dict(values))

    @classmethod
    def from_yaml(cls, path, base: Optional['AdaptConfig'] = None) -> 'AdaptConfig':
        """Config from a YAML file: either flat keys or a ROS params file
        (``<node>: {ros__parameters: {...}}``); keys that are not config fields (I/O paths
        such as ``labelled``, :class:`AdaptIO`) are ignored here (see :func:`split_yaml`)."""
        return cls.from_mapping(split_yaml(path)[0], base)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def specs(cls) -> Dict[str, Tuple[Any, ParamSpec]]:
        """``name -> (default, ParamSpec)`` for every field (for CLI flags and ROS descriptors)."""
        return specs(cls)

    def resolved_method(self) -> 'AdaptConfig':
        """The config with the method's fixed settings applied (baselines share the trainer).

        source_only: lambda1 = lambda2 = 0, no reweighting. wgan: m_alpha = 1 (m0 = 1,
        anneal = 1), potential without sign constraint, no reweighting."""
        if self.method == 'source_only':
            return dataclasses.replace(self, lambda1=0.0, lambda2=0.0, reweight=False)
        if self.method == 'wgan':
            return dataclasses.replace(self, m0=1.0, anneal=1.0, reweight=False)
        return self


@dataclass(frozen=True)
class AdaptIO:
    """The inputs and outputs of one adaptation run: ``pwan_adapt`` flags, ``adapt_node``
    parameters and ``config/adapt.yaml`` keys besides the :class:`AdaptConfig` fields. The paths
    are required (checked where they are used: '' = not given)."""

    labelled: str = param(
        '', '.npz with features (N, D), labels (N,), optional class_names (required)'
    )
    unlabelled: str = param(
        '', '.npz with features (M, D), optional evaluation labels (M,) (required)'
    )
    output: str = param('', 'output directory (required)')
    check: str = param(
        '',
        '.npz with a few rows of the unlabelled domain and their labels (features (C, D), labels '
        '(C,)): the safeguard compares its two candidates on them (check_alpha); "" = the '
        'label-free decision only',
    )
    resume: bool = param(False, 'continue from output/checkpoints/latest.pt')
    progress_interval: int = param(
        20, 'adapt_node: training steps between status messages on /diagnostics', 1, 1_000_000
    )

    def __post_init__(self):
        check(self, AdaptConfigError, flags=False)


#: the keys of :class:`AdaptIO`
IO_KEYS = tuple(specs(AdaptIO))


def split_yaml(path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Read a YAML file into ``(config_values, io_values)``.

    Accepts flat keys or a ROS 2 parameter file (``<node name or /**>: {ros__parameters: ...}``).
    ``io_values`` holds :data:`IO_KEYS`; any other unknown key is an error."""
    try:
        with open(path, 'r', encoding='utf-8') as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        reason = 'is a directory' if os.path.isdir(path) else (exc.strerror or str(exc))
        raise AdaptConfigError(f'cannot read config file {path}: {reason}') from None
    except UnicodeDecodeError:
        raise AdaptConfigError(f'config file {path} is not a text file') from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, 'problem_mark', None)
        at = f' (line {mark.line + 1}, column {mark.column + 1})' if mark is not None else ''
        problem = getattr(exc, 'problem', None) or str(exc).splitlines()[0]
        raise AdaptConfigError(f'config file {path} is not valid YAML{at}: {problem}') from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AdaptConfigError(f'config file {path}: expected a mapping at the top level')
    if len(data) == 1:
        (only,) = data.values()
        if isinstance(only, dict) and 'ros__parameters' in only:
            data = only['ros__parameters'] or {}
    names = {f.name for f in fields(AdaptConfig)}
    cfg = {k: v for k, v in data.items() if k in names}
    io = {k: v for k, v in data.items() if k in IO_KEYS}
    unknown = sorted(set(data) - names - set(IO_KEYS))
    if unknown:
        raise AdaptConfigError(f"config file {path}: unknown key(s) {', '.join(unknown)}")
    return cfg, io
