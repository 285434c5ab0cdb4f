"""The full-PWAN path of the odometry: an adapter from OdometryConfig to the core, and the
multi-start recovery.

Builds the core's RegistrationConfig once from the node parameters (same names), caps the
point sets at ``pwan_max_points``, warm-starts from the motion prediction (``mode='pwan'``: from
a pose tracking trusts, on the tail of the schedule, :func:`close_schedule`) and from the previous
scan's potential network weights (``mode='pwan'``), and keeps the keyframe's search structures
(k-d tree, normals) while the keyframe stays (:class:`ReferenceCache`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from scipy.spatial.transform import Rotation

from pwan_ros.core import RegistrationConfig, RegistrationResult, register
from pwan_ros.core.checks.rival import retake_better_rival
from pwan_ros.core.checks.verify import PoseCheck, check_pose
from pwan_ros.core.reference_cache import ReferenceCache
from pwan_ros.geometry.se3 import make_transform, transform_points
from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.keyframe_tracker import MatchQuality, PreparedCloud, track


def core_config(cfg: OdometryConfig, h: Optional[float] = None) -> RegistrationConfig:
    """The core configuration for the node parameters. h: distance threshold in metres
    (d-PWAN and the fine-tune stage), None = the core's automatic choice."""
    return RegistrationConfig(
        transform=cfg.transform,
        divergence=cfg.divergence,
        mass_ratio=cfg.mass_ratio,
        distance_threshold=h,
        max_points=cfg.pwan_max_points,
        steps=cfg.pwan_steps,
        potential_updates=cfg.potential_updates,
        device=cfg.device,
        seed=cfg.seed,
        compile=cfg.compile,
        threads=cfg.num_threads,
        self_check=False,
    )  # the pipeline judges the tracked result of a recovery itself (recover())


#: mode 'pwan', a start that tracking trusts: the adversarial stage enters its learning-rate
#: schedule where the rate has decayed to this fraction. With Adam every step moves the transform
#: by about the learning rate whatever the gradient, so the start of the schedule sets how far a
#: run travels (the full one: tens of degrees, a scan's length in the normalised frame), and the
#: motion test ends a run only once the rate has decayed (~300 of 400 steps on BALM). From a
#: start within tracking's reach the rest of the schedule travels about its gate h (BALM: h 0.5 m
#: in a 12.7 m scale, 0.039 normalised; (5e-4 - 1e-4) / (1 - decay) = 0.035).
CLOSE_LR_FRACTION = 0.05
#: potential updates per transform step from such a start: the network is the previous scan's,
#: trained on nearly the same discrepancy, and the transform moves a twentieth as far per step as
#: at the full schedule's start, so one update keeps up with it (BALM, nuScenes: the same errors
#: as with 3, docs/benchmarks.md)
CLOSE_UPDATES = 1


def close_schedule(config: RegistrationConfig) -> RegistrationConfig:
    """``config`` (resolved steps) entered at the step where its learning rate is
    :data:`CLOSE_LR_FRACTION` of the first (the same decay per step and final rate, fewer steps),
    with :data:`CLOSE_UPDATES` potential updates per step and no fine-tune or GICP polish: the
    pipeline tracks from every PWAN start, minimising the same partial objective (pairs within h)
    with GICP (BALM 333 -> 204 ms a scan, errors the same or lower; nuScenes the same)."""
    config = config.resolved()
    config = config.replace(
        potential_updates=min(CLOSE_UPDATES, config.potential_updates),
        finetune=dataclasses.replace(config.finetune, enabled=False, polish=False),
    )
    decay = np.log(config.lr_transform_final / config.lr_transform) / max(config.steps - 1, 1)
    if config.steps <= 1 or not decay < 0.0:
        return config  # a schedule of one rate: no tail to enter
    skipped = int(np.clip(round(np.log(CLOSE_LR_FRACTION) / decay), 0, config.steps - 1))
    return config.replace(
        steps=config.steps - skipped, lr_transform=config.lr_transform * np.exp(decay * skipped)
    )


