"""The public RBE kernels reject bad arguments with errors that name them.

``softmax_signed_loss``, ``greedy_selection`` and ``fit_linear_embeddings`` are public
functions (``mlpapers.retrieval.rbe.__all__``): a mismatch of their inputs broadcast
silently or failed deep inside torch, and a negative ridge was silently ignored.
"""

import pytest
import torch

from mlpapers.retrieval.rbe import fit_linear_embeddings, greedy_selection, softmax_signed_loss


def _low_rank(n, m, r, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, r, generator=g, dtype=torch.float64)
            @ torch.randn(r, m, generator=g, dtype=torch.float64))


def test_softmax_signed_loss_rejects_mismatched_shapes():
    targets = torch.tensor([[0.1, 0.9, 0.3, 0.2]])
    # (2, 4) logits against (1, 4) targets broadcast to a loss of the wrong problem
    with pytest.raises(ValueError, match="logits and targets"):
        softmax_signed_loss(torch.zeros(2, 4), targets)
    with pytest.raises(ValueError, match="logits and targets"):
        softmax_signed_loss(torch.zeros(1, 3), targets)
    with pytest.raises(ValueError, match="logits and targets"):
        softmax_signed_loss(torch.zeros(4), targets[0])


@pytest.mark.parametrize("q", [-0.5, 1.5, float("nan"), True])
def test_softmax_signed_loss_rejects_quantiles_outside_unit_interval(q):
    targets = torch.tensor([[0.1, 0.9, 0.3, 0.2]])
    with pytest.raises(ValueError, match="top_quantile"):
        softmax_signed_loss(torch.zeros(1, 4), targets, q)


def test_softmax_signed_loss_valid_endpoints_match_definition():
    # q = 1: only the best item is positive; q = 0: every item is (loss -1/m)
    targets = torch.tensor([[0.1, 0.9, 0.3, 0.2]], dtype=torch.float64)
    logits = torch.zeros(1, 4, dtype=torch.float64)
    p = torch.full((4,), 0.25, dtype=torch.float64)
    assert float(softmax_signed_loss(logits, targets, 1.0)) == pytest.approx(
        -float((p[1] - p[[0, 2, 3]].sum()) / 4))
    assert float(softmax_signed_loss(logits, targets, 0.0)) == pytest.approx(-0.25)


@pytest.mark.parametrize("k, exc", [(-1, ValueError), (2.5, TypeError), (True, TypeError)])
def test_greedy_selection_rejects_bad_k(k, exc):
    with pytest.raises(exc, match="k must be"):
        greedy_selection(_low_rank(6, 4, 2), k)


@pytest.mark.parametrize("tol", [-1.0, float("nan")])
def test_greedy_selection_rejects_bad_tol(tol):
    # a NaN tol picked nothing (empty support, with only a warning)
    with pytest.raises(ValueError, match="tol must be"):
        greedy_selection(_low_rank(6, 4, 2), 2, tol=tol)


def test_greedy_selection_rejects_non_matrix():
    with pytest.raises(ValueError, match="X must be a 2-D"):
        greedy_selection(torch.randn(5, dtype=torch.float64), 2)


def test_greedy_selection_k0_and_full_rank_identity():
    X = _low_rank(6, 5, 2)
    idx, gains = greedy_selection(X, 0)
    assert idx.numel() == 0 and gains.numel() == 0
    # two picks span the rank-2 rows: the gains add up to ||X||_F^2
    idx, gains = greedy_selection(X, 2)
    torch.testing.assert_close(gains.sum(), (X ** 2).sum())


def test_fit_linear_embeddings_rejects_row_mismatch():
    R = _low_rank(20, 10, 3)
    with pytest.raises(ValueError, match="one row per training query"):
        fit_linear_embeddings(R[:, :3], R[:15])
    with pytest.raises(ValueError, match="2-D"):
        fit_linear_embeddings(R[:, 0], R)


@pytest.mark.parametrize("kwargs, name", [({"ridge": -1.0}, "ridge"),
                                          ({"ridge": float("nan")}, "ridge"),
                                          ({"rcond": -1e-3}, "rcond")])
def test_fit_linear_embeddings_rejects_negative_solver_parameters(kwargs, name):
    # ridge=-1 used to fall back to the pseudo-inverse without a word
    R = _low_rank(20, 10, 3)
    with pytest.raises(ValueError, match=name):
        fit_linear_embeddings(R[:, :3], R, **kwargs)


def test_fit_linear_embeddings_reproduces_low_rank_relevance():
    # CUR identity: a rank-3 matrix is its 3 generic columns times their pseudo-inverse
    R = _low_rank(20, 10, 3)
    lin = fit_linear_embeddings(R[:, :3], R, standardize=False)
    torch.testing.assert_close(R[:, :3] @ lin["embeddings"].T, R)
    assert not bool(lin["offsets"].any())


def _head_args(n_items=6, k=3):
    g = torch.Generator().manual_seed(0)
    E = torch.randn(n_items, k, generator=g)
    return [E, torch.randn(n_items, generator=g), torch.randn(n_items, generator=g),
            torch.zeros(k), torch.ones(k)]


@pytest.mark.parametrize("pos, name", [(1, "offsets"), (2, "popularity"),
                                       (3, "query_mean"), (4, "query_scale")])
def test_neural_head_rejects_inputs_that_do_not_match_the_embeddings(pos, name):
    from mlpapers.retrieval.rbe import NeuralRBEHead

    args = _head_args()
    args[pos] = args[pos][:1]  # length 1: broadcast over every item before
    with pytest.raises(ValueError, match=name):
        NeuralRBEHead(*args, hidden=4)


def test_neural_head_rejects_negative_width_and_non_matrix_embeddings():
    from mlpapers.retrieval.rbe import NeuralRBEHead

    with pytest.raises(ValueError, match="hidden"):
        NeuralRBEHead(*_head_args(), hidden=-2)  # silently meant 0
    args = _head_args()
    args[0] = args[0][:, 0]
    with pytest.raises(ValueError, match="embeddings must be a 2-D"):
        NeuralRBEHead(*args, hidden=4)


def test_untrained_neural_head_is_linear_rbe():
    from mlpapers.retrieval.rbe import NeuralRBEHead

    E, v, pop, mu, sd = _head_args()
    u = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    head = NeuralRBEHead(E, v, pop, mu, sd, hidden=4)
    torch.testing.assert_close(head(u), u @ E.T + v)
    torch.testing.assert_close(head(u, torch.tensor([4, 4, 0])), (u @ E.T + v)[:, [4, 4, 0]])
    assert torch.equal(head.all_items_scorer()(u), head(u))
