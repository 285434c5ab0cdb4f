"""Anchor methods a user would pick instead of PWAN (thin wrappers around other libraries).

Each returns a 4x4 (rigid) source -> reference transform or transformed points (non-rigid).
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree


def o3d_icp(src, ref, max_dist=0.1, iters=100):
    """Open3D point-to-point ICP from identity with a correspondence distance limit (d-ICP)."""
    import open3d as o3d

    s = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(src))
    r = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(ref))
    res = o3d.pipelines.registration.registration_icp(
        s,
        r,
        max_dist,
        np.eye(4),
        o3d.pipelines.registration.TransformationEstimationPointToPoint(),
        o3d.pipelines.registration.ICPConvergenceCriteria(max_iteration=iters),
    )
    return np.asarray(res.transformation)


def trimmed_icp(src, ref, ratio=0.8, iters=100):
    """Trimmed ICP (m-ICP, Chetverikov et al.): keep the ``ratio`` closest pairs each iteration."""
    tree = cKDTree(ref)
    r_tot, t_tot = np.eye(3), np.zeros(3)
    cur = src.copy()
    k = max(3, int(ratio * min(len(src), len(ref))))
    for _ in range(iters):
        d, i = tree.query(cur)
        keep = np.argpartition(d, k - 1)[:k]
        p, q = cur[keep], ref[i[keep]]
        pc, qc = p.mean(0), q.mean(0)
        u, _, vt = np.linalg.svd((p - pc).T @ (q - qc))
        s = np.diag([1, 1, np.sign(np.linalg.det(vt.T @ u.T))])
        r = vt.T @ s @ u.T
        t = qc - r @ pc
        cur = cur @ r.T + t
        r_tot, t_tot = r @ r_tot, r @ t_tot + t
        if np.linalg.norm(t) < 1e-7 and abs(np.trace(r) - 3) < 1e-10:
            break
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = r_tot, t_tot
    return out


def probreg_cpd_rigid(src, ref, w=0.1):
    from probreg import cpd

    tf, _, _ = cpd.registration_cpd(src, ref, tf_type_name='rigid', w=w, maxiter=100)
    out = np.eye(4)
    out[:3, :3] = tf.rot * 1.0
    out[:3, 3] = tf.t
    return out


def pycpd_rigid(src, ref, w=0.1):
    from pycpd import RigidRegistration

    reg = RigidRegistration(X=ref, Y=src, w=w, max_iterations=100)
    _, (s, r, t) = reg.register()
    # pycpd: Y_t = s * Y @ R + t (row convention)
    out = np.eye(4)
    out[:3, :3] = (s * r).T
    out[:3, 3] = t
    return out


def small_gicp(src, ref, voxel=0.05):
    import small_gicp as sg

    res = sg.align(
        ref,
        src,
        registration_type='GICP',
        downsampling_resolution=voxel,
        max_correspondence_distance=4 * voxel,
        num_threads=1,
    )
    return np.asarray(res.T_target_source)


def pycpd_deformable(src, ref, w=0.1, beta=2.0, lam=2.0, iterations=150, tolerance=None):
    from pycpd import DeformableRegistration

    kwargs = {} if tolerance is None else {'tolerance': tolerance}
    reg = DeformableRegistration(
        X=ref, Y=src, w=w, beta=beta, alpha=lam, max_iterations=iterations, **kwargs
    )
    ty, _ = reg.register()
    return ty


def probreg_bcpd(src, ref, w=0.1, iterations=50):
    """probreg's BCPD with its defaults but the outlier weight and iteration cap."""
    from probreg import bcpd

    return bcpd.registration_bcpd(src, ref, w=w, maxiter=iterations).transform(src)


def probreg_cpd_deformable(src, ref, w=0.1, beta=2.0, lam=2.0):
    from probreg import cpd

    tf, _, _ = cpd.registration_cpd(
        src, ref, tf_type_name='nonrigid', w=w, beta=beta, lmd=lam, maxiter=150
    )
    return tf.transform(src)


def _fpfh_sets(src, ref, voxel):
    import open3d as o3d

    reg = o3d.pipelines.registration
    out = []
    for pts in (src, ref):
        pcd = o3d.geometry.PointCloud(
            o3d.utility.Vector3dVector(np.asarray(pts, np.float64))
        ).voxel_down_sample(voxel)
        pcd.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2 * voxel, max_nn=30))
        feat = reg.compute_fpfh_feature(
            pcd, o3d.geometry.KDTreeSearchParamHybrid(radius=5 * voxel, max_nn=100)
        )
        out.append((pcd, feat))
    return out


def _icp_refine(src, ref, init, voxel):
    """Open3D point-to-plane ICP (the usual second stage of a global method) at 1.5 x voxel."""
    import open3d as o3d

    reg = o3d.pipelines.registration
    s = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(src, np.float64)))
    r = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(ref, np.float64)))
    r.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2 * voxel, max_nn=30))
    res = reg.registration_icp(
        s,
        r,
        1.5 * voxel,
        init,
        reg.TransformationEstimationPointToPlane(),
        reg.ICPConvergenceCriteria(max_iteration=50),
    )
    return np.asarray(res.transformation)


def fpfh_ransac_icp(src, ref, voxel):
    """Open3D's global registration tutorial: FPFH + RANSAC (mutual filter, edge-length and
    distance checkers, 100k iterations / 0.999) then point-to-plane ICP."""
    import open3d as o3d

    reg = o3d.pipelines.registration
    (s, fs), (r, fr) = _fpfh_sets(src, ref, voxel)
    res = reg.registration_ransac_based_on_feature_matching(
        s,
        r,
        fs,
        fr,
        True,
        1.5 * voxel,
        reg.TransformationEstimationPointToPoint(False),
        3,
        [
            reg.CorrespondenceCheckerBasedOnEdgeLength(0.9),
            reg.CorrespondenceCheckerBasedOnDistance(1.5 * voxel),
        ],
        reg.RANSACConvergenceCriteria(100000, 0.999),
    )
    return _icp_refine(src, ref, np.asarray(res.transformation), voxel)


def fgr_icp(src, ref, voxel):
    """Open3D fast global registration on FPFH, then point-to-plane ICP."""
    import open3d as o3d

    reg = o3d.pipelines.registration
    (s, fs), (r, fr) = _fpfh_sets(src, ref, voxel)
    res = reg.registration_fgr_based_on_feature_matching(
        s, r, fs, fr, reg.FastGlobalRegistrationOption(maximum_correspondence_distance=1.5 * voxel)
    )
    return _icp_refine(src, ref, np.asarray(res.transformation), voxel)


def kiss_matcher(src, ref, voxel):
    """KISS-Matcher (pip install kiss-matcher) at ``voxel``, then point-to-plane ICP; identity when
    it reports no valid solution."""
    import kiss_matcher as km

    sol = km.KISSMatcher(km.KISSMatcherConfig(voxel)).estimate(
        np.asarray(src, np.float32), np.asarray(ref, np.float32)
    )
    t = np.eye(4)
    if sol.valid:
        t[:3, :3], t[:3, 3] = np.asarray(sol.rotation), np.asarray(sol.translation).ravel()
    return _icp_refine(src, ref, t, voxel)