class PwanAligner:
    """Runs PWAN between two clouds in metres; keeps the potential for warm starts and the
    reference's prepared search structures (``reference_cache``; None = rebuild them every call)
    for the scans registered against the same keyframe."""

    def __init__(self, config: OdometryConfig):
        self.config = config
        self._state: Optional[dict] = None
        self._cancel = threading.Event()  # shutdown: every registration from now on
        self._abandon = threading.Event()  # the running job only (a reset): until resume()
        self.reference_cache: Optional[ReferenceCache] = ReferenceCache()

    def align(
        self,
        source: np.ndarray,
        reference: np.ndarray,
        init: np.ndarray,
        h: Optional[float] = None,
        deadline: Optional[float] = None,
        self_check: bool = False,
        close: bool = False,
    ) -> RegistrationResult:
        """Register source (N, 3) onto reference (M, 3), both metres, from ``init`` (4x4
        T_reference_source). ``deadline`` (time.perf_counter() seconds) ends the adversarial
        stage early, as does :meth:`cancel`. self_check: the core judges its result (a
        deformation: the pipeline has no judge of its own for one). close: ``init`` is a pose
        tracking trusts: the short schedule (:func:`close_schedule`). Returns the core result
        (``transform`` maps source -> reference; ``status`` 'refused' with a reason)."""
        warm = self._state if self.config.mode == 'pwan' else None
        self.raise_if_cancelled()

        def should_stop() -> bool:
            self.raise_if_cancelled()  # shutdown: abandon the scan at the next step
            return deadline is not None and time.perf_counter() > deadline

        # the cache compares the keyframe's points by value: a new keyframe replaces the entry
        cache = self.reference_cache
        kwargs = {} if cache is None else {'reference_cache': cache}
        config = core_config(self.config, h).replace(self_check=self_check)
        result = register(
            source,
            reference,
            close_schedule(config) if close else config,
            init=init,
            potential_state=warm,
            should_stop=should_stop,
            **kwargs,
        )
        self._state = result.potential_state
        return result

    def align_global(
        self, source: np.ndarray, reference: np.ndarray, h: Optional[float] = None
    ) -> RegistrationResult:
        """Register source onto reference (metres) from an unknown pose: the core's
        ``init='global'`` (feature hypotheses chosen and refined by the partial objective); the
        result's ``status`` says whether it is trustworthy. Both clouds are in their sensors'
        frames (the scan; the keyframe's local map in the newest keyframe's), so the free space the
        sensors saw rejects poses that geometry alone cannot tell apart
        (``viewpoints='origin'``)."""
        self.raise_if_cancelled()
        cache = self.reference_cache
        kwargs = {} if cache is None else {'reference_cache': cache}
        return register(
            source,
            reference,
            core_config(self.config, h).replace(transform='rigid'),
            init='global',
            viewpoints='origin',
            **kwargs,
        )

    def reset(self) -> None:
        self._state = None
        if self.reference_cache is not None:
            self.reference_cache.clear()

    def cancel(self) -> None:
        """Abandon the running registration at its next step and refuse all later ones
        (shutdown): they raise :class:`RegistrationCancelled`."""
        self._cancel.set()

    def abandon(self) -> None:
        """Abandon the running registration at its next step (odometry reset during a
        background recovery) and every one until :meth:`resume`."""
        self._abandon.set()

    def resume(self) -> None:
        """The abandoned registration has ended: later ones run again."""
        self._abandon.clear()

    def raise_if_cancelled(self) -> None:
        if self._cancel.is_set():
            raise RegistrationCancelled('the PWAN registration was cancelled (shutdown)')
        if self._abandon.is_set():
            raise RegistrationCancelled('the PWAN registration was abandoned (odometry reset)')


class RegistrationCancelled(RuntimeError):
    """:meth:`PwanAligner.cancel` was called (the node is shutting down): the scan is abandoned,
    without the fine-tune, polish and self-check of the starts still to come."""


