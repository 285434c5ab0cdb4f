"""Fine-tune stage (eq. fine_tune): the bounded nearest-neighbour search changes no result."""

import numpy as np
import pytest
from scipy.spatial import cKDTree
from scipy.spatial.transform import Rotation

from pwan_ros.core.nearest import estimate_normals
from pwan_ros.core.finetune.objective import (
    FineTuneData,
    Selection,
    Transform,
    _nearest,
    run_finetune,
)


def _finetune(src, tree, ref, normals, selection, iterations=40):
    """The rigid fine-tune of src onto ref (searched with ``tree``) from identity."""
    data = FineTuneData(src, ref, tree, normals)
    return run_finetune(
        data, 'rigid', Transform(np.eye(3), np.zeros(3)), selection, (iterations, 1e-9)
    )


class _UnboundedTree:
    """The same k-d tree, searched without a radius: the exact reference of the bounded search."""

    def __init__(self, points):
        self.tree = cKDTree(points)
        self.n = self.tree.n

    def query(self, x, k=1, workers=1, distance_upper_bound=np.inf):
        return self.tree.query(x, k=k, workers=workers)


def _partial_pair(seed=0):
    """A curved sheet and a rotated, shifted copy of its other 60 %: partial overlap + far
    points."""
    rng = np.random.default_rng(seed)
    uv = rng.uniform(-1, 1, size=(3000, 2))
    sheet = np.column_stack((uv, 0.3 * np.sin(2 * uv[:, 0]) * np.cos(uv[:, 1])))
    ref = sheet[sheet[:, 0] > -0.4]
    src = sheet[sheet[:, 0] < 0.4][::2]
    rot = Rotation.from_rotvec([0.05, -0.08, 0.1]).as_matrix()
    return src @ rot.T + np.array([0.05, -0.03, 0.02]), ref


@pytest.mark.parametrize(
    'divergence,count,h,plane',
    [('mass', 900, 0.0, True), ('mass', 900, 0.0, False), ('distance', 0, 0.08, True)],
)
def test_bounded_search_gives_the_exact_finetune(divergence, count, h, plane):
    src, ref = _partial_pair()
    tree = cKDTree(ref)
    normals = estimate_normals(ref, tree) if plane else None
    selection = Selection(divergence, count, h)
    bounded = _finetune(src, tree, ref, normals, selection)
    exact = _finetune(src, _UnboundedTree(ref), ref, normals, selection)
    assert bounded.iterations == exact.iterations
    np.testing.assert_allclose(bounded.a, exact.a, atol=1e-12)
    np.testing.assert_allclose(bounded.t, exact.t, atol=1e-12)
    np.testing.assert_array_equal(bounded.selected, exact.selected)
    np.testing.assert_allclose(
        bounded.distances[bounded.selected], exact.distances[exact.selected]
    )
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
    from pwan_ros.core.finetune.objective import SAMPLE_REF_FACTOR

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


def _metric_sets(seed=0):
    """Reference (metres, a lidar-like extent far from the origin) with exact duplicates, and
    queries: noisy copies of reference points, points on a tie between two reference points,
    and far points."""
    rng = np.random.default_rng(seed)
    offset = np.array([4.2e3, -1.3e3, 35.0])
    ref = rng.uniform(-40, 40, size=(3000, 3)) + offset
    ref = np.vstack((ref, ref[:50]))  # exact duplicates: ties
    near = ref[rng.choice(3000, 1500)] + rng.normal(0, 0.05, (1500, 3))
    mid = 0.5 * (ref[100:150] + ref[150:200])  # equidistant from two points
    far = offset + rng.uniform(-400, 400, size=(300, 3))
    return ref, np.vstack((near, ref[:20], mid, far))


@pytest.mark.parametrize('chunk', [1 << 24, 1 << 16])
@pytest.mark.parametrize('bound', [np.inf, 2.0, 0.05])
def test_torch_nearest_equals_the_kd_tree(chunk, bound):
    from pwan_ros.core.nearest import TorchNearest

    ref, q = _metric_sets()
    tree = cKDTree(ref)
    tn = TorchNearest(ref, 'cpu', chunk_elements=chunk)  # 2^16: rows and references in blocks
    assert tn.n == tree.n
    d0, i0 = tree.query(q, distance_upper_bound=bound)
    d1, i1 = tn.query(q, distance_upper_bound=bound)
    assert d1.shape == (q.shape[0],) and d1.dtype == np.float64 and i1.dtype == np.int64
    found = np.isfinite(d0)
    np.testing.assert_array_equal(np.isfinite(d1), found)
    np.testing.assert_array_equal(i1[~found], tree.n)  # beyond the bound: inf and index n
    if np.isfinite(bound):
        assert (~found).any() and (d1[found] < bound).all()
    np.testing.assert_allclose(d1[found], d0[found], rtol=1e-12)
    # the same index except on ties, where the index returned is at the same (exact) distance
    np.testing.assert_allclose(
        np.linalg.norm(q[found] - ref[i1[found]], axis=1), d1[found], rtol=1e-12
    )
    tie = i0 != i1
    assert tie.sum() <= 70, tie.sum()  # duplicates + midpoints only
    # k > 1 (normals, spacing): the k nearest, nearest first
    d0, i0 = tree.query(q[:500], k=4)
    d1, i1 = tn.query(q[:500], k=4)
    assert d1.shape == (500, 4)
    np.testing.assert_allclose(d1, d0, rtol=1e-12)
    assert (np.diff(d1, axis=1) >= 0).all()


