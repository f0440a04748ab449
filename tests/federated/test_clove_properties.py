"""CLoVE: properties that must hold for every valid input, on inputs hypothesis generates.

Relations: :func:`clove_assign` gives identical loss vectors one model, is equivariant
to permuting clients and models (its total loss is invariant), invariant to a positive
rescaling and a shift of all losses, equals the argmin of the column sums for one
cluster and the optimal injective matching when every client is its own cluster, and
its centres are the means of their clients' loss vectors; :func:`ifca_assign` is the
row argmin, invariant to per-client shifts and rescalings; :func:`choose_n_clusters`
stays within its documented range; the per-model weighted average is invariant to
client order and to rescaling the weights, stays in the convex hull of its clients
and leaves models without clients untouched; the batched loss matrix does not depend
on the chunk size. Estimators: ``predict`` with ``client=i`` is the model of
``labels_[i]``, probabilities are a softmax whose argmax is ``predict``, ``assign`` of
a training client is its lowest-loss model, ``score`` is the documented mean, and
with full-batch local training the fit is equivariant to the order of the clients
(FedAvg is also invariant to duplicating every client). The Flower strategy's
server-side average has the same invariances.

``PROP_EXAMPLES`` raises the number of examples when exploring locally.
"""

import itertools
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics import r2_score

from mlpapers.federated import (
    IFCA,
    CLoVE,
    FedAvg,
    choose_n_clusters,
    clove_assign,
    ifca_assign,
)
from mlpapers.federated.clove._assign import match_clusters
from mlpapers.federated.clove._kernels import (
    batched_loss_matrix,
    random_assignment,
    weighted_model_average,
)
from mlpapers.federated.clove._models import build_module, make_sample_loss_fn

