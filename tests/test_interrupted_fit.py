"""A fit interrupted part-way (Ctrl-C, a user's callable raising, bad input) never leaves
a model that mixes two fits: the estimators are left exactly as they were, RAD and
PatchCore unfitted (docs/user_guide/conventions.rst, "Objects you hand us").

The interruption is a ``KeyboardInterrupt`` raised by the shared progress loop at its
second step, which every iterative fit goes through.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError

import mlpapers._utils._progress as progress
from mlpapers.anomaly import PatchCoreDetector, RADDetector
from mlpapers.datasets import make_federated_linear
from mlpapers.decentralized import DecentralizedSGD
from mlpapers.federated import CLoVE, FedAvg
from mlpapers.optim import KLDROClassifier, PartialAUCClassifier, SCENTClassifier
from mlpapers.retrieval import AmortizedMIPS
from mlpapers.ssl import CLAPPEncoder

RNG = np.random.default_rng(0)
X = RNG.normal(size=(120, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 120)
YB = (X[:, 0] > 0).astype(int)
CLIENTS_A = make_federated_linear(n_clusters=2, n_clients_per_cluster=3, n_samples=40,
                                  n_features=4, random_state=0)[0]
CLIENTS_B = make_federated_linear(n_clusters=2, n_clients_per_cluster=3, n_samples=40,
                                  n_features=4, random_state=1)[0]
IMAGES = torch.rand(8, 3, 24, 24, generator=torch.Generator().manual_seed(0))


def _fitted_state(est) -> dict:
    return {k: pickle.dumps(v) for k, v in vars(est).items()
            if k.endswith("_") and not k.startswith("_")}


@pytest.fixture
def interrupt_second_step(monkeypatch):
    original = progress.ProgressLogger.__iter__

    def iterate(self):
        for i, item in enumerate(original(self)):
            if i == 1:
                raise KeyboardInterrupt
            yield item

    def arm():
        monkeypatch.setattr(progress.ProgressLogger, "__iter__", iterate)
    return arm


@pytest.mark.parametrize("make, first, second", [
    (lambda: AmortizedMIPS(n_steps=4, random_state=0), (X,), (2 * X + 1,)),
    (lambda: DecentralizedSGD(n_nodes=4, n_rounds=4, random_state=0), (X, Y), (2 * X, Y)),
    (lambda: CLoVE(n_clusters=2, n_rounds=3, random_state=0), (CLIENTS_A,), (CLIENTS_B,)),
    (lambda: FedAvg(n_rounds=3, random_state=0), (CLIENTS_A,), (CLIENTS_B,)),
    (lambda: SCENTClassifier(n_negatives=2, epochs=3, random_state=0), (X, Y), (2 * X, Y)),
    (lambda: KLDROClassifier(epochs=3, random_state=0), (X, YB), (2 * X, YB)),
    (lambda: PartialAUCClassifier(epochs=3, random_state=0), (X, YB), (2 * X, YB)),
    (lambda: CLAPPEncoder(architecture="tiny", n_epochs=2, batch_size=4, random_state=0),
     (IMAGES,), (IMAGES * 0.5,)),
], ids=["amips", "dsgd", "clove", "fedavg", "scent", "kldro", "pauc", "clapp"])
def test_an_interrupted_refit_leaves_the_previous_fit(make, first, second,
                                                      interrupt_second_step):
    est = make().fit(*first)
    before = _fitted_state(est)
    interrupt_second_step()
    with pytest.raises(KeyboardInterrupt):
        est.fit(*second)
    assert _fitted_state(est) == before


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_an_interrupted_detector_refit_leaves_it_unfitted(cls, interrupt_second_step):
    kw = {"k_images": 2} if cls is RADDetector else {"random_state": 0}
    det = cls(extractor="random", image_size=None, batch_size=4, **kw).fit(IMAGES)
    interrupt_second_step()
    with pytest.raises(KeyboardInterrupt):
        det.fit(IMAGES * 0.5)
    with pytest.raises(NotFittedError):
        det.decision_function(IMAGES)


@pytest.mark.parametrize("make, y", [
    (lambda: SCENTClassifier(n_negatives=2, epochs=2, random_state=0), Y),
    (lambda: KLDROClassifier(epochs=2, random_state=0), YB),
    (lambda: PartialAUCClassifier(epochs=2, random_state=0), YB),
], ids=["scent", "kldro", "pauc"])
def test_a_refit_on_bad_input_keeps_the_previous_fit(make, y):
    # a refit on one class only recorded the new classes_ (and n_features_in_) before
    # raising: the previous model then mapped its scores to the wrong labels
    est = make().fit(X, y)
    before, proba = _fitted_state(est), est.predict_proba(X)
    with pytest.raises(ValueError, match="2 classes|two classes|class"):
        est.fit(X[:, :5], np.full(len(X), 7))
    assert _fitted_state(est) == before
    np.testing.assert_array_equal(est.predict_proba(X), proba)


def test_a_failing_first_partial_fit_leaves_scent_unfitted():
    # a first call with one class set classes_ and raised: predict then raised
    # AttributeError and every later call was refused ("classes differ")
    est = SCENTClassifier(n_negatives=1, random_state=0)
    with pytest.raises(ValueError, match="at least 2 classes"):
        est.partial_fit(X, np.zeros(len(X), int), classes=[0])
    with pytest.raises(NotFittedError):
        est.predict(X)
    est.partial_fit(X, YB, classes=[0, 1])  # starts again
    assert list(est.classes_) == [0, 1] and est.predict(X).shape == (len(X),)
