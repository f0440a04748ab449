"""CLoVE: tests that kill mutants the rest of the suite let through.

Each test asserts an exact reference (a loop or closed form written here), a
documented bound or a documented behaviour that an earlier suite left unchecked.
"""

import numpy as np
import pytest
import torch

from mlpapers.federated.clove._kernels import batched_loss_matrix
from mlpapers.federated.clove._models import make_sample_loss_fn, per_sample_loss


# -- batched kernels ---------------------------------------------------------------------
@pytest.mark.parametrize("max_elements", [2688, 4037, 10**9])
def test_batched_loss_matrix_blocks_respect_the_element_bound(monkeypatch, max_elements):
    # documented: K * rows * 4 * features <= max_elements (rows of all clients in blocks,
    # whatever the clients' sizes), every row evaluated exactly once, in order
    K, f = 3, 16  # K 4 f = 192: 2688 and 4037 allow 14 and 21 rows per block
    sizes = torch.tensor([60, 1, 7, 3, 200, 2])  # a client larger than a block too
    N = int(sizes.sum())
    torch.manual_seed(0)
    module = torch.nn.Linear(f, 2)
    params = {"weight": torch.randn(K, 2, f), "bias": torch.randn(K, 2)}
    X, Y = torch.randn(N, f), torch.randn(N, 2)
    real_vmap, blocks = torch.func.vmap, []

    def recording_vmap(fn, in_dims=0, **kw):
        mapped = real_vmap(fn, in_dims=in_dims, **kw)
        if in_dims == (0, None, None):  # the map over models gets a block of rows

            def call(p, x, y):
                blocks.append(x)
                return mapped(p, x, y)

            return call
        return mapped

    monkeypatch.setattr(torch.func, "vmap", recording_vmap)
    out = batched_loss_matrix(make_sample_loss_fn(module, "mse"), params, X, Y, sizes,
                              max_elements=max_elements)
    torch.testing.assert_close(torch.cat(blocks), X, rtol=0, atol=0)  # once each, in order
    assert max(K * len(x) * 4 * f for x in blocks) <= max(max_elements, K * 4 * f)
    if max_elements < K * N * 4 * f:
        assert len(blocks) > 1
    starts = torch.cumsum(sizes, 0) - sizes
    for i in range(len(sizes)):
        x, y = X[starts[i]:starts[i] + sizes[i]], Y[starts[i]:starts[i] + sizes[i]]
        for j in range(K):
            ref = per_sample_loss(x @ params["weight"][j].T + params["bias"][j], x, y,
                                  "mse").mean()
            torch.testing.assert_close(out[i, j], ref)


def test_batched_adam_matches_torch_adam_at_gradients_near_eps():
    # with gradients ~ eps the update is lr m / (sqrt(v) + eps): eps matters
    from mlpapers.federated.clove._kernels import batched_adam_step

    torch.manual_seed(1)
    n, d = 3, 4
    p0 = torch.randn(n, d, dtype=torch.float64)
    grads = [1e-9 * torch.randn(n, d, dtype=torch.float64) for _ in range(3)]
    P = {"w": p0.clone()}
    m1 = {"w": torch.zeros(n, d, dtype=torch.float64)}
    m2 = {"w": torch.zeros(n, d, dtype=torch.float64)}
    count = torch.zeros(n, dtype=torch.long)
    for g in grads:
        count += 1
        batched_adam_step(P, {"w": g}, m1, m2, count, lr=0.1)
    for i in range(n):
        w = torch.nn.Parameter(p0[i].clone())
        opt = torch.optim.Adam([w], lr=0.1)
        for g in grads:
            w.grad = g[i].clone()
            opt.step()
        torch.testing.assert_close(P["w"][i], w.detach(), rtol=1e-12, atol=1e-12)


def test_weighted_average_updates_a_model_whose_clients_weigh_one():
    # theta_j = sum_i w_i theta_i / sum_i w_i for every model with clients, whatever the scale
    from mlpapers.federated.clove._kernels import weighted_model_average

    old = {"w": torch.zeros(3, 2, dtype=torch.float64)}
    client = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]], dtype=torch.float64)}
    a = torch.tensor([0, 1, 1])
    new = weighted_model_average(client, a, torch.tensor([1.0, 0.25, 0.75]), old)
    torch.testing.assert_close(new["w"][0], client["w"][0])
    torch.testing.assert_close(new["w"][1], 0.25 * client["w"][1] + 0.75 * client["w"][2])
    torch.testing.assert_close(new["w"][2], old["w"][2])


