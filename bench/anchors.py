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
        s, r, max_dist, np.eye(4), o3d.pipelines.registration.TransformationEstimationPointToPoint(),
        o3d.pipelines.registration.ICPConvergenceCriteria(max_iteration=iters))
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
    res = sg.align(ref, src, registration_type='GICP', downsampling_resolution=voxel,
                   max_correspondence_distance=4 * voxel, num_threads=1)
    return np.asarray(res.T_target_source)


def pycpd_deformable(src, ref, w=0.1, beta=2.0, lam=2.0):
    from pycpd import DeformableRegistration
    reg = DeformableRegistration(X=ref, Y=src, w=w, beta=beta, alpha=lam, max_iterations=150)
    ty, _ = reg.register()
    return ty


def probreg_cpd_deformable(src, ref, w=0.1, beta=2.0, lam=2.0):
    from probreg import cpd
    tf, _, _ = cpd.registration_cpd(src, ref, tf_type_name='nonrigid', w=w, beta=beta, lmd=lam, maxiter=150)
    return tf.transform(src)
