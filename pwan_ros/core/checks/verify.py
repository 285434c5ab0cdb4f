"""The self-check every registration result gets: can the result itself vouch for its pose?

A pose is judged from what it shows, with no ground truth and no knowledge of the data set.
Both clouds are first voxelised at one *judging voxel* (the size at which about
``JUDGE_POINTS`` voxels hold two or more reference points, :func:`judging_voxel`): a sensor's
own sampling pattern (lidar rings that coincide at "no motion", dense returns near the sensor)
then weighs no more than any other surface. The gate is g = 1.5 judging voxels.

* **Overlap beyond chance.** ``overlap`` is the fraction of the (voxelised) source within g of
  the reference's surfaces (its voxels holding two or more points: a stray return or a uniform
  outlier rarely shares a voxel). Spurious returns put reference points near a source point by
  chance; ``chance`` is that rate, measured at random places in the box the moved source
  occupies. ``excess = (overlap - chance) / (1 - chance)`` is the overlap the pose explains,
  which outliers cannot inflate. Below ``MIN_EXCESS_OVERLAP``: refused.
* **Held in every direction** (3-D, a result's own pose, a reference not flat to a hundredth
  of g): the reference surface's normals at the matched source points must hold every
  direction of translation with ``MIN_HELD`` points' worth (the smallest eigenvalue of the sum
  of their n n^T); a plane patch, a corridor or a pipe lets the pose slide, and the rival
  search alone missed that when the sampling's edges cost a shifted pose more than
  ``RIVAL_MARGIN`` (an open pipe turned 50 deg came back ok, 37 deg off).
* **No rival pose**. GICP (plane-aware, small_gicp), coarse to fine down to g, from starts
  around the result: moved 8 and 32 gates (``RIVAL_REACH``) along each axis and turned
  ``RIVAL_TURN_DEG`` about each axis, in 3-D further on a source only a few gates across (so
  that the turned start is distinct; 2-D: point-to-point ICP in the plane, turned about its
  normal). A pose the
  data pins down is where those starts return to. Refused, with the rival's shift and overlap,
  when a start ends where more than ``RIVAL_MARGIN`` more of the source lies on the reference
  (the result is not the fit its data shows: a slide, "no motion" kept by a sampling pattern,
  an early stop), or at a *distinct* pose (points moved by more than ``RIVAL_DISTINCT`` gates
  RMS) with at least the result's overlap minus ``RIVAL_MARGIN``, or minus
  ``RIVAL_MARGIN_POINTS`` source points when that is more (not the only fit: a plane, a
  corridor, a featureless road, a symmetric object).

``status`` is 'refused' with the reason when a test fails. The thresholds are fractions of the
source and multiples of the judging voxel, never lengths of any scene; ``bench/bench_verify.py``
validates them on every real data set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import numpy as np
from scipy.spatial import cKDTree
from scipy.spatial.transform import Rotation

from pwan_ros.geometry.voxels import voxel_grid

from ..nearest import estimate_normals
from ..preprocess import random_subset, voxel_downsample

__all__ = ['PoseCheck', 'check_pose', 'judging_voxel', 'MIN_EXCESS_OVERLAP', 'RIVAL_MARGIN']

#: refuse when less than this fraction of the source lies on the reference beyond chance
MIN_EXCESS_OVERLAP = 0.05
#: the rival search: GICP starts these many gates away along each axis and turned this much about
#: each
RIVAL_REACH = (8.0, 32.0)
RIVAL_TURN_DEG = 15.0
#: ... and at least far enough to move the source points this many gates (RMS) about the turn's
#: axis, up to RIVAL_TURN_MAX_DEG: on a source a few gates across (a round tank, a pillar, a
#: ball), 15 deg moves its points by less than RIVAL_DISTINCT gates, so a turn about a symmetry
#: axis that fits as well counted as the same pose (a cylinder came back ok turned 37 deg)
RIVAL_TURN_GATES = 4.0
RIVAL_TURN_MAX_DEG = 90.0
#: refuse when a distinct rival pose puts at least the result's overlap minus this on the reference
RIVAL_MARGIN = 0.05
#: ... or minus this many judged source points, when that is more (a few dozen points: one point
#: more or less on the reference is sampling, not fit; an 18-point plane was vouched for when its
#: rival lay one point, 5.6 %, below the result)
RIVAL_MARGIN_POINTS = 2
#: a rival is distinct when it moves the source points by more than this many gates (RMS)
RIVAL_DISTINCT = 2.0
#: the judging voxel shrinks (by 1.5x, at most MAX_REFINE times, never below half the reference's
#: sampling spacing) until random places in the source's box are within the gate of the reference
#: at most this often (a small or sparse cloud); still more often: refused (a flat source fills
#: its own box, so chance explains any overlap)
MAX_CHANCE = 0.5
MAX_REFINE = 8
#: refuse when the matched reference normals hold some direction of translation with fewer than
#: this many points' worth (the smallest eigenvalue of the sum of their n n^T; one point facing
#: that way adds 1): the pose can slide along it. As many as a pose needs judged points
#: (MIN_JUDGED); the right poses of the real pairs hold 21 (bunny 180->315, 7 % overlap) and 70
#: (nuScenes) to 900 (small_gicp's pair), a plane patch or a bare corridor under 1
MIN_HELD = 11
#: fewer judged source points (or reference surface voxels) than this cannot vouch for a pose:
#: more than the 10 neighbours each point's covariance is estimated from in the rival search (at
#: 10 points every neighbourhood is the whole cloud, small_gicp says the cloud is too small, and
#: 10-point copies came back ok turned 2-7 deg)
MIN_JUDGED = 11
#: source points used by the check (a random subset of the voxelised moved source)
CHECK_POINTS = 4000
#: GICP (the rival search, a candidate's fit) has converged when a step shifts the source by under
#: this fraction of the finest gate, at every level (small_gicp's default, 1e-3, is in the
#: caller's unit: half the scan in km); it creeps along a weakly held direction, so a coarser stop
#: leaves it short (a corridor held by one box: 1 % of each level's gate stopped 0.8 m off)
CONVERGED_GATES = 0.003
#: GICP starts of one source that a level begins within this many finest gates of each other
#: (RMS) end where the first ended (:class:`GicpPaths`): far below a gate, so both have the same
#: correspondences and fixed point, and above the stop's own spread (CONVERGED_GATES)
MERGE_GATES = 0.1
#: the judging voxel leaves at most this many voxels with two or more reference points
#: (:func:`judging_voxel`)
JUDGE_POINTS = 10000


@dataclass(frozen=True)
class PoseCheck:
    """Outcome of :func:`check_pose`, lengths in caller units. status: 'ok' | 'refused'; reason:
    why refused ('' if ok). overlap: fraction of the voxelised source within ``gate`` of the
    voxelised reference; chance: the fraction a point off every surface gets by chance
    (outliers, clutter); excess: (overlap - chance) / (1 - chance). rival_overlap / rival_shift:
    overlap of the best distinct pose GICP reaches from starts around the result, and how far
    (RMS) it moves the source points (nan: every start returned to the result). rival_transform:
    (d+1, d+1) that moves the result's source points onto the rival pose (None without one).
    voxel: the judging voxel; gate: 1.5 voxels."""

    status: str
    reason: str
    overlap: float
    chance: float
    excess: float
    rival_overlap: float
    rival_shift: float
    voxel: float
    gate: float
    rival_transform: Optional[np.ndarray] = None

    @property
    def rival_better(self) -> bool:
        """A distinct pose fits clearly better (by more than ``RIVAL_MARGIN``)."""
        return (
            self.rival_transform is not None and self.rival_overlap > self.overlap + RIVAL_MARGIN
        )

    def as_dict(self) -> dict:
        """The measurements as JSON-ready values (no transform)."""
        out = {}
        for k, v in self.__dict__.items():
            if k == 'rival_transform':
                continue
            out[k] = (
                (None if not np.isfinite(v) else round(float(v), 6)) if isinstance(v, float) else v
            )
        return out


def _shared_voxels(points: np.ndarray, voxel: float) -> int:
    """Occupied voxels of edge ``voxel`` that hold at least two of ``points`` (n, d)."""
    return int(voxel_grid(points, voxel, origin=points.min(axis=0)).shared.sum())


def _surface(points: np.ndarray, voxel: float) -> np.ndarray:
    """Centroids (k, d) of the voxels of edge ``voxel`` holding two or more of ``points`` (n, d):
    the surfaces, without the returns that share a voxel with nothing (uniform outliers, stray
    returns). All occupied voxels' centroids when fewer than 10 voxels are shared."""
    grid = voxel_grid(points, voxel, origin=points.min(axis=0))
    shared = grid.shared
    return grid.centroids[shared] if shared.sum() >= 10 else grid.centroids


