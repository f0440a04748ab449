"""The user guide's math (docs/user_guide/rbe.rst) checked against float64 references.

Each reference is written from the page's text alone (numpy, float64), on small random
inputs of odd sizes; the formulas here are those no other test compares with an
independent reference (the plain/affine pseudo-inverse fits, greedy picks and ADACUR
rounds are covered in test_rbe_selection.py, test_rbe_issue_spec.py and
test_rbe_adacur.py).
"""
import numpy as np
import pytest
import torch

from mlpapers.retrieval.rbe import (
    NeuralRBEHead,
    RelevanceBasedRetriever,
    fit_linear_embeddings,
    softmax_signed_loss,
)

EPS = np.finfo(np.float64).eps


def _relevance(n_q, n_items, seed, rank=4):
    g = np.random.default_rng(seed)
    low = g.standard_normal((n_q, rank)) @ g.standard_normal((rank, n_items))
    return low + 0.3 * np.tanh(g.standard_normal((n_q, n_items))) + 1.5


@pytest.mark.parametrize("shape, seed", [((23, 41, 5), 0), ((40, 17, 6), 1), ((31, 60, 9), 2)])
@pytest.mark.parametrize("ridge", [0.0, 0.7])
def test_standardized_fit_is_ridge_on_population_standardised_supports(shape, seed, ridge):
    """Section "The method", Linear RBE: with ``standardize=True`` the support columns
    are centred and scaled by the population std (1/n_q), c_i is the item's mean
    training relevance, and ``ridge`` replaces the pseudo-inverse by
    (U^T U + lambda I)^{-1} U^T. The scale convention matters for ridge > 0."""
    n_q, n_items, k = shape
    R = _relevance(n_q, n_items, seed)
    S = np.random.default_rng(100 + seed).choice(n_items, k, replace=False)
    out = fit_linear_embeddings(torch.tensor(R[:, S]), torch.tensor(R), ridge=ridge)
    mu, sigma = R[:, S].mean(0), R[:, S].std(0)  # ddof=0
    U = (R[:, S] - mu) / sigma
    E = np.linalg.solve(U.T @ U + ridge * np.eye(k), U.T @ (R - R.mean(0))).T
    np.testing.assert_allclose(out["mean"].numpy(), mu, rtol=1e-13)
    np.testing.assert_allclose(out["scale"].numpy(), sigma, rtol=1e-13)
    np.testing.assert_allclose(out["offsets"].numpy(), R.mean(0), rtol=1e-13)
    np.testing.assert_allclose(out["embeddings"].numpy(), E, rtol=1e-9, atol=1e-11)


def test_plain_ridge_formula():
    """Section "The method": ``ridge`` with ``standardize=False`` gives
    e_i = (R_S^T R_S + lambda I)^{-1} R_S^T R_{:,i}."""
    R = _relevance(27, 33, 3)
    S = [4, 9, 20, 31]
    out = fit_linear_embeddings(torch.tensor(R[:, S]), torch.tensor(R), ridge=0.7,
                                standardize=False)
    A = R[:, S]
    E = np.linalg.solve(A.T @ A + 0.7 * np.eye(len(S)), A.T @ R).T
    np.testing.assert_allclose(out["embeddings"].numpy(), E, rtol=1e-10, atol=1e-12)


def test_default_rcond_is_max_nq_k_eps_relative():
    """Section "The method": ``rcond`` defaults to max(n_q, k) * eps relative to the
    largest singular value (``standardize=False``, the exact CUR formula): a singular
    value 20x above that cutoff is inverted, one 4x below it is dropped."""
    g = np.random.default_rng(5)
    n_q, k, n_items = 20, 3, 9
    Uo = np.linalg.qr(g.standard_normal((n_q, k)))[0]
    Vo = np.linalg.qr(g.standard_normal((k, k)))[0]
    cutoff = max(n_q, k) * EPS
    other = g.standard_normal((n_q, n_items - k))
    for small, kept in ((20 * cutoff, True), (cutoff / 4, False)):
        R_S = Uo @ np.diag([1.0, 0.5, small]) @ Vo
        R = np.column_stack([R_S, other])
        E = fit_linear_embeddings(torch.tensor(R_S), torch.tensor(R),
                                  standardize=False)["embeddings"].numpy()
        truncated = (np.linalg.pinv(R_S, rcond=1e-8) @ R).T  # the small direction dropped
        if kept:  # the 1/small direction is there: embeddings of size ~1/small
            assert np.abs(E).max() > 1e-3 / small
        else:
            np.testing.assert_allclose(E, truncated, atol=1e-9)


