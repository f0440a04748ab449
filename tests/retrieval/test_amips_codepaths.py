"""AMIPS code paths no other test reached (session 19 coverage audit): each test builds
the input that reaches one of them and checks what it does against an exact property."""

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.retrieval.amips import (
    AmortizedMIPS,
    Homogenize,
    KeyNet,
    SupportFunction,
    SupportNet,
    match_rate,
    mean_reciprocal_rank,
    mips_topk,
    rank_by_key,
    recall_at_k,
    support_function,
)


def _keys(n=30, d=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def _tiny(**kw):
    return AmortizedMIPS(**{"depth": 1, "hidden_dim": 16, "n_steps": 3, "batch_size": 16,
                            "random_state": 0, **kw})


# -- the estimator ---------------------------------------------------------------
def test_ragged_training_queries_passed_as_y_are_refused():
    """A ragged list of rows in ``y`` (numpy cannot make an array of it) was ignored like
    labels, and the model trained on sphere queries without a word."""
    with pytest.raises(TypeError, match="queries="):
        _tiny().fit(_keys(), [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0]])


def test_value_refuses_a_model_with_nan_outputs():
    m = _tiny().fit(_keys())
    with torch.no_grad():
        next(iter(m.model_.parameters())).fill_(float("nan"))
    with pytest.raises(ValueError, match=r"not finite \(NaN\)"):
        m.value(_keys(5, seed=1))


def test_centring_that_overflows_float32_is_refused():
    K = np.zeros((3, 2), dtype=np.float32)
    K[:, 0] = [3e38, -3e38, -3e38]  # mean -1e38: 3e38 - (-1e38) is beyond float32
    with pytest.raises(ValueError, match="centred keys overflow float32"):
        _tiny(center_keys=True).fit(K)


def test_batch_size_one_skips_the_data_init_and_stays_finite():
    """The data-dependent initialisation needs two rows (a standard deviation); on one
    it would set every weight to NaN."""
    m = _tiny(batch_size=1, arch="supportnet").fit(_keys())
    assert all(bool(torch.isfinite(p).all()) for p in m.model_.parameters())
    assert np.isfinite(m.value(_keys(5, seed=1))).all()


def test_a_sampler_without_a_signature_is_called_as_documented():
    """A callable whose signature cannot be read (some C-extension callables) is not
    refused: it is called as ``sampler(n, rng)``, and trains as the same Python function."""
    def draw(n, rng):
        return rng.normal(size=(n, 4))

    class Opaque:
        @property
        def __signature__(self):  # what inspect meets for a builtin without one
            raise ValueError("no signature found")

        def __call__(self, n, rng):
            return draw(n, rng)

    K, Q = _keys(), _keys(7, seed=2)
    np.testing.assert_array_equal(_tiny().fit(K, queries=Opaque()).predict_key(Q),
                                  _tiny().fit(K, queries=draw).predict_key(Q))


def test_a_parameter_without_gradient_is_left_as_it_is():
    """Adam and the NaN-zeroing skip a parameter that the loss does not reach."""
    from mlpapers.retrieval.amips._training import train_amips

    model = KeyNet(3, [8], generator=torch.Generator().manual_seed(0))
    model.unused = nn.Parameter(torch.ones(3))
    before = [p.detach().clone() for p in model.stack.parameters()]
    g = torch.Generator().manual_seed(1)
    final, _ = train_amips(
        model, torch.randn(10, 3, generator=g), lambda n: torch.randn(n, 3, generator=g),
        augment=lambda q: q, n_steps=3, batch_size=16, lr=0.1, warmup=0.0,
        end_lr_ratio=1.0, ema_decay=0.0, grad_clip=1.0, score_weight=0.01,
        target_weight=1.0, search_batch_size=64)
    assert final.unused.grad is None
    torch.testing.assert_close(final.unused.detach(), torch.ones(3), rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(before, final.stack.parameters()))


# -- the networks ----------------------------------------------------------------
@pytest.mark.parametrize("cls", [KeyNet, SupportNet])
def test_networks_need_a_hidden_layer(cls):
    with pytest.raises(ValueError, match="hidden_dims must contain at least one width"):
        cls(3, [])


@pytest.mark.parametrize("cls", [KeyNet, SupportNet])
def test_scale_output_without_biases_scales_the_output(cls):
    net = cls(3, [8, 8], bias=False, generator=torch.Generator().manual_seed(0),
              dtype=torch.float64)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    before = net(x)
    net.scale_output(2.5)
    torch.testing.assert_close(net(x), 2.5 * before, rtol=1e-10, atol=1e-12)