def _finest_voxel(points: np.ndarray, target: int = JUDGE_POINTS) -> float:
    """Half the lower-quartile nearest-neighbour spacing of ``points`` (n, d) (a quartile:
    outliers cannot raise it): below it, hardly any of the surfaces' points share a voxel."""
    extent = float(np.linalg.norm(np.ptp(points, axis=0)))
    sample = random_subset(points, 4 * target, np.random.default_rng(0))
    nn = np.sort(cKDTree(points).query(sample, k=2)[0][:, 1])
    return max(0.5 * float(nn[len(nn) // 4]), 1e-6 * extent, 1e-12)


def judging_voxel(reference: np.ndarray, target: int = JUDGE_POINTS) -> float:
    """The judging voxel (caller units) of ``reference`` (m, d): the smallest voxel at which the
    number of voxels holding two or more points is falling and at most ``target`` (half the
    spacing when none is, below a tenth of the extent).

    Surfaces fill voxels many points to one; uniform outliers rarely share a voxel while it is
    small, so they do not count. The count rises with the voxel while the surfaces' points start
    sharing voxels and falls as voxels merge (~ voxel^-(d-1)); outliers only add a second rise at
    coarse voxels. The voxel grows from the spacing in steps of 1.5x and stops on the surfaces'
    falling branch, so outliers cannot coarsen the judgement."""
    pts = np.asarray(reference, dtype=np.float64)
    extent = float(np.linalg.norm(np.ptp(pts, axis=0)))
    floor = _finest_voxel(pts, target)
    voxel, prev = floor, 0
    while voxel < 0.1 * extent:
        voxel *= 1.5
        n = _shared_voxels(pts, voxel)
        if n < prev and n <= target:
            return voxel
        prev = n
    return floor


def check_pose(
    moved: np.ndarray,
    reference: np.ndarray,
    voxel: Optional[float] = None,
    seed: int = 0,
    max_points: int = CHECK_POINTS,
    rivals: bool = True,
    admissible: Optional[Callable[[np.ndarray], bool]] = None,
) -> PoseCheck:
    """Check a registration result: ``moved`` (n, d) the source points mapped into the reference
    frame, ``reference`` (m, d), caller units. voxel: the judging voxel (None:
    :func:`judging_voxel` of the reference). rivals: run the rival search (and, in 3-D, the
    constraint test; in 3-D the turned starts are as wide as a small source needs, module
    docstring). admissible: optional test of a rival, given the (d+1, d+1) transform that moves
    ``moved`` onto it (e.g. the sensors' free space); rivals it rejects do not count."""
    moved = np.asarray(moved, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    voxel = judging_voxel(reference) if voxel is None else float(voxel)
    source, kept = _near(moved, reference)
    if not len(source):
        nan = float('nan')
        reason = 'no source point lies near the reference'
        return PoseCheck('refused', reason, 0.0, 0.0, 0.0, nan, nan, voxel, 1.5 * voxel)
    j = _judged(source, reference, voxel, seed, max_points)
    j = j._replace(overlap=j.overlap * kept)
    excess = (j.overlap - j.chance) / (1.0 - j.chance) if j.chance < 1.0 else 0.0

    def verdict(reason='', rival=None) -> PoseCheck:
        """The check's outcome ('' reason: ok); rival: (label, overlap, shift, transform)."""
        _, r_overlap, shift, r_t = rival or (None, float('nan'), float('nan'), None)
        status = 'refused' if reason else 'ok'
        return PoseCheck(
            status, reason, j.overlap, j.chance, excess, r_overlap, shift, j.voxel, j.gate, r_t
        )

    reason = _too_little(j, excess)
    if reason or not rivals:
        return verdict(reason)
    wide = j.moved.shape[1] == 3
    if wide and not _flat(j.tree.data, j.gate):
        held = _constraint(j.moved[j.matched], j.tree)
        if held < MIN_HELD:
            return verdict(
                f'the overlap leaves a direction free to slide: the matched reference normals '
                f"hold it with {held:.1f} points' worth (need {MIN_HELD}: a plane, a corridor, "
                'a pipe)'
            )
    center = j.moved[j.matched].mean(axis=0)
    better, rival = (
        None if r is None else (r[0], r[1] * kept, r[2], r[3])
        for r in _rivals(j.moved, j.tree, j.gate, center, admissible, wide)
    )
    return verdict(*_rival_verdict(j, better, rival))


class _Judged(NamedTuple):
    """The sets a pose is judged on: ``voxel`` (refined), ``gate`` = 1.5 voxels, ``tree`` of the
    reference's surfaces, ``moved`` the voxelised source (at most ``max_points``), ``matched``
    which of them lie within the gate, ``overlap`` their fraction, ``chance`` the fraction of
    random places in the source's box within the gate."""

    voxel: float
    gate: float
    tree: cKDTree
    moved: np.ndarray
    matched: np.ndarray
    overlap: float
    chance: float


def _near(moved: np.ndarray, reference: np.ndarray) -> tuple:
    """(the finite source points near the reference, their fraction of all). Points beyond the
    reference's box by more than its size (far glitches) cannot overlap; its largest side on
    every axis (a flat reference, e.g. a 2-D scan stored with z = 0, has a side of 0 that
    rounding of the moved points' z would leave)."""
    lo, hi = reference.min(axis=0), reference.max(axis=0)
    reach = float((hi - lo).max())
    near = (
        np.isfinite(moved).all(axis=1)
        & (moved >= lo - reach).all(axis=1)
        & (moved <= hi + reach).all(axis=1)
    )
    return moved[near], near.sum() / max(len(moved), 1)


def _judged(
    source: np.ndarray, reference: np.ndarray, voxel: float, seed: int, max_points: int
) -> _Judged:
    """Both sets at the judging voxel; a gate most of the source's box lies within tells nothing,
    so the voxel shrinks by 1.5x (at most ``MAX_REFINE`` times) while the reference's surfaces
    still fill it."""
    rng = np.random.default_rng(seed)
    finest = None
    for attempt in range(MAX_REFINE):
        if attempt:
            finest = _finest_voxel(reference) if finest is None else finest
            if voxel / 1.5 < finest:
                break
            voxel /= 1.5
        g = 1.5 * voxel
        tree = cKDTree(_surface(reference, voxel))
        moved = voxel_downsample(source, voxel)
        if len(moved) > max_points:
            moved = moved[
                np.random.default_rng(seed).choice(len(moved), max_points, replace=False)
            ]
        d0, _ = tree.query(moved, k=1, distance_upper_bound=g)
        probes = rng.uniform(moved.min(axis=0), moved.max(axis=0), size=moved.shape)
        dp, _ = tree.query(probes, k=1, distance_upper_bound=g)
        chance = float(np.isfinite(dp).mean())
        if chance <= MAX_CHANCE:
            break
    matched = np.isfinite(d0)
    return _Judged(voxel, g, tree, moved, matched, float(matched.mean()), chance)


def _too_little(j: _Judged, excess: float) -> str:
    """Why the overlap cannot vouch for the pose ('' when it can)."""
    g = j.gate
    if j.chance > MAX_CHANCE:
        return (
            f"random places in the source's box lie within {g:.3g} of the reference "
            f'{j.chance:.0%} of the time, even at the finest voxel its sampling allows: the '
            'overlap cannot tell one pose from another (a flat or tiny source)'
        )
    if excess < MIN_EXCESS_OVERLAP:
        return (
            f'only {j.overlap:.0%} of the source lies within {g:.3g} of the reference '
            f'({j.chance:.0%} would by chance)'
        )
    if min(len(j.moved), j.tree.n) < MIN_JUDGED:
        return (
            f'{len(j.moved)} source points and {j.tree.n} reference surface voxels at '
            f'the judging voxel {j.voxel:.3g}: too few to vouch for a pose (need {MIN_JUDGED})'
        )
    return ''


def _rival_verdict(j: _Judged, better, rival) -> tuple:
    """(reason, rival) of the rival test: a pose the starts reach that fits clearly better, or a
    distinct one that fits about as well, refuses; else ('', the best distinct rival)."""
    g, overlap = j.gate, j.overlap
    if better is not None and better[1] > overlap + RIVAL_MARGIN:
        label, rival_overlap, shift, _ = better
        return (
            f'a pose {shift:.3g} away ({label}) fits better: {rival_overlap:.0%} of the '
            f'source within {g:.3g} of the reference against {overlap:.0%}',
            better,
        )
    if rival is not None and rival[1] >= overlap - max(
        RIVAL_MARGIN, RIVAL_MARGIN_POINTS / len(j.moved)
    ):
        label, rival_overlap, shift, _ = rival
        return (
            f'a pose {shift:.3g} away ({label}) fits about as well (the data does not pin '
            f'the pose down): {rival_overlap:.0%} of the source within {g:.3g} of the reference '
            f'against {overlap:.0%}',
            rival,
        )
    return '', rival


def _rivals(
    moved: np.ndarray,
    reference_tree: cKDTree,
    g: float,
    center: np.ndarray,
    admissible: Optional[Callable[[np.ndarray], bool]] = None,
    wide: bool = False,
):
    """GICP from starts around the result (module docstring); ``wide``: turns as wide as a small
    source needs (:func:`_turn_deg`). Returns (better, rival): the pose
    of highest overlap any start reaches, and the best *distinct* one (points moved by more than
    ``RIVAL_DISTINCT`` gates RMS), each (start in words, overlap, RMS shift of the points, (d+1,
    d+1) transform from the result) or None. 2-D sets run in the plane z = 0 with point-to-point
    ICP (a curve's covariances leave a plane undefined), shifted along x and y and turned about z.
    The searches run with ``center`` at the origin (a pose's increments turn about the origin: at
    map coordinates, e.g. 4e6 m out, turns and shifts would be one ill-conditioned solve), so the
    verdict does not depend on where the data lie. Single-threaded: bit-reproducible."""
    import small_gicp

    dim = moved.shape[1]
    kind = 'GICP' if dim == 3 else 'ICP'
    center3 = _in_space(center[None])[0]
    target = small_gicp.PointCloud(_in_space(reference_tree.data) - center3)
    target_tree = small_gicp.KdTree(target, num_threads=1)
    source_points = _in_space(moved) - center3
    source = small_gicp.PointCloud(source_points)
    paths = GicpPaths(source_points)
    if kind == 'GICP':
        small_gicp.estimate_covariances(target, target_tree, num_neighbors=10, num_threads=1)
        small_gicp.estimate_covariances(
            source, small_gicp.KdTree(source, num_threads=1), num_neighbors=10, num_threads=1
        )
    starts = []
    for k in range(3):
        for sign in (1.0, -1.0):
            axis = 'xyz'[k] + ('+' if sign > 0 else '-')
            if k < dim:
                for reach in RIVAL_REACH:
                    shifted = np.eye(4)
                    shifted[k, 3] = sign * reach * g
                    label = f'{kind} from {reach * g:.3g} along {axis}'
                    starts.append((label, shifted, reach * g))
            if dim == 2 and k < 2:  # in the plane: turns about z only
                continue
            angle = _turn_deg(moved - center, k, g) if wide else RIVAL_TURN_DEG
            turned = np.eye(4)
            turned[:3, :3] = Rotation.from_rotvec(
                np.eye(3)[k] * sign * np.radians(angle)
            ).as_matrix()  # about the center
            label = f'{kind} from a {angle:.3g} deg turn about {axis}'
            starts.append((label, turned, RIVAL_REACH[0] * g))
    better = rival = None
    for label, t, reach in starts:
        gates = [g]
        while gates[0] * 2.0 <= reach:
            gates.insert(0, gates[0] * 2.0)
        t = coarse_to_fine(target, source, target_tree, t, kind, gates, paths)
        t = t.copy()
        t[:3, 3] += center3 - t[:3, :3] @ center3  # back to the caller's frame
        t = _in_plane(t) if dim == 2 else t
        if not np.isfinite(t).all() or (admissible is not None and not admissible(t)):
            continue
        alt = moved @ t[:dim, :dim].T + t[:dim, dim]
        shift = float(np.sqrt(((alt - moved) ** 2).sum(axis=1).mean()))
        d, _ = reference_tree.query(alt, k=1, distance_upper_bound=g)
        found = (label, float(np.isfinite(d).mean()), shift, t)
        if better is None or found[1] > better[1]:
            better = found
        if shift > RIVAL_DISTINCT * g and (rival is None or found[1] > rival[1]):
            rival = found
    return better, rival


def _flat(points: np.ndarray, g: float) -> bool:
    """Whether 3-D ``points`` lie in one plane to a hundredth of the gate ``g``: a 2-D scan
    stored with z = 0, whose PCA normals are undefined (a curve in a plane has two normal
    directions); such a set leaving its plane loses its overlap, so no direction is free."""
    centred = points - points.mean(axis=0)
    return bool(np.linalg.svd(centred, compute_uv=False)[-1] / np.sqrt(len(points)) < 0.01 * g)


def _constraint(matched: np.ndarray, reference_tree: cKDTree) -> float:
    """How well the overlap holds the translation: the smallest eigenvalue of the sum of n n^T
    of the reference surface's normals (PCA of 10 neighbours) at the nearest neighbours of the
    ``matched`` source points (k, 3), in points' worth. 0: every matched normal is orthogonal to
    one direction, along which the pose can slide; k / 3 at most."""
    if len(matched) < 3:
        return 0.0
    _, j = reference_tree.query(matched, k=1)
    n = estimate_normals(reference_tree.data, reference_tree, k=10)[j]
    return float(max(np.linalg.eigvalsh(n.T @ n)[0], 0.0))


def _turn_deg(offsets: np.ndarray, axis: int, g: float) -> float:
    """The rival turn (degrees) about ``axis`` (0, 1, 2) for 3-D points at ``offsets`` (n, 3)
    from the turn's center: RIVAL_TURN_DEG, or the turn that moves them RIVAL_TURN_GATES gates
    ``g`` (RMS) when that is larger (a chord of 2 r sin(a / 2) at RMS distance r from the axis),
    at most RIVAL_TURN_MAX_DEG."""
    across = np.delete(offsets, axis, axis=1)
    r = float(np.sqrt((across**2).sum(axis=1).mean()))
    need = RIVAL_TURN_GATES * g / (2.0 * r) if r > 0 else 1.0
    angle = np.degrees(2.0 * np.arcsin(min(need, 1.0)))
    return float(min(max(RIVAL_TURN_DEG, angle), RIVAL_TURN_MAX_DEG))


def _in_space(points: np.ndarray) -> np.ndarray:
    """(n, 3) float64 contiguous points for small_gicp: 2-D points in the plane z = 0."""
    points = np.asarray(points, dtype=np.float64)
    if points.shape[1] == 2:
        points = np.hstack((points, np.zeros((len(points), 1))))
    return np.ascontiguousarray(points)


def _in_plane(t: np.ndarray) -> np.ndarray:
    """The (3, 3) plane transform of a (4, 4) one that keeps z = 0 (ICP on points in that plane:
    its out-of-plane parts are rounding): the rotation about z re-orthonormalised, x-y shift."""
    angle = np.arctan2(t[1, 0] - t[0, 1], t[0, 0] + t[1, 1])
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, t[0, 3]], [s, c, t[1, 3]], [0.0, 0.0, 1.0]])


class GicpPaths:
    """The coarse-to-fine GICP levels run so far on one prepared source (its points ``points``
    (n, 3), as the GICP source cloud holds them): a start within ``MERGE_GATES`` finest gates
    (RMS over those points) of a start the same level already ran continues as that one did.
    Starts that return to one pose (most of a rival search's, the global search's candidates of
    one fit) then share the rest of their path instead of each converging to it again."""

    def __init__(self, points: np.ndarray):
        hom = np.hstack((points, np.ones((len(points), 1))))
        self._moments = hom.T @ hom / max(len(points), 1)  # (4, 4) second moments
        self._ran: dict = {}  # gate -> [(start, end)]

    def apart(self, a: np.ndarray, b: np.ndarray) -> float:
        """RMS distance between the points moved by (4, 4) ``a`` and by ``b``."""
        d = (a - b)[:3]
        return float(np.sqrt(max(np.trace(d @ self._moments @ d.T), 0.0)))

    def level(self, gate: float, start: np.ndarray, finest: float, run: Callable) -> np.ndarray:
        """The end of level ``gate`` from ``start``: ``run(start)``, or the end of an earlier
        start of this level within ``MERGE_GATES`` x ``finest``."""
        ran = self._ran.setdefault(gate, [])
        near = MERGE_GATES * finest
        for begun, end in ran:
            if self.apart(begun, start) <= near:
                return end.copy()
        end = run(start)
        ran.append((start.copy(), end.copy()))
        return end


def coarse_to_fine(
    target, source, tree, t: np.ndarray, kind: str, gates, paths: Optional[GicpPaths] = None
) -> np.ndarray:
    """small_gicp ``kind`` ('GICP' | 'ICP') of the prepared ``source`` to ``target`` (its KD
    ``tree``) from (4, 4) ``t``, once per correspondence gate of ``gates`` (coarse to fine, 30
    iterations each, one thread, converged when a step moves the source by under
    ``CONVERGED_GATES`` of the finest gate: the same stop in any unit); the (4, 4)
    ``T_target_source``. paths: the levels already run on this source (:class:`GicpPaths`),
    shared by starts that meet."""
    import small_gicp

    finest = min(gates)

    def run(gate):
        def level(start):
            res = small_gicp.align(
                target,
                source,
                tree,
                init_T_target_source=start,
                registration_type=kind,
                max_correspondence_distance=gate,
                num_threads=1,
                max_iterations=30,
                translation_epsilon=CONVERGED_GATES * finest,
            )
            return np.asarray(res.T_target_source, dtype=np.float64)

        return level

    for gate in gates:
        if paths is None:
            t = run(gate)(t)
        else:
            t = paths.level(gate, np.asarray(t, dtype=np.float64), finest, run(gate))
    return t
