"""Per-point acquisition times of a LiDAR scan, from the conventions of the common drivers.

Spinning LiDARs stamp every point; drivers disagree on the field name, type, unit and origin:

=========================  ==============  =========================================
driver (field)             type            meaning
=========================  ==============  =========================================
Ouster (``t``)             uint32          ns since the scan's header stamp
Velodyne (``time``)        float32         s relative to the header stamp (may be < 0)
Hesai (``timestamp``)      float64         absolute s (epoch)
Livox (``offset_time``)    uint32          ns since the header stamp
others (``time_stamp``)    int / float     any of the above
=========================  ==============  =========================================

:func:`point_times` finds the field and returns offsets in seconds relative to the header stamp.
The convention is read from the values, not assumed from the driver: values within 10 s of the
header stamp (in s or ns, and nearer to it than to zero) are absolute; otherwise integers are
nanoseconds and floats seconds, unless a float field spans more than a second (no sweep does), then
nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ['TIME_FIELDS', 'PointTimes', 'PointTimesError', 'point_times']

#: per-point time field names, in the order they are looked for
TIME_FIELDS = ('t', 'time', 'timestamp', 'offset_time', 'time_stamp')
#: a sweep lasts less than this (s); longer spans are another unit or a broken field
MAX_SWEEP_S = 1.0
#: values this close to the header stamp (s) are absolute times
ABSOLUTE_WINDOW_S = 10.0


class PointTimesError(ValueError):
    """A time field whose values fit no known convention (message names the field)."""


@dataclass(frozen=True)
class PointTimes:
    """offsets: (N,) float64 seconds of each point relative to the header stamp; field: the field
    read; convention: how it was read (e.g. 'relative ns')."""

    offsets: np.ndarray
    field: str
    convention: str


def point_times(extras: np.ndarray, stamp: float) -> PointTimes | None:
    """Per-point offsets (s) from the header ``stamp`` (s) of the time field in ``extras`` (the
    structured non-xyz fields of a decoded cloud, ``DecodedCloud.extras``); None when the cloud
    has no time field. Raises :class:`PointTimesError` when the field fits no convention."""
    names = extras.dtype.names or ()
    field = next((n for n in TIME_FIELDS if n in names), None)
    if field is None:
        return None
    raw = extras[field]
    if raw.ndim != 1:
        raise PointTimesError(
            f"time field '{field}' has {raw.shape[1]} values per point, expected 1"
        )
    if raw.size == 0:
        return PointTimes(np.zeros(0), field, 'empty')
    values = raw.astype(np.float64)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        raise PointTimesError(f"time field '{field}' holds no finite value")
    centre = float(np.median(finite))
    span = float(finite.max() - finite.min())
    integer = raw.dtype.kind in 'iu'

    def absolute(c: float) -> bool:  # nearer the stamp than zero, and within the window
        return abs(c - stamp) < min(ABSOLUTE_WINDOW_S, abs(c))

    if absolute(centre * 1e-9):
        offsets, convention = (values - stamp * 1e9) * 1e-9, 'absolute ns'
    elif absolute(centre):
        offsets, convention = values - stamp, 'absolute s'
    elif integer or span > MAX_SWEEP_S:
        offsets, convention = values * 1e-9, 'relative ns'
    else:
        offsets, convention = values, 'relative s'
    kept = offsets[np.isfinite(offsets)]
    if (
        float(kept.max() - kept.min()) > MAX_SWEEP_S
        or float(np.abs(kept).max()) > ABSOLUTE_WINDOW_S
    ):
        raise PointTimesError(
            f"time field '{field}' ({raw.dtype}) fits no known convention: read as "
            f'{convention}, its points span {kept.min():.3g}..{kept.max():.3g} s around the '
            'header stamp'
        )
    return PointTimes(offsets, field, convention)
