"""``AmortizedMIPS(center_keys=True)``: training on the centred keys ``K - m``.

The identity behind it: argmax_i <x, k_i - m> = argmax_i <x, k_i>, and
sigma_{K-m}(x) = sigma_K(x) - <x, m> (linear in x, so convexity and 1-homogeneity
survive). References: float64 brute force (numpy) on the original keys, the fit without
the offset, and the fit with the parameter omitted.
"""

import pickle

import numpy as np
import pytest
import torch

from mlpapers._utils._serialize import decode, encode
from mlpapers.retrieval import AmortizedMIPS

from ._wine import wine_keys_and_queries


def _brute(K, Q):
    return np.asarray(Q, dtype=np.float64) @ np.asarray(K, dtype=np.float64).T


@pytest.fixture(scope="module")
def wine():
    return wine_keys_and_queries()


def _small(**kw):
    kw = {"depth": 3, "hidden_dim": 64, "n_steps": 60, "batch_size": 256,
          "random_state": 0, **kw}
    return AmortizedMIPS(**kw)


def _offset_keys(seed=0, n=200, d=8, offset=50.0):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((n, d)) + offset
    return K, rng.standard_normal((64, d))


def test_centred_answers_are_exact_in_the_original_space():
    """Re-ranking every key (n_candidates = n_keys) returns the brute-force top-k of the
    ORIGINAL keys, the similarities are the original inner products <x, k_j> (float32
    rounding of products ~1e3), and KeyNet's value is the Euler score of the returned
    key, <x, predict_key(x)> = sigma_{K-m}-estimate + <x, m>."""
    K, Q = _offset_keys()
    m = _small(n_steps=5, center_keys=True).fit(K)
    S = _brute(K, Q)
    tol = 1e-6 * np.abs(S).max()
    sims, idx = m.kneighbors(Q, n_neighbors=7)
    np.testing.assert_allclose(sims, np.take_along_axis(S, idx, axis=1), rtol=0, atol=tol)
    m.set_params(n_candidates=len(K))
    sims, idx = m.kneighbors(Q, n_neighbors=7)
    ref = -np.sort(-S, axis=1)[:, :7]
    np.testing.assert_allclose(sims, ref, rtol=0, atol=tol)
    np.testing.assert_allclose(np.take_along_axis(S, idx, axis=1), ref, rtol=0, atol=tol)
    assert m.score(Q) == 1.0
    np.testing.assert_allclose(m.value(Q), np.einsum("nd,nd->n", Q, m.predict_key(Q)),
                               rtol=1e-5, atol=1e-5 * np.abs(S).max())


