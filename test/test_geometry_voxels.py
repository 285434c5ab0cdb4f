"""The one voxel grid (pwan_ros.geometry.voxels) and the one far-outlier rule
(pwan_ros.geometry.outliers)."""

import numpy as np
import pytest

from pwan_ros.geometry.outliers import FAR_OUTLIER_FACTOR, far_outliers
from pwan_ros.geometry.voxels import voxel_grid


def _unique_grid(points, voxel, origin):
    """The plain np.unique grid: centroids in key order, counts, first point per voxel."""
    keys = np.floor((points - origin) / voxel).astype(np.int64)
    _, first, inverse, counts = np.unique(
        keys, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    inverse = inverse.reshape(-1)
    sums = np.zeros((len(counts), points.shape[1]))
    np.add.at(sums, inverse, points)
    return sums / counts[:, None], counts, first


@pytest.mark.parametrize('dim', [2, 3])
def test_grid_equals_the_plain_unique_grid(dim):
    rng = np.random.default_rng(dim)
    pts = rng.normal(size=(3000, dim)) * [3.0, 1.0, 0.2][:dim] + 40.0
    origin = pts.min(axis=0)
    grid = voxel_grid(pts, 0.25, origin=origin)
    cent, counts, first = _unique_grid(pts, 0.25, origin)
    np.testing.assert_array_equal(grid.centroids, cent)  # bit for bit, key order
    np.testing.assert_array_equal(grid.counts, counts)
    np.testing.assert_array_equal(grid.first, first)  # the first point of each voxel
    np.testing.assert_array_equal(grid.shared, counts >= 2)
    assert (grid.keys >= 1).all() and (grid.keys <= grid.span - 2).all()
    # order lists each voxel's points in input order
    for v in (0, len(counts) // 2, len(counts) - 1):
        members = grid.order[grid.starts[v] : grid.starts[v] + counts[v]]
        np.testing.assert_array_equal(members, np.flatnonzero(grid.inverse == v))


def test_grid_too_wide_for_flat_keys_sorts_the_same_way():
    """A cloud spanning ~1e10 voxels per axis: no 63-bit flat keys (None, or ValueError when
    they are required), the same voxels in the same order from a lexsort."""
    rng = np.random.default_rng(1)
    pts = np.vstack([rng.uniform(0, 1, (500, 3)), [[1e7, 1e7, 1e7]]])
    grid = voxel_grid(pts, 1e-3)
    assert grid.flat is None
    cent, counts, _ = _unique_grid(pts, 1e-3, np.zeros(3))
    np.testing.assert_array_equal(grid.centroids, cent)
    np.testing.assert_array_equal(grid.counts, counts)
    with pytest.raises(ValueError, match='too small'):
        voxel_grid(pts, 1e-3, require_flat=True)
    with pytest.raises(ValueError, match='too small'):
        voxel_grid(np.array([[0.0, 0, 0], [1e300, 0, 0]]), 1.0)


def test_open3d_downsample_is_this_grid_half_a_voxel_lower():
    o3d = pytest.importorskip('open3d')
    pts = np.random.default_rng(2).uniform(-5, 5, (20000, 3))
    voxel = 0.37
    pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(pts))
    theirs = np.asarray(pcd.voxel_down_sample(voxel).points)
    ours = voxel_grid(pts, voxel, origin=pts.min(axis=0) - voxel * 0.5).centroids
    np.testing.assert_array_equal(
        theirs[np.lexsort(theirs.T[::-1])], ours[np.lexsort(ours.T[::-1])]
    )


def test_far_rule_drops_glitches_only():
    rng = np.random.default_rng(3)
    pts = rng.normal(size=(2000, 3)) * 5.0
    assert not far_outliers(pts).any()
    med = np.median(pts, axis=0)
    spread = np.median(np.linalg.norm(pts - med, axis=1))
    reach = FAR_OUTLIER_FACTOR * spread
    out = med + np.array([[0.9 * reach, 0, 0], [1.1 * reach, 0, 0], [1e19, 0, 0]])
    far = far_outliers(np.vstack([pts, out]))
    np.testing.assert_array_equal(np.flatnonzero(far), [2001, 2002])
    assert not far_outliers(np.zeros((5, 3))).any()
    assert far_outliers(np.zeros((0, 3))).shape == (0,)