def test_weighted_average_keeps_the_max_of_integer_buffers():
    # integer buffers (e.g. BatchNorm's num_batches_tracked) take their clients' maximum;
    # a model without clients keeps its own
    from mlpapers.federated.clove._kernels import weighted_model_average

    old = {"n": torch.tensor([1, 1, 1])}
    client = {"n": torch.tensor([3, 5, 7, 2])}
    a = torch.tensor([0, 0, 1, 1])
    new = weighted_model_average(client, a, torch.tensor([1.0, 2.0, 3.0, 4.0]), old)
    assert new["n"].tolist() == [5, 7, 1]


# -- local training --------------------------------------------------------------------------
@pytest.mark.parametrize("vectorize", [True, False])
def test_one_local_epoch_visits_every_sample_of_unequal_clients(vectorize):
    # SGD with a tiny lr is linear in the steps: one epoch with b | n_i moves client i by
    # -lr / b * (sum of its per-sample gradients at the start), whatever the order
    from mlpapers.federated.clove._engine import ClientData, Engine, stack_states

    torch.manual_seed(0)
    template = torch.nn.Linear(3, 2, dtype=torch.float64)
    sizes, b, lr = [8, 2, 4], 2, 1e-6
    Xs = [torch.randn(s, 3, dtype=torch.float64) for s in sizes]
    Ys = [torch.randn(s, 2, dtype=torch.float64) for s in sizes]
    data = ClientData.from_lists(Xs, Ys, torch.device("cpu"))
    eng = Engine(template, "mse", vectorize=vectorize, optimizer="sgd", lr=lr, batch_size=b,
                 local_epochs=1)
    states = stack_states([template])
    new = eng.local_train(states, torch.zeros(3, dtype=torch.long), data,
                          torch.Generator().manual_seed(0))
    for i, (x, y) in enumerate(zip(Xs, Ys)):
        w = template.weight.detach().clone().requires_grad_(True)
        c = template.bias.detach().clone().requires_grad_(True)
        per_sample_loss(x @ w.T + c, x, y, "mse").sum().backward()
        torch.testing.assert_close(new["weight"][i] - states["weight"][0], -lr / b * w.grad,
                                   rtol=1e-4, atol=1e-13)
        torch.testing.assert_close(new["bias"][i] - states["bias"][0], -lr / b * c.grad,
                                   rtol=1e-4, atol=1e-13)


# -- assignment rules ----------------------------------------------------------------------
def test_choose_n_clusters_default_gain_is_ten_percent():
    # three tight groups of loss vectors, the third 2 units from the second: k=3 beats k=2's
    # silhouette by 10-20%, so the default min_gain=0.1 takes it and 0.2 does not
    from sklearn.cluster import AgglomerativeClustering
    from sklearn.metrics import silhouette_score

    from mlpapers.federated.clove import choose_n_clusters

    g = np.array([[0.0, 0.0], [0.05, 0.0], [0.0, 0.05], [0.05, 0.05]])
    L = np.vstack([g, g + [5.0, 0.0], g + [5.0, 2.0]])
    sil = {k: silhouette_score(L, AgglomerativeClustering(n_clusters=k, linkage="ward")
                               .fit_predict(L)) for k in (2, 3)}
    assert 1.1 < sil[3] / sil[2] < 1.2
    assert choose_n_clusters(L, 3) == 3
    assert choose_n_clusters(L, 3, min_gain=0.2) == 2


def test_clove_assign_runs_kmeans_with_the_number_of_distinct_rows():
    # 2 distinct loss vectors, 3 models: k-means gets 2 clusters (no degenerate-cluster
    # warning), one model gets no cluster and a NaN centre
    import warnings

    from mlpapers.federated.clove import clove_assign

    L = np.array([[0.1, 2.0, 3.0]] * 3 + [[2.5, 0.2, 3.0]] * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a, centers = clove_assign(L, 3, random_state=0, return_centers=True)
    assert a.tolist() == [0, 0, 0, 1, 1]
    assert np.isnan(centers).all(axis=1).tolist() == [False, False, True]
    np.testing.assert_allclose(centers[:2], L[[0, 3]])


def test_random_assignment_spreads_the_extra_clients_uniformly():
    # one client per model, the others i.i.d. uniform over all models: 2000 clients on 4
    # models give counts 500 +- 5 sigma (sigma = sqrt(2000 * 1/4 * 3/4) ~ 19.4)
    from mlpapers.federated.clove._kernels import random_assignment

    a = random_assignment(2000, 4, np.random.default_rng(0))
    counts = np.bincount(a, minlength=4)
    assert np.all(np.abs(counts - 500) < 5 * np.sqrt(2000 * 0.25 * 0.75))


# -- the simulation loop -----------------------------------------------------------------------
def _federation(seed=1, sizes=(60, 20, 40, 30, 50, 10)):
    from mlpapers.datasets import make_federated_linear

    clients, truth, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=3,
                                              n_samples=60, n_features=5, random_state=seed)
    # unequal data sizes, so that data-size weights matter
    return [(X[:s], y[:s]) for (X, y), s in zip(clients, sizes)], truth