N = int(os.environ.get("PROP_EXAMPLES", 15))
prop = settings(max_examples=N, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
finite = dict(allow_nan=False, allow_infinity=False)


@st.composite
def loss_matrices(draw, max_n=9, max_m=4, min_n=1, min_m=1):
    """Loss matrices with ties, repeated rows, constant columns and several scales;
    "milli" entries (multiples of 0.001) make float ties of summed losses likely."""
    n = draw(st.integers(min_n, max_n))
    m = draw(st.integers(min_m, max_m))
    kind = draw(st.sampled_from(["float", "int", "repeat", "milli"]))
    if kind == "int":
        L = draw(hnp.arrays(np.float64, (n, m), elements=st.integers(0, 3).map(float)))
    elif kind == "milli":
        L = draw(hnp.arrays(np.float64, (n, m),
                            elements=st.sampled_from([0.0, 0.001, 0.003, 0.1])))
    else:
        # rounded to 1e-6: k-means cannot separate rows that differ by 1e-38 next to rows
        # that differ by 1 (it merges them and warns), a scale gap no loss vector has
        L = draw(hnp.arrays(np.float64, (n, m),
                            elements=st.floats(0, 10, **finite).map(lambda v: round(v, 6))))
    if kind == "repeat":  # each row a copy of one of a few prototypes
        protos = max(1, n // 2)
        L = L[draw(hnp.arrays(np.int64, n, elements=st.integers(0, protos - 1)))]
    return L * draw(st.sampled_from([1.0, 1e-3, 1e3]))


def _k(draw, L):
    return draw(st.integers(1, min(L.shape)))


def _total(L, a):
    return float(L[np.arange(len(a)), a].sum())


# -- clove_assign ------------------------------------------------------------------------
@given(loss_matrices(), st.data())
@prop
def test_clove_assign_range_and_identical_rows_share_a_model(L, data):
    k = _k(data.draw, L)
    a = clove_assign(L, k, random_state=0)
    assert a.shape == (L.shape[0],) and a.dtype == np.int64
    assert a.min() >= 0 and a.max() < L.shape[1]
    assert len(np.unique(a)) <= min(k, np.unique(L, axis=0).shape[0])
    for i, j in itertools.combinations(range(L.shape[0]), 2):
        if np.array_equal(L[i], L[j]):
            assert a[i] == a[j]
    # passing the embedding's own losses as match_losses is the default
    np.testing.assert_array_equal(clove_assign(L, k, random_state=0, match_losses=L), a)


def _best_injective_cost(cost):
    """Independent brute force: the least total cost of an injective row -> column map."""
    return min(cost[np.arange(len(cost)), list(p)].sum()
               for p in itertools.permutations(range(cost.shape[1]), len(cost)))


@given(loss_matrices(), st.data())
@prop
def test_match_clusters_is_an_optimal_injective_matching(L, data):
    """For any clustering of the clients (ties, repeated rows, constant columns), the
    cluster -> model map is injective and no other injective map costs less."""
    k = _k(data.draw, L)
    n = L.shape[0]
    labels = np.r_[np.arange(k), data.draw(
        hnp.arrays(np.int64, n - k, elements=st.integers(0, k - 1)))]
    labels = labels[data.draw(st.permutations(range(n)))]
    perm = match_clusters(L, labels, k)
    assert len(set(perm.tolist())) == k and perm.min() >= 0 and perm.max() < L.shape[1]
    cost = np.stack([L[labels == j].sum(axis=0) for j in range(k)])  # clusters x models
    assert cost[np.arange(k), perm].sum() == pytest.approx(_best_injective_cost(cost),
                                                           rel=1e-12, abs=1e-12)


@given(loss_matrices(), st.data())
@prop
def test_clove_assign_limits_one_cluster_and_one_client_per_cluster(L, data):
    a1 = clove_assign(L, 1, random_state=0)
    # one cluster: every client takes the model of least total loss (a tie: any of them)
    col = L.sum(axis=0)
    assert len(np.unique(a1)) == 1 and col[a1[0]] == pytest.approx(col.min(), rel=1e-12)
    rows = np.unique(L, axis=0)
    if len(rows) == L.shape[0] and L.shape[0] <= L.shape[1]:
        # every client its own cluster: the optimal injective client -> model matching
        a = clove_assign(L, L.shape[0], random_state=0)
        assert len(np.unique(a)) == L.shape[0]
        assert _total(L, a) == pytest.approx(_best_injective_cost(L), rel=1e-12, abs=1e-12)


@st.composite
def separated_loss_matrices(draw):
    """Loss vectors around k well-separated prototypes (k-means has one clear optimum)."""
    m = draw(st.integers(1, 4))
    k = draw(st.integers(1, m))
    protos = draw(hnp.arrays(np.float64, (k, m), elements=st.floats(0, 10, **finite)))
    d = np.linalg.norm(protos[:, None] - protos[None], axis=-1)[np.triu_indices(k, 1)]
    assume(k == 1 or d.min() > 1.0)
    labels = np.r_[np.arange(k), draw(hnp.arrays(np.int64, draw(st.integers(0, 6)),
                                                 elements=st.integers(0, k - 1)))]
    noise = draw(hnp.arrays(np.float64, (len(labels), m), elements=st.floats(0, 0.01)))
    return protos[labels] + noise, k, labels


@given(loss_matrices(min_n=3, min_m=2), st.data(), st.randoms(use_true_random=False))
@prop
def test_clove_assign_equivariant_to_client_order(L, data, rnd):
    k = data.draw(st.integers(2, min(L.shape)))  # (k = 1: see the limits test)
    a = clove_assign(L, k, random_state=0)
    rows = list(range(L.shape[0]))
    rnd.shuffle(rows)
    # documented: the result does not depend on the order of the clients (ties included)
    np.testing.assert_array_equal(clove_assign(L[rows], k, random_state=0), a[rows])


@given(separated_loss_matrices(), st.randoms(use_true_random=False))
@prop
def test_clove_assign_finds_separated_clusters_in_any_model_order(case, rnd):
    # Not for every matrix: k-means picks among equally good partitions by the order in
    # which it sees the points (exact ties, e.g. L = [[2,0,0],[0,0,0]x3,[0,2,0]], k = 2),
    # and relabelling the models reorders the sorted rows. With a unique optimum it holds.
    L, k, labels = case
    a = clove_assign(L, k, random_state=0)
    same = labels[:, None] == labels[None, :]
    np.testing.assert_array_equal(a[:, None] == a[None, :], same)
    cols = np.array(rnd.sample(range(L.shape[1]), L.shape[1]))
    b = clove_assign(L[:, cols], k, random_state=0)
    np.testing.assert_array_equal(b[:, None] == b[None, :], same)
    # relabelling the models relabels the answer (the matching may break an exact tie of
    # summed losses otherwise, so compare the total loss, which is invariant)
    assert _total(L[:, cols], b) == pytest.approx(_total(L, a), rel=1e-12, abs=1e-12)


def test_clove_assign_orders_rows_by_match_losses_when_the_embedding_ties():
    # found by review: rows equal in the embedding L but not in match_losses M (e.g. after
    # a loss_transform) must be ordered by M too, or the summed matching costs depend on
    # the order of the clients
    L = np.zeros((4, 3))
    M = np.array([[0.003, 0.3, 0.3], [0.2, 0.2, 0.2], [0.1, 0.003, 0.003], [0.3, 0.1, 0.2]])
    want = clove_assign(L, 1, random_state=0, match_losses=M)
    for order in itertools.permutations(range(4)):
        order = list(order)
        got = clove_assign(L[order], 1, random_state=0, match_losses=M[order])
        np.testing.assert_array_equal(got, want[order])


def test_clove_assign_breaks_summed_loss_ties_the_same_way_for_any_client_order():
    # Regression (found by hypothesis): with one cluster the model is the argmin of the
    # column sums, which tie here in exact arithmetic (0.01 each) but not in float
    # arithmetic, where the summation order decided: the answer depended on the order of
    # the clients, which the docstring rules out. The costs are now summed over the rows
    # in a canonical order.
    L = np.array([[0.0] * 3] * 5 + [[0.003, 0.001, 0.001], [0.001, 0.003, 0.003],
                                    [0.003, 0.003, 0.003], [0.003, 0.003, 0.003]])
    rng = np.random.default_rng(0)
    for k in (1, 2, 3):
        a = clove_assign(L, k, random_state=0)
        for _ in range(20):
            p = rng.permutation(len(L))
            np.testing.assert_array_equal(clove_assign(L[p], k, random_state=0), a[p])
            # the same with a transformed embedding matched on the raw losses
            np.testing.assert_array_equal(
                clove_assign(np.sqrt(L[p]), k, random_state=0, match_losses=L[p]),
                clove_assign(np.sqrt(L), k, random_state=0, match_losses=L)[p])


@given(separated_loss_matrices(), st.sampled_from([0.5, 4.0, 1e3]),
       st.sampled_from([0.0, 1.0, 100.0]))
@prop
def test_clove_assign_invariant_to_rescaling_and_shifting_all_losses(case, c, shift):
    # k-means is equivariant to x -> c x + shift; the matching cost of cluster C changes by
    # (c - 1) cost + |C| shift on every model alike, so the optimal match is the same.
    # Separated clusters only: between equally good partitions (exact ties of the k-means
    # objective) float rounding of the transformed losses may choose another one.
    L, k, _ = case
    a = clove_assign(L, k, random_state=0)
    b = clove_assign(c * L + shift, k, random_state=0)
    np.testing.assert_array_equal(b[:, None] == b[None, :], a[:, None] == a[None, :])
    assert _total(L, b) == pytest.approx(_total(L, a), rel=1e-9, abs=1e-9 * (1 + shift))


def _assert_centres_are_client_means(L, k):
    a, centers = clove_assign(L, k, random_state=0, return_centers=True)
    used = np.unique(a)
    assert centers.shape == (L.shape[1], L.shape[1])
    assert np.isnan(np.delete(centers, used, axis=0)).all()
    for j in used:
        # float64 means of the same rows in another summation order
        np.testing.assert_allclose(centers[j], L[a == j].mean(axis=0), rtol=1e-12,
                                   atol=1e-14 * (1 + np.abs(L).max()))


@pytest.mark.filterwarnings("ignore:Number of distinct clusters:UserWarning")
@given(loss_matrices(), st.data())
@prop
def test_clove_assign_centers_are_the_means_of_their_clients(L, data):
    """The centre row of a model is the mean loss vector of its clients; a model with no
    client has a NaN row (documented)."""
    _assert_centres_are_client_means(L, _k(data.draw, L))


@pytest.mark.filterwarnings("ignore:Number of distinct clusters:UserWarning")
def test_clove_assign_leaves_no_centre_for_an_empty_k_means_cluster():
    # found by hypothesis: k-means left one of its 2 clusters empty (the tiny row is
    # inseparable); that cluster was matched to a model, whose centre row was then set
    # although no client had that model (documented: NaN)
    _assert_centres_are_client_means(
        np.array([[1e-252, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]), 2)


# -- ifca_assign, choose_n_clusters, random_assignment -----------------------------------
@given(loss_matrices(), st.data())
@prop
def test_ifca_is_row_argmin_invariant_per_client(L, data):
    a = ifca_assign(L)
    np.testing.assert_array_equal(a, np.argmin(L, axis=1))
    # on a dyadic grid the shifts and power-of-two scalings below are exact (a subnormal
    # loss plus 1 would round to 1 and tie: no transform of floats is exact everywhere)
    L = np.floor(L * 8) / 8
    a = ifca_assign(L)
    off = data.draw(hnp.arrays(np.float64, L.shape[0], elements=st.integers(-5, 5).map(float)))
    scale = data.draw(hnp.arrays(np.float64, L.shape[0],
                                 elements=st.sampled_from([0.25, 1.0, 2.0, 8.0])))
    # exact in binary floating point: powers of two and small integers
    np.testing.assert_array_equal(ifca_assign(L * scale[:, None] + off[:, None]), a)


@given(loss_matrices(max_n=12, min_n=3), st.integers(2, 6), st.randoms(use_true_random=False))
@prop
def test_choose_n_clusters_range_order_and_scale(L, max_clusters, rnd):
    k = choose_n_clusters(L, max_clusters)
    distinct = np.unique(L, axis=0).shape[0]
    assert 1 <= k <= max(1, min(max_clusters, distinct))
    if distinct == 1:
        assert k == 1
    # scale-free: Ward linkage and the silhouette only compare distances
    assert choose_n_clusters(4.0 * L, max_clusters) == k
    # and the order of the clients does not matter (unknown-K CLoVE relies on it)
    rows = list(range(L.shape[0]))
    rnd.shuffle(rows)
    assert choose_n_clusters(L[rows], max_clusters) == k


def test_choose_n_clusters_does_not_depend_on_the_order_of_tied_clients():
    # Regression (found by hypothesis): Ward linkage breaks ties of merge costs by row
    # position, so permuting these clients changed the chosen number of clusters (2 or 3)
    # and with it unknown-K CLoVE's result. The rows are now sorted first.
    L = np.array([[0.0, 1], [0, 0], [0, 3], [1, 1], [2, 3], [0, 0], [0, 3], [1, 2], [0, 0]])
    rng = np.random.default_rng(0)
    k = choose_n_clusters(L, 3)
    for _ in range(30):
        assert choose_n_clusters(L[rng.permutation(len(L))], 3) == k


@given(st.integers(1, 8), st.integers(0, 10), st.integers(0, 2**16))
@prop
def test_random_assignment_uses_every_model_once_at_least(M, extra, seed):
    a = random_assignment(M + extra, M, np.random.default_rng(seed))
    assert a.shape == (M + extra,)
    np.testing.assert_array_equal(np.unique(a), np.arange(M))


# -- weighted model average and the batched loss matrix -----------------------------------
@st.composite
def averaging_case(draw):
    K = draw(st.integers(1, 4))
    n = draw(st.integers(1, 7))
    shape = draw(st.sampled_from([(), (2,), (2, 3)]))
    a = draw(hnp.arrays(np.int64, n, elements=st.integers(0, K - 1)))
    w = draw(hnp.arrays(np.float64, n, elements=st.sampled_from([0.0, 1.0, 3.0, 7.5])
                        | st.floats(0.1, 100, **finite)))
    cp = draw(hnp.arrays(np.float64, (n, *shape), elements=st.floats(-5, 5, **finite)))
    old = draw(hnp.arrays(np.float64, (K, *shape), elements=st.floats(-5, 5, **finite)))
    return a, w, cp, old


@given(averaging_case(), st.randoms(use_true_random=False), st.sampled_from([0.5, 3.0]))
@prop
def test_weighted_average_is_a_per_model_convex_combination(case, rnd, c):
    a, w, cp, old = case
    at = torch.as_tensor(a)
    out = weighted_model_average({"p": torch.as_tensor(cp)}, at, torch.as_tensor(w),
                                 {"p": torch.as_tensor(old)})["p"].numpy()
    for j in range(len(old)):
        sel = a == j
        if w[sel].sum() == 0:  # no client (or only weightless ones): unchanged
            np.testing.assert_array_equal(out[j], old[j])
            continue
        ref = np.tensordot(w[sel], cp[sel], axes=1) / w[sel].sum()
        np.testing.assert_allclose(out[j], ref, rtol=1e-12, atol=1e-12)
        assert np.all(out[j] >= cp[sel].min(axis=0) - 1e-12)
        assert np.all(out[j] <= cp[sel].max(axis=0) + 1e-12)
    perm = list(range(len(a)))
    rnd.shuffle(perm)
    got = weighted_model_average({"p": torch.as_tensor(cp[perm])}, at[perm],
                                 torch.as_tensor(c * w[perm]), {"p": torch.as_tensor(old)})
    np.testing.assert_allclose(got["p"].numpy(), out, rtol=1e-12, atol=1e-12)


@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 6), st.integers(1, 4),
       st.integers(1, 4000), st.integers(0, 2**16))
@prop
def test_batched_loss_matrix_does_not_depend_on_the_chunk_size(n, K, m, d, max_el, seed):
    g = torch.Generator().manual_seed(seed)
    template = build_module("linear", d, 1, ())
    loss_fn = make_sample_loss_fn(template, "mse")
    params = {k: torch.randn((K, *v.shape), generator=g, dtype=torch.float64)
              for k, v in template.state_dict().items()}
    sizes = torch.randint(1, m + 1, (n,), generator=g)
    X = torch.randn(int(sizes.sum()), d, generator=g, dtype=torch.float64)  # back to back
    Y = torch.randn(int(sizes.sum()), 1, generator=g, dtype=torch.float64)
    starts = torch.cumsum(sizes, 0) - sizes
    full = batched_loss_matrix(loss_fn, params, X, Y, sizes, max_elements=10**12)
    chunked = batched_loss_matrix(loss_fn, params, X, Y, sizes, max_elements=max_el)
    torch.testing.assert_close(chunked, full, rtol=1e-12, atol=1e-12)
    # brute force: the mean squared error of each model on each client's rows
    for i, j in itertools.product(range(n), range(K)):
        x, y = X[starts[i]:starts[i] + sizes[i]], Y[starts[i]:starts[i] + sizes[i]]
        pred = x @ params["weight"][j].T + params["bias"][j]
        assert float(full[i, j]) == pytest.approx(float(((pred - y) ** 2).mean()), rel=1e-10)


# -- estimators ----------------------------------------------------------------------------
@st.composite
def federations(draw, classification=False):
    n_clients = draw(st.integers(2, 5))
    d = draw(st.integers(1, 3))
    clients = []
    for _ in range(n_clients):
        m = draw(st.integers(2, 8))
        X = draw(hnp.arrays(np.float64, (m, d), elements=st.floats(-2, 2, **finite)
                            | st.sampled_from([0.0, 1.0])))
        if classification:
            y = draw(hnp.arrays(np.int64, m, elements=st.integers(0, 2)))
        else:
            y = draw(hnp.arrays(np.float64, m, elements=st.floats(-3, 3, **finite)))
        clients.append((X, y))
    if classification:  # every class somewhere, so classes_ is fixed
        X0, y0 = clients[0]
        clients[0] = (np.vstack([X0, np.zeros((3, d))]), np.r_[y0, 0, 1, 2])
    return clients


def _clove(**kw):
    return CLoVE(**{**dict(n_clusters=2, n_rounds=2, local_epochs=2, lr=0.05, batch_size=4,
                           random_state=0), **kw})


@given(federations(classification=True), st.sampled_from(["logistic", "mlp"]))
@prop
def test_classifier_outputs_agree_with_each_other(clients, model):
    est = _clove(model=model, hidden_layer_sizes=(4,)).fit(clients)
    assert est.n_clusters_ == len(np.unique(est.labels_))
    accs = []
    for i, (X, y) in enumerate(clients):
        pred = est.predict(X, client=i)
        np.testing.assert_array_equal(pred, est.predict(X, cluster=int(est.labels_[i])))
        proba = est.predict_proba(X, client=i)
        assert proba.shape == (len(X), len(est.classes_))
        np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-5)
        # argmax of the probabilities is the prediction, up to float32 ties
        top = proba.max(axis=1)
        chosen = proba[np.arange(len(X)), np.searchsorted(est.classes_, pred)]
        np.testing.assert_allclose(chosen, top, rtol=0, atol=1e-6)
        # a training client's own data sends it to (one of) its lowest-loss models
        j = est.assign(X, y)
        lv = est.loss_vectors_[i]
        assert lv[j] <= lv.min() + 1e-5 * (1 + lv.min())
        accs.append(np.mean(pred == y))
    assert est.score(clients) == pytest.approx(np.mean(accs), abs=1e-12)


