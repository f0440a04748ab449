"""Parity between CLAPP code paths that claim to agree (not compared elsewhere).

Each test names its two paths in the docstring.
"""

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder
from mlpapers.ssl.clapp import _distributed as _dist
from tests.ssl._torchrun import run_two_ranks


@pytest.fixture(scope="module")
def digits():
    return make_shifted_digits(n_samples=10, random_state=0)[0]


@pytest.mark.parametrize("cls", [CLAPPEncoder, GlobalSSLEncoder])
@pytest.mark.parametrize("n, world", [(2, 2), (3, 4), (4, 4)])
def test_distributed_fit_refuses_shards_of_one_image(monkeypatch, cls, n, world):
    """``fit`` under ``torchrun`` vs one process on the same ``X``: one process trains on
    2 images, but with ``n_samples <= world_size`` every rank's shard held one image, so
    every batch was skipped (no negative) and fit returned the untrained network with a
    zero loss history. Regression: a ``ValueError`` on every rank, before any
    collective (``dist_world`` is faked: the check comes before the first collective)."""
    X = make_shifted_digits(n_samples=n, random_state=0)[0]
    monkeypatch.setattr(_dist, "dist_world", lambda: (0, world))
    with pytest.raises(ValueError, match="world_size"):
        cls(architecture="tiny", n_epochs=1, augment=None, random_state=0).fit(X)


def test_single_process_trains_on_two_images():
    """The one-process counterpart of the case above: 2 images give one batch per epoch,
    a nonzero loss and updated weights."""
    X = make_shifted_digits(n_samples=2, random_state=0)[0]
    init = CLAPPEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(X)
    enc = CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0).fit(X)
    assert enc.history_[0]["loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(init.encoder_.state_dict().values(),
                                                      enc.encoder_.state_dict().values()))


@pytest.mark.parametrize("spatial_pool", [1, 2, [2, 1, 1]])
@pytest.mark.parametrize("variant", ["clapp", "clapp++", "clapp++dfb", "clapp++both"])
def test_local_and_global_encoders_share_the_initial_network(digits, variant, spatial_pool):
    """``CLAPPEncoder(variant=...)`` vs ``GlobalSSLEncoder`` with the same ``random_state``
    and ``n_epochs=0``: the shared network builder draws the encoder first, so both start
    from the same weights (local vs backprop comparisons start from one network), and the
    shared ``transform`` and feature names agree."""
    kw = dict(architecture="tiny", n_epochs=0, random_state=7, spatial_pool=spatial_pool)
    loc = CLAPPEncoder(variant=variant, **kw).fit(digits)
    glo = GlobalSSLEncoder(**kw).fit(digits)
    for (na, a), (nb, b) in zip(loc.encoder_.state_dict().items(),
                                glo.encoder_.state_dict().items()):
        assert na == nb and torch.equal(a, b)
    assert loc.layer_dims_ == glo.layer_dims_ and loc.grids_ == glo.grids_
    np.testing.assert_array_equal(loc.transform(digits), glo.transform(digits))
    # the names differ only by the estimator prefix (scikit-learn's convention)
    strip = [str(n).split("_", 1)[1] for n in loc.get_feature_names_out()]
    assert strip == [str(n).split("_", 1)[1] for n in glo.get_feature_names_out()]


@pytest.mark.parametrize("cls, kw", [(CLAPPEncoder, {"variant": "clapp++both"}),
                                     (CLAPPEncoder, {"variant": "clapp2021"}),
                                     (GlobalSSLEncoder, {"loss": "infonce"})])
def test_fit_transform_equals_fit_then_transform(digits, cls, kw):
    """``fit_transform(X)`` vs ``fit(X).transform(X)`` with the same integer seed (and
    the layer / pooling options of ``transform`` through ``fit`` then ``transform``)."""
    est = dict(architecture="tiny", n_epochs=1, batch_size=4, random_state=3, **kw)
    a = cls(**est).fit_transform(digits)
    fitted = cls(**est).fit(digits)
    np.testing.assert_array_equal(a, fitted.transform(digits))
    top = fitted.transform(digits, layers=-1)
    assert top.shape[1] == fitted.layer_dims_[-1]
    np.testing.assert_array_equal(top, fitted.transform(digits)[:, -top.shape[1]:])


@pytest.mark.parametrize("name", ["default", "light"])
def test_augment_names_equal_their_default_augment_objects(digits, name):
    """``augment="default"`` / ``"light"`` vs ``augment=DefaultAugment()`` /
    ``DefaultAugment.light()``: the same views from the same seed, so the same fit."""
    from mlpapers.ssl.clapp import DefaultAugment

    obj = DefaultAugment() if name == "default" else DefaultAugment.light()
    kw = dict(architecture="tiny", n_epochs=1, batch_size=4, random_state=0)
    a = CLAPPEncoder(augment=name, **kw).fit(digits)
    b = CLAPPEncoder(augment=obj, **kw).fit(digits)
    assert a.history_ == b.history_
    np.testing.assert_array_equal(a.transform(digits), b.transform(digits))


