"""Option interactions of ``RelevanceBasedRetriever`` and ``AdaCURRetriever`` (pairwise
covering arrays).

Every pair of values of the code-path options appears in at least one configuration
(greedy covering array, generated deterministically by
``tests._pairwise.covering_array``). Each configuration is fitted on a tiny nonlinear
heavy ranker and must keep, whatever the other options: the documented shapes and
dtypes, finite scores, ``kneighbors`` equal to the top of ``predict`` (no re-ranking)
or to brute force (``n_rerank = n_items``), the linear head's answer when the neural
head is off (``max_iter=0``), the call accounting, identical outputs for the same
``random_state``, after a refit of a ``clone`` and after ``save``/``load`` (every
fitted attribute kept), and answers that do not depend on ``batch_size``.
"""

import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone

from mlpapers.retrieval.rbe import AdaCURRetriever, RelevanceBasedRetriever
from tests._pairwise import covering_array, uncovered_pairs

_rng = np.random.default_rng(0)
_QA = _rng.standard_normal((70, 5))
ITEMS = _rng.standard_normal((30, 5))
Q_TRAIN, Q_TEST = _QA[:50], _QA[50:]


def heavy(q, i):
    """A nonlinear heavy ranker (rank above 5): a bilinear tanh plus a query-norm term."""
    q, i = np.asarray(q, dtype=np.float64), np.asarray(i, dtype=np.float64)
    return np.tanh(q @ i.T) + 0.1 * (q**2).sum(1)[:, None] * np.cos(i[:, 0])[None]


R_TEST = heavy(Q_TEST, ITEMS)

OPTIONS = {
    "support": ["greedy", "random", "popular", "kmeans", "farthest", "array"],
    "head": ["linear", "mlp"],
    "n_rerank": [0, 5, 30],
    "ridge": [0.0, 0.1],
    "rcond": [None, 1e-3],
    "standardize": [True, False],
    "mlp_hidden": [8, 0],
    "loss": ["softmax_signed", "mse"],
    "max_iter": [4, 0],
    "validation_fraction": [0.2, 0.0],
    "n_support": [6, 1],
    "input": ["numpy", "list", "torch", "matrix"],
}
CONFIGS = covering_array(OPTIONS)


def _make(cfg, **extra):
    kw = {k: v for k, v in cfg.items() if k != "input"}
    if kw["support"] == "array":
        kw["support"] = np.array([3, 7, 1, 20, 11, 0])[:kw["n_support"]]
    return RelevanceBasedRetriever(heavy, eval_every=2, item_batch=16, random_state=0,
                                   **{**kw, **extra})