@pytest.mark.parametrize("standardize", [True, False])
@pytest.mark.parametrize("shape, seed", [((23, 41, 5), 0), ((40, 17, 6), 1)])
def test_selection_scores_are_training_mse_decreases_per_entry(standardize, shape, seed):
    """Section "Support selection", greedy: ``selection_scores_`` are the decreases of
    the training MSE per matrix entry, ||X - X P_S||_F^2 / (n_q N), on the item vectors
    centred per item with ``standardize=True``; each pick is the brute-force best."""
    n_q, n_items, k = shape
    R = _relevance(n_q, n_items, seed)
    est = RelevanceBasedRetriever(lambda q, i: None, n_support=k, standardize=standardize)
    est.fit(np.arange(n_q), np.arange(n_items), relevance_matrix=R)
    X = R - R.mean(0) if standardize else R

    def residual(cols):
        if not cols:
            return (X ** 2).sum()
        A = X[:, cols]
        return ((X - A @ np.linalg.lstsq(A, X, rcond=None)[0]) ** 2).sum()

    S = [int(j) for j in est.support_indices_]
    for t, j in enumerate(S):
        cand = [residual(S[:t] + [c]) if c not in S[:t] else np.inf for c in range(n_items)]
        assert int(np.argmin(cand)) == j
    dec = np.array([residual(S[:t]) - residual(S[:t + 1]) for t in range(len(S))])
    np.testing.assert_allclose(est.selection_scores_, dec / (n_q * n_items), rtol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("q", [0.99, 0.7, 0.5])
def test_softmax_signed_loss_matches_definition(seed, q):
    """Section "Neural RBE": positives are the sampled items at or above the
    ``top_quantile`` quantile of the query's sampled relevances (linear interpolation,
    ties included) and the loss is -mean(+-softmax(s)_qi)."""
    g = np.random.default_rng(seed)
    L = g.standard_normal((4, 13))
    T = np.round(g.standard_normal((4, 13)), 1)  # ties
    pos = T >= np.quantile(T, q, axis=1, keepdims=True)
    p = np.exp(L - L.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ref = -np.mean(np.where(pos, p, -p))
    got = float(softmax_signed_loss(torch.tensor(L), torch.tensor(T), q))
    assert got == pytest.approx(ref, abs=1e-15)


def test_neural_head_score_formula():
    """Section "Neural RBE": s = u^T W e + MLP_q(u~)^T MLP_i(e~)/h + p pop + v + b with
    ELU towers Linear(k,h)-ELU-Linear(h,h), u~ standardised by query_mean/query_scale,
    e~ and pop standardised over the items (mean, population std)."""
    g = torch.Generator().manual_seed(0)
    n, n_items, k, h = 5, 9, 3, 7
    f64 = dict(generator=g, dtype=torch.float64)
    E = torch.randn(n_items, k, **f64)
    v, pop = torch.randn(n_items, **f64), torch.randn(n_items, **f64)
    u, mu = torch.randn(n, k, **f64), torch.randn(k, **f64)
    sc = torch.rand(k, **f64) + 0.5
    head = NeuralRBEHead(E, v, 3.0 * pop + 2.0, mu, sc, hidden=h, generator=g)
    with torch.no_grad():  # move every parameter off its (linear-RBE) initial value
        for prm in head.parameters():
            prm.copy_(torch.randn(prm.shape, **f64))
    P = {name: t.detach().numpy() for name, t in head.named_parameters()}

    def tower(x, name):
        z = x @ P[f"{name}.0.weight"].T + P[f"{name}.0.bias"]
        z = np.where(z > 0, z, np.expm1(z))
        return z @ P[f"{name}.2.weight"].T + P[f"{name}.2.bias"]

    U, En, pn = u.numpy(), E.numpy(), 3.0 * pop.numpy() + 2.0
    u_t = (U - mu.numpy()) / sc.numpy()
    e_t = (En - En.mean(0)) / En.std(0)
    pop_t = (pn - pn.mean()) / pn.std()
    ref = (U @ P["W"] @ En.T + tower(u_t, "query_tower") @ tower(e_t, "item_tower").T / h
           + P["p"] * pop_t + P["v"] + P["b"])
    np.testing.assert_allclose(head(u).detach().numpy(), ref, rtol=1e-12, atol=1e-12)
