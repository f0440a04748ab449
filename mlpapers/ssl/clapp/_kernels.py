"""Pure tensor math of CLAPP / CLAPP++: scores, layer-local losses, InfoNCE, theory.

Shapes use ``N`` for the number of samples in a loss (``2B``: both views of a
batch of ``B`` images, stacked as ``[view A; view B]``), ``D`` for the
(pooled, flattened) width of the layer whose representation ``z`` is trained and
``K`` for the width of the context ``c``.

References
----------
.. [1] Wu S. Zihan, A. Delrocq, W. Gerstner and G. Bellec, "Can Local Learning
   Match Self-Supervised Backpropagation?", ICML 2026, arXiv:2601.21683.
.. [2] B. Illing, J. Ventura, G. Bellec and W. Gerstner, "Local plasticity rules
   can learn deep representations using self-supervised contrastive
   predictions", NeurIPS 2021.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, get_args

import numpy as np
import torch
import torch.nn.functional as F

from mlpapers._utils import (
    ArrayLike,
    check_finite,
    check_in_options,
    check_positive,
    common_float_dtype,
    on_inputs_device,
    requires_tensors,
    row_power_of_two,
)

__all__ = [
    "LOSSES",
    "clapp_layer_loss",
    "contrastive_loss",
    "exact_linear_feedback",
    "infonce_loss",
    "negative_indices",
    "swap_views",
    "three_factor_grad",
]

#: Names of the decreasing functions ``f`` of the score (LOSSES lists them).
LayerLoss: TypeAlias = Literal["hinge", "softhinge", "linear"]
LOSSES: tuple[str, ...] = get_args(LayerLoss)
#: ``exact_linear_feedback(mode=...)``; ``FEEDBACK_MODES`` lists its values.
FeedbackMode: TypeAlias = Literal["dfb", "lateral"]
FEEDBACK_MODES: tuple[str, ...] = get_args(FeedbackMode)


def swap_views(h: torch.Tensor) -> torch.Tensor:
    """Swap the two view halves of a stacked batch.

    Parameters
    ----------
    h : Tensor of shape (2B, ...)
        ``[view A; view B]``.

    Returns
    -------
    Tensor of shape (2B, ...)
        ``[view B; view A]``, so that row ``i`` of the result and row ``i`` of
        ``h`` are the two views of the same image.
    """
    n = h.shape[0]
    if n % 2:
        raise ValueError(f"expected an even number of rows (two views), got {n}.")
    b = n // 2
    return torch.cat([h[b:], h[:b]], dim=0)


def negative_indices(
    n_images: int, *, mode: str = "next", generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Index of the negative sample of every row of a two-view batch.

    Parameters
    ----------
    n_images : int
        ``B``, the number of images (the stacked batch has ``2B`` rows; rows
        ``i`` and ``i + B`` are the two views of image ``i``).
    mode : {"next", "random"}
        ``"next"``: row ``(i + 1) mod 2B``, the official code's deterministic
        choice (the batch is shuffled every epoch, so it is a random other image).
        ``"random"``: a uniformly random row of another image (either view).
    generator : torch.Generator, optional
        Source of randomness for ``"random"``.

    Returns
    -------
    LongTensor of shape (2B,)
        Row ``neg[i]`` never shows the same image as row ``i`` (for ``B >= 2``).
    """
    if n_images < 2:
        raise ValueError(f"negatives need at least 2 images in a batch, got {n_images}.")
    n = 2 * n_images
    rows = torch.arange(n)
    if mode == "next":
        idx = (rows + 1) % n
    elif mode == "random":
        shift = torch.randint(1, n_images, (n,), generator=generator)
        view = torch.randint(0, 2, (n,), generator=generator)
        idx = (rows % n_images + shift) % n_images + view * n_images
    else:
        raise ValueError(f"negatives must be 'next' or 'random', got {mode!r}.")
    return idx.to(device) if device is not None else idx


