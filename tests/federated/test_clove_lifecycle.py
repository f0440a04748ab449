"""Regression tests from the ecosystem / lifecycle audit of CLoVE, IFCA and FedAvg."""

import warnings

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import CLoVE, FedAvg


@pytest.fixture(scope="module")
def clients():
    return make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=30,
                                 n_features=4, random_state=0)[0]


@pytest.mark.parametrize("cls", [CLoVE, FedAvg])
def test_dataframe_clients_record_feature_names(clients, cls, tmp_path):
    # DataFrame clients set n_features_in_ but not feature_names_in_, and a frame with
    # other columns was silently accepted at predict time
    pd = pytest.importorskip("pandas")
    cols = ["a", "b", "c", "d"]
    frames = [(pd.DataFrame(X, columns=cols), pd.Series(y)) for X, y in clients]
    kw = dict(n_rounds=2, random_state=0) | ({"n_clusters": 2} if cls is CLoVE else {})
    est = cls(**kw).fit(frames)
    np.testing.assert_array_equal(est.feature_names_in_, cols)
    ref = cls(**kw).fit(clients)
    assert not hasattr(ref, "feature_names_in_")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same frames: no warning
        np.testing.assert_allclose(est.predict(frames[0][0], client=0),
                                   ref.predict(clients[0][0], client=0), rtol=1e-6)
        est.assign(*frames[1])
        assert est.score(frames) == pytest.approx(ref.score(clients))
    with pytest.raises(ValueError, match="feature names"):
        est.predict(frames[0][0].rename(columns={"a": "z"}), client=0)
    with pytest.warns(UserWarning, match="feature names"):
        est.predict(clients[0][0], client=0)
    est.save(tmp_path / "m.pt")
    np.testing.assert_array_equal(type(est).load(tmp_path / "m.pt").feature_names_in_, cols)
    est.fit(clients)  # a refit on arrays forgets the names
    assert not hasattr(est, "feature_names_in_")
    bad = [frames[0], (frames[1][0].rename(columns={"a": "q"}), frames[1][1])] + frames[2:]
    with pytest.raises(ValueError, match=r"clients\[1\] has feature names"):
        cls(**kw).fit(bad)


def test_sparse_clients_raise_a_type_error_saying_to_densify(clients):
    sp = pytest.importorskip("scipy.sparse")
    with pytest.raises(TypeError, match=r"clients\[0\].*sparse.*toarray"):
        CLoVE(n_clusters=2).fit([(sp.csr_matrix(X), y) for X, y in clients])


def test_arrays_next_to_dataframes_warn_at_fit_and_score_as_before(clients):
    pd = pytest.importorskip("pandas")
    mixed = [(pd.DataFrame(clients[0][0], columns=list("abcd")), clients[0][1])]
    mixed += list(clients[1:])
    # scored by a model fitted on arrays: per-client check only (sklearn's warning)
    est = FedAvg(n_rounds=2, random_state=0).fit(clients)
    with pytest.warns(UserWarning, match=r"^clients\[0\] has feature names, but FedAvg "
                      "was fitted without feature names"):
        assert est.score(mixed) == pytest.approx(est.score(clients))
    named = FedAvg(n_rounds=2, random_state=0).fit(
        [(pd.DataFrame(X, columns=list("abcd")), y) for X, y in clients])
    with pytest.warns(UserWarning, match=r"^clients\[[123]\] does not have valid feature names"):
        named.score(mixed)
    swapped = [(pd.DataFrame(X, columns=list("abdc")), y) for X, y in clients]
    with pytest.raises(ValueError, match=r"feature names of clients\[0\] should match"):
        named.score(swapped)
    # fitted on the mix: names cannot be checked for the arrays, so none are recorded
    with pytest.warns(UserWarning, match="3 of 4 clients have no feature names") as rec:
        mixed_fit = FedAvg(n_rounds=2, random_state=0).fit(mixed)
    assert any(w.filename == __file__ for w in rec)  # points at this call
    assert not hasattr(mixed_fit, "feature_names_in_")
    np.testing.assert_allclose(mixed_fit.predict(clients[0][0], client=0),
                               est.predict(clients[0][0], client=0))
    # named clients that disagree are misaligned features: an error naming the client
    renamed = [(pd.DataFrame(X, columns=list(c)), y)
               for (X, y), c in zip(clients, ["abcd", "abcd", "abdc", "abcd"])]
    with pytest.raises(ValueError, match=r"clients\[2\] has feature names"):
        FedAvg(n_rounds=2, random_state=0).fit(renamed)


def test_builtin_models_under_float64_default_dtype():
    # torch.set_default_dtype(torch.float64) in user code built float64 models against the
    # float32 client data: a crash in the first loss matrix
    clients = make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=30,
                                    random_state=0)[0]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        est = CLoVE(n_clusters=2, n_rounds=2, random_state=0).fit(clients)
        assert est.models_[0].weight.dtype == torch.float32
        assert est.predict(clients[0][0], client=0).shape == (30,)
        # a user's callable model, built in float64 by that default, is cast like the data
        user = CLoVE(model=lambda d, k: torch.nn.Linear(d, k), n_clusters=2, n_rounds=2,
                     random_state=0).fit(clients)
        assert user.models_[0].weight.dtype == torch.float32
        mlp64 = CLoVE(model="mlp", n_clusters=2, n_rounds=2, random_state=0).fit(clients)
    finally:
        torch.set_default_dtype(old)
    # the built-in weights are drawn in float32: the same model under either default
    mlp32 = CLoVE(model="mlp", n_clusters=2, n_rounds=2, random_state=0).fit(clients)
    for a, b in zip(mlp32.models_, mlp64.models_):
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pa, pb, rtol=0, atol=0)
