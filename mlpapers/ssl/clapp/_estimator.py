"""CLAPPEncoder (layer-local self-supervised learning) and GlobalSSLEncoder (end-to-end BP)."""

from __future__ import annotations

import torch
from torch import nn

from mlpapers._utils import check_in_options, check_positive
from mlpapers.ssl.clapp._base_encoder import _SSLImageEncoder
from mlpapers.ssl.clapp._kernels import LOSSES, clapp_layer_loss, infonce_loss, swap_views
from mlpapers.ssl.clapp._networks import reset_parameters

__all__ = ["VARIANTS", "CLAPPEncoder", "GlobalSSLEncoder"]

#: The layer-local variants of :class:`CLAPPEncoder`.
VARIANTS = ("clapp", "clapp++", "clapp++dfb", "clapp++both")


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

    Parameters
    ----------
    variant : {"clapp++dfb", "clapp", "clapp++", "clapp++both"}, default="clapp++dfb"
        Where the context comes from. ``"clapp"``: the same block of the other
        view, globally average-pooled; ``"clapp++"``: the same, pooled to a small
        spatial grid (``spatial_pool``); ``"clapp++dfb"``: direct feedback, the
        *top* block of the other view for every block; ``"clapp++both"``: the
        concatenation of top and same-block contexts (as the official code).
    architecture : str or list of blocks, default="small"
        ``"small"`` = ``[(32,), (64, "M"), (64,), (128, "M")]`` (CPU sized),
        ``"tiny"``, ``"vgg6"`` (the paper's 6 blocks) or a list of blocks whose
        entries are conv channel counts (3x3 conv + ReLU) and ``"M"`` (2x2 max-pool).
    loss : {"hinge", "softhinge", "linear"}, default="hinge"
        The decreasing function ``f`` of the score.
    spatial_pool : None, int or list of int, default=None
        Side of the average-pooling grid of every block's output, used by the
        losses and by :meth:`transform`. ``None``: 1 for ``"clapp"``, else 2.
    negatives : {"next", "random"}, default="next"
        Negative of each row: the next row of the shuffled two-view batch (the
        official default) or a random other image.
    augment : "default", "light", None or callable, default="default"
        ``"default"`` is :class:`DefaultAugment` (the paper's random resized
        crop, flip, jitter, blur); ``"light"`` is :meth:`DefaultAugment.light`
        (no flip, milder crops and jitter: better for digits); a callable
        ``augment(x, generator) -> x`` on ``(N, C, H, W)`` tensors; ``None`` uses
        identical views.
    n_epochs : int, default=20
    batch_size : int, default=32
        The paper's batch size (>= 2).
    lr : float, default=1e-3
        AdamW learning rate (the paper uses 2e-4 for 300 epochs; the larger
        default suits the short CPU schedules this library targets).
    weight_decay : float, default=0.0
    device : str, default="cpu"
    random_state : int, RandomState or None, default=None
        Seeds the initialisation, shuffling, augmentations and negatives.
    verbose : int, default=0
        ``> 0`` shows a per-epoch progress bar with the per-block losses.

    Attributes
    ----------
    encoder_ : VGGEncoder
        The trained network.
    heads_ : torch.nn.ModuleList
        The prediction matrices :math:`B_l` (``nn.Linear`` without bias).
    grids_ : list of int
        Pooling grid side per block.
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

    def __init__(self, *, variant="clapp++dfb", architecture="small", loss="hinge",
                 spatial_pool=None, negatives="next", augment="default", n_epochs=20,
                 batch_size=32, lr=1e-3, weight_decay=0.0, device="cpu", random_state=None,
                 verbose=0):
        self.variant = variant
        self.architecture = architecture
        self.loss = loss
        self.spatial_pool = spatial_pool
        self.negatives = negatives
        self.augment = augment
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self) -> None:
        check_in_options(self.variant, "variant", VARIANTS)
        check_in_options(self.loss, "loss", LOSSES)
        self._check_common_params()
        self._loss_names = tuple(f"loss_l{i}" for i in range(len(self._blocks)))

    def _default_grid(self) -> int:
        return 1 if self.variant == "clapp" else 2

    def _context_dims(self, dims: list[int]) -> list[int]:
        if self.variant in ("clapp", "clapp++"):
            return list(dims)
        if self.variant == "clapp++dfb":
            return [dims[-1]] * len(dims)
        return [dims[-1] + d for d in dims]                      # "clapp++both"

    def _build_heads(self, dims, generator) -> nn.Module:
        heads = nn.ModuleList(
            nn.Linear(k, d, bias=False) for d, k in zip(dims, self._context_dims(dims))
        )
        reset_parameters(heads, generator)
        return heads

    def _contexts(self, h: list[torch.Tensor]) -> list[torch.Tensor]:
        """Detached context of every block (view-aligned with ``h``)."""
        top = h[-1].detach()
        if self.variant in ("clapp", "clapp++"):
            return [x.detach() for x in h]
        if self.variant == "clapp++dfb":
            return [top] * len(h)
        return [torch.cat([top, x.detach()], dim=1) for x in h]

    def _layer_losses(self, views: torch.Tensor, neg_idx: torch.Tensor, *,
                      detach: bool = True) -> torch.Tensor:
        """Per-block losses (shape ``(n_blocks,)``) of a two-view batch.

        With ``detach=False`` block inputs are not detached, so the last entry is
        the global (backprop) loss of the top block on the same views and negatives.
        """
        h = self._pooled(views, detach=detach)
        ctx = self._contexts(h)
        losses = [
            clapp_layer_loss(swap_views(z), c, head.weight, neg_idx, self.loss)
            for z, c, head in zip(h, ctx, self.heads_)
        ]
        return torch.stack(losses)

    def _batch_losses(self, views, neg_idx):
        return self._layer_losses(views, neg_idx, detach=True)


