"""MCMC convergence diagnostics: rank-normalised split R-hat and bulk/tail ESS.

Implements Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), "Rank-normalization,
folding, and localization: an improved R-hat for assessing convergence of MCMC",
Bayesian Analysis 16(2), with Geyer's initial monotone sequence for the ESS, in numpy.
All functions take draws of shape ``(chains, draws)`` or ``(chains, draws, d)``.
They return NaN where a value is undefined: fewer than 4 draws per chain (the ESS
also with fewer than 8, i.e. 4 per split half; ArviZ returns a number there), a NaN
draw (an infinite draw only takes the extreme rank, as in ArviZ), or draws that do
not vary (R-hat and ESS of constant draws are NaN, as in Stan and the R package
``posterior``; ArviZ reports the ESS of constant draws as their number). As in
ArviZ and Stan, the autocorrelation time is floored at ``1 / log10(N)``, so very
short chains (about 10 draws) can report an ESS above the ``N`` draws. The tail
ESS's quantiles are numpy's (R's type 7, as ``posterior``): where ArviZ's
``mquantiles`` rounds an order statistic down, its tail ESS can differ. A tail whose
indicator is constant (the 5% or the 95% quantile is the largest draw: draws tied
there) makes the tail ESS NaN, as in ``posterior``; ArviZ's ``min`` of the two tails
returns the other tail's ESS or NaN depending on which tail it is.
A single chain gets a split R-hat (from its two halves, as Stan); ArviZ gives NaN.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, TypeAlias, get_args

import numpy as np
from scipy.special import ndtri

from mlpapers._utils import (
    ArrayLike,
    check_in_options,
    check_real,
    power_of_two_units,
    to_numpy,
)
from mlpapers._utils._blocks import BLOCK_ELEMENTS as DEFAULT_BLOCK_ELEMENTS
from mlpapers._utils._blocks import block_rows_for

__all__ = ["ess", "rhat"]

MIN_DRAWS = 4  # fewer draws per chain give NaN (as ArviZ), never an exception
# Elements of one block of dimensions in the vectorised passes over all draws (32 MB of
# float64): the draws of a sampler reach GBs ((64, 10^4, 200) is 1 GB) and a pass over
# all of them at once held two or three temporaries of their size
BLOCK_ELEMENTS = DEFAULT_BLOCK_ELEMENTS


def dim_blocks(shape: tuple, block_elements: int | None = None) -> list[slice]:
    """Slices over the last axis of draws of ``shape`` with about ``block_elements``
    (default :data:`BLOCK_ELEMENTS`) elements each (at least one dimension per block)."""
    block_elements = BLOCK_ELEMENTS if block_elements is None else block_elements
    per_dim = max(int(np.prod(shape[:-1])), 1)
    step = block_rows_for(per_dim, block_elements)
    return [slice(i, min(i + step, shape[-1])) for i in range(0, shape[-1], step)]


def _split(x: np.ndarray) -> np.ndarray:
    """(M, N) -> (2M, N // 2): the first and second half of every chain."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]], axis=0)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata(x, method="average")`` (ties share their mean rank, NaN
    anywhere gives all NaN), equal bit for bit. The ranks do not depend on how ties are
    ordered, so the sort need not be stable: numpy's default introsort is faster than the
    stable sort recent scipy uses (about 2x on 640 000 draws), and ranking is most of a
    diagnostic's time."""
    flat = x.ravel()
    if np.isnan(flat).any():
        return np.full(x.shape, np.nan)
    order = np.argsort(flat)
    ranked = flat[order]
    new = np.empty(flat.size, dtype=bool)  # first element of each group of ties
    new[:1] = True
    np.not_equal(ranked[1:], ranked[:-1], out=new[1:])
    group = np.cumsum(new)  # 1-based group of each sorted element
    bounds = np.append(np.flatnonzero(new), flat.size)  # group g spans [bounds[g-1], bounds[g])
    out = np.empty(flat.size)
    out[order] = 0.5 * (bounds[group] + bounds[group - 1] + 1)
    return out.reshape(x.shape)


def _z_scale(x: np.ndarray) -> np.ndarray:
    r = _average_ranks(x)
    return ndtri((r - 0.375) / (x.size + 0.25))


