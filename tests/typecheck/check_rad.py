"""The RAD and PatchCore detectors and the feature extractors, as typed user code."""

from typing import assert_type

import numpy as np
import torch

from mlpapers.anomaly.rad import (
    PatchCoreDetector,
    RADDetector,
    RandomConvExtractor,
    TorchFeatureExtractor,
    check_images,
)


def check() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((4, 32, 32, 3)).astype(np.float32)
    y = np.array([0, 0, 1, 1])

    rad = RADDetector(extractor="random", k_images=2, image_size=32, random_state=0)
    assert_type(rad.fit(X), RADDetector)
    assert_type(rad.decision_function(X), np.ndarray)
    assert_type(rad.score_samples(X), np.ndarray)
    assert_type(rad.predict(X), np.ndarray)
    assert_type(rad.predict_proba(X, method="unify"), np.ndarray)
    assert_type(rad.fit_predict(X), np.ndarray)
    assert_type(rad.score(X, y), float)
    assert_type(rad.anomaly_map(X), np.ndarray | list[np.ndarray])
    assert_type(rad.anomaly_map(X, return_scores=True),
                tuple[np.ndarray | list[np.ndarray], np.ndarray])
    assert_type(rad.memory_bytes_, int)

    patchcore = PatchCoreDetector(extractor=RandomConvExtractor(channels=(8, 16)),
                                  image_size=32, random_state=0)
    assert_type(patchcore.fit(torch.as_tensor(X)), PatchCoreDetector)
    assert_type(patchcore.decision_function(list(X)), np.ndarray)
    assert_type(patchcore.predict(X), np.ndarray)

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU())
    feats, key = TorchFeatureExtractor(net, ["0"])(torch.as_tensor(X).permute(0, 3, 1, 2))
    assert_type(check_images(X), torch.Tensor)