@requires_tensors
def contrastive_loss(u_pos: torch.Tensor, u_neg: torch.Tensor, loss: str = "hinge"
                     ) -> torch.Tensor:
    r"""Per-sample loss of a positive and a negative score.

    ``hinge``: :math:`\mathrm{relu}(1 - u^+) + \mathrm{relu}(1 + u^-)`;
    ``softhinge``: :math:`\mathrm{softplus}(1 - u^+) + \mathrm{softplus}(1 + u^-)`
    (the official ``-logsigmoid(u^+ - 1) - logsigmoid(-u^- - 1)``, written stably);
    ``linear``: :math:`u^- - u^+`.

    Parameters
    ----------
    u_pos, u_neg : Tensor of shape (N,)
        Scores of the positive and negative pairs (any common shape works,
        elementwise; different shapes raise ``ValueError`` rather than broadcast,
        except a 0-d score, which applies to every pair).
    loss : {"hinge", "softhinge", "linear"}, default="hinge"
        The decreasing function ``f`` of the score (above).

    Returns
    -------
    Tensor of shape (N,)
        :math:`f(u^+) + f(-u^-)` per sample.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.ssl.clapp import contrastive_loss
    >>> contrastive_loss(torch.tensor([2.0, 0.5]), torch.tensor([-2.0, 0.0])).tolist()
    [0.0, 1.5]
    >>> contrastive_loss(torch.tensor([2.0]), torch.tensor([-1.0]), "linear").tolist()
    [-3.0]
    """
    # (one negative score of shape (1,) was broadcast over every pair; a 0-d score is a
    # deliberate constant)
    if u_pos.shape != u_neg.shape and u_pos.ndim and u_neg.ndim:
        raise ValueError(f"u_pos and u_neg must have the same shape, got {tuple(u_pos.shape)} "
                         f"and {tuple(u_neg.shape)}.")
    if loss == "hinge":
        return F.relu(1.0 - u_pos) + F.relu(1.0 + u_neg)
    if loss == "softhinge":
        # softplus(x) = -logsigmoid(-x), exact everywhere (F.softplus switches to x above
        # its threshold 20, an error of up to 2e-9 that float64 losses and gradients see)
        return -F.logsigmoid(u_pos - 1.0) - F.logsigmoid(-1.0 - u_neg)
    if loss == "linear":
        return u_neg - u_pos
    raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}.")


#: index dtypes: uint8 and bool tensors index as masks, and torch refuses int8/int16
_INDEX_DTYPES = (torch.int64, torch.int32)


