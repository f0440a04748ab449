"""Shared shell of the self-supervised image encoders: validation, training loop, features."""

from __future__ import annotations

import copy
import inspect
import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, Self, TypeAlias, cast

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import metadata_routing
from torch import nn

from mlpapers._base import TorchEstimatorMixin, restore_on_failure
from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    autograd_enabled,
    check_in_options,
    check_learning_rate,
    check_positive,
    check_tensor,
    reject_flat_image_table,
    reject_single_hwc_image,
    with_autograd,
)
from mlpapers._utils._blocks import collect_row_blocks
from mlpapers.ssl.clapp import _distributed as _dist
from mlpapers.ssl.clapp._augment import DefaultAugment, UserAugment, binds_its_call
from mlpapers.ssl.clapp._kernels import negative_indices
from mlpapers.ssl.clapp._networks import VGGEncoder, check_architecture, pool_representations

_TRANSFORM_CHUNK = 256
# the ``augment`` parameter stored by ``save`` in place of a custom callable (code, which a
# safe file cannot hold), and the key under which a DefaultAugment's settings are stored
_CUSTOM_AUGMENT = "<custom augment: pass it to load>"

#: The ``layers`` option of ``transform``: "all", a block index or a list of them.
Layers: TypeAlias = Literal["all"] | int | Sequence[int]
#: The ``architecture`` parameter: a named architecture, or a list of blocks, each a
#: channel count or a sequence of channel counts and ``"M"`` (max-pool).
Architecture: TypeAlias = str | Sequence[int | Sequence[int | str]]
#: The ``spatial_pool`` parameter: one grid side for every block, one per block, or None.
SpatialPool: TypeAlias = int | Sequence[int] | None
#: The ``augment`` parameter: a built-in recipe, ``augment(x, generator) -> x`` (or
#: ``augment(x) -> x``), or None (identical views).
Augment: TypeAlias = Literal["default", "light"] | Callable[..., torch.Tensor] | None
_DEFAULT_AUGMENT_TAG = "__DefaultAugment__"


def _augment_settings(aug: DefaultAugment) -> dict:
    """The constructor arguments of a ``DefaultAugment`` (what ``load`` rebuilds it from;
    other attributes a user set on it are not settings and are not stored)."""
    names = [k for k in inspect.signature(DefaultAugment.__init__).parameters if k != "self"]
    return {k: getattr(aug, k) for k in names}


