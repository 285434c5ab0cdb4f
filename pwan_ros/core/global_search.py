"""Registration from an unknown initial pose: feature hypotheses, chosen and refined by PWAN's
partial objective (``register(..., init='global')``).

1. **Hypotheses.** FPFH features (Open3D) on both sets voxel-downsampled to about
   ``feature_points`` points; mutual nearest neighbours in feature space; a vectorised RANSAC
   over 3-point samples (edge-length consistency, Kabsch) keeps the ``candidates`` best *distinct*
   poses by inlier support, not one answer. Open3D's FGR adds one, KISS-Matcher one more when
   installed; the caller's prior (identity) is always a candidate.
2. **Chosen by PWAN's partial objective.** Each candidate is refined by the fine-tune stage
   (eq. fine_tune, distance type at h = 2 x the reference spacing: it needs no overlap guess)
   and scored by the distance-type primal objective of the nearest-neighbour plan,
   ``mean_j min(d_j - h, 0) / h`` in [-1, 0] (lower = more of the source lies on the reference).
   Feature support only proposes; the partial objective decides, so a pose that RANSAC ranks
   low (features broken by outliers) still wins when it explains the geometry.
3. **Refusal.** ``overlap`` = fraction of the source within h at the winner. The confidence is
   the margin of the winner's objective over the best *distinct* runner-up; when the overlap is
   below ``min_overlap`` or the margin below ``min_confidence`` (two different poses explain the
   data almost equally: a corridor, a symmetric object) the result is ``status='refused'`` with
   the reason, instead of a confident wrong pose.

Frames: caller units; every pose maps source -> reference (T_reference_source).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
from scipy.spatial import cKDTree

from .config import GlobalConfig

#: seeded runs of Open3D's FGR (distinct poses become candidates)
FGR_RUNS = 4
#: with viewpoints, RANSAC keeps this many times ``candidates`` distinct poses before the
#: free-space filter
WIDE_FACTOR = 8

__all__ = ['GlobalConfig', 'Hypothesis', 'GlobalOutcome', 'feature_hypotheses', 'rotation_hypotheses', 'choose',
           'register_global', 'pose_distance']


@dataclass(frozen=True)
class Hypothesis:
    """A candidate pose: transform (4, 4) source -> reference; support: feature inliers (0 for
    non-feature candidates); origin: 'ransac' | 'fgr' | 'kiss_matcher' | 'prior'."""

    transform: np.ndarray
    support: int
    origin: str


def pose_distance(a: np.ndarray, b: np.ndarray, points: np.ndarray) -> float:
    """RMS distance (caller units) between ``points`` (n, 3) moved by poses a and b."""
    pa = points @ a[:3, :3].T + a[:3, 3]
    pb = points @ b[:3, :3].T + b[:3, 3]
    return float(np.sqrt(np.mean(np.sum((pa - pb) ** 2, axis=1))))


# --------------------------------------------------------------------------- features

def _pcd(points: np.ndarray):
    """An Open3D point cloud of (n, 3) points."""
    import open3d as o3d
    return o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(points, dtype=np.float64)))


def _downsample(points: np.ndarray, target: int):
    """(voxel, downsampled Open3D cloud): the voxel size leaving about ``target`` points."""
    pcd = _pcd(points)
    lo, hi = points.min(0), points.max(0)
    voxel = float(np.linalg.norm(hi - lo)) / 100.0
    for _ in range(30):
        down = pcd.voxel_down_sample(voxel)
        n = len(down.points)
        if 0.7 * target <= n <= 1.4 * target or voxel <= 0:
            break
        voxel *= (n / target) ** 0.5      # surface points scale ~ 1 / voxel^2
    return voxel, down


def _voxelised(points: np.ndarray, voxel: float) -> np.ndarray:
    return np.asarray(_pcd(points).voxel_down_sample(voxel).points)


def _fpfh(down, voxel: float) -> np.ndarray:
    import open3d as o3d
    down.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2.0 * voxel, max_nn=30))
    feat = o3d.pipelines.registration.compute_fpfh_feature(
        down, o3d.geometry.KDTreeSearchParamHybrid(radius=5.0 * voxel, max_nn=100))
    return np.asarray(feat.data).T.copy()


def _mutual_matches(fs: np.ndarray, fr: np.ndarray) -> np.ndarray:
    """(k, 2) index pairs (source, reference) that are mutual nearest neighbours in feature space."""
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
    d = np.sign(np.linalg.det(np.einsum('bij,bjk->bik', vt.transpose(0, 2, 1), u.transpose(0, 2, 1))))
    fix = np.ones((len(p), 3))
    fix[:, 2] = d
    r = np.einsum('bij,bj,bkj->bik', vt.transpose(0, 2, 1), fix, u)
    out = np.tile(np.eye(4), (len(p), 1, 1))
    out[:, :3, :3] = r
    out[:, :3, 3] = qc[:, 0] - np.einsum('bij,bj->bi', r, pc[:, 0])
    return out


def _ransac(ps: np.ndarray, pr: np.ndarray, matches: np.ndarray, inlier: float, iterations: int, keep: int,
            rng: np.random.Generator) -> List[Hypothesis]:
    """The ``keep`` best distinct poses by inlier count (matches within ``inlier`` after the pose),
    each re-estimated on its inliers."""
    if len(matches) < 3:
        return []
    a, b = ps[matches[:, 0]], pr[matches[:, 1]]
    scored = []
    batch = 2000
    for start in range(0, iterations, batch):
        idx = rng.integers(0, len(matches), size=(min(batch, iterations - start), 3))
        sa, sb = a[idx], b[idx]
        # edge-length consistency (rigid motions keep distances), as Open3D's checker at 0.9
        la = np.linalg.norm(sa - np.roll(sa, 1, axis=1), axis=2)
        lb = np.linalg.norm(sb - np.roll(sb, 1, axis=1), axis=2)
        ok = np.all((np.minimum(la, lb) >= 0.9 * np.maximum(la, lb)) & (la > inlier), axis=1)
        if not ok.any():
            continue
        poses = _kabsch_batch(sa[ok], sb[ok])
        moved = np.einsum('bij,nj->bni', poses[:, :3, :3], a) + poses[:, None, :3, 3]
        count = (np.sum((moved - b[None]) ** 2, axis=2) < inlier * inlier).sum(1)
        top = np.argsort(-count)[:4 * keep]
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


def feature_hypotheses(source: np.ndarray, reference: np.ndarray, cfg: GlobalConfig, seed: int = 0,
                       wide: int = 0):
    """(hypotheses, voxel, matches, timings): the candidate poses (source -> reference) from FPFH
    features, best support first, plus FGR / KISS-Matcher / the identity prior; ``voxel`` is the
    feature voxel size (caller units), ``matches`` the number of mutual feature matches. wide > 0:
    a second RANSAC keeps ``wide`` distinct poses, and those not within 3 inlier distances of a
    first-pass pose follow the first pass's (origin 'ransac_wide')."""
    import open3d as o3d
    t0 = time.perf_counter()
    vs, ds = _downsample(source, cfg.feature_points)
    vr, dr = _downsample(reference, cfg.feature_points)
    voxel = max(vs, vr)
    if voxel != vs:
        ds = _pcd(source).voxel_down_sample(voxel)
    if voxel != vr:
        dr = _pcd(reference).voxel_down_sample(voxel)
    fs, fr = _fpfh(ds, voxel), _fpfh(dr, voxel)
    ps, pr = np.asarray(ds.points), np.asarray(dr.points)
    t1 = time.perf_counter()
    matches = _mutual_matches(fs, fr)
    hyps = _ransac(ps, pr, matches, 1.5 * voxel, cfg.ransac_iterations, cfg.candidates,
                   np.random.default_rng(seed))
    matched = ps[matches[:, 0]] if len(matches) else ps

    def distinct(pose, kept):         # farther than 3 inlier distances from every kept pose
        return all(pose_distance(pose, k.transform, matched) > 4.5 * voxel for k in kept)
    if wide:
        hyps += [Hypothesis(h.transform, h.support, 'ransac_wide')
                 for h in _ransac(ps, pr, matches, 1.5 * voxel, cfg.ransac_iterations, wide,
                                  np.random.default_rng(seed + 1)) if distinct(h.transform, hyps)]
    t2 = time.perf_counter()
    extra: List[Hypothesis] = []
    if cfg.fgr:
        reg = o3d.pipelines.registration
        fs_o, fr_o = reg.Feature(), reg.Feature()
        fs_o.data, fr_o.data = fs.T.copy(), fr.T.copy()
        for run in range(FGR_RUNS):
            # FGR samples its correspondence tuples with Open3D's global generator: seeded, so the
            # search is deterministic; a few restarts, because one run finds a hard pair's pose
            # only sometimes (bunny 180->270 with outliers: 1 of 2 unseeded runs)
            o3d.utility.random.seed(seed + run)
            res = reg.registration_fgr_based_on_feature_matching(
                ds, dr, fs_o, fr_o, reg.FastGlobalRegistrationOption(maximum_correspondence_distance=1.5 * voxel))
            pose = np.asarray(res.transformation).copy()
            if distinct(pose, extra):
                extra.append(Hypothesis(pose, 0, 'fgr'))
    if cfg.kiss_matcher:
        pose = _kiss_matcher(source, reference, voxel)
        if pose is not None:
            extra.append(Hypothesis(pose, 0, 'kiss_matcher'))
    extra.append(Hypothesis(np.eye(4), 0, 'prior'))
    timings = {'features': t1 - t0, 'ransac': t2 - t1, 'other_solvers': time.perf_counter() - t2}
    return hyps + extra, voxel, matches.shape[0], timings