@given(federations())
@prop
def test_regressor_score_is_the_mean_client_r2(clients):
    est = _clove().fit(clients)
    r2 = []
    for i, (X, y) in enumerate(clients):
        pred = est.predict(X, client=i)
        assert pred.shape == (len(X),)
        w = est.models_[est.labels_[i]].weight.detach().double().numpy()
        b = est.models_[est.labels_[i]].bias.detach().double().numpy()
        np.testing.assert_allclose(pred, (X @ w.T + b)[:, 0], rtol=1e-5,
                                   atol=1e-5 * (1 + np.abs(X).sum(axis=1).max()))
        r2.append(r2_score(y, pred))
    assert est.score(clients) == pytest.approx(np.mean(r2), rel=1e-9, abs=1e-12)


@given(federations(), st.sampled_from(["clove", "ifca"]))
@prop
def test_unsupervised_outputs_agree_with_the_reconstruction_loss(clients, which):
    Xs = [X for X, _ in clients]
    kw = dict(model="autoencoder", hidden_layer_sizes=(3, 2), n_clusters=2, n_rounds=2,
              local_epochs=2, lr=0.05, batch_size=4, random_state=0)
    est = (CLoVE if which == "clove" else IFCA)(**kw).fit(Xs)
    assert est.loss_ == "reconstruction"
    mse = []
    for i, X in enumerate(Xs):
        rec = est.predict(X, client=i)
        assert rec.shape == X.shape and rec.dtype == np.float32
        err = float(np.mean((rec - X.astype(np.float32)) ** 2))
        # the loss vector entry of the client's own model is its reconstruction MSE
        assert est.loss_vectors_[i, est.labels_[i]] == pytest.approx(err, rel=1e-4, abs=1e-6)
        j = est.assign(X)
        assert est.loss_vectors_[i, j] <= est.loss_vectors_[i].min() * (1 + 1e-5) + 1e-6
        mse.append(err)
    assert est.score(Xs) == pytest.approx(-np.mean(mse), rel=1e-5, abs=1e-7)


