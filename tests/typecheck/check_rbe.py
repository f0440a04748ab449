"""The relevance-based-embedding retrievers and their functions, as typed user code."""

from typing import Any, assert_type

import numpy as np
import torch

from mlpapers.retrieval import (
    AdaCURRetriever,
    AnnCURRetriever,
    NeuralRBEHead,
    RelevanceBasedRetriever,
    cur_query_weights,
    fit_linear_embeddings,
    greedy_selection,
    hit_rate,
    select_support,
    softmax_signed_loss,
)


def heavy(queries: Any, items: Any) -> np.ndarray:
    return np.tanh(np.asarray(queries) @ np.asarray(items).T)


def check() -> None:
    rng = np.random.default_rng(0)
    Q, items = rng.standard_normal((20, 3)), rng.standard_normal((12, 3))
    train, test = Q[:16], Q[16:]
    R = heavy(train, items)

    rbe = RelevanceBasedRetriever(heavy, n_support=4, n_rerank=3, random_state=0)
    assert_type(rbe.fit(train, items, relevance_matrix=R), RelevanceBasedRetriever)
    assert_type(rbe.transform_items(), np.ndarray)
    assert_type(rbe.transform_queries(test), np.ndarray)
    assert_type(rbe.predict(list(test)), np.ndarray)
    scores, idx = rbe.kneighbors(test, n_neighbors=3)
    assert_type(scores, np.ndarray)
    assert_type(idx, np.ndarray)
    assert_type(rbe.kneighbors(test, 3, return_distance=False), np.ndarray)
    assert_type(rbe.score(test, heavy(test, items), n_neighbors=3), float)

    mlp = RelevanceBasedRetriever(heavy, n_support=4, head="mlp", mlp_hidden=4,
                                  max_iter=2, eval_every=1, random_state=0)
    assert_type(mlp.fit(train, items), RelevanceBasedRetriever)
    assert_type(mlp.head_, NeuralRBEHead | None)
    if mlp.head_ is not None:
        U = torch.as_tensor(mlp.transform_queries(test), dtype=torch.float32)
        assert_type(mlp.head_.forward(U), torch.Tensor)
        assert_type(mlp.head_.all_items_scorer()(U), torch.Tensor)

    ann = AnnCURRetriever(heavy, n_support=4, random_state=0)
    assert_type(ann.fit(train, items), AnnCURRetriever)
    assert_type(ann.kneighbors(test, 2, return_distance=False), np.ndarray)

    ada = AdaCURRetriever(heavy, n_calls=4, n_rounds=2, random_state=0)
    assert_type(ada.fit(train, items, R), AdaCURRetriever)
    assert_type(ada.predict(test), np.ndarray)
    assert_type(ada.predict(test, return_anchors=True), tuple[np.ndarray, np.ndarray])
    assert_type(ada.kneighbors(test, n_neighbors=2), tuple[np.ndarray, np.ndarray])
    assert_type(ada.score(test, n_neighbors=2), float)

    assert_type(hit_rate(R, np.argsort(-R, axis=1)[:, :3]), float)
    assert_type(select_support(R, 4, "popular"), np.ndarray)
    assert_type(select_support(R, 4, return_scores=True), tuple[np.ndarray, np.ndarray])
    Rt = torch.as_tensor(R)
    sel, gains = greedy_selection(Rt.T, 3)
    assert_type(sel, torch.Tensor)
    lin = fit_linear_embeddings(Rt[:, sel], Rt)
    assert_type(lin, dict[str, torch.Tensor])
    C = Rt.T[sel][None].expand(2, -1, -1)  # (b, m, n_queries): anchor items' relevance
    assert_type(cur_query_weights(C, Rt[:2, sel]), torch.Tensor)
    assert_type(softmax_signed_loss(Rt[:4].float(), Rt[4:8].float()), torch.Tensor)