def _kiss_matcher(source: np.ndarray, reference: np.ndarray, voxel: float) -> Optional[np.ndarray]:
    """KISS-Matcher's pose (None when not installed or invalid)."""
    try:
        import kiss_matcher
    except ImportError:
        return None
    matcher = kiss_matcher.KISSMatcher(kiss_matcher.KISSMatcherConfig(voxel))
    sol = matcher.estimate(np.asarray(source, np.float32), np.asarray(reference, np.float32))
    if not sol.valid:
        return None
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = np.asarray(sol.rotation), np.asarray(sol.translation).ravel()
    return out


@dataclass(frozen=True)
class GlobalOutcome:
    """The chosen pose and how it was chosen: ``result`` the winner's refinement
    (RegistrationResult); ``objective`` its partial objective in [-1, 0]; ``overlap`` fraction of
    the source within h; ``confidence`` relative margin over the best distinct runner-up (1 when
    there is none); ``status`` 'ok' | 'refused'; ``reason`` why refused; ``candidates`` scored
    [(origin, support, objective, free_space)] in input order (free_space None without viewpoints)."""

    result: object
    objective: float
    overlap: float
    confidence: float
    status: str
    reason: str
    candidates: list


def partial_objective_of(moved: np.ndarray, tree: cKDTree, h: float) -> tuple:
    """(objective, overlap) of source points ``moved`` (n, 3) onto a reference tree: the
    distance-type primal mean_j min(d_j - h, 0) / h in [-1, 0], and the fraction within h."""
    d, _ = tree.query(moved, k=1, distance_upper_bound=h)
    within = np.isfinite(d)
    return float(np.sum(d[within] - h) / (h * len(moved))), float(within.mean())