def test_homogenize_data_init_leaves_a_model_without_one_unchanged():
    keys = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    f = Homogenize(SupportFunction(keys))
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    before = f(x)
    f.data_init(x)
    torch.testing.assert_close(f(x), before, rtol=0, atol=0)


@pytest.mark.parametrize("model", [
    SupportNet(3, [8], generator=torch.Generator().manual_seed(0), dtype=torch.float64),
    Homogenize(SupportNet(3, [8], generator=torch.Generator().manual_seed(0),
                          dtype=torch.float64))])
def test_create_graph_keeps_the_callers_input_in_the_graph(model):
    """An ``x`` that already requires grad is used as it is (no detached copy): the key
    is then the derivative of the value with respect to the caller's ``x``, and both
    keep a graph to it (double backprop)."""
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64,
                    requires_grad=True)
    value, key = model.score_and_key(x, create_graph=True)
    (grad,) = torch.autograd.grad(value.sum(), x, create_graph=True)
    torch.testing.assert_close(grad, key)
    (second,) = torch.autograd.grad(key.sum(), x)  # the Hessian's row sums, finite
    assert second.shape == x.shape and bool(torch.isfinite(second).all())


# -- the kernels -----------------------------------------------------------------
def test_all_zero_keys_tie_every_key_lowest_index_first():
    """Every product is exactly 0, at any query scale: ties ordered by index, also for a
    query whose norm overflows float32 (searched again rescaled: the bound is 0)."""
    keys = torch.zeros(5, 3)
    q = torch.tensor([[1.0, -2.0, 0.5], [3e38, 3e38, -3e38]])
    scores, idx = mips_topk(q, keys, 3)
    assert bool((scores == 0).all())
    torch.testing.assert_close(idx, torch.tensor([[0, 1, 2], [0, 1, 2]]))


def test_a_search_without_features_is_refused():
    """Zero features failed with a torch IndexError in the rescue of the small rows."""
    with pytest.raises(ValueError, match="no feature"):
        mips_topk(torch.zeros(2, 0), torch.zeros(4, 0), 2)


def test_tie_aware_metrics_refuse_queries_and_database_without_features():
    """As the searches (above): they failed with torch's IndexError "amax(): Expected
    reduction dim 1 to have non-zero size" in the rescaling of the tie-aware mode."""
    Q, K = np.zeros((2, 0)), np.zeros((3, 0))
    for metric in (lambda: match_rate(None, [0, 1], queries=Q, database=K),
                   lambda: recall_at_k(None, [[0, 1], [1, 0]], 2, queries=Q, database=K),
                   lambda: mean_reciprocal_rank(None, [[0, 1], [1, 0]], queries=Q,
                                                database=K)):
        with pytest.raises(ValueError, match="queries and database have no feature"):
            metric()
    with pytest.raises(ValueError, match="same number of features, got 3 and 2"):
        match_rate(None, [0], queries=[[1.0, 0.0, 0.0]], database=np.eye(2))


def test_searches_of_zero_queries_return_empty_results():
    """Zero queries (with features) still give empty results, as before the zero-feature
    refusal: only a search without features is refused."""
    keys = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    Q = torch.zeros(0, 3)
    scores, idx = mips_topk(Q, keys, 2)
    assert scores.shape == idx.shape == (0, 2)
    for metric in ("ip", "l2"):
        assert rank_by_key(Q, keys, 2, metric=metric).shape == (0, 2)
    best, arg = support_function(Q, keys)
    assert best.shape == arg.shape == (0,)


def test_tie_aware_metrics_refuse_incomplete_or_malformed_input():
    K = np.eye(3)
    with pytest.raises(ValueError, match="y_true is required"):
        match_rate(None, [0])
    with pytest.raises(ValueError, match="given together"):
        match_rate(None, [0], queries=[[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="1D or 2D, got 3D"):
        match_rate([0], [[[0]]])
    with pytest.raises(ValueError, match="database is empty"):
        match_rate(None, [0], queries=[[1.0, 0.0, 0.0]], database=K[:0])
    with pytest.raises(ValueError, match="y_true has 2 rows but y_pred has 1"):
        match_rate([0, 1], [0])
    with pytest.raises(ValueError, match="queries has 1 rows but y_pred has 2"):
        match_rate(None, [0, 1], queries=[[1.0, 0.0, 0.0]], database=K)
