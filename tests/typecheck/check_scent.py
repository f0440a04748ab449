"""The SCENT estimators, loss module and kernels, as typed user code."""

from typing import assert_type

import numpy as np
import torch

from mlpapers.optim import (
    EntropicRiskLoss,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
    log_mean_exp,
    objective,
    spmd_update,
)


def check() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y3 = np.arange(40) % 3
    y2 = (X[:, 0] > 0).astype(int)

    clf = SCENTClassifier(n_negatives=2, epochs=1, batch_size=16, random_state=0)
    assert_type(clf.fit(X, y3), SCENTClassifier)
    assert_type(clf.partial_fit(torch.as_tensor(X), y3), SCENTClassifier)
    assert_type(clf.predict(X), np.ndarray)
    assert_type(clf.predict_proba(X), np.ndarray)
    assert_type(clf.predict_log_proba(X), np.ndarray)
    assert_type(clf.decision_function(X), np.ndarray)
    assert_type(clf.objective(X, y3), float)
    assert_type(clf.score(X, y3), float)

    reg = KLDRORegressor(epochs=1, random_state=0)
    assert_type(reg.fit(X, X[:, 0]), KLDRORegressor)
    assert_type(reg.predict(X), np.ndarray)
    assert_type(reg.objective(X, X[:, 0]), float)
    assert_type(reg.score(X, X[:, 0]), float)

    dro = KLDROClassifier(epochs=1, random_state=0)
    assert_type(dro.fit(X, y3), KLDROClassifier)
    assert_type(dro.predict(X), np.ndarray)
    assert_type(dro.predict_proba(X), np.ndarray)
    assert_type(dro.decision_function(X), np.ndarray)
    assert_type(dro.objective(X, y3), float)

    pauc = PartialAUCClassifier(epochs=1, random_state=0)
    assert_type(pauc.fit(X, y2), PartialAUCClassifier)
    assert_type(pauc.decision_function(X), np.ndarray)
    assert_type(pauc.predict_proba(X), np.ndarray)
    assert_type(pauc.predict(X), np.ndarray)
    assert_type(pauc.score(X, y2), float)
    assert_type(pauc.objective(X, y2), float)

    scores = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    index = torch.arange(4)
    loss_fn = EntropicRiskLoss(n_anchors=4)
    assert_type(loss_fn.forward(scores, index), torch.Tensor)
    L = log_mean_exp(scores)
    assert_type(L, torch.Tensor)
    assert_type(spmd_update(loss_fn.nu[index], L, 0.0), torch.Tensor)
    assert_type(objective(scores), torch.Tensor)

    # the constructors' documented non-default values (unions, literals, tensors)
    for method in ("sox", "bsgd", "asgd", "umax", "asgd_softplus"):
        assert_type(SCENTClassifier(method=method), SCENTClassifier)
    xc = SCENTClassifier(n_negatives=2, loss="negatives", negatives="in_batch", method="sox",
                         log_alpha=2.0, lr_schedule="constant", epochs=1, batch_size=16,
                         device=torch.device("cpu"), random_state=np.random.default_rng(0))
    assert_type(xc.fit(X, y3), SCENTClassifier)
    auto = KLDRORegressor(method="asgd", log_alpha="auto", lr_schedule="constant",
                          init="zeros", epochs=1, random_state=np.random.RandomState(0),
                          device=torch.device("cpu"))
    assert_type(auto.fit(X, X[:, 0]), KLDRORegressor)
    assert_type(KLDROClassifier(method="umax", log_alpha=-1.0, init="zeros",
                                lr_schedule="constant", device=torch.device("cpu"),
                                random_state=np.random.default_rng(0)), KLDROClassifier)
    assert_type(KLDROClassifier(log_alpha="auto", random_state=None), KLDROClassifier)
    assert_type(PartialAUCClassifier(method="asgd_softplus", log_alpha=-4.0,
                                     lr_schedule="constant", device=torch.device("cpu"),
                                     random_state=np.random.default_rng(0)),
                PartialAUCClassifier)
    assert_type(EntropicRiskLoss(4, method="bsgd", log_alpha=torch.zeros(4), nu_init=0.0),
                EntropicRiskLoss)
    assert_type(EntropicRiskLoss(4, method="umax", log_alpha=-1.0, nu_init=None),
                EntropicRiskLoss)
