"""Sampled-softmax scores with shared negatives and a row-sparse primal step.

Used by :class:`~mlpapers.optim.scent.SCENTClassifier`. A step touches only the
rows of the weight matrix of the batch's positive classes and of the sampled
negatives, so its cost is :math:`O((B + k) d)` instead of :math:`O(C d)`.
"""

from __future__ import annotations

import torch


def shared_negatives(
    n_classes: int, n_negatives: int, y: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Negatives shared by the batch and, per anchor, which of them are valid.

    ``n_negatives`` classes are drawn uniformly with replacement from all
    ``n_classes`` classes (with ``n_negatives = n_classes - 1`` every class is
    used once instead); a draw equal to an anchor's own label is invalid for
    that anchor.

    Parameters
    ----------
    n_classes : int
    n_negatives : int
    y : torch.Tensor of int of shape (B,)
        Encoded labels of the anchors.
    generator : torch.Generator

    Returns
    -------
    neg : torch.Tensor of int of shape (k,)
        ``k = n_negatives``, or ``n_classes`` in the exhaustive case.
    valid : torch.Tensor of bool of shape (B, k)
    """
    if n_negatives >= n_classes - 1:
        neg = torch.arange(n_classes)
    else:
        neg = torch.randint(0, n_classes, (n_negatives,), generator=generator)
    neg = neg.to(y.device)
    return neg, neg[None, :] != y[:, None]


def sampled_scores(
    z_pos: torch.Tensor, z_neg: torch.Tensor, valid: torch.Tensor, n_classes: int,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""Shifted scores whose masked mean of ``exp`` is unbiased for the softmax sum.

    For anchor :math:`i` with valid negatives :math:`V_i` among ``k`` draws, the
    mean of :math:`e^{s}` over the :math:`1 + |V_i|` valid items equals
    :math:`\frac1C + \frac1k\sum_{u\in V_i} e^{(z_u - z_y)/\tau}`, an unbiased
    estimate of :math:`\frac1C\sum_{c} e^{(z_c - z_y)/\tau}`; the positive term
    is kept exactly. The shifts are constants, so gradients are unchanged.

    Parameters
    ----------
    z_pos : torch.Tensor of shape (B,)
        Logits of the anchors' own classes.
    z_neg : torch.Tensor of shape (B, k)
        Logits of the drawn negatives.
    valid : torch.Tensor of bool of shape (B, k)
    n_classes : int
    temperature : float

    Returns
    -------
    scores : torch.Tensor of shape (B, 1 + k)
        Column 0 is the (constant) positive item.
    mask : torch.Tensor of bool of shape (B, 1 + k) or None
        Valid items; ``None`` when all are valid.
    """
    B, k = z_neg.shape
    n_valid = 1.0 + valid.sum(dim=1).to(z_neg.dtype)  # (B,)
    c0 = torch.log(n_valid / n_classes)
    c1 = torch.log(n_valid / k)
    neg = (z_neg - z_pos[:, None]) / temperature + c1[:, None]
    scores = torch.cat([c0[:, None], neg], dim=1)
    if bool(valid.all()):
        return scores, None
    ones = torch.ones(B, 1, dtype=torch.bool, device=valid.device)
    return scores, torch.cat([ones, valid], dim=1)


def sparse_rows_grad(
    W: torch.Tensor, rows: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """Dense gradient of ``W`` assembled from row gradients ``[(index, grad_rows), ...]``."""
    grad = torch.zeros_like(W)
    for index, g in rows:
        grad.index_add_(0, index, g)
    return grad


def sparse_sgd_step(
    W: torch.Tensor, rows: list[tuple[torch.Tensor, torch.Tensor]], lr: float
) -> None:
    """In-place plain SGD on the touched rows only (duplicate indices accumulate)."""
    with torch.no_grad():
        for index, g in rows:
            W.index_add_(0, index, g, alpha=-lr)
