"""DecentralizedSGD with the user's own ``torch.nn.Module``: train/eval modes, dropout under
vmap, BatchNorm statistics per node and pooled for predict, frozen and tied parameters,
output contracts, persistence, threads and the global RNG."""

import copy
import pickle
import time

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss
from torch import nn

from mlpapers.decentralized.btsp import DecentralizedSGD
from tests._ambient import check_state_untouched, check_thread_safe, run_in_threads

RNG = np.random.default_rng(0)
X = RNG.normal(size=(120, 4)).astype(np.float32)
Y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0)


def _seeded(build, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _drop_net(p=0.5):
    return _seeded(lambda: nn.Sequential(nn.Linear(4, 16), nn.Dropout(p), nn.ReLU(),
                                         nn.Linear(16, 3)))


def _bn_net(freeze_first=False):
    net = _seeded(lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(),
                                        nn.Linear(6, 3)))
    if freeze_first:
        net[0].requires_grad_(False)
    return net


def _fit(model, X=X, y=Y, **kw):
    params = dict(n_nodes=4, n_rounds=12, eval_every=4, lr=0.3, random_state=0)
    params.update(kw)
    nodes = params.pop("nodes", None)
    return DecentralizedSGD(model=model, **params).fit(X, y, nodes=nodes)


def _result(clf):
    return {"proba": clf.predict_proba(X), **{k: v.numpy() for k, v in clf.params_.items()}}


def _forward64(clf, x):
    """float64 forward of the BatchNorm net by its definition, in eval mode, from the
    fitted ``params_`` and ``buffers_``."""
    p = {k: v.double() for k, v in clf.params_.items()}
    b = {k: v.double() for k, v in clf.buffers_.items()}
    h = torch.as_tensor(x, dtype=torch.float64) @ p["0.weight"].T + p["0.bias"]
    z = (h - b["1.running_mean"]) / torch.sqrt(b["1.running_var"] + 1e-5)
    z = torch.relu(z * p["1.weight"] + p["1.bias"])
    return torch.softmax(z @ p["3.weight"].T + p["3.bias"], dim=1).numpy()


