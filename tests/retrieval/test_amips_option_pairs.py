"""Option interactions of ``AmortizedMIPS`` (pairwise covering array) and of the
tie-aware metrics.

Every pair of values of the code-path options below appears in at least one
configuration (a greedy covering array, generated deterministically by
``tests._pairwise.covering_array``). Each configuration is fitted on tiny data and must
keep, whatever the other options: the documented output shapes and dtypes, finite
values, the match rate of ``score`` equal to a float64 brute-force count, the
similarities of ``kneighbors`` equal to the true inner products, ``predict`` equal to
the first column of ``kneighbors`` (``n_candidates`` 1 or ``>= n_neighbors``),
``n_candidates = n_keys`` exact, identical outputs after a refit of a ``clone``, after
``pickle`` and after ``save``/``load`` (every fitted attribute kept), and answers that
do not depend on ``search_batch_size``/``batch_size``.
"""

import pickle
from fractions import Fraction

import numpy as np
import pytest
import torch
from sklearn.base import clone

from mlpapers.retrieval import AmortizedMIPS, ExactMIPS
from mlpapers.retrieval.amips import match_rate, mean_reciprocal_rank, recall_at_k
from tests._pairwise import covering_array, uncovered_pairs

from ._wine import wine_keys_and_queries

OPTIONS = {
    "arch": ["keynet", "supportnet"],
    "homogenize": [True, False],
    "resnet": [False, True],
    "retrieval": ["ip", "l2"],
    "n_candidates": [1, 3, 12],
    "center_keys": [False, True],
    "hidden_dim": [None, 8],
    "wx_inject": [4, True, False],
    "ema_decay": [0.97, 0.0],
    "grad_clip": [1.0, None],
    "noise": [(0.02, 10), (0.0, 0)],
    "queries": ["none", "array", "callable"],
    "input": ["np64", "torch32", "list", "offset"],
    "search_batch_size": [8192, 1],
}
CONFIGS = covering_array(OPTIONS)

_rng = np.random.default_rng(0)
KEYS = _rng.standard_normal((12, 4))
Q_TRAIN = _rng.standard_normal((40, 4))
Q_TEST = _rng.standard_normal((15, 4))


def test_the_covering_array_covers_every_pair():
    assert uncovered_pairs(OPTIONS, CONFIGS) == []


def _make(cfg):
    kw = {k: v for k, v in cfg.items() if k not in ("noise", "queries", "input")}
    kw["noise_std"], kw["n_noise"] = cfg["noise"]
    return AmortizedMIPS(depth=2, n_steps=3, batch_size=16, params_fraction=2.0,
                         random_state=0, **kw)


def _data(cfg):
    K = KEYS + (50.0 if cfg["input"] == "offset" else 0.0)
    if cfg["input"] == "torch32":
        K = torch.as_tensor(K, dtype=torch.float32)
    elif cfg["input"] == "list":
        K = K.tolist()
    queries = {"none": None, "array": Q_TRAIN,
               "callable": lambda n, rng: rng.standard_normal((n, 4))}[cfg["queries"]]
    return K, queries


