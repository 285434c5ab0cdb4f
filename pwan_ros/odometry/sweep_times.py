"""Which per-point times to trust for deskewing: a driver's time field is used only when it
describes one sweep at the scan's header stamp.

Drivers get time fields wrong in the field: a constant offset (a Velodyne ``time`` 5 s off, a
Hesai ``timestamp`` from another clock), random or alternating values, NaN. Applied blindly,
a field 5 s off at 1 m/s moved every pose 5 m with status OK. A field is used only when

- its values span at most one sweep, and every point lies within one sweep of the header stamp
  (a sweep: 1.5 scan periods, measured from the header stamps, at most 1 s);
- its median time advances from scan to scan (a field that jumps back and forth is no clock);

otherwise the scan is registered as it is (not deskewed) and :attr:`SweepTimes.warning` says
why, for the log and the diagnostics. Points whose own time is NaN or infinite are kept and
simply not moved by the deskew (offset = the scan's median time).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

from pwan_ros.io.point_times import MAX_SWEEP_S, TIME_FIELDS, PointTimesError, point_times

__all__ = ['SweepTimes', 'SweepClock']

#: a sweep lasts at most this many scan periods (drivers stamp its start, middle or end)
SWEEP_PERIODS = 1.5


@dataclass(frozen=True)
class SweepTimes:
    """offsets: (N,) s from the header stamp to use for deskewing (non-finite entries replaced by
    the median), or None (deskew off, no field, or the field refused). status: one word for the
    diagnostics ('off', 'none', 'used', 'ignored'). detail: field and convention, or why it
    was refused. warning: text for the log when the field was refused (else None)."""

    offsets: Optional[np.ndarray]
    status: str
    detail: str = ''
    warning: Optional[str] = None


class SweepClock:
    """Per-point times of one sensor's scans, checked against the header stamps.

    deskew: 'auto' (use a valid field when there is one), 'on' (the same, and warn when a scan
    has none) or 'off'."""

    def __init__(self, deskew: str = 'auto'):
        self.deskew = deskew
        self.reset()

    def reset(self) -> None:
        """Forget the scan period and the last sweep time (a new sensor, time going back)."""
        self._last_stamp: Optional[float] = None
        self._last_sweep: Optional[float] = None
        self._periods: deque = deque(maxlen=10)

    @property
    def max_sweep_s(self) -> float:
        """The longest sweep accepted (s): 1.5 x the median scan period, at most 1 s."""
        if not self._periods:
            return MAX_SWEEP_S
        return min(MAX_SWEEP_S, SWEEP_PERIODS * float(np.median(self._periods)))

    def read(self, extras: np.ndarray, stamp: float) -> SweepTimes:
        """The offsets of one scan. extras: structured non-xyz fields (``DecodedCloud.extras``);
        stamp: the header stamp (s)."""
        if self._last_stamp is not None and stamp < self._last_stamp:
            self.reset()
        if self._last_stamp is not None and stamp > self._last_stamp:
            self._periods.append(stamp - self._last_stamp)
        self._last_stamp = stamp
        if self.deskew == 'off':
            return SweepTimes(None, 'off')
        try:
            times = point_times(extras, stamp)
        except PointTimesError as exc:
            return self._refuse(str(exc))
        if times is None:
            warning = None
            if self.deskew == 'on':
                warning = (
                    'deskew=on but the cloud has no per-point time field '
                    f"({', '.join(TIME_FIELDS)}): not deskewing"
                )
            return SweepTimes(None, 'none', '', warning)
        offsets = times.offsets
        finite = np.isfinite(offsets)
        if not finite.any():
            return self._refuse(f"time field '{times.field}' holds no finite value")
        lo, hi = float(offsets[finite].min()), float(offsets[finite].max())
        limit = self.max_sweep_s
        if hi - lo > limit or max(abs(lo), abs(hi)) > limit:
            return self._refuse(
                f"time field '{times.field}' ({times.convention}) does not describe one sweep at "
                f"the header stamp: its points lie {lo:+.3f}..{hi:+.3f} s from it, a sweep here "
                f"lasts at most {limit:.3f} s"
            )
        median = float(np.median(offsets[finite]))
        sweep = stamp + median
        if self._last_sweep is not None and sweep <= self._last_sweep:
            return self._refuse(
                f"time field '{times.field}' goes back: this sweep's median time is "
                f'{self._last_sweep - sweep:.3f} s before the previous one'
            )
        self._last_sweep = sweep
        bad = int((~finite).sum())
        if bad:
            offsets = np.where(finite, offsets, median)
        detail = f'{times.field} ({times.convention})' + (
            f', {bad} points without a time' if bad else ''
        )
        return SweepTimes(offsets, 'used', detail)

    def _refuse(self, why: str) -> SweepTimes:
        self._last_sweep = None
        return SweepTimes(None, 'ignored', why, f'not deskewing: {why}')
