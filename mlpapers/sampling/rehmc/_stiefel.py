"""Stiefel-manifold sampling through the polar reparameterisation.

``X`` is an ``n x k`` matrix with density proportional to
``g(Q_X) exp(-||X||_F^2 / 2)`` on the well-conditioned set
``R = {a <= sigma_min(X), sigma_max(X) <= b}``, where ``Q_X = X (X^T X)^{-1/2}``
is the polar factor. Under the Gaussian, ``Q_X`` is uniform on ``V(n, k)`` and
independent of ``P = (X^T X)^{1/2}``; ``R`` and the ball container depend on ``X``
only through ``P``, so ``Q_X`` has density proportional to ``g`` with respect to
the uniform measure on the Stiefel manifold. ReflectiveHMC runs on the Frobenius
ball ``||X||_F <= b sqrt(k)`` and keeps the draws in ``R`` (container plus thinning).
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, overload

import numpy as np
import numpy.typing as npt
import torch
from sklearn.base import BaseEstimator

from mlpapers._base import TorchEstimatorMixin
from mlpapers._utils import (
    TORCH_INTEGER_DTYPES,
    ArrayLike,
    RandomStateLike,
    check_positive,
    make_generators,
    on_inputs_device,
    user_stacklevel,
)
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for, collect_row_blocks
from mlpapers.sampling.rehmc._container import _as_float_array
from mlpapers.sampling.rehmc._kernels import ContractError
from mlpapers.sampling.rehmc._result import attribute_entries
from mlpapers.sampling.rehmc._sampler import FloatDType, ReflectiveHMC, SampleResult
from mlpapers.sampling.rehmc._supports import Ball, Region
from mlpapers.sampling.rehmc._user import eval_mode

__all__ = [
    "StiefelResult",
    "StiefelSampler",
    "bingham_log_density",
    "matrix_von_mises_fisher_log_density",
    "polar_factor",
]

Tensor = torch.Tensor


class _Polar(torch.autograd.Function):
    """``Q = U V^T`` from the thin SVD, with a backward that only divides by
    ``sigma_i + sigma_j`` (stable for repeated singular values, unlike SVD's backward)."""

    @staticmethod
    def forward(ctx, X):
        U, S, Vh = torch.linalg.svd(X, full_matrices=False)
        ctx.save_for_backward(U, S, Vh)
        return U @ Vh

    @staticmethod
    def backward(ctx, G):
        U, S, Vh = ctx.saved_tensors
        V = Vh.transpose(-2, -1)
        Gt = U.transpose(-2, -1) @ G @ V
        inv_sum = 1.0 / (S[..., :, None] + S[..., None, :])
        inner = U @ (inv_sum * (Gt - Gt.transpose(-2, -1))) @ Vh
        GV = G @ V
        outer = (GV - U @ (U.transpose(-2, -1) @ GV)) / S[..., None, :] @ Vh
        return inner + outer


def _warn_if_detached(lg: Tensor) -> None:
    """Warn when ``log_density``'s values vary over the chains but carry no autograd
    graph: the wrapper's Gaussian term always has one, so the sampler's own check of
    ``log_prob`` could not see that the user's part is cut off (its gradient is then
    zero, and the chains random-walk: min ESS 11 against 552 on a von Mises-Fisher)."""
    if lg.requires_grad or lg.numel() < 2 or bool((lg == lg[0]).all()):
        return
    warnings.warn(
        "log_density's output is not connected to its input by autograd (it leaves torch, "
        "e.g. through numpy or .detach()), but varies over the chains: its gradient is "
        "taken as zero, so the chains stay exact but mix like a random walk. Write "
        "log_density with torch operations.", UserWarning, stacklevel=user_stacklevel())


@overload
def polar_factor(X: Tensor) -> Tensor: ...
@overload
def polar_factor(X: npt.ArrayLike) -> np.ndarray: ...
@on_inputs_device
def polar_factor(X: ArrayLike) -> Tensor | np.ndarray:
    """Orthonormal polar factor ``Q = X (X^T X)^{-1/2}`` of ``(..., n, k)`` matrices (via SVD).

    Differentiable with a backward pass stable for repeated singular values.

    Parameters
    ----------
    X : torch.Tensor or array-like of shape (..., n, k)
        Matrices of full column rank (``k <= n``), batched over the leading
        dimensions. A floating tensor keeps its dtype (a half-precision one is
        factored in float32), device and autograd graph, and an integer or boolean
        one becomes float64; anything else is converted to a float64 array.

    Raises
    ------
    TypeError
        If ``X`` is not numeric (complex numbers included).
    ValueError
        If ``X`` holds NaN or infinity, has fewer than 2 dimensions or more columns
        than rows.

    Returns
    -------
    torch.Tensor or numpy.ndarray of shape (..., n, k)
        ``U V^T`` from the thin SVD ``X = U S V^T``: orthonormal columns
        (``Q^T Q = I``). A tensor for a tensor input, else a float64 numpy array.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import polar_factor
    >>> X = np.array([[2.0, 0.0], [0.0, 3.0], [0.0, 0.0]])
    >>> polar_factor(X).tolist()
    [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    >>> Q = polar_factor(np.random.default_rng(0).standard_normal((5, 4, 2)))
    >>> Q.shape, bool(np.allclose(Q.swapaxes(-1, -2) @ Q, np.eye(2)))
    ((5, 4, 2), True)
    """
    if not isinstance(X, torch.Tensor):
        X_np = _as_float_array(X, "X", None)
        if X_np.ndim < 2:
            raise ValueError(f"X must have shape (..., n, k), got {X_np.shape}.")
        _check_tall(X_np.shape)
        return _Polar.apply(torch.from_numpy(X_np)).numpy()
    # the checks of the array path: a complex tensor gave a complex "factor" without
    # orthonormal columns, an integer or boolean one torch's "Expected a floating point
    # tensor", NaN a _LinAlgError and an infinity a wrong factor, silently
    if not (X.is_floating_point() or X.dtype == torch.bool or X.dtype in TORCH_INTEGER_DTYPES):
        raise TypeError(f"X must be numeric, got dtype {X.dtype}.")
    if not X.is_floating_point():  # (as integer and boolean arrays are: float64)
        X = X.to(torch.float32 if X.device.type == "mps" else torch.float64)
    _check_tall(X.shape)
    if not X.is_meta and not bool(torch.isfinite(X.detach()).all()):
        raise ValueError("X must be finite (no NaN or inf).")
    return _polar(X)


def _polar(X: Tensor) -> Tensor:
    """:func:`polar_factor` of a floating tensor, unchecked (the sampler's own calls)."""
    if X.dtype in (torch.float16, torch.bfloat16):  # torch has no SVD in half precision
        return _Polar.apply(X.float()).to(X.dtype)
    return _Polar.apply(X)


def _check_tall(shape) -> None:
    """``k <= n``: with more columns than rows no factor has orthonormal columns (the
    result of the SVD form would have orthonormal rows instead)."""
    if len(shape) < 2 or shape[-1] > shape[-2]:
        raise ValueError(f"X must have shape (..., n, k) with k <= n, got {tuple(shape)}.")


def _param_matrix(value, name: str, square: bool = False) -> np.ndarray:
    arr = _as_float_array(value, name, 2)
    if square and arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{name} must be a square matrix, got shape {arr.shape}.")
    return arr


def _check_input_shape(Q: Tensor, n: int, k: int, names: str) -> None:
    if Q.ndim < 2 or tuple(Q.shape[-2:]) != (n, k):
        raise ValueError(f"{names} needs Q of shape (..., {n}, {k}) (a sampler with n={n}, "
                         f"k={k}), got Q of shape {tuple(Q.shape)}.")


@on_inputs_device
def matrix_von_mises_fisher_log_density(F: ArrayLike) -> Callable[[Tensor], Tensor]:
    """``log g(Q) = tr(F^T Q)`` (matrix von Mises-Fisher), for ``(C, n, k)`` inputs.

    The density concentrates around the polar factor of ``F`` (its mode), more
    sharply as ``F`` grows.

    Parameters
    ----------
    F : array-like of shape (n, k)
        Finite parameter matrix (``ValueError`` otherwise, or when the sampler's
        ``Q`` does not have shape ``(..., n, k)``).

    Returns
    -------
    callable
        ``log_density(Q)``: maps a torch tensor ``Q`` of shape ``(..., n, k)`` to
        ``tr(F^T Q)`` of shape ``(...)``, in ``Q``'s dtype and device (the
        ``log_density`` of :class:`StiefelSampler`). It pickles, and so does a
        sampler holding it.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.sampling import matrix_von_mises_fisher_log_density
    >>> log_g = matrix_von_mises_fisher_log_density([[5.0, 0.0], [0.0, 5.0], [0.0, 0.0]])
    >>> Q = torch.eye(3, 2, dtype=torch.float64)[None]  # the mode
    >>> log_g(Q).tolist()
    [10.0]
    """
    return _MatrixVMFLogDensity(_param_matrix(F, "F"))


@on_inputs_device
def bingham_log_density(A: ArrayLike, B: ArrayLike) -> Callable[[Tensor], Tensor]:
    """``log g(Q) = tr(Q^T A Q B)`` (matrix Bingham), for ``(C, n, k)`` inputs.

    Parameters
    ----------
    A : array-like of shape (n, n)
        Finite square matrix acting on the rows of ``Q`` (``ValueError``
        otherwise).
    B : array-like of shape (k, k)
        Finite square matrix acting on the columns of ``Q`` (``ValueError``
        otherwise, or when the sampler's ``Q`` does not have shape
        ``(..., n, k)``).

    Returns
    -------
    callable
        ``log_density(Q)``: maps a torch tensor ``Q`` of shape ``(..., n, k)`` to
        ``tr(Q^T A Q B)`` of shape ``(...)``, in ``Q``'s dtype and device (the
        ``log_density`` of :class:`StiefelSampler`). It pickles, and so does a
        sampler holding it.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.sampling import bingham_log_density
    >>> log_g = bingham_log_density(torch.diag(torch.tensor([3.0, 2.0, 1.0])), [[1.0]])
    >>> Q = torch.eye(3, 1, dtype=torch.float64)[None]  # the first axis
    >>> log_g(Q).tolist()
    [3.0]
    """
    return _BinghamLogDensity(_param_matrix(A, "A", square=True),
                              _param_matrix(B, "B", square=True))


# The densities are instances of module-level classes, not closures: a StiefelSampler
# holding one must pickle (and save with joblib) like any estimator, and a closure
# does not pickle.
class _MatrixVMFLogDensity:
    """``Q -> tr(F^T Q)`` of :func:`matrix_von_mises_fisher_log_density` (picklable)."""

    def __init__(self, F: np.ndarray):
        self.F = F

    def __call__(self, Q: Tensor) -> Tensor:
        n, k = self.F.shape
        _check_input_shape(Q, n, k, f"F of shape {self.F.shape}")
        return (torch.as_tensor(self.F, dtype=Q.dtype, device=Q.device) * Q).sum((-2, -1))

    def __repr__(self) -> str:
        return f"matrix_von_mises_fisher_log_density(F of shape {self.F.shape})"


class _BinghamLogDensity:
    """``Q -> tr(Q^T A Q B)`` of :func:`bingham_log_density` (picklable)."""

    def __init__(self, A: np.ndarray, B: np.ndarray):
        self.A, self.B = A, B

    def __call__(self, Q: Tensor) -> Tensor:
        A_np, B_np = self.A, self.B
        _check_input_shape(Q, A_np.shape[0], B_np.shape[0],
                           f"A of shape {A_np.shape} with B of shape {B_np.shape}")
        A_t = torch.as_tensor(A_np, dtype=Q.dtype, device=Q.device)
        B_t = torch.as_tensor(B_np, dtype=Q.dtype, device=Q.device)
        return ((A_t @ Q @ B_t) * Q).sum((-2, -1))

    def __repr__(self) -> str:
        return (f"bingham_log_density(A of shape {self.A.shape}, "
                f"B of shape {self.B.shape})")


@dataclass(repr=False, eq=False)
class StiefelResult(SampleResult):
    """:class:`SampleResult` of :class:`StiefelSampler`; ``samples`` holds the flattened ``Q``.

    Attributes
    ----------
    Q : numpy.ndarray of shape (chains, draws, n, k)
        The Stiefel draws.
    X : numpy.ndarray of shape (chains, draws, n, k)
        The underlying Euclidean draws (``Q`` is their polar factor).
    samples : numpy.ndarray of shape (chains, draws, n * k)
        ``Q`` flattened row-major, for the diagnostics (:meth:`rhat`,
        :meth:`ess`, :meth:`summary`).
    kept_fraction : numpy.ndarray of shape (chains,)
        Fraction of the recorded states ``X`` that were well conditioned (kept).
    last_state : numpy.ndarray of shape (chains, n * k) or None
        Final Euclidean state ``X`` of each chain, flattened (see Notes).
%(inherited)s

    Notes
    -----
    In the entries inherited from :class:`SampleResult`, ``d`` is ``n * k``.
    The inherited ``last_state``, of shape ``(chains, n * k)``, holds each chain's
    final Euclidean state ``X`` flattened row-major (reshape it to ``(chains, n, k)``),
    not ``Q``: the chain runs on ``X``, and ``Q`` alone loses ``(X^T X)^{1/2}``, so
    :meth:`StiefelSampler.sample` continues from it with ``resume=result``. It may
    differ from ``X[:, -1]`` and lie outside the well-conditioned set (a chain that
    already had its draws kept moving on), but always inside the Frobenius ball.
    ``step_size``, ``inv_mass``, ``trajectory_length``, ``sampler_state`` and
    ``sample_stats`` are those of the inner :class:`ReflectiveHMC` run on ``X``: there
    ``lp`` is the Euclidean log density ``log g(Q) - ||X||_F^2 / 2`` of the draw and
    ``energy`` the Hamiltonian of the chain on ``X``.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import StiefelSampler
    >>> res = StiefelSampler(n=3, k=2, n_leapfrog=5, random_state=0).sample(
    ...     30, n_chains=2, warmup=30)
    >>> res.Q.shape, res.samples.shape, res.last_state.shape
    ((2, 30, 3, 2), (2, 30, 6), (2, 6))
    >>> bool(np.allclose(res.Q, res.samples.reshape(2, 30, 3, 2)))
    True
    """

    Q: np.ndarray = field(default_factory=lambda: np.zeros(0))
    X: np.ndarray = field(default_factory=lambda: np.zeros(0))

    _draw_fields = ("samples", "Q", "X")

    def _shape_text(self) -> str:
        Q = np.asarray(self.Q)
        if Q.ndim != 4:
            return super()._shape_text()
        return f"chains={Q.shape[0]}, draws={Q.shape[1]}, n={Q.shape[2]}, k={Q.shape[3]}"

    def _default_names(self) -> list[str]:
        Q = np.asarray(self.Q)
        if Q.ndim != 4:
            return super()._default_names()
        return [f"Q[{i},{j}]" for i in range(Q.shape[2]) for j in range(Q.shape[3])]


# the fields inherited unchanged, documented in SampleResult's words (python -OO strips
# the docstrings: dataclasses then write their own, without the placeholder)
if StiefelResult.__doc__ is not None:
    StiefelResult.__doc__ = StiefelResult.__doc__.replace("%(inherited)s", "\n".join(
        textwrap.indent(entry, "    ")
        for name, entry in attribute_entries(SampleResult.__doc__ or "").items()
        if name not in ("samples", "kept_fraction", "last_state")))


class StiefelSampler(TorchEstimatorMixin, BaseEstimator):
    r"""Sample ``Q`` on the Stiefel manifold ``V(n, k)`` with density ``∝ g(Q)``.

    Runs :class:`ReflectiveHMC` on ``X in R^{n x k}`` with the potential
    :math:`-\log g(Q_X) + \|X\|_F^2 / 2`, reflecting off the Frobenius ball
    :math:`\|X\|_F \le b \sqrt{k}` and keeping the draws with
    :math:`a \le \sigma_{\min}(X)` and :math:`\sigma_{\max}(X) \le b`, whose polar
    factors are returned. Keeping only well-conditioned ``X`` does not change the
    law of ``Q``; it conditions the returned draws, not the trajectories, which
    cross the whole ball (where the gradient of ``Q_X`` grows as
    :math:`\sigma_{\min} \to 0`).

    Parameters
    ----------
    log_density : callable, optional
        ``log g``: maps ``(C, n, k)`` tensors to ``(C,)`` (another shape raises
        ``ValueError``); ``None`` is uniform.
        See :func:`matrix_von_mises_fisher_log_density` and :func:`bingham_log_density`.
    n, k : int, default=3, 1
        Manifold ``V(n, k)``, ``1 <= k <= n``.
    a, b : float, optional
        Conditioning bounds (defaults ``a = (sqrt(n) - sqrt(k - 1)) / 4`` and
        ``b = sqrt(n) + sqrt(k) + 1``, around the Gaussian's singular values: 96-99.7%
        of Gaussian ``n x k`` matrices lie within them for ``k < n`` and 80-88% for
        ``k = n``, measured on 20,000 draws for ``n`` up to 50).
    n_leapfrog, step_size, target_accept, jitter : optional
        As in :class:`ReflectiveHMC` (``n_leapfrog="auto"``: ChEES, by default).
    max_reflections, dtype, device, random_state, verbose : optional
        As in :class:`ReflectiveHMC`.

    Attributes
    ----------
    step_size_ : numpy.ndarray of shape (chains,)
        Frozen step sizes of the last :meth:`sample` call.
    trajectory_length_ : float or None
        Frozen ChEES trajectory length of the last call (``None`` with a fixed
        ``n_leapfrog``).
    n_features_in_ : int
        Dimension ``n * k`` of the Euclidean chain.

    References
    ----------
    .. [1] "Reflective Hamiltonian Monte Carlo on bounded supports: convex
       containers, thinning and Stiefel manifolds", ICML 2026.
    .. [2] M. Jauch, P. D. Hoff and D. B. Dunson, "Monte Carlo simulation on the
       Stiefel manifold via polar expansion", JCGS 2021, arXiv:1906.07684.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.sampling import StiefelSampler
    >>> res = StiefelSampler(n=3, k=2, n_leapfrog=5, random_state=0).sample(
    ...     50, n_chains=2, warmup=50)
    >>> res.Q.shape
    (2, 50, 3, 2)
    >>> Q = res.Q[0, -1]
    >>> bool(np.allclose(Q.T @ Q, np.eye(2), atol=1e-10))
    True
    """

    def __init__(self, log_density: Callable[[Tensor], Tensor] | None = None, n: int = 3,
                 k: int = 1, *, a: float | None = None, b: float | None = None,
                 n_leapfrog: int | Literal["auto"] = "auto",
                 step_size: Literal["auto"] | float = "auto", target_accept: float = 0.8,
                 jitter: bool | float = True, max_reflections: int | None = None,
                 dtype: FloatDType = torch.float64, device: str | torch.device = "cpu",
                 random_state: RandomStateLike = None, verbose: int = 0) -> None:
        self.log_density = log_density
        self.n = n
        self.k = k
        self.a = a
        self.b = b
        # (declared: pyright would widen the literal "auto" of an inferred one to str)
        self.n_leapfrog: int | Literal["auto"] = n_leapfrog
        self.step_size: Literal["auto"] | float = step_size
        self.target_accept = target_accept
        self.jitter = jitter
        self.max_reflections = max_reflections
        self.dtype = dtype
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    @classmethod
    def _estimator_check_instances(cls) -> list:
        # A sampler, not a fit(X, y) estimator: scikit-learn's checks do not apply.
        return []

    def _bounds(self) -> tuple[float, float]:
        # A quarter of sqrt(n) - sqrt(k - 1), the scale of a Gaussian matrix's smallest
        # singular value (Edelman): 0.25 sqrt(n) for k = 1 as before, but that value
        # kept 0.5% of the draws on V(10, 10) and left no start in R
        a = 0.25 * (math.sqrt(self.n) - math.sqrt(self.k - 1)) if self.a is None else self.a
        b = math.sqrt(self.n) + math.sqrt(self.k) + 1.0 if self.b is None else self.b
        check_positive(a, "a")
        check_positive(b, "b")
        if not a < b:
            raise ValueError(f"a must be smaller than b, got a={a!r}, b={b!r}.")
        return float(a), float(b)

    def _random_starts(self, a: float, b: float) -> Callable[[int], Tensor]:
        """Random starting points, flattened: per chain a Gaussian matrix (the law of
        ``X`` for a uniform ``g``) where it lies in ``R``, else its polar factor times a
        common singular value inside ``(a, b)``. Random points of the Frobenius ball
        have ``sigma_max`` near ``2 b`` for ``k = n`` and missed ``R``. They come from
        random_state's numpy stream, decorrelated from the sampler's torch stream (and
        so a run from these points as ``x0`` is the same run)."""
        n, k = int(self.n), int(self.k)
        _, rng = make_generators(self.random_state)
        sigma = math.sqrt(n) if a < math.sqrt(n) < b else 0.5 * (a + b)

        def propose(chains: int) -> Tensor:
            G = torch.from_numpy(rng.standard_normal((chains, n, k)))
            s = torch.linalg.svdvals(G)
            inside = (s[:, -1] > a) & (s[:, 0] < b)
            return torch.where(inside[:, None, None], G, sigma * _polar(G)).reshape(
                chains, -1)
        return propose

    def sample(self, n_samples: int, *, n_chains: int | None = None, warmup: int | None = None,
               thin: int = 1, resume: StiefelResult | None = None) -> StiefelResult:
        """Draw ``n_samples`` Stiefel matrices per chain.

        Parameters
        ----------
        n_samples : int
            Kept draws per chain.
        n_chains, warmup : int, optional
            As in :meth:`ReflectiveHMC.sample`: 4 chains and 1000 adaptation
            iterations by default; the result's chains and no warm-up with ``resume``.
        thin : int, default=1
            Record every ``thin``-th state (then keep the well-conditioned ones).
        resume : StiefelResult, optional
            Continue a finished run of a sampler on the same ``V(n, k)``: each
            chain restarts from its final Euclidean state ``X``
            (``resume.last_state``, not ``Q``) with the frozen step sizes and
            trajectory length of the result, and the random stream goes on where
            the run stopped, as :meth:`ReflectiveHMC.sample` does with
            ``resume``: the concatenation is one Markov chain (bit for bit one
            longer call when every recorded ``X`` of both calls was well
            conditioned, ``kept_fraction == 1``), and ``random_state`` plays no
            further role. The sampler's other settings (``log_density``, ``a``,
            ``b``, a fixed ``n_leapfrog``, ``jitter``, ...) apply. With
            ``warmup > 0`` the adaptation starts afresh from the final states.

        Returns
        -------
        StiefelResult
            ``Q`` of shape ``(chains, draws, n, k)`` (and ``samples``, its
            flattened form, for the diagnostics).

        Raises
        ------
        TypeError
            If ``log_density`` is not callable, or ``resume`` is not a
            :class:`StiefelResult`.
        ValueError
            If ``n``, ``k``, ``a`` or ``b`` are invalid. With ``resume``: if the
            result was drawn on another ``V(n, k)``, it has no final state (built
            by hand or by an older version), ``n_chains`` differs from the
            result's, its final states lie outside the Frobenius ball of radius
            ``b sqrt(k)`` (a smaller ``b``), or ``n_leapfrog="auto"`` resumes a
            fixed-length run without warm-up.
        """
        check_positive(self.n, "n", integer=True)
        check_positive(self.k, "k", integer=True)
        if self.k > self.n:
            raise ValueError(f"k must be <= n, got k={self.k}, n={self.n}.")
        if self.log_density is not None and not callable(self.log_density):
            raise TypeError("log_density must be callable or None.")
        n, k = int(self.n), int(self.k)
        a, b = self._bounds()
        if resume is not None:
            _check_resume(resume, n, k)
        g = self.log_density
        checked: list[bool] = []  # whether log_density's autograd graph was looked at (once)

        def log_prob(x):
            X = x.reshape(-1, n, k)
            out = -0.5 * (x * x).sum(-1)
            if g is not None:
                lg = g(_polar(X))
                if not isinstance(lg, torch.Tensor) or lg.shape != out.shape:
                    got = tuple(lg.shape) if isinstance(lg, torch.Tensor) else type(lg).__name__
                    # (a ContractError: the sampler adds no guess written for log_prob)
                    raise ContractError(f"log_density must map a ({X.shape[0]}, {n}, {k}) "
                                        f"tensor to shape ({X.shape[0]},) (one value per "
                                        f"matrix, a torch tensor), got {got}; wrap a function "
                                        "of one matrix in torch.vmap.")
                if not checked and x.requires_grad:
                    checked.append(True)
                    _warn_if_detached(lg)
                out = out + lg
            return out

        def well_conditioned(x):
            s = torch.linalg.svdvals(x.reshape(-1, n, k))
            return (s[:, -1] >= a) & (s[:, 0] <= b)

        hmc = ReflectiveHMC(
            log_prob, Ball(np.zeros(n * k), b * math.sqrt(k)), support=Region(well_conditioned),
            step_size=self.step_size, n_leapfrog=self.n_leapfrog,
            target_accept=self.target_accept, max_reflections=self.max_reflections,
            jitter=self.jitter, dtype=self.dtype, device=self.device,
            random_state=self.random_state, verbose=self.verbose)
        hmc._progress_label = "StiefelSampler"  # the bars the user sees
        hmc._density_name = "log_density"  # the user's function, in the start's errors
        hmc._start_advice = "check where log_density is finite (-inf outside a region)"
        hmc._start_proposal = self._random_starts(a, b)
        with eval_mode(g):  # (the inner sampler sees only the wrapper)
            res = hmc.sample(n_samples, n_chains=n_chains, warmup=warmup, thin=thin,
                             resume=resume)
        self.step_size_ = hmc.step_size_
        self.trajectory_length_ = hmc.trajectory_length_
        self.n_features_in_ = n * k
        chains = res.samples.shape[0]
        X = torch.from_numpy(res.samples).reshape(chains, n_samples, n, k)
        Q = polar_draws(X)
        fields = {f: getattr(res, f) for f in SampleResult.__dataclass_fields__}
        fields["samples"] = Q.reshape(chains, n_samples, n * k)
        return StiefelResult(**fields, Q=Q, X=X.numpy())


POLAR_BLOCK_ELEMENTS = BLOCK_ELEMENTS  # draws' entries per block of polar factors (32 MB float64)


def polar_draws(X: Tensor) -> np.ndarray:
    """Polar factors of draws ``X`` of shape ``(chains, draws, n, k)``, in ``X``'s dtype.

    Computed in float64 over blocks of draws written into one output: the SVD of all
    the draws at once held a copy of them, ``U`` and the product besides the result (a
    run of 64 chains x 10^4 draws on ``V(50, 10)`` has 2.6 GB of float64 draws).
    """
    shape = X.shape
    flat = X.reshape(-1, *shape[-2:])
    rows = block_rows_for(shape[-2] * shape[-1], POLAR_BLOCK_ELEMENTS)
    Q = collect_row_blocks(lambda r: _polar(flat[r].to(torch.float64)).to(X.dtype),
                           flat.shape[0], rows)
    return Q.reshape(shape).numpy()


def _check_resume(result, n: int, k: int) -> None:
    """Reject a ``resume`` that is no :class:`StiefelResult` of ``V(n, k)`` with a final state
    (the inner :class:`ReflectiveHMC` checks the rest: chains, ball, tuning)."""
    if not isinstance(result, StiefelResult):
        raise TypeError("resume must be a StiefelResult returned by StiefelSampler.sample, "
                        f"got {type(result).__name__}.")
    Q = np.asarray(result.Q)
    if result.last_state is None or result.sampler_state is None or Q.ndim != 4:
        raise ValueError("resume: this StiefelResult has no final chain state (it was built "
                         "by hand or by an older version of mlpapers); start a new run with "
                         "a warm-up instead.")
    if tuple(Q.shape[-2:]) != (n, k):
        raise ValueError(f"resume: the result was drawn on V({Q.shape[-2]}, {Q.shape[-1]}) "
                         f"(n={Q.shape[-2]}, k={Q.shape[-1]}) but the sampler has n={n}, k={k}.")
