"""``save`` refuses parameters that ``load`` rebuilds the model from, when they were
changed by ``set_params`` after ``fit``: the file would hold another model.

Found by the option-interaction audit: AmortizedMIPS with ``resnet``, ``negative_slope``
or ``beta`` changed after fit saved a file whose loaded copy answered differently from
the live estimator, with no error; ``arch`` or ``model`` changes wrote files that failed
to load with a ``load_state_dict`` "Missing key(s)" error.
"""

import numpy as np
import pytest

from mlpapers._base import _same_param
from mlpapers.datasets import make_federated_linear
from mlpapers.federated import CLoVE, FedAvg
from mlpapers.retrieval import AmortizedMIPS

_rng = np.random.default_rng(0)
KEYS = _rng.standard_normal((12, 4)).astype(np.float32)
QUERIES = _rng.standard_normal((9, 4)).astype(np.float32)


def _amips(**params):
    return AmortizedMIPS(depth=2, hidden_dim=8, n_steps=3, random_state=0, **params).fit(KEYS)


@pytest.mark.parametrize("fitted, changed", [
    ({"arch": "keynet"}, {"resnet": True}),
    ({"arch": "keynet"}, {"negative_slope": 0.5}),
    ({"arch": "keynet"}, {"beta": 3.0}),
    ({"arch": "keynet"}, {"arch": "supportnet"}),
    ({"arch": "supportnet"}, {"homogenize": False}),
    ({"arch": "supportnet"}, {"wx_inject": True}),
])
def test_amips_save_refuses_a_rebuild_parameter_changed_after_fit(tmp_path, fitted, changed):
    m = _amips(**fitted)
    want = m.value(QUERIES)
    before = {k: m.get_params()[k] for k in changed}
    m.set_params(**changed)
    with pytest.raises(ValueError, match=f"{next(iter(changed))}=.*set after fit"):
        m.save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()
    np.testing.assert_array_equal(m.value(QUERIES), want)      # the live model is intact
    m.set_params(**before).save(tmp_path / "m.pt")
    loaded = AmortizedMIPS.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(loaded.value(QUERIES), want)
    loaded.set_params(**changed)                                 # the loaded copy checks too
    with pytest.raises(ValueError, match="set after fit"):
        loaded.save(tmp_path / "again.pt")


@pytest.mark.parametrize("arch, ignored", [("keynet", {"homogenize": False}),
                                           ("supportnet", {"resnet": True})])
def test_amips_saves_options_its_architecture_ignores(tmp_path, arch, ignored):
    m = _amips(arch=arch)
    m.set_params(**ignored).save(tmp_path / "m.pt")
    np.testing.assert_array_equal(AmortizedMIPS.load(tmp_path / "m.pt").value(QUERIES),
                                  m.value(QUERIES))


@pytest.mark.parametrize("cls", [FedAvg, CLoVE])
def test_federated_save_refuses_a_model_changed_after_fit(tmp_path, cls):
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=20, n_features=3, random_state=0)
    params = dict(n_rounds=2, random_state=0)
    if cls is CLoVE:
        params["n_clusters"] = 2
    est = cls(model="linear", **params).fit(clients)
    est.set_params(model="mlp")
    with pytest.raises(ValueError, match="model='linear' -> 'mlp' set after fit"):
        est.save(tmp_path / "m.pt")
    est.set_params(model="linear").save(tmp_path / "m.pt")
    X = clients[0][0]
    np.testing.assert_array_equal(cls.load(tmp_path / "m.pt").predict(X, cluster=0)
                                  if cls is CLoVE else cls.load(tmp_path / "m.pt").predict(X),
                                  est.predict(X, cluster=0) if cls is CLoVE else est.predict(X))


def test_a_refit_records_the_new_parameters(tmp_path):
    m = _amips(arch="keynet").set_params(negative_slope=0.5).fit(KEYS)
    m.save(tmp_path / "m.pt")                                    # fitted with 0.5: no change
    np.testing.assert_array_equal(AmortizedMIPS.load(tmp_path / "m.pt").value(QUERIES),
                                  m.value(QUERIES))


def test_same_param_treats_lists_and_tuples_alike_and_arrays_as_different():
    assert _same_param([64, 32], (64, 32)) and _same_param("mlp", "mlp")
    assert not _same_param([64], (64, 32)) and not _same_param(0.1, 0.2)
    assert not _same_param([64, 32], (64, 16))       # every element compared, not any
    assert not _same_param([64], 64) and not _same_param(64, (64,))  # a list is no scalar
    a = np.ones(3)
    assert _same_param(a, a) and not _same_param(a, np.ones(3))
