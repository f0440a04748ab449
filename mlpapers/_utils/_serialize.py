"""Encoding of estimator states into what ``torch.load(weights_only=True)`` accepts.

:func:`encode` turns tensors, numpy arrays and scalars, numpy random generators,
numbers, strings and nested lists/tuples/dicts of them into tensors, numbers,
strings, lists and dicts (tagged dicts mark what must be rebuilt); :func:`decode`
inverts it. Only a fixed list of numpy bit generators can be rebuilt, by name,
so a file never makes the loader import or call anything else.

Numbers are stored as tensors. ``numpy.longdouble`` and ``numpy.clongdouble``,
which torch cannot hold, are written as two float64 (complex128) tensors, the
float64 rounding and what it dropped, and load back as the same numpy type with
the same values (exactly, within float64's range: larger magnitudes load as
infinities, and digits below float64's smallest subnormal are lost).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from mlpapers._utils._validation import torch_compatible_array

__all__ = ["decode", "encode", "generator_from_state"]

_NDARRAY_TAG = "__mlpapers_ndarray__"
_TUPLE_TAG = "__mlpapers_tuple__"
_STRARRAY_TAG = "__mlpapers_strarray__"
_SCALAR_TAG = "__mlpapers_npscalar__"
_RNG_TAG = "__mlpapers_numpy_rng__"
_DICT_TAG = "__mlpapers_dict__"
_DTYPE_TAG = "__mlpapers_dtype__"
_LOW = "low"  # the float64 remainder of a long double (next to _NDARRAY_TAG/_SCALAR_TAG)
_WIDE_TYPES = {"longdouble": np.longdouble, "clongdouble": np.clongdouble}
_BUILTIN_TYPES = {t.__name__: t for t in (bool, int, float, complex, str)}
_NUMPY_TYPES = {np.dtype(t).type for t in "?bBhHiIlLqQefdgFDG"}
# numpy bit generators that ``load`` may rebuild (by name, from a fixed list)
_NUMPY_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


def _plain(v: Any) -> Any:
    """Numpy scalars inside object arrays as Python scalars (the safe loader refuses them)."""
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v.item() if isinstance(v, np.generic) else v


def _encode_numbers(a: Any, tag: str) -> dict[str, Any]:
    """A numeric array (or numpy scalar) as ``{tag: tensor}``; long doubles, which torch
    cannot hold, as two float64 (complex128) tensors whose sum is the value."""
    a = torch_compatible_array(a)
    if a.dtype.type in (np.longdouble, np.clongdouble):
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        with np.errstate(all="ignore"):
            high = a.astype(wide)
            rest = np.asarray(a - high)  # exact: what rounding to float64 dropped
        low = np.zeros(a.shape, dtype=wide)  # 0 where ``high`` is infinite or nan
        for dst, src, hi in (((low.real, rest.real, high.real), (low.imag, rest.imag, high.imag))
                             if a.dtype.kind == "c" else ((low, rest, high),)):
            np.copyto(dst, src, casting="same_kind", where=np.isfinite(src))
            np.copyto(dst, np.copysign(0.0, hi), where=dst == 0)  # -0.0 + -0.0 stays -0.0
        name = "clongdouble" if a.dtype.kind == "c" else "longdouble"
        return {tag: torch.from_numpy(high), _LOW: torch.from_numpy(low), "dtype": name}
    if a.dtype.kind in "biu":  # e.g. numpy.ulonglong, which torch refuses: as uint64
        a = a.view(np.dtype(a.dtype.str))
    return {tag: torch.from_numpy(a)}


def _decode_wide(obj: dict, tag: str) -> np.ndarray:
    """The long double array that :func:`_encode_numbers` split into two tensors."""
    wide = _WIDE_TYPES[obj["dtype"]]
    with np.errstate(all="ignore"):
        return (obj[tag].cpu().numpy().astype(wide)
                + obj[_LOW].cpu().numpy().astype(wide))


def _encode_key(key: Any, where: str) -> Any:
    if isinstance(key, np.generic):
        key = key.item()
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    if isinstance(key, tuple):
        return tuple(_encode_key(k, where) for k in key)
    raise TypeError(f"cannot save {where}: dict keys of type {type(key).__name__} are not "
                    "supported (only strings, numbers, None and tuples of them).")


def encode(obj: Any, where: str) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biufc":
            return _encode_numbers(obj, _NDARRAY_TAG)
        # string labels (``classes_`` of classifiers): stored as a nested list
        flat = obj.ravel().tolist()
        if obj.dtype.kind == "U" or (obj.dtype.kind == "O" and all(
                isinstance(v, (str, bool, numbers.Number)) for v in flat)):
            return {_STRARRAY_TAG: _plain(obj.tolist()), "object": obj.dtype.kind == "O",
                    "dtype": obj.dtype.str, "shape": list(obj.shape)}
        raise TypeError(f"cannot save {where}: numpy arrays of dtype {obj.dtype} are "
                        "not supported (only numbers and strings).")
    if isinstance(obj, np.generic):
        if obj.dtype.kind in "biufc":  # keep the numpy type (np.float32 stays np.float32)
            return _encode_numbers(obj, _SCALAR_TAG)
        return obj.item()
    if isinstance(obj, np.random.RandomState):
        return {_RNG_TAG: encode(obj.get_state(legacy=False), where), "legacy": True}
    if isinstance(obj, np.random.Generator):
        return {_RNG_TAG: encode(obj.bit_generator.state, where), "legacy": False}
    if obj is None or isinstance(obj, (bool, numbers.Number, str)):
        return obj
    if isinstance(obj, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {_TUPLE_TAG: [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        items = [(_encode_key(k, where), encode(v, f"{where}[{k!r}]")) for k, v in obj.items()]
        if any(isinstance(k, str) and k.startswith("__mlpapers_") for k, _ in items):
            # a user dict that looks like one of the tags above: stored as pairs
            return {_DICT_TAG: [[k, v] for k, v in items]}
        return dict(items)
    if isinstance(obj, torch.device):
        return str(obj)
    if isinstance(obj, torch.dtype):  # the safe loader reads torch dtypes as they are
        return obj
    if isinstance(obj, np.dtype):
        return {_DTYPE_TAG: obj.str, "kind": "dtype"}
    if isinstance(obj, type) and issubclass(obj, np.generic) and obj in _NUMPY_TYPES:
        return {_DTYPE_TAG: np.dtype(obj).str, "kind": "numpy type"}
    if isinstance(obj, type) and obj in _BUILTIN_TYPES.values():  # ``dtype=float``
        return {_DTYPE_TAG: obj.__name__, "kind": "builtin type"}
    if type(obj).__module__.split(".")[0] == "pandas" and hasattr(obj, "to_numpy"):
        # a DataFrame or Series given as an array-like parameter (delays, an
        # assignment): saved as its values, which is what the estimator read of it
        return encode(obj.to_numpy(), where)
    raise TypeError(
        f"cannot save {where} of type {type(obj).__name__}: only tensors, arrays, "
        "numbers, strings and containers of them can be saved safely. Use pickle for "
        "trusted files, or override _get_state/_set_state."
    )


def generator_from_state(state: Any, legacy: bool = False
                         ) -> np.random.RandomState | np.random.Generator:
    """A numpy ``Generator`` (or ``RandomState`` when ``legacy``) from a bit-generator
    state dict, for the bit generators of a fixed list only."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _NUMPY_BIT_GENERATORS:
        raise ValueError(f"unsupported numpy bit generator {name!r} in the file.")
    if legacy:
        rs = np.random.RandomState()
        rs.set_state(state)
        _check_state_kept(state, rs.get_state(legacy=False))
        return rs
    bit_gen = getattr(np.random, name)()
    bit_gen.state = state
    _check_state_kept(state, bit_gen.state)
    return np.random.Generator(bit_gen)


