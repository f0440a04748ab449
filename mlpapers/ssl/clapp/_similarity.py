"""Per-block similarity between local CLAPP updates and the backprop update."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import torch

from mlpapers._utils import (
    ArrayLike,
    check_generator,
    check_in_options,
    check_positive,
    on_inputs_device,
    with_autograd,
)

if TYPE_CHECKING:
    from mlpapers.ssl.clapp._estimator import CLAPPEncoder

__all__ = ["update_similarity"]

#: ``update_similarity(reference=...)``; ``REFERENCES`` lists its values.
Reference: TypeAlias = Literal["bp"]
REFERENCES: tuple[str, ...] = get_args(Reference)


def _flat_grads(loss: torch.Tensor, blocks) -> list[torch.Tensor]:
    params = [list(b.parameters()) for b in blocks]
    flat = [p for ps in params for p in ps]
    grads = torch.autograd.grad(loss, flat, allow_unused=True, retain_graph=False)
    out, k = [], 0
    for ps in params:
        g = [torch.zeros_like(p) if gr is None else gr
             for p, gr in zip(ps, grads[k:k + len(ps)])]
        out.append(torch.cat([x.reshape(-1) for x in g]))
        k += len(ps)
    return out


# it differentiates the encoder's losses: autograd on even inside the caller's no_grad /
# inference_mode block (its result is a dict of floats, no graph escapes)
@on_inputs_device
@with_autograd
def update_similarity(encoder: CLAPPEncoder, X: ArrayLike, *, reference: Reference = "bp",
                      n_batches: int = 10, batch_size: int | None = None,
                      random_state: Any = None) -> dict[int, float]:
    r"""Cosine between every block's local update and its backprop update.

    For each of ``n_batches`` random batches of ``X``, the same two augmented
    views and the same negatives are used twice, on the same weights: once for
    the sum of the encoder's layer-local losses (block inputs detached), once for
    the top block's loss backpropagated through the whole network (the
    BP-CLAPP gradient). For every block the cosine between the two raw gradients
    (all the block's parameters, flattened) is averaged over batches, as in the
    paper's gradient analysis. The top block's cosine is 1 by construction, except
    that a batch on which a block's gradient is exactly zero (every hinge term
    satisfied) counts as a cosine of 0 for that block, as ``cosine_similarity`` gives
    in the official analysis; such batches lower the mean.

    Parameters
    ----------
    encoder : CLAPPEncoder
        A fitted encoder.
    X : array-like of shape (n_samples, C, H, W) or (n_samples, H, W)
        Images (at least 2).
    reference : {"bp"}, default="bp"
        The reference update: backprop of the top block's loss.
    n_batches : int, default=10
        Number of random batches the cosines are averaged over.
    batch_size : int or None, default=None
        ``None`` uses the encoder's ``batch_size``.
    random_state : int, RandomState, numpy Generator, torch.Generator or None, default=None
        Seeds batches, views and negatives; per batch, one torch generator draws
        in this order: the batch (a ``randperm`` of ``X``'s rows, first ``batch_size``
        kept), the two views (the encoder's augmentation), the negatives.

    Returns
    -------
    dict of int to float
        Block index (0 = first block) to the mean cosine similarity.

    References
    ----------
    .. [1] Wu S. Zihan, A. Delrocq, W. Gerstner and G. Bellec, "Can Local Learning
       Match Self-Supervised Backpropagation?", ICML 2026, arXiv:2601.21683.

    Examples
    --------
    >>> from mlpapers.datasets import make_shifted_digits
    >>> from mlpapers.ssl import CLAPPEncoder, update_similarity
    >>> X, _ = make_shifted_digits(n_samples=64, random_state=0)
    >>> enc = CLAPPEncoder(architecture="tiny", n_epochs=1, random_state=0).fit(X)
    >>> sim = update_similarity(enc, X, n_batches=2, random_state=0)
    >>> round(sim[2], 6)
    1.0
    """
    check_in_options(reference, "reference", REFERENCES)
    check_positive(n_batches, "n_batches", integer=True)
    if not hasattr(encoder, "_layer_losses"):
        raise TypeError("update_similarity expects a CLAPPEncoder, got "
                        f"{type(encoder).__name__}.")
    X = encoder._check_images(X, reset=False)
    encoder._check_structure(encoder._HEAD_PARAMS, "its losses would not match the fitted "
                             "prediction heads")
    bs = encoder.batch_size if batch_size is None else batch_size
    check_positive(bs, "batch_size", integer=True)
    bs = min(bs, X.shape[0])
    if bs < 2:
        raise ValueError(f"update_similarity needs batches of >= 2 images, got {bs}.")
    gen = check_generator(random_state)
    augment = encoder._augment_fn()
    blocks = list(encoder.encoder_.blocks)
    sums = torch.zeros(len(blocks), dtype=torch.float64)
    for _ in range(n_batches):
        views, neg = encoder._random_batch(X, bs, augment, gen)
        local = _flat_grads(encoder._layer_losses(views, neg, detach=True).sum(), blocks)
        glob = _flat_grads(encoder._layer_losses(views, neg, detach=False)[-1], blocks)
        for i, (a, b) in enumerate(zip(local, glob)):
            sums[i] += float(torch.nn.functional.cosine_similarity(
                a.double(), b.double(), dim=0, eps=1e-30))
    return {i: float(s / n_batches) for i, s in enumerate(sums)}
