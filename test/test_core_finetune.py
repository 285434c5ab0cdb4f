"""Fine-tune stage (eq. fine_tune): the bounded nearest-neighbour search changes no result."""
import numpy as np
import pytest
from scipy.spatial import cKDTree
from scipy.spatial.transform import Rotation

from pwan_ros.core.finetune import _nearest, estimate_normals, run_finetune


class _UnboundedTree:
    """The same k-d tree, searched without a radius: the exact reference of the bounded search."""

    def __init__(self, points):
        self.tree = cKDTree(points)
        self.n = self.tree.n

    def query(self, x, k=1, workers=1, distance_upper_bound=np.inf):
        return self.tree.query(x, k=k, workers=workers)


def _partial_pair(seed=0):
    """A curved sheet and a rotated, shifted copy of its other 60 %: partial overlap + far points."""
    rng = np.random.default_rng(seed)
    uv = rng.uniform(-1, 1, size=(3000, 2))
    sheet = np.column_stack((uv, 0.3 * np.sin(2 * uv[:, 0]) * np.cos(uv[:, 1])))
    ref = sheet[sheet[:, 0] > -0.4]
    src = sheet[sheet[:, 0] < 0.4][::2]
    rot = Rotation.from_rotvec([0.05, -0.08, 0.1]).as_matrix()
    return src @ rot.T + np.array([0.05, -0.03, 0.02]), ref


@pytest.mark.parametrize('divergence,count,h,plane', [('mass', 900, 0.0, True), ('mass', 900, 0.0, False),
                                                      ('distance', 0, 0.08, True)])
def test_bounded_search_gives_the_exact_finetune(divergence, count, h, plane):
    src, ref = _partial_pair()
    tree = cKDTree(ref)
    normals = estimate_normals(ref, tree) if plane else None
    args = (src, None, ref, 'rigid', np.eye(3), np.zeros(3), divergence, count, h, 40, 1e-9)
    bounded = run_finetune(*args[:1], tree, *args[2:], ref_normals=normals)
    exact = run_finetune(*args[:1], _UnboundedTree(ref), *args[2:], ref_normals=normals)
    assert bounded.iterations == exact.iterations
    np.testing.assert_allclose(bounded.a, exact.a, atol=1e-12)
    np.testing.assert_allclose(bounded.t, exact.t, atol=1e-12)
    np.testing.assert_array_equal(bounded.selected, exact.selected)
    np.testing.assert_allclose(bounded.distances[bounded.selected], exact.distances[exact.selected])
    # the search radius did act: points outside the overlap were never searched exactly
    assert np.isinf(bounded.distances).any()


def test_nearest_widens_a_too_small_radius():
    src, ref = _partial_pair(1)
    tree = cKDTree(ref)
    exact, _ = tree.query(src)
    need = int(0.9 * src.shape[0])
    dist, nn = _nearest(tree, src, 1e-3, need, 1)
    assert np.isfinite(dist).sum() >= need
    kth = np.sort(exact)[:need]
    np.testing.assert_allclose(np.sort(dist)[:need], kth)
    found = np.isfinite(dist)
    np.testing.assert_allclose(dist[found], np.linalg.norm(src[found] - ref[nn[found]], axis=1))


def test_selection_sample_keeps_each_reference_normal_with_its_point():
    from pwan_ros.core.finetune_stage import SAMPLE_REF_FACTOR, FineTuneData
    src, ref = _partial_pair(2)
    tree = cKDTree(ref)
    data = FineTuneData(src, ref, tree, estimate_normals(ref, tree))
    cap = 100
    small = data.subset(cap, seed=0)
    assert small.ys.shape[0] == cap and small.xr.shape[0] == SAMPLE_REF_FACTOR * cap
    row = {tuple(p): i for i, p in enumerate(ref)}
    idx = np.array([row[tuple(p)] for p in small.xr])
    np.testing.assert_array_equal(small.normals, data.normals[idx])
    assert small.tree.n == small.xr.shape[0]
    np.testing.assert_array_equal(small.tree.data, small.xr)
    # the same sample every time (deterministic per seed), and no sampling below the caps
    np.testing.assert_array_equal(data.subset(cap, seed=0).xr, small.xr)
    assert data.subset(0, seed=0) is not None and data.subset(0, seed=0).xr.shape == ref.shape
