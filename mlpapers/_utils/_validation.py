"""Input validation and conversion between array-likes, numpy and torch.

Error messages follow scikit-learn's wording ("Expected 2D array, got 1D array
instead") and always name the offending argument, so that a user sees *which*
input was wrong before any expensive work starts.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
import torch

from mlpapers._utils._ambient import usable_outside_inference
from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for
from mlpapers._utils._typing import F

_FLOAT_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Turn ``device`` into a :class:`torch.device`, checking it is usable.

    Parameters
    ----------
    device : str, torch.device or None
        ``None`` and ``"cpu"`` mean the CPU; ``"auto"`` picks CUDA when available.

    Returns
    -------
    torch.device
        CUDA with an index: ``"cuda"`` and ``"auto"`` name the current CUDA device.

    Raises
    ------
    ValueError
        If ``device`` names no device, or one this machine cannot use (CUDA or MPS
        missing, an index beyond the device count, ``"meta"``, or another type, e.g.
        ``"xla"`` or ``"xpu"``, whose backend is not installed or has no device).
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto', got {device!r}."
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} was requested but CUDA is not available.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} was requested but only "
                             f"{torch.cuda.device_count()} CUDA device(s) are available.")
        if dev.index is None:
            # pinned: tensors on it compare equal to it (a cache keyed by device hits), and
            # a later torch.cuda.set_device does not move an estimator's computations
            dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type == "mps" and not (
        getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    ):
        raise ValueError(f"device={device!r} was requested but MPS is not available.")
    if dev.type == "meta":  # tensors without data: every result would be meaningless
        raise ValueError("device='meta' holds no data and cannot fit an estimator.")
    if dev.type not in ("cpu", "cuda", "mps"):
        # the other types torch parses ('xla', 'xpu', 'hpu', 'privateuseone', ...) need a
        # backend this build or machine may lack; probed so that they fail here, not with
        # torch's RuntimeError, NotImplementedError, AssertionError or ModuleNotFoundError
        # at the first tensor (and load does not call a valid file damaged)
        try:
            torch.empty(0, device=dev)
        except Exception as exc:  # each backend fails in its own way
            raise ValueError(f"device={device!r} was requested but the {dev.type!r} device "
                             f"is not available here ({type(exc).__name__}); use 'cpu', "
                             "'cuda' or 'auto'.") from exc
    return dev


def resolve_dtype(dtype: Any) -> torch.dtype:
    """Turn a floating dtype given as torch dtype, numpy dtype or string into a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating point dtype, got {dtype}.")
        return dtype
    try:
        name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    except TypeError as exc:
        raise TypeError(f"dtype must be a floating point dtype, got {dtype!r}.") from exc
    name = name.replace("torch.", "")
    if name not in _FLOAT_DTYPES and name != "bfloat16":
        try:  # numpy spellings of float dtypes: "double", "f4", "<f8", "half"
            name = np.dtype(name).name
        except TypeError:
            pass
    if name not in _FLOAT_DTYPES:
        raise TypeError(
            f"dtype must be one of {sorted(_FLOAT_DTYPES)}, got {dtype!r}."
        )
    return _FLOAT_DTYPES[name]


def _all_finite(t: torch.Tensor, block: int = BLOCK_ELEMENTS) -> bool:
    """``torch.isfinite(t).all()`` in blocks of rows of about ``block`` values: the
    check's temporaries stay small whatever the size of ``t`` (no copy of ``t``).

    A finite sum proves every value finite (a NaN or an infinity makes the sum NaN or
    infinite) in one reduction, about 8 times faster than the elementwise test, which
    ran twice on a relevance matrix per RBE fit; only a sum that overflows falls through
    to the exact blocked test."""
    if bool(torch.isfinite(t.detach().sum())):
        return True
    if t.ndim == 0 or t.numel() <= block:
        return bool(torch.isfinite(t).all())
    rows = block_rows_for(t[0].numel(), block)
    return all(bool(torch.isfinite(t[s:s + rows]).all()) for s in range(0, t.shape[0], rows))


