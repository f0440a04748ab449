"""Pure tensor kernels of amortized MIPS: exact chunked search, the support function,
the training loss, the learning-rate schedule and tie-aware retrieval metrics.

Shapes: ``n`` queries, ``N`` keys, ``d`` features, ``k`` neighbours.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias, get_args

import torch

from mlpapers._utils import (
    ArrayLike,
    check_finite,
    check_in_options,
    check_positive,
    on_inputs_device,
    power_of_two_unit,
    requires_tensors,
    torch_compatible_array,
)
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for

__all__ = [
    "amips_loss",
    "gather_dot",
    "mean_reciprocal_rank",
    "match_rate",
    "mips_topk",
    "rank_by_key",
    "recall_at_k",
    "search_rows",
    "support_function",
    "warmup_cosine_lr",
]


#: Most scores held by one chunk of :func:`mips_topk` (256 MiB in float32): the number
#: of queries per chunk is also capped by ``CHUNK_SCORES // n_keys``.
CHUNK_SCORES = 2**26


def search_rows(batch_size: int, n_keys: int) -> int:
    """Queries per chunk of a search over ``n_keys`` keys: at most ``batch_size`` and
    at most ``CHUNK_SCORES // n_keys`` (at least 1)."""
    return block_rows_for(n_keys, CHUNK_SCORES, cap=batch_size)


def _check_search(queries: torch.Tensor, keys: torch.Tensor, k, batch_size,
                  names: tuple[str, str] = ("queries", "keys")) -> None:
    """Shapes, dtypes, ``k`` and ``batch_size`` of a public search, checked before any
    work: they failed with torch traces (a zero ``k``, a ``k`` above ``N`` or a float
    one, mismatched widths or dtypes, an empty database, no feature) and ``batch_size=0`` was
    silently taken as 1. Only the public kernels check; the estimators validate once."""
    qn, kn = names
    for name, t in ((qn, queries), (kn, keys)):
        if t.ndim != 2:
            raise ValueError(f"{name} must have shape ({'n' if t is queries else 'N'}, d), "
                             f"got {tuple(t.shape)}.")
    if keys.shape[0] == 0:
        raise ValueError(f"{kn} is empty: the search needs at least one key.")
    if queries.shape[1] != keys.shape[1]:
        raise ValueError(f"{qn} and {kn} must have the same number of features, got "
                         f"{queries.shape[1]} and {keys.shape[1]}.")
    if keys.shape[1] == 0:  # (the rescue's smallest |q_i| failed with a torch IndexError)
        raise ValueError(f"{qn} and {kn} have no feature (shape (., 0)): an inner product "
                         "needs at least one.")
    if queries.dtype != keys.dtype:
        raise TypeError(f"{qn} and {kn} must have the same dtype, got {queries.dtype} and "
                        f"{keys.dtype}.")
    if queries.dtype == torch.bool or queries.dtype.is_complex:  # (matmul failed deep in torch)
        raise TypeError(f"{qn} and {kn} must be real numbers (floating or integer), got "
                        f"{queries.dtype}; cast them, e.g. with .float().")
    # a NaN key is the top-1 of every query (topk ranks NaN first) and a NaN or infinite
    # query ranks nothing: the returned indices were arbitrary
    check_finite(queries, qn)
    check_finite(keys, kn)
    check_positive(k, "k", integer=True)
    if k > keys.shape[0]:
        raise ValueError(f"k must be <= the number of keys ({keys.shape[0]}), got {k}.")
    check_positive(batch_size, "batch_size", integer=True)


