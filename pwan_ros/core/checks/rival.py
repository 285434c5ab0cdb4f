"""Retake a better rival: when the self-check of a pose finds a distinct pose nearby that fits
clearly better (:attr:`verify.PoseCheck.rival_better`), fit again from there and judge the new
pose in its place. One step, shared by every path that judges a pose: a local registration's
result (:mod:`local.assemble`), a deformation's pose (:mod:`decide`), the global search's winner
and the odometry's PWAN recovery."""

from __future__ import annotations

from typing import Callable, Optional, Tuple, TypeVar

import numpy as np

from .verify import PoseCheck

__all__ = ['retake_better_rival']

T = TypeVar('T')


def retake_better_rival(
    check: PoseCheck,
    refit: Callable[[np.ndarray], T],
    judge: Callable[[T], PoseCheck],
    within: float = np.inf,
    keep_refused: bool = True,
) -> Optional[Tuple[T, PoseCheck]]:
    """(``refit(check.rival_transform)``, its ``judge``-ment) when ``check`` found a clearly
    better pose no farther than ``within`` gates (RMS shift of the source points); None when it
    found none, or when the retaken pose is refused and not ``keep_refused``. refit: the rival's
    (d+1, d+1) transform from the judged pose -> what is judged next (a result, a tracking
    outcome, moved points); judge: that -> its :class:`PoseCheck`."""
    if not check.rival_better or check.rival_shift > within * check.gate:
        return None
    retaken = refit(check.rival_transform)
    verdict = judge(retaken)
    if verdict.status != 'ok' and not keep_refused:
        return None
    return retaken, verdict
