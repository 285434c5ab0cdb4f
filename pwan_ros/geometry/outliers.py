"""The package's one far-outlier rule (numpy only), used by the core's input cleaning and the
odometry's scan filter.

A point is a *far outlier* when it lies farther than :data:`FAR_OUTLIER_FACTOR` median spreads
from the coordinate-wise median, the spread being the median distance of the points to that
median. Both statistics are robust (up to half the points replaced move the median by at most
the spread) and neither depends on the frame: the rule works on a scan in its sensor frame and on
a point set in any caller frame alike.

The rule exists for driver glitches (returns written at 1e19 m or 3e38 m): a few such points
would dominate a centroid and an RMS scale and overflow voxel keys and float32 network inputs.
On real scans it drops nothing: over the 39 nuScenes keyframes and the 10 BALM scans the farthest
return lies at most 22 and 35 median spreads out.
"""

from __future__ import annotations

import numpy as np

__all__ = ['FAR_OUTLIER_FACTOR', 'far_outliers']

#: far outliers lie beyond this many median spreads from the coordinate-wise median
FAR_OUTLIER_FACTOR = 50.0


def far_outliers(points: np.ndarray, factor: float = FAR_OUTLIER_FACTOR) -> np.ndarray:
    """(n,) bool: rows of finite ``points`` (n, d) farther than ``factor`` x the median spread from
    the coordinate-wise median (see the module docstring). Exact duplicates of the median do not
    count in the spread; a set whose points all sit on the median has no outliers."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    # per column (numpy's axis-0 reductions of an (n, d) array are slower); squares summed in
    # column order, as ((pts - median) ** 2).sum(axis=1) does
    sq = None
    for i in range(pts.shape[1]):
        c = pts[:, i] - float(np.median(pts[:, i]))
        sq = c * c if sq is None else sq + c * c
    r = np.sqrt(sq)
    pos = r[r > 0]
    if pos.size == 0:
        return np.zeros(pts.shape[0], dtype=bool)
    return r > factor * float(np.median(pos))
