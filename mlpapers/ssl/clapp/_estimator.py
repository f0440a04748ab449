"""CLAPPEncoder: layer-local self-supervised learning (CLAPP++ variants and the 2021 CLAPP)."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias, get_args

import torch
from torch import nn

from mlpapers._utils import RandomStateLike, check_in_options, check_positive
from mlpapers.ssl.clapp._base_encoder import Architecture, Augment, SpatialPool, _SSLImageEncoder
from mlpapers.ssl.clapp._global import GlobalSSLEncoder
from mlpapers.ssl.clapp._kernels import LOSSES, LayerLoss, clapp_layer_loss, swap_views
from mlpapers.ssl.clapp._networks import linear, materialize, pool_representations
from mlpapers.ssl.clapp._patches import (
    SKIP_STEP,
    PatchPredictor,
    extract_patches,
    patch_grid,
    patch_representations,
)

__all__ = ["VARIANTS", "CLAPPEncoder", "GlobalSSLEncoder"]

#: The layer-local variants of :class:`CLAPPEncoder` (VARIANTS lists them).
Variant: TypeAlias = Literal["clapp", "clapp++", "clapp++dfb", "clapp++both", "clapp2021"]
VARIANTS: tuple[str, ...] = get_args(Variant)

#: The official 2021 number of prediction steps (rows below the context patch).
_MAX_STEPS_2021 = 5


class CLAPPEncoder(_SSLImageEncoder):
    r"""Self-supervised image encoder trained by layer-local CLAPP / CLAPP++ rules.

    Every block :math:`l` of a VGG-like network (no BatchNorm) has its own loss on
    the score :math:`u = z_l^\top B_l c_l`, with :math:`z_l` the pooled block
    output for one augmented view of an image, :math:`c_l` a *detached* context
    from the other view and :math:`B_l` a trainable prediction matrix:

    .. math:: L_l = f(z_l^{+\top} B_l c_l) + f(-z_l^{-\top} B_l c_l),
              \qquad f(u) = \mathrm{relu}(1 - u)\ \text{(hinge)},

    where :math:`z^-` is the representation of another image of the batch.
    Block inputs are detached, so the gradient of :math:`L_l` reaches block
    :math:`l` and :math:`B_l` only: the update of each weight is a local
    three-factor rule (see :func:`~mlpapers.ssl.clapp.three_factor_grad`). The views
    are swapped so both directions count.

    Training runs each block's backward pass right after its forward pass, so only
    one block's autograd graph is alive at a time (for ``"clapp++dfb"`` and
    ``"clapp++both"`` a first, gradient-free sweep computes the top-block context:
    the feedback arrives after the feedforward pass). The gradients are exactly
    those of the summed block losses.

    ``variant="clapp2021"`` is the original patch-prediction CLAPP [2]_: a single
    view per image is cut into overlapping patches (``patch_size``,
    ``patch_stride``), the encoder runs on every patch, and each block's context
    :math:`c_t` at patch position :math:`t` predicts the representation of the
    patch :math:`k + 1` rows below, :math:`u = z_{t+k+1}^\top W_k c_t`
    (``k = 1..prediction_steps``, one :math:`W_k` per step), against the patch at
    the same position in another image; the score is split asymmetrically as in
    the official code (see :class:`~mlpapers.ssl.clapp.PatchPredictor`).

    Parameters
    ----------
    variant : {"clapp++dfb", "clapp", "clapp++", "clapp++both", "clapp2021"}, default="clapp++dfb"
        Where the context comes from. ``"clapp"``: the same block of the other
        view, globally average-pooled; ``"clapp++"``: the same, pooled to a small
        spatial grid (``spatial_pool``); ``"clapp++dfb"``: direct feedback, the
        *top* block of the other view for every block; ``"clapp++both"``: the
        direct-feedback loss plus an extra lateral loss, each with its own
        prediction matrix (the official ``--extra_lateral_loss``);
        ``"clapp2021"``: the 2021 patch prediction within one view (above).
    architecture : str or list of blocks, default="small"
        ``"small"`` = ``[(32,), (64, "M"), (64,), (128, "M")]`` (CPU sized),
        ``"tiny"``, ``"vgg6"`` (the paper's 6 blocks) or a list of blocks whose
        entries are conv channel counts (3x3 conv + ReLU) and ``"M"`` (2x2 max-pool).
    loss : {"hinge", "softhinge", "linear"}, default="hinge"
        The decreasing function ``f`` of the score.
    spatial_pool : None, int or list (or 1-D array) of int, default=None
        Side of the average-pooling grid of every block's output, used by the
        losses and by :meth:`transform` (which can pool to another grid, e.g. the
        same grid for every variant as the official evaluation does, with
        ``transform(X, spatial_pool=g)``). ``None``: 1 for ``"clapp"``, else 2. For
        ``"clapp2021"`` the grid pools the patch grid of per-patch vectors and is
        used by :meth:`transform` only (``None``: 1, the official patch average).
    patch_size : int or None, default=None
        ``"clapp2021"`` only: patch side in pixels. ``None``: a quarter of the
        smaller image side (at least 2), the official 16 px on 64 px crops.
    patch_stride : int or None, default=None
        ``"clapp2021"`` only: step between patches; ``None``: ``patch_size // 2``
        (the official overlap factor 2).
    prediction_steps : int or None, default=None
        ``"clapp2021"`` only: number ``K`` of predicted rows (``k + 1`` rows below
        the context for ``k = 1..K``). ``None``: the official 5, or fewer when the
        patch grid has fewer than 7 rows. The two-view variants have no patches and
        ignore ``patch_size``, ``patch_stride`` and ``prediction_steps`` (as every
        variant ignores the options only another one reads), so one set of keyword
        arguments serves a comparison of variants, e.g. a grid search over ``variant``.
    negatives : {"next", "random"}, default="next"
        Negative of each row: the next row of the shuffled two-view batch (the
        official default) or a random other image.
    augment : "default", "light", None or callable, default="default"
        ``"default"`` is :class:`DefaultAugment` (the paper's random resized
        crop, flip, jitter, blur); ``"light"`` is :meth:`DefaultAugment.light`
        (no flip, milder crops and jitter: better for digits); a callable
        ``augment(x, generator) -> x`` on ``(N, C, H, W)`` tensors, or
        ``augment(x) -> x`` when its signature takes one required argument (e.g. an
        ``nn.Module``; each call gets
        its own copy of the batch, with the global torch RNG seeded from
        ``random_state``; its output is checked: see the user guide, "Your own
        augmentation"); ``None`` uses identical views.
    n_epochs : int, default=20
        Passes over the training images (``0`` builds the initialised network
        without training, e.g. for a random-features baseline).
    batch_size : int, default=32
        Images per training batch (>= 2: the negatives are the batch's other
        images); the paper's batch size.
    lr : float, default=1e-3
        AdamW learning rate (the paper uses 2e-4 for 300 epochs; the larger
        default suits the short CPU schedules this library targets).
    weight_decay : float, default=0.0
        AdamW's decoupled weight decay (>= 0).
    device : str or torch.device, default="cpu"
        Where the network is trained and applied: ``"cpu"``, ``"cuda"``,
        ``"cuda:N"``, ``"mps"`` or ``"auto"`` (CUDA when available).
    random_state : int, RandomState, Generator or None, default=None
        Seeds the initialisation, shuffling, augmentations and negatives.
    verbose : int, default=0
        ``> 0`` shows a per-epoch progress bar with the per-block losses.

    Attributes
    ----------
    encoder_ : VGGEncoder
        The trained network.
    heads_ : torch.nn.ModuleList
        The prediction matrices :math:`B_l` (``nn.Linear`` without bias), or a
        ``PatchPredictor`` per block for ``"clapp2021"``.
    grids_ : list of int
        Pooling grid side per block.
    patch_grid_ : tuple of int or None
        ``"clapp2021"``: ``(patch_size, patch_stride, n_y, n_x, prediction_steps)``;
        ``None`` for the other variants.
    layer_dims_ : list of int
        Feature width per block (``channels * grid**2``).
    input_shape_ : tuple of int
        ``(C, H, W)`` of the training images.
    n_features_in_ : int
        ``C * H * W``.
    history_ : list of dict
        Per epoch: ``epoch``, total ``loss`` and ``loss_l{i}`` per block.

    See Also
    --------
    GlobalSSLEncoder : the end-to-end backprop baselines on the same network.
    update_similarity : cosine between local and backprop updates per block.

    References
    ----------
    .. [1] Wu S. Zihan, A. Delrocq, W. Gerstner and G. Bellec, "Can Local Learning
       Match Self-Supervised Backpropagation?", ICML 2026, arXiv:2601.21683.
    .. [2] B. Illing, J. Ventura, G. Bellec and W. Gerstner, "Local plasticity
       rules can learn deep representations using self-supervised contrastive
       predictions", NeurIPS 2021, arXiv:2010.08262.

    Examples
    --------
    >>> from mlpapers.datasets import make_shifted_digits
    >>> from mlpapers.ssl import CLAPPEncoder
    >>> X, y = make_shifted_digits(n_samples=64, random_state=0)
    >>> enc = CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0).fit(X)
    >>> enc.transform(X).shape
    (64, 448)
    >>> sorted(enc.history_[-1])
    ['epoch', 'loss', 'loss_l0', 'loss_l1', 'loss_l2']
    """

    def __init__(
        self,
        *,
        variant: Variant = "clapp++dfb",
        architecture: Architecture = "small",
        loss: LayerLoss = "hinge",
        spatial_pool: SpatialPool = None,
        patch_size: int | None = None,
        patch_stride: int | None = None,
        prediction_steps: int | None = None,
        negatives: Literal["next", "random"] = "next",
        augment: Augment = "default",
        n_epochs: int = 20,
        batch_size: int = 32,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        device: str | torch.device = "cpu",
        random_state: RandomStateLike = None,
        verbose: int = 0,
    ) -> None:
        self.variant = variant
        self.architecture = architecture
        self.loss = loss
        self.spatial_pool = spatial_pool
        self.patch_size = patch_size
        self.patch_stride = patch_stride
        self.prediction_steps = prediction_steps
        self.negatives = negatives
        self.augment = augment
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    _STRUCTURE_PARAMS = ("variant", "architecture", "spatial_pool", "patch_size",
                         "patch_stride", "prediction_steps")
    _HEAD_PARAMS = ("variant",)
    # the heads and loss code of each variant: "clapp" and "clapp++" differ only by the
    # default grid (spatial_pool, compared on its own), so a fitted "clapp" is a "clapp++"
    _HEAD_KIND = {"clapp": "lateral", "clapp++": "lateral", "clapp++dfb": "feedback",
                  "clapp++both": "both", "clapp2021": "patch"}
    # where the resolved patch parameters sit in patch_grid_
    _PATCH_FIELD = {"patch_size": 0, "patch_stride": 1, "prediction_steps": 4}

    @classmethod
    def _head_kind(cls, variant):
        return cls._HEAD_KIND.get(variant, variant) if isinstance(variant, str) else variant

    def _structure_value(self, name: str):
        if name == "variant":
            return self._head_kind(self.variant)
        if name in self._PATCH_FIELD:
            # the geometry these values give on the training images, nothing for the
            # two-view variants (which ignore them)
            if self.variant != "clapp2021":
                return None
            try:
                return self._patch_geometry(self.input_shape_)[self._PATCH_FIELD[name]]
            except (TypeError, ValueError):
                return getattr(self, name)
        return super()._structure_value(name)

    def _fitted_structure_value(self, name: str):
        if name == "variant":
            return self._head_kind(self._fitted_structure.get("variant"))
        if name in self._PATCH_FIELD:
            grid = getattr(self, "patch_grid_", None)
            return None if grid is None else grid[self._PATCH_FIELD[name]]
        return super()._fitted_structure_value(name)

    def _check_transform_structure(self) -> None:
        # transform encodes patches for "clapp2021" and whole images otherwise: across
        # that boundary the fitted network would be applied to the other input (the
        # other variants share one transform). Read from the fitted patch_grid_, not from
        # a record of the fit, so that encoders pickled or saved before the record existed
        # are checked too.
        patches = getattr(self, "patch_grid_", None) is not None
        if patches != (self.variant == "clapp2021"):
            fitted = getattr(self, "_fitted_structure", None) or {}
            then = fitted.get("variant")
            then = (repr(then) if then is not None else "'clapp2021'" if patches
                    else "a two-view variant")
            raise ValueError(
                f"{type(self).__name__} was fitted with other parameters than it holds now "
                f"(variant={then} -> {self.variant!r}, set after fit): transform would "
                "apply the fitted network to another variant's inputs (patches or whole "
                "images). Fit it again, or set the fitted values back.")

    def _check_params(self) -> None:
        if isinstance(self.variant, str) and self.variant in GlobalSSLEncoder._LOSS_ALIASES:
            # the paper's end-to-end baselines are another estimator (no local losses)
            raise ValueError(
                f"variant={self.variant!r} is a global backprop baseline, not a layer-local "
                f"variant: use GlobalSSLEncoder(loss={self.variant!r}) (the same as loss="
                f"{GlobalSSLEncoder._LOSS_ALIASES[self.variant]!r}); CLAPPEncoder's variants "
                f"are {list(VARIANTS)}.")
        check_in_options(self.variant, "variant", VARIANTS)
        check_in_options(self.loss, "loss", LOSSES)
        for name in ("patch_size", "patch_stride", "prediction_steps"):
            value = getattr(self, name)
            if value is not None:
                check_positive(value, name, integer=True)
        self._check_common_params()
        self._loss_names = tuple(f"loss_l{i}" for i in range(len(self._blocks)))

    def _default_grid(self) -> int:
        return 1 if self.variant in ("clapp", "clapp2021") else 2

    # -- the 2021 patch geometry ----------------------------------------------------------
    def _patch_geometry(self, shape: tuple[int, ...]) -> tuple[int, int, int, int, int]:
        """``(size, stride, n_y, n_x, steps)`` of ``"clapp2021"`` for images ``(C, H, W)``."""
        height, width = shape[1], shape[2]
        size = self.patch_size if self.patch_size is not None else max(2, min(height,
                                                                              width) // 4)
        stride = self.patch_stride if self.patch_stride is not None else max(1, size // 2)
        if size > min(height, width):
            raise ValueError(f"patch_size={size} is too large for images of size "
                             f"{height}x{width}.")
        n_y, n_x = patch_grid(height, width, size, stride)
        steps = self.prediction_steps
        if steps is None:
            steps = min(_MAX_STEPS_2021, n_y - SKIP_STEP - 1)
        if steps < 1 or steps + SKIP_STEP >= n_y:
            if self.prediction_steps is None:
                raise ValueError(
                    f"images of size {height}x{width} give {n_y} patch rows (patch_size="
                    f"{size}, patch_stride={stride}); clapp2021 needs at least {SKIP_STEP + 2}"
                    " rows. Use a smaller patch_size or patch_stride.")
            raise ValueError(
                f"images of size {height}x{width} give {n_y} patch rows (patch_size={size}, "
                f"patch_stride={stride}), too few for prediction_steps={steps}: the grid needs "
                f"more than prediction_steps + {SKIP_STEP} rows. Use a smaller patch_size or "
                "patch_stride, or fewer prediction_steps.")
        return size, stride, n_y, n_x, steps

    def _fitted_patch_grid(self) -> tuple[int, int, int, int, int]:
        """``patch_grid_`` where ``variant="clapp2021"`` (set by ``_check_sizes``; the
        fitted-structure check keeps the other variants' fits from these code paths)."""
        assert self.patch_grid_ is not None  # internal invariant, not a user input check
        return self.patch_grid_

    def _check_sizes(self, shape: tuple[int, ...]) -> None:
        if self.variant != "clapp2021":
            self.patch_grid_ = None
            super()._check_sizes(shape)
            return
        size, stride, n_y, n_x, steps = self._patch_geometry(shape)
        self.patch_grid_ = (size, stride, n_y, n_x, steps)
        for i, ((h, w), g) in enumerate(zip(self.encoder_.map_sizes(size, size), self.grids_)):
            if min(h, w) < 1:
                raise ValueError(f"patches of {size}x{size} pixels are too small for the "
                                 f"architecture: block {i} has no output left after its "
                                 "max-pools. Use a larger patch_size or fewer 'M' max-pools.")
            if min(n_y, n_x) < g:
                raise ValueError(f"spatial_pool grid {g} of block {i} is larger than the "
                                 f"{n_y}x{n_x} patch grid.")

    def _check_view_size(self, size: tuple[int, ...]) -> None:
        if self.variant == "clapp2021" and size != tuple(self.input_shape_[1:]):
            # the patch grid (patch_grid_) and the predictors are fixed by the image size
            raise ValueError(f"augment returned views of size {size[0]}x{size[1]}; "
                             f"variant='clapp2021' needs views of the input size "
                             f"{self.input_shape_[1]}x{self.input_shape_[2]} (its patch "
                             "grid is fixed by the training images).")
        super()._check_view_size(size)

    # -- heads and contexts ---------------------------------------------------------------
    def _build_heads(self, dims, generator) -> nn.ModuleList:
        if self.variant == "clapp2021":
            steps = self._fitted_patch_grid()[4]
            return nn.ModuleList(PatchPredictor(c, steps, generator, dtype=torch.float32)
                                 for c in self.encoder_.channels)
        if self.variant in ("clapp", "clapp++"):
            heads = nn.ModuleList(linear(d, d) for d in dims)
        elif self.variant == "clapp++dfb":
            heads = nn.ModuleList(linear(dims[-1], d) for d in dims)
        else:                                   # "clapp++both": [feedback, lateral] per block
            heads = nn.ModuleList(nn.ModuleList([linear(dims[-1], d), linear(d, d)])
                                  for d in dims)
        return materialize(heads, generator)

    # -- representations ----------------------------------------------------------------
    def _encoder_input(self, views: torch.Tensor) -> torch.Tensor:
        """The first block's input: the views, or (2021) view A's patches."""
        if self.variant != "clapp2021":
            return views
        size, stride = self._fitted_patch_grid()[:2]
        return extract_patches(views, size, stride)[0]

    def _rep(self, block: int, out: torch.Tensor, n_images: int) -> torch.Tensor:
        """What block ``block``'s loss sees: (N, D) pooled, or (B, C, n_y, n_x) patches."""
        if self.variant != "clapp2021":
            return pool_representations([out], [self.grids_[block]])[0]
        _, _, n_y, n_x, _ = self._fitted_patch_grid()
        return patch_representations(out, n_images, n_y, n_x)

    def _pooled(self, views: torch.Tensor, detach: bool, grids: list[int] | None = None
                ) -> list[torch.Tensor]:
        if self.variant != "clapp2021":
            return super()._pooled(views, detach, grids)
        maps = self.encoder_(self._encoder_input(views), detach=detach)
        reps = [self._rep(i, m, views.shape[0]) for i, m in enumerate(maps)]
        return pool_representations(reps, self.grids_ if grids is None else grids)

    def _feature_map_sizes(self) -> list[tuple[int, int]]:
        if self.variant != "clapp2021":
            return super()._feature_map_sizes()
        _, _, n_y, n_x, _ = self._fitted_patch_grid()
        return [(n_y, n_x)] * len(self.grids_)   # the patch grid

    def _block_loss(self, block: int, h: torch.Tensor, top: torch.Tensor | None,
                    neg_idx: torch.Tensor) -> torch.Tensor:
        # a PatchPredictor, a Linear or a [feedback, lateral] pair of Linears, per variant
        head: Any = self.heads_[block]
        if self.variant == "clapp2021":
            return head.loss(h, neg_idx, self.loss)
        z = swap_views(h)                        # row i: the other view of row i's image
        if self.variant in ("clapp", "clapp++"):
            return clapp_layer_loss(z, h.detach(), head.weight, neg_idx, self.loss)
        assert top is not None  # _train_step / _layer_losses pass it for these variants
        if self.variant == "clapp++dfb":
            return clapp_layer_loss(z, top, head.weight, neg_idx, self.loss)
        return (clapp_layer_loss(z, top, head[0].weight, neg_idx, self.loss)      # "both"
                + clapp_layer_loss(z, h.detach(), head[1].weight, neg_idx, self.loss))

    def _split_2021(self, views: torch.Tensor, neg_idx: torch.Tensor):
        """``"clapp2021"`` uses one view per image: view A and its other-image negatives."""
        if self.variant != "clapp2021":
            return views, neg_idx
        b = views.shape[0] // 2
        return views[:b], neg_idx[:b] % b

    # -- losses -------------------------------------------------------------------------
    def _layer_losses(self, views: torch.Tensor, neg_idx: torch.Tensor, *,
                      detach: bool = True) -> torch.Tensor:
        """Per-block losses (shape ``(n_blocks,)``) of a two-view batch.

        With ``detach=False`` block inputs are not detached, so the last entry is
        the global (backprop) loss of the top block on the same views and negatives.
        """
        views, neg_idx = self._split_2021(views, neg_idx)
        maps = self.encoder_(self._encoder_input(views), detach=detach)
        h = [self._rep(i, m, views.shape[0]) for i, m in enumerate(maps)]
        top = h[-1].detach()
        return torch.stack([self._block_loss(i, x, top, neg_idx) for i, x in enumerate(h)])

    def _train_step(self, views: torch.Tensor, neg_idx: torch.Tensor) -> torch.Tensor:
        """Block by block: forward, loss, backward, free the graph, next block."""
        views, neg_idx = self._split_2021(views, neg_idx)
        n_images = views.shape[0]
        top = None
        if self.variant in ("clapp++dfb", "clapp++both"):
            with torch.no_grad():                  # feedback: a first, gradient-free sweep
                x = self._encoder_input(views)
                for block in self.encoder_.blocks:
                    x = block(x)
                top = self._rep(len(self.encoder_.blocks) - 1, x, n_images)
        x = self._encoder_input(views)
        losses = []
        for i, block in enumerate(self.encoder_.blocks):
            out = block(x)
            loss = self._block_loss(i, self._rep(i, out, n_images), top, neg_idx)
            loss.backward()                        # frees this block's graph
            losses.append(loss.detach())
            x = out.detach()
        return torch.stack(losses)