def test_key_mean_and_the_coordinates_of_each_output():
    """key_mean_ is the float32 column mean; predict_key is transform (centred
    coordinates) plus key_mean_; value is the centred model's value plus <x, m>."""
    K, Q = _offset_keys(1)
    m = _small(n_steps=5, center_keys=True).fit(K)
    assert m.key_mean_.dtype == np.float32 and m.key_mean_.shape == (K.shape[1],)
    np.testing.assert_allclose(m.key_mean_, K.mean(0), rtol=1e-6)
    np.testing.assert_allclose(m.predict_key(Q), m.transform(Q) + m.key_mean_, rtol=1e-6)
    with torch.no_grad():
        v = m.model_.score_and_key(torch.as_tensor(Q, dtype=torch.float32)
                                   / m.query_scale_)[0].numpy()
    v = v * m.key_scale_ * m.query_scale_ + Q @ m.key_mean_.astype(np.float64)
    np.testing.assert_allclose(m.value(Q), v, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("retrieval", ["ip", "l2"])
def test_ranking_is_in_centred_coordinates(retrieval):
    """The predicted key (transform: centred) is compared with the centred keys: "ip"
    by <k_hat_c, k_j - m> (the same order as <k_hat_c, k_j>), "l2" by
    ||k_hat_c - (k_j - m)|| = ||predict_key - k_j||; float64 references, tie-aware."""
    K, Q = _offset_keys(2)
    m = _small(n_steps=5, center_keys=True, retrieval=retrieval).fit(K)
    kc = m.transform(Q).astype(np.float64)
    Kc = K.astype(np.float32).astype(np.float64) - m.key_mean_
    if retrieval == "ip":
        score = kc @ Kc.T
    else:
        score = -((kc[:, None, :] - Kc[None]) ** 2).sum(-1)
        alt = m.predict_key(Q).astype(np.float64)
        np.testing.assert_array_equal(
            score.argmax(1), (-((alt[:, None, :] - K[None]) ** 2).sum(-1)).argmax(1))
    pred = m.predict(Q)
    got = score[np.arange(len(Q)), pred]
    np.testing.assert_allclose(got, score.max(1), rtol=1e-5, atol=1e-5 * np.abs(score).max())


@pytest.mark.parametrize("retrieval", ["ip", "l2"])
def test_centring_recovers_keys_with_a_large_common_offset(wine, retrieval):
    """Wine keys + 1e4 (short KeyNet fit): trained on them as given the model answers
    every query alike (measured ip 0.072, l2 0.017; the most frequent answer 0.117);
    center_keys=True gives 0.80 / 0.51, as the keys without offset (0.80 / 0.51); exact
    float64 match rates (the former tie tolerance read 0.075, 0.028, 0.84 and 0.54)."""
    K, Qtr, Qte = wine
    raw = _small(retrieval=retrieval).fit(K + 1e4, queries=Qtr).score(Qte)
    cen = _small(retrieval=retrieval, center_keys=True).fit(K + 1e4, queries=Qtr).score(Qte)
    ref = _small(retrieval=retrieval).fit(K, queries=Qtr).score(Qte)
    assert cen >= raw + 0.4, (raw, cen)
    assert cen >= ref - 0.05, (cen, ref)


def test_false_is_the_default_and_trains_on_the_keys_as_given():
    """center_keys=False is the fit with the parameter omitted, bit for bit, with
    key_mean_ None; True trains another model on the same keys."""
    K, Q = _offset_keys(3, offset=3.0)
    a = _small(n_steps=10).fit(K)
    b = _small(n_steps=10, center_keys=False).fit(K)
    c = _small(n_steps=10, center_keys=True).fit(K)
    assert a.key_mean_ is None and b.key_mean_ is None
    for name, t in a.model_.state_dict().items():
        assert torch.equal(t, b.model_.state_dict()[name]), name
    for f in ("predict_key", "value", "transform", "predict"):
        np.testing.assert_array_equal(getattr(a, f)(Q), getattr(b, f)(Q))
    np.testing.assert_array_equal(a.kneighbors(Q, 5)[0], b.kneighbors(Q, 5)[0])
    assert not np.array_equal(a.predict_key(Q), c.predict_key(Q))


def test_refit_answers_as_a_fresh_fit():
    """A centred refit on other keys, then one with center_keys=False, answer as fresh
    fits (no stale key_mean_ or cached centred keys)."""
    K, Q = _offset_keys(4)
    K2 = _offset_keys(11, offset=-20.0)[0]
    m = _small(n_steps=5, center_keys=True).fit(K)
    m.predict(Q)
    for center in (True, False):
        m.set_params(center_keys=center).fit(K2)
        fresh = _small(n_steps=5, center_keys=center).fit(K2)
        assert (m.key_mean_ is None) == (not center)
        np.testing.assert_array_equal(m.predict_key(Q), fresh.predict_key(Q))
        np.testing.assert_array_equal(m.kneighbors(Q, 3)[1], fresh.kneighbors(Q, 3)[1])


def test_supportnet_centred_value_is_positively_homogeneous():
    """sigma_{K-m}(x) + <x, m> is 1-homogeneous: the homogenized SupportNet's value
    with centring keeps value(c x) = c value(x) for c > 0."""
    K, Q = _offset_keys(5)
    m = _small(arch="supportnet", n_steps=5, center_keys=True).fit(K)
    v = m.value(Q)
    for c in (0.5, 3.0):
        np.testing.assert_allclose(m.value(c * Q), c * v, rtol=1e-4,
                                   atol=1e-4 * np.abs(v).max())


def test_save_load_and_pickle_round_trip_key_mean(tmp_path):
    K, Q = _offset_keys(6)
    m = _small(n_steps=5, center_keys=True, retrieval="l2").fit(K)
    m.save(tmp_path / "m.pt")
    for back in (AmortizedMIPS.load(tmp_path / "m.pt"), pickle.loads(pickle.dumps(m))):
        assert back.center_keys is True
        np.testing.assert_array_equal(back.key_mean_, m.key_mean_)
        assert back.key_mean_.dtype == np.float32
        for f in ("predict", "predict_key", "value", "transform"):
            np.testing.assert_array_equal(getattr(back, f)(Q), getattr(m, f)(Q))


def test_files_and_pickles_from_before_the_parameter_load_uncentred(tmp_path):
    """A file (or pickle) written before center_keys existed holds neither the
    parameter nor key_mean_: it loads with center_keys=False, key_mean_ None, and
    answers as saved. A key_mean_ of the wrong shape is refused."""
    K, Q = _offset_keys(7)
    m = _small(n_steps=5).fit(K)
    m.save(tmp_path / "new.pt")
    payload = torch.load(tmp_path / "new.pt", weights_only=True)
    params, state = decode(payload["params"]), decode(payload["state"])
    del params["center_keys"], state["key_mean_"]
    payload["params"], payload["state"] = encode(params, "p"), encode(state, "s")
    torch.save(payload, tmp_path / "old.pt")
    old = AmortizedMIPS.load(tmp_path / "old.pt")
    assert old.center_keys is False and old.key_mean_ is None
    np.testing.assert_array_equal(old.predict(Q), m.predict(Q))

    pick = m.__getstate__()
    del pick["center_keys"], pick["key_mean_"]
    old = AmortizedMIPS.__new__(AmortizedMIPS)
    old.__setstate__(pick)
    assert old.get_params()["center_keys"] is False and old.key_mean_ is None
    unfitted = AmortizedMIPS.__new__(AmortizedMIPS)
    unfitted.__setstate__({k: v for k, v in _small().__getstate__().items()
                           if k != "center_keys"})
    assert "key_mean_" not in vars(unfitted)  # an unfitted pickle stays unfitted
    np.testing.assert_array_equal(old.value(Q), m.value(Q))

    state["key_mean_"] = np.zeros(K.shape[1] + 1, dtype=np.float32)
    payload["state"] = encode(state, "s")
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="key_mean_"):
        AmortizedMIPS.load(tmp_path / "bad.pt")


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 1.0])
def test_center_keys_must_be_a_bool(bad):
    K, Q = _offset_keys(8, n=20)
    with pytest.raises(TypeError, match="center_keys"):
        _small(n_steps=10**9, center_keys=bad).fit(K)  # raised before any training
    m = _small(n_steps=2).fit(K)
    m.set_params(center_keys=bad)
    with pytest.raises(TypeError, match="center_keys"):
        m.predict(Q)


