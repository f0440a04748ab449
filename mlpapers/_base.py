"""The common base of every mlpapers estimator.

:class:`TorchEstimatorMixin` gives torch-backed estimators the pieces that would
otherwise be copied into each algorithm: device and generator set-up from the
``device``/``random_state`` parameters, input validation that records
``n_features_in_``, numpy output, fitted-state checks, and safe persistence.

Persistence
-----------
:meth:`TorchEstimatorMixin.save` writes ``{class, params, state}`` with
:func:`torch.save`; :meth:`TorchEstimatorMixin.load` reads it back with
``torch.load(weights_only=True)``, which refuses arbitrary pickled objects. The
state holds only tensors, numpy arrays (stored as tensors; string arrays keep
their dtype and shape), numpy scalars (which keep their type), numbers, strings,
numpy ``RandomState``/``Generator`` objects (stored as their states) and nested
lists/tuples/dicts of them (``numpy.longdouble`` values are written as two float64
tensors and load back as the same long doubles). The file also lists the names in
the state, so a damaged name is reported when loading, not at the first
``predict``. Estimators holding ``torch.nn.Module`` objects
override :meth:`_get_state` / :meth:`_set_state` to store state dicts instead.
The class named in a file is only instantiated when it is an estimator class
defined inside :mod:`mlpapers` (or the class whose ``load`` is called); nothing
else named by a file is ever called. Plain :mod:`pickle` also works for every
estimator (for trusted files).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import numbers
import os
import shutil
import uuid
import warnings
import zipfile
from typing import TYPE_CHECKING, Any, Self, cast

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import (
    _check_feature_names,
    _check_n_features,
    _check_y,
    _get_feature_names,
    check_array,
    check_is_fitted,
    check_X_y,
    validate_data,
)

from mlpapers._utils import (
    check_seed,
    check_tensor,
    check_verbose,
    make_generators,
    on_cpu_default_device,
    resolve_device,
    resolve_dtype,
    to_numpy,
    torch_compatible_array,
    wrap_public_methods,
)
from mlpapers._utils._ambient import without_inference_tensors
from mlpapers._utils._serialize import decode as _decode
from mlpapers._utils._serialize import encode as _encode
from mlpapers._utils._serialize import generator_from_state
from mlpapers._utils._typing import F
from mlpapers._utils._warnings import user_stacklevel

__all__ = ["TorchEstimatorMixin", "check_feature_names", "load", "restore_on_failure", "save"]

_FORMAT_VERSION = 1


class TorchEstimatorMixin:
    """Mixin for scikit-learn estimators computed with PyTorch.

    Expects the estimator to have ``device``, ``random_state`` and ``verbose``
    parameters (any of them may be absent; defaults are then CPU, ``None`` and
    silent).

    Notes
    -----
    Call ``_init_fit()`` at the start of ``fit``: it resolves the device and
    creates ``self._torch_gen`` / ``self._numpy_gen`` from ``random_state`` (unless the
    class sets ``_uses_random_state = False``), so
    fits are reproducible and never touch the global RNG state (``None`` draws
    one seed from numpy's global ``RandomState``, as in scikit-learn).
    """

    if TYPE_CHECKING:  # scikit-learn's, from the BaseEstimator this is mixed with
        def get_params(self, deep: bool = True) -> dict[str, Any]: ...

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a caller's torch.set_default_device never reaches an estimator's code: tensors
        # it creates without a device stay on the CPU, as it was written for
        wrap_public_methods(cls, on_cpu_default_device)

    # -- fitting helpers ---------------------------------------------------
    #: False for an estimator without randomness: its fit makes no generators, so
    #: ``random_state=None`` draws no seed from numpy's global RNG either
    _uses_random_state = True

    #: parameters :meth:`load` rebuilds the fitted model from (its architecture): set to
    #: another value after ``fit``, a saved file would hold another model, so
    #: :meth:`save` refuses (the live estimator keeps the model it fitted)
    _REBUILD_PARAMS: tuple[str, ...] = ()

    def _rebuild_param_names(self) -> tuple[str, ...]:
        """The rebuild parameters the current settings read (override to drop those
        the chosen architecture ignores)."""
        return self._REBUILD_PARAMS

    def _record_rebuild_params(self) -> None:
        self._fitted_rebuild_params = {n: getattr(self, n)
                                       for n in self._rebuild_param_names()}

    def _check_rebuild_params(self) -> None:
        fitted = getattr(self, "_fitted_rebuild_params", None)
        if fitted is None:  # pickled by a version without the record: nothing to compare
            return
        changed = [n for n, v in fitted.items() if not _same_param(getattr(self, n), v)]
        if changed:
            was = ", ".join(f"{n}={fitted[n]!r} -> {getattr(self, n)!r}" for n in changed)
            raise ValueError(
                f"cannot save: {was} set after fit; load rebuilds the fitted model from "
                "these parameters, so the file would hold another model. Set them back, "
                "or fit again.")

    def _init_fit(self) -> tuple[torch.Generator, np.random.Generator] | None:
        """Check ``verbose``, resolve the device and seed this call's generators
        (``_torch_gen``, ``_numpy_gen``); returns them too, so that a call can hold its
        own even if another thread starts a call on the same object."""
        check_verbose(getattr(self, "verbose", 0))
        self._record_rebuild_params()
        self._device = resolve_device(getattr(self, "device", "cpu"))
        if self._uses_random_state:
            gens = make_generators(getattr(self, "random_state", None), device="cpu")
            self._torch_gen, self._numpy_gen = gens
            return gens
        # unused, but a value make_generators refuses is refused here too
        check_seed(getattr(self, "random_state", None))
        return None

    @property
    def _resolved_device(self) -> torch.device:
        dev = getattr(self, "_device", None)
        return dev if dev is not None else resolve_device(getattr(self, "device", "cpu"))

    def _validate_data(
        self,
        X: Any,
        y: Any = "no_validation",
        *,
        reset: bool,
        ndim: int | tuple[int, ...] = 2,
        dtype: torch.dtype | str = torch.float32,
        min_samples: int = 1,
        allow_nan: bool = False,
        y_numeric: bool = False,
        multi_output: bool = False,
    ):
        """Validate ``X`` (and ``y``) into a tensor on the estimator's device.

        Array-likes go through scikit-learn's ``validate_data`` (so messages,
        ``n_features_in_`` and ``feature_names_in_`` behave exactly as in
        scikit-learn); torch tensors are checked by :func:`check_tensor` without
        a round trip through numpy.

        Parameters
        ----------
        X : array-like or torch.Tensor
            Input; ``ndim`` gives the allowed number of dimensions.
        y : array-like, torch.Tensor, None or "no_validation"
            Targets. ``"no_validation"`` (default) means ``X`` only; ``None``
            raises when the estimator requires ``y``.
        reset : bool
            ``True`` in ``fit`` (records ``n_features_in_``), else the feature
            count must match the fitted one.

        Returns
        -------
        X : torch.Tensor
            Validated input of ``dtype`` on the estimator's device.
        y : numpy.ndarray
            Validated targets (only when ``y`` is given).
        """
        if not reset:
            self._check_fitted()
        torch_dtype = resolve_dtype(dtype)
        allowed = {ndim} if isinstance(ndim, int) else set(ndim)
        has_y = not (isinstance(y, str) and y == "no_validation")
        if has_y and isinstance(y, torch.Tensor):
            y = to_numpy(y, "y")  # detached, on the CPU (numpy cannot read grad/CUDA tensors)
        if isinstance(X, torch.Tensor):
            # tensors have no column names: drops ``feature_names_in_`` on reset and
            # warns, as scikit-learn does for arrays, when fitted on a DataFrame
            if reset:
                _check_feature_names(self, X, reset=True)
            else:
                check_feature_names(self, X)
            Xt = check_tensor(
                X, ndim=tuple(allowed), dtype=torch_dtype, device=self._resolved_device,
                allow_nan=allow_nan, min_samples=min_samples,
                n_features=None if reset else getattr(self, "n_features_in_", None),
                owner=type(self).__name__,
            )
            self._count_features(Xt, reset)
            if not has_y:
                return Xt
            if y is None:
                raise ValueError(f"This {type(self).__name__} estimator requires y to be "
                                 "passed, but the target y is None.")
            # the same checks as scikit-learn's ``validate_data`` applies to ``y``
            # (finite values, a column vector raveled, numeric when asked)
            y_np = _check_y(y, multi_output=multi_output, y_numeric=y_numeric, estimator=self)
            if y_np.shape[:1] != (Xt.shape[0],):
                raise ValueError(f"Found input variables with inconsistent numbers of "
                                 f"samples: [{Xt.shape[0]}, {len(y_np)}]")
            return Xt, torch_compatible_array(y_np)
        np_dtype = np.float64 if torch_dtype == torch.float64 else np.float32
        kwargs = dict(
            reset=reset, dtype=np_dtype,
            allow_nd=max(allowed) > 2, ensure_2d=min(allowed) >= 2,
            ensure_min_samples=min_samples,
            ensure_all_finite="allow-nan" if allow_nan else True,
        )
        # names on one side only: warned here at the user's call, and not again from
        # inside scikit-learn (whose warning pointed at its validation module)
        one_sided = not reset and feature_names_one_sided(self, X)
        if one_sided:
            check_feature_names(self, X)
        # scikit-learn's finiteness check sums the data first: finite float32 values near
        # its maximum overflow that sum and numpy warned "invalid value encountered in
        # reduce" about valid data (the check then looks at each value and passes)
        with np.errstate(over="ignore", invalid="ignore"):
            if one_sided:
                # validate_data without its name check (warned above): a warnings filter
                # to silence it is process-wide, and calls overlapping in two threads
                # restored each other's filters, leaving an "ignore" installed for good
                checks = {k: v for k, v in kwargs.items() if k != "reset"}
                if has_y:
                    X_np, y_np = check_X_y(X, y, y_numeric=y_numeric,
                                           multi_output=multi_output, estimator=self,
                                           **checks)
                else:
                    X_np = check_array(X, estimator=self, **checks)
                if checks["ensure_2d"]:  # (the count of other inputs is checked below)
                    self._count_features(X_np, reset=False)
            elif has_y:
                X_np, y_np = validate_data(self, X, y, y_numeric=y_numeric,
                                           multi_output=multi_output, **kwargs)
            else:
                X_np = validate_data(self, X, **kwargs)
        if not kwargs["ensure_2d"]:
            # scikit-learn skips the feature count when ``ensure_2d=False``; keep it
            # for 2-D input so that ``ndim=(1, 2)`` estimators still check it
            self._count_features(X_np, reset)
        if X_np.ndim not in allowed:
            want = " or ".join(f"{d}D" for d in sorted(allowed))
            raise ValueError(f"Expected {want} array for X, got {X_np.ndim}D array instead.")
        # read-only memmaps, big-endian files: torch reads neither
        Xt = torch.from_numpy(torch_compatible_array(X_np)).to(
            device=self._resolved_device, dtype=torch_dtype)
        return (Xt, torch_compatible_array(y_np)) if has_y else Xt

    def _count_features(self, X: Any, reset: bool) -> None:
        """Record (``reset``) or check ``n_features_in_`` as scikit-learn does; 1-D
        input records no count, and a refit on it drops the count of an earlier fit."""
        if reset and X.ndim < 2 and hasattr(self, "n_features_in_"):
            del self.n_features_in_
        _check_n_features(self, X, reset=reset)

    @staticmethod
    def _to_numpy(t: Any) -> np.ndarray:
        return to_numpy(t)

    def _check_fitted(self) -> None:
        check_is_fitted(self)

    def __sklearn_is_fitted__(self) -> bool:
        return any(
            k.endswith("_") and not k.startswith("__") for k in vars(self)
        )

    # -- persistence -------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # scikit-learn returns the live ``__dict__`` for classes outside sklearn
        # (Python >= 3.11), so subclasses that pop private keys from
        # ``super().__getstate__()`` would strip the estimator being pickled.
        return dict(cast(dict[str, Any], super().__getstate__()))

    def __setstate__(self, state: dict[str, Any]) -> None:
        if torch.is_inference_mode_enabled():  # unpickled inside the caller's block
            state = without_inference_tensors(dict(state))
        parent = getattr(super(), "__setstate__", None)  # scikit-learn's
        if parent is not None:
            parent(state)
        else:
            self.__dict__.update(state)
        self._upgrade_params()
        fitted_on = self.__dict__.get("_device")
        if (isinstance(fitted_on, torch.device) and fitted_on.type == "cuda"
                and fitted_on.index is None and _device_available(fitted_on)):
            self._device = resolve_device(fitted_on)  # (pickled before devices were pinned)
        elif fitted_on is not None and not _device_available(fitted_on):
            # pickled on a GPU, unpickled without one (state held in numpy or on the
            # CPU; tensors on a missing device already failed in torch's unpickler)
            if not _device_available(getattr(self, "device", None)):
                # ("auto" stays: it means the CPU here; through __dict__ because the
                # subclasses declare the parameter's type, not this base class)
                self.__dict__["device"] = "cpu"
            try:
                self._device = resolve_device(getattr(self, "device", "cpu"))
            except ValueError:  # a value set after fit that names no device
                self._device = torch.device("cpu")
            warnings.warn(f"{type(self).__name__} was fitted on device={str(fitted_on)!r}, "
                          f"which this machine does not have; it computes on "
                          f"{str(self._device)!r} here. Use set_params(device=...) and fit "
                          f"again to change where it computes.", UserWarning,
                          stacklevel=user_stacklevel())

    def _upgrade_params(self) -> None:
        """Parameters as an older version left them, in a pickle or a saved file.

        A pickle made before a constructor parameter existed lacks it (get_params, repr
        and clone then raised AttributeError): it gets the parameter's default, which is
        the behaviour of the version that made the pickle. Versions that did not check
        the switches (the ``True``/``False`` parameters) took 0 or 1 and read them as
        truth values: they load with the bool they meant, instead of failing where the
        switch is checked.
        """
        for name, param in inspect.signature(type(self).__init__).parameters.items():
            if param.default is not param.empty and name not in self.__dict__:
                setattr(self, name, param.default)
            value = getattr(self, name, None)
            if (isinstance(param.default, bool) and isinstance(value, numbers.Integral)
                    and not isinstance(value, (bool, np.bool_))):
                setattr(self, name, bool(value))

    def _get_state(self) -> dict[str, Any]:
        """Fitted state to persist: every public attribute ending in ``_``."""
        return {
            k: v for k, v in vars(self).items()
            if k.endswith("_") and not k.startswith("_")
        }

    # private attributes a subclass's ``_get_state`` adds to the public fitted state
    _PRIVATE_STATE: tuple[str, ...] = ()

    def _set_state(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            # the names come from the file: only fitted attributes (``name_``) or the
            # declared private ones, never a method, property or other class attribute
            ok = isinstance(k, str) and k.isidentifier() and not _is_class_member(
                type(self), k) and (k in self._PRIVATE_STATE
                                    or (k.endswith("_") and not k.startswith("_")))
            if not ok:
                raise ValueError(f"the file's state holds {k!r}, which is not a fitted "
                                 f"attribute of {type(self).__name__}.")
            setattr(self, k, v)

    def save(self, path: str | os.PathLike) -> None:
        """Save the parameters and fitted state to ``path`` (a ``torch.save`` file).

        The file contains only tensors, numbers, strings and containers, so
        :meth:`load` can read it with ``torch.load(weights_only=True)``.

        Parameters
        ----------
        path : str or path-like
            Destination file (overwritten if it exists; its directory must exist). The
            file is written to a temporary file in the same folder and moved into place
            once complete, so a save that fails leaves an existing file unchanged.
        """
        save(self, path)

    def _save_storing(self, path: str | os.PathLike, name: str, stored: Any) -> None:
        """:meth:`save` with the parameter ``name`` written as ``stored`` (a marker, or a
        callable's settings: a safe file holds no code), then set back as it was, also
        when writing fails."""
        value = getattr(self, name)
        setattr(self, name, stored)
        try:
            TorchEstimatorMixin.save(self, path)
        finally:
            setattr(self, name, value)

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: Any = "cpu") -> Self:
        """Load an estimator written by :meth:`save`, safely (``weights_only=True``).

        Parameters
        ----------
        path : str or path-like
            File written by :meth:`save`.
        map_location : str or torch.device, default="cpu"
            Where tensors are loaded. When the file's ``device`` parameter names a
            device this machine does not have (a model fitted on a GPU, loaded on a
            machine without one), the estimator's ``device`` becomes this one (the
            CPU if it is not a device name or not available either), with a
            warning. ``"meta"`` is refused: meta tensors hold no values.

        Returns
        -------
        estimator
            A fitted instance of this class.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            If the file is not one that :meth:`save` wrote (empty, truncated, damaged,
            another kind of file), or holds another version's format.
        TypeError
            If the file holds an estimator of another class.
        """
        est = load(path, map_location=map_location, trusted=cls)
        if not isinstance(est, cls):
            raise TypeError(f"{_file_path(path)!r} holds a saved {type(est).__name__}, not "
                            f"{cls.__name__}; load it with {type(est).__name__}.load.")
        return est

    # -- scikit-learn integration -------------------------------------------
    @classmethod
    def _estimator_check_instances(cls) -> list:
        """Instances run through scikit-learn's ``parametrize_with_checks``.

        Return ``[]`` for estimators outside the standard ``fit(X, y)`` contract
        (samplers, losses); override to pass non-default parameters (small
        epoch counts) that keep the checks fast.
        """
        return [cls()]

    def _expected_failed_checks(self) -> dict[str, str]:
        """Checks that genuinely do not apply, mapped to the reason."""
        return {}


def check_feature_names(estimator: BaseEstimator, X: Any, name: str = "X") -> None:
    """scikit-learn's check of ``X``'s column names against ``feature_names_in_`` after
    fit (a warning for names on one side only, a ``ValueError`` for other names or
    order), with the messages naming the argument ``name`` rather than ``X`` (the
    ``queries`` of a fit, the ``clients[i]`` of a federation). The warnings point at the
    user's call (scikit-learn's pointed inside its validation module)."""
    if feature_names_one_sided(estimator, X):
        warn_feature_names_one_sided(estimator, name)
        return
    fitted = getattr(estimator, "feature_names_in_", None)
    given = _get_feature_names(X)
    if given is None or fitted is None:  # (neither has names)
        return
    if name == "X":
        _check_feature_names(estimator, X, reset=False)  # its error, listing the names
    elif not np.array_equal(given, fitted):
        raise ValueError(f"the feature names of {name} should match those passed during "
                         f"fit, in the same order: got {list(given)}, fitted on "
                         f"{list(fitted)}.")


def feature_names_one_sided(estimator: BaseEstimator, X: Any) -> bool:
    """Whether exactly one of ``X`` and the fit had column names (scikit-learn warns)."""
    return (_get_feature_names(X) is None) != (
        getattr(estimator, "feature_names_in_", None) is None)


def warn_feature_names_one_sided(estimator: BaseEstimator, name: str,
                                 others: str = "") -> None:
    """scikit-learn's warning for column names on one side only, naming the argument
    ``name``, at the user's call; ``others`` names further arguments in the same case
    (``"3 other clients"``), so that one warning covers them all."""
    if getattr(estimator, "feature_names_in_", None) is None:
        what, also, fitted = "has feature names", "as do", "without"
    else:
        what, also, fitted = "does not have valid feature names", "nor do", "with"
    if others:
        what += f", {also} {others}"
    warnings.warn(f"{name} {what}, but {type(estimator).__name__} was fitted {fitted} "
                  "feature names", UserWarning, stacklevel=user_stacklevel())


def restore_on_failure(fit: F) -> F:
    """Decorate a ``fit`` so that, if it raises part-way (bad input, a user's callable
    failing, ``Ctrl-C``), the estimator is put back exactly as it was before the call:
    a fitted one keeps its previous model, diagnostics and data units, an unfitted one
    stays unfitted. (A fit interrupted after some epochs left the previous model with
    the new run's ``loss_curve_``, or a partly trained encoder.)

    A fit rebinds its fitted attributes to new objects rather than changing the previous
    ones in place, so a shallow copy of the instance's ``__dict__`` is the whole state to
    restore; it holds references only, so the previous model's memory is not copied.
    """
    @functools.wraps(fit)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        before = dict(vars(self))
        try:
            return fit(self, *args, **kwargs)
        except BaseException:
            vars(self).clear()
            vars(self).update(before)
            raise
    return cast(F, wrapper)


def _same_param(a: Any, b: Any) -> bool:
    """Whether two values of a parameter are the same setting: the same object, or
    equal with lists and tuples alike (``[64]`` and ``(64,)``)."""
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_param(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. arrays: no single truth value
        return False


def _is_class_member(cls: type, name: str) -> bool:
    """Whether ``name`` is a method, property or other callable of ``cls`` (which a
    file's state must not shadow); plain class-level data defaults are not."""
    static = inspect.getattr_static(cls, name, None)
    return callable(static) or isinstance(static, (property, classmethod, staticmethod))


def _rng_state(estimator: BaseEstimator) -> dict[str, Any]:
    """The current states of the fit's generators, so that a loaded estimator's
    ``partial_fit`` continues the same random stream as the saved one."""
    out: dict[str, Any] = {}
    gen = getattr(estimator, "_torch_gen", None)
    if isinstance(gen, torch.Generator) and gen.device.type == "cpu":
        out["torch"] = gen.get_state()
    np_gen = getattr(estimator, "_numpy_gen", None)
    if isinstance(np_gen, np.random.Generator):
        out["numpy"] = np_gen  # encoded as its bit generator's state
    return out


def _restore_rng(estimator: BaseEstimator, rng: Any) -> None:
    try:
        rng = _decode(rng)
        if not isinstance(rng, dict):
            raise TypeError("not a dict")
        if "torch" in rng:
            gen = torch.Generator()
            gen.set_state(rng["torch"].cpu())
            estimator._torch_gen = gen
        if "numpy" in rng:
            np_gen = rng["numpy"]
            if isinstance(np_gen, dict):  # files that stored the PCG64 state dict itself
                np_gen = generator_from_state(np_gen)
            if not isinstance(np_gen, np.random.Generator):
                raise TypeError(f"numpy stream of type {type(np_gen).__name__}")
            estimator._numpy_gen = np_gen
    except (AttributeError, KeyError, TypeError, RuntimeError, ValueError,
            OverflowError) as exc:  # (numpy's state setter: a damaged integer)
        raise ValueError(f"the saved generator states are malformed: {exc}") from exc


def save(estimator: BaseEstimator, path: str | os.PathLike) -> None:
    """Save a fitted mlpapers estimator to ``path``; see :meth:`TorchEstimatorMixin.save`."""
    if not isinstance(estimator, TorchEstimatorMixin):
        raise TypeError(f"save expects an mlpapers estimator, got {type(estimator).__name__}.")
    if not callable(getattr(estimator, "fit", None)):  # samplers: nothing fitted to save
        raise TypeError(f"{type(estimator).__name__} has no fit method, and save stores "
                        "fitted estimators only: keep the results it returns (e.g. pickle "
                        "them), or pickle the object itself (with what it adapted, such "
                        "as a sampler's step size).")
    try:
        check_is_fitted(estimator)
    except NotFittedError as exc:
        raise NotFittedError(f"cannot save an unfitted {type(estimator).__name__}.") from exc
    estimator._check_rebuild_params()
    cls = type(estimator)
    state = estimator._get_state()
    names = list(state)
    payload = {
        "format": _FORMAT_VERSION,
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "params": _encode(estimator.get_params(deep=False), "a parameter"),
        "state": _encode(state, "the fitted state"),
        "rng": _encode(_rng_state(estimator), "the generator states"),
    }
    if all(isinstance(k, str) and "\n" not in k for k in names):
        # the state's names, checked by load (a damaged name would otherwise load and
        # fail at the first predict with an AttributeError); one string, so that the
        # pickle does not share the key strings with the state (a flipped byte in one
        # would change both)
        payload["names"] = "\n".join(names)
    where = _file_path(path)
    if os.path.isdir(where):
        raise IsADirectoryError(errno.EISDIR, "save needs a file path, not a directory", where)
    directory = os.path.dirname(os.path.abspath(where))
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, "the directory to save into does not exist",
                                directory)
    _write_atomically(payload, where)


def _write_atomically(payload: dict, where: str) -> None:
    """``torch.save(payload, where)`` through a temporary file in the same folder, moved
    over ``where`` only once complete: a write that fails (disk full, file size limit,
    an interrupt) leaves an existing file as it was and no partial file (writing in
    place truncated the previous model to an unloadable fragment)."""
    target = os.path.realpath(where)  # through a symbolic link, as writing in place did
    tmp = os.path.join(os.path.dirname(target),
                       f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    try:
        # created like any new file (the umask applies), never over an existing one
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            try:
                torch.save(payload, f)
            except RuntimeError as exc:  # torch's writer reports a failed write so
                raise OSError(errno.EIO, f"the file could not be written (is the disk "
                              f"full, or the file size limited?): {exc}", where) from exc
        if os.path.exists(target):
            shutil.copymode(target, tmp)  # the replaced file's permissions
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _is_zip(path: str) -> bool:
    """Whether the file at ``path`` is a zip archive; an error opening it (permissions)
    propagates (``zipfile.is_zipfile(path)`` reported it as "not a zip")."""
    with open(path, "rb") as f:
        return zipfile.is_zipfile(f)


def _file_path(path: Any) -> str:
    """``path`` as a ``str`` (``bytes`` and path-likes decoded as ``open`` does:
    ``torch.save``/``torch.load`` take neither bytes nor their paths)."""
    try:
        return os.fsdecode(path)
    except TypeError:
        raise TypeError(f"path must be a str or path-like, got {type(path).__name__}.") from None


def load(
    path: str | os.PathLike, map_location: Any = "cpu", *, trusted: type | None = None
) -> BaseEstimator:
    """Load an estimator saved by :func:`save`, with ``torch.load(weights_only=True)``.

    Only estimator classes (subclasses of :class:`TorchEstimatorMixin`) defined
    inside :mod:`mlpapers`, or the class ``trusted`` itself (what
    ``SomeEstimator.load(path)`` passes, so user subclasses load too), are
    reconstructed; no other module is ever imported and nothing but that class is
    ever called.
    """
    # normal tensors even when called inside inference_mode: an estimator loaded there
    # would otherwise hold tensors that can never be differentiated (fine-tuned) later
    with torch.inference_mode(False):
        return _load(path, map_location, trusted)


def _check_map_location(map_location: Any) -> Any:
    """``map_location`` as ``torch.load`` takes it: a device name is checked (and
    ``"auto"`` resolved) first, so that a device this machine lacks, or ``"meta"``
    (whose tensors hold no values), is not reported as a damaged file."""
    if not isinstance(map_location, str | torch.device):
        return map_location  # a dict or a callable: torch.load applies it
    try:
        return resolve_device(map_location)
    except ValueError as exc:
        raise ValueError(f"map_location={str(map_location)!r} cannot be used: {exc}") from exc


def _holds_meta_tensors(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.is_meta
    if isinstance(obj, dict):
        return any(_holds_meta_tensors(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_holds_meta_tensors(v) for v in obj)
    return False


def _load(path: str | os.PathLike, map_location: Any, trusted: type | None) -> BaseEstimator:
    where = _file_path(path)
    location = _check_map_location(map_location)
    if os.path.isfile(where) and not _is_zip(where):
        # save writes torch's zip format; torch.load would first warn about a plain
        # pickle (e.g. pickle.dump of an estimator) and then refuse it
        raise ValueError(f"{where!r} is not a valid mlpapers estimator file: it is not the "
                         "zip archive that save writes (it is empty, damaged, or another "
                         "kind of file; an estimator written with pickle.dump is read back "
                         "with pickle.load).")
    try:
        payload = torch.load(where, map_location=location, weights_only=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise  # the path, not the file's contents
    except Exception as exc:  # torch raises many kinds on a damaged file
        hint = ("" if isinstance(map_location, str | torch.device) else
                f", or map_location={map_location!r} cannot be applied to it")
        raise ValueError(
            f"{where!r} is not a valid mlpapers estimator file: torch.load could not read "
            f"it ({type(exc).__name__}); it is empty, truncated, damaged or not written "
            f"by save{hint}."
        ) from exc
    if _holds_meta_tensors(payload):  # a dict or callable map_location sent them there
        raise ValueError(f"map_location={map_location!r} put tensors on the 'meta' device, "
                         "which cannot hold the fitted state: meta tensors have no values.")
    if (not isinstance(payload, dict) or payload.get("format") != _FORMAT_VERSION
            or not isinstance(payload.get("class"), str)):
        raise ValueError(f"{where!r} is not an mlpapers estimator file.")
    name = payload["class"]
    if trusted is not None and name == f"{trusted.__module__}:{trusted.__qualname__}":
        cls = trusted
    else:
        cls = _estimator_class(name)
    try:  # a malformed file fails in the decoder, the constructor or _set_state
        params, state = _decode(payload["params"]), _decode(payload["state"])
        if not isinstance(params, dict) or not isinstance(state, dict):
            raise TypeError("params and state must be dicts")
        _use_an_available_device(params, map_location, cls.__name__)
        est = cls(**params)
        est._upgrade_params()
        est._set_state(state)
        if "names" in payload:  # (files written before the names were kept have none)
            _check_state_names(est, state, payload["names"])
        est._record_rebuild_params()  # the model was just rebuilt from these values
        _restore_rng(est, payload.get("rng", {}))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError,
            OverflowError) as exc:
        raise ValueError(f"{where!r} is not a valid mlpapers estimator file: "
                         f"{exc}") from exc
    return est


def _check_state_names(est: BaseEstimator, state: dict, names: Any) -> None:
    """The loaded state against the names :func:`save` listed beside it: a name not
    listed is a damaged one; a listed name missing from the state is refused unless the
    class's ``_set_state`` supplied it (as it does for files of older versions)."""
    if not isinstance(names, str):
        raise TypeError("the list of the fitted state's names is malformed")
    names = names.split("\n") if names else []
    listed = set(names)
    unknown = [k for k in state if k not in listed]
    missing = [n for n in names
               if n not in state and n not in vars(est) and not hasattr(type(est), n)]
    if unknown or missing:
        found = [f"holds {unknown} that it does not list"] if unknown else []
        found += [f"lacks {missing} that it lists"] if missing else []
        raise ValueError(f"the fitted state of {type(est).__name__} is damaged: it "
                         f"{' and '.join(found)}.")


def _device_available(device: Any) -> bool:
    """Whether ``device`` names a device this machine has (``None``, ``"auto"`` and
    values that name no device count as available: they are not ours to replace)."""
    if device is None or (isinstance(device, str) and device == "auto"):
        return True
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        return True
    try:
        resolve_device(device)
    except ValueError:
        return False
    return True


def _use_an_available_device(params: dict, map_location: Any, name: str) -> None:
    """Replace a saved ``device`` that this machine lacks (a model fitted on a GPU,
    loaded on a machine without one) by ``map_location``'s device, else the CPU, with
    a warning: its tensors are loaded there, and some estimators move their models to
    their device while loading. A value that names no device is left to the
    constructor and ``fit`` to report."""
    saved = params.get("device")
    if _device_available(saved):
        return
    target = "cpu"
    if isinstance(map_location, str | torch.device):
        try:
            target = str(resolve_device(map_location))
        except ValueError:
            pass
    warnings.warn(f"{name} was saved with device={str(saved)!r}, which this machine does "
                  f"not have; it is loaded with device={target!r} (map_location decides). "
                  f"Use set_params(device=...) to change it.", UserWarning,
                  stacklevel=user_stacklevel())
    params["device"] = target


def _estimator_class(name: str) -> type:
    """The mlpapers estimator class named ``"module:qualname"`` in a file.

    The name comes from the file, so it is resolved without calling anything: the
    module must be inside :mod:`mlpapers` (``__main__`` excluded: importing it runs
    the command line), and the object found must be an estimator class defined in
    mlpapers (not, e.g., ``os.system`` reached through ``mlpapers._base:os``).
    """
    import importlib

    module_name, _, qualname = name.partition(":")
    parts = module_name.split(".")
    if parts[0] != "mlpapers" or any(p.startswith("__") for p in parts):
        raise ValueError(f"refusing to load class {name!r} from outside mlpapers.")
    if not qualname or any(p.startswith("__") for p in qualname.split(".")):
        raise ValueError(f"refusing to load {name!r}: not an mlpapers estimator class.")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {name!r}: {exc}") from exc
    # (a module may alias a class that moved, so the class's own module may differ)
    if not (isinstance(obj, type) and issubclass(obj, TorchEstimatorMixin)
            and obj.__module__.split(".")[0] == "mlpapers"):
        raise ValueError(f"refusing to load {name!r}: not an mlpapers estimator class.")
    return obj