@given(federations(), st.randoms(use_true_random=False), st.sampled_from(["adam", "sgd"]),
       st.sampled_from([1, 2, "auto"]), st.sampled_from([None, "sqrt", "log"]),
       st.sampled_from(["random", "same"]))
@prop
def test_full_batch_fit_is_equivariant_to_the_order_of_the_clients(clients, rnd, optimizer,
                                                                   k, transform, init):
    # (first_assignment="random" deals models by position and participation < 1 samples
    # by position: those are order-dependent by design)
    kw = dict(batch_size=None, optimizer=optimizer, n_clusters=k, loss_transform=transform,
              init=init, max_clusters=3)
    a = _clove(**kw).fit(clients)
    perm = list(range(len(clients)))
    rnd.shuffle(perm)
    b = _clove(**kw).fit([clients[i] for i in perm])
    # full-batch local steps see every sample: only float32 summation order differs, so
    # the models and loss vectors agree to float32 precision; the assignment can only
    # differ where k-means met a (near) tie, which these draws rule out
    L = a.loss_vectors_
    assume(np.unique(np.round(L, 3), axis=0).shape[0] == len(np.unique(L, axis=0)))
    np.testing.assert_array_equal(b.labels_, a.labels_[perm])
    np.testing.assert_allclose(b.loss_vectors_, L[perm], rtol=1e-4, atol=1e-5)
    for ma, mb in zip(a.models_, b.models_):
        for pa, pb in zip(ma.parameters(), mb.parameters()):
            torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5)


