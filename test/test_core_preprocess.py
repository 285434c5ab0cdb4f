"""Input validation, downsampling and normalisation."""

import numpy as np
import pytest

from pwan_ros.core import PwanInputError
from pwan_ros.core.preprocess import (
    clean_points,
    make_normaliser,
    median_spacing,
    voxel_downsample,
)


def test_clean_points_drops_nonfinite_rows_with_warning():
    pts = np.arange(30, dtype=float).reshape(10, 3)
    pts[2, 1] = np.nan
    pts[7, 0] = np.inf
    with pytest.warns(RuntimeWarning, match='dropped 2 of 10'):
        c = clean_points(pts, 'source')
    assert c.dropped == 2 and c.points.shape == (8, 3)
    assert not c.valid[2] and not c.valid[7] and c.valid.sum() == 8


def test_far_points_warning_says_how_far_they_are():
    """Placeholder (0, 0, 0) rows in a cloud at map coordinates (4e6 m out) are left out, and the
    warning says how far from the cloud they lie (before: 'up to 0 in the input units', the
    largest coordinate of those rows)."""
    rng = np.random.default_rng(0)
    pts = rng.normal(size=(500, 3)) + [4.0e6, 5.3e5, 120.0]
    pts[:5] = 0.0
    with pytest.warns(RuntimeWarning, match=r'5 of 500 points .* \(up to 4\.03e\+06 from it'):
        c = clean_points(pts, 'source')
    assert not c.core[:5].any() and c.core[5:].all()


@pytest.mark.parametrize(
    'bad,msg',
    [
        (np.zeros((0, 3)), 'empty'),
        (np.zeros((5, 4)), '2 or 3 coordinates'),
        (np.zeros(6), 'shape'),
        (np.full((4, 3), np.nan), 'at least 3'),
        ([['a', 'b', 'c']], 'numeric'),
    ],
)
def test_clean_points_rejects_bad_input(bad, msg):
    with pytest.raises(PwanInputError, match=msg):
        clean_points(bad, 'source')


def test_voxel_downsample_averages_cells():
    pts = np.array([[0.01, 0.01, 0.01], [0.03, 0.03, 0.03], [1.01, 0.0, 0.0]])
    out = voxel_downsample(pts, 0.5)
    assert out.shape == (2, 3)
    assert np.allclose(sorted(out[:, 0]), [0.02, 1.01])


def test_normaliser_round_trip_and_spacing():
    rng = np.random.default_rng(0)
    src = rng.normal(size=(50, 3)) * 3 + 10
    ref = rng.normal(size=(60, 3)) * 2 - 5
    n = make_normaliser(src, ref, align_centroids=True)
    assert np.allclose(n.source(src).mean(0), 0, atol=1e-12)
    assert np.allclose(n.denormalise_reference(n.reference(ref)), ref)
    grid = np.stack(np.meshgrid(np.arange(4), np.arange(4), np.arange(4)), -1).reshape(-1, 3) * 0.5
    assert median_spacing(grid) == pytest.approx(0.5)