class GlobalSSLEncoder(_SSLImageEncoder):
    r"""The end-to-end backprop baselines: one SSL loss at the top block.

    Same network, augmentations, pooling and training loop as
    :class:`CLAPPEncoder`, but block inputs are not detached and only the top
    block has a loss, whose gradient flows through every block.

    Parameters
    ----------
    loss : {"clapp", "infonce"}, default="clapp"
        ``"clapp"`` (BP-CLAPP++): the hinge CLAPP loss :math:`f(z_L^\top B_L c_L)`
        of the top block with a detached context from the other view;
        ``"infonce"`` (BP-InfoNCE, SimCLR): a linear projection to
        ``projection_dim`` and NT-Xent with cosine similarity and ``temperature``
        (views crossed, all other rows of the batch as negatives).
    temperature : float, default=0.1
    projection_dim : int, default=128
        The paper projects to 1024 on STL-10; smaller suits the small default.
    architecture, spatial_pool, negatives, augment : see CLAPPEncoder
        As in :class:`CLAPPEncoder` (``spatial_pool=None`` means 2).
    n_epochs, batch_size, lr, weight_decay, device, random_state, verbose : see CLAPPEncoder
        As in :class:`CLAPPEncoder`.

    Attributes
    ----------
    encoder_, heads_, grids_, layer_dims_, input_shape_, n_features_in_, history_
        As in :class:`CLAPPEncoder`; ``heads_`` holds the top predictor or the
        projection, and ``history_`` a single ``loss_top`` per epoch.

    References
    ----------
    .. [1] Wu S. Zihan, A. Delrocq, W. Gerstner and G. Bellec, "Can Local Learning
       Match Self-Supervised Backpropagation?", ICML 2026, arXiv:2601.21683.
    .. [2] T. Chen, S. Kornblith, M. Norouzi and G. Hinton, "A Simple Framework
       for Contrastive Learning of Visual Representations", ICML 2020.

    Examples
    --------
    >>> from mlpapers.datasets import make_shifted_digits
    >>> from mlpapers.ssl import GlobalSSLEncoder
    >>> X, _ = make_shifted_digits(n_samples=64, random_state=0)
    >>> enc = GlobalSSLEncoder(loss="infonce", architecture="tiny", n_epochs=1,
    ...                        random_state=0).fit(X)
    >>> enc.transform(X, layers=-1).shape
    (64, 256)
    """

    _loss_names = ("loss_top",)

    def __init__(self, *, loss="clapp", temperature=0.1, projection_dim=128,
                 architecture="small", spatial_pool=None, negatives="next", augment="default",
                 n_epochs=20, batch_size=32, lr=1e-3, weight_decay=0.0, device="cpu",
                 random_state=None, verbose=0):
        self.loss = loss
        self.temperature = temperature
        self.projection_dim = projection_dim
        self.architecture = architecture
        self.spatial_pool = spatial_pool
        self.negatives = negatives
        self.augment = augment
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self) -> None:
        check_in_options(self.loss, "loss", ("clapp", "infonce"))
        check_positive(self.temperature, "temperature")
        check_positive(self.projection_dim, "projection_dim", integer=True)
        self._check_common_params()

    def _default_grid(self) -> int:
        return 2

    def _build_heads(self, dims, generator) -> nn.Module:
        d = dims[-1]
        out = d if self.loss == "clapp" else self.projection_dim
        heads = nn.ModuleList([nn.Linear(d, out, bias=False)])
        reset_parameters(heads, generator)
        return heads

    def _batch_losses(self, views, neg_idx):
        top = self._pooled(views, detach=False)[-1]
        head = self.heads_[0]
        if self.loss == "clapp":
            loss = clapp_layer_loss(swap_views(top), top.detach(), head.weight, neg_idx,
                                    "hinge")
        else:
            loss = infonce_loss(head(top), self.temperature)
        return loss[None]