@on_inputs_device
@requires_tensors
def mips_topk(
    queries: torch.Tensor, keys: torch.Tensor, k: int = 1, *, batch_size: int = 8192
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact maximum inner product search by chunked matmul + top-k.

    Parameters
    ----------
    queries : torch.Tensor of shape (n, d)
        Query vectors.
    keys : torch.Tensor of shape (N, d)
        The database, in the dtype of ``queries``.
    k : int, default=1
        Number of neighbours (``1 <= k <= N``).
    batch_size : int, default=8192
        Most queries per chunk. A chunk also holds at most ``2**26`` scores
        (256 MiB in float32: ``min(batch_size, 2**26 // N)`` queries), so the
        memory stays bounded for large databases (2**20 keys: 64 queries per chunk).

    Returns
    -------
    scores : Tensor of shape (n, k)
        Inner products ``<q, k_j>``, in descending order.
    indices : Tensor of shape (n, k), int64
        Indices of the keys. Exact ties are broken towards the lowest index (the
        order of a stable descending sort), so ``indices[:, 0]`` is the ``argmax``
        for every ``k``. Ties are those of the computed scores: in float32, copies
        of a key can score one unit in the last place apart (the BLAS rounding
        depends on the row and on the number of queries in a chunk).

    Notes
    -----
    The ranking of a query does not depend on its scale, so a row that may overflow
    (``||q|| sqrt(d) max|k_ij|`` above about ``2**120`` in float32) or whose top-``k``
    holds a product below ``2**-100`` in magnitude while an element-wise product
    ``q_i k_ji`` can leave the normal range (``min|q_i| min|k_ji|`` over the nonzero
    entries below ``2**-125``; there products lose precision or flush to zero and
    tie) is searched again with the query multiplied by a power of two. The factor
    puts the bound ``||q|| sqrt(d) max|k_ij|`` of its products near ``2**120`` (when
    ``sqrt(d) max|k_ij| < 1``, it is ``||q||`` itself that is moved near ``2**120``).
    The indices are then those of the exact search in the dtype's rounding for any
    finite data, as long as the top-``k`` products of a query are above about
    ``1e-66 ||q|| max(1, sqrt(d) max|k_ij|)``, ``1e-66`` times the quantity actually
    placed near ``2**120`` (float32; below it they may still tie). The scores are
    scaled back: a product beyond the range of the dtype is returned as ``+-inf``,
    one below it as 0 or a subnormal. Exact
    zero products that no rescaling can change (sparse or one-hot data, zero
    queries) are not searched again. Half-precision inputs (float16, bfloat16) are
    searched in their dtype and only the rows whose outputs leave its range are
    searched again, in float32; integer inputs are searched exactly, in their dtype, or
    in int64 (float64 beyond its range) when a product could wrap around.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import mips_topk
    >>> keys = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> scores, idx = mips_topk(torch.tensor([[1.0, 0.5]]), keys, k=2)
    >>> scores, idx
    (tensor([[1.5000, 1.0000]]), tensor([[2, 0]]))
    >>> mips_topk(torch.tensor([[1.0, 1.0]]), keys, k=3)[1]  # 2, 2, 1: ties lowest first
    tensor([[1, 2, 0]])
    """
    _check_search(queries, keys, k, batch_size)
    return _mips_topk(queries, keys, int(k), int(batch_size), _KeyStats(keys))


def _abs_max(x: torch.Tensor) -> float:
    """``max |x_ij|`` as a Python float, in one pass (``aminmax``: no ``|x|`` copy)."""
    if not x.numel():
        return 0.0
    # detached: a scale statistic, not part of a graph (a key tensor that requires grad
    # made torch warn about converting it to a Python float)
    lo, hi = torch.aminmax(x.detach())
    return max(float(hi), -float(lo))


def _min_nonzero_abs(x: torch.Tensor) -> float:
    """Smallest nonzero ``|x_ij|`` (``inf`` if none), by chunks of rows so the ``|x|``
    temporary stays within :data:`CHUNK_SCORES` elements."""
    out = math.inf
    rows = block_rows_for(x.shape[1], CHUNK_SCORES)
    for s in range(0, x.shape[0], rows):
        a = x[s:s + rows].detach().abs()  # (d >= 1: the searches refuse d = 0)
        out = min(out, float(a.masked_fill(a == 0, math.inf).min()))
    return out


class _KeyStats:
    """Scale statistics of a key matrix (N, d) used to decide which rows of a search
    are rescued: ``amax = max|k_ij|``, ``bound = sqrt(d) amax`` (a bound on the key
    norms, float64) and, computed on first use only (a pass over the keys that
    ordinary data never needs), ``min_nonzero = min |k_ij| over k_ij != 0``.
    The estimators cache one per database (the keys do not change)."""

    __slots__ = ("_keys", "_min_nonzero", "amax", "bound")

    def __init__(self, keys: torch.Tensor, amax: float | None = None):
        self._keys = keys
        self.amax = _abs_max(keys) if amax is None else amax
        self.bound = self.amax * math.sqrt(keys.shape[1])
        self._min_nonzero: float | None = None

    @property
    def min_nonzero(self) -> float:
        if self._min_nonzero is None:
            self._min_nonzero = _min_nonzero_abs(self._keys)
        return self._min_nonzero


def _wide_enough(queries: torch.Tensor, keys: torch.Tensor,
                 key_amax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer queries and keys in a dtype where no inner product can wrap around.

    The products of integers are exact only while they fit: int32 queries and keys of
    50000 wrapped to -1794967296 and the best key was ranked last, silently. When the
    bound ``d max|q| max|k|`` exceeds the dtype's range, the search runs in int64 (still
    exact), or in float64 beyond int64's range.
    """
    bound = float(keys.shape[1]) * _abs_max(queries) * key_amax * (1 + 1e-9)
    if bound <= torch.iinfo(queries.dtype).max:
        return queries, keys
    wide = torch.int64 if bound <= torch.iinfo(torch.int64).max else torch.float64
    return queries.to(wide), keys.to(wide)


def _mips_topk(queries: torch.Tensor, keys: torch.Tensor, k: int, batch_size: int,
               stats: _KeyStats) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mips_topk` with the :class:`_KeyStats` ``stats`` of ``keys`` given (cached
    by the estimators, whose database does not change)."""
    n = queries.shape[0]
    batch_size = search_rows(batch_size, keys.shape[0])
    floating = queries.dtype.is_floating_point and keys.dtype.is_floating_point
    if not floating:  # (float64 holds every product of int64 values: nothing to rescue)
        queries, keys = _wide_enough(queries, keys, stats.amax)
    scores = torch.empty(n, k, dtype=queries.dtype, device=queries.device)
    indices = torch.empty(n, k, dtype=torch.long, device=queries.device)
    if floating:
        fi = torch.finfo(queries.dtype)
        half = fi.bits == 16 or torch.finfo(keys.dtype).bits == 16
        if half:
            # float16/bfloat16: the thresholds of float32 below gave 0.5 and 2**7 here
            # (every row searched twice). The products are computed as before; a row is
            # rescued (searched again in float32) only when an output may leave the
            # range, or when a top-k output is near the subnormals while an element
            # product can be (below 2**-11 and 2**-13 in float16)
            fi = torch.finfo(torch.promote_types(queries.dtype, keys.dtype))
            safe = 2.0 ** (math.floor(math.log2(fi.max)) - 1)
            tiny = fi.tiny * 8.0
        else:
            safe = 2.0 ** (math.floor(math.log2(fi.max)) - 8)  # 2**120 in float32
            tiny = fi.tiny / fi.eps * 8.0  # 2**-100 in float32
        under = 2.0 * fi.tiny  # 2**-125 in float32: an element product may be subnormal
        bound = stats.bound
        keys32 = None
    for start in range(0, n, batch_size):
        q = queries[start:start + batch_size]
        s, i = _topk_rows(q @ keys.T, k)  # the (b, N) scores are freed on return
        if floating:  # integers are exact (widened above): nothing to rescue
            # Rows searched again with the query rescaled by a power of two (the ranking
            # of a row does not depend on it): those where a product may overflow (an
            # overflow to -inf or NaN can hide the true maximum: 2.6e40 computed as -inf
            # was ranked last, silently) and those with a top-k value near the subnormal
            # range (keys and queries of norm 1e-23: every product 0 in float32, index 0
            # returned) where an element product can actually underflow: an exact zero
            # (sparse or one-hot data) is the same at any scale, and a search again
            # doubled the cost of such rows
            bad = ~(q.norm(dim=1) * bound <= safe)  # a norm that overflows counts too
            bad |= ~torch.isfinite(s).all(dim=1)
            small = ~bad & (s.abs() < tiny).any(dim=1)
            if bool(small.any()):
                r = small.nonzero()[:, 0]
                qa = q[r].abs()
                qmin = qa.masked_fill(qa == 0, math.inf).amin(dim=1)
                kmin = stats.min_nonzero
                if kmin < math.inf:
                    bad[r] = qmin < under / kmin
            if bool(bad.any()):
                rows = bad.nonzero()[:, 0]
                if half:  # in float32, whose range holds every product of half floats
                    if keys32 is None:
                        keys32 = keys.float()
                    sr, ir = _rescaled_topk(q[rows].float(), keys32, k, bound)
                    s[rows], i[rows] = sr.to(s.dtype), ir
                else:
                    s[rows], i[rows] = _rescaled_topk(q[rows], keys, k, bound)
        scores[start:start + batch_size] = s
        indices[start:start + batch_size] = i
        del s, i  # else the next chunk's scores are built while these are alive
    return scores, indices


def _topk_rows(sim: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of each row of ``sim`` (b, N), ties by lowest index."""
    if k == 1:
        return sim.max(dim=1, keepdim=True)
    return _topk_lowest_index(sim, k)


def _scale_pow2(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``x * 2**e[:, None]`` row by row (``e`` integral, in ``x``'s dtype: small integers,
    exact in float32, so no float64 is needed on devices without it), in steps of
    factors the dtype holds (``2**1074`` does not fit float64): while the result is a
    normal number every step is exact (the intermediates lie between ``x`` and the
    result)."""
    big = float(math.floor(math.log2(torch.finfo(x.dtype).max)) - 1)
    e = torch.where(torch.isfinite(e), e, 0.0).to(x.dtype)  # a copy; never an endless loop
    while bool((e != 0).any()):
        step = e.clamp(-big, big)
        x = x * torch.exp2(step)[:, None]
        e -= step
    return x


def _pow2_unit(x: torch.Tensor, *, rows: bool) -> torch.Tensor:
    """``x`` (n, d) divided by the power of two nearest its largest ``|x_ij|`` (of each
    row with ``rows``): exact, and the ranking of inner products with a query (a row)
    and the scale-free tie tolerance of :func:`_hits` do not depend on it."""
    if rows:
        m = x.abs().amax(dim=1)
    else:  # (no |x| temporary of the size of a database)
        m = x.new_full((x.shape[0],), _abs_max(x))
    e = torch.where((m > 0) & torch.isfinite(m), torch.log2(m).round(), 0.0)
    if not bool((e != 0).any()):
        return x
    return _scale_pow2(x, -e)


def _rescaled_topk(q: torch.Tensor, keys: torch.Tensor, k: int,
                   bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mips_topk` of the rows ``q`` (b, d) rescaled by powers of two so that the
    Cauchy-Schwarz bound ``|q| * bound`` of their inner products sits just below
    the largest float of the dtype (no overflow, and the widest range above the
    subnormals); the scores are scaled back (to +-inf or 0 if out of range)."""
    if bound == 0.0:  # all products exactly 0
        return _topk_rows(q @ keys.T, k)
    # log2 |q| without overflow (rows of norm above the dtype's range), in q's own dtype
    # (no float64 on MPS): the exponent only needs to be right within a few units
    m = q.abs().amax(dim=1)
    log_qn = torch.log2(m) + torch.log2(
        torch.linalg.vector_norm(q / torch.where(m > 0, m, 1.0)[:, None], dim=1))
    top = math.floor(math.log2(torch.finfo(q.dtype).max)) - 8  # 2**120 in float32
    e = (top - max(0.0, math.log2(bound)) - log_qn).floor()
    # zero queries: all products exactly 0 anyway; a non-finite row (an overflowed
    # predicted key) is left as it is (its infinite scale would never be reached)
    e = torch.where((m > 0) & torch.isfinite(e), e, 0.0)
    s, i = _topk_rows(_scale_pow2(q, e) @ keys.T, k)
    return _scale_pow2(s, -e), i


def _topk_lowest_index(sim: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk`` of the rows of ``sim`` (b, N) with exact ties ordered by index.

    The order is that of a stable descending sort (``np.argsort(-sim, kind="stable")``),
    so the first column agrees with ``argmax``; ``torch.topk`` alone orders tied
    values arbitrarily. In rows whose ties straddle the k-th place, the keys tied
    with the k-th value are taken by lowest index (linear in ``N``).
    """
    extra = int(k < sim.shape[1])  # one more place tells whether ties straddle the k-th
    s, i = sim.topk(k + extra, dim=1, largest=True, sorted=True)
    crowded = s[:, k - 1] == s[:, -1] if extra else s.new_zeros(len(s), dtype=torch.bool)
    s, i = s[:, :k], i[:, :k]
    crowded_rows = crowded.nonzero()[:, 0]
    # in blocks of rows: the copies, masks and running count of whole rows below were
    # made for every crowded row of the chunk at once (duplicated keys: 1.7 GB peak
    # against 0.2 GB, for a chunk bounded at 256 MiB)
    block = block_rows_for(sim.shape[1], BLOCK_ELEMENTS)
    for start in range(0, len(crowded_rows), block):
        # keep everything above the k-th value, then the lowest-index keys tied with it
        # (a mask and a cumsum: linear in N, unlike a full sort of the row)
        rows = crowded_rows[start:start + block]
        sub, kth = sim[rows], s[rows, k - 1:k]
        # NaN (an overflow inf - inf) is ranked first by topk: counted above the k-th,
        # or fewer than k keys were kept (a reshape error)
        above = (sub > kth) | sub.isnan()
        tied = sub == kth
        need = k - above.sum(dim=1, keepdim=True)
        keep = above | (tied & (tied.cumsum(dim=1, dtype=torch.int32) <= need))
        idx = keep.nonzero()[:, 1].reshape(len(rows), k)  # row-major: ascending per row
        s[rows], i[rows] = sub.gather(1, idx), idx
    order = i.argsort(dim=1)
    s, i = s.gather(1, order), i.gather(1, order)
    order = s.argsort(dim=1, descending=True, stable=True)
    return s.gather(1, order), i.gather(1, order)


#: Most gathered key entries (``chunk x k x d``) held by one chunk of :func:`gather_dot`
#: (16 MiB in float32). It was :data:`CHUNK_SCORES` (256 MiB): ``kneighbors`` of 10**5
#: queries held a 256 MiB gather beside its search chunk (337 MB peak; 57 - 74 MB now), and
#: the smaller chunks are also faster (0.33 s against 0.47 s for 10**5 x 10 x 64); the
#: values are the same (each row's products do not depend on the chunk).
GATHER_ELEMENTS = BLOCK_ELEMENTS


def _gather_rows(k: int, d: int) -> int:
    """Queries per chunk of a gather of ``k`` keys of ``d`` features each, so that the
    gathered keys (``chunk x k x d``) stay within :data:`GATHER_ELEMENTS` elements
    (never more than :data:`CHUNK_SCORES`, the bound of every chunk of this module)."""
    return block_rows_for(k * d, min(GATHER_ELEMENTS, CHUNK_SCORES))


def _float64_device(device: torch.device) -> torch.device:
    """Where float64 products are computed: ``device``, or the CPU for MPS (no float64)."""
    return torch.device("cpu") if device.type == "mps" else device


def _dot64(keys: torch.Tensor, index: torch.Tensor, queries: torch.Tensor,
           dev: torch.device) -> torch.Tensor:
    """``<queries[i], keys[index[i, j]]>`` (n, k) in float64 on ``dev``, from the gathered
    rows only (moved before the cast: MPS has no float64; no float64 copy of ``keys``)."""
    return torch.einsum("nkd,nd->nk", keys[index].to(dev).double(),
                        queries.to(dev).double())


def gather_dot(keys: torch.Tensor, index: torch.Tensor, queries: torch.Tensor,
               exact: bool = False) -> torch.Tensor:
    """``<queries[i], keys[index[i, j]]>`` of shape (n, k), in chunks of queries so the
    gathered keys (``chunk x k x d``) stay within :data:`GATHER_ELEMENTS` elements.

    ``exact=True`` computes them in float64 (on the CPU where the device has none), from
    the gathered rows only (no float64 copy of ``keys``): products of float32 numbers are
    then exact up to the rounding of the sum, which is what a re-ranking needs."""
    n, k = index.shape
    rows = _gather_rows(k, keys.shape[1])
    if exact:
        dev = _float64_device(queries.device)
        out = torch.empty(n, k, dtype=torch.float64, device=dev)
        for s in range(0, n, rows):
            out[s:s + rows] = _dot64(keys, index[s:s + rows], queries[s:s + rows], dev)
        return out
    out = torch.empty(n, k, dtype=torch.promote_types(keys.dtype, queries.dtype),
                      device=queries.device)
    for s in range(0, n, rows):
        out[s:s + rows] = torch.einsum("nkd,nd->nk", keys[index[s:s + rows]],
                                       queries[s:s + rows])
    # a product that overflows the dtype (inf - inf = NaN for a finite inner product of
    # 1e20-scale data) is recomputed in float64: NaN never, inf only beyond the range.
    # By chunks of the same size (every row may overflow)
    bad = ~torch.isfinite(out).all(dim=1)
    if bool(bad.any()) and out.dtype != torch.float64:
        r = bad.nonzero()[:, 0]
        dev = _float64_device(out.device)
        for s in range(0, len(r), rows):
            rr = r[s:s + rows]
            out[rr] = _dot64(keys, index[rr], queries[rr], dev).to(out.dtype).to(out.device)
    return out


@on_inputs_device
@requires_tensors
def support_function(
    queries: torch.Tensor, keys: torch.Tensor, *, batch_size: int = 8192
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The support function :math:`\sigma_K(x) = \max_i \langle x, k_i\rangle` and its argmax.

    Where the argmax is unique, :math:`\nabla\sigma_K(x) = k_{i^*(x)}` (Danskin), so
    ``keys[index]`` is both the MIPS answer and the gradient target of the
    amortized models.

    Parameters
    ----------
    queries : torch.Tensor of shape (n, d)
        Query vectors :math:`x`.
    keys : torch.Tensor of shape (N, d)
        The database :math:`K`, in the dtype of ``queries``.
    batch_size : int, default=8192
        Most queries per chunk of the search (see :func:`mips_topk`).

    Returns
    -------
    value : torch.Tensor of shape (n,)
        :math:`\sigma_K(x)`, the largest inner product of each query.
    index : torch.Tensor of shape (n,), int64
        Index of the maximising key (the lowest on exact ties).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import support_function
    >>> keys = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    >>> support_function(torch.tensor([[3.0, 1.0], [1.0, 1.0]]), keys)
    (tensor([3., 2.]), tensor([0, 1]))
    """
    s, i = mips_topk(queries, keys, 1, batch_size=batch_size)  # (which validates)
    return s[:, 0], i[:, 0]


def _support(queries: torch.Tensor, keys: torch.Tensor, batch_size: int,
             stats: _KeyStats) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`support_function` on validated inputs, with the cached ``stats`` of
    ``keys``: the training loop labels every step's queries against the same keys
    (checking and scanning the keys at every step cost a pass over the database)."""
    s, i = _mips_topk(queries, keys, 1, batch_size, stats)
    return s[:, 0], i[:, 0]


#: ``rank_by_key(metric=...)``, ``build_faiss_ivf(metric=...)`` and
#: ``AmortizedMIPS(retrieval=...)``; ``METRICS`` lists its values.
Metric: TypeAlias = Literal["ip", "l2"]
METRICS: tuple[str, ...] = get_args(Metric)


@on_inputs_device
@requires_tensors
def rank_by_key(key_hat: torch.Tensor, keys: torch.Tensor, k: int, *, metric: Metric = "ip",
                batch_size: int = 8192) -> torch.Tensor:
    r"""Indices (n, k) of the keys closest to predicted keys ``key_hat`` (n, d).

    ``metric="ip"`` ranks by :math:`\langle \hat k, k_j\rangle` (the paper's rule);
    ``"l2"`` by :math:`-\|\hat k - k_j\|^2`, computed as a MIPS on augmented vectors
    :math:`[\hat k, 1]` and :math:`[k_j, -\|k_j\|^2/2]`.

    Parameters
    ----------
    key_hat : torch.Tensor of shape (n, d)
        Predicted keys (e.g. :meth:`AmortizedMIPS.predict_key`).
    keys : torch.Tensor of shape (N, d)
        The database.
    k : int
        Number of keys returned per row, in ``[1, N]``.
    metric : {"ip", "l2"}, default="ip"
        Similarity to the predicted key: inner product or (negative) squared
        Euclidean distance.
    batch_size : int, default=8192
        Most rows per chunk of the search (see :func:`mips_topk`).

    Returns
    -------
    torch.Tensor of shape (n, k), int64
        Indices of the keys, most similar first (exact ties: lowest index first).

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import rank_by_key
    >>> keys = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    >>> key_hat = torch.tensor([[1.1, 0.0]])
    >>> rank_by_key(key_hat, keys, 2), rank_by_key(key_hat, keys, 2, metric="l2")
    (tensor([[1, 0]]), tensor([[0, 1]]))
    """
    check_in_options(metric, "metric", METRICS)
    if metric == "l2" and not (key_hat.is_floating_point() and keys.is_floating_point()):
        # integers: -||k||^2 / 2 is not an integer, and matmul needs one dtype
        key_hat, keys = key_hat.float(), keys.float()
    _check_search(key_hat, keys, k, batch_size, names=("key_hat", "keys"))
    return _rank_by_key(key_hat, keys, int(k), metric, int(batch_size), None)


def _rank_by_key(key_hat: torch.Tensor, keys: torch.Tensor, k: int, metric: str,
                 batch_size: int, stats: _KeyStats | None) -> torch.Tensor:
    """:func:`rank_by_key` of floating-point ``key_hat`` and ``keys`` (for ``"l2"``) with
    the :class:`_KeyStats` of ``keys`` given (or ``None``)."""
    if stats is None:
        stats = _KeyStats(keys)
    if metric == "l2":
        # in units of a power of two of the keys (exact; the ranking does not depend on
        # it): ||k_j||^2 overflowed float32 for keys of 1e20 and underflowed for 1e-25,
        # which turned the ranking into garbage or into the "ip" one
        # at least float32: ||k||^2 / 2 of float16 keys overflowed (inf, every key tied)
        # from ||k|| = 362 on; the augmented keys below are a copy anyway
        wide = torch.promote_types(keys.dtype, torch.float32)
        key_hat, keys = key_hat.to(wide), keys.to(wide)
        amax = stats.amax
        unit = power_of_two_unit(amax, 30)
        if unit != 1.0:
            key_hat, keys, amax = key_hat / unit, keys / unit, amax / unit
        key_hat = torch.cat([key_hat, key_hat.new_ones(len(key_hat), 1)], 1)
        half_sq = -0.5 * keys.square().sum(1, keepdim=True)
        keys = torch.cat([keys, half_sq], 1)
        # the augmented keys' largest entry, from the new column alone (N values)
        stats = _KeyStats(keys, amax=max(amax, _abs_max(half_sq)))
    return _mips_topk(key_hat, keys, k, batch_size, stats)[1]


@on_inputs_device
@requires_tensors
def amips_loss(
    pred_score: torch.Tensor,
    pred_key: torch.Tensor,
    true_score: torch.Tensor,
    true_key: torch.Tensor,
    *,
    score_weight: float = 0.01,
    target_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The AMIPS regression loss.

    .. math::

        L = w_s \,\mathrm{mean}_b (\hat s_b - \sigma_K(x_b))^2
          + w_k \,\mathrm{mean}_{b,j} (\hat k_{bj} - k^*_{bj})^2

    (squared errors averaged over all elements, as in the official code).

    Parameters
    ----------
    pred_score : torch.Tensor of shape (b,)
        Predicted support values :math:`\hat s_b`.
    pred_key : torch.Tensor of shape (b, d)
        Predicted argmax keys :math:`\hat k_b`.
    true_score : torch.Tensor of shape (b,)
        Exact support values :math:`\sigma_K(x_b)` (see :func:`support_function`).
    true_key : torch.Tensor of shape (b, d)
        Exact argmax keys :math:`k^*_b`.
    score_weight : float, default=0.01
        Weight :math:`w_s` of the score term.
    target_weight : float, default=1.0
        Weight :math:`w_k` of the key term.

    Returns
    -------
    total : torch.Tensor
        The weighted loss :math:`L` (a scalar, differentiable in the predictions).
    score_loss : torch.Tensor
        The unweighted score term (a scalar).
    key_loss : torch.Tensor
        The unweighted key term (a scalar).

    Raises
    ------
    ValueError
        If the shapes differ from the above (a score of shape (b, 1) against (b,)
        would otherwise broadcast to (b, b) and give a wrong loss without an error),
        or if ``b`` or ``d`` is 0.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.retrieval.amips import amips_loss
    >>> total, s_loss, k_loss = amips_loss(torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]),
    ...                                    torch.tensor([2.0]), torch.tensor([[0.0, 0.0]]))
    >>> float(s_loss), float(k_loss), round(float(total), 4)  # 0.01 * 1 + 1 * 0.5
    (1.0, 0.5, 0.51)
    """
    b = pred_score.shape[0] if pred_score.dim() == 1 else None
    if b is None or true_score.shape != (b,):
        raise ValueError("pred_score and true_score must have the same shape (b,), got "
                         f"{tuple(pred_score.shape)} and {tuple(true_score.shape)}.")
    if pred_key.dim() != 2 or pred_key.shape[0] != b or true_key.shape != pred_key.shape:
        raise ValueError(f"pred_key and true_key must have the same shape (b, d) with b={b} "
                         f"(the scores' length), got {tuple(pred_key.shape)} and "
                         f"{tuple(true_key.shape)}.")
    if 0 in pred_key.shape:  # (the means of no terms were NaN)
        raise ValueError(f"amips_loss needs at least one query and one feature, got "
                         f"pred_key of shape {tuple(pred_key.shape)}.")
    # (a negative or NaN weight trained away from the labels or on NaN, silently; a
    # tensor weight, e.g. a learnable one, is the caller's to keep in range)
    for value, name in ((score_weight, "score_weight"), (target_weight, "target_weight")):
        if not isinstance(value, torch.Tensor):
            check_positive(value, name, strict=False)
    score_loss = (pred_score - true_score).square().mean()
    key_loss = (pred_key - true_key).square().mean()
    return score_weight * score_loss + target_weight * key_loss, score_loss, key_loss


def warmup_cosine_lr(step: int, n_steps: int, peak: float, warmup_steps: int,
                     end: float) -> float:
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps``, then cosine decay to ``end``.

    The optax ``warmup_cosine_decay_schedule`` used by the official code (with
    ``init_value=0``); ``step`` counts from 0.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return peak * step / warmup_steps
    span = max(n_steps - warmup_steps, 1)
    frac = min(max(step - warmup_steps, 0) / span, 1.0)
    return end + 0.5 * (peak - end) * (1.0 + math.cos(math.pi * frac))


# -- metrics -----------------------------------------------------------------
def _as_tensor(a, dtype=None) -> torch.Tensor:
    """Tensor view of an array-like (copied only when torch cannot read it as is)."""
    if isinstance(a, torch.Tensor):
        return a.detach() if dtype is None else a.detach().to(dtype)
    return torch.as_tensor(torch_compatible_array(a), dtype=dtype)


def _as_long_2d(y_pred, name: str = "y_pred") -> torch.Tensor:
    try:
        t = _as_tensor(y_pred)
    except (TypeError, ValueError) as err:  # strings, objects: torch's own message
        what = (f"{type(y_pred).__name__} of dtype {y_pred.dtype}" if hasattr(y_pred, "dtype")
                else f"a {type(y_pred).__name__} that is not an array of numbers")
        raise TypeError(f"{name} must hold integer indices (rows of the database), got "
                        f"{what}.") from err
    if t.ndim == 1:
        t = t[:, None]
    if t.ndim != 2:
        raise ValueError(f"{name} must be 1D or 2D, got {t.ndim}D.")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty; at least one query is required.")
    if t.shape[1] == 0:  # (failed with a torch IndexError)
        raise ValueError(f"{name} has no column: at least one index per query is required.")
    # inf and floats beyond int64 were cast to one same int64 and counted as hits
    if t.dtype == torch.bool or t.is_complex() or (
            t.is_floating_point() and not bool(((t == t.round()) & (t.abs() < 2.0 ** 63)).all())):
        raise TypeError(f"{name} must hold integer indices, got {t.dtype} values.")
    return t.long()


def _real_matrix(a, name: str) -> torch.Tensor:
    """``a`` as a float64 tensor; complex (its imaginary part was dropped with a torch
    warning), boolean and non-numeric data raise an error naming ``name``."""
    try:
        t = _as_tensor(a)
    except (TypeError, ValueError) as err:  # strings, objects, scipy sparse matrices
        raise TypeError(f"{name} must be an array of real numbers, got "
                        f"{type(a).__name__}.") from err
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold real numbers, got {t.dtype} values.")
    return t.to(torch.float64)


def _gathered_diff_norms(K: torch.Tensor, arg: torch.Tensor, pred: torch.Tensor
                         ) -> torch.Tensor:
    """``||K[arg[i]] - K[pred[i, j]]||`` (n, k), by chunks of queries so the gathered
    keys stay within :data:`GATHER_ELEMENTS` elements (as :func:`gather_dot`)."""
    n, k = pred.shape
    rows = _gather_rows(k, K.shape[1])
    out = K.new_empty(n, k)
    for s in range(0, n, rows):
        out[s:s + rows] = (K[pred[s:s + rows]] - K[arg[s:s + rows]][:, None]).norm(dim=2)
    return out


def _hits(y_true, y_pred, queries, database, rtol, batch_size=8192,
          round_eps: float | None = None) -> torch.Tensor:
    """Boolean (n, k) matrix: is the j-th prediction a correct top-1 answer?"""
    check_positive(batch_size, "batch_size", integer=True)
    # a negative rtol counted exact answers as misses (match rate 0.0), silently
    check_positive(rtol, "rtol", strict=False)
    pred = _as_long_2d(y_pred)
    if queries is None and database is None:
        if y_true is None:
            raise ValueError("y_true is required unless queries and database are given "
                             "(the tie-aware mode recomputes the exact answers).")
        # (a float y_true was truncated to integers and an (n, m) one flattened into
        # n m "rows", silently or with a misleading count)
        true2d = _as_long_2d(y_true, "y_true")
        if true2d.shape[1] != 1:
            raise ValueError(f"y_true must have shape (n,), the exact top-1 index of each "
                             f"query, got {tuple(true2d.shape)}.")
        true = true2d[:, 0]
        if true.shape[0] != pred.shape[0]:
            raise ValueError(f"y_true has {true.shape[0]} rows but y_pred has {pred.shape[0]}.")
        return pred == true[:, None].to(pred.device)
    if queries is None or database is None:
        raise ValueError("queries and database must be given together (tie-aware mode).")
    # in float64, queries and database rescaled by powers of two: inner products of
    # data near 1e-160 underflowed (all tied: any prediction a hit) and norms near 1e160
    # overflowed (an infinite tolerance: any prediction a hit)
    q = _real_matrix(queries, "queries")
    K = _real_matrix(database, "database").to(q.device)
    # the searches' checks (2-D, same width, at least one feature and one key) before
    # the rescaling: queries and a database of no feature failed there with a torch
    # IndexError ("amax(): Expected reduction dim 1 to have non-zero size")
    _check_search(q, K, 1, batch_size, names=("queries", "database"))
    q = _pow2_unit(q, rows=True)
    K = _pow2_unit(K, rows=False)
    if q.shape[0] != pred.shape[0]:
        raise ValueError(f"queries has {q.shape[0]} rows but y_pred has {pred.shape[0]}.")
    if bool(((pred < 0) | (pred >= K.shape[0])).any()):
        raise ValueError(f"y_pred holds indices outside [0, {K.shape[0]}) (the rows of "
                         "database).")
    best, arg = _support(q, K, int(batch_size), _KeyStats(K))  # (checked above)
    pred = pred.to(K.device)
    got = gather_dot(K, pred, q)  # (n, k)
    # tolerance from the difference of the two keys compared: a hit when
    # <q, k_best - k_pred> <= rtol ||q|| ||k_best - k_pred|| (+ rounding), invariant to
    # the scale of the data, to the other keys (the largest key of the database widened
    # it for every query) and to a common offset of the keys, which changes no answer:
    # the former ``rtol (|max| + ||q|| (||k_best|| + ||k_pred||))`` grew with the
    # offset (wine keys + 1e4 read a constant prediction's match rate as 0.139
    # against the exact 0.117; an absolute ``+ 1`` before it called every key a tie
    # on small-norm data). Plus the rounding of the two products themselves,
    # ``(d + 2) u ||q|| ||k||`` each (u: float64's, or the search's own precision when
    # the caller says so), so that ties exact in real arithmetic still count
    diff = _gathered_diff_norms(K, arg, pred)
    qn = q.norm(dim=1)[:, None]
    norms = K.norm(dim=1)
    u = torch.finfo(K.dtype).eps if round_eps is None else max(round_eps,
                                                                torch.finfo(K.dtype).eps)
    tol = qn * (rtol * diff + (K.shape[1] + 2) * u * (norms[arg][:, None] + norms[pred]))
    return got >= best[:, None] - tol


@on_inputs_device
def match_rate(y_true: ArrayLike | None, y_pred: ArrayLike, *, queries: ArrayLike | None = None,
               database: ArrayLike | None = None, rtol: float = 1e-6,
               batch_size: int = 8192) -> float:
    """Fraction of queries whose top-1 prediction is the exact MIPS answer (recall@1).

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Exact top-1 indices (ignored in the tie-aware mode).
    y_pred : array-like of shape (n,) or (n, k)
        Predicted indices; only the first column is used.
    queries, database : array-like of shape (n, d) and (N, d), optional
        If given, a prediction counts as a hit when its inner product equals the
        maximum up to ``rtol * ||q|| * ||k_max - k_pred||`` plus the float64 rounding
        of the two products (``(d + 2) eps ||q|| ||k||`` each; computed in float64):
        invariant to the scale of the data, to the other keys and to a common offset
        of the keys (which changes no answer), so keys tied with the argmax count as
        hits and near-misses do not. A float32 search (faiss,
        :meth:`ExactMIPS.predict`) scored with it can therefore show misses when the
        keys share a large offset (keys + 1e6: about 10% of the queries), its own
        float32 rounding exceeding this tolerance, where :meth:`ExactMIPS.score`,
        which allows that rounding, reads 1.0.
    rtol : float, default=1e-6
        Relative tolerance of the tie-aware mode.
    batch_size : int, default=8192
        Most queries per chunk of the exact search of the tie-aware mode (memory
        ``min(batch_size, 2**26 / n_keys) x n_keys`` float64, see :func:`mips_topk`;
        the database is also copied to float64).

    Returns
    -------
    float
        The fraction of hits, in [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval.amips import match_rate
    >>> match_rate([0, 1, 1], [0, 1, 2])
    0.6666666666666666
    >>> keys = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> match_rate(None, [1], queries=[[1.0, 1.0]], database=keys)  # a tie is a hit
    1.0
    """
    hits = _hits(y_true, _as_long_2d(y_pred)[:, :1], queries, database, rtol, batch_size)
    return float(hits[:, 0].double().mean())


@on_inputs_device
def recall_at_k(y_true: ArrayLike | None, y_pred: ArrayLike, k: int, *,
                queries: ArrayLike | None = None, database: ArrayLike | None = None,
                rtol: float = 1e-6, batch_size: int = 8192) -> float:
    """Fraction of queries whose exact top-1 answer is among the first ``k`` predictions.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Exact top-1 indices (ignored in the tie-aware mode).
    y_pred : array-like of shape (n, m) with ``m >= k``
        Ranked predicted indices.
    k : int
        Number of leading predictions examined, in ``[1, m]``.
    queries, database, rtol, batch_size : optional
        Tie-aware mode, as in :func:`match_rate`.

    Returns
    -------
    float
        The fraction of queries with a hit among their first ``k`` predictions.

    Examples
    --------
    >>> from mlpapers.retrieval.amips import recall_at_k
    >>> y_pred = [[3, 0, 1], [2, 1, 0]]
    >>> recall_at_k([0, 0], y_pred, k=1), recall_at_k([0, 0], y_pred, k=2)
    (0.0, 0.5)
    """
    pred = _as_long_2d(y_pred)
    check_positive(k, "k", integer=True)  # (a float k failed inside the slicing)
    if not 1 <= k <= pred.shape[1]:
        raise ValueError(f"k must be in [1, {pred.shape[1]}] (columns of y_pred), got {k}.")
    hits = _hits(y_true, pred[:, :k], queries, database, rtol, batch_size)
    return float(hits.any(dim=1).double().mean())


@on_inputs_device
def mean_reciprocal_rank(y_true: ArrayLike | None, y_pred: ArrayLike, *,
                         queries: ArrayLike | None = None,
                         database: ArrayLike | None = None,
                         rtol: float = 1e-6, batch_size: int = 8192) -> float:
    """Mean of ``1 / rank`` of the first correct prediction (0 when none is correct).

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Exact top-1 indices (ignored in the tie-aware mode).
    y_pred : array-like of shape (n, m)
        Ranked predicted indices.
    queries, database, rtol, batch_size : optional
        Tie-aware mode, as in :func:`match_rate`.

    Returns
    -------
    float
        The mean reciprocal rank, in [0, 1].

    Examples
    --------
    >>> from mlpapers.retrieval.amips import mean_reciprocal_rank
    >>> mean_reciprocal_rank([0, 0, 0], [[0, 1], [1, 0], [1, 2]])  # (1 + 1/2 + 0) / 3
    0.5
    """
    pred = _as_long_2d(y_pred)
    hits = _hits(y_true, pred, queries, database, rtol, batch_size)
    ranks = torch.arange(1, pred.shape[1] + 1, dtype=torch.float64, device=hits.device)
    first = torch.where(hits, ranks, torch.full_like(ranks, math.inf)).min(dim=1).values
    return float((1.0 / first).mean())
