"""The self-check of an affine result against the rigid pose inside it.

An affine transform can stretch or shear the source onto a partial overlap: on real scans that
are rigid (consecutive lidar scans) the affine fit can end squashed 5-15 % and metres off while
every rigid rival of the check (GICP moving the squashed points) fits it no better. The rigid
pose nearest the result (the rotation of its linear part's polar decomposition, the centroid of
the moved source kept, refined by GICP from there) is judged at the same voxel:

* it puts at least as much of the source on the reference: the affine fit stopped short of a
  transform it contains (the simpler one, on a tie); the rigid pose is taken and judged in turn,
  also when the affine result itself was refused;
* it is distinct (``RIVAL_DISTINCT`` gates RMS) and fits about as well: the data does not pin the
  affine part down; refused.

An affine part that stretches one direction more than ``MAX_ANISOTROPY`` times another is
refused as well: squeezed toward a plane or a line, a source lies on any reference's surfaces
(the overlap the check measures rises as the shape collapses: bunny 090->180 from identity came
back squeezed 14x, 0.27 diagonals off, with 74 % of it on the reference).

A true stretch or shear keeps its result: the rigid pose then fits clearly worse. Caller units.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import numpy as np

from ..preprocess import voxel_downsample
from .verify import (
    coarse_to_fine,
    RIVAL_DISTINCT,
    RIVAL_MARGIN,
    PoseCheck,
    _in_plane,
    _in_space,
    _surface,
    check_pose,
)

__all__ = ['MAX_ANISOTROPY', 'judge_affine', 'rigid_inside']

#: the most an affine result may stretch one direction against another (its linear part's
#: largest over smallest singular value); real stretches and shears of a shape stay far below
#: (1.3x in the tests), a collapse far above
MAX_ANISOTROPY = 3.0


def rigid_inside(
    source: np.ndarray, transform: np.ndarray, reference: np.ndarray, voxel: float
) -> Tuple[np.ndarray, np.ndarray]:
    """(T (d+1, d+1), the source moved by it): the rigid pose nearest the affine ``transform``
    of ``source`` (n, d) onto ``reference`` (m, d): the polar rotation of its linear part about
    the moved source's centroid, refined by GICP (point-to-point ICP in 2-D) coarse to fine down
    to 1.5 ``voxel`` on both sets at the judging voxel. Single-threaded: reproducible."""
    import small_gicp

    d = source.shape[1]
    u, _, vt = np.linalg.svd(transform[:d, :d])
    if np.linalg.det(u @ vt) < 0:
        u[:, -1] *= -1
    rot = u @ vt
    moved = source @ transform[:d, :d].T + transform[:d, d]
    start = np.eye(d + 1)
    start[:d, :d] = rot
    start[:d, d] = moved.mean(axis=0) - source.mean(axis=0) @ rot.T
    kind = 'GICP' if d == 3 else 'ICP'
    target = small_gicp.PointCloud(_in_space(_surface(reference, voxel)))
    tree = small_gicp.KdTree(target, num_threads=1)
    src = small_gicp.PointCloud(_in_space(voxel_downsample(source, voxel)))
    if kind == 'GICP':
        small_gicp.estimate_covariances(target, tree, num_neighbors=10, num_threads=1)
        small_gicp.estimate_covariances(
            src, small_gicp.KdTree(src, num_threads=1), num_neighbors=10, num_threads=1
        )
    t = np.eye(4)
    t[:d, :d], t[:d, 3] = start[:d, :d], start[:d, d]
    t = coarse_to_fine(
        target, src, tree, t, kind, (12.0 * voxel, 6.0 * voxel, 3.0 * voxel, 1.5 * voxel)
    )
    t = _in_plane(t) if d == 2 else t
    if not np.isfinite(t).all():
        t = start
    return t, source @ t[:d, :d].T + t[:d, d]


def judge_affine(
    source: np.ndarray, transform: np.ndarray, reference: np.ndarray, verdict: PoseCheck, seed: int
) -> Tuple[np.ndarray, PoseCheck]:
    """(transform, its check) of an affine result (``transform`` of ``source`` (n, d) onto
    ``reference``, judged by ``verdict``) against the rigid pose inside it (module docstring):
    the rigid pose and its full check when it puts at least as much of the source on the
    reference (the affine fit stopped short of a transform it contains), the result refused when
    it squeezes the shape (``MAX_ANISOTROPY``) or a distinct rigid pose fits about as well, else
    the result as judged."""
    rigid, moved = rigid_inside(source, transform, reference, verdict.voxel)
    alt = check_pose(moved, reference, verdict.voxel, seed, rivals=False)
    if alt.overlap >= verdict.overlap:
        return rigid, check_pose(moved, reference, verdict.voxel, seed)
    d = source.shape[1]
    sv = np.linalg.svd(transform[:d, :d], compute_uv=False)
    if verdict.status == 'ok' and not sv[0] <= MAX_ANISOTROPY * sv[-1]:
        reason = (
            f'the affine part stretches one direction {sv[0] / max(sv[-1], 1e-300):.3g} times '
            f'another (more than {MAX_ANISOTROPY:g}): a squeezed shape lies on any surface, '
            'which the overlap cannot vouch for (register rigidly, or from a prior pose)'
        )
        return transform, dataclasses.replace(verdict, status='refused', reason=reason)
    placed = source @ transform[:d, :d].T + transform[:d, d]
    shift = float(np.sqrt(((moved - placed) ** 2).sum(axis=1).mean()))
    distinct = shift > RIVAL_DISTINCT * verdict.gate
    if verdict.status != 'ok' or not distinct or alt.overlap < verdict.overlap - RIVAL_MARGIN:
        return transform, verdict
    reason = (
        f'a rigid pose {shift:.3g} away fits about as well ({alt.overlap:.0%} of the source '
        f'within {verdict.gate:.3g} of the reference against {verdict.overlap:.0%}): the '
        'data does not pin the affine part down (register rigidly)'
    )
    return transform, PoseCheck(
        'refused',
        reason,
        verdict.overlap,
        verdict.chance,
        verdict.excess,
        alt.overlap,
        shift,
        verdict.voxel,
        verdict.gate,
        rigid @ np.linalg.inv(transform),
    )
