"""BTSP-MSR's assignment functions and DecentralizedSGD under the caller's ambient torch
state: grad and inference mode, default dtype, deterministic algorithms, anomaly
detection, global RNGs, threads and the user's own objects."""

import copy
import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import load_iris

from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    best_multiplier,
    bottleneck_delay,
    bottleneck_tsp,
    circulant_schedule,
    delays_from_graph,
    make_delay_matrix,
    metric_closure,
    mixing_matrices,
)
from tests._ambient import (
    AMBIENT,
    assert_same_result,
    check_ambient,
    check_one_numpy_seed,
    check_state_untouched,
    check_thread_safe,
)

D = make_delay_matrix(8, random_state=0)
D_SPARSE = np.where(np.abs(np.subtract.outer(np.arange(8), np.arange(8))) <= 2, D, np.inf)


def _graph_delays():
    nx = pytest.importorskip("networkx")
    G = nx.cycle_graph(6)
    for k, (u, v) in enumerate(G.edges):
        G.edges[u, v]["distance"] = 100.0 * (k + 1)
    return delays_from_graph(G)


def _assigner():
    est = BottleneckNodeAssigner(topology="one_peer_exponential", refine_iter=20,
                                 random_state=0).fit(D)
    out = {k: v for k, v in vars(est).items()
           if k.endswith("_") and k not in ("fit_time_", "schedule_", "edges_")}
    out["bcd"] = est.bcd(D, reduce="none")
    return out


FUNCTIONS = {
    "assigner": _assigner,
    "assigner_closure": lambda: BottleneckNodeAssigner(
        method="annealing", n_iter=50, metric_closure=True, random_state=0).fit(
        D_SPARSE).assignment_,
    "bottleneck_tsp": lambda: bottleneck_tsp(D, random_state=0),
    "best_multiplier": lambda: best_multiplier(D, np.arange(8)),
    "bottleneck_delay": lambda: bottleneck_delay(D, np.arange(8)[::-1], reduce="none"),
    "circulant_schedule": lambda: [np.asarray(s) for s in circulant_schedule(8, "ring")],
    "mixing_matrices": lambda: mixing_matrices(8, "one_peer_exponential"),
    "metric_closure": lambda: metric_closure(D_SPARSE),
    "delays_from_graph": _graph_delays,
    "make_delay_matrix": lambda: make_delay_matrix(8, "backbone", random_state=0),
}


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_functions_indifferent_to_ambient_state(name, context):
    check_ambient(FUNCTIONS[name], context)


@pytest.mark.parametrize("name", ["assigner", "bottleneck_tsp", "make_delay_matrix"])
def test_functions_thread_safe_and_leave_global_state(name):
    check_state_untouched(FUNCTIONS[name])
    check_thread_safe(FUNCTIONS[name])


def test_delay_inputs_not_mutated_and_odd_arrays_accepted():
    ro = D.copy()
    ro.flags.writeable = False
    with torch.inference_mode():
        D_inf = torch.tensor(D)
    D_grad = torch.tensor(D, requires_grad=True)
    expected = BottleneckNodeAssigner(random_state=0).fit(D).assignment_
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for delays in (ro, D_inf, D_grad):
            est = BottleneckNodeAssigner(random_state=0).fit(delays)
            np.testing.assert_array_equal(est.assignment_, expected)
            assert est.bcd(delays) == est.bcd_
            assert bottleneck_delay(delays, expected) == est.bcd_
    np.testing.assert_array_equal(ro, D)
    assert D_grad.grad is None


# -- DecentralizedSGD ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    return ((X - X.mean(0)) / X.std(0)).astype(np.float32), y


def _user_module(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 5, dtype=dtype), torch.nn.Tanh(),
                              torch.nn.Linear(5, 3, dtype=dtype))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float32) - 0.5)
    return net


USER = _user_module()


@pytest.fixture(scope="module", autouse=True)
def _warm_up(iris):
    # torch imports some modules lazily on first use of torch.func (sympy adds a warnings
    # filter then): a one-time process effect, not a call's
    DecentralizedSGD(model=USER, n_nodes=2, n_rounds=1).fit(*iris)
MODELS = {"logistic": "logistic", "mlp": "mlp", "user_module": USER}


