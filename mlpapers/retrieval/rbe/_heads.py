"""The neural RBE scoring head (bilinear + two-tower ELU MLP + popularity + item bias)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from mlpapers._utils import (
    ProgressLogger,
    check_positive,
    on_inputs_device,
    seeded_linear,
    usable_outside_inference,
)
from mlpapers.retrieval.rbe._kernels import _softmax_signed_loss, hit_rate, topk_scores

__all__ = ["NeuralRBEHead", "build_head", "head_from_state", "head_state", "train_head"]


def _tower(k: int, hidden: int, generator: torch.Generator | None = None) -> nn.Sequential:
    # float32 whatever the default dtype (a float16 default rounded the initial weights)
    return nn.Sequential(seeded_linear(k, hidden, generator=generator), nn.ELU(),
                         seeded_linear(hidden, hidden, generator=generator))


class NeuralRBEHead(nn.Module):
    r"""Neural RBE score over fixed query and item inputs.

    .. math::

        s(q, i) = u_q^\top W e_i + \mathrm{MLP}_q(\tilde u_q)^\top \mathrm{MLP}_i(\tilde e_i)/h
        + p\,\mathrm{pop}_i + v_i + b,

    where :math:`u_q` is the query's (standardised) relevance to the support items,
    :math:`e_i` the linear-RBE item embedding, tildes denote per-dimension
    standardisation (:math:`\tilde u_q` by ``query_mean`` and ``query_scale``,
    :math:`\tilde e_i` by the mean and population standard deviation of
    ``embeddings`` over the items), :math:`\mathrm{pop}_i` the item's mean training
    relevance standardised over the items (``popularity`` minus its mean, over its
    population standard deviation: the same model as the raw value, since :math:`p`
    and :math:`b` are learned, with a step size of :math:`p` independent of the
    relevance's scale) and
    each MLP is ``Linear(k, h) -> ELU -> Linear(h, h)``. :math:`W` starts at the
    identity, :math:`v` at the linear offsets and the item tower's output layer
    at zero, so the untrained head *is* linear RBE; with ``hidden=0`` the MLP term
    is absent. The MLP product is divided by ``hidden`` to keep its scale
    independent of the width.

    Parameters
    ----------
    embeddings : Tensor of shape (n_items, k)
        Linear RBE item embeddings (fixed inputs).
    offsets : Tensor of shape (n_items,)
        Linear RBE item offsets (initial :math:`v`).
    popularity : Tensor of shape (n_items,)
        Mean training relevance of each item.
    query_mean, query_scale : Tensor of shape (k,)
        Standardisation of the query input of :math:`\mathrm{MLP}_q`.
    hidden : int
        MLP width, ``>= 0`` (0 disables the MLP term).
    generator : torch.Generator or None, default=None
        Source of the towers' random initialisation (drawn in float32, then cast to the
        dtype of ``embeddings``); ``None`` draws from torch's global RNG (as ``torch.nn``
        layers do), a generator leaves the global RNG untouched.

    Raises
    ------
    ValueError
        If ``embeddings`` is not a 2-D tensor, if ``offsets``/``popularity`` are not
        tensors of shape ``(n_items,)`` or ``query_mean``/``query_scale`` not of shape
        ``(k,)``, if any of them holds NaN or infinity, or if ``hidden`` is negative.
    TypeError
        If one of them is not a floating tensor, or ``hidden`` is not an integer.

    Notes
    -----
    :class:`RelevanceBasedRetriever` builds and trains this head with ``head="mlp"``
    (as ``head_``); build one directly to train it with your own loop. Its
    parameters are ``W``, ``v``, ``p``, ``b`` and the towers' weights; the inputs
    ``embeddings``, ``popularity`` and the standardisations are buffers.

    References
    ----------
    .. [1] Shevkunov, Ploskonosov, Prokhorenkova, "Relevance-Based Embeddings:
       Lightweight Candidate Retrieval via Heavy-Ranker Calls", ICML 2026 (PMLR v306).

    Examples
    --------
    The untrained head scores exactly as linear RBE, :math:`\langle u_q, e_i\rangle
    + v_i`:

    >>> import torch
    >>> from mlpapers.retrieval.rbe import NeuralRBEHead
    >>> g = torch.Generator().manual_seed(0)
    >>> E, v = torch.randn(6, 3, generator=g), torch.randn(6, generator=g)
    >>> pop, u = torch.randn(6, generator=g), torch.randn(4, 3, generator=g)
    >>> head = NeuralRBEHead(E, v, pop, u.mean(0), u.std(0), hidden=8, generator=g)
    >>> head(u).shape
    torch.Size([4, 6])
    >>> torch.allclose(head(u), u @ E.T + v)
    True
    """

    # buffers, registered in __init__
    embeddings: torch.Tensor
    items_std: torch.Tensor
    popularity: torch.Tensor
    query_mean: torch.Tensor
    query_scale: torch.Tensor

    def __init__(self, embeddings: torch.Tensor, offsets: torch.Tensor,
                 popularity: torch.Tensor, query_mean: torch.Tensor,
                 query_scale: torch.Tensor, hidden: int,
                 *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        # (a public class: offsets or popularity of length 1 broadcast over the items
        # without an error, and a negative width silently meant 0)
        if not isinstance(embeddings, torch.Tensor) or embeddings.ndim != 2:
            raise ValueError("embeddings must be a 2-D tensor (n_items, k), got "
                             f"{getattr(embeddings, 'shape', type(embeddings).__name__)}.")
        n_items, k = embeddings.shape
        if n_items == 0 or k == 0:
            # (torch warned of degenerate std and zero-element inits, then scored 0)
            raise ValueError("embeddings must have at least one item and one support "
                             f"column, got shape {(n_items, k)}.")
        for name, t, shape in (("offsets", offsets, (n_items,)),
                               ("popularity", popularity, (n_items,)),
                               ("query_mean", query_mean, (k,)),
                               ("query_scale", query_scale, (k,))):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a tensor of shape {shape} to match "
                                 f"embeddings (n_items, k) = {(n_items, k)}, got {got}.")
        # (integer inputs failed inside torch's mean/std/requires_grad, NaN ones gave NaN
        # scores for every item without an error)
        for name, t in (("embeddings", embeddings), ("offsets", offsets),
                        ("popularity", popularity), ("query_mean", query_mean),
                        ("query_scale", query_scale)):
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating tensor, got {t.dtype}.")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} must hold finite values (no NaN or infinity).")
        if not bool(torch.isfinite(query_scale).all() and (query_scale > 0).all()):
            # (a zero scale, e.g. the std of a constant column, made every score NaN)
            raise ValueError("query_scale must hold finite values > 0 (use 1 for a "
                             "constant support column).")
        check_positive(hidden, "hidden", strict=False, integer=True)
        self.hidden = int(hidden)
        # fixed inputs: detached, so that a graph they came out of (or their own
        # requires_grad) does not reach the buffers (a user's second backward failed,
        # and deepcopy refused the non-leaf buffers)
        embeddings, popularity = embeddings.detach(), popularity.detach()
        query_mean, query_scale = query_mean.detach(), query_scale.detach()
        emb_mean = embeddings.mean(dim=0)
        emb_scale = embeddings.std(dim=0, correction=0)
        emb_scale = torch.where(emb_scale > 0, emb_scale, torch.ones_like(emb_scale))
        pop_scale = popularity.std(correction=0)
        pop_scale = pop_scale if pop_scale > 0 else torch.ones_like(pop_scale)
        self.register_buffer("embeddings", embeddings.clone())
        self.register_buffer("items_std", (embeddings - emb_mean) / emb_scale)
        self.register_buffer("popularity", (popularity - popularity.mean()) / pop_scale)
        self.register_buffer("query_mean", query_mean.clone())
        self.register_buffer("query_scale", query_scale.clone())
        # made on the embeddings' device, whatever the default device; the towers are
        # drawn where the generator draws (or there), then moved
        dev = embeddings.device
        self.W = nn.Parameter(torch.eye(k, dtype=embeddings.dtype, device=dev))
        self.v = nn.Parameter(offsets.clone())
        self.p = nn.Parameter(torch.zeros((), dtype=embeddings.dtype, device=dev))
        self.b = nn.Parameter(torch.zeros((), dtype=embeddings.dtype, device=dev))
        if self.hidden > 0:
            with torch.device(dev if generator is None else generator.device):
                towers = [_tower(k, self.hidden, generator) for _ in range(2)]
            self.query_tower, self.item_tower = (
                t.to(device=dev, dtype=embeddings.dtype) for t in towers)
            # Zero output layer of the item tower: the MLP term starts at exactly 0
            # (so the untrained head equals linear RBE) yet still gets gradients.
            out_layer = self.item_tower[-1]
            assert isinstance(out_layer, nn.Linear)  # (built by _tower)
            nn.init.zeros_(out_layer.weight)
            nn.init.zeros_(out_layer.bias)

    @on_inputs_device
    def forward(self, u: torch.Tensor, items: torch.Tensor | None = None) -> torch.Tensor:
        """Score queries against some or all items.

        Parameters
        ----------
        u : Tensor of shape (n, k)
            Query inputs: each query's standardised relevance to the ``k`` support
            items (:meth:`RelevanceBasedRetriever.transform_queries`), in the head's
            dtype.
        items : LongTensor of shape (m,) or None, default=None
            Indices of the items to score (repeats allowed, as in the sampled
            training batches); ``None`` scores all ``n_items``.

        Returns
        -------
        Tensor of shape (n, m)
            ``s(q, i)`` of the class formula (``m = n_items`` when ``items`` is
            ``None``); differentiable with respect to the head's parameters.
        """
        self._check_queries(u)
        if items is not None and (not isinstance(items, torch.Tensor) or items.ndim != 1
                                  or items.dtype not in (torch.int64, torch.int32)):
            raise TypeError("items must be a 1-D LongTensor of item indices or None, got "
                            f"{_describe(items)}.")
        if items is not None and items.numel() and not bool(
                (items.min() >= 0) & (items.max() < self.embeddings.shape[0])):
            # (a negative index counted from the end: -1 scored the last item)
            raise ValueError(f"items must be indices in [0, {self.embeddings.shape[0]}).")
        sl = slice(None) if items is None else items
        E = self.embeddings[sl]
        s = (u @ self.W) @ E.T + (self.p * self.popularity[sl] + self.v[sl] + self.b)[None, :]
        if self.hidden > 0:
            zq = self.query_tower((u - self.query_mean) / self.query_scale)
            zi = self.item_tower(self.items_std[sl])
            s = s + zq @ zi.T / self.hidden
        return s

    def _check_queries(self, u: torch.Tensor) -> None:
        # (torch's "mat1 and mat2 shapes cannot be multiplied" named neither argument)
        k = self.W.shape[0]
        if not isinstance(u, torch.Tensor):
            raise TypeError(f"u must be a Tensor of shape (n, {k}), got {_describe(u)}.")
        if u.ndim != 2 or u.shape[1] != k:
            raise ValueError(f"u must be a Tensor of shape (n, {k}) (each query's relevance "
                             f"to the {k} support items), got {_describe(u)}.")
        if u.dtype != self.W.dtype:
            raise TypeError(f"u must have the head's dtype {self.W.dtype}, got {u.dtype}.")

    def all_items_scorer(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """A function ``u -> self(u)`` (scores of all items), the item side computed once.

        It gives bitwise :meth:`forward`'s scores, for callers that score the queries
        in many chunks (the item tower over all items per chunk cost more than the
        chunk). The item side is computed now: after the head's parameters change
        (a training step), call this method again.

        Returns
        -------
        callable
            ``scores(u)`` mapping a Tensor of shape (n, k) to the Tensor of shape
            (n, n_items) of :meth:`forward` with ``items=None``.
        """
        E_T = self.embeddings.T
        offset = (self.p * self.popularity + self.v + self.b)[None, :]
        zi_T = self.item_tower(self.items_std).T if self.hidden > 0 else None

        def scores(u: torch.Tensor) -> torch.Tensor:
            self._check_queries(u)
            s = (u @ self.W) @ E_T + offset
            if zi_T is not None:
                zq = self.query_tower((u - self.query_mean) / self.query_scale)
                s = s + zq @ zi_T / self.hidden
            return s
        return scores


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} Tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__}"


def head_state(head: NeuralRBEHead | None) -> dict | None:
    """A ``weights_only``-safe description of ``head`` (``None`` stays ``None``)."""
    if head is None:
        return None
    return {"hidden": head.hidden,
            "state_dict": {k: v.detach().cpu() for k, v in head.state_dict().items()}}


def head_from_state(state: dict | None, device) -> NeuralRBEHead | None:
    """Rebuild the head saved by :func:`head_state` on ``device``, in eval mode."""
    if state is None:
        return None
    sd = state["state_dict"]
    # (a throwaway generator: the initial towers are overwritten, and building them
    # must not advance the caller's global RNG)
    # normal tensors even when loaded inside inference_mode (a head built there has
    # inference-tensor parameters and buffers, which cannot be fine-tuned later)
    with torch.inference_mode(False):
        sd = {k: usable_outside_inference(v) for k, v in sd.items()}
        head = NeuralRBEHead(sd["embeddings"], sd["v"], sd["popularity"], sd["query_mean"],
                             sd["query_scale"], int(state["hidden"]),
                             generator=torch.Generator())
        head.load_state_dict(sd)
    return head.to(device).eval().requires_grad_(False)


def build_head(embeddings, offsets, popularity, U_fit: torch.Tensor, hidden: int, *,
               seed: int, device: torch.device) -> NeuralRBEHead:
    """A :class:`NeuralRBEHead` on ``device`` (float32), towers seeded by ``seed``.

    The towers are drawn from a generator seeded with ``seed`` (the values of a build
    after ``torch.manual_seed(seed)``): the global torch RNG, shared by all threads, is
    neither seeded nor advanced. ``embeddings`` (n_items, k)
    and ``offsets`` (n_items,) are the linear RBE solution, ``popularity`` (n_items,)
    the mean training relevance, ``U_fit`` (n_fit, k) the standardised training
    query inputs (their mean and scale standardise the query tower's input).
    """
    f32 = torch.float32
    # no supports (greedy stopped at once) leaves no columns: torch warns on their std
    scale = (U_fit.std(dim=0, correction=0) if U_fit.numel()
             else U_fit.new_ones(U_fit.shape[1]))
    if U_fit.numel():
        # a support constant over the training queries gets unit scale, as in the linear
        # solve: a floor of 1e-12 multiplied a test query's deviation there by 1e12
        const = U_fit.amax(dim=0) == U_fit.amin(dim=0)
        scale = torch.where((scale > 0) & ~const, scale, torch.ones_like(scale))
    head = NeuralRBEHead(
        torch.as_tensor(embeddings, dtype=f32, device=device),
        torch.as_tensor(offsets, dtype=f32, device=device),
        torch.as_tensor(popularity, device=device).to(f32), U_fit.mean(dim=0),
        scale, int(hidden),
        generator=torch.Generator().manual_seed(int(seed)),
    )
    return head.to(device)


def train_head(
    head: NeuralRBEHead,
    U_fit: torch.Tensor,
    T_fit: torch.Tensor,
    U_val: torch.Tensor,
    R_val: torch.Tensor,
    *,
    loss: str = "softmax_signed",
    top_quantile: float = 0.99,
    item_batch: int = 128,
    max_iter: int = 2000,
    lr: float = 5e-4,
    eval_every: int = 100,
    batch_size: int = 1024,
    generator: torch.Generator | None = None,
    verbose: int = 0,
) -> tuple[list[dict], float | None]:
    """Train ``head`` in place with Adam; keep the best checkpoint by validation HitRate.

    Each step samples ``item_batch`` items with replacement and scores them for all
    training queries. Validation HitRate@m, ``m = clip(round((1 - top_quantile) N),
    1, 100)``, is measured before training and every ``eval_every`` steps.

    Parameters
    ----------
    head : NeuralRBEHead
    U_fit : Tensor of shape (n_fit, k)
        Training query inputs.
    T_fit : Tensor of shape (n_fit, n_items)
        Their heavy relevance to all items.
    U_val : Tensor of shape (n_val, k)
        Validation query inputs (``n_val = 0``: no selection, last step kept).
    R_val : Tensor of shape (n_val, n_items)
    loss : {"softmax_signed", "mse"}
    top_quantile, item_batch, max_iter, lr, eval_every, batch_size
        See :class:`RelevanceBasedRetriever`.
    generator : torch.Generator, optional
        Source of the item samples (on the CPU).
    verbose : int
        Progress bar.

    Returns
    -------
    history : list of dict
        ``step``, ``loss`` and, at evaluations, ``val_hit_rate``.
    best : float or None
        Best validation HitRate (``None`` without validation queries).
    """
    N = T_fit.shape[1]
    has_val = U_val.shape[0] > 0
    eval_k = int(min(100, max(1, round((1 - top_quantile) * N))))
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    log = ProgressLogger(max_iter, verbose, desc="neural RBE")

    def validate() -> float:
        with torch.no_grad():
            score_all = head.all_items_scorer()
            _, idx = topk_scores(lambda a, b: score_all(U_val[a:b]), U_val.shape[0], eval_k,
                                 batch_size=batch_size, n_items=N)
        return hit_rate(R_val, idx.cpu(), eval_k)

    best = validate() if has_val else None
    best_state = copy.deepcopy(head.state_dict())
    for step in log:
        cols = torch.randint(N, (item_batch,), generator=generator).to(T_fit.device)
        logits, target = head(U_fit, cols), T_fit[:, cols]
        if loss == "softmax_signed":
            value = _softmax_signed_loss(logits, target, top_quantile)
        else:
            value = torch.mean((logits - target) ** 2)
        opt.zero_grad()
        value.backward()
        opt.step()
        entry = {"step": step + 1, "loss": float(value.detach())}
        if has_val and ((step + 1) % eval_every == 0 or step + 1 == max_iter):
            entry["val_hit_rate"] = validate()
            if entry["val_hit_rate"] > best:
                best, best_state = entry["val_hit_rate"], copy.deepcopy(head.state_dict())
        log.log(**entry)
    if has_val:
        head.load_state_dict(best_state)
    elif not all(bool(torch.isfinite(p).all()) for p in head.parameters()):
        # (with validation the best checkpoint is kept; without it a diverged head was
        # kept silently, and every score was NaN)
        raise FloatingPointError(f"the neural head diverged (loss {log.history[-1]['loss']} "
                                 f"at step {log.history[-1]['step']}): lower lr, or keep "
                                 "validation queries (validation_fraction > 0).")
    return log.history, best