def _rhat_basic(x: np.ndarray) -> float | np.ndarray:
    """Classic R-hat of draws (M, N) or, vectorised, (M, N, d) (then an array (d,)).

    ``N >= 2`` (the callers return NaN for fewer than ``MIN_DRAWS`` draws per chain, so
    the split halves hold 2 or more)."""
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite draws give NaN
        means, variances = x.mean(axis=1), x.var(axis=1, ddof=1)
    out = _rhat_from_moments(means, variances, x.shape[1], np.isfinite(x).all(axis=(0, 1)))
    return float(out) if x.ndim == 2 else out


def _rhat_from_moments(means: np.ndarray, variances: np.ndarray, n: int,
                       finite: np.ndarray) -> np.ndarray:
    """Classic R-hat from the chains' means and variances (``ddof=1``), both (M, ...),
    of ``n`` draws each; NaN where ``finite`` is False or the draws are constant."""
    m = means.shape[0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # NaN, not warnings
        w = variances.mean(axis=0)
        b = n * means.var(axis=0, ddof=1) if m > 1 else np.zeros_like(w)
        var_plus = (n - 1) / n * w + b / n
        out = np.sqrt(var_plus / w)
    # every chain stuck at its own value: not converged at all
    out = np.where(w <= 1e-12 * var_plus, np.inf, out)
    # constant draws (undefined) or non-finite draws
    return np.where((var_plus > 0) & finite, out, np.nan)


def _dim_groups(shape: tuple, block_elements: int) -> list[slice]:
    """Groups of dimensions of draws (M, N, d) for the passes of
    :func:`_split_half_blocks`: all of them while one chain fits in ``block_elements``,
    else as many as one chain's ``N`` draws of each fit (at least one)."""
    _, n, d = shape
    step = d if n * d <= block_elements else block_rows_for(n, block_elements)
    return [slice(j, min(j + step, d)) for j in range(0, d, step)]


def extreme_value_units(x: np.ndarray, axis: int | tuple[int, ...]) -> np.ndarray:
    """Per column of ``x`` (reduced over ``axis``), the power of two at or below its
    largest magnitude where that lies outside ``[2**-500, 2**500]``, else 1: dividing
    by it is exact, and the squares and sums of the moments then neither overflow nor
    underflow (draws of 1e160 gave an infinite variance, hence an infinite sd and a
    false "chains disagree" warning)."""
    return power_of_two_units(_column_amax(x, axis), 500)


def _column_amax(x: np.ndarray, axis: int | tuple[int, ...]) -> np.ndarray:
    """Largest magnitude per column, from the extremes: no temporary of the size of
    ``x`` (NaN where a column holds one)."""
    with np.errstate(invalid="ignore"):
        return np.fmax(np.abs(x.max(axis=axis)), np.abs(x.min(axis=axis)))


def _split_half_blocks(x: np.ndarray, dims: slice, block_elements: int
                       ) -> Iterator[tuple[slice, np.ndarray]]:
    """``(chains, half)`` over the first and second halves of the chains of draws
    (M, N, d) in the dimensions ``dims``, as float64 arrays (m, N // 2, k): as many whole
    chains at a time as fit in ``block_elements`` (contiguous reads; blocks of dimensions
    strided through all the draws made these passes 4x slower at (256, 1000, 50)).
    ``chains`` indexes the 2M split chains of :func:`_split`."""
    m, n, _ = x.shape
    half, k = n // 2, dims.stop - dims.start
    rows = block_rows_for(n * k, block_elements)
    # (the diagnostics are scale-free; one unit per dimension for all the blocks)
    # (from the largest magnitude over all the draws: per block, a block of zeros had
    # unit 1, which hid the units of tiny draws in the others)
    unit = extreme_value_units(x[:, :, dims], (0, 1)) if m and n else np.ones(k)
    for start in range(0, m, rows):
        stop = min(start + rows, m)
        block = np.asarray(x[start:stop, :, dims], dtype=np.float64)
        if (unit != 1.0).any():
            block = block / unit
        yield slice(start, stop), block[:, :half]
        yield slice(m + start, m + stop), block[:, n - half:]


def _undefined(h: np.ndarray, state: np.ndarray | None) -> np.ndarray:
    """Running (min, max, finite) of a block of split draws (m, N, k) per dimension,
    folded into ``state`` (3, k): a dimension is undefined where a draw is not finite or
    all its draws are equal (a constant whose mean is not exact, such as 0.1, left a
    rounding-level variance, and an R-hat near 1 with an ESS near 8 instead of NaN)."""
    lo, hi = h.min(axis=(0, 1)), h.max(axis=(0, 1))
    ok = np.isfinite(h).all(axis=(0, 1))
    if state is None:
        return np.stack([lo, hi, ok])
    return np.stack([np.fmin(state[0], lo), np.fmax(state[1], hi), (state[2] > 0) & ok])


def _defined(state: np.ndarray) -> np.ndarray:
    return (state[2] > 0) & (state[0] < state[1])


def split_rhat_classic(draws: np.ndarray) -> np.ndarray:
    """Classic split R-hat (Gelman et al., no rank normalisation) per dimension of draws
    (chains, draws, d): cheap (one pass, vectorised), for a convergence warning."""
    x = np.asarray(draws)
    m, n, d = x.shape
    if n < MIN_DRAWS:
        return np.full(d, np.nan)
    out = np.empty(d)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN where a draw is not finite
        for dims in _dim_groups(x.shape, BLOCK_ELEMENTS):
            k = dims.stop - dims.start
            means, variances, state = np.empty((2 * m, k)), np.empty((2 * m, k)), None
            for chains, h in _split_half_blocks(x, dims, BLOCK_ELEMENTS):
                state = _undefined(h, state)
                means[chains] = h.mean(axis=1)
                variances[chains] = h.var(axis=1, ddof=1)
            assert state is not None
            out[dims] = _rhat_from_moments(means, variances, n // 2, _defined(state))
    return out


def split_ess_classic(draws: np.ndarray) -> np.ndarray:
    """Classic split-chain ESS (no rank normalisation) per dimension of draws
    (chains, draws, d): cheap and vectorised over dimensions, for a warning.

    The autocorrelations of the split chains (by FFT) are combined as in
    :func:`_ess_basic` (Vehtari et al. 2021): Geyer's initial positive sequence of
    paired autocorrelations, made monotone, and the time floored at ``1 / log10(N)``
    (the last even-lag refinement of :func:`_ess_basic` is left out: a warning needs no
    third digit). NaN where undefined (fewer than 8 draws per chain, non-finite or
    constant draws). Without the ranks it costs one FFT pass, where :func:`ess` sorts
    all the draws of every dimension (seconds for hundreds of chains); a bounded
    support keeps the variance finite, which the raw draws' ESS needs. The chains'
    power spectra are summed before the one inverse FFT per dimension (the mean
    autocovariance over chains is the inverse transform of their mean spectrum).
    """
    x = np.asarray(draws)
    m, n, d = x.shape
    if n < 2 * MIN_DRAWS:
        return np.full(d, np.nan)
    out = np.empty(d)
    # blocks 8x smaller than R-hat's: the padded transform holds several copies of one;
    # a group of dimensions is finished before the next (its spectra are a chain's size)
    for dims in _dim_groups(x.shape, BLOCK_ELEMENTS // 8):
        out[dims] = _ess_of_dims(x, dims, BLOCK_ELEMENTS // 8)
    return out


def _ess_of_dims(x: np.ndarray, dims: slice, block_elements: int) -> np.ndarray:
    m2, n, k = 2 * x.shape[0], x.shape[1] // 2, dims.stop - dims.start  # split chains
    size = 1 << int(np.ceil(np.log2(2 * n)))  # zero padding: no circular wrap-around
    power, means, state = np.zeros((size // 2 + 1, k)), np.empty((m2, k)), None
    with np.errstate(invalid="ignore", over="ignore"):  # NaN where a draw is not finite
        for chains, h in _split_half_blocks(x, dims, block_elements):
            state = _undefined(h, state)
            means[chains] = mu = h.mean(axis=1)
            f = np.fft.rfft(h - mu[:, None], size, axis=1)
            power += (f.real ** 2 + f.imag ** 2).sum(axis=0)
        acov = np.fft.irfft(power / m2, size, axis=0)[:n] / n  # (N, k), mean over chains
        mean_var = acov[0] * n / (n - 1)
        var_plus = acov[0] + means.var(axis=0, ddof=1)
    assert state is not None
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var - acov) / var_plus  # (N, k), rho[0] = 1
        pairs = rho[: 2 * (n // 2)].reshape(n // 2, 2, -1).sum(axis=1)  # rho_2t + rho_2t+1
        # Geyer: keep the initial positive pairs, then make them monotone (non-increasing)
        positive = np.cumprod(pairs > 0, axis=0).astype(bool)
        pairs = np.minimum.accumulate(np.where(positive, pairs, 0.0), axis=0)
        tau = np.maximum(-1.0 + 2.0 * pairs.sum(axis=0), 1.0 / np.log10(m2 * n))
        ess = m2 * n / tau
    return np.where(_defined(state) & (var_plus > 0), ess, np.nan)


def _autocov(x: np.ndarray) -> np.ndarray:
    """Autocovariances ``(1/N) sum (x_i - m)(x_{i+t} - m)`` per chain by FFT, (M, N)."""
    n = x.shape[1]
    y = x - x.mean(axis=1, keepdims=True)
    size = 1 << int(np.ceil(np.log2(2 * n)))
    f = np.fft.rfft(y, size, axis=1)
    return np.fft.irfft(f * np.conj(f), size, axis=1)[:, :n] / n


def _ess_basic(x: np.ndarray) -> float:
    m, n = x.shape
    if n < 4 or not np.all(np.isfinite(x)):
        return float("nan")
    acov = _autocov(x)
    mean_var = acov[:, 0].mean() * n / (n - 1)
    var_plus = mean_var * (n - 1) / n + (x.mean(axis=1).var(ddof=1) if m > 1 else 0.0)
    if var_plus <= 0:
        return float("nan")
    rho = np.zeros(n)
    rho[0] = 1.0
    even, odd = 1.0, 1.0 - (mean_var - acov[:, 1].mean()) / var_plus
    rho[1] = odd
    t = 1
    while t < n - 3 and even + odd > 0:
        even = 1.0 - (mean_var - acov[:, t + 1].mean()) / var_plus
        odd = 1.0 - (mean_var - acov[:, t + 2].mean()) / var_plus
        if even + odd >= 0:
            rho[t + 1], rho[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0:  # as in Stan and ArviZ: the last even-lag estimate improves the tail
        rho[max_t + 1] = even
    t = 1  # Geyer's initial monotone sequence
    while t <= max_t - 2:
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = rho[t + 2] = 0.5 * (rho[t - 1] + rho[t])
        t += 2
    total = m * n
    tau = -1.0 + 2.0 * rho[: max_t + 1].sum() + rho[max_t + 1]
    tau = max(tau, 1.0 / np.log10(total))
    return float(total / tau)


def _per_dim(x: ArrayLike, fn) -> np.ndarray | float:
    # float64 one dimension at a time: converting float32 draws of GBs at once doubled them.
    # A tensor (the draws of sample(return_tensor=True), on their device) is detached and
    # brought to the CPU: np.asarray raised on a CUDA, bfloat16 or requires-grad tensor
    x = to_numpy(x)
    check_real(x, "draws")
    if x.dtype.kind not in "biuf":  # (None became NaN, text failed in numpy's cast)
        raise TypeError(f"draws must hold real numbers (floating or integer), got dtype "
                        f"{x.dtype}; pass a numeric array, e.g. np.asarray(draws, float).")
    if x.ndim not in (2, 3):
        raise ValueError(f"draws must have shape (chains, draws[, d]), got {x.shape}.")
    if x.shape[0] == 0:  # (NaN after numpy's empty-slice warnings)
        raise ValueError(f"draws must hold at least one chain, got shape {x.shape}.")
    if x.shape[1] < MIN_DRAWS:  # split chains need 2+ draws per half: undefined, not an error
        return float("nan") if x.ndim == 2 else np.full(x.shape[2], np.nan)
    if x.ndim == 2:
        return fn(np.asarray(x, dtype=np.float64))
    return np.array([fn(np.asarray(x[:, :, j], dtype=np.float64)) for j in range(x.shape[2])])


def rhat(draws: ArrayLike) -> np.ndarray | float:
    """Rank-normalised split R-hat (max of bulk and folded), per dimension.

    Every chain is split in halves; the draws are rank-normalised (bulk) and, for
    the folded R-hat, their distances to the median are; the classic R-hat of
    both is computed and the larger kept (Vehtari et al. 2021 [1]_). Values near 1
    (below 1.01) indicate agreeing chains.

    Parameters
    ----------
    draws : array-like or torch.Tensor of shape (chains, draws) or (chains, draws, d)
        MCMC draws, e.g. ``SampleResult.samples`` (or ``samples_tensor``, on any
        device); another number of dimensions raises ``ValueError``.

    Returns
    -------
    float or numpy.ndarray of shape (d,)
        A float for 2D draws, one value per dimension for 3D draws; NaN where
        undefined (fewer than 4 draws per chain, a NaN draw or constant draws; an
        infinite draw takes the extreme rank, as in ArviZ), ``inf`` when every chain
        is stuck at its own value.

    References
    ----------
    .. [1] A. Vehtari, A. Gelman, D. Simpson, B. Carpenter and P.-C. Bürkner,
       "Rank-normalization, folding, and localization: an improved R-hat for
       assessing convergence of MCMC", Bayesian Analysis 16(2), 2021,
       arXiv:1903.08008.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import rhat
    >>> draws = np.random.default_rng(0).standard_normal((4, 500, 3))
    >>> rhat(draws).shape, bool((rhat(draws) < 1.01).all())
    ((3,), True)
    >>> draws[0] += 3.0  # one chain elsewhere: the chains disagree
    >>> bool((rhat(draws) > 1.1).all())
    True
    """

    def one(x):  # folded about the median of the split draws, as ArviZ
        s = _split(x)
        folded = np.abs(s - np.median(s))
        return max(_rhat_basic(_z_scale(s)), _rhat_basic(_z_scale(folded)))

    return _per_dim(draws, one)


#: ``ess(kind=...)`` (and ``SampleResult.ess``); ``ESS_KINDS`` lists its values.
EssKind: TypeAlias = Literal["bulk", "tail"]
ESS_KINDS: tuple[str, ...] = get_args(EssKind)


def ess(draws: ArrayLike, kind: EssKind = "bulk") -> np.ndarray | float:
    """Bulk (rank-normalised) or tail (5%/95% quantile) effective sample size.

    The chains are split in halves; the autocorrelations (by FFT) are summed
    with Geyer's initial monotone sequence (Vehtari et al. 2021 [1]_).

    Parameters
    ----------
    draws : array-like or torch.Tensor of shape (chains, draws) or (chains, draws, d)
        MCMC draws, e.g. ``SampleResult.samples`` (or ``samples_tensor``, on any
        device); another number of dimensions raises ``ValueError``.
    kind : {"bulk", "tail"}, default="bulk"
        ``"bulk"``: the ESS of the rank-normalised draws (the centre of the
        distribution); ``"tail"``: the smaller ESS of the indicators of the
        5% and 95% quantiles. Another value raises ``ValueError``.

    Returns
    -------
    float or numpy.ndarray of shape (d,)
        A float for 2D draws, one value per dimension for 3D draws; NaN where
        undefined (fewer than 8 draws per chain, a NaN draw or constant draws; an
        infinite draw takes the extreme rank, as in ArviZ). The tail ESS is also NaN
        where a tail's indicator is constant (the 95% or the 5% quantile is the
        largest draw: draws tied there, e.g. clipped at a bound), as in
        ``posterior``. About ``chains * draws`` for independent draws.

    References
    ----------
    .. [1] A. Vehtari, A. Gelman, D. Simpson, B. Carpenter and P.-C. Bürkner,
       "Rank-normalization, folding, and localization: an improved R-hat for
       assessing convergence of MCMC", Bayesian Analysis 16(2), 2021,
       arXiv:1903.08008.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import ess
    >>> draws = np.random.default_rng(0).standard_normal((4, 500))  # independent
    >>> bool(1500 < ess(draws) < 2500), bool(1500 < ess(draws, "tail") < 2500)
    (True, True)
    """
    check_in_options(kind, "kind", ESS_KINDS)

    def one(x):  # tail quantiles of all draws (with the middle one of an odd-length
        # chain, which splitting drops), as ArviZ and posterior
        if kind == "bulk":
            return _ess_basic(_z_scale(_split(x)))
        lo, hi = np.quantile(x, [0.05, 0.95])
        low = _ess_basic(_split(x <= lo).astype(float))
        high = _ess_basic(_split(x <= hi).astype(float))
        # NaN when either tail's indicator is constant, as posterior (a bare ``min``
        # would return or drop the NaN depending on which tail it is)
        return float("nan") if np.isnan(low) or np.isnan(high) else min(low, high)

    return _per_dim(draws, one)