# an invariance on arbitrary data, some of which (raw, uncentred) SGD cannot fit in
# a few steps: the ConvergenceWarning saying so is expected there
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@given(federations(), st.sampled_from(["adam", "sgd"]))
@prop
def test_fedavg_full_batch_is_invariant_to_duplicating_every_client(clients, optimizer):
    kw = dict(n_rounds=2, local_epochs=2, lr=0.05, batch_size=None, optimizer=optimizer,
              random_state=0)
    a = FedAvg(**kw).fit(clients)
    # each duplicate trains the same model on the same data and weighs the same: the
    # data-size weighted average is unchanged
    b = FedAvg(**kw).fit(clients + clients)
    for pa, pb in zip(a.models_[0].parameters(), b.models_[0].parameters()):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b.labels_, 0)


# -- Flower strategy -------------------------------------------------------------------------
@given(st.integers(1, 3), st.integers(1, 6), st.data())
@prop
def test_flower_average_is_order_and_scale_free_and_convex(K, n_nodes, data):
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord

    from mlpapers.federated.clove._flower import CLoVEStrategy

    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    keys = ["b", "a.weight"]
    shapes = {"b": (2,), "a.weight": (2, 3)}
    init = [ArrayRecord({k: torch.from_numpy(rng.normal(size=shapes[k]).astype(np.float32))
                         for k in keys}) for _ in range(K)]
    labels = data.draw(hnp.arrays(np.int64, n_nodes, elements=st.integers(0, K - 1)))
    sizes = data.draw(hnp.arrays(np.int64, n_nodes, elements=st.integers(1, 50)))
    states = [{k: torch.from_numpy(rng.normal(size=shapes[k]).astype(np.float32))
               for k in (keys if rng.random() < 0.5 else keys[::-1])} for _ in range(n_nodes)]

    def run(order, factor):
        strategy = CLoVEStrategy(n_clusters=K)
        strategy.models_ = list(init)
        strategy.labels_ = {100 + i: int(labels[i]) for i in range(n_nodes)}
        replies = [SimpleNamespace(
            metadata=SimpleNamespace(src_node_id=100 + i),
            content={"metrics": {"num-examples": int(sizes[i] * factor)},
                     "arrays": ArrayRecord(dict(states[i]))}) for i in order]
        strategy.aggregate_train(1, replies)
        return [m.to_torch_state_dict() for m in strategy.models_]

    ref = run(range(n_nodes), 1)
    order = data.draw(st.permutations(range(n_nodes)))
    got = run(order, 3)
    for j in range(K):
        sel = np.flatnonzero(labels == j)
        for k in keys:
            torch.testing.assert_close(got[j][k], ref[j][k], rtol=1e-6, atol=1e-6)
            if len(sel) == 0:  # a model without nodes keeps its weights
                torch.testing.assert_close(ref[j][k], init[j].to_torch_state_dict()[k],
                                           rtol=0, atol=0)
                continue
            stack = np.stack([states[i][k].numpy().astype(np.float64) for i in sel])
            expect = np.tensordot(sizes[sel].astype(np.float64), stack, axes=1) / sizes[sel].sum()
            np.testing.assert_allclose(ref[j][k].numpy(), expect, rtol=1e-6, atol=1e-6)