class _SSLImageEncoder(TorchEstimatorMixin, TransformerMixin, BaseEstimator,
                      auto_wrap_output_keys=None):
    """Base: fit a VGG-like encoder without labels, transform images to pooled features.

    Subclasses define ``_check_params`` (their parameters, then
    ``_check_common_params``), ``_default_grid`` (spatial pool side when
    ``spatial_pool`` is None), ``_build_heads(dims, generator)`` (predictors/projections,
    an ``nn.Module``) and either ``_batch_losses(views, neg_idx)`` (a 1D tensor of the
    losses, summed by the default :meth:`_train_step`) or their own ``_train_step``
    (:class:`CLAPPEncoder`'s block-by-block backward passes).
    """

    _loss_names: tuple[str, ...] = ()
    # set by the estimator that mixes this in (its constructor parameter; ``load`` reads a
    # saved DefaultAugment's settings as a dict)
    augment: str | Callable[..., Any] | dict[str, Any] | None
    # Constructor parameters that define the fitted modules (``load`` rebuilds them from
    # the saved parameters), those of them the losses read with the fitted heads
    # (``update_similarity``, ``training_step_activation_bytes``), and, per subclass,
    # a check of those ``transform`` reads. Changed by ``set_params`` after ``fit``
    # without a refit, they gave features from another variant's code path (silently),
    # cryptic shape errors, or a file that loaded as another network.
    _STRUCTURE_PARAMS: tuple[str, ...] = ("architecture", "spatial_pool")
    _HEAD_PARAMS: tuple[str, ...] = ()
    # ``transform`` is not wrapped by scikit-learn's ``set_output`` machinery (which would
    # name the columns with ``get_feature_names_out()``, i.e. ``layers="all"``, whatever
    # ``layers`` / ``spatial_pool`` the call used): it wraps its output itself
    # (``_wrap_output``). The subclasses still offer ``set_output``.
    # ``transform(X, layers=...)`` is an option, not routed metadata.
    __metadata_request__transform = {"layers": metadata_routing.UNUSED,
                                     "spatial_pool": metadata_routing.UNUSED}

    # -- scikit-learn integration ---------------------------------------------
    @classmethod
    def _estimator_check_instances(cls) -> list:
        # The encoder consumes images (n, C, H, W) or (n, H, W): a convolutional
        # network has no meaning for the generic (n_samples, n_features) tables of
        # scikit-learn's checks (3 or 10 features, not images), so the checks are
        # not run; cloning, get/set_params, pipelines, determinism and pickling are
        # tested in tests/ssl/test_clapp_estimator.py instead.
        return []

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.requires_fit = True
        # the encoder is a float32 network: float64 images give float32 features
        tags.transformer_tags.preserves_dtype = ["float32"]
        return tags

    # -- validation ---------------------------------------------------------------
    def _check_common_params(self) -> None:
        check_positive(self.n_epochs, "n_epochs", integer=True, strict=False)
        check_positive(self.batch_size, "batch_size", integer=True)
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (negatives come from other images of "
                             f"the batch), got {self.batch_size}.")
        check_learning_rate(self.lr, adam=True)  # AdamW
        check_positive(self.weight_decay, "weight_decay", strict=False)
        check_in_options(self.negatives, "negatives", ("next", "random"))
        self._check_augment()
        self._blocks = check_architecture(self.architecture)

    def _check_augment(self) -> None:
        if isinstance(self.augment, type):
            # a class is callable too: augment(x, generator) would construct it
            raise TypeError(f"augment must be a callable object, got the class "
                            f"{self.augment.__name__}; pass an instance, e.g. "
                            f"{self.augment.__name__}().")
        if not (callable(self.augment) or self.augment in ("default", "light", None,
                                                            _CUSTOM_AUGMENT)):
            raise ValueError("augment must be 'default', 'light', None (identity views) or a "
                             f"callable augment(x, generator) -> x, got {self.augment!r}.")

    def _grids(self, sp: Any = None) -> list[int]:
        """Grid side per block of ``sp`` (default: the ``spatial_pool`` parameter)."""
        n_blocks = len(self._blocks)
        if sp is None:
            sp = self.spatial_pool
        if sp is None:
            sp = self._default_grid()
        if isinstance(sp, numbers.Integral) and not isinstance(sp, bool):
            grids = [int(sp)] * n_blocks
        elif isinstance(sp, (list, tuple)) or (isinstance(sp, np.ndarray) and sp.ndim == 1):
            grids = list(sp)  # (a 1-D numpy array of ints too: np.integer is Integral)
        else:
            raise TypeError(f"spatial_pool must be None, an int or a list of ints, got {sp!r}.")
        if len(grids) != n_blocks or any(
            isinstance(g, bool) or not isinstance(g, numbers.Integral) or g < 1 for g in grids
        ):
            raise ValueError(f"spatial_pool must give one positive int grid side per block "
                             f"({n_blocks} blocks), got {sp!r}.")
        return [int(g) for g in grids]

    def _check_images(self, X: Any, *, reset: bool) -> torch.Tensor:
        """Validate images into a float32 CPU tensor of shape (n, C, H, W)."""
        if not reset:
            self._check_fitted()
        reject_flat_image_table(X, takes=f"{type(self).__name__} takes images, (n, H, W) "
                                "or (n, C, H, W)", channels_first=True,
                                image_shape=None if reset else tuple(self.input_shape_))
        X = check_tensor(X, ndim=(3, 4), dtype=torch.float32, device="cpu",
                         min_samples=2 if reset else 1, owner=type(self).__name__)
        reject_single_hwc_image(X, fix="a batch of at least 2 (n, C, H, W) images (one colour "
                                "image is X[None].transpose(0, 3, 1, 2) for numpy, "
                                "X[None].permute(0, 3, 1, 2) for torch)")
        if X.ndim == 4 and X.shape[-1] in (1, 3, 4) and min(X.shape[1], X.shape[2]) > 4:
            raise ValueError(f"X has shape {tuple(X.shape)}, which looks like channels-last "
                             "(n, H, W, C) images; images must be (n, C, H, W) (or (n, H, W) "
                             "grayscale): transpose them with X.transpose(0, 3, 1, 2) "
                             "(numpy) or X.permute(0, 3, 1, 2) (torch).")
        if X.ndim == 3:
            X = X[:, None]
        shape = tuple(int(s) for s in X.shape[1:])
        if reset:
            return X
        if shape != tuple(self.input_shape_):
            raise ValueError(f"X has images of shape {shape} (C, H, W), but "
                             f"{type(self).__name__} was fitted on {tuple(self.input_shape_)}.")
        return X

    def _check_sizes(self, shape: tuple[int, ...]) -> None:
        sizes = self.encoder_.map_sizes(shape[1], shape[2])
        for i, ((h, w), g) in enumerate(zip(sizes, self.grids_)):
            if min(h, w) < g:
                raise ValueError(
                    f"images of size {shape[1]}x{shape[2]} are too small for the architecture: "
                    f"block {i} outputs {h}x{w} maps, smaller than its spatial_pool grid {g}. "
                    "Use larger images, fewer 'M' max-pools or a smaller spatial_pool.")

    def _augment_fn(self):
        # also for update_similarity and training_step_activation_bytes, which a fitted
        # encoder runs without fit's checks (after set_params(augment=...))
        self._check_augment()
        if isinstance(self.augment, str) and self.augment == _CUSTOM_AUGMENT:
            raise ValueError(f"this {type(self).__name__} was saved with a custom augment, "
                             "which the file does not hold; pass it again to train: "
                             f"{type(self).__name__}.load(path, augment=my_augment) or "
                             "set_params(augment=my_augment).")
        if self.augment == "default":
            return DefaultAugment()
        if self.augment == "light":
            return DefaultAugment.light()
        if self.augment is None:
            return lambda x, generator=None: x
        if type(self.augment) is DefaultAugment:  # draws from the generator only, in place
            return self.augment                   # never: no copy, fork or lock needed
        # a copy of the batch per call, the global torch RNG forked and seeded (UserAugment)
        # (a callable here: _check_augment let no other value through)
        return UserAugment(cast(Callable[..., Any], self.augment))

    def _two_views(self, augment, xb: torch.Tensor, gen) -> torch.Tensor:
        """Two augmented views of ``xb`` stacked to ``(2N, C, h, w)``; a user callable's
        output is checked so that a wrong one is named rather than failing inside torch
        (or training on it silently)."""
        custom = callable(self.augment) and type(self.augment) is not DefaultAugment
        try:
            first = augment(xb, gen)
            if custom and isinstance(first, torch.Tensor):
                # an augment that writes every result into one buffer of its own would
                # overwrite the first view with the second (one memcpy of the batch)
                first = first.clone()
            views = [first, augment(xb, gen)]
        except TypeError as exc:
            if not custom or binds_its_call(cast(Callable[..., Any], self.augment)):
                raise  # raised inside the augment: its own error, unchanged
            raise TypeError(f"augment must be callable as augment(x, generator) -> x (or "
                            f"augment(x) -> x): {exc}") from exc
        if custom:
            for v in views:
                if not isinstance(v, torch.Tensor):
                    raise TypeError(f"augment must return a torch.Tensor, got "
                                    f"{type(v).__name__}.")
                if not v.is_floating_point():
                    # integer or boolean views would be cast to float on another scale
                    # than the images (0-255 for uint8), complex ones lose a part
                    raise TypeError(f"augment must return floating-point images (it is "
                                    f"given float32 ones), got dtype {v.dtype}.")
                if v.ndim != 4 or tuple(v.shape[:2]) != tuple(xb.shape[:2]):
                    raise ValueError(f"augment must return images of shape (N, C, h, w) = "
                                     f"({xb.shape[0]}, {xb.shape[1]}, h, w), got "
                                     f"{tuple(v.shape)}.")
            if views[0].shape != views[1].shape:
                raise ValueError(f"augment returned views of different sizes "
                                 f"{tuple(views[0].shape)} and {tuple(views[1].shape)} for "
                                 "one batch; both views must have the same size (resize "
                                 "random crops to a fixed size, e.g. the input's).")
            self._check_view_size(tuple(int(s) for s in views[0].shape[2:]))
            views = [v.to(device=xb.device, dtype=xb.dtype) for v in views]
            for v in views:  # after the cast: float64 values beyond float32 become inf
                if not bool(torch.isfinite(v).all()):
                    raise ValueError("augment returned NaN or infinite values; the views "
                                     "must be finite images.")
        return torch.cat(views, dim=0)

    def _check_view_size(self, size: tuple[int, ...]) -> None:
        """Augmented views of another size than the training images must still fit
        the architecture and the pooling grids (what the images were checked for)."""
        if size == tuple(self.input_shape_[1:]):
            return
        for i, ((h, w), g) in enumerate(zip(self.encoder_.map_sizes(*size), self.grids_)):
            if min(h, w) < g:
                raise ValueError(
                    f"augment returned views of size {size[0]}x{size[1]}, too small for the "
                    f"architecture: block {i} outputs {h}x{w} maps, smaller than its "
                    f"spatial_pool grid {g}. Return views of the input size "
                    f"{self.input_shape_[1]}x{self.input_shape_[2]}.")

    # -- building -----------------------------------------------------------------
    # A parameter changed by ``set_params`` after ``fit`` is compared with its fitted value
    # after both are resolved to what the fitted modules depend on: a spelling that
    # builds the same network (``"tiny"`` and its blocks written out, ``spatial_pool=None``
    # and its grids, a patch option that the variant ignores, ...) is no change; only a
    # value that builds another network is refused where it matters.
    def _structure_value(self, name: str) -> Any:
        """The current value of a structural parameter, resolved as the network reads it."""
        if name == "architecture":
            # valid here: save checks the parameters (_check_params) before comparing
            return check_architecture(self.architecture)
        if name == "spatial_pool" and hasattr(self, "_blocks"):
            try:                    # the grids it gives: None and their explicit value agree
                return self._grids()
            except (TypeError, ValueError):
                pass
        return getattr(self, name)

    def _fitted_structure_value(self, name: str) -> Any:
        """The fitted value of a structural parameter, resolved as :meth:`_structure_value`."""
        if name == "architecture":
            return check_architecture(self._fitted_structure["architecture"])
        if name == "spatial_pool":
            return list(self.grids_)
        return self._fitted_structure.get(name)

    def _changed_structure(self, names) -> list[str]:
        """Which of ``names`` resolve to other values than when the network was built."""
        if getattr(self, "_fitted_structure", None) is None:
            return []               # built by an older version: nothing recorded
        changed = []
        for name in names:
            now, then = self._structure_value(name), self._fitted_structure_value(name)
            try:
                same = bool(now == then)
            except Exception:       # e.g. arrays: compared by identity only
                same = now is then
            if not same:
                changed.append(name)
        return changed

    def _check_structure(self, names, consequence: str) -> None:
        changed = self._changed_structure(names)
        if not changed:
            return
        set_, implied = [], []
        for k in changed:
            then, now = self._fitted_structure.get(k), getattr(self, k)
            try:
                alike = bool(then == now)
            except Exception:
                alike = False
            if alike:       # changed through another parameter, e.g. the default grid
                implied.append(f"{k}={then!r} -> {now!r} (resolved: "
                               f"{self._fitted_structure_value(k)!r} -> "
                               f"{self._structure_value(k)!r})")
            else:
                set_.append(f"{k}={then!r} -> {now!r}")
        # the parameters the user set; the resolved values only when no set one differs
        desc = ", ".join(set_ or implied)
        raise ValueError(
            f"{type(self).__name__} was fitted with other parameters than it holds now "
            f"({desc}, set after fit): {consequence}. Fit it again, or set the fitted "
            "values back.")

    def _check_fitted(self) -> None:
        super()._check_fitted()
        self._check_transform_structure()

    def _check_transform_structure(self) -> None:
        """Subclasses: raise if a parameter ``transform`` reads changed since ``fit``."""

    def _build(self, shape: tuple[int, ...], generator: torch.Generator | None) -> None:
        # the parameters as given (resolved when compared: _fitted_structure_value)
        self._fitted_structure = {k: copy.deepcopy(getattr(self, k))
                                  for k in self._STRUCTURE_PARAMS}
        self.grids_ = self._grids()
        self.input_shape_ = tuple(shape)
        self.encoder_ = VGGEncoder(shape[0], self._blocks, generator=generator)
        self._check_sizes(shape)
        self.layer_dims_ = [c * g * g for c, g in zip(self.encoder_.channels, self.grids_)]
        self.heads_ = self._build_heads(self.layer_dims_, generator)
        dev = self._resolved_device
        self.encoder_.to(dev)
        self.heads_.to(dev)

    def _pooled(self, views: torch.Tensor, detach: bool, grids: list[int] | None = None
                ) -> list[torch.Tensor]:
        return pool_representations(self.encoder_(views, detach=detach),
                                    self.grids_ if grids is None else grids)

    def _feature_grids(self, spatial_pool) -> list[int]:
        """The pooling grids of :meth:`transform`: ``grids_`` or a validated override."""
        if spatial_pool is None:
            return list(self.grids_)
        grids = self._grids(spatial_pool)
        for i, ((h, w), g) in enumerate(zip(self._feature_map_sizes(), grids)):
            if min(h, w) < g:
                raise ValueError(f"spatial_pool grid {g} of block {i} is larger than the "
                                 f"{h}x{w} map it pools.")
        return grids

    def _feature_map_sizes(self) -> list[tuple[int, int]]:
        """Spatial size of what :meth:`transform` pools, per block."""
        return self.encoder_.map_sizes(*self.input_shape_[1:])

    # -- fitting ------------------------------------------------------------------
    # training needs autograd even inside the caller's no_grad / inference_mode block (the
    # torchrun path included: it runs inside this method)
    @with_autograd
    @restore_on_failure
    def fit(self, X: ArrayLike, y: object = None) -> Self:
        """Train the encoder without labels.

        Parameters
        ----------
        X : array-like or Tensor of shape (n_samples, C, H, W) or (n_samples, H, W)
            Images (at least 2).
        y : None
            Ignored (self-supervised).

        Returns
        -------
        self : object
            The fitted encoder.

        Notes
        -----
        When :mod:`torch.distributed` is initialised (e.g. under ``torchrun``), every
        rank must pass the same ``X``; each trains on its shard, gradients are averaged
        across ranks and all ranks end with identical parameters (``batch_size`` is per
        rank; ``X`` needs more images than ranks, since every rank's batches need 2 for
        the negatives). See the user guide, "Scale-out".
        """
        self._check_params()
        augment = self._augment_fn()          # before any work: a saved custom augment
        self._init_fit()
        X = self._check_images(X, reset=True)
        gen = self._torch_gen
        self._build(tuple(X.shape[1:]), gen)
        self.n_features_in_ = int(np.prod(self.input_shape_))
        params = [p for p in [*self.encoder_.parameters(), *self.heads_.parameters()]
                  if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        n = X.shape[0]
        dev = self._resolved_device
        ddp = _dist.dist_world()              # (rank, world_size) under torchrun, else None
        shuffle_gen = gen
        verbose = self.verbose
        if ddp is not None and self.n_epochs > 0 and -(-n // ddp[1]) < 2:
            # every rank's shard would hold one image: no batch has a negative, so every
            # step would be skipped and fit would return the initial network with a zero
            # loss history (one process trains on the same images). Raised on every rank
            # (all pass the same X) before any collective.
            raise ValueError(
                f"X has {n} images for {ddp[1]} processes: each process trains on "
                f"ceil(n_samples / world_size) = {-(-n // ddp[1])} image(s), but a batch "
                f"needs at least 2 (the negatives are its other images); pass more than "
                f"world_size = {ddp[1]} images or start fewer processes.")
        if ddp is not None:
            # Same initialisation and same permutations on every rank; independent
            # augmentations/negatives per rank. See _distributed.py.
            _dist.broadcast_modules(self.encoder_, self.heads_)
            seed = _dist.shared_seed(gen, dev)
            shuffle_gen = torch.Generator().manual_seed(seed)
            gen = torch.Generator().manual_seed((seed + 1 + ddp[0]) % 2 ** 63)
            verbose = verbose if ddp[0] == 0 else 0
        bs = min(self.batch_size, n if ddp is None else -(-n // ddp[1]))
        log = ProgressLogger(self.n_epochs, verbose, desc=type(self).__name__)
        self.encoder_.train()
        for epoch in log:
            perm = torch.randperm(n, generator=shuffle_gen)
            if ddp is not None:
                perm = _dist.shard(perm, *ddp)
            total = torch.zeros(len(self._loss_names), dtype=torch.float32, device=dev)
            seen = 0
            for start in range(0, len(perm), bs):
                idx = perm[start:start + bs]
                if len(idx) < 2:      # a one-image remainder has no negative: skipped
                    continue
                xb = X[idx].to(dev)
                with torch.no_grad():
                    views = self._two_views(augment, xb, gen)
                neg = self._negatives(len(idx), gen, dev)
                opt.zero_grad(set_to_none=True)
                losses = self._train_step(views, neg)
                if ddp is not None:
                    _dist.average_gradients(params, ddp[1])
                opt.step()
                total += losses.detach() * len(idx)
                seen += len(idx)
            if ddp is not None:               # history over the global data set
                total = _dist.sum_across_ranks(total)
                seen = int(_dist.sum_across_ranks(torch.tensor([seen], device=dev)).item())
            per = (total / max(seen, 1)).tolist()
            if not (all(np.isfinite(per)) and all(bool(torch.isfinite(p).all())
                                                  for p in params)):
                # no BatchNorm: the scores z^T B c grow like the square of the pixel
                # scale, and a NaN model would give NaN features without a word
                decay = (f", or lower weight_decay (now {self.weight_decay})"
                         if self.weight_decay else "")
                raise FloatingPointError(
                    f"{type(self).__name__} diverged in epoch {epoch}: non-finite losses or "
                    f"weights (images with values up to {float(X.abs().max()):.3g}). Scale "
                    "the images to a moderate range such as [0, 1] (the network has no "
                    f"normalisation layer), or lower lr (now {self.lr}){decay}.")
            log.log(epoch=epoch, loss=float(sum(per)),
                    **{name: v for name, v in zip(self._loss_names, per)})
        opt.zero_grad(set_to_none=True)       # no stale gradients on the fitted modules
        self.encoder_.eval()
        self.history_ = log.history
        return self

    def _train_step(self, views: torch.Tensor, neg_idx: torch.Tensor) -> torch.Tensor:
        """Accumulate the gradients of one batch into ``.grad``; return the detached losses.

        The default sums :meth:`_batch_losses` and calls one backward pass (global
        backprop keeps the graph of every block until then). Layer-local encoders
        override it to run each block's backward right after its forward pass.
        """
        losses = self._batch_losses(views, neg_idx)
        losses.sum().backward()
        return losses.detach()

    def _negatives(self, n_images: int, gen, device) -> torch.Tensor:
        return negative_indices(n_images, mode=self.negatives, generator=gen, device=device)

    def _random_batch(self, X: torch.Tensor, batch_size: int, augment, gen
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The two views and negatives of ``batch_size`` images drawn from ``X``, all from
        ``gen`` in that order (the analyses' one-batch training step)."""
        dev = self._resolved_device
        xb = X[torch.randperm(X.shape[0], generator=gen)[:batch_size]].to(dev)
        with torch.no_grad():
            views = self._two_views(augment, xb, gen)
        return views, self._negatives(xb.shape[0], gen, dev)

    # -- features -------------------------------------------------------------------
    def _layer_list(self, layers) -> list[int]:
        n_blocks = len(self.grids_)
        if isinstance(layers, str) and layers == "all":
            return list(range(n_blocks))
        single = isinstance(layers, numbers.Integral) and not isinstance(layers, bool)
        items = [layers] if single else layers
        try:
            items = list(items)
        except TypeError:
            items = [None]
        out = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, numbers.Integral) or not (
                -n_blocks <= int(item) < n_blocks
            ):
                raise ValueError(f"layers must be 'all', an int or a list of ints in "
                                 f"[-{n_blocks}, {n_blocks - 1}], got {layers!r}.")
            out.append(int(item) % n_blocks)
        if not out:
            raise ValueError("layers must not be empty.")
        if len(set(out)) < len(out):  # (repeated features under repeated column names)
            raise ValueError(f"layers must name each block at most once (negative ints "
                             f"count from the top), got {layers!r}.")
        return out

    def transform(self, X: ArrayLike, layers: Layers = "all",
                  spatial_pool: int | Sequence[int] | None = None) -> np.ndarray:
        """Pooled block outputs, concatenated: the linear-probe features.

        No gradients, no batch statistics (no BatchNorm): each image's features
        depend on that image only, so the result does not depend on batching (up to
        float rounding: CPU convolutions round by batch size, about 1e-7).

        Parameters
        ----------
        X : array-like or Tensor of shape (n_samples, C, H, W) or (n_samples, H, W)
            Images (numpy, torch or nested lists) of the training images' shape
            ``input_shape_`` and scale; ``(n, H, W)`` is one-channel.
        layers : "all", int or list of int, default="all"
            Which blocks' features to concatenate, in the given order (0 is the
            first block; negative ints count from the top), each block at most once.
        spatial_pool : None, int or list (or 1-D array) of int, default=None
            Pooling grid of the features; ``None`` uses the training grids
            (``grids_``). The official evaluation pools every model's blocks with
            the same grid whatever its training loss pooled (e.g. the globally
            pooled CLAPP++ is probed on spatial grids), which this reproduces.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
            ``sum(channels[l] * g[l] ** 2 for l in layers)`` features, float32
            (``layer_dims_`` with the training grids). Under
            ``set_output(transform="pandas")`` a DataFrame whose columns are
            ``get_feature_names_out(layers=layers, spatial_pool=spatial_pool)``.
        """
        X = self._check_images(X, reset=False)
        chosen = self._layer_list(layers)
        grids = self._feature_grids(spatial_pool)
        dev = self._resolved_device
        self.encoder_.eval()

        finite = [True]

        def chunk(rows: slice) -> torch.Tensor:
            h = self._pooled(X[rows].to(dev), detach=True, grids=grids)
            f = torch.cat([h[i] for i in chosen], dim=1)
            # checked per chunk: torch.isfinite of the whole output allocates
            # temporaries larger than the output itself
            finite[0] = finite[0] and bool(torch.isfinite(f).all())
            return f.cpu()

        with torch.no_grad():
            # each chunk's features are written into one output allocated once: a list
            # of the chunks' features concatenated at the end would hold the features
            # twice, and pin the heap between the network's large transient activations
            # (mlpapers._utils._blocks)
            feats = collect_row_blocks(chunk, X.shape[0], _TRANSFORM_CHUNK)
        if not finite[0]:
            raise ValueError(
                f"X gives non-finite features (float32 overflow; images with values up to "
                f"{float(X.abs().max()):.3g}): pass images on the scale of the training "
                "images, e.g. in [0, 1].")
        return self._wrap_output(self._to_numpy(feats), X, chosen, grids)

    def _wrap_output(self, out: np.ndarray, X: Any, layers: list[int], grids: list[int]):
        """The ``set_output`` container of ``out``, its columns named for these
        ``layers`` and pooling ``grids`` (ndarray unless configured otherwise)."""
        from sklearn.utils._set_output import ADAPTERS_MANAGER, _get_output_config

        dense = _get_output_config("transform", self)["dense"]
        if dense == "default":
            return out
        return ADAPTERS_MANAGER.adapters[dense].create_container(
            out, X, columns=lambda: self.get_feature_names_out(layers=layers,
                                                               spatial_pool=grids),
            inplace=False)

    def get_feature_names_out(self, input_features: Any = None, layers: Layers = "all",
                              spatial_pool: int | Sequence[int] | None = None) -> np.ndarray:
        """Names of the :meth:`transform` features.

        ``"<class>_layer{l}_ch{c}"`` for a globally pooled block and
        ``"<class>_layer{l}_ch{c}_y{i}_x{j}"`` for a grid cell.

        Parameters
        ----------
        input_features : ignored
            Present for scikit-learn API compatibility.
        layers : "all", int or list of int, default="all"
            The blocks, as in :meth:`transform`.
        spatial_pool : None, int or list (or 1-D array) of int, default=None
            The pooling grids, as in :meth:`transform`.

        Returns
        -------
        ndarray of str of shape (n_features,)
            One name per column of ``transform(X, layers=layers,
            spatial_pool=spatial_pool)``, in its order (object dtype).
        """
        self._check_fitted()
        prefix = type(self).__name__.lower()
        grids = self._feature_grids(spatial_pool)
        names = []
        for i in self._layer_list(layers):
            g = grids[i]
            for c in range(self.encoder_.channels[i]):
                if g == 1:
                    names.append(f"{prefix}_layer{i}_ch{c}")
                else:
                    names += [f"{prefix}_layer{i}_ch{c}_y{a}_x{b}"
                              for a in range(g) for b in range(g)]
        return np.asarray(names, dtype=object)

    # -- persistence ------------------------------------------------------------------
    def _get_state(self) -> dict[str, Any]:
        return {
            "encoder": self.encoder_.state_dict(),
            "heads": self.heads_.state_dict(),
            "input_shape_": list(self.input_shape_),
            "history_": self.history_,
            "n_features_in_": self.n_features_in_,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Save the parameters and the fitted encoder (``torch.load(weights_only=True)``-safe).

        A :class:`DefaultAugment` given as ``augment`` is stored by its settings and
        rebuilt on load. Any other callable is code, which a safe file cannot hold: it
        is left out (:meth:`transform` does not need it), and training the loaded
        encoder again needs it back (``load(path, augment=...)`` or ``set_params``).

        Parameters
        ----------
        path : str or path-like
            Destination file.

        Raises
        ------
        ValueError
            If a parameter that defines the network (the architecture, pooling grids,
            variant's heads, patch geometry or projection) was changed by ``set_params``
            after ``fit`` to a value that builds another network: ``load`` rebuilds the
            network from the saved parameters. Values that resolve to the fitted network
            (``architecture="tiny"`` and its blocks written out, ``spatial_pool=None``
            and the grids it gives, an option the variant or loss ignores) are saved.
            Also any parameter value :meth:`load` would refuse (the file could not be
            read back), as :meth:`fit` would.
        """
        # load validates the parameters: a value set after fit that load would refuse
        # (even one the variant ignores) must not be written; a copy keeps the fitted
        # encoder's resolved blocks as they are
        copy.copy(self)._check_params()
        if hasattr(self, "encoder_"):
            self._check_structure(self._STRUCTURE_PARAMS,
                                  "the file would rebuild another network on load")
        aug = self.augment
        if aug is None or isinstance(aug, str):
            super().save(path)
            return
        self._save_storing(path, "augment", {_DEFAULT_AUGMENT_TAG: _augment_settings(aug)}
                           if type(aug) is DefaultAugment else _CUSTOM_AUGMENT)

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: Any = "cpu", *,
             augment: Callable[..., Any] | None = None) -> Self:
        """Load an encoder written by :meth:`save`, safely (``weights_only=True``).

        Parameters
        ----------
        path : str or path-like
            File written by :meth:`save`.
        map_location : str or torch.device, default="cpu"
            Where its tensors are loaded, as for ``torch.load``; the encoder then
            computes on its ``device`` parameter (a saved device this machine does
            not have becomes this one, with a warning).
        augment : callable or None, default=None
            The custom augment the encoder was saved with (only for such a file;
            needed to train it again, not to transform).

        Returns
        -------
        encoder
            A fitted instance of this class.
        """
        est = super().load(path, map_location=map_location)
        if augment is not None:
            if not (isinstance(est.augment, str) and est.augment == _CUSTOM_AUGMENT):
                raise ValueError(f"{os.fspath(path)!r} was saved with augment="
                                 f"{est.augment!r}, which is restored on load; do not pass "
                                 "augment=.")
            if not callable(augment):
                raise TypeError(f"augment must be a callable augment(x, generator) -> x, "
                                f"got {type(augment).__name__}.")
            est.augment = augment
        return est

    def _set_state(self, state: dict[str, Any]) -> None:
        aug = self.augment  # a DefaultAugment stored by its settings (save)
        if isinstance(aug, dict) and set(aug) == {_DEFAULT_AUGMENT_TAG}:
            self.augment = DefaultAugment(**aug[_DEFAULT_AUGMENT_TAG])
        self._check_params()
        # the throwaway initialisation draws from a private generator, not the global torch
        # RNG, and the modules are built outside the caller's inference_mode (inference
        # parameters could never be trained or differentiated, e.g. by update_similarity)
        with autograd_enabled():
            self._build(tuple(state["input_shape_"]), torch.Generator())
            self.encoder_.load_state_dict(state["encoder"])
            self.heads_.load_state_dict(state["heads"])
        self.encoder_.eval()
        self.history_ = state["history_"]
        self.n_features_in_ = state["n_features_in_"]

    # -- hooks ----------------------------------------------------------------------------
    def _check_params(self) -> None:  # pragma: no cover - overridden
        self._check_common_params()

    def _default_grid(self) -> int:  # pragma: no cover - overridden
        return 2

    def _build_heads(self, dims: list[int], generator) -> nn.ModuleList:  # pragma: no cover
        raise NotImplementedError

    def _batch_losses(self, views: torch.Tensor, neg_idx: torch.Tensor
                      ) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError
