"""Farthest-point and k-means support selection on relevance with large offsets.

Regression: both computed squared distances as |x|^2 - 2 x.y + |y|^2, which cancels for
items far from the origin: a relevance offset by 1e6 changed the farthest-point picks
from the 14th on, and per-query offsets of 1e7 made k-means return members farther
from their centroid than others of the same cluster.
"""

import numpy as np
import pytest

from mlpapers.retrieval.rbe import select_support


def _farthest_reference(X, k):
    """Farthest-point traversal from the item farthest from the mean, in numpy."""
    picks = [int(np.argmax(np.linalg.norm(X - X.mean(0), axis=1)))]
    dmin = np.linalg.norm(X - X[picks[0]], axis=1)
    dmin[picks[0]] = -1.0
    for _ in range(k - 1):
        j = int(np.argmax(dmin))
        picks.append(j)
        dmin = np.minimum(dmin, np.linalg.norm(X - X[j], axis=1))
        dmin[j] = -1.0
    return np.array(picks)


@pytest.mark.parametrize("offset", ["common", "per_query"])
def test_farthest_picks_do_not_depend_on_offsets(offset):
    rng = np.random.default_rng(2)
    R = rng.standard_normal((300, 1000))
    shift = 1e6 if offset == "common" else 1e8 * rng.standard_normal((300, 1))
    ref = _farthest_reference(R.T, 30)
    np.testing.assert_array_equal(select_support(R, 30, "farthest", center=False), ref)
    np.testing.assert_array_equal(select_support(R + shift, 30, "farthest", center=False), ref)


def test_kmeans_picks_do_not_depend_on_per_query_offsets():
    # k-means clusters the centred item vectors (the offsets cancel there); the member
    # nearest each centroid must be too (with the cancellation, two clusters took
    # members farther from their centroid than the plain data's picks)
    rng = np.random.default_rng(0)
    R = rng.standard_normal((30, 200))
    shifted = R + 1e7 * rng.standard_normal(30)[:, None]
    plain = select_support(R, 8, "kmeans", random_state=0)
    np.testing.assert_array_equal(select_support(shifted, 8, "kmeans", random_state=0), plain)