def common_float_dtype(*tensors: torch.Tensor, min_bits: int = 16,
                       names: Sequence[str] = ()) -> torch.dtype:
    """The dtype the public tensor kernels compute in for ``tensors``: their promoted
    dtype, the default dtype when none is floating (integer inputs), raised to float32
    when it has fewer than ``min_bits`` bits (linear algebra has no float16 kernels).
    Mixed inputs failed with torch's "expected m1 and m2 to have the same dtype".
    Complex inputs raise a ``TypeError`` (naming the first one by ``names``, the
    arguments' names in order, when given): they were cast to the real default dtype,
    dropping the imaginary part silently."""
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
    if dtype.is_complex:
        i = next(j for j, t in enumerate(tensors) if t.is_complex())
        check_real(tensors[i], names[i] if i < len(names) else "complex tensors")
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if torch.finfo(dtype).bits < min_bits:
        dtype = torch.float32
    return dtype


def check_real(value: Any, name: str) -> None:
    """Raise a ``TypeError`` naming ``name`` if ``value`` (a tensor, a numpy array or an
    array-like) holds complex numbers. The library computes in real dtypes, and the cast
    to one dropped the imaginary part: silently in torch, with a warning in numpy."""
    if isinstance(value, torch.Tensor):
        if not value.is_complex():
            return
    elif not np.iscomplexobj(value):
        return
    dtype = getattr(value, "dtype", "complex values")
    raise TypeError(f"{name} must hold real numbers (floating or integer), got {dtype}; "
                    "pass its real part or its magnitude.")


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` if the floating tensor ``t`` holds NaN or
    infinity (checked in blocks: no full-size temporary). The check of the public
    tensor kernels, whose inputs ``check_tensor`` does not see. A complex ``t`` raises a
    ``TypeError`` naming ``name`` (the kernels compute in real dtypes)."""
    check_real(t, name)
    if t.is_floating_point() and not _all_finite(t):
        raise ValueError(f"{name} contains NaN or infinity.")


def _is_pandas_na(value: Any) -> bool:
    return type(value).__name__ == "NAType"


def _numbers_as_float64(arr: np.ndarray, name: str) -> np.ndarray:
    """An object/string array of numbers as float64. pandas' nullable columns (``Int64``,
    ``boolean``) give ``pd.NA`` for missing values: they become NaN, so the NaN check
    reports them as missing instead of as non-numbers. Dates and durations are refused
    (their integer encoding is not a feature)."""
    error = TypeError(f"{name} must contain numbers, got an array of dtype {arr.dtype}.")
    if arr.dtype.kind in "mMUS":
        # (string arrays refused even when they parse, as scikit-learn's check_array
        # does: "1.5" read as a number hid a file loaded as text)
        raise error
    try:
        return arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        if arr.dtype.kind == "O":
            missing = np.frompyfunc(_is_pandas_na, 1, 1)(arr).astype(bool)
            if missing.any():
                try:
                    return np.where(missing, np.nan, arr).astype(np.float64)
                except (TypeError, ValueError):
                    pass
        raise error from exc


def check_tensor(
    X: Any,
    *,
    name: str = "X",
    ndim: int | Iterable[int] | None = 2,
    dtype: torch.dtype | str | None = torch.float32,
    device: str | torch.device | None = None,
    allow_nan: bool = False,
    min_samples: int = 1,
    min_features: int = 1,
    n_features: int | None = None,
    owner: str = "this estimator",
) -> torch.Tensor:
    """Validate an array-like, numpy array or tensor and return a torch tensor.

    Parameters
    ----------
    X : array-like, numpy.ndarray or torch.Tensor
        The input. Lists and numpy arrays are converted; tensors keep their data
        (moved to ``device`` and cast to ``dtype`` when these differ, copied to a
        contiguous layout when they are not, as numpy inputs are: results do not
        depend on the memory layout).
    name : str, default="X"
        The argument's name, used in error messages.
    ndim : int, iterable of int or None, default=2
        The allowed number of dimensions. ``None`` accepts any.
    dtype : torch.dtype, str or None, default=torch.float32
        The floating dtype of the result. ``None`` keeps a floating input's dtype
        (except float16 on the CPU, which becomes float32; integer and boolean
        inputs are then returned unchanged, for labels and indices).
    device : str, torch.device or None
        Where the result lives (default CPU).
    allow_nan : bool, default=False
        Whether NaN and infinite values are accepted.
    min_samples : int, default=1
        The minimum size of the first axis.
    min_features : int, default=1
        The minimum size of the second axis (when ``ndim >= 2``).
    n_features : int or None
        If given, the exact required size of the second axis (the number of
        features seen in ``fit``).

    Returns
    -------
    torch.Tensor
        The validated tensor of shape ``X.shape``.

    Raises
    ------
    TypeError
        If ``X`` is not numeric (strings, objects), is sparse (scipy or torch), or is a
        nested or quantized torch tensor.
    ValueError
        On a meta-device tensor, complex data, a wrong number of dimensions, too few
        samples or features, a feature count that differs from ``n_features``, or
        non-finite values.
    """
    dev = resolve_device(device)
    if X is None:
        raise ValueError(f"{name} must be an array-like or tensor, got None.")
    if isinstance(X, torch.Tensor):
        t = X.detach()
        if t.is_nested:  # (before layout: a nested tensor may report torch.strided)
            raise TypeError(f"{name} is a nested torch tensor, but {owner} needs one dense "
                            f"tensor: pad it, e.g. {name}.to_padded_tensor(0.0).")
        if t.is_meta:
            raise meta_tensor_error(name)
        if t.is_quantized:
            raise TypeError(f"{name} is a quantized torch tensor ({t.dtype}), but {owner} "
                            f"needs real values: pass {name}.dequantize().")
        if t.layout != torch.strided:
            raise TypeError(
                f"{name} is a sparse torch tensor ({t.layout}), but {owner} needs dense "
                f"data: pass {name}.to_dense()."
            )
        if t.is_complex():
            raise ValueError(f"Complex data not supported: {name} has dtype {t.dtype}.")
    else:
        if hasattr(X, "__array__") or isinstance(X, (list, tuple, numbers.Number)):
            try:
                arr = np.asarray(X)
            except ValueError as exc:  # ragged nested sequences
                raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
        elif hasattr(X, "toarray"):  # scipy sparse matrices and arrays
            raise TypeError(
                f"{name} is a scipy sparse {type(X).__name__}, but {owner} needs dense "
                f"data: pass {name}.toarray()."
            )
        else:
            raise TypeError(
                f"{name} must be an array-like, numpy array or torch tensor, "
                f"got {type(X).__name__}."
            )
        if arr.dtype.kind == "c":
            raise ValueError(f"Complex data not supported: {name} has dtype {arr.dtype}.")
        if arr.dtype.kind in "OUSVmM":
            arr = _numbers_as_float64(arr, name)
        elif arr.dtype.kind == "f" and arr.dtype.itemsize > 8:  # long double: torch has none
            arr = arr.astype(np.float64)
        t = torch.from_numpy(torch_compatible_array(arr))

    allowed = None if ndim is None else ({ndim} if isinstance(ndim, int) else set(ndim))
    if allowed is not None and t.ndim not in allowed:
        want = " or ".join(f"{d}D" for d in sorted(allowed))
        hint = ""
        if t.ndim == 1 and 2 in allowed:
            hint = (
                " Reshape your data either using array.reshape(-1, 1) if your data has a "
                "single feature or array.reshape(1, -1) if it contains a single sample."
            )
        raise ValueError(f"Expected {want} array for {name}, got {t.ndim}D array instead.{hint}")

    if t.ndim >= 1 and t.shape[0] < min_samples:
        raise ValueError(
            f"Found array with {t.shape[0]} sample(s) (shape={tuple(t.shape)}) in {name} "
            f"while a minimum of {min_samples} is required."
        )
    if t.ndim >= 2 and t.shape[1] < min_features:
        raise ValueError(
            f"Found array with {t.shape[1]} feature(s) (shape={tuple(t.shape)}) in {name} "
            f"while a minimum of {min_features} is required."
        )
    if n_features is not None and t.ndim >= 2 and t.shape[1] != n_features:
        raise ValueError(
            f"{name} has {t.shape[1]} features, but {owner} is expecting "
            f"{n_features} features as input."
        )

    if dtype is not None:
        t = t.to(device=dev, dtype=resolve_dtype(dtype))
    else:
        if t.dtype == torch.float16 and dev.type == "cpu":
            t = t.float()
        t = t.to(device=dev)
    # (a transposed or channels-last tensor summed in another order in the matmuls than
    # the same values from numpy, which torch_compatible_array makes C-contiguous)
    t = usable_outside_inference(t.contiguous())
    if t.is_floating_point() and not allow_nan and not _all_finite(t):
        kind = "NaN" if bool(torch.isnan(t).any()) else "infinity"
        raise ValueError(f"Input {name} contains {kind} or a value too large for {t.dtype}.")
    return t


def reject_single_hwc_image(images: Any, name: str = "X", fix: str = "X[None]") -> None:
    """Raise when a 3D image batch ``(n, H, W)`` is really one ``(H, W, C)`` colour image
    (last axis of 3 or 4 entries, more than 4 rows), which would otherwise be read as
    ``H`` grayscale images a few pixels wide; ``fix`` is the suggested call."""
    shape = tuple(images.shape)
    if len(shape) == 3 and shape[-1] in (3, 4) and shape[-2] > 4:
        raise ValueError(f"{name} has shape {shape}: a single (H, W, C) colour image, not a "
                         f"batch of {shape[0]} grayscale images {shape[-1]} pixels wide; "
                         f"pass {fix}.")


def reject_flat_image_table(X: Any, name: str = "X", *, takes: str,
                            channels_first: bool = False,
                            image_shape: tuple[int, ...] | None = None) -> None:
    """Raise when ``X`` is 2D: one image, or a table of flattened images (one row per
    image, as PyOD or ``load_digits().data`` give), with the reshape to apply.

    ``takes`` names the accepted layouts in the message; ``channels_first`` restricts
    the suggestion to ``(n, C, H, W)``; ``image_shape`` (e.g. the fit's) is suggested
    when its size matches a row. Nested lists are measured with ``np.shape``.
    """
    if isinstance(X, torch.Tensor) and X.is_nested:  # no shape: check_tensor explains
        return
    shape = getattr(X, "shape", None)
    if shape is None and isinstance(X, (list, tuple)):
        try:
            shape = np.shape(X)
        except ValueError:  # ragged: the general checks explain
            return
    if shape is None or len(shape) != 2:
        return
    n, d = (int(v) for v in shape)
    side, side3 = math.isqrt(d), math.isqrt(d // 3)
    if image_shape is not None and math.prod(image_shape) == d:
        eg = f"{name}.reshape({n}, {', '.join(str(int(v)) for v in image_shape)})"
    elif side * side == d:
        eg = f"{name}.reshape({n}, {'1, ' if channels_first else ''}{side}, {side})"
    elif d % 3 == 0 and side3 * side3 == d // 3:
        first = f"{name}.reshape({n}, 3, {side3}, {side3})"
        eg = first if channels_first else (
            f"{name}.reshape({n}, {side3}, {side3}, 3) for channels-last rows or {first} "
            "for channels-first rows")
    else:
        eg = f"{name}.reshape(n, C, H, W)" if channels_first else \
            f"{name}.reshape(n, H, W) or (n, H, W, 3)"
    raise ValueError(f"{name} has shape {(n, d)}, a table of rows; {takes}. For a single "
                     f"image pass {name}[None]; with one flattened image per row, reshape "
                     f"flattened images first, e.g. {eg}.")


def torch_compatible_array(a: Any) -> np.ndarray:
    """``a`` as a numpy array that ``torch.from_numpy`` reads: native byte order,
    writable and C-contiguous, copied at most once and only when needed.

    Big-endian data (from FITS/HDF5/MATLAB files), read-only memmaps and pandas'
    copy-on-write views, and strided views all need the copy; 0-d arrays stay 0-d.
    A reversed axis of length 1 (``x[:, ::-1]`` of one column) leaves numpy's
    C-contiguous flag set but a negative stride that torch refuses: copied too.
    """
    a = np.asanyarray(a)
    a = np.require(a, dtype=a.dtype.newbyteorder("="), requirements=["C", "W"])
    return a.copy() if any(st < 0 for st in a.strides) else a


#: torch's integer dtypes (numpy's kinds "i" and "u"; the wider unsigned ones where this
#: torch has them)
TORCH_INTEGER_DTYPES: tuple[torch.dtype, ...] = tuple(
    getattr(torch, f"{kind}int{bits}") for kind in ("", "u") for bits in (8, 16, 32, 64)
    if hasattr(torch, f"{kind}int{bits}"))


def meta_tensor_error(name: str, fix: str = "pass a tensor with data") -> ValueError:
    """The error for a meta-device tensor given as ``name`` (its values do not exist:
    torch's own "Cannot copy out of meta tensor" came from deep inside a conversion);
    ``fix`` says what to do instead."""
    return ValueError(f"{name} is a torch tensor on the meta device, which holds no "
                      f"values: {fix}.")


def to_numpy(t: Any, name: str = "the input") -> np.ndarray:
    """Return ``t`` as a numpy array (tensors are detached and moved to the CPU).

    bfloat16 and float16 tensors become float32, since numpy has no bfloat16. A
    meta-device tensor raises a ``ValueError`` naming ``name`` (the argument).
    """
    if isinstance(t, torch.Tensor):
        if t.is_meta:
            raise meta_tensor_error(name)
        t = t.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.cpu().resolve_conj().resolve_neg().numpy()
    return np.asarray(t)


def check_positive(value: Any, name: str, *, strict: bool = True, integer: bool = False) -> Any:
    """Check that a scalar parameter is a (strictly) positive number.

    Parameters
    ----------
    value : object
        The value to check.
    name : str
        The parameter name, used in the message.
    strict : bool, default=True
        Require ``value > 0`` (else ``value >= 0``).
    integer : bool, default=False
        Require an integer (booleans are rejected) of at most ``2**63 - 1``.

    Returns
    -------
    The value, unchanged.
    """
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "an integer" if integer else "a real number"
        raise TypeError(f"{name} must be {what}, got {value!r} of type {type(value).__name__}.")
    # ``float(value)`` overflows for huge Python ints, which are finite anyway
    finite = isinstance(value, numbers.Integral) or math.isfinite(float(value))
    if not finite or (value <= 0 if strict else value < 0):
        bound = "> 0" if strict else ">= 0"
        # ("must be > 0, got inf" contradicted itself)
        raise ValueError(f"{name} must be {'' if finite else 'finite and '}{bound}, got "
                         f"{value!r}.")
    if isinstance(value, numbers.Integral) and integer and int(value) > _INDEX_MAX:
        # a count or size beyond any index: tqdm, range and torch's shapes failed on it
        # with errors that did not name the parameter
        raise ValueError(f"{name} must be at most 2**63 - 1 (a count or size), got "
                         f"{value!r}.")
    return value


#: the largest count or size (torch's int64 shapes, Python's ssize_t ranges)
_INDEX_MAX = 2**63 - 1

#: the largest learning rate an optimiser can apply to float32 weights
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def float32_within_range(values: np.ndarray, name: str, value: Any) -> np.ndarray:
    """``values`` cast to float32, refusing what overflows there: a generator parameter
    ``name`` (given as ``value``) large enough to put values beyond float32's range
    gave infinite data with only numpy's cast warning."""
    with np.errstate(over="ignore"):
        out = values.astype(np.float32)
    if not np.isfinite(out).all():
        raise ValueError(f"{name}={value!r} puts values beyond float32's range; lower it.")
    return out


def check_learning_rate(value: Any, name: str = "lr", *, adam: bool = False) -> Any:
    """Check a learning rate: a finite number in ``(0, float32 max]``, or up to a tenth
    of that for Adam/AdamW (``adam=True``).

    Optimisers step float32 weights with it, and torch refuses a larger step only at the
    first update, with "value cannot be converted to type float without overflow". Adam's
    first step is ``lr / (1 - beta1)``, ten times ``lr`` at torch's default
    ``beta1 = 0.9``. No useful rate comes near either bound.

    Returns
    -------
    The value, unchanged.
    """
    check_positive(value, name)
    bound = _FLOAT32_MAX * (1.0 - 0.9) if adam else _FLOAT32_MAX
    if value > bound:
        why = "Adam's first step, lr / (1 - 0.9), must fit in float32" if adam else \
            "the largest step an optimiser can apply to float32 weights"
        raise ValueError(f"{name} must be at most {bound:.4g} ({why}), got {value!r}.")
    return value


def check_float32_param(value: Any, name: str, *, strict: bool = True) -> None:
    """A positive (``strict``) or non-negative number the float32 training multiplies
    weights or losses by: at most float32's largest value. Torch refused a larger one
    only at the first step ("value cannot be converted to type float without
    overflow"), or it became inf and the fit returned NaN coefficients."""
    check_positive(value, name, strict=strict)
    if value > _FLOAT32_MAX:
        raise ValueError(f"{name} must be at most {_FLOAT32_MAX:.3g} (float32 training), got "
                         f"{value!r}.")


def check_bool(value: Any, name: str) -> bool:
    """Check a switch: ``True`` or ``False`` (a numpy bool too), never a truthy stand-in.

    ``"no"``, ``2`` or ``None`` would otherwise pass as a truth value and choose a
    branch the caller did not ask for; scikit-learn refuses them the same way.

    Returns
    -------
    The value as a Python ``bool``.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {value!r} of type "
                        f"{type(value).__name__}.")
    return bool(value)


def holds_only_zero_one(t: torch.Tensor) -> bool:
    """Whether ``t`` can stand for booleans: a bool tensor, or real numbers that are all
    0 or 1 (a mask cast to float). ``.bool()`` of anything else (a score, a weight, NaN)
    is True almost everywhere, so callers refuse it instead."""
    if t.dtype == torch.bool:
        return True
    return not t.is_complex() and bool(((t == 0) | (t == 1)).all())


def check_verbose(value: Any, name: str = "verbose") -> Any:
    """Check a verbosity: ``True``/``False`` or an integer ``>= 0`` (scikit-learn's rule)."""
    if not isinstance(value, (bool, np.bool_)):
        check_positive(value, name, strict=False, integer=True)
    return value


def check_in_options(value: Any, name: str, options: Iterable[Any]) -> Any:
    """Check that ``value`` is one of ``options``; raise a ``ValueError`` listing them."""
    options = tuple(options)
    if not any(_same_option(value, o) for o in options):
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}.")
    return value


def _same_option(value: Any, option: Any) -> bool:
    """``value == option``, where a bool never matches a number (``True == 1`` in
    Python) and values without a truth value (arrays) never match."""
    if isinstance(value, (bool, np.bool_)) != isinstance(option, (bool, np.bool_)):
        return False
    try:
        return bool(value == option)
    except (TypeError, ValueError):
        return False


def probe_module(module: torch.nn.Module, x: torch.Tensor, name: str = "model") -> Any:
    """Run a user ``module`` once on a small batch ``x`` to check its interface early.

    The call runs in eval mode without gradients and restores the module's
    training flag, so it has no side effects (BatchNorm statistics, dropout).

    Returns
    -------
    The module's output, for the caller to check its shape.

    Raises
    ------
    ValueError
        If the module fails on ``x`` (a ``RuntimeError``, e.g. a shape mismatch),
        naming ``name`` and the expected input shape.
    """
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return module(x)
    except RuntimeError as exc:
        raise ValueError(f"{name} must accept inputs of shape (batch, *{tuple(x.shape[1:])}): "
                         f"{exc}") from exc
    finally:
        module.train(training)


_ABSENT = object()


_TENSOR_ANNOTATIONS = ("torch.Tensor", "Tensor", torch.Tensor)
_OPTIONAL_TENSOR_ANNOTATIONS = ("torch.Tensor | None", "Tensor | None", torch.Tensor | None)


def requires_tensors(func: F) -> F:
    """Raise a ``TypeError`` naming the parameter when an argument annotated
    ``torch.Tensor`` (or ``torch.Tensor | None``, unless it is ``None``) is something
    else (a numpy array or a list gave an ``AttributeError`` from deep inside the
    function: ``mask=[True, False]``), or a complex tensor. For the public tensor
    functions."""
    params = list(inspect.signature(func).parameters.values())
    required = [(i, p.name, p.annotation in _OPTIONAL_TENSOR_ANNOTATIONS)
                for i, p in enumerate(params)
                if p.annotation in _TENSOR_ANNOTATIONS
                or p.annotation in _OPTIONAL_TENSOR_ANNOTATIONS]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        for i, name, optional in required:
            value = args[i] if i < len(args) else kwargs.get(name, _ABSENT)
            if value is _ABSENT or (optional and value is None):
                continue
            if not isinstance(value, torch.Tensor):
                hint = f" (torch.from_numpy({name}))" if isinstance(value, np.ndarray) else ""
                raise TypeError(f"{func.__name__}: {name} must be a torch.Tensor{hint}, got "
                                f"{type(value).__name__}.")
            check_real(value, f"{func.__name__}: {name}")
        return func(*args, **kwargs)

    return cast(F, wrapper)
