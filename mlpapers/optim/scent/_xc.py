r"""The two extreme-classification objectives of :class:`SCENTClassifier` and their estimates.

``loss="softmax"`` is the cross-entropy, written as the compositional
entropic risk :math:`\frac{\tau}{n}\sum_i\log\frac1C\sum_k e^{(z_{ik}-z_{iy_i})/\tau}`
(the cross-entropy minus :math:`\tau\log C`); the positive term is kept exactly
in every estimate. ``loss="negatives"`` is the risk optimised by the
official SCENT extreme-classification code, a mean over the *other* classes
only: :math:`\frac{\tau}{n}\sum_i\log\frac{1}{C-1}\sum_{k\ne y_i}
e^{(z_{ik}-z_{iy_i})/\tau}`.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias, get_args

import torch

from mlpapers.optim.scent._kernels import tempered_log_mean_exp
from mlpapers.optim.scent._sampled import (
    NegativeDraw,
    in_batch_negatives,
    other_class_negatives,
    sampled_scores,
    shared_negatives,
)

#: ``SCENTClassifier(loss=...)`` and ``negatives=...``; LOSSES and NEGATIVES list them.
Loss: TypeAlias = Literal["softmax", "negatives"]
Negatives: TypeAlias = Literal["uniform", "in_batch"]
LOSSES: tuple[str, ...] = get_args(Loss)
NEGATIVES: tuple[str, ...] = get_args(Negatives)


def draw_negatives(
    objective: str, negatives: str, n_classes: int, n_negatives: int, y: torch.Tensor,
    generator: torch.Generator,
) -> NegativeDraw:
    """The negatives of one batch for the given objective and sampler.

    ``"uniform"`` draws ``n_negatives`` classes: for ``"softmax"`` uniform over
    all classes and shared by the batch (:func:`shared_negatives`), for
    ``"negatives"`` uniform over each anchor's other classes
    (:func:`other_class_negatives`). ``"in_batch"`` uses the batch's distinct
    labels (:func:`in_batch_negatives`; ``n_negatives`` is unused).
    """
    if negatives == "in_batch":
        return in_batch_negatives(y)
    if objective == "negatives":
        return other_class_negatives(n_classes, n_negatives, y, generator)
    neg, valid = shared_negatives(n_classes, n_negatives, y, generator)
    return NegativeDraw(neg, None, valid)


def batch_scores(
    objective: str, negatives: str, z_pos: torch.Tensor, z_neg: torch.Tensor,
    valid: torch.Tensor | None, n_classes: int, temperature: float,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    r"""Scaled scores :math:`s/\tau` of the kept anchors (the loss uses temperature 1).

    The masked mean of :math:`e^{s/\tau}` over a kept anchor's items estimates
    the inner mean of ``objective``: unbiased for uniform draws, and for
    ``"in_batch"`` draws when the classes are balanced (see :mod:`._sampled`).

    Parameters
    ----------
    objective, negatives : str
    z_pos : torch.Tensor of shape (B,)
        Logits of the anchors' labels.
    z_neg : torch.Tensor of shape (B, k)
        Logits of the anchors' negatives.
    valid : torch.Tensor of bool of shape (B, k) or None
    n_classes : int
    temperature : float

    Returns
    -------
    scores : torch.Tensor of shape (B', k')
    mask : torch.Tensor of bool of shape (B', k') or None
    keep : torch.Tensor of bool of shape (B,) or None
        Anchors with at least one valid negative (``None``: all); an anchor
        whose batch holds only its own class has none with ``"in_batch"``.
    """
    keep = None
    if valid is not None and negatives == "in_batch":
        count = valid.sum(dim=1)
        if not bool((count > 0).all()):
            keep = count > 0
            z_pos, z_neg, valid, count = z_pos[keep], z_neg[keep], valid[keep], count[keep]
    tau = float(temperature)
    if objective == "softmax":
        # both softmax draws (shared, in-batch) mask each anchor's own label
        assert valid is not None
        weight = None
        if negatives == "in_batch":
            weight = (n_classes - 1) / (n_classes * count.to(z_neg.dtype))
        scores, mask = sampled_scores(z_pos, z_neg, valid, n_classes, tau, weight)
        return scores, mask, keep
    scores = (z_neg - z_pos[:, None]) / tau
    if valid is not None and bool(valid.all()):
        valid = None
    return scores, valid, keep


def exact_objective(z: torch.Tensor, y: torch.Tensor, objective: str,
                    temperature: float) -> torch.Tensor:
    r"""Exact objective (no regulariser) from all logits.

    ``"softmax"``: the cross-entropy :math:`\frac{\tau}{n}\sum_i[\log\sum_k
    e^{z_{ik}/\tau} - z_{iy_i}/\tau]`; ``"negatives"``: :math:`\frac{\tau}{n}
    \sum_i\log\frac{1}{C-1}\sum_{k\ne y_i}e^{(z_{ik}-z_{iy_i})/\tau}`.

    Parameters
    ----------
    z : torch.Tensor of shape (n, C)
    y : torch.Tensor of int of shape (n,)
    objective : str
    temperature : float

    Returns
    -------
    torch.Tensor
        A scalar, differentiable in ``z``.
    """
    # logit differences reduced by tempered_log_mean_exp: tau * logsumexp(d / tau) alone
    # overflows for a tiny tau and rounds the "negatives" risk to 0 for a huge one
    rows = torch.arange(len(y), device=z.device)
    d = z - z[rows, y][:, None]
    if objective == "softmax":
        return (tempered_log_mean_exp(d, temperature, dim=1)
                + temperature * math.log(z.shape[1])).mean()
    valid = torch.ones_like(d, dtype=torch.bool).index_put(
        (rows, y), torch.tensor(False, device=d.device))
    return tempered_log_mean_exp(d, temperature, dim=1, mask=valid).mean()