def test_random_first_assignment_does_not_look_at_the_data():
    # round 0 with first_assignment="random" depends on the seed only: one round on two
    # different federations of the same size gives the same labels
    from mlpapers.federated import CLoVE

    a, _ = _federation(1)
    b, _ = _federation(2)
    b = b[::-1]
    kw = dict(n_clusters=3, n_rounds=1, first_assignment="random", random_state=0)
    la, lb = CLoVE(**kw).fit(a).labels_, CLoVE(**kw).fit(b).labels_
    np.testing.assert_array_equal(la, lb)
    assert sorted(set(la.tolist())) == [0, 1, 2]  # every model gets a client


def test_random_first_assignment_recovers_the_clusters():
    # the paper's CNN runs start from a random assignment: later rounds are loss based
    from sklearn.metrics import adjusted_rand_score

    from mlpapers.federated import CLoVE

    clients, truth = _federation(1)
    est = CLoVE(n_clusters=2, n_rounds=6, local_epochs=10, lr=0.05, first_assignment="random",
                random_state=0).fit(clients)
    assert adjusted_rand_score(truth, est.labels_) == 1.0


def test_history_loss_and_ari_are_the_documented_reductions():
    # a vanishing lr freezes the models, so the last round's loss matrix is loss_vectors_:
    # history loss = sum_i n_i L[i, a_i] / sum_i n_i, ari = ARI(truth, labels_)
    from sklearn.metrics import adjusted_rand_score

    from mlpapers.federated import CLoVE

    clients, _ = _federation(1)
    n = np.array([len(X) for X, _ in clients], dtype=float)
    given = np.array([0, 1, 0, 1, 1, 0])  # any labelling: the ARI is only logged
    est = CLoVE(n_clusters=2, n_rounds=2, lr=1e-30, random_state=3).fit(clients, given)
    L, a = est.loss_vectors_, est.labels_
    ref = float((L[np.arange(len(a)), a] * n).sum() / n.sum())
    assert est.history_[-1]["loss"] == pytest.approx(ref, rel=1e-5)
    assert est.history_[-1]["ari"] == pytest.approx(adjusted_rand_score(given, a))


def _best_split(values):
    """Optimal 2-means partition of 1-D values (brute force over sorted split points)."""
    order = np.argsort(values)
    v = values[order]
    sse = [((v[:i] - v[:i].mean()) ** 2).sum() + ((v[i:] - v[i:].mean()) ** 2).sum()
           for i in range(1, len(v))]
    side = np.zeros(len(v), dtype=int)
    side[order[int(np.argmin(sse)) + 1:]] = 1
    return side


@pytest.mark.parametrize("transform, f", [(None, lambda v: v), ("sqrt", np.sqrt),
                                          ("log", np.log)])
def test_loss_transform_shapes_the_kmeans_embedding(transform, f):
    # one informative column: k-means on the transformed losses is the optimal 1-D split
    from sklearn.metrics import adjusted_rand_score

    from mlpapers.federated import CLoVE

    v = np.array([0.01, 0.04, 1.0, 4.0, 9.0, 16.0, 0.02, 0.09])
    L = np.stack([v, np.ones_like(v)], 1)
    est = CLoVE(n_clusters=2, loss_transform=transform)
    est._numpy_gen = np.random.default_rng(0)
    assert adjusted_rand_score(_best_split(f(v)), est._assign(L, 1)) == 1.0


def test_log_transform_accepts_a_zero_loss():
    from mlpapers.federated import CLoVE

    L = np.array([[0.0, 1.0], [0.1, 1.0], [3.0, 0.5], [2.0, 0.4]])
    est = CLoVE(n_clusters=2, loss_transform="log")
    est._numpy_gen = np.random.default_rng(0)
    assert set(est._assign(L, 1).tolist()) <= {0, 1}


def test_degenerate_loss_vectors_fall_back_to_random_only_in_round_zero():
    # documented: fewer distinct loss vectors than clusters -> random assignment (every
    # model gets a client) in round 0; later rounds cluster them (identical rows share)
    from mlpapers.federated import CLoVE

    L = np.tile([0.5, 0.7, 0.9], (6, 1))
    est = CLoVE(n_clusters=3)
    est._numpy_gen = np.random.default_rng(0)
    assert sorted(set(est._assign(L, 0).tolist())) == [0, 1, 2]
    assert len(set(est._assign(L, 1).tolist())) == 1