@pytest.mark.parametrize('bound', [np.inf, 2.0, 0.05])
def test_host_nearest_equals_the_kd_tree(bound):
    """The fine-tune's host search (small_gicp's k-d tree for 3-D nearest neighbours) gives
    scipy's distances, its indices up to ties, and inf / index n beyond the bound (sets in metres,
    1 km from the origin, duplicates, midpoints and far points); k > 1 and 2-D go to scipy."""
    from pwan_ros.core.nearest import HostNearest, make_search

    ref, q = _metric_sets()
    tree = cKDTree(ref)
    hn = make_search(ref)
    assert isinstance(hn, HostNearest) and hn.n == tree.n
    d0, i0 = tree.query(q, distance_upper_bound=bound)
    d1, i1 = hn.query(q, distance_upper_bound=bound, workers=-1)
    assert d1.shape == (q.shape[0],) and d1.dtype == np.float64
    found = np.isfinite(d0)
    np.testing.assert_array_equal(np.isfinite(d1), found)
    np.testing.assert_array_equal(i1[~found], tree.n)
    np.testing.assert_allclose(d1[found], d0[found], rtol=1e-12)
    np.testing.assert_allclose(
        np.linalg.norm(q[found] - ref[i1[found]], axis=1), d1[found], rtol=1e-12
    )
    assert (i0 != i1).sum() <= 70  # duplicates + midpoints only
    d0, i0 = tree.query(q[:500], k=4)
    d1, i1 = hn.query(q[:500], k=4)
    np.testing.assert_array_equal(d1, d0)
    flat = HostNearest(ref[:, :2])
    np.testing.assert_array_equal(flat.query(q[:, :2])[0], cKDTree(ref[:, :2]).query(q[:, :2])[0])


def test_host_nearest_answers_bounded_queries_off_the_reference_in_the_bounded_search():
    """A query bounded within a few reference spacings after one whose rows lay mostly farther is
    answered by scipy's bounded search (small_gicp's has no bound: slow for far rows), one after a
    query mostly near by small_gicp, an unbounded one always by small_gicp; every answer is the
    k-d tree's (metres, 1 km from the origin, a source 30 m off with a tenth of it on the
    reference)."""
    from pwan_ros.core.nearest import BOUNDED_SPACINGS, HostNearest

    ref, _ = _metric_sets()
    hn = HostNearest(ref)
    tree = cKDTree(ref)
    assert 0.5 < hn.spacing < 5.0  # ~3 m: 3050 points in an 80 m cube
    calls = []

    class Counted:  # small_gicp's tree, its calls counted
        def __init__(self, fast):
            self.fast = fast

        def batch_nearest_neighbor_search(self, x, num_threads=1):
            calls.append(len(x))
            return self.fast.batch_nearest_neighbor_search(x, num_threads=num_threads)

    hn._fast = Counted(hn._fast)
    rng = np.random.default_rng(2)
    near = ref[rng.choice(3000, 200)] + rng.normal(0, 0.05, (200, 3))
    off = np.vstack((near, ref[rng.choice(3000, 1800)] + np.array([30.0, 30.0, 30.0])))
    bound = 2.0 * hn.spacing
    assert bound <= BOUNDED_SPACINGS * hn.spacing
    queries = (off, off, off, near, near, off, off, off)
    bounds = (bound,) * 5 + (np.inf, bound, bound)
    answered_by_small_gicp = (True, False, False, False, True, True, True, False)
    for q, b, small_gicp in zip(queries, bounds, answered_by_small_gicp):
        before = len(calls)
        d, i = hn.query(q, distance_upper_bound=b)
        assert (len(calls) > before) == small_gicp
        d0, i0 = tree.query(q, distance_upper_bound=b)
        np.testing.assert_array_equal(np.isfinite(d), np.isfinite(d0))
        np.testing.assert_allclose(d[np.isfinite(d)], d0[np.isfinite(d0)], rtol=1e-12)
        np.testing.assert_array_equal(i[~np.isfinite(d)], tree.n)