@dataclass(frozen=True)
class Recovery:
    """transform: (4, 4) T_keyframe_scan of the best start (polished by the tracker); quality:
    its match quality; iterations: PWAN + tracker iterations of all starts; starts: starts run;
    pwan_ms / polish_ms: time spent in each; origin: 'prediction', 'yaw N deg' or 'global' (the
    start the result came from), prefixed 'self-check rival of the' when the self-check found a
    clearly better pose next to it and the result was polished from there; global_status: the
    global registration's status ('' if it did not run); check: the core's self-check of the
    result (:func:`pwan_ros.core.checks.verify.check_pose`, scan against keyframe): a recovery it
    refuses must not be accepted; None where it did not run (``RecoveryPlan.close``)."""

    transform: np.ndarray
    quality: MatchQuality
    iterations: int
    starts: int
    pwan_ms: float
    polish_ms: float
    origin: str = 'prediction'
    global_status: str = ''
    check: Optional[PoseCheck] = None


@dataclass(frozen=True)
class RecoveryPlan:
    """How a recovery searches: ``yaw_starts`` starts turned about the sensor's z axis (REP-103:
    z up), stop at the first matching ``good`` (matched ratio) or at ``deadline``
    (time.perf_counter() seconds); the tracker's ``num_threads``; ``use_global``: when no start
    matched ``good`` (a kidnapped robot, a jump far beyond the prediction), a global registration
    (no initial pose) too. ``settles(T_keyframe_scan, quality)``: a result that ends the search
    as a good match does (it agrees with the motion prediction, say); None: none does. ``close``
    (None: not so): the first start is a pose tracking trusts; PWAN runs from it on the short
    schedule (:func:`close_schedule`), and ``close(T_keyframe_scan)`` says whether a result still
    agrees with it: then tracking's trust vouches for it (as for a tracked pose in mode
    'adaptive') and the self-check does not run."""

    yaw_starts: int
    good: float
    deadline: float
    num_threads: int = 2
    use_global: bool = False
    settles: Optional[Callable[[np.ndarray, MatchQuality], bool]] = None
    close: Optional[Callable[[np.ndarray], bool]] = None


class _Search:
    """The starts of one recovery as they run: the best tracked so far, where it came from, and
    what the starts spent."""

    def __init__(self):
        self.best = None
        self.origin = 'prediction'
        self.iterations, self.pwan_ms, self.polish_ms = 0, 0.0, 0.0
        self.starts, self.global_status = 0, ''
        self.settled = False  # a start's result settled the search (plan.settles)

    def offer(self, tracked, origin: str) -> None:
        """A start's tracked result: kept when it matches more of the scan."""
        if self.best is None or tracked.quality.matched_ratio > self.best.quality.matched_ratio:
            self.best, self.origin = tracked, origin


def recover(
    aligner: PwanAligner,
    keyframe: PreparedCloud,
    scan: PreparedCloud,
    init: np.ndarray,
    h: float,
    plan: RecoveryPlan,
) -> Recovery:
    """Full PWAN of ``scan`` onto ``keyframe`` from ``init`` (T_keyframe_scan), then from rotations
    of it by k x 360/yaw_starts degrees about the sensor's z axis, nearest first, each polished
    by the partial tracker, then (``plan.use_global``) the global registration; ``plan`` says
    when to stop. Returns the best by matched ratio.

    The result is judged by the core's self-check (unless it is the first start's and
    ``plan.close`` vouches for it); when the check finds a clearly better pose next to the result,
    the result is polished from there and judged in its place (kept when vouched for)."""
    search = _Search()
    _yaw_starts(aligner, keyframe, scan, (init, h), plan, search)
    if (
        plan.use_global
        and search.best.quality.matched_ratio < plan.good
        and not search.settled
        and time.perf_counter() < plan.deadline
    ):
        _global_start(aligner, keyframe, scan, h, plan, search)
    aligner.raise_if_cancelled()
    t1 = time.perf_counter()
    check = None
    if not _kept_close(plan, search):
        check = _judged(keyframe, scan, h, plan, search)
    search.polish_ms += (time.perf_counter() - t1) * 1e3
    best = search.best
    return Recovery(
        best.transform,
        best.quality,
        search.iterations,
        search.starts,
        search.pwan_ms,
        search.polish_ms,
        search.origin,
        search.global_status,
        check,
    )