# ------------------------------------------------------------------ dropout -----
def test_dropout_trains_reproducibly_without_touching_the_global_rng():
    # was "vmap: called random operation while in randomness error mode"
    net = _drop_net()
    first = check_state_untouched(lambda: _result(_fit(net)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)  # the global seed plays no part
        again = _result(_fit(net))
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    other_seed = _result(_fit(net, random_state=1))
    assert not np.array_equal(first["proba"], other_seed["proba"])
    # dropout is active in training: without it the run differs
    no_drop = _result(_fit(_drop_net(p=0.0)))
    assert not np.array_equal(first["proba"], no_drop["proba"])


def test_predict_runs_in_eval_mode_and_draws_nothing():
    clf = _fit(_drop_net())
    proba = check_state_untouched(lambda: clf.predict_proba(X))
    np.testing.assert_array_equal(proba, clf.predict_proba(X))
    # eval mode: the dropout-free forward of the average model
    ref = _drop_net()  # the architecture, with the average model's weights
    ref.load_state_dict(clf.params_)
    with torch.no_grad():
        expected = torch.softmax(ref.eval()(torch.as_tensor(X)), 1).numpy()
    np.testing.assert_allclose(proba, expected, rtol=1e-6, atol=1e-7)


def test_module_given_in_eval_mode_still_trains_in_train_mode():
    train_net, eval_net = _drop_net(), _drop_net().eval()
    a, b = _result(_fit(train_net)), _result(_fit(eval_net))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert train_net.training and not eval_net.training


# ---------------------------------------------------------------- batchnorm -----
def test_batchnorm_statistics_per_node_pooled_by_total_variance():
    """Each node's shard is one repeated point, and the layer before BatchNorm is frozen:
    every batch of node i has mean h_i = W x_i + b and variance 0, so after T rounds
    (momentum m) running_mean_i = (1 - (1-m)^T) h_i and running_var_i = (1-m)^T."""
    n, T, m = 3, 5, 0.1
    pts = RNG.normal(size=(n, 4)).astype(np.float32)
    Xn = np.repeat(pts, 10, axis=0)
    yn = np.arange(len(Xn)) % 3
    net = _bn_net(freeze_first=True)
    clf = _fit(net, Xn, yn, n_nodes=n, n_rounds=T, eval_every=T,
               nodes=np.repeat(np.arange(n), 10))
    W, b = net[0].weight.detach().double(), net[0].bias.detach().double()
    h = torch.as_tensor(pts, dtype=torch.float64) @ W.T + b  # (n, 6)
    mean_i = (1 - (1 - m) ** T) * h
    var_i = torch.full_like(h, (1 - m) ** T)
    nb = clf.node_buffers_
    torch.testing.assert_close(nb["1.running_mean"].double(), mean_i, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(nb["1.running_var"].double(), var_i, rtol=1e-5, atol=1e-6)
    assert nb["1.num_batches_tracked"].tolist() == [T] * n
    pooled_var = var_i.mean(0) + (mean_i - mean_i.mean(0)).pow(2).mean(0)
    torch.testing.assert_close(clf.buffers_["1.running_mean"].double(), mean_i.mean(0),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(clf.buffers_["1.running_var"].double(), pooled_var,
                               rtol=1e-5, atol=1e-6)
    assert int(clf.buffers_["1.num_batches_tracked"]) == T
    # predict uses exactly these statistics, in eval mode
    np.testing.assert_allclose(clf.predict_proba(X), _forward64(clf, X), rtol=1e-5,
                               atol=1e-6)


def test_batchnorm_rows_are_independent_and_one_row_predicts():
    # predict(X[:1]) raised "Expected more than 1 value per channel when training", and
    # a row's prediction depended on the other rows of its batch
    clf = _fit(_bn_net())
    whole = clf.predict_proba(X[:10])
    rows = np.vstack([clf.predict_proba(X[i:i + 1]) for i in range(10)])
    np.testing.assert_allclose(whole, rows, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(whole, _forward64(clf, X[:10]), rtol=1e-5, atol=1e-6)


def test_history_evaluates_the_average_model_in_eval_mode():
    clf = _fit(_bn_net(), n_rounds=8, eval_every=8)
    last = clf.history_[-1]
    # (it was the train-mode loss: batch statistics of the evaluated data)
    proba = _forward64(clf, X)
    assert last["loss"] == pytest.approx(log_loss(Y, proba, labels=[0, 1, 2]), rel=1e-5)
    assert last["accuracy"] == pytest.approx(clf.score(X, Y))


def test_node_without_data_keeps_its_initial_statistics():
    clf = _fit(_bn_net(), n_nodes=3, nodes=np.zeros(len(Y), dtype=int))
    nb = clf.node_buffers_
    for i in (1, 2):  # their padded batches are node 0's samples, not their data
        torch.testing.assert_close(nb["1.running_mean"][i], torch.zeros(6))
        torch.testing.assert_close(nb["1.running_var"][i], torch.ones(6))
        assert int(nb["1.num_batches_tracked"][i]) == 0
    for k in ("1.running_mean", "1.running_var"):  # pooled over node 0 alone
        torch.testing.assert_close(clf.buffers_[k], nb[k][0])


def test_batchnorm_state_survives_pickle_and_save_is_refused_clearly(tmp_path):
    clf = _fit(_bn_net())
    back = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    for k, v in clf.buffers_.items():
        assert torch.equal(back.buffers_[k], v)
    with pytest.raises(TypeError, match="pickle"):  # a module is no safe parameter
        clf.save(tmp_path / "dsgd.pt")


def test_train_mode_failure_is_named_and_leaves_the_module_as_given():
    net = _bn_net()
    net[0].weight.requires_grad_(False)
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match="model failed in training.*batch_size"):
        _fit(net, batch_size=1)  # BatchNorm needs 2 samples per node in train mode
    assert net.training and [p.requires_grad for p in net.parameters()] == [
        False, True, True, True, True, True]
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])


# ------------------------------------------------------- frozen / tied / none -----
def test_frozen_parameters_are_not_trained():
    net = _drop_net()
    net[0].requires_grad_(False)
    clf = _fit(net, weight_decay=0.1, momentum=0.5)
    assert torch.equal(clf.params_["0.weight"], net[0].weight.detach())
    assert torch.equal(clf.params_["0.bias"], net[0].bias.detach())
    assert set(clf.node_params_) == {"3.weight", "3.bias"}
    assert not torch.equal(clf.params_["3.weight"], net[3].weight.detach())
    assert list(clf.params_) == [k for k, _ in net.named_parameters()]


def test_frozen_layer_trains_as_a_fixed_feature_map():
    """A frozen first layer gives the run of a module whose first layer is a constant
    map held in buffers (no parameters), with the same head."""

    class Fixed(nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.register_buffer("w", layer.weight.detach().clone())
            self.register_buffer("b", layer.bias.detach().clone())

        def forward(self, x):
            return nn.functional.linear(x, self.w, self.b)

    frozen = _seeded(lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)))
    frozen[0].requires_grad_(False)
    fixed = nn.Sequential(Fixed(frozen[0]), nn.Tanh(), copy.deepcopy(frozen[2]))
    a, b = _fit(frozen), _fit(fixed)
    for k in ("2.weight", "2.bias"):
        torch.testing.assert_close(a.params_[k], b.params_[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=1e-5, atol=1e-6)


def test_module_without_trainable_parameters_is_refused():
    with pytest.raises(ValueError, match="no trainable parameters"):
        _fit(nn.Linear(4, 3).requires_grad_(False))


def test_tied_weights_train_as_one_parameter():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.b.weight = self.a.weight
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))

    clf = _fit(_seeded(Tied))
    p = {k: v.double() for k, v in clf.params_.items()}
    assert "b.weight" not in p
    x = torch.as_tensor(X, dtype=torch.float64)
    h = torch.tanh(x @ p["a.weight"].T + p["a.bias"])
    h = torch.tanh(h @ p["a.weight"].T + p["b.bias"])  # the shared weight, twice
    expected = torch.softmax(h @ p["head.weight"].T + p["head.bias"], 1).numpy()
    np.testing.assert_allclose(clf.predict_proba(X), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------- output contract -----
class _Out(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.lin, self.kind = _seeded(lambda: nn.Linear(4, 3)), kind

    def forward(self, x):
        out = self.lin(x)
        return {"int": out.long(), "bool": out > 0, "nan": out * float("nan"),
                "float64": out.double()}[self.kind]


@pytest.mark.parametrize("kind", ["int", "bool"])
def test_non_float_logits_are_named(kind):
    # were torch kernel errors ("log_softmax_lastdim_kernel_impl" not implemented for 'Long')
    with pytest.raises(TypeError, match="model must return floating-point logits"):
        _fit(_Out(kind))


def test_non_finite_logits_are_named_before_training():
    # reported as a divergence ("lower lr") after the first rounds
    with pytest.raises(ValueError, match="non-finite logits"):
        _fit(_Out("nan"))


def test_float64_logits_give_float32_probabilities():
    clf = _fit(_Out("float64"))
    assert clf.predict_proba(X).dtype == np.float32  # as documented


# ----------------------------------------------------------------- threads ------
def test_dropout_and_batchnorm_fits_are_thread_safe():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.3),
                                      nn.ReLU(), nn.Linear(6, 3))

        def forward(self, x):
            return self.body(x)

    net = _seeded(Net)
    check_thread_safe(lambda: _result(_fit(net, n_rounds=6)))


