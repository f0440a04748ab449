"""Amortized MIPS with the user's own objects: hand-built / wrapped modules
(SupportNet, KeyNet, Homogenize of any scalar model, SupportFunction) and query samplers."""

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.retrieval.amips import (
    AmortizedMIPS,
    GaussianMixtureQuerySampler,
    Homogenize,
    KeyNet,
    SupportFunction,
    SupportNet,
)

X = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))


class ScalarBN(nn.Module):
    """A user's scalar model h: (n, 3) -> (n,) with BatchNorm (and optional Dropout)."""

    def __init__(self, dropout=0.0):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.l1, self.l2 = nn.Linear(3, 8), nn.Linear(8, 1)
        for p in self.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g))
        self.bn, self.drop = nn.BatchNorm1d(8), nn.Dropout(dropout)

    def forward(self, x):
        return self.l2(self.drop(torch.tanh(self.bn(self.l1(x)))))[..., 0]


def _autograd_reference(model, x):
    x = x.detach().double().requires_grad_(True)
    v = model.double()(x)
    (g,) = torch.autograd.grad(v.sum(), x)
    return v.detach(), g


# -- a user's BatchNorm model in train mode (regression) --------------------------------
@pytest.mark.parametrize("context", ["grad", "no_grad", "inference_mode"])
def test_score_and_key_of_a_train_mode_batchnorm_model(context):
    # Regression: score_and_key(x) (no create_graph) ran the model under torch.func.grad,
    # which refuses BatchNorm's in-place running-statistics update in train mode:
    # "During a grad (vjp, jvp, grad, etc) transform, the function provided attempted to
    # call in-place operation (aten::add_.Tensor) that would mutate a captured tensor"
    model = Homogenize(ScalarBN()).train()
    ref = copy.deepcopy(model)
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
           "inference_mode": torch.inference_mode}[context]
    with ctx():
        value, key = model.score_and_key(X)
    assert not value.requires_grad and not key.requires_grad
    want_v, want_k = _autograd_reference(ref, X)  # a train-mode forward of the same model
    torch.testing.assert_close(value.double(), want_v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(key.double(), want_k, rtol=1e-5, atol=1e-6)
    # the running statistics moved exactly as in that train-mode forward
    torch.testing.assert_close(model.model.bn.running_mean.double(), ref.model.bn.running_mean)
    assert int(model.model.bn.num_batches_tracked) == 1
    assert model.training  # the user's mode is left as given


def test_eval_mode_batchnorm_model_scores_each_row_on_its_own():
    model = Homogenize(ScalarBN(dropout=0.5))
    model(X)  # one train-mode forward: running statistics away from their init
    model.eval()
    stats = model.model.bn.running_mean.clone()
    state = torch.random.get_rng_state()
    v, k = model.score_and_key(X)
    rows = [model.score_and_key(X[i:i + 1]) for i in range(len(X))]
    torch.testing.assert_close(v, torch.cat([r[0] for r in rows]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(k, torch.cat([r[1] for r in rows]), rtol=1e-6, atol=1e-7)
    assert torch.equal(torch.random.get_rng_state(), state)  # eval: no dropout draw
    assert torch.equal(model.model.bn.running_mean, stats)


def test_score_and_key_with_frozen_parameters_still_differentiates_the_input():
    net = SupportNet(3, [8, 8], generator=torch.Generator().manual_seed(0)).requires_grad_(False)
    for create_graph in (False, True):
        v, k = net.score_and_key(X, create_graph=create_graph)
        want_v, want_k = _autograd_reference(copy.deepcopy(net), X)
        torch.testing.assert_close(k.double(), want_k, rtol=1e-5, atol=1e-6)
    assert not any(p.requires_grad for p in net.parameters())


def test_score_and_key_leaves_the_input_and_the_module_as_given():
    net = Homogenize(SupportNet(3, [8], generator=torch.Generator().manual_seed(0))).eval()
    x = X.clone()
    flags = [p.requires_grad for p in net.parameters()]
    net.score_and_key(x)
    net.score_and_key(x, create_graph=True)
    assert torch.equal(x, X) and not x.requires_grad
    assert [p.requires_grad for p in net.parameters()] == flags and not net.training


# -- dtype / device moves, state_dict, pickling -----------------------------------------
def _models():
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    return {
        "supportnet": (SupportNet(3, [8, 8], generator=g()),
                       lambda: SupportNet(3, [8, 8])),
        "keynet": (KeyNet(3, [8, 8], resnet=True, generator=g()),
                   lambda: KeyNet(3, [8, 8], resnet=True)),
        "homogenize": (Homogenize(SupportNet(3, [8], generator=g())),
                       lambda: Homogenize(SupportNet(3, [8]))),
        "support_function": (SupportFunction(torch.randn(7, 3, generator=g())),
                             lambda: SupportFunction(torch.zeros(7, 3))),
    }


@pytest.mark.parametrize("name", ["supportnet", "keynet", "homogenize", "support_function"])
def test_state_dict_pickle_and_double_round_trips(name):
    model, blank = _models()[name]
    v, k = model.score_and_key(X)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    other = blank()
    other.load_state_dict(torch.load(buf, weights_only=True))
    for copy_ in (other, pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        v2, k2 = copy_.score_and_key(X)
        torch.testing.assert_close(v2, v, rtol=0, atol=0)
        torch.testing.assert_close(k2, k, rtol=0, atol=0)
    wide = copy.deepcopy(model).double()
    v64, k64 = wide.score_and_key(X.double())
    assert v64.dtype == k64.dtype == torch.float64
    torch.testing.assert_close(v64, v.double(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k64, k.double(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["supportnet", "keynet", "homogenize", "support_function"])
def test_train_and_eval_modes_give_the_same_scores(name):
    # the library's modules hold no mode-dependent layer: eval() changes nothing
    model, _ = _models()[name]
    v, k = model.train().score_and_key(X)
    v2, k2 = model.eval().score_and_key(X)
    torch.testing.assert_close(v2, v, rtol=0, atol=0)
    torch.testing.assert_close(k2, k, rtol=0, atol=0)


# -- query samplers and failed fits --------------------------------------------------------
KEYS = np.random.default_rng(0).standard_normal((40, 4))
QUERIES = np.random.default_rng(1).standard_normal((10, 4))


def test_sampler_is_called_once_per_step_plus_the_initialisation_batch():
    calls = []

    def sampler(n, rng):
        calls.append((n, type(rng)))
        return rng.standard_normal((n, 4))

    AmortizedMIPS(n_steps=5, batch_size=16, random_state=0).fit(KEYS, queries=sampler)
    assert calls == [(16, np.random.Generator)] * 6


@pytest.mark.parametrize("convert", [
    lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True),
    lambda a: a.tolist(),
    lambda a: torch.tensor(a, dtype=torch.float32),
])
def test_sampler_outputs_are_coerced_to_float32(convert):
    def plain(n, rng):
        return rng.standard_normal((n, 4)).astype(np.float32)

    ref = AmortizedMIPS(n_steps=4, batch_size=8, random_state=0).fit(KEYS, queries=plain)
    got = AmortizedMIPS(n_steps=4, batch_size=8, random_state=0).fit(
        KEYS, queries=lambda n, rng: convert(plain(n, rng)))
    np.testing.assert_array_equal(got.predict_key(QUERIES), ref.predict_key(QUERIES))


@pytest.mark.parametrize("bad,match", [
    (lambda n, rng: rng.standard_normal((n + 1, 4)), "returned 9 rows, expected 8"),
    (lambda n, rng: rng.standard_normal((n, 3)), "3 features"),
    (lambda n, rng: np.full((n, 4), np.nan), "NaN"),
    (lambda n, rng: None, "sampler output"),
])
def test_bad_sampler_outputs_raise_clearly(bad, match):
    with pytest.raises(ValueError, match=match):
        AmortizedMIPS(n_steps=3, batch_size=8, random_state=0).fit(KEYS, queries=bad)


def test_sampler_raising_mid_fit_leaves_a_fitted_estimator_unchanged():
    # Regression: fit set database_, hidden_dims_ and the data units (key_scale_,
    # query_scale_) before training, so a sampler raising at step 3 of a refit left the
    # old model_ with the new units: predictions off by a factor of ~1000, silently.
    est = AmortizedMIPS(n_steps=6, batch_size=8, random_state=0).fit(KEYS)
    want = est.predict_key(QUERIES)
    state = dict(vars(est))
    calls = []

    def failing(n, rng):
        calls.append(n)
        if len(calls) > 3:
            raise RuntimeError("sampler down")
        return 1000.0 * rng.standard_normal((n, 4))

    with pytest.raises(RuntimeError, match="sampler down"):
        est.fit(1000.0 * KEYS, queries=failing)
    assert vars(est).keys() == state.keys()
    assert all(vars(est)[k] is v for k, v in state.items())
    np.testing.assert_array_equal(est.predict_key(QUERIES), want)


def test_sampler_raising_in_a_first_fit_leaves_it_unfitted():
    from sklearn.exceptions import NotFittedError

    est = AmortizedMIPS(n_steps=3, batch_size=8, random_state=0)

    def failing(n, rng):
        raise RuntimeError("sampler down")

    with pytest.raises(RuntimeError):
        est.fit(KEYS, queries=failing)
    with pytest.raises(NotFittedError):
        est.predict_key(QUERIES)


def test_gaussian_mixture_sampler_pickles_and_is_deterministic_in_its_rng():
    sampler = GaussianMixtureQuerySampler(np.eye(4), noise=0.1)
    back = pickle.loads(pickle.dumps(sampler))
    a = sampler(5, np.random.default_rng(3))
    np.testing.assert_array_equal(back(5, np.random.default_rng(3)), a)
    fits = [AmortizedMIPS(n_steps=3, batch_size=8, random_state=0).fit(KEYS, queries=s)
            for s in (sampler, back)]
    np.testing.assert_array_equal(fits[0].predict_key(QUERIES), fits[1].predict_key(QUERIES))