def _outputs(m):
    return (m.predict(Q_TEST), m.predict_key(Q_TEST), m.value(Q_TEST), m.transform(Q_TEST),
            *m.kneighbors(Q_TEST, 5), m.score(Q_TEST))


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"c{i}" for i in range(len(CONFIGS))])
def test_every_pair_of_options_keeps_the_invariants(cfg, tmp_path):
    K, queries = _data(cfg)
    m = _make(cfg).fit(K, queries=queries)
    out = _outputs(m)
    pred, key, val, proj, sims, idx, score = out
    assert pred.shape == (15,) and pred.dtype == np.int64
    for a, shape in ((key, (15, 4)), (val, (15,)), (proj, (15, 4)), (sims, (15, 5))):
        assert a.shape == shape and a.dtype == np.float32 and np.isfinite(a).all()
    assert idx.shape == (15, 5) and idx.dtype == np.int64
    # float64 brute force on the stored float32 keys and queries
    S = Q_TEST.astype(np.float32).astype(np.float64) @ np.asarray(m.database_, np.float64).T
    hits = S[np.arange(15), pred] >= S.max(1) - 1e-9 * np.abs(S).max()
    assert score == hits.mean()
    np.testing.assert_allclose(sims, np.take_along_axis(S, idx, 1), rtol=1e-5,
                               atol=1e-5 * np.abs(S).max())
    if cfg["n_candidates"] in (1, 12):  # 1, or >= n_neighbors: predict is the first column
        np.testing.assert_array_equal(idx[:, 0], pred)
    if cfg["n_candidates"] == 12:  # every key re-ranked: exact search
        assert score == 1.0
    # a clone refitted (also: the same random_state twice), pickle, save/load
    _assert_same(out, _outputs(clone(m).fit(*_data(cfg)[:1], queries=_data(cfg)[1])))
    _assert_same(out, _outputs(pickle.loads(pickle.dumps(m))))
    m.save(tmp_path / "m.pt")
    back = AmortizedMIPS.load(tmp_path / "m.pt")
    _assert_same(out, _outputs(back))
    fitted = {k for k in vars(m) if k.endswith("_") and not k.startswith("_")}
    assert fitted <= set(vars(back))
    # the chunk sizes are memory knobs, not part of the answer
    m.set_params(search_batch_size=3, batch_size=2)
    np.testing.assert_array_equal(m.predict(Q_TEST), pred)


@pytest.mark.parametrize(("arch", "option"), [("keynet", "homogenize"),
                                              ("supportnet", "resnet")])
def test_an_option_documented_as_ignored_changes_nothing(arch, option):
    """homogenize is ignored by KeyNet and resnet by SupportNet: the same weights."""
    kw = dict(arch=arch, depth=2, hidden_dim=8, n_steps=3, random_state=0)
    a = AmortizedMIPS(**kw, **{option: True}).fit(KEYS)
    b = AmortizedMIPS(**kw, **{option: False}).fit(KEYS)
    sb = b.model_.state_dict()
    assert all(torch.equal(t, sb[k]) for k, t in a.model_.state_dict().items())


# -- the tie tolerance of score / match_rate (backlog: it grew with the key norm) ------
def _float64_hit_rate(K, Q, pred):
    """Exact count on the float32-rounded data: float64 products of float32 numbers are
    exact up to the sum's rounding (far below every gap here)."""
    S = np.asarray(Q, np.float32).astype(np.float64) @ np.asarray(K, np.float32).astype(
        np.float64).T
    return float(np.mean(S[np.arange(len(pred)), pred] == S.max(1)))


def test_score_is_the_exact_count_for_keys_with_a_large_common_offset():
    """Wine keys + 1e4: the tolerance ``rtol (|max| + ||q|| (||k_max|| + ||k_pred||))``
    grew with the offset, so a constant prediction (the most frequent answer, exact
    0.117) read 0.139 and a short KeyNet fit 0.075 against an exact 0.072. A common
    offset changes no answer: the match rate must be the float64 brute-force count at
    any offset."""
    K, Qtr, Qte = wine_keys_and_queries()
    S = Qte @ K.T
    top = np.bincount(S.argmax(1)).argmax()
    const = np.full(len(Qte), top)
    exact = _float64_hit_rate(K, Qte, const)
    for off in (0.0, 1e2, 1e4, -3e5):
        Ko = (K + off).astype(np.float32)
        assert _float64_hit_rate(Ko, Qte, const) == exact  # the offset changes no answer
        assert match_rate(None, const, queries=Qte.astype(np.float32), database=Ko) == exact
    m = AmortizedMIPS(depth=3, hidden_dim=64, n_steps=60, batch_size=256,
                      random_state=0).fit(K + 1e4, queries=Qtr)
    assert m.score(Qte) == _float64_hit_rate(m.database_, Qte, m.predict(Qte))


