"""make_relevance_problem: the synthetic heavy ranker of the RBE tests and benchmark."""

import numpy as np
import pytest

from mlpapers.datasets._relevance import make_relevance_problem


def test_shapes_determinism_and_chunking():
    Q, I, f = make_relevance_problem(30, 20, n_features=5, random_state=0)
    assert Q.shape == (30, 5) and I.shape == (20, 5)
    R = f(Q, I)
    assert R.shape == (30, 20) and np.isfinite(R).all()
    Q2, I2, f2 = make_relevance_problem(30, 20, n_features=5, random_state=0)
    np.testing.assert_array_equal(R, f2(Q2, I2))
    # scoring is a cross product: sub-blocks agree with the full matrix
    np.testing.assert_allclose(f(Q[3:7], I[[1, 4]]), R[3:7][:, [1, 4]], atol=1e-12)
    assert "rank=8" in repr(f)


def test_rank_structure():
    Q, I, f = make_relevance_problem(60, 50, rank=3, nonlinearity=0.0, random_state=1)
    s = np.linalg.svd(f(Q, I), compute_uv=False)
    assert s[4] < 1e-10 * s[0]  # bilinear rank 3 + popularity rank 1
    Q, I, f = make_relevance_problem(60, 50, rank=3, nonlinearity=1.0, random_state=1)
    s = np.linalg.svd(f(Q, I), compute_uv=False)
    assert s[10] > 1e-6 * s[0]  # the tanh interaction is not low rank


@pytest.mark.parametrize("rank, n_features", [(3, 8), (8, 8), (3, 4), (10, 4)])
def test_linear_relevance_has_the_documented_rank(rank, n_features):
    # min(rank + 1, n_features): both terms are linear in the item features
    Q, I, f = make_relevance_problem(60, 50, n_features=n_features, rank=rank,
                                     nonlinearity=0.0, random_state=1)
    assert np.linalg.matrix_rank(f(Q, I)) == min(rank + 1, n_features)


def test_bad_input():
    with pytest.raises(ValueError, match="n_items"):
        make_relevance_problem(5, 0)
    with pytest.raises(ValueError, match="nonlinearity"):
        make_relevance_problem(5, 5, nonlinearity=-1.0)
    Q, I, f = make_relevance_problem(5, 5, n_features=4, random_state=0)
    with pytest.raises(ValueError, match="4 features"):
        f(Q[:, :3], I)


def test_synthetic_ranker_allocates_one_score_matrix():
    """5k x 20k scores are 0.8 GB: no temporaries of that size besides the result."""
    import tracemalloc

    Q, I, f = make_relevance_problem(2000, 4000, n_hidden=4, random_state=0)
    tracemalloc.start()
    R = f(Q, I)  # 64 MB, and chunks of the tanh interaction of 2M values (16 MB)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1.6 * R.nbytes