def check_pair_shapes(z_shape: tuple[int, ...], c: torch.Tensor, weight: torch.Tensor,
                      neg_idx: Any, *, z_name: str = "z",
                      weight_name: str = "weight") -> torch.Tensor:
    """Shapes of a CLAPP loss's inputs, before any work (of the data, only the range of
    ``neg_idx`` is read, in one reduction): rows ``z`` ``(N, D)`` or patch grids
    ``(N, D, n_y, n_x)`` with ``N >= 1``, contexts ``c`` ``(N, K)`` or ``(N, K, n_y,
    n_x)``, the prediction matrix ``(D, K)`` or ``(steps, D, K)``, and integer
    ``neg_idx`` ``(N,)``. A context or ``neg_idx`` of one row broadcast over every row,
    and a 2-D ``neg_idx`` averaged a wrong loss, without an error; an index outside
    ``[0, N)`` is refused (torch wrapped a negative one). Returns ``neg_idx`` as
    an int64 tensor on ``c``'s device (a list or numpy array of indices is accepted; a
    uint8 or bool tensor, which torch reads as a mask, is not)."""
    grid = len(z_shape) == 4
    want = "(N, D, n_y, n_x)" if grid else "(N, D)"
    if len(z_shape) not in (2, 4):
        raise ValueError(f"{z_name} must have shape (N, D) or (N, D, n_y, n_x), got "
                         f"{tuple(z_shape)}.")
    n, d = z_shape[0], z_shape[1]
    if n == 0:  # (no rows gave a NaN loss)
        raise ValueError(f"{z_name} must have shape {want} with N >= 1, got {tuple(z_shape)}.")
    if c.ndim != len(z_shape) or c.shape[0] != n or tuple(c.shape[2:]) != tuple(z_shape[2:]):
        ctx = f"({n}, K{', ' if grid else ''}{', '.join(map(str, z_shape[2:]))})"
        raise ValueError(f"c must have shape {ctx} to match {z_name} {want} = "
                         f"{tuple(z_shape)}, got {tuple(c.shape)}.")
    expected = (d, c.shape[1])
    if tuple(weight.shape[-2:]) != expected or weight.ndim != (3 if grid else 2):
        steps = "steps, " if grid else ""
        raise ValueError(f"{weight_name} must have shape ({steps}{d}, {c.shape[1]}) for "
                         f"{z_name} with {d} channels and c with {c.shape[1]}, got "
                         f"{tuple(weight.shape)}.")
    if not isinstance(neg_idx, torch.Tensor):
        try:
            neg_idx = torch.as_tensor(np.asarray(neg_idx), device=c.device)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"neg_idx must be integer indices of shape ({n},), got "
                             f"{type(neg_idx).__name__}.") from exc
    if neg_idx.dtype not in _INDEX_DTYPES or tuple(neg_idx.shape) != (n,):
        raise ValueError(f"neg_idx must be integer indices of shape ({n},), one negative "
                         f"row per row of {z_name}, got {tuple(neg_idx.shape)} "
                         f"{neg_idx.dtype}.")
    # (torch wraps -1 to the last row and fails with an IndexError past the end); the
    # training loop calls this per layer and step: one reduction and one device sync
    low, high = (int(v) for v in torch.stack(torch.aminmax(neg_idx)).tolist())
    if low < 0 or high >= n:
        raise ValueError(f"neg_idx must index rows of {z_name}, in [0, {n}), got values "
                         f"from {low} to {high}.")
    return neg_idx.long()


@requires_tensors
def clapp_layer_loss(
    z: torch.Tensor, c: torch.Tensor, weight: torch.Tensor, neg_idx: ArrayLike,
    loss: str = "hinge",
) -> torch.Tensor:
    r"""The CLAPP loss of one layer, :math:`f(z^\top B c)` for positives and negatives.

    Row ``i`` of ``z`` and row ``i`` of ``c`` come from the two views of the same
    image; the negative of row ``i`` is ``z[neg_idx[i]]`` with the same context
    ``c[i]`` (so one prediction :math:`Bc` serves both terms, as in the paper's
    three-factor rule). The caller detaches ``c`` (asymmetric predictor, no
    weight transport).

    Parameters
    ----------
    z : Tensor of shape (N, D)
        The layer's representation (trained).
    c : Tensor of shape (N, K)
        The context: the other view at the same layer (lateral) or at the top
        layer (direct feedback).
    weight : Tensor of shape (D, K)
        The prediction matrix :math:`B`.
    neg_idx : LongTensor or array-like of int of shape (N,)
        Row of ``z`` used as the negative of each row, in ``[0, N)`` (see
        ``negative_indices``: another image than row ``i``'s).
    loss : {"hinge", "softhinge", "linear"}, default="hinge"
        The decreasing function ``f`` (:func:`contrastive_loss`).

    Returns
    -------
    Tensor of shape ()
        The mean loss over the ``N`` rows.

    Examples
    --------
    Two images, views stacked as ``[view A; view B]``; each row's negative is the
    next row (another image):

    >>> import torch
    >>> from mlpapers.ssl.clapp import clapp_layer_loss
    >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    >>> c = z[[2, 3, 0, 1]]                  # the other view of each image
    >>> neg_idx = torch.tensor([1, 2, 3, 0])
    >>> float(clapp_layer_loss(z, c, torch.eye(2), neg_idx))  # u+ = 1, u- = 0
    1.0
    >>> float(clapp_layer_loss(z, c, torch.eye(2), neg_idx, loss="linear"))  # u- - u+
    -1.0
    """
    neg_idx = check_pair_shapes(tuple(z.shape), c, weight, neg_idx)
    # one floating dtype (a float64 context beside float32 weights failed in the matmul)
    dtype = common_float_dtype(z, c, weight, names=("z", "c", "weight"))
    z, c, weight = z.to(dtype), c.to(dtype), weight.to(dtype)
    pred = c @ weight.T                      # (N, D): the "dendritic prediction" B c
    u_pos = (z * pred).sum(-1)
    u_neg = (z[neg_idx] * pred).sum(-1)
    return contrastive_loss(u_pos, u_neg, loss).mean()