def choose(reference: np.ndarray, hyps: List[Hypothesis], cfg: GlobalConfig, refine_fn, h: float,
           probe: np.ndarray, free_space=None) -> GlobalOutcome:
    """Refine every hypothesis with ``refine_fn(init) -> RegistrationResult`` (the fine-tune, distance
    type), score it by the partial objective on ``probe`` source points against ``reference`` at
    threshold ``h``, and pick the winner (see the module doc for the refusal rules).
    free_space: None, or ``f(transform) -> fraction`` (:func:`free_space.contradiction`): candidates
    above ``cfg.max_free_space`` contradict what the sensors saw and cannot win."""
    tree = cKDTree(reference)
    scored = []
    for hyp in hyps:
        res = refine_fn(hyp.transform)
        moved = probe @ res.transform[:3, :3].T + res.transform[:3, 3]
        obj, overlap = partial_objective_of(moved, tree, h)
        seen_through = None if free_space is None else free_space(res.transform)
        scored.append((obj, overlap, res, hyp, seen_through))
    cands = [(s[3].origin, s[3].support, s[0], s[4]) for s in scored]
    order = sorted(range(len(scored)), key=lambda k: scored[k][0])
    if free_space is not None:
        order_ok = [k for k in order if scored[k][4] <= cfg.max_free_space]
        if not order_ok:
            obj, overlap, res, _, seen = scored[order[0]]
            least = min(s[4] for s in scored)
            return GlobalOutcome(res, obj, overlap, 0.0, 'refused',
                                 f'every candidate pose puts one cloud where the other sensor saw free space '
                                 f'(least: {least:.0%} > max_free_space {cfg.max_free_space:.0%})', cands)
        order = order_ok
    obj, overlap, res, hyp, _ = scored[order[0]]
    runner = next((scored[k] for k in order[1:]
                   if pose_distance(scored[k][2].transform, res.transform, probe) > 2.0 * h), None)
    confidence = 1.0 if runner is None or obj >= 0 else float(min(1.0, (runner[0] - obj) / -obj))
    status, reason = 'ok', ''
    if overlap < cfg.min_overlap:
        status, reason = 'refused', (f'best pose puts {overlap:.0%} of the source on the reference '
                                     f'(< min_overlap {cfg.min_overlap:.0%}): no overlap found')
    elif confidence < cfg.min_confidence:
        apart = pose_distance(runner[2].transform, res.transform, probe)
        status, reason = 'refused', (f'ambiguous: a pose {apart:.3g} away explains the data almost as well '
                                     f'(confidence {confidence:.2f} < min_confidence {cfg.min_confidence:.2f})')
    return GlobalOutcome(res, obj, overlap, confidence, status, reason, cands)


