import numpy as np
import pytest
from sklearn.datasets import load_digits

from mlpapers.datasets import make_federated_digits, make_federated_linear


@pytest.mark.parametrize("separation", [1.0, 0.1, 0.01])
def test_linear_models_unit_norm_and_separated(separation):
    clients, labels, coef = make_federated_linear(n_clusters=5, n_clients_per_cluster=2,
                                                  separation=separation, random_state=0)
    np.testing.assert_allclose(np.linalg.norm(coef, axis=1), 1.0, rtol=1e-12)
    d = np.linalg.norm(coef[:, None] - coef[None], axis=2)[np.triu_indices(5, 1)]
    assert d.min() >= separation and d.max() <= 5 * separation
    np.testing.assert_array_equal(labels, np.repeat(np.arange(5), 2))
    assert len(clients) == 10


def test_linear_targets_follow_the_cluster_model():
    clients, labels, coef = make_federated_linear(n_clusters=3, n_clients_per_cluster=2,
                                                  n_samples=400, noise=0.05, random_state=1)
    for (X, y), k in zip(clients, labels):
        assert X.shape == (400, 20) and y.shape == (400,) and X.dtype == np.float32
        resid = y - X @ coef[k]
        assert abs(resid.std() - 0.05) < 0.01
        w = np.linalg.lstsq(X, y, rcond=None)[0]
        assert np.argmin(np.linalg.norm(coef - w, axis=1)) == k


def test_linear_determinism_and_errors():
    a = make_federated_linear(random_state=3)
    b = make_federated_linear(random_state=3)
    np.testing.assert_array_equal(a[0][4][0], b[0][4][0])
    np.testing.assert_array_equal(a[2], b[2])
    with pytest.raises(ValueError, match="separation"):
        make_federated_linear(separation=3.0)
    with pytest.raises(ValueError, match="n_samples"):
        make_federated_linear(n_samples=0)
    with pytest.raises(ValueError, match="could not place"):
        make_federated_linear(n_clusters=10, n_features=2, separation=1.2, random_state=0)


def test_digits_rotation_clusters_are_rotations_of_real_digits():
    clients, labels = make_federated_digits("rotation", n_clusters=4, n_clients_per_cluster=2,
                                            n_samples=30, random_state=0)
    originals = load_digits().images / 16.0
    flat = originals.reshape(len(originals), -1)
    for (X, y), k in zip(clients, labels):
        assert X.shape == (30, 64) and X.dtype == np.float32 and y.dtype == np.int64
        back = np.rot90(X.reshape(-1, 8, 8), -k, axes=(1, 2)).reshape(len(X), -1)
        dist = np.abs(back[:, None] - flat[None]).max(axis=2).min(axis=1)
        assert dist.max() < 1e-6


def test_digits_label_swap_permutations_differ_and_disjoint_samples():
    clients, labels = make_federated_digits("label_swap", n_clusters=5, n_clients_per_cluster=2,
                                            n_samples=60, n_swaps=2, random_state=0)
    digits = load_digits()
    flat = (digits.images / 16.0).reshape(len(digits.images), -1).astype(np.float32)
    perms = {}
    used = []
    for (X, y), k in zip(clients, labels):
        idx = np.array([np.flatnonzero((flat == x).all(1))[0] for x in X])
        used.append(idx)
        perm = perms.setdefault(k, {})
        for t, yy in zip(digits.target[idx], y):
            assert perm.setdefault(t, yy) == yy  # one fixed relabelling per cluster
    used = np.concatenate(used)
    assert len(np.unique(used)) == len(used)  # 600 <= 1797: no digit reused
    tables = [tuple(sorted(p.items())) for p in perms.values()]
    assert len(set(tables)) == 5
    assert all(v == t for t, v in perms[0].items())  # cluster 0 keeps true labels
    for k in range(1, 5):
        moved = sum(t != v for t, v in perms[k].items())
        assert moved <= 4


def test_digits_errors():
    with pytest.raises(ValueError, match="kind"):
        make_federated_digits("shift")
    with pytest.raises(ValueError, match="8 clusters"):
        make_federated_digits("rotation", n_clusters=9)
    with pytest.raises(ValueError, match="n_swaps"):
        make_federated_digits("label_swap", n_swaps=6)