def _fit(est, cfg):
    kw = {}
    if cfg["input"] == "list":
        args = (Q_TRAIN.tolist(), ITEMS.tolist())
    elif cfg["input"] == "torch":
        args = (torch.as_tensor(Q_TRAIN), torch.as_tensor(ITEMS))
    else:
        args = (Q_TRAIN, ITEMS)
        if cfg["input"] == "matrix":
            kw["relevance_matrix"] = heavy(Q_TRAIN, ITEMS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (interpolation warnings of some supports)
        return est.fit(*args, **kw), args[1]


def _outputs(m):
    return (m.predict(Q_TEST), *m.kneighbors(Q_TEST, 3), m.transform_queries(Q_TEST),
            m.transform_items())


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_the_covering_arrays_cover_every_pair():
    assert uncovered_pairs(OPTIONS, CONFIGS) == []
    assert uncovered_pairs(ADACUR_OPTIONS, ADACUR_CONFIGS) == []


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"c{i}" for i in range(len(CONFIGS))])
def test_every_pair_of_options_keeps_the_invariants(cfg, tmp_path):
    m, items = _fit(_make(cfg), cfg)
    out = _outputs(m)
    P, s, idx, U, E = out
    k = len(m.support_indices_)
    assert P.shape == (20, 30) and np.isfinite(P).all()
    assert P.dtype == np.float64  # (the neural head's was float32 at some scales only)
    assert idx.shape == (20, 3) and idx.dtype == np.int64
    assert U.shape == (20, k) and E.shape == (30, k)
    assert m.n_calls_per_query_ == k + cfg["n_rerank"]
    # best_validation_hit_rate_ is always set: a float exactly when validation ran
    validated = (cfg["head"] == "mlp" and cfg["max_iter"] > 0
                 and cfg["validation_fraction"] > 0)
    assert (m.best_validation_hit_rate_ is not None) == validated
    assert (m.head_units_ is None) == (m.head_ is None) == (cfg["head"] == "linear")
    if cfg["n_rerank"] == 30:  # every item re-ranked: brute force (ties: lower index)
        np.testing.assert_array_equal(idx, np.argsort(-R_TEST, axis=1, kind="stable")[:, :3])
    elif cfg["n_rerank"] == 0:  # the top of predict, with its scores
        np.testing.assert_array_equal(s, np.take_along_axis(P, idx, 1).astype(s.dtype))
        assert (s[:, 0] == P.max(1)).all()
    if cfg["head"] == "mlp" and cfg["max_iter"] == 0:  # the untrained head is linear RBE
        lin = _fit(_make(cfg, head="linear"), cfg)[0].predict(Q_TEST)
        np.testing.assert_allclose(P, lin, rtol=1e-4, atol=1e-4 * np.abs(lin).max())
    # the same random_state (a clone refitted) and a save/load give the same answers
    _assert_same(out, _outputs(_fit(clone(m), cfg)[0]))
    m.save(tmp_path / "m.pt")
    back = RelevanceBasedRetriever.load(tmp_path / "m.pt", relevance_fn=heavy, items=items)
    _assert_same(out, _outputs(back))
    fitted = {a for a in vars(m) if a.endswith("_") and not a.startswith("_")}
    assert fitted <= set(vars(back))
    assert back.best_validation_hit_rate_ == m.best_validation_hit_rate_
    # batch_size chunks the heavy calls and the scoring only
    small = _fit(clone(m).set_params(batch_size=3), cfg)[0]
    np.testing.assert_allclose(small.predict(Q_TEST), P, rtol=1e-5,
                               atol=1e-6 * np.abs(P).max())


ADACUR_OPTIONS = {
    "n_calls": [6, 1, 30],
    "n_rounds": [1, 3, "all"],
    "init": ["random", "greedy", "popular", "kmeans", "farthest"],
    "ridge": [0.0, 0.1],
    "rcond": [None, 1e-3],
    "input": ["numpy", "list", "matrix"],
}
ADACUR_CONFIGS = covering_array(ADACUR_OPTIONS)


@pytest.mark.parametrize("cfg", ADACUR_CONFIGS,
                         ids=[f"a{i}" for i in range(len(ADACUR_CONFIGS))])
def test_adacur_pairs_keep_the_invariants(cfg, tmp_path):
    kw = {k: v for k, v in cfg.items() if k != "input"}
    kw["n_rounds"] = kw["n_calls"] if kw["n_rounds"] == "all" else min(kw["n_rounds"],
                                                                         kw["n_calls"])

    def make(**extra):
        return AdaCURRetriever(heavy, random_state=0, **{**kw, **extra})

    m, items = _fit(make(), cfg)
    P = m.predict(Q_TEST)
    s, idx = m.kneighbors(Q_TEST, 3)
    assert P.shape == (20, 30) and np.isfinite(P).all() and idx.dtype == np.int64
    assert m.round_sizes_.sum() == kw["n_calls"] and len(m.round_sizes_) == kw["n_rounds"]
    np.testing.assert_array_equal(idx, np.argsort(-P, axis=1, kind="stable")[:, :3])
    if kw["n_calls"] == 30:  # every item scored by the heavy ranker: brute force
        np.testing.assert_array_equal(idx, np.argsort(-R_TEST, axis=1, kind="stable")[:, :3])
    np.testing.assert_array_equal(_fit(make(), cfg)[0].predict(Q_TEST), P)
    m.save(tmp_path / "a.pt")
    back = AdaCURRetriever.load(tmp_path / "a.pt", relevance_fn=heavy, items=items)
    np.testing.assert_array_equal(back.predict(Q_TEST), P)
    np.testing.assert_allclose(_fit(make(batch_size=1), cfg)[0].predict(Q_TEST), P,
                               rtol=1e-7, atol=1e-9)