def rotation_hypotheses(source: np.ndarray, reference: np.ndarray) -> List[Hypothesis]:
    """The 24 rotations of the cube's group about the source centroid, each moving it onto the
    reference centroid: PWAN's own starts, for when the features are weak."""
    from .multistart import start_rotations
    cs, cr = source.mean(0), reference.mean(0)
    out = []
    for rot in start_rotations(3, 24):
        t = np.eye(4)
        t[:3, :3], t[:3, 3] = rot, cr - rot @ cs
        out.append(Hypothesis(t, 0, 'rotation'))
    return out


def register_global(source, reference, config, reference_cache=None, refine=None, viewpoints=None):
    """``register(source, reference, config, init='global')``: see the module doc. Returns a
    RegistrationResult (the winner's dense fine-tune, in the configured divergence: the distance
    type as it is; the mass type with the mass estimated from the winner's overlap) with
    ``status``, ``reason``, ``overlap``, ``confidence`` and ``candidates`` filled in. ``refine``:
    the core's :func:`api.refine` (passed in by :func:`api.register`). viewpoints: None or the
    sensors' positions (source's in the source frame, reference's in the reference frame): then
    candidates that contradict the free space the sensors saw are rejected (:mod:`free_space`)."""
    import dataclasses
    from .errors import PwanInputError
    from .preprocess import median_spacing
    t0 = time.perf_counter()
    cfg = config.global_search
    src = np.asarray(source, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if src.ndim != 2 or ref.ndim != 2 or src.shape[1] != 3 or ref.shape[1] != 3:
        raise PwanInputError("init='global' needs 3-D point sets (N, 3) and (M, 3)")
    src_f, ref_f = src[np.isfinite(src).all(1)], ref[np.isfinite(ref).all(1)]
    if len(src_f) < 10 or len(ref_f) < 10:
        raise PwanInputError("init='global' needs at least 10 finite points per set")
    wide = 0 if viewpoints is None else WIDE_FACTOR * cfg.candidates
    hyps, voxel, n_matches, timings = feature_hypotheses(src_f, ref_f, cfg, config.seed, wide)
    # refined on the subsets; scored on both sets voxel-downsampled at the feature voxel with
    # h = 1.5 voxels (the RANSAC inlier distance): uniform density, so a sensor's own sampling
    # pattern (lidar rings, dense near the sensor) cannot make "no motion" look like a match
    vs, vr = _voxelised(src_f, voxel), _voxelised(ref_f, voxel)
    seen_through = None
    if viewpoints is not None:
        from .free_space import FreeSpace, contradiction, supported
        ss, sr = vs[supported(vs, voxel)], vr[supported(vr, voxel)]
        spaces = FreeSpace(ss, viewpoints[0], voxel), FreeSpace(sr, viewpoints[1], voxel)

        def seen_through(pose):
            return contradiction(pose, ss, sr, *spaces)
        # the poses of the wide RANSAC join those refined without viewpoints when, as they are (before
        # refinement), they do not contradict the free space and explain most of the source: a
        # repetitive scene (a room's box-like furniture) gives its symmetric poses more feature
        # support than the true one
        vtree = cKDTree(vr)
        extra = sorted((partial_objective_of(vs @ h.transform[:3, :3].T + h.transform[:3, 3], vtree, 1.5 * voxel)[0],
                        k, h) for k, h in enumerate(hyps) if h.origin == 'ransac_wide'
                       and seen_through(h.transform) <= cfg.max_free_space)
        hyps = [h for h in hyps if h.origin != 'ransac_wide'] + [h for _, _, h in extra[:cfg.candidates]]
    if max((h.support for h in hyps), default=0) < cfg.weak_support:
        hyps = hyps + rotation_hypotheses(src_f, ref_f)
    rng = np.random.default_rng(config.seed + 41)
    cap = max(config.start_finetune_points, 100)
    sub_s = src_f[rng.choice(len(src_f), min(cap, len(src_f)), replace=False)]
    sub_r = ref_f[rng.choice(len(ref_f), min(4 * cap, len(ref_f)), replace=False)]
    dist_cfg = config.replace(divergence='distance', transform='rigid')
    small = dist_cfg.replace(finetune=dataclasses.replace(dist_cfg.finetune, max_points=cap,
                                                          max_iterations=config.start_finetune_iterations))
    h = config.distance_threshold or 2.0 * median_spacing(ref_f[rng.choice(len(ref_f), min(20000, len(ref_f)),
                                                                           replace=False)])
    t1 = time.perf_counter()
    with warnings.catch_warnings():     # the candidates' refinements are capped on purpose
        warnings.filterwarnings('ignore', message='the fine-tune stopped', category=RuntimeWarning)
        out = choose(vr, hyps, cfg, lambda init: refine(sub_s, sub_r, init=init, config=small), 1.5 * voxel, vs,
                     seen_through)
    t2 = time.perf_counter()
    final_cfg = dist_cfg.replace(distance_threshold=h)
    if config.divergence == 'mass':      # the overlap the candidates found, not a fixed guess
        final_cfg = config.replace(transform='rigid', mass=None, mass_ratio=float(np.clip(out.overlap, 0.05, 1.0)))
    final = refine(source, reference, init=out.result.transform, config=final_cfg, reference_cache=reference_cache)
    timings.update(choose=t2 - t1, finetune=time.perf_counter() - t2)
    overlap = out.overlap
    if config.divergence == 'distance':
        overlap = final.matched_ratio
    return dataclasses.replace(final, time_s=time.perf_counter() - t0, timings=timings, status=out.status,
                               reason=out.reason, overlap=overlap, confidence=out.confidence,
                               candidates=[{'origin': o, 'support': sup, 'objective': obj, 'free_space': fs}
                                           for o, sup, obj, fs in out.candidates],
                               distance_threshold=final.distance_threshold)