@pytest.mark.parametrize("K, separation", [(2, 1.9), (2, 2.0), (3, 1.7), (5, 1.5)])
def test_linear_large_separations_up_to_the_simplex_bound(K, separation):
    # separations the docstring allowed (<= 2) but random perturbations cannot reach
    # raised "could not place ..."; a regular simplex reaches sqrt(2K / (K - 1))
    _, _, coef = make_federated_linear(n_clusters=K, n_clients_per_cluster=1, n_samples=3,
                                       separation=separation, random_state=0)
    np.testing.assert_allclose(np.linalg.norm(coef, axis=1), 1.0)
    dist = np.linalg.norm(coef[:, None] - coef[None], axis=2)[np.triu_indices(K, 1)]
    assert dist.min() >= separation * (1 - 1e-12) and dist.max() <= 5 * separation
    with pytest.raises(ValueError, match="separation must be <="):
        make_federated_linear(n_clusters=K, separation=np.sqrt(2 * K / (K - 1)) + 1e-3)


def test_linear_one_feature_places_opposite_models_without_warnings():
    # with n_features=1 the only unit models are -1 and +1: two clusters fit (distance 2),
    # three do not; before, a 0/0 warning was followed by "could not place" for K=2
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, groups, theta = make_federated_linear(n_clusters=2, n_features=1, random_state=0)
        assert sorted(np.asarray(theta).ravel().tolist()) == [-1.0, 1.0]
        assert abs(make_federated_linear(n_clusters=1, n_features=1, random_state=0)[2]).item() == 1
    with pytest.raises(ValueError, match="n_features=1"):
        make_federated_linear(n_clusters=3, n_features=1, random_state=0)


def test_linear_more_models_than_a_circle_holds_use_a_cross_polytope():
    """Six models in 3-D at separation 1.2 fit neither on a circle (6 steps of
    2 asin(0.6) exceed 2 pi) nor as perturbations of one centre: the layout falls back to
    the vertices +-q_i of a rotated cross-polytope (distances sqrt(2) and 2)."""
    for seed in range(3):
        _, _, coef = make_federated_linear(n_clusters=6, n_features=3, separation=1.2,
                                           random_state=seed)
        np.testing.assert_allclose(np.linalg.norm(coef, axis=1), 1.0, rtol=1e-12)
        dist = np.linalg.norm(coef[:, None] - coef[None], axis=-1)[~np.eye(6, dtype=bool)]
        assert dist.min() >= 1.2 and dist.max() <= 5 * 1.2
        np.testing.assert_allclose(np.sort(np.unique(dist.round(9))), [np.sqrt(2), 2.0])
    # separation 1.5 (below the simplex bound 1.549) has no layout: a clear error
    with pytest.raises(ValueError, match="could not place 6 unit-norm models in 3 dim"):
        make_federated_linear(n_clusters=6, n_features=3, separation=1.5, random_state=0)


def test_linear_circle_at_its_documented_bound_and_separations_below_resolution():
    # 2 sin(pi / 6) = 1 is the documented circle bound for six models: 6 * 2 asin(0.5)
    # rounded one step above 2 pi and the layout was refused for every seed
    for seed in range(3):
        _, _, coef = make_federated_linear(n_clusters=6, n_features=2, separation=1.0,
                                           random_state=seed)
        dist = np.linalg.norm(coef[:, None] - coef[None], axis=-1)[~np.eye(6, dtype=bool)]
        np.testing.assert_allclose(dist.min(), 1.0, rtol=1e-12)
    # unit vectors 1e-300 apart are one point in float64: three identical models came
    # back without an error
    with pytest.raises(ValueError, match=r"^could not place 3 unit-norm models .*raise "
                                         r"separation"):
        make_federated_linear(n_clusters=3, n_features=20, separation=1e-300, random_state=0)


def test_linear_noise_beyond_float32_is_refused():
    # the targets overflowed to inf with only numpy's cast warning
    with pytest.raises(ValueError, match=r"^noise=1e\+39 puts values beyond float32's range"):
        make_federated_linear(2, 1, 5, 3, noise=1e39, random_state=0)


@pytest.mark.parametrize("K", [3, 4, 6])
@pytest.mark.parametrize("separation", [1e-4, 3e-4, 1e-8])
def test_small_separations_on_the_circle_are_placed_for_every_seed(K, separation):
    # more clusters than features: the circle layout puts neighbours exactly separation
    # apart, and a relative tolerance of 1e-12 refused most seeds at 1e-4 (the rounding
    # of unit vectors is absolute, ~1e-16), advising a lower separation
    for seed in range(10):
        _, _, coef = make_federated_linear(n_clusters=K, n_clients_per_cluster=1,
                                           n_samples=2, n_features=2,
                                           separation=separation, random_state=seed)
        dist = np.linalg.norm(coef[:, None] - coef[None], axis=2)[np.triu_indices(K, 1)]
        np.testing.assert_allclose(np.linalg.norm(coef, axis=1), 1.0, rtol=1e-12)
        # [separation, 5 separation] up to the rounding of unit vectors (absolute)
        assert dist.min() >= separation - 1e-14
        assert dist.max() <= 5 * separation + 1e-14
