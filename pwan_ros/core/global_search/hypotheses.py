"""Candidate poses for the global search (source -> reference, caller units): FPFH features
(Open3D) matched mutually and a vectorised RANSAC keeping distinct poses by inlier support,
seeded runs of Open3D's FGR, KISS-Matcher when installed, the identity prior, and PWAN's own
rotation starts translated by votes. :mod:`choose` chooses among them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from ..checks.verify import judging_voxel
from ..config import GlobalConfig
from ..local.starts import start_rotations
from ..local.votes import start_translations
from ..preprocess import median_spacing

__all__ = [
    'FGR_RUNS',
    'ROTATION_KEEP',
    'Hypothesis',
    'pose_distance',
    'voxelised',
    'feature_normals',
    'feature_hypotheses',
    'rotation_hypotheses',
]

#: seeded runs of Open3D's FGR (distinct poses become candidates)
FGR_RUNS = 4


@dataclass(frozen=True)
class Hypothesis:
    """A candidate pose: transform (4, 4) source -> reference; support: feature inliers (0 for
    non-feature candidates); origin: 'ransac' | 'ransac_wide' | 'ransac_open3d' |
    'ransac_surfaces' | 'fgr' | 'kiss_matcher' | 'prior' | 'rotation'."""

    transform: np.ndarray
    support: int
    origin: str


def pose_distance(a: np.ndarray, b: np.ndarray, points: np.ndarray) -> float:
    """RMS distance (caller units) between ``points`` (n, 3) moved by poses a and b."""
    pa = points @ a[:3, :3].T + a[:3, 3]
    pb = points @ b[:3, :3].T + b[:3, 3]
    return float(np.sqrt(np.mean(np.sum((pa - pb) ** 2, axis=1))))


# --------------------------------------------------------------------------- features


def _open3d():
    """open3d, printing only its errors: its warnings (FGR's 'Not enough correspondences') go to
    stdout, where they would break ``pwan_register --json``."""
    import open3d as o3d

    o3d.utility.set_verbosity_level(o3d.utility.VerbosityLevel.Error)
    return o3d


def _pcd(points: np.ndarray):
    """An Open3D point cloud of (n, 3) points."""
    o3d = _open3d()
    return o3d.geometry.PointCloud(
        o3d.utility.Vector3dVector(np.asarray(points, dtype=np.float64))
    )


def _downsample(points: np.ndarray, target: int):
    """(voxel, downsampled Open3D cloud): the voxel size leaving about ``target`` points, or, for
    a cloud with fewer, half its median point spacing (every point kept)."""
    pcd = _pcd(points)
    extent = float(np.linalg.norm(points.max(0) - points.min(0)))
    floor = max(0.5 * median_spacing(points), 1e-6 * extent)  # below it every point is kept
    voxel = max(extent / 100.0, floor)
    for _ in range(30):
        down = pcd.voxel_down_sample(voxel)
        n = len(down.points)
        if 0.7 * target <= n <= 1.4 * target or (n < target and voxel <= floor):
            break
        voxel = max(voxel * (n / target) ** 0.5, floor)  # surface points scale ~ 1 / voxel^2
    return voxel, down


def _feature_clouds(source: np.ndarray, reference: np.ndarray, target: int) -> tuple:
    """(voxel, source cloud, reference cloud): both sets downsampled at one voxel, the coarser of
    the two that leave about ``target`` points each (:func:`_downsample`)."""
    vs, ds = _downsample(source, target)
    vr, dr = _downsample(reference, target)
    voxel = max(vs, vr)
    if voxel != vs:
        ds = _pcd(source).voxel_down_sample(voxel)
    if voxel != vr:
        dr = _pcd(reference).voxel_down_sample(voxel)
    return voxel, ds, dr


def _o3d_features(features: np.ndarray):
    """Open3D's Feature of (n, 33) FPFH rows."""
    out = _open3d().pipelines.registration.Feature()
    out.data = features.T.copy()
    return out


def on_surfaces(points: np.ndarray) -> np.ndarray:
    """The (k, 3) of ``points`` (n, 3) that share a voxel of the judging voxel
    (:func:`checks.verify.judging_voxel`: set by the surfaces, which fill a voxel many points to
    one) with another point; all of them when fewer than 10 do. Uniform outliers rarely share
    such a voxel (50 % / 100 % of a 3DMatch fragment's points in its box: 9 % / 17 % of them
    do), nor do a sparse lidar's far returns."""
    from pwan_ros.geometry.voxels import voxel_grid

    grid = voxel_grid(points, judging_voxel(points), origin=points.min(axis=0))
    keep = grid.counts[grid.inverse] >= 2
    return points[keep] if keep.sum() >= 10 else points


def voxelised(points: np.ndarray, voxel: float) -> np.ndarray:
    """(k, 3) centroids of the occupied voxels of edge ``voxel`` of (n, 3) points (caller units),
    from Open3D's ``voxel_down_sample`` like the feature clouds: the centroids are those of
    :func:`pwan_ros.geometry.voxels.voxel_grid` with the origin half a voxel below the points'
    minimum, bit for bit, but in Open3D's (hash map) order, which the global search's seeded
    samples of these clouds depend on."""
    return np.asarray(_pcd(points).voxel_down_sample(voxel).points)


def _fpfh(down, voxel: float) -> np.ndarray:
    """(n, 33) FPFH features of the Open3D cloud ``down`` (normals from 2 voxels, features from 5),
    computed in voxel units about the cloud's mean: at map coordinates (1e5 m out) the normals'
    covariances lost their digits and 70 % of the features changed."""
    o3d = _open3d()
    points = np.asarray(down.points)
    local = _pcd((points - points.mean(axis=0)) / voxel)
    local.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2.0, max_nn=30))
    feat = o3d.pipelines.registration.compute_fpfh_feature(
        local, o3d.geometry.KDTreeSearchParamHybrid(radius=5.0, max_nn=100)
    )
    return np.asarray(feat.data).T.copy()