def test_simultaneous_predictions_on_one_estimator():
    """predict swapped the average model's parameters into the shared module for each
    call (functional_call) and back out: a thread could run on the other's swapped-out
    weights. A forward that pauses between its layers makes the overlap certain."""

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

        def forward(self, x):
            h = torch.tanh(self.a(x))
            time.sleep(0.002)
            return self.b(h)

    clf = _fit(_seeded(Slow), n_rounds=2)
    expected = clf.predict_proba(X)
    for out in run_in_threads([lambda: [clf.predict_proba(X) for _ in range(8)]] * 4):
        for proba in out:
            np.testing.assert_array_equal(proba, expected)


def test_predict_follows_params_replaced_after_fit():
    def plain():
        return _seeded(lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)))

    a, b = _fit(plain()), _fit(plain(), random_state=1)
    a.params_ = {k: v.clone() for k, v in b.params_.items()}
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))
    with torch.no_grad():
        a.params_["2.bias"] += 1.0  # edited in place
    assert not np.array_equal(a.predict_proba(X), b.predict_proba(X))


def _forward(clf, state) -> np.ndarray:
    """softmax of the average model's forward from the state given, from scratch."""
    ref = _seeded(lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)))
    with torch.no_grad():
        return torch.softmax(torch.func.functional_call(ref, state, (torch.as_tensor(X),)),
                             1).numpy()


