"""The RAD and PatchCore detectors and the feature extractors, as typed user code."""

from typing import assert_type

import numpy as np
import torch

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
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
    check_constructors()


class _TinyViT(torch.nn.Module):
    """The DINOv2/v3 ``get_intermediate_layers`` API on 8x8 patches, two blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 4, 8, stride=8)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    def get_intermediate_layers(self, x: torch.Tensor, n: list[int], reshape: bool,
                                return_class_token: bool, norm: bool
                                ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        grid = self.embed(x)
        tokens = torch.cat([grid.mean((2, 3))[:, None], grid.flatten(2).mT], 1)
        outs = []
        for i, block in enumerate(self.blocks):
            tokens = block(tokens)
            if i in n:
                outs.append((tokens[:, 1:].mT.reshape(grid.shape), tokens[:, 0]))
        return tuple(outs)


def _plain_extractor(images: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A function as the extractor: one feature map (the images pooled) and a key."""
    grid = torch.nn.functional.avg_pool2d(images, 4)
    return [grid], grid.mean((2, 3))


def check_constructors() -> None:
    # each constructor with the non-default kinds of values its parameters accept
    rng = np.random.default_rng(0)
    X = rng.random((4, 32, 32, 3)).astype(np.float32)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU())
    hooked = TorchFeatureExtractor(net, "1", key="gap", key_layer="0", forward=None,
                                   mean=0.5, std=(0.25, 0.25, 0.25))
    TorchFeatureExtractor(net, ("0", "1"), key="cls", mean=None, std=None)
    dino = DinoViTExtractor(_TinyViT(), layers=[1, -2], norm=False, mean=None, std=None)
    DinoViTExtractor(_TinyViT(), layers=1, mean=[0.5, 0.5, 0.5], std=0.2)
    RandomConvExtractor(channels=4, seed=1)

    RADDetector(extractor="efficientnet-lite0", image_size=[32, 48],
                device=torch.device("cpu"))
    RADDetector(extractor=dino, memory_dtype="bfloat16", matching="gather")
    rad = RADDetector(extractor=_plain_extractor, k_images=2, pos_radius=None,
                      layer_weights=np.array([1.0]), image_size=(32, 32), top_ratio=0.0,
                      smoothing_sigma=0.5, blur_padding="reflect", contamination=0.25,
                      memory_dtype="float16", matching="tiled", batch_size=2,
                      chunk_size=2**20, device=torch.device("cpu"),
                      random_state=np.random.default_rng(0), verbose=0)
    assert_type(rad.fit(X).decision_function(X), np.ndarray)
    RADDetector(extractor=hooked, pos_radius=0, layer_weights=[1.0], image_size=None,
                matching="shared", random_state=np.random.RandomState(0))

    patchcore = PatchCoreDetector(extractor=_plain_extractor, coreset_ratio=1.0,
                                  image_size=[32, 32], smoothing_sigma=0.0,
                                  contamination=0.5, memory_dtype="bfloat16", batch_size=2,
                                  chunk_size=2**20, device=torch.device("cpu"),
                                  random_state=np.random.default_rng(1))
    assert_type(patchcore.fit(X).predict(X), np.ndarray)
    PatchCoreDetector(extractor="random", image_size=None, memory_dtype="float16",
                      random_state=np.random.RandomState(0))