# -- backlog: best_validation_hit_rate_ set after every fit ------------------------------
@pytest.mark.parametrize("kw", [dict(head="mlp", max_iter=0),
                                dict(head="mlp", max_iter=3, validation_fraction=0.0),
                                dict(head="linear")])
def test_best_validation_hit_rate_is_none_when_no_validation_runs(kw, tmp_path):
    """It was absent after a fit with max_iter=0 (or without validation queries, or a
    linear head) while fits that validated set it: now always set, None there, and kept
    by save/load; a validating fit sets the HitRate of its kept checkpoint."""
    est = _fit(RelevanceBasedRetriever(heavy, n_support=5, eval_every=2, random_state=0,
                                       **kw), {"input": "numpy"})[0]
    assert est.best_validation_hit_rate_ is None
    est.save(tmp_path / "r.pt")
    back = RelevanceBasedRetriever.load(tmp_path / "r.pt", relevance_fn=heavy, items=ITEMS)
    assert back.best_validation_hit_rate_ is None
    est.set_params(head="mlp", max_iter=3, validation_fraction=0.2)
    _fit(est, {"input": "numpy"})
    vals = [h["val_hit_rate"] for h in est.history_ if "val_hit_rate" in h]
    assert vals and 0.0 <= est.best_validation_hit_rate_ <= 1.0
    assert est.best_validation_hit_rate_ >= max(vals)


def test_head_units_follow_the_head_of_the_last_fit(tmp_path):
    """head_units_ (the neural head's units) was set only by an "mlp" fit, so a linear
    refit after one kept the units of a head that no longer exists (as
    best_validation_hit_rate_ did): now None exactly when head_ is None, after every
    fit, and through save/load; an "mlp" refit sets them again, for its own data
    (relevance of 2**50 is outside [2**-40, 2**40]: a power of two of it)."""
    def big(q, i):
        return heavy(q, i) * 2.0**50

    est = RelevanceBasedRetriever(big, n_support=5, head="mlp", max_iter=2, eval_every=2,
                                  random_state=0)
    _fit(est, {"input": "numpy"})
    assert est.head_ is not None and est.head_units_[1] > 2.0**40
    for head in ("linear", "mlp"):
        _fit(est.set_params(head=head), {"input": "numpy"})
        assert (est.head_units_ is None) == (est.head_ is None) == (head == "linear")
        est.save(tmp_path / "r.pt")
        back = RelevanceBasedRetriever.load(tmp_path / "r.pt", relevance_fn=big,
                                            items=ITEMS)
        if head == "linear":
            assert back.head_units_ is None
        else:  # the units of this fit's data: (1, a power of two within 2x of 2**50 R)
            np.testing.assert_array_equal(back.head_units_, est.head_units_)
            q_unit, unit = est.head_units_
            assert q_unit == 1.0 and 2.0**40 < unit and np.log2(unit) % 1 == 0
        np.testing.assert_array_equal(back.predict(Q_TEST), est.predict(Q_TEST))


@pytest.mark.parametrize(("init", "ridge", "rcond"), [("random", 0.0, None),
                                                      ("greedy", 0.3, None),
                                                      ("farthest", 0.0, 1e-3)])
def test_one_adacur_round_is_the_plain_cur_fit_with_its_anchors_scored(init, ridge, rcond):
    """Identity between the options of the two retrievers: with n_rounds=1 ADACUR's
    anchors are the first-round selection (``center=False``), its approximation is the
    plain CUR fit u^T A_{:,I}^+ A (RBE with the same supports, ``standardize=False``,
    the same ridge/rcond), and the anchors themselves sit at their heavy scores."""
    kw = dict(ridge=ridge, rcond=rcond, random_state=0)
    ada = AdaCURRetriever(heavy, n_calls=6, n_rounds=1, init=init, **kw).fit(Q_TRAIN, ITEMS)
    rbe = RelevanceBasedRetriever(heavy, n_support=6, support=init, standardize=False,
                                  **kw).fit(Q_TRAIN, ITEMS)
    S = rbe.support_indices_
    np.testing.assert_array_equal(np.sort(ada.initial_anchors_), np.sort(S))
    ref = rbe.predict(Q_TEST)
    ref[:, S] = R_TEST[:, S]
    np.testing.assert_allclose(ada.predict(Q_TEST), ref, rtol=1e-10,
                               atol=1e-10 * np.abs(ref).max())
