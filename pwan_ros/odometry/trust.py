"""The trust policy of the odometry: when a registration is distrusted (full PWAN runs), accepted
or rejected, judged against the recent accepted scans. :meth:`TrustPolicy.screen` and
:meth:`TrustPolicy.judge` decide a scan's :class:`Verdict` without changing any state; the
pipeline then reports what it did with :meth:`~TrustPolicy.accepted` / ``rejected`` /
``reanchored``."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Deque, Optional

import numpy as np

from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.keyframe_tracker import MatchQuality
from pwan_ros.odometry.keyframes import Keyframe

#: a scan keeping fewer usable points than this fraction of the recent accepted scans' median is
#: rejected (its content collapsed; registering it would match the few survivors "well")
POINT_COLLAPSE_RATIO = 0.3
#: recent accepted scans remembered
HISTORY = 10
#: consecutive rejections after which the history is forgotten (the scene may have changed)
FORGET_AFTER = 3
#: a registration agrees with the motion prediction when it deviates from it by at most this
#: many times the median deviation of the recent accepted scans (plus the floors below)
AGREEMENT_FACTOR = 3.0
#: floors of the agreement test: a fraction of h (m) and degrees
AGREEMENT_FLOOR_H = 0.05
AGREEMENT_FLOOR_DEG = 0.25


@dataclass(frozen=True)
class Verdict:
    """What becomes of a scan. action: 'init' (the first scan defines odom), 'accept', 'reject'
    (the last good pose is held) or 'reanchor' (a new keyframe at the held pose). reason: why
    (for an accepted scan: what the registration reported, '' if nothing). by_motion: accepted
    below the quality floor only because it agrees with the motion prediction."""

    action: str
    reason: str = ''
    by_motion: bool = False


class TrustPolicy:
    """History of the matched ratio, residual and size of recent accepted scans, and the count
    of consecutive rejections."""

    def __init__(self, config: OdometryConfig):
        self.config = config
        self.reset()

    def reset(self) -> None:
        self._ratios: Deque[float] = collections.deque(maxlen=HISTORY)
        self._residuals: Deque[float] = collections.deque(maxlen=HISTORY)
        self._sizes: Deque[int] = collections.deque(maxlen=HISTORY)
        self._deviations: Deque[tuple] = collections.deque(
            maxlen=HISTORY
        )  # (m, deg) from the prediction
        self.rejections = 0

    def forget(self) -> None:
        """Stop comparing with the old scans (keep the rejection count)."""
        self._ratios.clear()
        self._residuals.clear()
        self._sizes.clear()
        self._deviations.clear()

    def screen(self, kf: Optional[Keyframe], size: int) -> Optional[Verdict]:
        """The verdict on a scan decided before registering it, or None (register it): the first
        scan (no keyframe ``kf`` yet) defines odom; after ``reanchor_after`` rejections the scan
        re-anchors (never against a reference cloud); a scan whose ``size`` (usable points)
        collapsed is rejected."""
        if kf is None:
            return Verdict('init')
        if self.should_reanchor() and not kf.is_reference:
            return Verdict(
                'reanchor',
                f're-anchored on this scan after {self.rejections} rejected scans '
                '(motion since not recovered)',
            )
        collapse = self.collapsed(size)
        return Verdict('reject', collapse) if collapse else None

    def judge(
        self,
        q: MatchQuality,
        note: str,
        deviation: Optional[tuple],
        h: float,
        deformed: bool = False,
    ) -> Verdict:
        """Accept or reject a registration of quality ``q``. note: what the registration reported
        (why PWAN ran, self-check refusals; '' if nothing); deviation: (m, deg) from the motion
        prediction, None without one; h: matching distance (m). deformed: an affine / non-rigid
        registration to the reference cloud, judged by ``min_matched_ratio`` alone. A rigid one
        is accepted at the :meth:`acceptance_floor`, or below it (not under
        ``min_matched_ratio``) when it :meth:`agrees_with_motion`."""
        ratio, least = q.matched_ratio, self.config.min_matched_ratio
        if deformed:
            if ratio < least:
                return Verdict(
                    'reject', f'matched ratio {ratio:.2f} < min_matched_ratio {least:.2f}'
                )
            return Verdict('accept', note)
        floor = self.acceptance_floor()
        if ratio >= floor:
            return Verdict('accept', note)
        why = f'matched ratio {ratio:.2f} < required {floor:.2f}'
        detail = f' ({note})' if note else ''
        if ratio >= least and deviation is not None and self.agrees_with_motion(deviation, h):
            agrees = (
                f', accepted: agrees with the motion prediction ({deviation[0]:.3f} m, '
                f'{deviation[1]:.2f} deg)'
            )
            return Verdict('accept', why + agrees + detail, by_motion=True)
        return Verdict('reject', why + detail)

    def collapsed(self, size: int) -> str:
        """Why a scan of ``size`` usable points collapsed against the recent scans ('' if not)."""
        if len(self._sizes) >= 3:
            ref = float(np.median(self._sizes))
            if size < POINT_COLLAPSE_RATIO * ref:
                return f'usable points collapsed ({size} vs recent {ref:.0f})'
        return ''

    def distrust(self, q: MatchQuality, h: float) -> str:
        """Why a tracking result is not trusted ('' if it is); h: matching distance (m)."""
        cfg = self.config
        if q.matched_ratio < cfg.min_matched_ratio:
            return f'tracking lost (matched ratio {q.matched_ratio:.2f})'
        if len(self._ratios) >= 3:
            ref = float(np.median(self._ratios))
            if q.matched_ratio < cfg.ratio_drop * ref:
                return f'matched ratio collapsed ({q.matched_ratio:.2f} vs recent {ref:.2f})'
            res = float(np.median(self._residuals))
            if q.median_residual > 2.0 * res + 0.25 * h:
                return f'residual jump ({q.median_residual:.3f} m vs recent {res:.3f} m)'
        return ''

    def acceptance_floor(self) -> float:
        """Smallest matched ratio accepted: min_matched_ratio, raised to ratio_drop x the recent
        median once there is a history (a result far below recent quality is not trusted,
        whichever path produced it)."""
        floor = self.config.min_matched_ratio
        if len(self._ratios) >= 3:
            floor = max(floor, self.config.ratio_drop * float(np.median(self._ratios)))
        return floor

    def agrees_with_motion(self, deviation: tuple, h: float) -> bool:
        """Whether a registration that deviates (metres, degrees) from the motion prediction agrees
        with it as closely as the recent accepted scans did (needs a history of 3). Two independent
        estimates agreeing is evidence of a right pose even where the matched ratio is low: a scan
        flooded with spurious returns (rain, dust) matches a small fraction of its points."""
        if len(self._deviations) < 3:
            return False
        med_m, med_deg = np.median(np.array(self._deviations), axis=0)
        return (
            deviation[0] <= AGREEMENT_FACTOR * med_m + AGREEMENT_FLOOR_H * h
            and deviation[1] <= AGREEMENT_FACTOR * med_deg + AGREEMENT_FLOOR_DEG
        )

    def good_match(self) -> float:
        """Matched ratio that ends a multi-start recovery early: about the recent quality; without
        a history (start-up) infinity, so every start is tried."""
        if not self._ratios:
            return float('inf')
        return max(self.acceptance_floor(), 0.9 * float(np.median(self._ratios)))

    def should_reanchor(self) -> bool:
        n = self.config.reanchor_after
        return bool(n) and self.rejections >= n

    def accepted(
        self, q: MatchQuality, size: int, deviation: tuple | None = None, by_motion: bool = False
    ) -> None:
        """An accepted scan: its quality, usable points, and deviation (m, deg) from the motion
        prediction (None: there was none). ``by_motion``: accepted only by agreeing with the
        prediction; its quality is not the scene's and stays out of the history."""
        self.rejections = 0
        if by_motion:
            return
        self._ratios.append(q.matched_ratio)
        self._residuals.append(q.median_residual)
        self._sizes.append(size)
        if deviation is not None:
            self._deviations.append(deviation)

    def rejected(self) -> None:
        self.rejections += 1
        if self.rejections >= FORGET_AFTER:
            self.forget()

    def reanchored(self, size: int) -> None:
        self.rejections = 0
        self.forget()
        self._sizes.append(size)