def check_temperature(temperature: Any, dtype: torch.dtype = torch.float32) -> None:
    """An InfoNCE temperature: positive and finite (else a meaningless loss), and at
    least ``1 / finfo(dtype).max`` (about 2.9e-39 for the float32 of training), below
    which the logits, cosines divided by it, overflow and the loss is NaN."""
    check_positive(temperature, "temperature")
    low = 1.0 / float(torch.finfo(dtype).max)
    if temperature < low:
        raise ValueError(f"temperature must be at least {low:.3g} (1 / the largest {dtype} "
                         f"value: the logits divide by it), got {temperature!r}.")


@requires_tensors
def infonce_loss(p: torch.Tensor, temperature: float = 0.1, pairs: str = "all"
                 ) -> torch.Tensor:
    r"""InfoNCE with cosine similarity between the two views of a batch.

    ``pairs="all"`` is SimCLR's NT-Xent: every row of ``[view A; view B]`` must
    find its other view among the ``2B - 1`` other rows (both directions, the
    other images of *both* views as negatives). ``pairs="cross"`` is the form of
    the official CLAPP++ code's BP-InfoNCE baseline (``vision/models/SSLLoss.py``,
    ``InfoNCE`` with the SimCLR script's flags): each view-A row :math:`a_i` must
    find :math:`b_i` among the :math:`B` view-B rows only, in one direction,

    .. math:: L = -\frac{1}{B}\sum_i \log \frac{\exp(\cos(a_i, b_i)/\tau)}
              {\sum_j \exp(\cos(a_i, b_j)/\tau)}.

    Parameters
    ----------
    p : Tensor of shape (2B, P)
        Projections ``[view A; view B]`` (any scale: rows are normalised).
    temperature : float, default=0.1
        :math:`\tau > 0`, dividing the cosine similarities (smaller is sharper).
    pairs : {"all", "cross"}, default="all"
        Which rows compete (above).

    Returns
    -------
    Tensor of shape ()
        The mean cross-entropy.

    Examples
    --------
    Views that agree exactly and images that are orthogonal: each row's softmax
    puts :math:`e^{1/\tau}` on its other view and 1 on each other candidate.

    >>> import math
    >>> import torch
    >>> from mlpapers.ssl.clapp import infonce_loss
    >>> p = torch.cat([torch.eye(3), torch.eye(3)])         # B = 3 images, 2 views
    >>> round(float(infonce_loss(p, temperature=0.5, pairs="cross")), 5)
    0.23954
    >>> round(math.log(1 + 2 * math.exp(-2.0)), 5)         # log(1 + (B-1) e^{-1/tau})
    0.23954
    """
    if pairs not in ("all", "cross"):
        raise ValueError(f"pairs must be 'all' or 'cross', got {pairs!r}.")
    dtype = common_float_dtype(p, names=("p",))  # (integer p failed in torch.finfo)
    if not isinstance(temperature, torch.Tensor):  # (a learnable one is the caller's)
        check_temperature(temperature, dtype)
    n = p.shape[0] if p.ndim == 2 else 0
    if p.ndim != 2 or n == 0 or n % 2:  # (no rows gave a NaN loss)
        raise ValueError(f"p must have shape (2B, P) with B >= 1 (an even number of rows: "
                         f"two views), got {tuple(p.shape)}.")
    q = _unit_rows(p.to(dtype))
    if pairs == "cross":
        b = n // 2
        sim = (q[:b] @ q[b:].T) / temperature
        return F.cross_entropy(sim, torch.arange(b, device=p.device))
    sim = (q @ q.T) / temperature
    sim = sim.masked_fill(torch.eye(n, dtype=torch.bool, device=p.device), float("-inf"))
    target = (torch.arange(n, device=p.device) + n // 2) % n
    return F.cross_entropy(sim, target)


def _unit_rows(p: torch.Tensor) -> torch.Tensor:
    """Rows of ``p`` scaled to unit norm, at any scale.

    ``F.normalize`` alone is not scale-free: the squared norm overflows float32 for
    entries above ~1e19 (every row then becomes 0, every cosine 0) and a norm below its
    ``eps=1e-12`` is replaced by ``eps`` (rows of entries ~1e-13 are not unit rows). Each
    row is first multiplied by the power of two ``2**-floor(log2(max |p_i|))`` that
    brings its largest entry into [1, 2): exact in floating point, so ordinary rows give
    bit-identical results and gradients, and the cosine similarity stays invariant to
    the scale of ``p``. Zero rows and rows holding inf or NaN are left unscaled and get
    what ``F.normalize`` gives them: a zero row stays zero. Its ``eps`` is the dtype's
    smallest normal number, not the default ``1e-12``, which rounds to 0 in float16
    (0 / 0 made a zero row NaN there); scaled nonzero rows have norm >= 1, so ``eps``
    never touches them.
    """
    return F.normalize(p / row_power_of_two(p, dim=1), dim=1, eps=torch.finfo(p.dtype).tiny)


def _check_linear_net(weights, B_top) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Matrices of one floating dtype whose shapes chain (``W_{l+1}`` after ``W_l``)."""
    # any iterable of matrices (list, tuple, nn.ParameterList), but not one tensor
    if isinstance(weights, (torch.Tensor, np.ndarray, str, Mapping, set, frozenset)) \
            or not isinstance(weights, Iterable):  # unordered containers have no layer order
        raise ValueError("weights must be a non-empty sequence of 2D matrices W_1..W_L.")
    weights = list(weights)
    if not weights:
        raise ValueError("weights must be a non-empty sequence of 2D matrices W_1..W_L.")
    mats = [w if isinstance(w, torch.Tensor) else torch.as_tensor(np.asarray(w))
            for w in [*weights, B_top]]
    dtype = common_float_dtype(*mats, names=[*(f"weights[{i}]" for i in range(len(weights))),
                                             "B_top"])
    mats = [m.to(dtype=dtype, device=mats[-1].device) for m in mats]
    *Ws, B = mats
    for i, w in enumerate(Ws):
        if w.ndim != 2:
            raise ValueError(f"weights[{i}] must be a 2D matrix, got shape {tuple(w.shape)}.")
        if i and w.shape[1] != Ws[i - 1].shape[0]:
            raise ValueError(f"weights[{i}] has shape {tuple(w.shape)}: its {w.shape[1]} "
                             f"inputs do not match the {Ws[i - 1].shape[0]} outputs of "
                             f"weights[{i - 1}].")
    d_top = Ws[-1].shape[0]
    if tuple(B.shape) != (d_top, d_top):
        raise ValueError(f"B_top must have shape ({d_top}, {d_top}) (the top layer's width), "
                         f"got {tuple(B.shape)}.")
    # (a NaN was reported as an overflow of the products W_L ... W_l)
    for i, w in enumerate(Ws):
        check_finite(w, f"weights[{i}]")
    check_finite(B, "B_top")
    return Ws, B


@on_inputs_device
def exact_linear_feedback(
    weights: Sequence[torch.Tensor], B_top: torch.Tensor, mode: FeedbackMode = "dfb"
) -> list[torch.Tensor]:
    r"""Prediction matrices that make local updates equal to backprop in a linear net.

    For a deep linear network :math:`z_l = W_l z_{l-1}` with
    :math:`M_l = W_L \cdots W_{l+1}` (:math:`M_L = I`) and the global loss
    :math:`f(z_L^\top B_L c_L)`, the layer-local losses give exactly the
    backprop gradient of every :math:`W_l` when

    * ``"dfb"`` (context from the top, :math:`c_l = c_L`):
      :math:`B_l = M_l^\top B_L`;
    * ``"lateral"`` (context from the same layer, :math:`c_l = z_l'`):
      :math:`B_l = M_l^\top B_L M_l`.

    Parameters
    ----------
    weights : sequence of L tensors, ``weights[l]`` of shape (d_{l+1}, d_l)
        The layer matrices :math:`W_1, \dots, W_L`.
    B_top : Tensor of shape (d_L, d_L)
        The top prediction matrix :math:`B_L`.
    mode : {"dfb", "lateral"}, default="dfb"
        Where the layer-local context comes from (above).

    Returns
    -------
    list of L tensors
        :math:`B_1, \dots, B_L`; of shape (d_l, d_L) for ``"dfb"`` and
        (d_l, d_l) for ``"lateral"``, in the promoted floating dtype of the
        inputs, on ``B_top``'s device. The last one equals ``B_top``.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.ssl.clapp import exact_linear_feedback
    >>> W1, W2 = 2 * torch.eye(2), 3 * torch.eye(2)
    >>> B1, B2 = exact_linear_feedback([W1, W2], torch.eye(2))
    >>> B1.tolist(), B2.tolist()                           # B_1 = W_2^T B_L
    ([[3.0, 0.0], [0.0, 3.0]], [[1.0, 0.0], [0.0, 1.0]])
    >>> exact_linear_feedback([W1, W2], torch.eye(2), mode="lateral")[0].tolist()
    [[9.0, 0.0], [0.0, 9.0]]
    """
    check_in_options(mode, "mode", FEEDBACK_MODES)
    weights, B_top = _check_linear_net(weights, B_top)
    d_top = weights[-1].shape[0]
    M = torch.eye(d_top, dtype=B_top.dtype, device=B_top.device)
    out = []
    for W in reversed(weights):              # l = L, L-1, ..., 1
        out.append(M.T @ B_top if mode == "dfb" else M.T @ B_top @ M)
        M = M @ W
    if not all(bool(torch.isfinite(b).all()) for b in out):
        # products of L matrices overflow (inf, and inf * 0 = NaN) long before any entry
        # of the weights does: say so rather than return NaN matrices
        raise ValueError(f"the products W_L ... W_l overflow {B_top.dtype}: rescale the "
                         "weights or pass float64 matrices.")
    return out[::-1]


@requires_tensors
def three_factor_grad(
    x: torch.Tensor, W: torch.Tensor, c: torch.Tensor, B: torch.Tensor,
    neg_idx: ArrayLike, loss: str = "hinge",
) -> torch.Tensor:
    r"""The CLAPP update of one layer :math:`z = \mathrm{relu}(W x)`, written by hand.

    The gradient of :func:`clapp_layer_loss` with respect to ``W`` is a sum of
    three-factor terms: a scalar modulating factor :math:`f'(u)` (the
    "neuromodulator"), the dendritic prediction :math:`B c` gated by the
    post-synaptic derivative :math:`\mathrm{relu}'(a)`, and the pre-synaptic
    activity :math:`x` (Hebbian):

    .. math:: \frac{\partial L}{\partial W} = \frac{1}{N}\sum_i \big[f'(u_i^+)\,
              (Bc_i \odot \phi'(a_i))\,x_i^\top
              - f'(-u_i^-)\,(Bc_i \odot \phi'(a_{n(i)}))\,x_{n(i)}^\top\big],

    with :math:`n(i)` = ``neg_idx[i]``; the local update is the descent step
    :math:`\Delta W \propto -\partial L / \partial W`.

    Used to check that autograd on the local loss is the local rule.

    Parameters
    ----------
    x : Tensor of shape (N, K_in)
        Pre-synaptic activity: the layer's input, one row per sample.
    W : Tensor of shape (D, K_in)
        The layer's weights; :math:`a = W x` and :math:`z = \mathrm{relu}(a)`.
    c : Tensor of shape (N, K)
        The (detached) context of each row, as in :func:`clapp_layer_loss`.
    B : Tensor of shape (D, K)
        The prediction matrix.
    neg_idx : LongTensor or array-like of int of shape (N,)
        Row used as the negative of each row, as in :func:`clapp_layer_loss`.
    loss : {"hinge", "softhinge", "linear"}, default="hinge"
        The decreasing function ``f`` (:func:`contrastive_loss`).

    Returns
    -------
    Tensor of shape (D, K_in)
        :math:`\partial L / \partial W` for the mean loss over ``N`` rows, in
        the promoted floating dtype of the inputs (a descent step subtracts it).

    Examples
    --------
    The hand-written rule equals autograd on :func:`clapp_layer_loss`:

    >>> import torch
    >>> from mlpapers.ssl.clapp import clapp_layer_loss, three_factor_grad
    >>> g = torch.Generator().manual_seed(0)
    >>> x, c = torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g)
    >>> W = torch.randn(5, 4, generator=g, requires_grad=True)
    >>> B, neg_idx = torch.randn(5, 3, generator=g), torch.tensor([1, 2, 3, 4, 5, 0])
    >>> clapp_layer_loss(torch.relu(x @ W.T), c, B, neg_idx).backward()
    >>> torch.allclose(three_factor_grad(x, W.detach(), c, B, neg_idx), W.grad, atol=1e-6)
    True
    """
    if x.ndim != 2 or W.ndim != 2 or W.shape[1] != x.shape[1]:
        raise ValueError(f"x must have shape (N, K_in) and W (D, K_in), got {tuple(x.shape)} "
                         f"and {tuple(W.shape)}.")
    if x.shape[0] == 0:  # (no rows gave a NaN gradient)
        raise ValueError(f"x must have shape (N, K_in) with N >= 1, got {tuple(x.shape)}.")
    neg_idx = check_pair_shapes((x.shape[0], W.shape[0]), c, B, neg_idx,
                                z_name="relu(x W^T)", weight_name="B")
    # one floating dtype, as clapp_layer_loss promotes (matmul refuses mixed dtypes)
    dtype = common_float_dtype(x, W, c, B, names=("x", "W", "c", "B"))
    x, W, c, B = (t.to(dtype) for t in (x, W, c, B))
    a = x @ W.T
    z = F.relu(a)
    pred = c @ B.T
    u_pos = (z * pred).sum(-1)
    u_neg = (z[neg_idx] * pred).sum(-1)
    if loss == "hinge":
        g_pos = -(u_pos < 1).to(x.dtype)                 # d/du relu(1 - u)
        g_neg = (u_neg > -1).to(x.dtype)                 # d/du relu(1 + u)
    elif loss == "softhinge":
        g_pos = -torch.sigmoid(1 - u_pos)
        g_neg = torch.sigmoid(1 + u_neg)
    elif loss == "linear":
        g_pos = -torch.ones_like(u_pos)
        g_neg = torch.ones_like(u_neg)
    else:
        raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}.")
    n = x.shape[0]
    gate = (a > 0).to(x.dtype)
    post_pos = g_pos[:, None] * pred * gate                       # (N, D)
    post_neg = g_neg[:, None] * pred * gate[neg_idx]              # (N, D)
    return (post_pos.T @ x + post_neg.T @ x[neg_idx]) / n