def _check_state_kept(given: Any, kept: Any) -> None:
    """Refuse a state numpy did not keep as given: an integer out of its range (-1,
    2**200) raised OverflowError in newer numpy and was wrapped silently in older."""
    def same(a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return bool(np.array_equal(np.asarray(a), np.asarray(b)))
        return bool(a == b)

    if not same(given, kept):
        raise ValueError("the numpy generator state holds values out of its range")


def _decode_rng(obj: dict) -> np.random.RandomState | np.random.Generator:
    return generator_from_state(decode(obj[_RNG_TAG]), bool(obj["legacy"]))


def decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        keys = set(obj)
        if keys == {_NDARRAY_TAG}:
            return obj[_NDARRAY_TAG].cpu().numpy()
        if keys == {_SCALAR_TAG}:
            return obj[_SCALAR_TAG].cpu().numpy()[()]
        if keys == {_NDARRAY_TAG, _LOW, "dtype"}:
            return _decode_wide(obj, _NDARRAY_TAG)
        if keys == {_SCALAR_TAG, _LOW, "dtype"}:
            return _decode_wide(obj, _SCALAR_TAG)[()]
        if keys == {_RNG_TAG, "legacy"}:
            return _decode_rng(obj)
        if keys == {_STRARRAY_TAG, "object", "dtype", "shape"}:
            out = np.empty(tuple(obj["shape"]), dtype=np.dtype(obj["dtype"]))
            if out.size:
                if obj["object"]:
                    out[...] = np.array(obj[_STRARRAY_TAG], dtype=object).reshape(out.shape)
                else:
                    out[...] = obj[_STRARRAY_TAG]
            return out
        if keys == {_STRARRAY_TAG, "object"}:  # files written before the dtype was kept
            return np.array(obj[_STRARRAY_TAG], dtype=object if obj["object"] else None)
        if keys == {_DTYPE_TAG, "kind"}:
            if obj["kind"] == "builtin type":
                return _BUILTIN_TYPES[obj[_DTYPE_TAG]]
            dtype = np.dtype(obj[_DTYPE_TAG])
            return dtype if obj["kind"] == "dtype" else dtype.type
        if keys == {_TUPLE_TAG}:
            return tuple(decode(v) for v in obj[_TUPLE_TAG])
        if keys == {_DICT_TAG}:
            return {k: decode(v) for k, v in obj[_DICT_TAG]}
        tags = sorted(k for k in keys if isinstance(k, str) and k.startswith("__mlpapers_"))
        if tags:  # encode stores a user dict with such keys under _DICT_TAG: damaged
            raise ValueError(f"unknown or malformed entry {tags[0]!r} with keys "
                             f"{sorted(map(str, keys))}")
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj
