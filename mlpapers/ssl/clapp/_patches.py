"""The 2021 patch-prediction CLAPP (Illing et al., NeurIPS 2021): patches, predictors, loss.

The image is cut into a grid of overlapping square patches (the official code: 16 px
patches with stride 8 on 64 px crops, a 7 x 7 grid); the encoder runs on every patch
independently and each block's output map is averaged over the patch, giving one
vector per patch position. The loss of a block asks the context ``c_t`` at patch
position ``t = (y, x)`` to predict the representation ``z`` of the patch
``k + skip`` rows *below* (``k = 1..K``, ``skip = 1``: the official ``skip_step``,
so the nearest, overlapping row is never predicted), with one bilinear predictor
``W_k`` per step. The negative is the patch at the same position in another image of
the batch (the official ``--sample_negs_locally_same_everywhere``: one other image per
image, the same for every position).

References
----------
.. [1] B. Illing, J. Ventura, G. Bellec and W. Gerstner, "Local plasticity rules can
   learn deep representations using self-supervised contrastive predictions",
   NeurIPS 2021, arXiv:2010.08262.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from mlpapers._utils import ArrayLike, check_positive, common_float_dtype, requires_tensors
from mlpapers.ssl.clapp._kernels import check_pair_shapes, contrastive_loss

__all__ = ["PatchPredictor", "extract_patches", "patch_grid", "patch_prediction_loss",
           "patch_representations"]

#: Rows skipped between a context patch and the nearest predicted patch (official value).
SKIP_STEP = 1


def patch_grid(height: int, width: int, size: int, stride: int) -> tuple[int, int]:
    """Number of patch rows and columns, ``(n_y, n_x)``, of an image."""
    return (height - size) // stride + 1, (width - size) // stride + 1


@requires_tensors
def extract_patches(x: torch.Tensor, size: int, stride: int
                    ) -> tuple[torch.Tensor, int, int]:
    """Cut images into overlapping square patches.

    Parameters
    ----------
    x : Tensor of shape (B, C, H, W)
        Images at least ``size`` pixels a side.
    size, stride : int
        Patch side and step in pixels.

    Returns
    -------
    patches : Tensor of shape (B * n_y * n_x, C, size, size)
        Row-major per image: patch ``(b, i, j)`` is row ``(b * n_y + i) * n_x + j``.
    n_y, n_x : int
        The patch grid, ``(H - size) // stride + 1`` by ``(W - size) // stride + 1``
        (pixels beyond the last whole patch are dropped).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.ssl.clapp import extract_patches
    >>> x = torch.arange(2 * 8 * 6, dtype=torch.float32).reshape(2, 1, 8, 6)
    >>> patches, n_y, n_x = extract_patches(x, size=4, stride=2)
    >>> tuple(patches.shape), n_y, n_x
    ((12, 1, 4, 4), 3, 2)
    >>> bool((patches[(1 * n_y + 2) * n_x + 1] == x[1, :, 4:8, 2:6]).all())
    True
    """
    for name, v in (("size", size), ("stride", stride)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}.")
    if x.ndim != 4 or size > min(x.shape[2], x.shape[3]):
        raise ValueError(f"x must be images (B, C, H, W) of at least size={size} pixels "
                         f"a side, got shape {tuple(x.shape)}.")
    p = x.unfold(2, size, stride).unfold(3, size, stride)        # B, C, ny, nx, s, s
    b, c, ny, nx = p.shape[:4]
    p = p.permute(0, 2, 3, 1, 4, 5).reshape(b * ny * nx, c, size, size)
    return p, ny, nx


def patch_representations(maps: torch.Tensor, n_images: int, n_y: int, n_x: int
                          ) -> torch.Tensor:
    """Average each patch's block output map: one vector per patch position.

    Parameters
    ----------
    maps : Tensor of shape (B * n_y * n_x, D, h, w)
    n_images, n_y, n_x : int

    Returns
    -------
    Tensor of shape (B, D, n_y, n_x)
    """
    v = maps.mean(dim=(2, 3))                                      # (B*ny*nx, D)
    return v.reshape(n_images, n_y, n_x, -1).permute(0, 3, 1, 2)


@requires_tensors
def patch_prediction_loss(
    z: torch.Tensor, c: torch.Tensor, weight: torch.Tensor, neg_idx: ArrayLike,
    loss: str = "hinge", skip: int = SKIP_STEP,
) -> torch.Tensor:
    r"""The 2021 CLAPP loss: contexts predict the patches ``k + skip`` rows below.

    For every step :math:`k = 1..K` and every context position :math:`t = (y, x)`
    with a patch :math:`t + k + \mathrm{skip}` rows below,

    .. math:: u^\pm_{t,k} = z^{\pm\top}_{t+k+\mathrm{skip}}\, W_k\, c_t ,

    with :math:`z^+` the same image and :math:`z^-` image ``neg_idx[b]`` at the same
    position; the loss is :func:`contrastive_loss` averaged over images and
    positions, then over the :math:`K` steps (as the official code).

    Parameters
    ----------
    z : Tensor of shape (B, D, n_y, n_x)
        Patch representations that are predicted (trained through ``z``).
    c : Tensor of shape (B, K_c, n_y, n_x)
        Patch contexts (the caller detaches whichever side must not learn).
    weight : Tensor of shape (K, D, K_c)
        One prediction matrix :math:`W_k` per step.
    neg_idx : LongTensor or array-like of int of shape (B,)
        The other image whose patches are the negatives of each image, in ``[0, B)``.
    loss : {"hinge", "softhinge", "linear"}, default="hinge"
        The decreasing function ``f`` (:func:`contrastive_loss`).
    skip : int, default=1
        Rows skipped between a context and its nearest predicted patch (the
        official ``skip_step``), ``>= 0``; ``K + skip`` must be below ``n_y``.

    Returns
    -------
    Tensor of shape ()
        The loss, averaged over images, positions and steps.

    Examples
    --------
    With zero prediction matrices every score is 0, and the hinge loss is
    :math:`\mathrm{relu}(1 - 0) + \mathrm{relu}(1 + 0) = 2`:

    >>> import torch
    >>> from mlpapers.ssl.clapp import patch_prediction_loss
    >>> z = torch.randn(2, 4, 5, 3)                   # B=2 images, D=4, 5x3 patch grid
    >>> weight = torch.zeros(2, 4, 4)                  # K=2 steps
    >>> float(patch_prediction_loss(z, z, weight, torch.tensor([1, 0])))
    2.0
    """
    # a negative skip predicts rows at or above the context (for skip < -1 the slices
    # below have different lengths and broadcast into a wrong loss without an error)
    if isinstance(skip, bool) or not isinstance(skip, numbers.Integral) or skip < 0:
        raise ValueError(f"skip must be a non-negative int, got {skip!r}.")
    neg_idx = check_pair_shapes(tuple(z.shape), c, weight, neg_idx)
    # (mixed dtypes failed in the einsum)
    dtype = common_float_dtype(z, c, weight, names=("z", "c", "weight"))
    z, c, weight = z.to(dtype), c.to(dtype), weight.to(dtype)
    n_steps = weight.shape[0]
    n_y = z.shape[2]
    if n_steps + skip >= n_y:
        raise ValueError(f"{n_steps} prediction steps (+ skip {skip}) need more than "
                         f"{n_steps + skip} patch rows, got {n_y}.")
    total = z.new_zeros(())
    for k in range(1, n_steps + 1):
        off = k + skip
        zk = z[:, :, off:]                                         # (B, D, ny-off, nx)
        pred = torch.einsum("dk,bkyx->bdyx", weight[k - 1], c[:, :, :n_y - off])
        u_pos = (zk * pred).sum(1)                                 # (B, ny-off, nx)
        u_neg = (zk[neg_idx] * pred).sum(1)
        total = total + contrastive_loss(u_pos, u_neg, loss).mean()
    return total / n_steps


class PatchPredictor(nn.Module):
    r"""The prediction matrices of one block: ``W_k`` and their asymmetric mirror.

    The official CLAPP scripts use ``--asymmetric_W_pred``: the bilinear score
    :math:`z^\top W c` is split into :math:`z^\top W\,\mathrm{sg}(c)` (trains the
    predicted patch through ``weight``) and :math:`\mathrm{sg}(z)^\top W' c` (trains the
    context patch through ``mirror``), so no weight is ever transported.

    Parameters
    ----------
    dim : int
        Channels ``D`` of the block (context and target have the same width), >= 1.
    n_steps : int
        ``K``, the number of prediction steps, >= 1.
    generator : torch.Generator, optional
        Draws the initial weights (uniform in :math:`\pm 1/\sqrt{D}`, as
        ``nn.Linear``); ``None`` uses the global torch RNG.
    dtype : torch.dtype, optional
        Of the parameters; ``None`` follows ``torch.get_default_dtype()``, as
        ``nn.Linear`` does (:class:`CLAPPEncoder` passes float32).

    Attributes
    ----------
    weight, mirror : Parameter of shape (K, D, D)
        The prediction matrices :math:`W_k` and :math:`W'_k`.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.ssl.clapp import PatchPredictor
    >>> pred = PatchPredictor(4, n_steps=2, generator=torch.Generator().manual_seed(0))
    >>> tuple(pred.weight.shape), tuple(pred.mirror.shape)
    ((2, 4, 4), (2, 4, 4))
    >>> h = torch.randn(3, 4, 5, 5, requires_grad=True)     # (B, D, n_y, n_x)
    >>> loss = pred.loss(h, torch.tensor([1, 2, 0]))
    >>> loss.backward()
    >>> loss.shape, h.grad.shape
    (torch.Size([]), torch.Size([3, 4, 5, 5]))
    """

    def __init__(self, dim: int, n_steps: int, generator: torch.Generator | None = None, *,
                 dtype: torch.dtype | None = None):
        super().__init__()
        check_positive(dim, "dim", integer=True)
        check_positive(n_steps, "n_steps", integer=True)
        # (an int seed failed on generator.device with an AttributeError)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got "
                            f"{type(generator).__name__}.")
        bound = 1.0 / math.sqrt(dim)          # nn.Linear's default initialisation
        # a generator draws on its own device, so the weights are made there
        where = None if generator is None else generator.device  # (None: the default)
        self.weight = nn.Parameter(torch.empty(n_steps, dim, dim, dtype=dtype, device=where))
        self.mirror = nn.Parameter(torch.empty(n_steps, dim, dim, dtype=dtype, device=where))
        with torch.no_grad():
            for p in (self.weight, self.mirror):
                p.uniform_(-bound, bound, generator=generator)

    def loss(self, h: torch.Tensor, neg_idx: torch.Tensor, loss: str = "hinge"
             ) -> torch.Tensor:
        """Both halves of the asymmetric loss of patch representations ``h``.

        Parameters
        ----------
        h : Tensor of shape (B, D, n_y, n_x)
            Patch representations of one block; both the predicted (through
            ``weight``) and the context side (through ``mirror``) are trained.
        neg_idx : LongTensor of shape (B,)
            The other image whose patches are the negatives of each image.
        loss : {"hinge", "softhinge", "linear"}, default="hinge"
            The decreasing function ``f`` (:func:`contrastive_loss`).

        Returns
        -------
        Tensor of shape ()
            ``patch_prediction_loss(h, sg(h), weight) + patch_prediction_loss(
            sg(h), h, mirror)``, with ``sg`` the stop-gradient.
        """
        if h.ndim != 4 or h.shape[1] != self.weight.shape[1]:
            raise ValueError(f"h must have shape (B, {self.weight.shape[1]}, n_y, n_x), got "
                             f"{tuple(h.shape)}.")
        return (patch_prediction_loss(h, h.detach(), self.weight, neg_idx, loss)
                + patch_prediction_loss(h.detach(), h, self.mirror, neg_idx, loss))
