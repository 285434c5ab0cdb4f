"""How firmly a tracked scan pins the pose: the information of its own registration (small_gicp's
GICP Hessian H at the solution) along each direction of translation (Zhang et al., "On
degeneracy of optimization-based state estimation problems", ICRA 2016).

The translation block's Schur complement (rotation marginalised out) is eigen-decomposed; the
weakest direction's share of its trace says what fraction of the scan's constraint holds the pose
along that axis: about 1/3 where surfaces face every way, near 0 along a bare corridor, where only
the covariance regularisation of the GICP points (normals 1e3 times firmer than the tangent
plane) holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: a direction holding less than this share of the translational information is not pinned by
#: the data: a few times the floor that small_gicp's covariance regularisation alone leaves
#: (a bare corridor: 0.19-0.26 %; boxes along its walls 0.7-1.3 %, tracked right; streets,
#: BALM, nuScenes: 3-19 %)
DEGENERATE_SHARE = 0.005


@dataclass(frozen=True)
class Constraint:
    """share: the weakest translation direction's share of the translational information (0..1/3);
    axis: (3,) that direction, a unit vector in the scan's (sensor) frame; condition: the
    strongest direction's information over the weakest's (>= 1)."""

    share: float
    axis: np.ndarray
    condition: float

    @property
    def degenerate(self) -> bool:
        return self.share < DEGENERATE_SHARE

    @classmethod
    def of(cls, hessian: np.ndarray) -> 'Constraint':
        """From GICP's (6, 6) Hessian over (rotation, translation), the perturbation applied in
        the source (scan) frame."""
        h = np.asarray(hessian, dtype=np.float64)
        h_rr, h_rt, h_tt = h[:3, :3], h[:3, 3:], h[3:, 3:]
        try:
            schur = h_tt - h_rt.T @ np.linalg.solve(h_rr, h_rt)
        except np.linalg.LinAlgError:  # no rotational information at all: nothing pinned
            return cls(0.0, np.array([1.0, 0.0, 0.0]), float('inf'))
        w, v = np.linalg.eigh(0.5 * (schur + schur.T))
        total = float(w.sum())
        if not np.isfinite(total) or total <= 0.0 or w[0] <= 0.0:
            return cls(0.0, v[:, 0], float('inf'))
        return cls(float(w[0] / total), v[:, 0], float(w[-1] / w[0]))

    def describe(self) -> str:
        a = self.axis
        k = int(np.argmax(np.abs(a)))
        return (
            f'the scan pins the pose weakly along ({a[0]:.2f}, {a[1]:.2f}, {a[2]:.2f}) in its '
            f"frame (mostly {'xyz'[k]}): {self.share:.2%} of its constraint, below "
            f'{DEGENERATE_SHARE:.1%} (a corridor, a featureless road): the pose may slide along it'
        )
