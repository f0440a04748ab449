"""Negative draws, sampled-softmax scores and a row-sparse primal step.

Used by :class:`~mlpapers.optim.scent.SCENTClassifier`. A draw names the
candidate classes ``cand`` whose weight rows a step reads and writes (and, per
anchor, which of them it uses), so a step costs :math:`O((B + |cand|) d)`
instead of :math:`O(C d)`. Three draws exist:

* :func:`shared_negatives`: ``k`` classes uniform over all :math:`C`, shared by
  the batch, own label masked;
* :func:`other_class_negatives`: ``k`` classes per anchor uniform over the
  :math:`C-1` *other* classes, built from ``k`` shared draws (no masking);
* :func:`in_batch_negatives`: the distinct labels of the batch, own label masked
  (the official SCENT extreme-classification code).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class NegativeDraw(NamedTuple):
    """Negatives of one batch.

    Attributes
    ----------
    cand : torch.Tensor of int of shape (m,)
        Candidate classes (weight rows read and updated).
    cols : torch.Tensor of int of shape (B, k) or None
        Per anchor, the columns of ``cand`` it uses; ``None``: all ``m`` of them.
    valid : torch.Tensor of bool of shape (B, k) or None
        Which used negatives count (``False`` for the anchor's own label);
        ``None``: all.
    """

    cand: torch.Tensor
    cols: torch.Tensor | None
    valid: torch.Tensor | None


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


def other_class_negatives(
    n_classes: int, n_negatives: int, y: torch.Tensor, generator: torch.Generator,
    draws: torch.Tensor | None = None,
) -> NegativeDraw:
    r"""``k`` negatives per anchor, i.i.d. uniform over the :math:`C-1` other classes.

    ``k`` shared draws :math:`u_j` uniform on :math:`\{0, \dots, C-2\}` are
    mapped, for an anchor of label :math:`y`, to :math:`u_j + [u_j \ge y]`, a
    bijection onto the classes :math:`\ne y`. So every anchor gets exactly
    ``k`` valid negatives (no masking, no anchor without negatives), and the
    step reads at most :math:`2k` weight rows (:math:`u_j` and :math:`u_j + 1`).
    With ``n_negatives >= n_classes - 1`` every other class is used once.

    Parameters
    ----------
    n_classes : int
    n_negatives : int
    y : torch.Tensor of int of shape (B,)
        Encoded labels of the anchors.
    generator : torch.Generator
    draws : torch.Tensor of int of shape (k,), optional
        Given :math:`u_j` instead of random ones (tests).

    Returns
    -------
    NegativeDraw
        ``cand`` of shape (2k,) (or (C,) in the exhaustive case), ``cols`` of
        shape (B, k) and ``valid=None`` (``cols=None`` and the own label masked
        in the exhaustive case).
    """
    if draws is None and n_negatives >= n_classes - 1:
        cand = torch.arange(n_classes, device=y.device)
        return NegativeDraw(cand, None, cand[None, :] != y[:, None])
    if draws is None:
        draws = torch.randint(0, n_classes - 1, (n_negatives,), generator=generator)
    u = draws.to(y.device)
    k = u.shape[0]
    cols = torch.arange(k, device=y.device)[None, :] + k * (u[None, :] >= y[:, None]).long()
    return NegativeDraw(torch.cat([u, u + 1]), cols, None)


def in_batch_negatives(y: torch.Tensor) -> NegativeDraw:
    """The distinct labels of the batch as negatives, each anchor's own label masked.

    This is the sampler of the official SCENT extreme-classification code: a
    class is a negative when some sample of the batch has it, so frequent
    classes are drawn more often (the estimate of a mean over the other
    classes is unbiased only when the classes are balanced).

    Parameters
    ----------
    y : torch.Tensor of int of shape (B,)

    Returns
    -------
    NegativeDraw
        ``cand`` = the sorted distinct labels (K,), ``cols=None``, ``valid`` (B, K).
    """
    cand = torch.unique(y)
    return NegativeDraw(cand, None, cand[None, :] != y[:, None])


def sampled_scores(
    z_pos: torch.Tensor, z_neg: torch.Tensor, valid: torch.Tensor, n_classes: int,
    temperature: float, neg_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""Shifted scores whose masked mean of ``exp`` estimates the softmax sum.

    For anchor :math:`i` with valid negatives :math:`V_i` among ``k`` draws, the
    mean of :math:`e^{s}` over the :math:`1 + |V_i|` valid items equals
    :math:`\frac1C + c_i\sum_{u\in V_i} e^{(z_u - z_y)/\tau}` with
    :math:`c_i` = ``neg_weight`` (default :math:`1/k`). With uniform draws from
    all :math:`C` classes and :math:`c_i = 1/k` this is an unbiased estimate of
    :math:`\frac1C\sum_{c} e^{(z_c - z_y)/\tau}`; with
    :math:`c_i = \frac{C-1}{C|V_i|}` it is unbiased whenever the valid
    negatives are uniform over the other classes. The positive term is kept
    exactly. The shifts are constants, so gradients are unchanged.

    Parameters
    ----------
    z_pos : torch.Tensor of shape (B,)
        Logits of the anchors' own classes.
    z_neg : torch.Tensor of shape (B, k)
        Logits of the drawn negatives.
    valid : torch.Tensor of bool of shape (B, k)
    n_classes : int
    temperature : float
    neg_weight : torch.Tensor of shape (B,), optional
        :math:`c_i`; ``None`` means :math:`1/k`.

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
    c1 = torch.log(n_valid / k) if neg_weight is None else torch.log(n_valid * neg_weight)
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
