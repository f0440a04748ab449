"""Training machinery of amortized MIPS: query sources, noise augmentation, data
units, output scaling at initialisation, the optimisation loop (Adam, clipping,
warmup-cosine learning rate, EMA of the weights) and the whole fit (:func:`fit_amips`).

Kept apart from the estimator shell (:mod:`._estimator`), which validates the
parameters and inputs and calls :func:`fit_amips`.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from mlpapers._base import check_feature_names
from mlpapers._utils import ArrayLike, ProgressLogger, check_tensor
from mlpapers._utils._blocks import block_rows_for, row_blocks
from mlpapers.retrieval.amips._kernels import _KeyStats, _support, amips_loss, warmup_cosine_lr
from mlpapers.retrieval.amips._networks import AMIPSNetwork

__all__ = ["QuerySource", "augment_queries", "centre", "column_mean", "fit_amips",
           "make_query_source", "match_output_scale", "power_of_two_scale", "train_amips"]


#: ``fit(queries=...)``: None (the unit sphere), rows to resample, or ``sampler(n, rng)``
QuerySource = ArrayLike | Callable[[int, np.random.Generator], Any] | None


def make_query_source(queries: QuerySource, d: int, *, device: torch.device,
                      torch_gen: torch.Generator, numpy_gen: np.random.Generator,
                      owner: str, check_names: Callable[[Any], None] | None = None
                      ) -> Callable[[int], torch.Tensor]:
    """Return ``draw(n) -> (n, d)`` float32 training queries on ``device``.

    ``queries`` is ``None`` (uniform on the unit sphere), an array (rows sampled
    with replacement) or a callable ``sampler(n, rng)`` with ``rng`` a numpy
    Generator (``numpy_gen``). Raises ``ValueError`` for zero-norm rows (in an
    array or a sampler's output) and for a sampler that returns the wrong number of
    rows. ``check_names(X)``, when given, checks the column names of a DataFrame of
    queries (or of a sampler's DataFrame output) against the keys' (scikit-learn's
    rule: other columns raise ``ValueError``); unnamed arrays are read by position.
    """
    if queries is None:
        def draw_sphere(n: int) -> torch.Tensor:
            # float32 whatever the default dtype (float16 rounded the queries, float64
            # drew other numbers and failed against the float32 network)
            q = torch.randn(n, d, generator=torch_gen, dtype=torch.float32)
            return (q / q.norm(dim=1, keepdim=True).clamp_min(1e-12)).to(device)
        return draw_sphere
    if callable(queries) and not isinstance(queries, (np.ndarray, torch.Tensor)):
        # a one-argument sampler (``lambda n: ...``) failed inside the first step with
        # Python's "<lambda>() takes 1 positional argument but 2 were given"
        try:
            inspect.signature(queries).bind(1, numpy_gen)
        except TypeError:
            raise TypeError(f"queries: a sampler is called as sampler(n, rng) (n rows, rng "
                            f"a numpy Generator), but {queries!r} does not accept these two "
                            "arguments.") from None
        except ValueError:  # no introspectable signature (some builtins): just call it
            pass

        def draw_sampler(n: int) -> torch.Tensor:
            out = queries(n, numpy_gen)
            if check_names is not None and hasattr(out, "columns"):
                # (DataFrames only, as for an array: unnamed ones are read by position)
                check_names(out)
            q = check_tensor(out, name="sampler output", dtype=torch.float32,
                             device=device, n_features=d, owner=owner)
            if q.shape[0] != n:
                raise ValueError(f"the query sampler returned {q.shape[0]} rows, "
                                 f"expected {n}.")
            # (zero rows were trained on: every key ties, so the target was key 0)
            _refuse_zero_rows(q, "the query sampler returned")
            return q
        return draw_sampler
    if check_names is not None and hasattr(queries, "columns"):
        check_names(queries)
    pool = check_tensor(queries, name="queries", dtype=torch.float32, device=device,
                        n_features=d, owner=owner)
    _refuse_zero_rows(pool, "queries contains")

    def draw(n):
        idx = torch.randint(pool.shape[0], (n,), generator=torch_gen).to(device)
        return pool[idx]
    return draw


def _refuse_zero_rows(q: torch.Tensor, what: str) -> None:
    # not ``q.norm(dim=1) == 0``: in float32 the norm of a row of 1e-23 underflows
    if not bool((q != 0).any(dim=1).all()):
        raise ValueError(f"{what} rows with zero norm; MIPS needs nonzero queries.")


def augment_queries(q: torch.Tensor, noise_std: float, n_noise: int,
                    gen: torch.Generator) -> torch.Tensor:
    """The paper's noise augmentation, on the fly.

    Each row ``q`` of shape (n, d) is replaced, with probability
    ``n_noise / (n_noise + 1)``, by ``||q|| * normalize(q + noise_std * ||q|| * eps)``,
    ``eps ~ N(0, I)``: in expectation, the dataset of every query plus ``n_noise``
    renormalised noisy copies.
    """
    if noise_std == 0 or n_noise == 0:
        return q
    n, d = q.shape
    norm = q.norm(dim=1, keepdim=True)
    # float32 draws whatever the default dtype (the numbers of the default float32)
    eps = torch.randn(n, d, generator=gen, dtype=torch.float32)
    noisy = q + noise_std * norm * eps.to(q)
    noisy = noisy * (norm / noisy.norm(dim=1, keepdim=True).clamp_min(1e-12))
    u = torch.rand(n, 1, generator=gen, dtype=torch.float32)
    replace = u.to(q.device) < n_noise / (n_noise + 1)
    return torch.where(replace, noisy, q)


@torch.no_grad()
def match_output_scale(model: AMIPSNetwork, x: torch.Tensor, keys: torch.Tensor, *,
                       search_batch_size: int = 8192) -> float:
    """Scale the output layer so the mean predicted key norm on ``x`` equals the labels'.

    A positive scale keeps SupportNet convex. Returns the factor applied (1.0, none,
    when that is not a finite positive number: a zero or non-finite predicted norm,
    or zero labels, as the one centred key of a single-key fit).
    """
    _, pred = model.score_and_key(x)
    _, idx = _support(x, keys, search_batch_size, _KeyStats(keys))
    target = keys[idx].norm(dim=1).mean()
    got = pred.norm(dim=1).mean()
    c = float(target / got) if bool(got > 0) else math.nan
    if 0 < c < math.inf:
        model.scale_output(c)
        return c
    return 1.0


def train_amips(
    model: AMIPSNetwork,
    keys: torch.Tensor,
    draw: Callable[[int], torch.Tensor],
    *,
    augment: Callable[[torch.Tensor], torch.Tensor],
    n_steps: int,
    batch_size: int,
    lr: float,
    warmup: float,
    end_lr_ratio: float,
    ema_decay: float,
    grad_clip: float | None,
    score_weight: float,
    target_weight: float,
    search_batch_size: int,
    verbose: int = 0,
    desc: str = "AmortizedMIPS",
    callback: Callable[[int, nn.Module], None] | None = None,
) -> tuple[AMIPSNetwork, list[dict[str, float]]]:
    """Optimise ``model`` on fresh batches of queries with exact labels.

    Each step draws ``batch_size`` queries (``augment(draw(batch_size))``), labels
    them by chunked exact search over ``keys`` (N, d), and takes an Adam step on
    :func:`amips_loss` with NaN-zeroed gradients, global-norm clipping
    (``grad_clip``) and the warmup-cosine learning rate (linear from 0 to ``lr``
    over ``round(warmup * n_steps)`` steps, cosine to ``end_lr_ratio * lr``). An
    EMA of the weights (decay ``ema_decay``, 0 disables it) is the returned model.
    Gradient models (SupportNet) differentiate their key, an input gradient, through
    ``create_graph=True``. ``callback(step, current_eval_model)`` is called after each step
    (used for learning curves; the model passed is the EMA when enabled).

    Raises ``FloatingPointError`` when the loss is not finite at a logged step.

    Returns
    -------
    model : nn.Module
        The EMA (or raw) model, in eval mode with ``requires_grad`` off.
    history : list of dict
        ``step``, ``loss``, ``score_loss``, ``key_loss``, ``lr`` every
        ``max(1, n_steps // 200)`` steps and at the last step.
    """
    ema = copy.deepcopy(model) if ema_decay > 0 else None
    if ema is not None:
        ema.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    # at least the last step in the decay: a warm-up rounded to every step (n_steps=10,
    # warmup=0.95) never decayed and the last update used the peak lr
    warmup_steps = min(int(round(warmup * n_steps)), n_steps - 1)
    end_lr = lr * end_lr_ratio
    log_every = max(1, n_steps // 200)
    stats = _KeyStats(keys)  # (the keys do not change during training)
    logger = ProgressLogger(n_steps, verbose, desc=desc)
    model.train()
    for step in logger:
        lr_t = warmup_cosine_lr(step + 1, n_steps, lr, warmup_steps, end_lr)
        for group in opt.param_groups:
            group["lr"] = lr_t
        q = augment(draw(batch_size))
        with torch.no_grad():
            true_score, idx = _support(q, keys, search_batch_size, stats)
        pred_score, pred_key = model.score_and_key(q, create_graph=True)
        loss, s_loss, k_loss = amips_loss(pred_score, pred_key, true_score, keys[idx],
                                          score_weight=score_weight,
                                          target_weight=target_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in params:
            if p.grad is not None:
                torch.nan_to_num_(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        if ema is not None:
            with torch.no_grad():
                for pe, p in zip(ema.parameters(), model.parameters()):
                    pe.lerp_(p, 1.0 - ema_decay)
        if step % log_every == 0 or step == n_steps - 1:
            if not math.isfinite(loss.item()):
                # the NaN-zeroed gradients then leave the weights as they are: without
                # this the fit returned an untrained model, with inf in history_
                raise FloatingPointError(
                    f"{desc} training loss is not finite at step {step} (score loss "
                    f"{s_loss.item():.3g}, key loss {k_loss.item():.3g}); lower "
                    f"score_weight (now {score_weight!r}), target_weight (now "
                    f"{target_weight!r}) or lr (now {lr!r}).")
            logger.log(step=step, loss=loss.item(), score_loss=s_loss.item(),
                       key_loss=k_loss.item(), lr=lr_t)
        if callback is not None:
            callback(step, ema if ema is not None else model)
    final = ema if ema is not None else model
    final.eval()
    final.requires_grad_(False)
    return final, logger.history


def power_of_two_scale(x: torch.Tensor) -> float:
    """The power of two nearest the root-mean-square row norm of ``x`` (n, d).

    The unit in which :func:`fit_amips` trains: dividing keys and queries by it puts
    them near unit norm whatever the user's units (the argmax of inner products is
    invariant to positive scalings), and a power of two rescales exactly, so data
    already near unit norm (the paper's normalised embeddings) train bit for bit as
    without it. Returns 1.0 for all-zero or non-finite data.
    """
    # float64 squares summed in row chunks of 2**20 values: a float64 copy and its
    # square of the whole matrix took 4x the memory of the keys (1 GB for 10**6 x 64)
    x = x.detach()
    rows = block_rows_for(x.shape[1], 2**20)
    total = sum(float(x[r].double().square().sum()) for r in row_blocks(x.shape[0], rows))
    rms = math.sqrt(total / x.shape[0]) if x.numel() else 0.0
    if not math.isfinite(rms) or rms <= 0.0:
        return 1.0
    # within float32's powers of two, [2**-149, 2**127]: rms near float32's maximum
    # rounded up to 2**128 (inf in float32: every scaled key became 0), and rms below
    # the smallest subnormal to a unit that is 0 in float32 (NaN keys)
    return float(2.0 ** min(max(round(math.log2(rms)), -149), 127))


def column_mean(keys: torch.Tensor) -> torch.Tensor:
    """Mean (d,) of the rows of ``keys`` (N, d), summed in float64 by row chunks (no
    float64 copy of the database), returned in the keys' dtype."""
    rows = block_rows_for(keys.shape[1], 2**20)
    # (a tensor: a fitted database has at least one row)
    total = cast(torch.Tensor,
                 sum(keys[r].double().sum(0) for r in row_blocks(keys.shape[0], rows)))
    return (total / keys.shape[0]).to(keys.dtype)


def centre(keys: torch.Tensor, key_mean: torch.Tensor) -> torch.Tensor:
    """``keys - key_mean``: the same float32 rows in training and in the search (a
    centred copy of the database). Raises ``ValueError`` if it overflows."""
    out = keys - key_mean
    if not bool(torch.isfinite(out).all()):
        raise ValueError("center_keys=True: the centred keys overflow float32 (keys "
                         "near +-3.4e38 on both sides of their mean); rescale the keys.")
    return out


def fit_amips(est, keys: torch.Tensor, queries: QuerySource,
              callback: Callable[[int, nn.Module], None] | None = None) -> None:
    """Train the network of :class:`AmortizedMIPS` ``est`` on the database ``keys`` (N, d).

    Sets ``model_``, ``hidden_dims_``, ``history_``, ``n_params_``, ``key_scale_``,
    ``query_scale_`` and ``key_mean_`` on ``est`` (whose ``_init_fit`` has run). The
    network is trained on ``keys / key_scale_`` (``(keys - key_mean_) / key_scale_``
    with ``center_keys``; ``key_mean_`` is ``None`` without) and ``queries /
    query_scale_`` (both powers of two from :func:`power_of_two_scale`: the training
    queries' scale is measured on the initialisation batch), so that its learning
    dynamics (Adam's epsilon, the soft-leaky-ReLU's fixed ``beta``, the data-dependent
    initialisation) do not depend on the units of the data; the estimator maps
    predictions back to the data's units (and coordinates).
    """
    n_keys, d = keys.shape
    draw = make_query_source(queries, d, device=est._device, torch_gen=est._torch_gen,
                             numpy_gen=est._numpy_gen, owner=type(est).__name__,
                             # (queries of columns in another order trained silently)
                             check_names=lambda X: check_feature_names(est, X, "queries"))
    gen = est._torch_gen

    def augment(q):
        return augment_queries(q, est.noise_std, est.n_noise, gen)

    # model init from a generator seeded by the private one: the global RNG, shared by
    # all threads, is never seeded (a fork_rng + manual_seed here made simultaneous fits
    # in threads draw each other's initialisations and left the global RNG changed)
    seed = int(torch.randint(2**62, (1,), generator=gen))
    model, est.hidden_dims_ = est._build_model(n_keys, d, seed=seed)
    model = model.to(est._device)
    # the units are measured before the augmentation (which keeps each norm) and the
    # augmentation runs in them: its float32 norms overflowed for queries of norm 1e19
    # (a NaN batch: training in the data's units) and underflowed for 1e-19
    init_batch = draw(min(est.batch_size, 1024))
    # center_keys: train on K - mean (the argmax and the network's convexity and
    # homogeneity are unchanged, sigma_{K-m}(x) = sigma_K(x) - <x, m>); with a large
    # common offset the spread of the keys was ~1e-4 of the training units below
    # and every query learned the same key
    key_mean = None
    if est.center_keys:
        key_mean = column_mean(keys)
        keys = centre(keys, key_mean)
    key_scale, query_scale = power_of_two_scale(keys), power_of_two_scale(init_batch)
    # (no copy of the database when it is already in its units: a division by 1.0
    # duplicated 256 MB of keys at 10**6 x 64 for the whole fit)
    keys = keys if key_scale == 1.0 else keys / key_scale
    init_batch = augment(init_batch / query_scale)

    def draw_scaled(n):
        return draw(n) / query_scale

    if init_batch.shape[0] >= 2:
        model.data_init(init_batch)
    if est.arch == "keynet" and est.resnet:
        # the residual branch starts small, so the model starts near the identity map
        # x -> x (the official KeyNet(resnet=True) scales its final layer by 0.01)
        model.scale_output(0.01)
    else:
        # match the initial key norms to the labels' (a positive scale keeps convexity)
        match_output_scale(model, init_batch, keys, search_batch_size=est.search_batch_size)
    # set before training: a callback reads the units of the fit in progress
    est.key_scale_, est.query_scale_ = key_scale, query_scale
    est.key_mean_ = None if key_mean is None else est._to_numpy(key_mean)
    est.model_, est.history_ = train_amips(
        model, keys, draw_scaled, augment=augment, n_steps=est.n_steps,
        batch_size=est.batch_size, lr=est.lr, warmup=est.warmup,
        end_lr_ratio=est.end_lr_ratio, ema_decay=est.ema_decay,
        grad_clip=est.grad_clip, score_weight=est.score_weight,
        target_weight=est.target_weight, search_batch_size=est.search_batch_size,
        verbose=est.verbose,
        desc=type(est).__name__, callback=callback)
    est.n_params_ = int(sum(p.numel() for p in est.model_.parameters()))