def test_fine_tune_searches_use_the_registration_threads(monkeypatch, thread_starts):
    """The fine-tune's host searches get the registration's thread budget (``threads``; 0: the
    automatic count), small_gicp's threaded answers equal its single-thread ones, scipy's small
    queries start no thread, and both registrations find the pose (a pair in metres, 500 m from
    the origin, 40 % outliers, a 30 deg turn)."""
    from _core_shapes import blob, rot3, rot_err_deg
    from pwan_ros.core import RegistrationConfig, register
    from pwan_ros.core.device import default_threads
    from pwan_ros.core.nearest import HostNearest

    ref, q = _metric_sets()
    hn = HostNearest(ref)
    d1, i1 = hn.query(q, workers=1)
    d3, i3 = hn.query(q, workers=3)
    np.testing.assert_array_equal(d3, d1)
    np.testing.assert_array_equal(i3, i1)
    # the queries scipy answers (k > 1) stay on the calling thread below PARALLEL_QUERY_ROWS rows:
    # scipy starts its worker threads anew on every call
    d4, _ = hn.query(q[:500], k=4, workers=-1)
    np.testing.assert_array_equal(d4, cKDTree(ref).query(q[:500], k=4)[0])
    assert thread_starts == []

    seen = []
    real = HostNearest.query

    def spy(self, x, k=1, distance_upper_bound=np.inf, workers=1):
        if k == 1:
            seen.append(workers)
        return real(self, x, k=k, distance_upper_bound=distance_upper_bound, workers=workers)

    monkeypatch.setattr(HostNearest, 'query', spy)
    rng = np.random.default_rng(4)
    pts = blob(1500, seed=4) * 8.0 + 500.0
    src = pts @ rot3(0.0, 0.0, 30.0).T + np.array([3.0, -2.0, 1.0])
    src = np.vstack((src, rng.uniform(-40, 40, size=(600, 3)) + 500.0))
    results = {}
    for threads in (3, 0):
        seen.clear()
        res = register(src, pts, RegistrationConfig(seed=1, threads=threads))
        assert seen and set(seen) == {threads or default_threads()}, (threads, set(seen))
        results[threads] = rot_err_deg(res.transform[:3, :3], rot3(0.0, 0.0, 30.0).T)
    assert max(results.values()) < 0.5, results


def test_torch_nearest_fewer_points_than_k_pads_as_the_tree():
    from pwan_ros.core.nearest import TorchNearest

    ref = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    d, i = TorchNearest(ref).query(np.array([[0.2, 0.0, 0.0]]), k=3)
    np.testing.assert_allclose(d[0, :2], [0.2, 0.8])
    assert np.isinf(d[0, 2]) and i.tolist() == [[0, 1, 2]]


def test_finetune_with_the_torch_search_equals_the_kd_tree():
    from pwan_ros.core.nearest import TorchNearest

    src, ref = _partial_pair(3)
    tree = cKDTree(ref)
    normals = estimate_normals(ref, tree)
    selection = Selection('mass', 900, 0.0)
    kd = _finetune(src, tree, ref, normals, selection)
    tn = _finetune(src, TorchNearest(ref), ref, normals, selection)
    assert kd.iterations == tn.iterations
    np.testing.assert_allclose(tn.a, kd.a, atol=1e-10)
    np.testing.assert_allclose(tn.t, kd.t, atol=1e-10)
    np.testing.assert_array_equal(tn.selected, kd.selected)


@pytest.mark.parametrize('transform', ['rigid', 'affine'])
def test_register_with_the_torch_search_forced_on_cpu(transform, monkeypatch):
    """finetune.nn='torch' on CPU (the path CUDA registrations take by default) gives the pose of
    the k-d tree."""
    from _core_shapes import blob, rot3
    from pwan_ros.core import RegistrationConfig, register
    from pwan_ros.core.config import FineTuneConfig
    from pwan_ros.core.nearest import TorchNearest

    calls = []
    query = TorchNearest.query
    monkeypatch.setattr(
        TorchNearest, 'query', lambda self, *a, **k: calls.append(1) or query(self, *a, **k)
    )
    src = blob(600, 1) * 20.0  # metres
    ref = (blob(600, 0) * 20.0) @ rot3(10, -5, 8).T + np.array([3.0, -2.0, 1.0])
    res = {}
    for nn in ('kdtree', 'torch'):
        cfg = RegistrationConfig(
            transform=transform, seed=0, device='cpu', steps=80, finetune=FineTuneConfig(nn=nn)
        )
        res[nn] = register(src, ref, cfg)
        assert (len(calls) > 0) == (nn == 'torch')
    assert res['torch'].device == 'cpu'
    np.testing.assert_allclose(res['torch'].transform, res['kdtree'].transform, atol=1e-9)
    np.testing.assert_array_equal(res['torch'].match_weights, res['kdtree'].match_weights)


def test_nn_mode_validated_and_auto_picks_the_tree_on_every_device():
    import torch
    from pwan_ros.core import PwanInputError
    from pwan_ros.core.config import FineTuneConfig
    from pwan_ros.core.nearest import search_device

    with pytest.raises(PwanInputError, match='finetune.nn'):
        FineTuneConfig(nn='faiss')
    cpu, cuda = torch.device('cpu'), torch.device('cuda')
    assert search_device('auto', cpu) is None and search_device('kdtree', cuda) is None
    assert search_device('auto', cuda) is None
    assert search_device('torch', cpu) == cpu and search_device('torch', cuda) == cuda