# -- inference ---------------------------------------------------------------------------------
def test_assign_a_new_classification_client_to_its_lowest_loss_model():
    from mlpapers.federated import CLoVE

    rng = np.random.default_rng(0)
    w = rng.normal(size=(2, 4, 3))  # two clusters with different class boundaries

    def client(k, n=40):
        X = rng.normal(size=(n, 4))
        return X.astype(np.float32), (X @ w[k]).argmax(1)

    clients = [client(k) for k in (0, 0, 1, 1)]
    est = CLoVE(n_clusters=2, model="logistic", n_rounds=3, local_epochs=5, lr=0.05,
                random_state=0).fit(clients)
    for k in (0, 1):
        X, y = client(k, 60)
        with torch.no_grad():
            ce = [float(torch.nn.functional.cross_entropy(m(torch.as_tensor(X)),
                                                          torch.as_tensor(y)))
                  for m in est.models_]
        assert abs(ce[0] - ce[1]) > 1e-3
        assert est.assign(X, y) == int(np.argmin(ce))


def test_mlp_hidden_layers_are_relu():
    from mlpapers.federated.clove._models import build_module

    net = build_module("mlp", 5, 3, (8, 6))
    kinds = [type(m).__name__ for m in net]
    assert kinds == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert [m.out_features for m in net if isinstance(m, torch.nn.Linear)] == [8, 6, 3]


def test_score_is_the_mean_over_clients_of_their_r2():
    from sklearn.metrics import r2_score

    from mlpapers.federated import CLoVE

    clients, _ = _federation(1)
    est = CLoVE(n_clusters=2, n_rounds=2, local_epochs=5, lr=0.05, random_state=0).fit(clients)
    ref = np.mean([r2_score(y, est.predict(X, client=i)) for i, (X, y) in enumerate(clients)])
    assert est.score(clients) == pytest.approx(ref, rel=1e-6)


def test_partial_participation_averages_with_the_participants_own_sizes(monkeypatch):
    # one round of full-batch SGD: the size-weighted average of the participants'
    # local models is one gradient step on their pooled data (FedAvg's identity);
    # the participants are clients 1 and 3, of very different sizes
    from mlpapers.federated.clove import FedAvg
    from mlpapers.federated.clove._federation import _FederatedBase

    rng = np.random.default_rng(0)
    sizes = [5, 40, 9, 70]
    w_true = rng.normal(size=3)
    clients = []
    for n_i in sizes:
        X = rng.normal(size=(n_i, 3))
        clients.append((X, X @ w_true + rng.normal(size=n_i)))
    monkeypatch.setattr(_FederatedBase, "_participants",
                        lambda self, n, M: np.array([1, 3]))
    kw = dict(model="linear", n_rounds=1, local_epochs=1, batch_size=None, optimizer="sgd",
              participation=0.5, random_state=0)
    start = FedAvg(lr=1e-30, **kw).fit(clients).models_[0]  # the initial model
    lr = 0.1
    got = FedAvg(lr=lr, **kw).fit(clients).models_[0]
    W = start.weight.detach().double().clone().requires_grad_(True)
    b = start.bias.detach().double().clone().requires_grad_(True)
    X = torch.as_tensor(np.concatenate([clients[1][0], clients[3][0]]))
    y = torch.as_tensor(np.concatenate([clients[1][1], clients[3][1]]))
    ((X @ W.T + b).ravel() - y).pow(2).mean().backward()
    torch.testing.assert_close(got.weight.detach().double(), (W - lr * W.grad).detach(),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.bias.detach().double(), (b - lr * b.grad).detach(),
                               rtol=1e-5, atol=1e-6)


def test_clients_first_seen_after_the_freeze_take_their_lowest_loss_model(monkeypatch):
    # clients 4 and 5 take part only after the assignment froze: each must get its
    # lowest-loss model (with lr ~ 0 the models never move, so that is the argmin of
    # the final loss vectors), not a default model
    from mlpapers.federated.clove import CLoVE
    from mlpapers.federated.clove._federation import _FederatedBase

    rng = np.random.default_rng(1)
    w = rng.normal(size=3)
    clients = []
    for i in range(6):
        X = rng.normal(size=(30, 3))
        clients.append((X, (1 if i % 2 else -1) * 5 * X @ w))
    rounds = iter([np.arange(4), np.arange(4), np.arange(6)])
    monkeypatch.setattr(_FederatedBase, "_participants", lambda self, n, M: next(rounds))
    est = CLoVE(n_clusters=2, n_rounds=3, lr=1e-30, freeze_after=1, participation=0.7,
                random_state=0).fit(clients)
    assert [h["frozen"] for h in est.history_] == [False, True, True]
    late = est.labels_[4:]
    np.testing.assert_array_equal(late, est.loss_vectors_[4:].argmin(1))
    assert len(set(late)) == 2  # the two late clients belong to different models