def test_numpy_bool_is_accepted():
    K, Q = _offset_keys(9, n=20)
    m = _small(n_steps=2, center_keys=np.True_).fit(K)
    assert m.key_mean_ is not None


def test_faiss_index_holds_the_centred_keys():
    """to_faiss_ivf indexes database_ - key_mean_, searched with transform (centred):
    visiting every list, its top-1 is the amortized top-1 of kneighbors."""
    pytest.importorskip("faiss")
    K, Q = _offset_keys(10)
    for retrieval in ("ip", "l2"):
        m = _small(n_steps=5, center_keys=True, retrieval=retrieval).fit(K)
        index = m.to_faiss_ivf(n_lists=4)
        index.nprobe = 4
        found = index.search(np.ascontiguousarray(m.transform(Q)), 1)[1][:, 0]
        Kc = K.astype(np.float32) - m.key_mean_
        kc = m.transform(Q).astype(np.float64)
        score = kc @ Kc.T if retrieval == "ip" else -((kc[:, None] - Kc[None]) ** 2).sum(-1)
        np.testing.assert_allclose(score[np.arange(len(Q)), found], score.max(1),
                                   rtol=1e-5, atol=1e-5 * np.abs(score).max())


def test_refit_drops_the_previous_centred_copy():
    """A refit (centred or not) kept the previous database and its centred copy alive
    (twice its size, on the device) in a private cache."""
    K, _ = _offset_keys(3)
    m = _small(n_steps=2, center_keys=True).fit(K)
    old_keys = m._search_keys()[0]
    K2, _ = _offset_keys(4, n=150)
    m.set_params(center_keys=False).fit(K2)
    assert all(old_keys is not t for t in (vars(m).get("_centred_cache") or ()))
    m.set_params(center_keys=True).fit(K2)
    centred = vars(m)["_centred_cache"][2]
    np.testing.assert_allclose(centred.numpy(), K2.astype(np.float32) - m.key_mean_,
                               rtol=0, atol=1e-5)


def test_reranking_keeps_the_differences_a_large_offset_rounds_away():
    """Keys N(0, 1) + 1e6: float32 products <x, k_j> (~1e6) round the differences
    between keys (ulp 0.06-0.125), so re-ranking the candidates by them picked the
    float64-best of its own candidates in only 92% of queries, and kneighbors'
    similarities were off by up to 0.76. float64 products keep them: the returned key is
    the float64-best of the candidates (exact products of the stored float32 keys), the
    similarities are within float32 rounding of the truth, in descending order."""
    rng = np.random.default_rng(0)
    K = (rng.standard_normal((400, 6)) + 1e6).astype(np.float32)  # the stored keys
    Q = rng.standard_normal((300, 6)).astype(np.float32)
    m = _small(n_steps=5, center_keys=True, n_candidates=20).fit(K)
    S = _brute(K, Q)
    cand = m.set_params(n_candidates=1).kneighbors(Q, n_neighbors=20, return_distance=False)
    m.set_params(n_candidates=20)
    best = cand[np.arange(len(Q)), np.take_along_axis(S, cand, axis=1).argmax(1)]
    np.testing.assert_array_equal(m.predict(Q), best)
    sims, idx = m.kneighbors(Q, n_neighbors=5)
    assert sims.dtype == np.float32
    truth = np.take_along_axis(S, idx, axis=1)
    np.testing.assert_allclose(sims, truth, rtol=1e-7, atol=0)
    np.testing.assert_array_equal(idx, np.take_along_axis(
        cand, np.argsort(-np.take_along_axis(S, cand, axis=1), axis=1, kind="stable")[:, :5],
        axis=1))