_DDP_WORKER = '''
import sys, torch, torch.distributed as dist
from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder
dist.init_process_group("gloo")
torch.set_num_threads(1)
X, _ = make_shifted_digits(n_samples=8, random_state=0)
enc = CLAPPEncoder(**eval(sys.argv[2])).fit(X)
if dist.get_rank() == 0:
    torch.save({"encoder": enc.encoder_.state_dict(), "heads": enc.heads_.state_dict(),
                "history": [h["loss"] for h in enc.history_]}, sys.argv[1])
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.slow  # two torchrun workers: about 13 s of process start-up on 2 cores
def test_torchrun_two_ranks_equal_one_process_averaging_the_shard_gradients(tmp_path):
    """``fit`` under ``torchrun`` (2 gloo ranks) vs one process that replays the documented
    steps: rank 0's initialisation, the shared permutation seeded from rank 0's generator,
    shards ``perm[r::2]``, the mean of the two shards' layer-local gradients, one AdamW
    step; and the history as the mean loss over both shards. Identical views
    (``augment=None``) and ``"next"`` negatives make the replay deterministic."""
    from mlpapers.ssl.clapp._distributed import shard
    from mlpapers.ssl.clapp._kernels import negative_indices

    kw = dict(variant="clapp++dfb", architecture="tiny", augment=None, n_epochs=2,
              batch_size=4, lr=1e-2, random_state=0)
    script = tmp_path / "worker.py"
    script.write_text(_DDP_WORKER)
    run_two_ranks(script, str(tmp_path / "out.pt"), repr(kw))
    got = torch.load(tmp_path / "out.pt", weights_only=True)

    X = torch.as_tensor(make_shifted_digits(n_samples=8, random_state=0)[0])
    enc = CLAPPEncoder(**{**kw, "n_epochs": 0}).fit(X.numpy())  # rank 0's initial network
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=enc._torch_gen, dtype=torch.int64))
    shuffle = torch.Generator().manual_seed(seed)
    params = [p for p in [*enc.encoder_.parameters(), *enc.heads_.parameters()]
              if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=kw["lr"], weight_decay=0.0)
    enc.encoder_.train()
    history = []
    for _ in range(kw["n_epochs"]):
        perm = torch.randperm(8, generator=shuffle)
        grads, losses = [], []
        for rank in range(2):
            xb = X[shard(perm, rank, 2)]
            opt.zero_grad(set_to_none=True)
            losses.append(enc._train_step(torch.cat([xb, xb]), negative_indices(len(xb))))
            grads.append([p.grad.clone() for p in params])
        for p, g0, g1 in zip(params, *grads):
            p.grad = (g0 + g1) / 2
        opt.step()
        history.append(float(sum(((losses[0] + losses[1]) / 2).tolist())))
    for key, module in (("encoder", enc.encoder_), ("heads", enc.heads_)):
        for name, value in module.state_dict().items():
            torch.testing.assert_close(got[key][name], value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["history"], history, rtol=1e-6)


@pytest.mark.parametrize("kw, name", [(dict(ratio=(4 / 3, 3 / 4)), "ratio"),
                                      (dict(scale=(0.0, 1.0)), "scale"),
                                      (dict(scale=(0.9, 0.5)), "scale"),
                                      (dict(sigma=(0.0, 1.0)), "sigma"),
                                      (dict(flip=1.5), "flip"),
                                      (dict(jitter_p=-0.1), "jitter_p"),
                                      (dict(jitter=(0.4, 0.4)), "jitter"),
                                      (dict(jitter=(0.4, -0.1, 0.4)), "jitter")])
def test_default_augment_refuses_settings_torchvision_would_not_draw(kw, name):
    """DefaultAugment vs torchvision's transforms on bad settings: a reversed ``ratio``
    was read as (min, max) (a 3/4-high fallback crop where torchvision takes min/max),
    a zero ``scale`` drew zero-area crops, a probability above 1 was silently 1."""
    from mlpapers.ssl.clapp import DefaultAugment

    with pytest.raises(ValueError, match=name):
        DefaultAugment(**kw)(torch.rand(2, 3, 8, 8), torch.Generator().manual_seed(0))
    DefaultAugment(jitter=tuple(np.float32([0.4] * 3)), flip=np.float32(0.5))(
        torch.rand(2, 3, 8, 8))


def test_default_augment_takes_numpy_and_torch_numbers_as_python_ones():
    """DefaultAugment settings given as numpy or 0-d torch numbers vs Python floats: the
    same views (the setting check must not refuse what the draws accept), and sigma is
    not checked when the blur is off."""
    from mlpapers.ssl.clapp import DefaultAugment

    x = torch.rand(3, 3, 12, 12)
    ref = DefaultAugment(flip=0.5, jitter=(0.4, 0.4, 0.4), blur_p=1.0)(
        x, torch.Generator().manual_seed(1))
    for kw in (dict(flip=torch.tensor(0.5), jitter=np.array([0.4, 0.4, 0.4]),
                    blur_p=np.bool_(True)),
               dict(flip=np.float32(0.5), jitter=(torch.tensor(0.4),) * 3, blur_p=1)):
        out = DefaultAugment(**kw)(x, torch.Generator().manual_seed(1))
        torch.testing.assert_close(out, ref)
    DefaultAugment(sigma=(0.0, 0.0), blur_p=0.0)(x)