def test_exact_ties_still_count_at_any_offset_and_near_misses_do_not():
    """Keys tied with the argmax in real arithmetic are hits (also when the float64
    products round differently), a key below the maximum by 1e-4 (relative 1e-4 of the
    gap's scale) is a miss, at offsets 0 to 1e6; recall@k and MRR use the same rule."""
    for off in (0.0, 1e4, 1e6):
        keys = off + np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0 - 1e-4], [0.0, 1.0]])
        q = np.array([[1.0, 1.0]])
        assert match_rate(None, [0], queries=q, database=keys) == 1.0
        assert match_rate(None, [1], queries=q, database=keys) == 1.0
        assert match_rate(None, [3], queries=q, database=keys) == 1.0
        assert match_rate(None, [2], queries=q, database=keys) == 0.0
        assert recall_at_k(None, [[2, 3]], 1, queries=q, database=keys) == 0.0
        assert mean_reciprocal_rank(None, [[2, 3]], queries=q, database=keys) == 0.5
    # rounding ties: <q, k1> = <q, k2> in decimal arithmetic (0.1 + 0.2 + 0.6 against
    # 0.2 + 0.4 + 0.3, plus 0.6e4 each); the binary values differ by about 3e-17, far
    # below float64's spacing at 6000.9 (9e-13), so a float64 matmul ties or splits them
    # by one ulp depending on its summation order (numpy 1.26 and 2.x differ): hits both
    keys = np.array([[1.0, 1.0, 2.0], [2.0, 2.0, 1.0]]) + 1e4
    q = np.array([[0.1, 0.2, 0.3]])
    exact = [sum(Fraction(a) * Fraction(b) for a, b in zip(q[0], k)) for k in keys]
    assert exact[0] != exact[1] and abs(exact[0] - exact[1]) < 1e-16   # (the premise)
    assert match_rate(None, [0], queries=q, database=keys) == 1.0
    assert match_rate(None, [1], queries=q, database=keys) == 1.0


def test_exact_search_still_scores_one_at_large_offsets():
    """ExactMIPS searches in float32; its score counts keys within float32 rounding of
    the maximum as ties of that search (documented "1.0 by construction")."""
    rng = np.random.default_rng(1)
    K = rng.standard_normal((300, 6)) + 1e6
    Q = rng.standard_normal((200, 6))
    assert ExactMIPS().fit(K).score(Q) == 1.0


@pytest.mark.parametrize("center_keys", [False, True])
def test_reranking_every_key_is_exact_search_at_a_large_offset(center_keys):
    """n_candidates = n_keys re-ranks every key by its true inner product: exact search,
    as documented. Without center_keys the re-ranking used float32 products, which round
    away the differences between keys + 1e6 (ulp 0.06 - 0.125): predict missed the
    float64 argmax for 10% of the queries (hidden by the former tie tolerance of
    score). The products are now float64 in both coordinate systems."""
    rng = np.random.default_rng(0)
    K = (rng.standard_normal((400, 6)) + 1e6).astype(np.float32)  # the stored keys
    Q = rng.standard_normal((300, 6)).astype(np.float32)
    m = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=3, random_state=0,
                      center_keys=center_keys, n_candidates=400).fit(K)
    S = Q.astype(np.float64) @ K.astype(np.float64).T
    np.testing.assert_array_equal(m.predict(Q), S.argmax(1))  # (no exact ties here)
    assert m.score(Q) == 1.0
    sims, idx = m.kneighbors(Q, n_neighbors=5)
    np.testing.assert_array_equal(idx, np.argsort(-S, axis=1, kind="stable")[:, :5])
    np.testing.assert_allclose(sims, np.take_along_axis(S, idx, 1), rtol=1e-7, atol=0)