@pytest.mark.parametrize("edit", ["numpy_view", "data", "del_and_replace", "inference_mode"])
def test_predict_follows_every_kind_of_edit_of_params(edit):
    # a cache keyed by (id, version) of the tensors missed edits through a numpy view or
    # .data (no version bump) and a new tensor at a freed address, and raised on
    # inference tensors: predict now reads params_ at every call
    clf = _fit(_seeded(lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))))
    clf.predict_proba(X)
    if edit == "numpy_view":
        clf.params_["2.bias"].numpy()[:] = [5.0, 0.0, 0.0]
    elif edit == "data":
        clf.params_["2.bias"].data.add_(3.0)
    elif edit == "del_and_replace":
        del clf.params_["2.bias"]
        clf.params_["2.bias"] = torch.tensor([0.0, 4.0, 0.0])
    else:
        with torch.inference_mode():
            clf.params_ = {k: v + 0.5 for k, v in clf.params_.items()}
    np.testing.assert_allclose(clf.predict_proba(X), _forward(clf, clf.params_),
                               rtol=1e-6, atol=1e-7)


def test_non_persistent_buffers_learnt_in_fit_are_used_by_predict():
    # load_state_dict skips non-persistent buffers: predict used the module's initial
    # value while history_ (and buffers_) used the learnt one
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.register_buffer("scale", torch.ones(3), persistent=False)

        def forward(self, x):
            if self.training:
                with torch.no_grad():
                    self.scale.mul_(0.99)
            return self.lin(x) * self.scale

    clf = _fit(_seeded(Scaled))
    assert not torch.equal(clf.buffers_["scale"], torch.ones(3))
    ref = _seeded(Scaled).eval()
    with torch.no_grad():
        expected = torch.softmax(torch.func.functional_call(
            ref, {**clf.params_, **clf.buffers_}, (torch.as_tensor(X),)), 1).numpy()
    np.testing.assert_allclose(clf.predict_proba(X), expected, rtol=1e-6, atol=1e-7)


def test_module_modifying_its_input_in_place_corrupts_nothing():
    """fit evaluated the user's (shared-memory) X itself, so a forward that edits its
    input (``x.mul_(2)``) doubled the training data on every history record, and
    predict doubled the caller's array on every call: the module now gets copies."""

    class Doubling(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            x.mul_(2.0)
            return self.lin(x)

    Xt = torch.tensor(X)
    clf = _fit(_seeded(Doubling), Xt)
    torch.testing.assert_close(Xt, torch.tensor(X), rtol=0, atol=0)
    Xc = X.copy()
    first = clf.predict_proba(Xc)
    np.testing.assert_array_equal(Xc, X)
    np.testing.assert_array_equal(clf.predict_proba(Xc), first)
    # the training data stayed intact: the same run as a module that doubles a copy
    class Clean(Doubling):
        def forward(self, x):
            return self.lin(2.0 * x)

    np.testing.assert_array_equal(_fit(_seeded(Clean), X).predict_proba(X), first)


@pytest.mark.parametrize("change", ["delete_layer", "append_layer"])
def test_predict_after_a_refit_with_a_changed_module_uses_the_new_fit(change):
    # the per-thread predict module was kept across fits: after the user changed their
    # module in place and refitted, the same thread predicted with the old architecture
    # (a deleted layer's old weights filled in silently, or an AttributeError)
    m = _seeded(lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3),
                                      nn.Linear(3, 3)))
    clf = _fit(m)
    clf.predict_proba(X)
    if change == "delete_layer":
        del m[3]
    else:
        m.append(_seeded(lambda: nn.Linear(3, 3), seed=1))
    clf.fit(X, Y)
    got = clf.predict_proba(X)
    np.testing.assert_array_equal(got, pickle.loads(pickle.dumps(clf)).predict_proba(X))
    m.append(nn.Tanh())  # changing the module after the fit changes nothing fitted
    np.testing.assert_array_equal(clf.predict_proba(X), got)


