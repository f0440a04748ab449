"""Warnings point at the user's line and come once per call, not once per client/round."""

import warnings

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import FedAvg


def _record(call):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        call()
    return rec


def _frames(clients, pd):
    return [(pd.DataFrame(X, columns=[f"c{j}" for j in range(X.shape[1])]), y)
            for X, y in clients]


def test_federated_score_gives_one_feature_names_warning_per_call():
    pd = pytest.importorskip("pandas")
    clients = make_federated_linear(n_clusters=2, n_clients_per_cluster=5, n_samples=20,
                                    random_state=0)[0]
    est = FedAvg(n_rounds=2, local_epochs=2, random_state=0).fit(_frames(clients, pd))
    rec = _record(lambda: est.score(clients))  # 10 array clients: one summary
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert msg.startswith("clients[0] does not have valid feature names, nor do 9 other "
                          "clients (10 of 10 clients")
    assert msg.endswith("but FedAvg was fitted with feature names")
    assert rec[0].filename == __file__
    # a single array among DataFrames: the per-client message, naming it
    mixed = _frames(clients, pd)
    mixed[3] = clients[3]
    rec = _record(lambda: est.score(mixed))
    assert [str(w.message) for w in rec] == [
        "clients[3] does not have valid feature names, but FedAvg was fitted with "
        "feature names"]
    # the reverse: DataFrames scored by a model fitted on arrays
    plain = FedAvg(n_rounds=2, local_epochs=2, random_state=0).fit(clients)
    rec = _record(lambda: plain.score(_frames(clients, pd)))
    assert len(rec) == 1 and rec[0].filename == __file__
    assert str(rec[0].message).startswith("clients[0] has feature names, as do 9 other")
    # other names still raise, naming the client
    renamed = _frames(clients, pd)
    renamed[4] = (renamed[4][0].rename(columns={"c0": "z"}), renamed[4][1])
    with pytest.raises(ValueError, match=r"feature names of clients\[4\] should match"):
        est.score(renamed)


def test_feature_names_warnings_point_at_the_callers_line():
    pd = pytest.importorskip("pandas")
    from sklearn.datasets import load_iris

    from mlpapers.decentralized.btsp import DecentralizedSGD
    from mlpapers.optim.scent import KLDROClassifier
    from mlpapers.retrieval.amips import AmortizedMIPS

    X, y = load_iris(return_X_y=True)
    df = pd.DataFrame(X, columns=list("abcd"))
    dsgd = DecentralizedSGD(n_nodes=4, n_rounds=3, random_state=0).fit(df, y)
    dro = KLDROClassifier(epochs=1, random_state=0).fit(df, (y > 0).astype(int))
    mips = AmortizedMIPS(n_steps=3, depth=1, hidden_dim=8, random_state=0).fit(df)
    clients = make_federated_linear(n_clusters=1, n_clients_per_cluster=2, n_samples=20,
                                    random_state=0)[0]
    fed = FedAvg(n_rounds=1, local_epochs=1, random_state=0).fit(_frames(clients, pd))
    Xc = clients[0][0]
    calls = [lambda: dsgd.predict(X), lambda: dsgd.predict(torch.as_tensor(X)),
             lambda: dro.predict(X), lambda: mips.predict(X), lambda: mips.score(X),
             lambda: fed.predict(Xc), lambda: fed.predict(torch.as_tensor(Xc)),
             lambda: fed.assign(*clients[0])]
    for call in calls:
        rec = _record(call)
        names = [w for w in rec if "feature names" in str(w.message)]
        assert len(names) == 1, [str(w.message) for w in rec]
        assert names[0].filename == __file__, names[0].filename
        assert str(names[0].message).startswith("X does not have valid feature names")
    # and the reverse (a DataFrame for a model fitted on an array), sklearn's message
    plain = DecentralizedSGD(n_nodes=4, n_rounds=3, random_state=0).fit(X, y)
    rec = _record(lambda: plain.predict(df))
    assert [w.filename for w in rec] == [__file__]
    assert str(rec[0].message) == ("X has feature names, but DecentralizedSGD was fitted "
                                   "without feature names")
    # other columns still raise scikit-learn's error
    with pytest.raises(ValueError, match="Feature names unseen at fit time"):
        dsgd.predict(df.rename(columns={"a": "z"}))


def test_fedavg_float32_overflow_warns_once_per_fit():
    clients = make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=50,
                                    random_state=0)[0]
    big = [(X, y * 1e20) for X, y in clients]
    rec = _record(lambda: FedAvg(n_rounds=20, local_epochs=1, random_state=0).fit(big))
    overflow = [w for w in rec if "overflow float32" in str(w.message)]
    assert len(overflow) == 1
    assert overflow[0].category is RuntimeWarning and overflow[0].filename == __file__


@pytest.mark.parametrize("verbose", [-1, "yes", 1.5])
def test_detectors_check_verbose_when_scoring(verbose, capsys):
    from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector
    from mlpapers.datasets import make_texture_anomalies

    X_train, X_test = make_texture_anomalies(n_train=6, n_test=2, image_size=32,
                                             random_state=0)[:2]
    for det in (RADDetector(extractor="random", k_images=2, image_size=None),
                PatchCoreDetector(extractor="random", image_size=None, random_state=0)):
        det.fit(X_train)
        capsys.readouterr()
        det.set_params(verbose=verbose)  # refused by fit, and now by scoring too
        with pytest.raises((ValueError, TypeError), match="verbose"):
            det.decision_function(X_test)
        with pytest.raises((ValueError, TypeError), match="verbose"):
            det.predict(X_test)
        assert capsys.readouterr().err == ""  # no progress bar before the error


def test_progress_logger_hides_the_bar_for_a_verbosity_of_zero_or_less(capsys):
    from mlpapers._utils import ProgressLogger

    for verbose in (0, -1, False, np.int64(-2), 0.0):
        assert list(ProgressLogger(3, verbose=verbose, desc="quiet")) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    list(ProgressLogger(3, verbose=1, desc="shown"))
    assert "shown" in capsys.readouterr().err
