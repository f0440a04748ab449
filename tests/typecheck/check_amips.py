"""Amortized and exact MIPS, the networks and the metrics, as typed user code."""

from typing import assert_type

import numpy as np
import torch

from mlpapers.retrieval import (
    AmortizedMIPS,
    ExactMIPS,
    Homogenize,
    KeyNet,
    SupportFunction,
    SupportNet,
    amips_loss,
    match_rate,
    mean_reciprocal_rank,
    mips_topk,
    rank_by_key,
    recall_at_k,
    soft_leaky_relu,
    solve_width,
    support_function,
)


def sampler(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((n, 3))


def check() -> None:
    rng = np.random.default_rng(0)
    keys, Q = rng.standard_normal((16, 3)), rng.standard_normal((5, 3))

    amips = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=2, batch_size=16, random_state=0)
    assert_type(amips.fit(keys.tolist(), queries=Q.tolist()), AmortizedMIPS)
    assert_type(amips.fit(torch.as_tensor(keys), queries=sampler), AmortizedMIPS)
    assert_type(amips.predict(Q), np.ndarray)
    assert_type(amips.predict_key(Q), np.ndarray)
    assert_type(amips.transform(Q), np.ndarray)
    assert_type(amips.value(Q), np.ndarray)
    sims, idx = amips.kneighbors(Q, n_neighbors=2)
    assert_type(sims, np.ndarray)
    assert_type(amips.kneighbors(Q, 2, return_distance=False), np.ndarray)
    assert_type(amips.score(Q), float)

    exact = ExactMIPS()
    assert_type(exact.fit(keys), ExactMIPS)
    assert_type(exact.predict(Q), np.ndarray)
    assert_type(exact.kneighbors(Q, n_neighbors=2), tuple[np.ndarray, np.ndarray])
    assert_type(exact.kneighbors(Q, return_distance=False), np.ndarray)
    assert_type(exact.score(Q), float)

    pred = amips.predict(Q)
    assert_type(match_rate(exact.predict(Q), pred), float)
    assert_type(match_rate(None, pred, queries=Q, database=keys), float)
    top = exact.kneighbors(Q, n_neighbors=3, return_distance=False)
    assert_type(recall_at_k(exact.predict(Q), top, 3), float)
    assert_type(mean_reciprocal_rank(exact.predict(Q), top), float)

    K, X = torch.as_tensor(keys, dtype=torch.float32), torch.as_tensor(Q, dtype=torch.float32)
    assert_type(support_function(X, K), tuple[torch.Tensor, torch.Tensor])
    assert_type(mips_topk(X, K, 2), tuple[torch.Tensor, torch.Tensor])
    assert_type(rank_by_key(X, K, 2), torch.Tensor)
    assert_type(soft_leaky_relu(X), torch.Tensor)
    assert_type(solve_width(1000.0, 3, 3, 2), int)
    net = Homogenize(SupportNet(3, [8], generator=torch.Generator().manual_seed(0)))
    value, key = net.score_and_key(X)
    assert_type(value, torch.Tensor)
    assert_type(KeyNet(3, [8]).score_and_key(X), tuple[torch.Tensor, torch.Tensor])
    assert_type(SupportFunction(K).forward(X), torch.Tensor)
    true_value, true_idx = support_function(X, K)
    assert_type(amips_loss(value, key, true_value, K[true_idx]),
                tuple[torch.Tensor, torch.Tensor, torch.Tensor])