def _dsgd(model, X, y, **fit_params):
    clf = DecentralizedSGD(model=model, n_nodes=4, n_rounds=6, eval_every=3, hidden=5,
                           delays=make_delay_matrix(4, random_state=0),
                           random_state=0).fit(X, y, **fit_params)
    return {"proba": clf.predict_proba(X), "pred": clf.predict(X), "nodes": clf.node_params_,
            "params": clf.params_, "history": [[h["loss"], h["consensus"]] for h in
                                               clf.history_], "sim_time": clf.sim_time_}


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("model", list(MODELS))
def test_dsgd_indifferent_to_ambient_state(model, context, iris):
    # fit failed inside no_grad/inference_mode ("element 0 of tensors does not require
    # grad") and under another default dtype (float64 layers on float32 data), and the
    # built-in layers' default init advanced the global torch RNG
    check_ambient(lambda: _dsgd(MODELS[model], *iris), context)


@pytest.mark.parametrize("model", list(MODELS))
def test_dsgd_leaves_global_state_and_is_thread_safe(model, iris):
    check_state_untouched(lambda: _dsgd(MODELS[model], *iris))
    check_thread_safe(lambda: _dsgd(MODELS[model], *iris))


def test_dsgd_random_state_none_never_reseeds(iris):
    check_one_numpy_seed(lambda: DecentralizedSGD(n_nodes=4, n_rounds=2,
                                                  random_state=None).fit(*iris))


def test_dsgd_user_module_left_untouched(iris):
    net = _user_module().train()
    net[0].weight.requires_grad_(False)
    net.register_forward_hook(lambda *args: None)
    snapshot = copy.deepcopy(net.state_dict())
    with torch.no_grad():
        _dsgd(net, *iris)
    assert net.training
    assert [p.requires_grad for p in net.parameters()] == [False, True, True, True]
    assert all(p.grad is None for p in net.parameters())
    assert len(net._forward_hooks) == 1
    for k, v in net.state_dict().items():
        assert torch.equal(v, snapshot[k])


def test_dsgd_float64_user_module_trains_as_float32(iris):
    # a module built in float64 (e.g. under set_default_dtype(torch.float64)) failed with
    # "mat1 and mat2 must have the same dtype"; it now trains as a float32 copy
    net64 = _user_module(torch.float64)
    assert_same_result(_dsgd(USER, *iris), _dsgd(net64, *iris))
    assert all(p.dtype == torch.float64 for p in net64.parameters())


def test_dsgd_inputs_not_mutated_and_odd_tensors_accepted(iris):
    X, y = iris
    expected = _dsgd("mlp", X, y)
    ro_X, ro_y = X.copy(), y.copy()
    ro_X.flags.writeable = False
    ro_y.flags.writeable = False
    X_grad = torch.tensor(X, requires_grad=True)
    with torch.inference_mode():
        X_inf, y_inf = torch.tensor(X), torch.tensor(y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for Xi, yi in ((ro_X, ro_y), (X_grad, y), (X_inf, y_inf)):
            out = _dsgd("mlp", Xi, yi, eval_set=(Xi, yi))
            np.testing.assert_array_equal(out["proba"], expected["proba"])
            for v in (*out["nodes"].values(), *out["params"].values()):
                assert not v.requires_grad and v.grad_fn is None and not v.is_inference()
    np.testing.assert_array_equal(ro_X, X)
    assert X_grad.grad is None


@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "default_float64",
                                     "default_float16"])
def test_dsgd_save_load_indifferent_to_ambient_state(context, iris, tmp_path):
    X, y = iris
    clf = DecentralizedSGD(model="mlp", n_nodes=4, n_rounds=4, hidden=5,
                           random_state=0).fit(X, y)
    path = tmp_path / "dsgd.pt"
    with AMBIENT[context]():
        clf.save(path)
        loaded = DecentralizedSGD.load(path)
        inside = loaded.predict_proba(X)
    np.testing.assert_array_equal(inside, clf.predict_proba(X))
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_dsgd_user_module_is_cast_only_when_its_parameters_need_it(iris):
    """A float32 module with a float64 buffer works as it is: casting it whole rounded
    the buffer (other probabilities than the module computes)."""

    class Shifted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)
            self.register_buffer("shift", torch.full((3,), 1 / 3, dtype=torch.float64))

        def forward(self, x):
            return (self.linear(x) + self.shift).float()

    X, y = iris
    clf = DecentralizedSGD(model=Shifted(), n_nodes=2, n_rounds=2, random_state=0).fit(X, y)
    assert clf.buffers_["shift"].dtype == torch.float64  # the state predict runs with
    assert clf.params_["linear.weight"].dtype == torch.float32
