"""The CLAPP and global self-supervised image encoders and their tools, as typed user code."""

from typing import assert_type

import numpy as np
import torch

from mlpapers.ssl import (
    CLAPPEncoder,
    DefaultAugment,
    GlobalSSLEncoder,
    update_similarity,
)
from mlpapers.ssl.clapp import (
    clapp_layer_loss,
    extract_patches,
    infonce_loss,
    training_step_activation_bytes,
)


def check() -> None:
    X = np.random.default_rng(0).random((8, 1, 8, 8), dtype=np.float32)
    small = [(4,), (4, "M")]
    enc = CLAPPEncoder(architecture=small, n_epochs=1, batch_size=4, augment=None,
                       random_state=0)
    assert_type(enc.fit(X), CLAPPEncoder)
    assert_type(enc.transform(X), np.ndarray)
    assert_type(enc.transform(torch.from_numpy(X), layers=-1, spatial_pool=1), np.ndarray)
    assert_type(enc.transform(X, layers=[0, 1]), np.ndarray)
    assert_type(enc.get_feature_names_out(), np.ndarray)
    assert_type(update_similarity(enc, X, n_batches=1, random_state=0), dict[int, float])
    assert_type(training_step_activation_bytes(enc, X, batch_size=4), int)

    glob = GlobalSSLEncoder(loss="infonce", projection_dim=4, architecture=small,
                            n_epochs=1, batch_size=4, augment=DefaultAugment.light(),
                            random_state=0)
    assert_type(glob.fit(X), GlobalSSLEncoder)
    assert_type(glob.transform(X), np.ndarray)

    aug = DefaultAugment(scale=(0.5, 1.0), sigma=(0.1, 1.0))
    x = torch.from_numpy(X)
    assert_type(aug(x, torch.Generator().manual_seed(0)), torch.Tensor)
    assert_type(extract_patches(x, 4, 2), tuple[torch.Tensor, int, int])
    z = torch.randn(4, 3)
    assert_type(infonce_loss(z), torch.Tensor)
    neg = torch.tensor([1, 2, 3, 0])
    assert_type(clapp_layer_loss(z, z, torch.eye(3), neg), torch.Tensor)
    check_constructor_options()


def flip(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    return x.flip(-1)


def check_constructor_options() -> None:
    # the parameters that are not a single plain type, given as a user would
    clapp2021 = CLAPPEncoder(variant="clapp2021", architecture=[8, (16, "M")], loss="softhinge",
                             spatial_pool=[1, 2], patch_size=4, patch_stride=2,
                             prediction_steps=1, negatives="random", augment=flip,
                             device=torch.device("cpu"), random_state=np.random.default_rng(0))
    assert_type(clapp2021, CLAPPEncoder)
    both = CLAPPEncoder(variant="clapp++both", architecture=((4,), (8, "M", 8)),
                        spatial_pool=(1, 1), augment=torch.nn.Identity(),
                        random_state=np.random.RandomState(0), device="cpu", lr=1e-2,
                        weight_decay=1e-4, n_epochs=0, verbose=1)
    assert_type(both, CLAPPEncoder)
    named = CLAPPEncoder(variant="clapp", architecture="vgg6", spatial_pool=2,
                         augment="light", random_state=np.int64(3))
    assert_type(named, CLAPPEncoder)
    for variant in ("clapp", "clapp++", "clapp++dfb"):
        assert_type(CLAPPEncoder(variant=variant, augment=lambda x: x), CLAPPEncoder)
    glob = GlobalSSLEncoder(loss="infonce-cross", temperature=0.5, projection_dim=8,
                            architecture=[(4, 4, "M")], spatial_pool=[1], negatives="random",
                            augment=DefaultAugment(flip=0.0), device=torch.device("cpu"),
                            random_state=np.random.default_rng(1))
    assert_type(glob, GlobalSSLEncoder)
    bp = GlobalSSLEncoder(loss="bp-clapp", augment=None, random_state=None)
    assert_type(bp, GlobalSSLEncoder)