@pytest.mark.parametrize("bn, match", [
    (lambda: nn.BatchNorm1d(6, track_running_stats=False), "track_running_stats=False"),
    (lambda: nn.BatchNorm1d(6, momentum=None), "momentum=None"),
], ids=["no_running_stats", "cumulative_average"])
def test_batchnorm_settings_that_cannot_be_fitted_are_named(bn, match):
    # failed with torch's "Expected more than 1 value per channel when training" or a
    # vmap .item() error blamed on batch_size
    net = _seeded(lambda: nn.Sequential(nn.Linear(4, 6), bn(), nn.ReLU(), nn.Linear(6, 3)))
    with pytest.raises(ValueError, match=rf"model's BatchNorm1d '1' .*{match}"):
        _fit(net)
    assert not net[1]._forward_pre_hooks  # no hook left behind


def test_an_unused_batch_statistics_layer_does_not_stop_a_fit():
    class WithHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
            self.head = nn.BatchNorm1d(3, track_running_stats=False)  # never called

        def forward(self, x):
            return self.body(x)

    clf = _fit(_seeded(WithHead))
    assert clf.predict(X[:1]).shape == (1,)


def test_node_of_is_an_int64_copy_of_the_callers_labels():
    # it was a view of the caller's array (uint8 stayed uint8): changing the array after
    # fit changed the fitted split
    pd = pytest.importorskip("pandas")
    labels = (np.arange(len(X)) % 3).astype(np.uint8)
    for given in (labels, torch.from_numpy(labels.copy()), pd.Series(labels.copy())):
        est = DecentralizedSGD(n_nodes=3, n_rounds=2, random_state=0).fit(X, Y, nodes=given)
        assert est.node_of_.dtype == np.int64
        given[:] = 0
        assert np.bincount(est.node_of_).tolist() == [40, 40, 40]


def test_consensus_distance_of_complex_parameters_counts_the_imaginary_parts():
    import warnings

    from mlpapers.decentralized.btsp._dsgd import consensus_distance

    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, 2, dtype=torch.complex64, generator=g)
    want = float(((w.to(torch.complex128) - w.to(torch.complex128).mean(0)).abs() ** 2)
                 .sum((1, 2)).mean())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (torch's "discards the imaginary part")
        got = consensus_distance({"w": w, "b": torch.zeros(4, 2)})
    assert got == pytest.approx(want, rel=1e-12)


def test_save_takes_pandas_array_like_parameters(tmp_path):
    pd = pytest.importorskip("pandas")
    from mlpapers.decentralized.btsp import make_delay_matrix

    delays = make_delay_matrix(6, random_state=0)
    assignment = np.random.default_rng(0).permutation(6)
    est = DecentralizedSGD(delays=pd.DataFrame(delays), assignment=pd.Series(assignment),
                           n_rounds=3, random_state=0).fit(X, Y)
    est.save(tmp_path / "m.pt")
    back = DecentralizedSGD.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(back.delays, delays)
    np.testing.assert_array_equal(back.assignment, assignment)
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    np.testing.assert_array_equal(back.round_delays_, est.round_delays_)
