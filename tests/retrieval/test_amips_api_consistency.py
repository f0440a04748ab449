"""AMIPS API details: ``kneighbors`` defaults agree, ``transform`` names its columns
(``set_output``), and the metrics name a non-numeric index argument."""

import inspect

import numpy as np
import pytest

from mlpapers.datasets import make_mips_problem
from mlpapers.retrieval.amips import (
    AmortizedMIPS,
    ExactMIPS,
    match_rate,
    mean_reciprocal_rank,
    recall_at_k,
)
from mlpapers.retrieval.rbe import RelevanceBasedRetriever


def _default(cls, name):
    return inspect.signature(cls.kneighbors).parameters[name].default


def test_kneighbors_defaults_agree_across_the_retrievers():
    # ExactMIPS returned 1 neighbour by default where AmortizedMIPS returned 10, so the
    # same call gave arrays of different shapes for the exact and the amortized search
    assert _default(ExactMIPS, "n_neighbors") == _default(AmortizedMIPS, "n_neighbors")
    assert _default(ExactMIPS, "n_neighbors") == _default(RelevanceBasedRetriever, "n_neighbors")
    K, Q, _ = make_mips_problem(50, 4, n_queries=6, random_state=0)
    sims, idx = ExactMIPS().fit(K).kneighbors(Q)
    assert idx.shape == (6, _default(ExactMIPS, "n_neighbors"))
    np.testing.assert_array_equal(idx, np.argsort(-(Q @ K.T), axis=1, kind="stable")[:, :10])


def test_transform_columns_are_named_for_set_output():
    pd = pytest.importorskip("pandas")
    K, Q, _ = make_mips_problem(60, 5, n_queries=80, random_state=0)
    model = AmortizedMIPS(n_steps=5, random_state=0).fit(K, queries=Q)
    names = model.get_feature_names_out()
    assert list(names) == [f"amortizedmips{i}" for i in range(5)]
    keys = model.transform(Q[:4])
    model.set_output(transform="pandas")
    frame = model.transform(Q[:4])
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == list(names)
    np.testing.assert_array_equal(frame.to_numpy(), keys)


@pytest.mark.parametrize("metric", [
    lambda t, p: match_rate(t, p),
    lambda t, p: recall_at_k(t, p, 1),
    lambda t, p: mean_reciprocal_rank(t, p),
])
def test_metrics_name_string_indices(metric):
    with pytest.raises(TypeError, match="y_pred must hold integer indices"):
        metric([0, 1], np.array([["a"], ["b"]]))
    with pytest.raises(TypeError, match="y_true must hold integer indices"):
        metric(np.array(["a", "b"]), [[0], [1]])