def feature_normals(points: np.ndarray, voxel: float) -> np.ndarray:
    """(n, 3) unit normals of (n, 3) points at ``voxel`` resolution (as the features use; in
    voxel units about their mean)."""
    o3d = _open3d()
    pcd = _pcd((points - points.mean(axis=0)) / voxel)
    pcd.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2.0, max_nn=30))
    return np.asarray(pcd.normals)


def _mutual_matches(fs: np.ndarray, fr: np.ndarray) -> np.ndarray:
    """(k, 2) index pairs (source, reference) that are mutual nearest neighbours in feature
    space."""
    _, s2r = cKDTree(fr).query(fs, k=1)
    _, r2s = cKDTree(fs).query(fr, k=1)
    i = np.arange(len(fs))
    keep = r2s[s2r] == i
    return np.stack((i[keep], s2r[keep]), 1)


def _kabsch_batch(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(B, 4, 4) rigid transforms mapping p (B, k, 3) onto q (B, k, 3) (least squares)."""
    pc, qc = p.mean(1, keepdims=True), q.mean(1, keepdims=True)
    h = np.einsum('bki,bkj->bij', p - pc, q - qc)
    u, _, vt = np.linalg.svd(h)
    d = np.sign(
        np.linalg.det(np.einsum('bij,bjk->bik', vt.transpose(0, 2, 1), u.transpose(0, 2, 1)))
    )
    fix = np.ones((len(p), 3))
    fix[:, 2] = d
    r = np.einsum('bij,bj,bkj->bik', vt.transpose(0, 2, 1), fix, u)
    out = np.tile(np.eye(4), (len(p), 1, 1))
    out[:, :3, :3] = r
    out[:, :3, 3] = qc[:, 0] - np.einsum('bij,bj->bi', r, pc[:, 0])
    return out


#: two matches agree as a rigid motion would keep them when the shorter of their two lengths
#: (source side, reference side) is at least this fraction of the longer (Open3D's edge checker)
EDGE_RATIO = 0.9
#: matches the second and third match of a guided sample are drawn from (all of them up to this
#: many, else a random subset): bounds the compatibility table to n x 4096
PARTNER_POOL = 4096


def _compatible(a: np.ndarray, b: np.ndarray, inlier: float, pool: np.ndarray, chunk: int = 128):
    """(n, p) bool: whether match i (a_i, b_i) and match pool[c] agree as a rigid motion keeps
    them: lengths |a_i - a_j| and |b_i - b_j| within :data:`EDGE_RATIO` and longer than
    ``inlier`` (a well-conditioned edge); a (n, 3), b (n, 3), pool (p,) match indices. Compared
    squared, in row blocks (0.05 s for 3000 x 3000)."""
    ap, bp = a[pool], b[pool]
    out = np.empty((a.shape[0], pool.size), dtype=bool)
    ratio2, inlier2 = EDGE_RATIO**2, inlier * inlier
    for s in range(0, a.shape[0], chunk):
        la = cdist(a[s : s + chunk], ap, 'sqeuclidean')
        lb = cdist(b[s : s + chunk], bp, 'sqeuclidean')
        out[s : s + chunk] = (np.minimum(la, lb) >= ratio2 * np.maximum(la, lb)) & (la > inlier2)
    return out


def _triplets(
    comp: np.ndarray, pool: np.ndarray, count: int, rng: np.random.Generator
) -> np.ndarray:
    """(k, 3) samples of match indices whose three pairs are all compatible (``comp``, from
    :func:`_compatible` with ``pool``), k <= ``count``: i uniform among the matches with two
    compatible partners, j and k uniform among i's compatible partners, kept when j and k are
    compatible too. Guided this way, a sample of true matches is drawn about n / deg(i) times
    more often per partner than by uniform draws (with 2 % true matches, as in a room seen at
    30 % overlap, uniform triplets are all true once in ~100k draws)."""
    deg = comp.sum(1)
    first = np.flatnonzero(deg >= 2)
    if first.size == 0:
        return np.empty((0, 3), dtype=np.int64)
    cols = np.nonzero(comp)[1]  # row-major: the compatible partners of row i are a run of cols
    off = np.concatenate(([0], np.cumsum(deg)[:-1]))
    i = first[rng.integers(0, first.size, size=count)]
    jc = cols[off[i] + (rng.random(count) * deg[i]).astype(np.int64)]
    kc = cols[off[i] + (rng.random(count) * deg[i]).astype(np.int64)]
    j, k = pool[jc], pool[kc]
    ok = (jc != kc) & comp[j, kc]
    return np.stack((i[ok], j[ok], k[ok]), 1)


def _inliers(poses: np.ndarray, a: np.ndarray, b: np.ndarray, inlier: float) -> np.ndarray:
    """(B,) number of matches (a_i, b_i) within ``inlier`` after each pose (B, 4, 4), in blocks
    of about 2M match evaluations."""
    step = max(1, 2_000_000 // max(1, a.shape[0]))
    out = np.empty(poses.shape[0], dtype=np.int64)
    for s in range(0, poses.shape[0], step):
        p = poses[s : s + step]
        diff = np.matmul(a[None], p[:, :3, :3].transpose(0, 2, 1)) + p[:, None, :3, 3]
        diff -= b  # (B, n, 3): a batched matmul, several times faster than the einsum
        out[s : s + step] = (np.einsum('bni,bni->bn', diff, diff) < inlier * inlier).sum(1)
    return out


def _ransac(
    ps: np.ndarray,
    pr: np.ndarray,
    matches: np.ndarray,
    inlier: float,
    iterations: int,
    keep: int,
    rng: np.random.Generator,
) -> List[Hypothesis]:
    """The ``keep`` best distinct poses by inlier count (matches within ``inlier`` after the pose),
    each re-estimated on its inliers. ``iterations`` 3-match samples are drawn guided by length
    compatibility (:func:`_triplets`); those whose three pairs agree are solved and scored."""
    if len(matches) < 3:
        return []
    a, b = ps[matches[:, 0]], pr[matches[:, 1]]
    n = len(matches)
    pool = (
        np.arange(n)
        if n <= PARTNER_POOL
        else np.sort(rng.choice(n, size=PARTNER_POOL, replace=False))
    )
    comp = _compatible(a, b, inlier, pool)
    scored = []
    batch = 2000
    for start in range(0, iterations, batch):
        idx = _triplets(comp, pool, min(batch, iterations - start), rng)
        if not len(idx):
            continue
        poses = _kabsch_batch(a[idx], b[idx])
        count = _inliers(poses, a, b, inlier)
        top = np.argsort(-count, kind='stable')[: 4 * keep]
        scored.extend((int(count[t]), poses[t]) for t in top)
    scored.sort(key=lambda c: -c[0])
    out: List[Hypothesis] = []
    for count, pose in scored:
        if count < 3 or len(out) == keep:
            break
        moved = a @ pose[:3, :3].T + pose[:3, 3]
        inl = np.sum((moved - b) ** 2, axis=1) < inlier * inlier
        refit = _kabsch_batch(a[inl][None], b[inl][None])[0] if inl.sum() >= 3 else pose
        if all(pose_distance(refit, h.transform, a) > 3.0 * inlier for h in out):
            out.append(Hypothesis(refit, int(inl.sum()), 'ransac'))
    return out


def feature_hypotheses(
    source: np.ndarray, reference: np.ndarray, cfg: GlobalConfig, seed: int = 0, wide: int = 0
):
    """(hypotheses, voxel, matches, timings): the candidate poses (source -> reference) from FPFH
    features, best support first, plus FGR / KISS-Matcher / the identity prior; ``voxel`` is the
    feature voxel size (caller units), ``matches`` the number of mutual feature matches. wide > 0:
    a second RANSAC keeps ``wide`` distinct poses, and those not within 3 inlier distances of a
    first-pass pose follow the first pass's (origin 'ransac_wide')."""
    _open3d()  # its warnings silenced
    t0 = time.perf_counter()
    voxel, ds, dr = _feature_clouds(source, reference, cfg.feature_points)
    fs, fr = _fpfh(ds, voxel), _fpfh(dr, voxel)
    ps, pr = np.asarray(ds.points), np.asarray(dr.points)
    t1 = time.perf_counter()
    matches = _mutual_matches(fs, fr)
    hyps = _ransac(
        ps,
        pr,
        matches,
        1.5 * voxel,
        cfg.ransac_iterations,
        cfg.candidates,
        np.random.default_rng(seed),
    )
    matched = ps[matches[:, 0]] if len(matches) else ps

    def distinct(pose, kept):  # farther than 3 inlier distances from every kept pose
        return all(pose_distance(pose, k.transform, matched) > 4.5 * voxel for k in kept)

    if wide:
        hyps += [
            Hypothesis(h.transform, h.support, 'ransac_wide')
            for h in _ransac(
                ps,
                pr,
                matches,
                1.5 * voxel,
                cfg.ransac_iterations,
                wide,
                np.random.default_rng(seed + 1),
            )
            if distinct(h.transform, hyps)
        ]
    pose = _open3d_ransac(ds, dr, fs, fr, voxel, seed)
    support = int(_inliers(pose[None], ps[matches[:, 0]], pr[matches[:, 1]], 1.5 * voxel)[0])
    hyps += [
        h
        for h in [Hypothesis(pose, support, 'ransac_open3d')]
        + _surface_hypotheses(source, reference, voxel, cfg, seed)
        if distinct(h.transform, hyps)
    ]
    t2 = time.perf_counter()
    extra: List[Hypothesis] = (
        _fgr_hypotheses(ds, dr, fs, fr, voxel, seed, distinct) if cfg.fgr else []
    )
    if cfg.kiss_matcher:
        pose = _kiss_matcher(source, reference, voxel)
        if pose is not None:
            extra.append(Hypothesis(pose, 0, 'kiss_matcher'))
    extra.append(Hypothesis(np.eye(4), 0, 'prior'))
    timings = {'features': t1 - t0, 'ransac': t2 - t1, 'other_solvers': time.perf_counter() - t2}
    return hyps + extra, voxel, matches.shape[0], timings


#: Open3D's feature RANSAC (its tutorial's settings: mutual filter, edge-length and distance
#: checkers) draws this many samples, stopping early at 0.999 confidence
OPEN3D_RANSAC_ITERATIONS = 100000


def _open3d_ransac(ds, dr, fs, fr, voxel: float, seed: int) -> np.ndarray:
    """The (4, 4) pose of Open3D's feature
    RANSAC on the feature clouds ``ds``, ``dr`` and their FPFH features ``fs``, ``fr`` (n, 33),
    seeded: the answer of the FPFH + RANSAC pipeline users know, among the candidates (its
    sampling found poses that the length-guided RANSAC missed on real rooms)."""
    o3d = _open3d()
    reg = o3d.pipelines.registration
    fs_o, fr_o = _o3d_features(fs), _o3d_features(fr)
    o3d.utility.random.seed(seed)
    res = reg.registration_ransac_based_on_feature_matching(
        ds,
        dr,
        fs_o,
        fr_o,
        True,
        1.5 * voxel,
        reg.TransformationEstimationPointToPoint(False),
        3,
        [
            reg.CorrespondenceCheckerBasedOnEdgeLength(0.9),
            reg.CorrespondenceCheckerBasedOnDistance(1.5 * voxel),
        ],
        reg.RANSACConvergenceCriteria(OPEN3D_RANSAC_ITERATIONS, 0.999),
    )
    return np.asarray(res.transformation, dtype=np.float64).copy()


def _fgr_hypotheses(ds, dr, fs, fr, voxel: float, seed: int, distinct) -> List[Hypothesis]:
    """The distinct poses of :data:`FGR_RUNS` seeded runs of Open3D's FGR on the feature clouds
    ``ds``, ``dr`` and their FPFH features ``fs``, ``fr`` (n, 33); ``distinct(pose, kept)``."""
    reg = _open3d().pipelines.registration
    fs_o, fr_o = _o3d_features(fs), _o3d_features(fr)
    out: List[Hypothesis] = []
    for run in range(FGR_RUNS):
        # FGR samples its correspondence tuples with Open3D's global generator: seeded, so the
        # search is deterministic; a few restarts, because one run finds a hard pair's pose
        # only sometimes (bunny 180->270 with outliers: 1 of 2 unseeded runs)
        _open3d().utility.random.seed(seed + run)
        res = reg.registration_fgr_based_on_feature_matching(
            ds,
            dr,
            fs_o,
            fr_o,
            reg.FastGlobalRegistrationOption(maximum_correspondence_distance=1.5 * voxel),
        )
        pose = np.asarray(res.transformation).copy()
        if distinct(pose, out):
            out.append(Hypothesis(pose, 0, 'fgr'))
    return out


#: the features of the points on surfaces alone run too when they need a voxel finer than all
#: points' by more than this factor (spurious points coarsened it)
SURFACE_VOXEL_RATIO = 1.25


def _surface_hypotheses(source, reference, voxel: float, cfg: GlobalConfig, seed: int) -> list:
    """RANSAC poses (origin 'ransac_surfaces') from FPFH features of the points on both sets'
    surfaces (:func:`on_surfaces`), when their feature voxel is more than
    :data:`SURFACE_VOXEL_RATIO` finer than ``voxel``, that of all points: 50 % uniform outliers
    in the reference's box made the 3DMatch fragments' feature voxel 3x coarser (6.5 -> 17-23
    cm) and their features too blunt to match. Else none."""
    src, ref = on_surfaces(source), on_surfaces(reference)
    fine, ds, dr = _feature_clouds(src, ref, cfg.feature_points)
    if fine * SURFACE_VOXEL_RATIO > voxel:
        return []
    ps, pr = np.asarray(ds.points), np.asarray(dr.points)
    matches = _mutual_matches(_fpfh(ds, fine), _fpfh(dr, fine))
    found = _ransac(
        ps, pr, matches, 1.5 * fine, cfg.ransac_iterations, cfg.candidates,
        np.random.default_rng(seed + 2),
    )  # fmt: skip
    return [Hypothesis(h.transform, h.support, 'ransac_surfaces') for h in found]


def _kiss_matcher(source: np.ndarray, reference: np.ndarray, voxel: float) -> Optional[np.ndarray]:
    """KISS-Matcher's pose (None when not installed, invalid, or when it rejects the input, e.g.
    a voxel below its fixed floor on a small object). Its console output goes to stderr, less
    its note that it clamps the noise bounds (:data:`KISS_MATCHER_CLAMP_NOTE`): stdout stays the
    caller's (``pwan_register --json``). It takes float32 points: each set goes in about its own
    mean (at map coordinates, 4e6 m out, float32 steps are 0.25-0.5 m, and it printed a warning
    per point), and the pose is composed back."""
    src_mean = np.asarray(source, np.float64).mean(axis=0)
    ref_mean = np.asarray(reference, np.float64).mean(axis=0)
    with _one_cpu():  # its first import and call size its thread pools (see _one_cpu)
        try:
            import kiss_matcher
        except ImportError:
            return None
        try:
            with _native_output_to_stderr(KISS_MATCHER_CLAMP_NOTE):
                matcher = kiss_matcher.KISSMatcher(kiss_matcher.KISSMatcherConfig(voxel))
                sol = matcher.estimate(
                    (np.asarray(source, np.float64) - src_mean).astype(np.float32),
                    (np.asarray(reference, np.float64) - ref_mean).astype(np.float32),
                )
        except (RuntimeError, ValueError):
            return None
    if not sol.valid:
        return None
    out = np.eye(4)
    out[:3, :3] = np.asarray(sol.rotation)
    out[:3, 3] = np.asarray(sol.translation).ravel() + ref_mean - out[:3, :3] @ src_mean
    return out if np.isfinite(out).all() else None


@contextlib.contextmanager
def _one_cpu():
    """Run the block with the calling thread on one of its CPUs (Linux; elsewhere as it is).

    KISS-Matcher's thread pools (TBB, OpenMP) take their size from the CPUs of the thread that
    first loads and calls it, and with two threads its pose is not reproducible: on a simulated
    street pair it moved by up to 0.38 m between calls on the same input. On one CPU every call
    gives the same pose (at about 1.8x its time: 0.14 s against 0.08 s there)."""
    get = getattr(os, 'sched_getaffinity', None)
    cpus = get(0) if get is not None else None
    pinned = False
    if cpus:
        try:
            os.sched_setaffinity(0, {min(cpus)})
            pinned = True
        except OSError:  # a restricted container: run as it is
            pass
    try:
        yield
    finally:
        if pinned:
            os.sched_setaffinity(0, cpus)


#: KISS-Matcher's note that it clamps a noise bound to 1 m (its intended behaviour for the feature
#: voxels of street scans, 1-2 m), six lines per call: left out of what reaches stderr
KISS_MATCHER_CLAMP_NOTE = re.compile(
    r'(\x1b\[[0-9;]*m)*\[Warning\] Too large `[^`]*` has been set\.\n'
    r'Empirically, 1\.0 tends to work better for large-scale maps\.\n'
    r'If you do not want to clamp these values, disable `enable_noise_clamping`\.\n'
    r'(\x1b\[[0-9;]*m)*'
)


@contextlib.contextmanager
def _native_output_to_stderr(drop: Optional[re.Pattern] = None):
    """What native code writes to file descriptors 1 and 2 during the block goes to stderr after
    it, less the text ``drop`` matches (stdout stays the caller's: ``pwan_register --json``).
    Without a writable temporary directory it goes to stderr as it comes, unfiltered."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        tmp = tempfile.TemporaryFile()
    except OSError:
        tmp = None
    sink = tmp.fileno() if tmp is not None else 2
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        if tmp is not None:
            with tmp:
                tmp.seek(0)
                text = tmp.read().decode('utf-8', errors='replace')
            if drop is not None:
                text = drop.sub('', text)
            if text:
                sys.stderr.write(text)
                sys.stderr.flush()


#: rotation starts refined (of the cube's 24), most votes first
ROTATION_KEEP = 8


def rotation_hypotheses(
    source: np.ndarray, reference: np.ndarray, voxel: float, seed: int = 0, keep: int = 24
) -> List[Hypothesis]:
    """The 24 rotations of the cube's group, each with the translation most point pairs vote for
    (:func:`votes.start_translations`, cells of 2 ``voxel``, the reference voxelised at 1.5
    ``voxel``): PWAN's own starts, for when the features are weak; the ``keep`` with the
    most votes, most first."""
    rots = start_rotations(3, 24)
    out = []
    for rot, (trans, votes) in zip(
        rots,
        start_translations(source, voxelised(reference, 1.5 * voxel), rots, 2.0 * voxel, seed),
    ):
        t = np.eye(4)
        t[:3, :3], t[:3, 3] = rot, trans
        out.append((votes, Hypothesis(t, 0, 'rotation')))
    out.sort(key=lambda c: -c[0])
    return [h for _, h in out[:keep]]