def _exact_products(K, Q):
    """float64 products of the float32 keys and queries the estimator stores and
    searches: exact up to the rounding of the sum (far below every gap here)."""
    return _brute(np.asarray(K, np.float32), np.asarray(Q, np.float32))


def test_reranking_uses_the_original_keys_not_their_rounded_centred_copy():
    """Keys 0.001001 and 0.001 beside a key of 200: the mean is ~50, and the centred
    float32 copy rounds both small keys to -49.9995 (their difference, 1e-6, is below the
    ulp 4e-6 there), so <x, k_j - m> + <x, m> tied them and re-ranking all 4 keys (exact
    search, as documented) returned key 1: predict [1], score 0.0, kneighbors
    -9.9945e-4 twice. The products of the original float32 keys tell them apart."""
    K = np.float32([[200, 0], [0.001001, 0], [0.001, 0], [0, -5]])
    Q = np.float32([[-1, 0.01]])
    S = _exact_products(K, Q)
    for center_keys in (False, True):
        m = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=3, random_state=0,
                          center_keys=center_keys, n_candidates=4).fit(K)
        np.testing.assert_array_equal(m.predict(Q), [2])
        assert m.score(Q) == 1.0
        sims, idx = m.kneighbors(Q, n_neighbors=4)
        np.testing.assert_array_equal(idx, [[2, 1, 3, 0]])
        # the float32 rounding of the true products, exactly
        np.testing.assert_array_equal(sims, np.take_along_axis(S, idx, 1).astype(np.float32))
        # without re-ranking too: the similarities returned are the true products
        sims, idx = m.set_params(n_candidates=1).kneighbors(Q, n_neighbors=4)
        np.testing.assert_array_equal(sims, np.take_along_axis(S, idx, 1).astype(np.float32))


def test_reranking_every_key_is_exact_for_near_duplicates_beside_outliers():
    """500 near-duplicate keys (spread 1e-4 around one vector) and 5 outliers of norm
    ~1e4: centring on a mean pulled far away by the outliers rounded the near-duplicates'
    differences away, and re-ranking every key returned the float64 argmax for only 99%
    of the queries whose answer is a near-duplicate (score 0.99). Now exact in both
    coordinate systems."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((1, 8))
    K = np.vstack([base + 1e-4 * rng.standard_normal((500, 8)),
                   1e3 * rng.standard_normal((5, 8)) + 3e3]).astype(np.float32)
    Q = rng.standard_normal((1000, 8)).astype(np.float32)
    Q = Q[_exact_products(K, Q).argmax(1) < 500][:300]
    S = _exact_products(K, Q)
    for center_keys in (False, True):
        m = AmortizedMIPS(depth=1, hidden_dim=8, n_steps=1, random_state=0,
                          center_keys=center_keys, n_candidates=len(K)).fit(K)
        np.testing.assert_array_equal(m.predict(Q), S.argmax(1))  # (no exact ties here)
        assert m.score(Q) == 1.0


@pytest.mark.parametrize("arch, switch", [("supportnet", "homogenize"), ("keynet", "resnet")])
def test_files_and_pickles_with_an_int_switch_load_with_the_bool(tmp_path, arch, switch):
    """Switches were not checked before: a model saved or pickled with 1 (or 0) for
    ``homogenize``/``resnet`` loads with the bool it meant and answers as saved,
    instead of failing on every query now that the switches are checked."""
    K, Q = _offset_keys(7)
    m = _small(n_steps=5, arch=arch).fit(K)
    m.save(tmp_path / "new.pt")
    payload = torch.load(tmp_path / "new.pt", weights_only=True)
    params = decode(payload["params"])
    params[switch] = int(params[switch])
    payload["params"] = encode(params, "p")
    torch.save(payload, tmp_path / "old.pt")
    old = AmortizedMIPS.load(tmp_path / "old.pt")
    assert getattr(old, switch) is getattr(m, switch)
    np.testing.assert_array_equal(old.predict(Q), m.predict(Q))

    pick = m.__getstate__()
    pick[switch] = int(pick[switch])
    old = pickle.loads(pickle.dumps(m))
    old.__setstate__(pick)
    assert getattr(old, switch) is getattr(m, switch)
    np.testing.assert_array_equal(old.predict(Q), m.predict(Q))