def _yaw_starts(aligner, keyframe, scan, start: tuple, plan: RecoveryPlan, search: _Search):
    """PWAN from ``start`` = (init, h) (the prediction, or in mode 'pwan' a pose tracking
    trusts: ``plan.close``) and its yaw turns, nearest first, until one matches ``plan.good`` or
    the deadline passes."""
    init, h = start
    yaws = [0.0] + [2.0 * np.pi * k / plan.yaw_starts for k in range(1, plan.yaw_starts)]
    yaws = sorted(yaws, key=lambda a: min(a, 2.0 * np.pi - a))
    for k, yaw in enumerate(yaws):
        turned = init @ make_transform(
            Rotation.from_rotvec([0.0, 0.0, yaw]).as_matrix(), np.zeros(3)
        )
        t0 = time.perf_counter()
        close = plan.close is not None and k == 0
        result = aligner.align(scan.points, keyframe.points, turned, h, plan.deadline, close=close)
        t1 = time.perf_counter()
        tr = track(keyframe, scan, result.transform, h, num_threads=plan.num_threads)
        search.pwan_ms += (t1 - t0) * 1e3
        search.polish_ms += (time.perf_counter() - t1) * 1e3
        search.iterations += result.iterations + tr.iterations
        search.offer(tr, 'prediction' if k == 0 else f'yaw {np.degrees(yaw):.0f} deg')
        search.starts = k + 1
        best = search.best
        search.settled = plan.settles is not None and plan.settles(best.transform, best.quality)
        if best.quality.matched_ratio >= plan.good or search.settled:
            break
        if time.perf_counter() > plan.deadline:
            break


def _kept_close(plan: RecoveryPlan, search: _Search) -> bool:
    """Whether the result is the first start's, a pose tracking trusts, and still agrees with
    it (``plan.close``)."""
    return (
        plan.close is not None
        and search.origin == 'prediction'
        and plan.close(search.best.transform)
    )


def _global_start(aligner, keyframe, scan, h: float, plan: RecoveryPlan, search: _Search):
    """The global registration (no initial pose), tracked from its pose when not refused."""
    t0 = time.perf_counter()
    result = aligner.align_global(scan.points, keyframe.points, h)
    t1 = time.perf_counter()
    search.pwan_ms += (t1 - t0) * 1e3
    search.starts, search.global_status = search.starts + 1, result.status
    if result.status == 'ok':
        tr = track(keyframe, scan, result.transform, h, num_threads=plan.num_threads)
        search.polish_ms += (time.perf_counter() - t1) * 1e3
        search.iterations += tr.iterations
        if tr.quality.matched_ratio > search.best.quality.matched_ratio:
            search.best, search.origin = tr, 'global'


def _judged(keyframe, scan, h: float, plan: RecoveryPlan, search: _Search) -> PoseCheck:
    """The self-check of the best start (scan against keyframe); a clearly better pose it finds
    next to it (a polish that slid along a corridor, say) is tracked from there and takes its
    place when vouched for."""

    def judged(t: np.ndarray) -> PoseCheck:  # the self-check of the scan at T_keyframe_scan t
        return check_pose(transform_points(t, scan.points), keyframe.points)

    check = judged(search.best.transform)
    tracked = []

    def refit(rival: np.ndarray):
        tracked.append(
            track(keyframe, scan, rival @ search.best.transform, h, num_threads=plan.num_threads)
        )
        return tracked[-1]

    retaken = retake_better_rival(
        check, refit, lambda tr: judged(tr.transform), keep_refused=False
    )
    search.iterations += sum(tr.iterations for tr in tracked)
    if retaken is not None:
        (search.best, check), search.origin = retaken, f'self-check rival of the {search.origin}'
    return check
