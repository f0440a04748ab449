"""GlobalSSLEncoder: the end-to-end backprop baselines (BP-CLAPP, BP-InfoNCE)."""

from __future__ import annotations

from typing import Literal, cast

import torch
from torch import nn

from mlpapers._utils import RandomStateLike, check_in_options, check_positive
from mlpapers.ssl.clapp._base_encoder import Architecture, Augment, SpatialPool, _SSLImageEncoder
from mlpapers.ssl.clapp._kernels import (
    check_temperature,
    clapp_layer_loss,
    infonce_loss,
    negative_indices,
    swap_views,
)
from mlpapers.ssl.clapp._networks import linear, materialize

__all__ = ["GlobalSSLEncoder"]


class GlobalSSLEncoder(_SSLImageEncoder):
    r"""The end-to-end backprop baselines: one SSL loss at the top block.

    Same network, augmentations, pooling and training loop as
    :class:`CLAPPEncoder`, but block inputs are not detached and only the top
    block has a loss, whose gradient flows through every block.

    Parameters
    ----------
    loss : {"clapp", "infonce", "infonce-cross", "bp-clapp", "bp-infonce"}, default="clapp"
        ``"clapp"`` (BP-CLAPP++; ``"bp-clapp"`` is the same): the hinge CLAPP loss
        :math:`f(z_L^\top B_L c_L)` of the top block with a detached context from
        the other view; ``"infonce"`` (BP-InfoNCE, SimCLR; ``"bp-infonce"`` is the
        same): a linear projection to
        ``projection_dim`` and NT-Xent with cosine similarity and ``temperature``
        (views crossed, all other rows of the batch as negatives, both
        directions); ``"infonce-cross"``: the same projection with the official
        CLAPP++ code's InfoNCE, each view-A image against the view-B images only,
        in one direction (:func:`~mlpapers.ssl.clapp.infonce_loss` with
        ``pairs="cross"``).
    temperature : float, default=0.1
        InfoNCE temperature :math:`\tau > 0` of the ``"infonce"`` losses (unused
        by ``"clapp"``).
    projection_dim : int, default=128
        Width of the linear projection of the ``"infonce"`` losses (unused by
        ``"clapp"``). The paper projects to 1024 on STL-10; smaller suits the small default.
    architecture, spatial_pool, negatives, augment : see CLAPPEncoder
        As in :class:`CLAPPEncoder` (``spatial_pool=None`` means 2). ``negatives``
        applies to ``"clapp"`` only: the ``"infonce"`` losses contrast every other
        row of the batch, so their fits do not depend on it.
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
    #: The baselines' names in the paper and the issue, accepted as ``loss``.
    _LOSS_ALIASES = {"bp-clapp": "clapp", "bp-infonce": "infonce"}

    def __init__(
        self,
        *,
        loss: Literal["clapp", "infonce", "infonce-cross", "bp-clapp", "bp-infonce"] = "clapp",
        temperature: float = 0.1,
        projection_dim: int = 128,
        architecture: Architecture = "small",
        spatial_pool: SpatialPool = None,
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

    _STRUCTURE_PARAMS = ("loss", "projection_dim", "architecture", "spatial_pool")
    _HEAD_PARAMS = ("loss", "projection_dim")

    @classmethod
    def _resolved_head(cls, name: str, loss, projection_dim):
        """The head ``loss`` builds (the ``"clapp"`` predictor, "bp-clapp" included, or
        the InfoNCE projection, the same for both InfoNCE losses) and ``projection_dim``
        as the head reads it (nothing for ``"clapp"``, which has no projection)."""
        kind = cls._LOSS_ALIASES.get(loss, loss) if isinstance(loss, str) else loss
        if name == "loss":
            return {"clapp": "predictor", "infonce": "projection",
                    "infonce-cross": "projection"}.get(kind, kind)
        return None if kind == "clapp" else projection_dim

    def _structure_value(self, name: str):
        if name in ("loss", "projection_dim"):
            return self._resolved_head(name, self.loss, self.projection_dim)
        return super()._structure_value(name)

    def _fitted_structure_value(self, name: str):
        if name in ("loss", "projection_dim"):
            fitted = self._fitted_structure
            return self._resolved_head(name, fitted.get("loss"), fitted.get("projection_dim"))
        return super()._fitted_structure_value(name)

    def _check_params(self) -> None:
        check_in_options(self.loss, "loss", ("clapp", "infonce", "infonce-cross",
                                             *self._LOSS_ALIASES))
        check_temperature(self.temperature)
        check_positive(self.projection_dim, "projection_dim", integer=True)
        self._check_common_params()

    def _default_grid(self) -> int:
        return 2

    def _loss_kind(self) -> str:
        """``loss`` with the ``"bp-"`` aliases resolved (the parameter is kept verbatim)."""
        return self._LOSS_ALIASES.get(self.loss, self.loss)

    def _build_heads(self, dims, generator) -> nn.ModuleList:
        d = dims[-1]
        out = d if self._loss_kind() == "clapp" else self.projection_dim
        return materialize(nn.ModuleList([linear(d, out)]), generator)

    def _negatives(self, n_images: int, gen, device):
        if self._loss_kind() != "clapp":
            # InfoNCE contrasts every other row and never reads the indices: drawing
            # random ones would still consume the generator and shift the augmentations,
            # so negatives="random" changed an InfoNCE fit it has no part in
            return negative_indices(n_images, mode="next", device=device)
        return super()._negatives(n_images, gen, device)

    def _batch_losses(self, views, neg_idx):
        top = self._pooled(views, detach=False)[-1]
        head = cast(nn.Linear, self.heads_[0])  # (the one head _build_heads makes)
        kind = self._loss_kind()
        if kind == "clapp":
            loss = clapp_layer_loss(swap_views(top), top.detach(), head.weight, neg_idx,
                                    "hinge")
        else:
            pairs = "cross" if kind == "infonce-cross" else "all"
            loss = infonce_loss(head(top), self.temperature, pairs)
        return loss[None]
