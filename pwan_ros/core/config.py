"""Typed, frozen and validated configuration of the registration core.

One dataclass per component; every field name is the future ROS parameter / CLI option name
(nested components are addressed as ``potential.hidden`` etc. by
:meth:`RegistrationConfig.from_dict`). Lengths are in the caller's units (metres for ROS) unless a
field says "normalised": the core normalises both sets internally (see ``docs/core.md``) and
converts back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Tuple

from pwan_ros.params import check, param

from .errors import PwanInputError

TRANSFORMS = ('rigid', 'affine', 'nonrigid')
DIVERGENCES = ('mass', 'distance')
H_MODES = ('learn', 'closed_form')
START_SCORES = ('overlap', 'nn')
COMPILE_MODES = ('auto', 'on', 'off')
NN_MODES = ('auto', 'kdtree', 'torch')

#: defaults of the fields left None, per transform: (steps, potential_updates, tolerance). The
#: non-rigid transform has r x d more parameters, moves more slowly per step and needs a more
#: accurate potential (measured on the bcpd pairs with 120 % outliers: 200 steps / u=3 left the
#: MSE at 1.2-2.8x the similarity oracle, 1000 / u=10 / tolerance 0.03 at 0.2-1.1x). On the full
#: 1000-step schedule u=5 (5000 critic updates, WGAN-GP's critic count) is enough: against u=10 the
#: same MSE on 12 of 12 SHREC'19 body cells (the soft stage's CPD from the pre-aligned pose wins
#: there) in 0.7x the time (median 20.4 -> 14.5 s, one thread); bench_verdicts.py's 78 verdicts
#: 49 / 6 / 2 / 21 (right-ok / wrong-ok / right-refused / wrong-refused; were 48 / 7 / 3 / 20).
#: The short schedule keeps u=10 (:data:`NONRIGID_MATCHED_UPDATES`).
TRANSFORM_DEFAULTS = {
    'rigid': (200, 3, 0.1),
    'affine': (200, 3, 0.1),
    'nonrigid': (1000, 5, 0.03),
}
#: default non-rigid ``steps`` when the mass type matches the whole source (``mass`` >= the source
#: points: outliers in the reference only). The learning rate decays over ``steps`` and the
#: fine-tune's soft-correspondence stage fits the deformation from where the adversarial stage
#: leaves it, so a shorter schedule only has to bring every source point near its match
#: (measured on the bcpd pairs, 3 draws, rotation removed: at 300 steps the median MSE is the same
#: (within 5 %) or lower in all 16 cells of fish / bunny / monkey / armadillo with 20-120 %
#: outliers or full overlap, in 0.4-0.6x the time; rotated, with the 24-start pre-alignment, the
#: same in 12 of 12 in 0.35-0.7x). With a part of the source unmatched the stage also decides
#: which part, and fewer steps lose it (cuts keeping 70-85 %: 300 steps left the median 1.1-35x
#: higher in 6 of 8 cells), so those keep 1000. Only with the soft stage's CPD from the start
#: (``finetune.soft_from_start``), the second route to the deformation: the adversarial field
#: polished alone is worse after 300 steps (monkey, 20 % outliers: 0.0048 against 6e-6).
NONRIGID_MATCHED_STEPS = 300
#: potential updates u of that short schedule (``potential_updates`` left None): its 300 steps
#: keep u=10, 3000 critic updates, the long schedule's 5000 at u=5 (bcpd bunny, 1500 points,
#: 120 % outliers, 3 draws: u=5 on 300 steps left the median MSE 5.7x higher)
NONRIGID_MATCHED_UPDATES = 10

#: default potential widths per transform (``potential.hidden`` None), chosen by benchmark: (16,
#: 16) solves the bunny tournament as (32, 32) did (6 of 8 pairs clean and with 100 % outliers,
#: three draws) at 2-3x less compute, but on the non-rigid fish with 100 % outliers it picked a
#: wrong start on 3 of 3 seeds (MSE 4.9 vs 0.03 with (32, 32)); the deformation needs the finer
#: potential
HIDDEN_DEFAULTS = {'rigid': (16, 16), 'affine': (16, 16), 'nonrigid': (32, 32)}
#: default ``warmup_updates`` per transform: 30 solves the bunny tournament as 100 did; the fish
#: with 120 % outliers needs 100 with the non-rigid widths (MSE 4.7 with 30, 0.047 with 100)
WARMUP_DEFAULTS = {'rigid': 30, 'affine': 30, 'nonrigid': 100}

#: default ``steps`` of a rigid / affine multi-start (``starts > 1``). The learning rate decays
#: over ``steps``, so ``steps`` sets how far a run can travel: starts from the rotation group begin
#: up to ~60 deg from the truth, further than a single run from a prior, and the tournament keeps
#: every finalist's short-stage pose, so the longer schedule cannot lose one (measured on the bunny
#: pairs with 100 % outliers: 600 steps solved 5 of the 5 pairs <= 60 deg, 200 steps 4; a single
#: start gains nothing from it and takes 2x longer, 3.5 s instead of 1.75 s at 2k + 2k points).
MULTISTART_STEPS = 600
#: default ``start_steps`` of a multi-start: the short stage of the coarse-to-fine tournament
MULTISTART_START_STEPS = 60


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise PwanInputError(msg)


@dataclass(frozen=True)
class PotentialConfig:
    """Potential network f_{w,h} and its optimiser (``potential.*`` keys). Every field carries its
    description and range (``specs(PotentialConfig)``, the table in docs/core.md).

    h_floor: below the sampling resolution the potential distinguishes nothing; with dense
    outliers the learned h otherwise collapses to ~0 and the transform stops receiving gradient
    (see docs/core.md). hidden (per transform, :data:`HIDDEN_DEFAULTS`) and the warm-up: chosen by
    benchmark (docs/benchmarks.md, "Engine speed (Alg. 1)"). :attr:`widths` is ``hidden`` with
    None resolved.
    """

    hidden: Optional[Tuple[int, int]] = param(
        None,
        'widths (a, b) of the point-wise MLP d->a->b, branch b->2b->b, '
        'skip concatenation [a, branch]->1 (Appx. B.5); None = (16, 16) rigid / '
        'affine, (32, 32) nonrigid',
        1,
    )
    lr: float = param(5e-3, 'Adam learning rate of the potential network', 0.0, low_open=True)
    gp_weight: float = param(
        10.0, 'weight of the one-sided gradient penalty mean(relu(|grad g|^2 - 1))', 0.0
    )
    gp_points: int = param(
        256,
        'points of the current source + reference batch the penalty is taken at (on the '
        'first of the u updates of each step)',
        1,
    )
    h_mode: str = param(
        'learn',
        'mass type: learn (h is a parameter, eq. loss_m_app) or closed_form (h = max |g| '
        'over the batch, eq. app_final_m_eq2)',
        choices=H_MODES,
    )
    h_init: float = param(1.0, 'initial h (normalised units)', 0.0, low_open=True)
    h_floor: float = param(
        1.0,
        'lower bound of a learned h, x the median nearest-neighbour spacing of the '
        'adversarial reference (0 = none)',
        0.0,
    )
    leaky_slope: float = param(0.2, 'negative slope of the LeakyReLU activations', 0.0)
    length_scale: float = param(
        0.1,
        'resolution l of the network: g(x) = l mlp(x / l) (normalised units)',
        0.0,
        low_open=True,
    )
    betas: Tuple[float, float] = param(
        (0.5, 0.99), 'Adam betas of the potential network', 0.0, 1.0, high_open=True
    )

    def __post_init__(self):
        check(self, PwanInputError, flags=False, prefix='potential.')

    @property
    def widths(self) -> Tuple[int, int]:
        """``hidden``, or the rigid default when None (a network built outside a registration)."""
        return self.hidden if self.hidden is not None else HIDDEN_DEFAULTS['rigid']


@dataclass(frozen=True)
class CoherenceConfig:
    """Coherence regulariser lambda Tr(V^T (sigma I + G_rho)^-1 V) of the non-rigid transform
    (``coherence.*`` keys), G(i,j) = exp(-|y_i - y_j|^2 / rho) in normalised units (unit variance
    sets), through k Nystrom landmarks."""

    rho: float = param(2.0, 'Gaussian kernel width rho (normalised units)', 0.0, low_open=True)
    weight: float = param(0.01, 'regulariser weight lambda', 0.0)
    sigma: float = param(0.1, 'ridge sigma', 0.0, low_open=True)
    rank: int = param(100, 'Nystrom landmarks k', 1)

    def __post_init__(self):
        check(self, PwanInputError, flags=False, prefix='coherence.')


@dataclass(frozen=True)
class FineTuneConfig:
    """Fine-tune stage (eq. fine_tune): trimmed / thresholded nearest-neighbour objective
    (``finetune.*`` keys).

    max_iterations is a cap: the iteratively re-weighted steps converge slowly along weakly
    constrained directions, e.g. along a corridor or a street, where 60 left a lidar pair 0.5 m
    short; a run that hits the cap warns. overlap_refine: a mass above the true overlap pulls the
    pose off; the distance-type pass matches what actually overlaps.
    """

    enabled: bool = param(
        True, 'run the fine-tune after the adversarial stage of register (refine always runs it)'
    )
    max_iterations: int = param(
        300, 'cap on the alternations of nearest-neighbour search and closed-form step', 1
    )
    tolerance: float = param(
        1e-5,
        'stop when the RMS motion of the source between iterations is below this x the set scale',
        0.0,
        low_open=True,
    )
    max_points: int = param(20000, 'cap on the source points used (0 = all valid input points)', 0)
    metric: str = param(
        'point_to_plane',
        'rigid: point_to_plane (distance along the nearest reference point\'s PCA '
        'normal) or point_to_point (eq. fine_tune as written; always for affine / nonrigid)',
        choices=('point_to_plane', 'point_to_point'),
    )
    normal_neighbors: int = param(10, 'neighbours of the PCA normals (point_to_plane)', 3)
    overlap_refine: bool = param(
        True,
        'rigid mass type: then the distance-type fine-tune at 2 x the median dense '
        'reference spacing, so the matched mass follows the actual overlap',
    )
    polish: bool = param(
        True,
        'rigid 3-D register: then a plane-aware polish (small_gicp GICP, its gate '
        'halving from 2 % of the reference extent to 2 x the matching distance), kept when it '
        'puts 0.5 % more of the source within the matching distance (the fine-tune slides '
        'slowly along streets and corridors)',
    )
    soft_iterations: int = param(
        100,
        'nonrigid: cap on the EM steps of the soft-correspondence polish after the fine-tune '
        '(coherent point drift from the fine-tuned field, outlier weight from the mass or h; '
        '0 = off)',
        0,
    )
    soft_beta: float = param(
        2.0,
        'nonrigid polish: width beta of its Gaussian kernel (normalised units, rho = 2 beta^2; '
        "CPD's default)",
        0.0,
        low_open=True,
    )
    soft_lambda: float = param(
        2.0, "nonrigid polish: weight lambda of its coherence term (CPD's default)", 0.0
    )
    soft_from_start: bool = param(
        True,
        'nonrigid: also run coherent point drift from the stage\'s initial pose (CPD\'s wide '
        'start, a smooth field only, soft_beta / soft_lambda) and keep whichever of it and the '
        'polished PWAN field has the lower partial nearest-neighbour objective',
    )
    nn: str = param(
        'auto',
        'nearest-neighbour search of the fine-tune: kdtree (host CPU: small_gicp in 3-D, scipy), '
        'torch (chunked brute force on the registration\'s device) or auto (kdtree: the '
        'fine-tune\'s steps run on the host, measured faster on CPU and CUDA)',
        choices=NN_MODES,
    )

    def __post_init__(self):
        check(self, PwanInputError, flags=False, prefix='finetune.')


@dataclass(frozen=True)
class GlobalConfig:
    """Global search (``global_search.*`` keys of RegistrationConfig; used by init='global')."""

    feature_points: int = param(
        3000,
        'points per set the FPFH features are computed on (sets the feature voxel)',
        100,
        1_000_000,
    )
    candidates: int = param(
        6,
        'distinct RANSAC poses refined, fitted and ranked by their overlap beyond chance',
        1,
        100,
    )
    ransac_iterations: int = param(
        20000,
        '3-point samples drawn by the RANSAC (guided: each pair of a sample agrees in length)',
        100,
        10_000_000,
    )
    min_overlap: float = param(
        0.2,
        'refuse when less than this fraction of the source lies within h of the '
        'reference at the best pose',
        0.0,
        1.0,
    )
    weak_support: int = param(
        12,
        'when no RANSAC pose has this many feature inliers, the rotation group of '
        'the cube (its 8 best starts, each translated by votes) joins the candidates',
        0,
        1_000_000,
    )
    min_confidence: float = param(
        0.2,
        'refuse when the best distinct runner-up comes within this share of what the '
        'winner puts on the reference beyond chance (or of confirm_below, when the winner '
        'explains less): ambiguous',
        0.0,
        1.0,
    )
    min_constraint: float = param(
        0.04,
        'refuse when the overlap leaves a direction free: the smallest eigenvalue '
        'of the mean n n^T of the matched reference normals (0: a plane or a '
        'corridor, the pose can slide; 1/3: every direction held alike)',
        0.0,
        1.0 / 3,
    )
    max_free_space: float = param(
        0.03,
        'with viewpoints: reject a candidate pose that puts more than this '
        'fraction of either cloud where the other sensor saw free space',
        0.0,
        1.0,
    )
    confirm_below: float = param(
        0.5,
        'a rigid 3-D result registered from no init (init None) that puts less than this '
        'fraction of the source on the reference beyond chance is confirmed by the global '
        'search: kept when it agrees or fits clearly better, refused when the two searches '
        'leave the pose open (0: never); the global search asks a winner explaining less to '
        'lead its runner-up by min_confidence of this',
        0.0,
        1.0,
    )
    fgr: bool = param(True, "add Open3D's fast global registration as a candidate")
    kiss_matcher: bool = param(True, 'add KISS-Matcher as a candidate when it is installed')

    def __post_init__(self):
        check(self, PwanInputError, flags=False, prefix='global_search.')


@dataclass(frozen=True)
class RegistrationConfig:
    """Configuration of :func:`pwan_ros.core.register` and :func:`pwan_ros.core.refine`.

    Each top-level field carries its description and range (``specs(RegistrationConfig)``, the
    source of the ``pwan_register`` flags and the table in docs/core.md). Fields left None take
    the per-transform defaults of :meth:`resolved`. Convergence (tolerance / window /
    min_steps): below the sampling resolution the potential carries no more information and the
    fine-tune stage takes over. The multi-start tournament: every start runs ``start_steps``
    transform steps and a fine-tune on ``start_finetune_points`` source points, the best
    ``start_keep`` continue with the full Alg. 1 + fine-tune (each finalist's short-stage pose
    stays a candidate); ``start_score`` 'overlap' is the distance-type partial objective of the NN
    plan at h = 2x the dense reference spacing (how much of the source lies on the reference).
    """

    transform: str = param(
        'rigid',
        'transform of the source: rigid (rotation + translation), affine, or nonrigid '
        '(coherent displacement field, eq. nonrigid)',
        choices=TRANSFORMS,
    )
    divergence: str = param(
        'mass',
        'mass: m-PWAN, match a given mass (mass / mass_ratio); distance: d-PWAN, match '
        'pairs closer than distance_threshold',
        choices=DIVERGENCES,
    )
    mass_ratio: Optional[float] = param(
        None,
        'matched mass as a fraction of the smaller valid set; None (with mass None) = 0.8, '
        'then lowered to the overlap the result shows (register, rigid / affine)',
        0.0,
        1.0,
        low_open=True,
    )
    mass: Optional[float] = param(
        None,
        'matched mass in points (<= the smaller valid set); exclusive with mass_ratio',
        0.0,
        low_open=True,
    )
    distance_threshold: Optional[float] = param(
        None,
        'd-PWAN threshold h in caller units; None = 2 x the median '
        'nearest-neighbour spacing of the preprocessed reference',
        0.0,
        low_open=True,
    )
    voxel_size: Optional[float] = param(
        None,
        'voxel-grid downsampling before the adversarial stage, caller units; None = off',
        0.0,
        low_open=True,
    )
    max_points: int = param(2000, 'random cap on points per set in the adversarial stage', 3)
    steps: Optional[int] = param(
        None,
        'maximum transform updates T; None = 200 rigid / affine (600 with '
        'starts > 1); nonrigid 300 when the mass covers the whole source and the fine-tune runs '
        'CPD from the start, else 1000',
        0,
    )
    potential_updates: Optional[int] = param(
        None,
        'potential-network updates u per transform update; None = 3 rigid / affine, 5 nonrigid '
        '(10 on its 300-step schedule)',
        1,
    )
    warmup_updates: Optional[int] = param(
        None,
        'potential updates before the first transform update; None = 30 '
        'rigid / affine, 100 nonrigid',
        0,
    )
    batch_size: int = param(512, 'mini-batch per set (0 = whole sets)', 0)
    lr_transform: float = param(
        1e-2, 'Adam learning rate of the transform at the first step', 0.0, low_open=True
    )
    lr_transform_final: float = param(
        1e-4, 'learning rate at the last step (exponential decay over steps)', 0.0, low_open=True
    )
    tolerance: Optional[float] = param(
        None,
        'stop when the RMS source motion over window steps is below this x '
        'the source point spacing; None = 0.1 rigid / affine, 0.03 nonrigid',
        0.0,
        low_open=True,
    )
    window: int = param(10, 'steps over which the convergence motion is measured', 1)
    min_steps: int = param(30, 'transform updates before convergence is tested', 0)
    starts: int = param(
        1,
        'rigid / affine multi-start: initial rotations (identity, the cube group, then '
        'random; 24 = the cube group, for an unknown orientation)',
        1,
    )
    start_score: str = param(
        'overlap',
        'how starts are compared after their fine-tune: overlap (fraction of the '
        'source on the reference) or nn (fixed-mass partial NN objective)',
        choices=START_SCORES,
    )
    start_steps: Optional[int] = param(
        None,
        'multi-start tournament: steps every start runs before the best '
        'start_keep continue (0 = every start runs the full Alg. 1); None = '
        f'{MULTISTART_START_STEPS} with starts > 1',
        0,
    )
    start_keep: int = param(4, 'multi-start tournament: starts that continue after start_steps', 1)
    prealign_keep: int = param(
        3, 'nonrigid with starts > 1: best rigid finalists deformed and compared', 1
    )
    start_finetune_points: int = param(
        2000, 'source points of the fine-tune that scores each start (0 = all)', 0
    )
    start_finetune_iterations: int = param(
        60,
        'iteration cap of the fine-tune that scores each start (the '
        "winner's final fine-tune has finetune.max_iterations)",
        1,
    )
    prealign: bool = param(
        True,
        'nonrigid: first register rigidly (same settings, incl. starts) and deform from there',
    )
    reorient: bool = param(
        True,
        'nonrigid with prealign, starts = 1 and no init: a deformation the self-check refuses is '
        'registered again from the 24 rotations of the cube (an orientation far from the '
        'initial one), and taken when the check accepts it',
    )
    device: str = param(
        'auto',
        'compute device: auto = the CPU (these small networks run host-bound on a GPU, and the '
        'first registration of each shape set there pays its graph capture), cpu, cuda or '
        'cuda:N; use cuda for many registrations of one shape set (docs/benchmarks.md)',
        fmt='device',
    )
    compile: str = param(
        'auto',
        'torch.compile the two gradient functions of Alg. 1 (fullgraph): on, off, or auto = '
        'off on every device (it pays back only over many registrations of one shape set)',
        choices=COMPILE_MODES,
    )
    cuda_graphs: bool = param(
        True,
        'CUDA: the Alg. 1 steps after the first replay one captured CUDA graph of a step '
        '(no per-kernel launch from Python); false = launch kernel by kernel (compiled '
        "functions then use torch.compile's own graphs); no effect on the CPU",
    )
    seed: int = param(0, 'random seed (sampling, network initialisation)', 0)
    threads: int = param(
        0,
        "CPU threads for torch and the fine-tune's nearest-neighbour searches (0 = automatic: "
        '1 on up to 2 cores, else half the cores, at most 4)',
        0,
    )
    verbose: bool = param(False, 'progress lines on stderr')
    self_check: bool = param(
        True,
        'judge every result from what it shows (overlap beyond chance, at an optimum, '
        'constrained in every direction; core/checks/verify.py): a pose it cannot vouch for gets '
        "status 'refused' (pwan_register exit 3)",
    )
    potential: PotentialConfig = field(default_factory=PotentialConfig)
    coherence: CoherenceConfig = field(default_factory=CoherenceConfig)
    finetune: FineTuneConfig = field(default_factory=FineTuneConfig)
    global_search: GlobalConfig = field(default_factory=GlobalConfig)

    def __post_init__(self):
        check(self, PwanInputError, flags=False, rules=RegistrationConfig._rules)

    def _rules(self):
        """The cross-field rules (:func:`pwan_ros.params.check`): ``(ok, field, allowed)``."""
        yield (
            self.mass is None or self.mass_ratio is None,
            'mass',
            'None when mass_ratio is given (give either mass or mass_ratio)',
        )
        for name, sub in _SECTIONS.items():
            yield isinstance(getattr(self, name), sub), name, f'a {sub.__name__}'

    @property
    def effective_mass_ratio(self) -> Optional[float]:
        """Mass ratio used when ``mass`` is not given (0.8, the paper's rigid setting)."""
        if self.mass is not None:
            return None
        return 0.8 if self.mass_ratio is None else self.mass_ratio

    def resolved(self) -> 'RegistrationConfig':
        """Copy with ``steps`` / ``potential_updates`` / ``tolerance`` left None set to the
        transform's defaults (:data:`TRANSFORM_DEFAULTS`; rigid / affine with ``starts > 1``:
        ``steps`` = :data:`MULTISTART_STEPS`)."""
        steps, updates, tol = TRANSFORM_DEFAULTS[self.transform]
        if self.starts > 1 and self.transform != 'nonrigid':
            steps = MULTISTART_STEPS
        start_steps = MULTISTART_START_STEPS if self.starts > 1 else 0
        pinned = self.pinned()
        return dataclasses.replace(
            self,
            steps=steps if self.steps is None else self.steps,
            potential=pinned.potential,
            warmup_updates=pinned.warmup_updates,
            start_steps=start_steps if self.start_steps is None else self.start_steps,
            potential_updates=updates
            if self.potential_updates is None
            else self.potential_updates,
            tolerance=tol if self.tolerance is None else self.tolerance,
        )

    def pinned(self) -> 'RegistrationConfig':
        """Copy with ``potential.hidden`` and ``warmup_updates`` left None set to this transform's
        defaults (:data:`HIDDEN_DEFAULTS`, :data:`WARMUP_DEFAULTS`): a non-rigid registration's
        rigid pre-alignment keeps the non-rigid network."""
        out = self
        if out.potential.hidden is None:
            out = dataclasses.replace(
                out,
                potential=dataclasses.replace(
                    out.potential, hidden=HIDDEN_DEFAULTS[self.transform]
                ),
            )
        if out.warmup_updates is None:
            out = dataclasses.replace(out, warmup_updates=WARMUP_DEFAULTS[self.transform])
        return out

    def replace(self, **changes: Any) -> 'RegistrationConfig':
        """Copy with changed fields (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> 'RegistrationConfig':
        """Build from a flat mapping; nested fields as ``'potential.lr'`` keys or sub-mappings.

        Unknown keys raise :class:`PwanInputError` (catches typos in ROS parameters / YAML).
        """
        top = {f.name for f in dataclasses.fields(cls)}
        subs = _SECTIONS
        kwargs: dict = {}
        nested: dict = {k: {} for k in subs}
        for key, value in dict(values).items():
            if '.' in key:
                head, tail = key.split('.', 1)
                _check(head in subs, f'unknown configuration key {key!r}')
                nested[head][tail] = value
            elif key in subs and isinstance(value, Mapping):
                nested[key].update(value)
            else:
                _check(key in top, f'unknown configuration key {key!r}')
                kwargs[key] = value
        for name, sub_cls in subs.items():
            if nested[name]:
                known = {f.name for f in dataclasses.fields(sub_cls)}
                bad = set(nested[name]) - known
                _check(
                    not bad, f'unknown configuration key(s) {sorted(name + "." + b for b in bad)}'
                )
                kwargs[name] = sub_cls(**nested[name])
        try:
            return cls(**kwargs)
        except TypeError as exc:  # wrong field types that dataclass itself rejects
            raise PwanInputError(str(exc)) from None


#: the nested sections of :class:`RegistrationConfig`: key -> config class
_SECTIONS = {
    'potential': PotentialConfig,
    'coherence': CoherenceConfig,
    'finetune': FineTuneConfig,
    'global_search': GlobalConfig,
}
