"""The shared shell of the patch-based detectors (image validation: ``_images``)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import numbers
import os
import warnings
from collections.abc import Callable
from typing import Any, Literal, Self, TypeAlias, cast, get_args, overload

import numpy as np
import torch
from scipy.special import erf
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.metrics import roc_auc_score

from mlpapers._base import TorchEstimatorMixin
from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    check_bool,
    check_in_options,
    check_positive,
    check_verbose,
    resolve_dtype,
    to_numpy,
    user_stacklevel,
)
from mlpapers._utils._blocks import collect_row_blocks, row_blocks
from mlpapers._utils._modules import module_behind
from mlpapers.anomaly.rad._extractors import (
    _BUILTIN,
    _as_module_input,
    check_extractor_output,
    eval_mode,
    refuse_batch_statistics,
    resolve_extractor,
)
from mlpapers.anomaly.rad._images import (  # noqa: F401 (check_images re-exported)
    ImageInput,
    _resize,
    _unit_rgb,
    check_images,
    validate_image_source,
)
from mlpapers.anomaly.rad._maps import resize_maps

_MEMORY_DTYPES = ("float32", "float16", "bfloat16")
# words of torch's errors for inputs too small for a network (convolution kernels, pools)
_SIZE_ERRORS = ("kernel size", "too small", "output size", "input size", "pad should be")
# the ``extractor`` parameter stored by ``save`` in place of a custom extractor module
_CUSTOM_EXTRACTOR = "<custom extractor: pass it to load>"
#: ``predict_proba(method=...)`` of the detectors; ``PROBA_METHODS`` lists its values.
ProbaMethod: TypeAlias = Literal["linear", "unify"]
PROBA_METHODS: tuple[str, ...] = get_args(ProbaMethod)


def _needs_move(module: torch.nn.Module, device: torch.device) -> bool:
    """Whether a parameter or buffer of ``module`` is off ``device`` (``"cuda"`` without
    an index is the current device, where the images go)."""
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    if device.index is None and hasattr(backend, "current_device"):  # (mps has none)
        device = torch.device(device.type, backend.current_device())
    for t in itertools.chain(module.parameters(), module.buffers()):
        if t.device.type != device.type or (
                device.index is not None and t.device.index != device.index):
            return True
    return False


def _copy_to_device(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A deep copy of ``module`` with its parameters and buffers made directly on
    ``device`` (a deep copy then ``.to`` would first duplicate a large backbone where it
    is, e.g. on a full GPU); tied parameters stay tied, ``requires_grad`` is kept."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(p.detach().to(device, copy=True),
                                         requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = b.detach().to(device, copy=True)
    try:
        return copy.deepcopy(module, memo)
    except Exception as exc:  # e.g. a module holding a lock or an open file
        raise TypeError(f"the extractor's weights are not on device={str(device)!r} and "
                        f"its copy for that device failed ({type(exc).__name__}: {exc}); "
                        "set device to where the weights are, or move the module there "
                        "yourself.") from exc


def _shares_memory(x: torch.Tensor, images) -> bool:
    """Whether ``x`` may be a view of the tensor ``images`` (same storage)."""
    return (isinstance(images, torch.Tensor) and x.device == images.device
            and x.untyped_storage().data_ptr() == images.untyped_storage().data_ptr())


def check_fraction(value, name: str, high: float, *, zero_allowed: bool) -> None:
    """Refuse ``value`` unless it is a real number in ``[0, high]`` (``(0, high]`` without
    ``zero_allowed``). A bool is refused, not read as 0 or 1 (``coreset_ratio=True`` meant
    as "use a coreset" kept the whole memory; ``top_ratio=True`` averaged every pixel)."""
    real = cast(float, value)  # compared only once known to be a numbers.Real
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            (0.0 <= real if zero_allowed else 0.0 < real) and real <= high):
        raise ValueError(f"{name} must be in {'[' if zero_allowed else '('}0, {high:g}], "
                         f"got {value!r}.")


def check_image_size(image_size, name: str = "image_size") -> tuple[int, int] | None:
    """``(height, width)`` of a size parameter (an int or a pair), or None."""
    if image_size is None:
        return None
    if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool):
        check_positive(image_size, name, integer=True)
        return int(image_size), int(image_size)
    if isinstance(image_size, (tuple, list)) and len(image_size) == 2:
        for s in image_size:
            check_positive(s, name, integer=True)
        return int(image_size[0]), int(image_size[1])
    raise ValueError(f"{name} must be None, an int or a pair (height, width), "
                     f"got {image_size!r}.")


class BaseImageDetector(TorchEstimatorMixin, OutlierMixin, BaseEstimator):
    """Shared shell: input handling, extraction in batches, PyOD-style thresholds.

    Subclasses implement ``_check_params()``, ``_fit_memory(feats, keys)`` (stores
    the memory, returns the leave-one-out training scores) and
    ``_score_features(feats, keys, exclude, return_maps=True)`` returning ``(maps (B,
    H', W') or None without return_maps, scores (B,))`` at the network input resolution,
    or override :meth:`_score_extracted` (as :class:`RADDetector` does). Every call of
    ``_extract`` and of the scoring has at least one image: the input validation
    (``_validate_images``, shared with :func:`check_images`) refuses an empty set.
    """

    def __sklearn_tags__(self):
        # images (n, H, W) or (n, C, H, W), or lists of them; a 2-D table is refused
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        return tags

    # -- parameter checks ---------------------------------------------------
    def _check_common_params(self) -> None:
        # also at scoring (set_params after fit): verbose=-1 or "yes" showed the bars
        check_verbose(self.verbose)
        check_image_size(self.image_size)
        check_positive(self.smoothing_sigma, "smoothing_sigma", strict=False)
        check_fraction(self.contamination, "contamination", 0.5, zero_allowed=False)
        check_in_options(self.memory_dtype, "memory_dtype", _MEMORY_DTYPES)
        check_positive(self.batch_size, "batch_size", integer=True)
        check_positive(self.chunk_size, "chunk_size", integer=True)
        if isinstance(self.extractor, str) and self.extractor == _CUSTOM_EXTRACTOR:
            # loaded by the generic loader, which cannot restore the module
            raise ValueError(f"this {type(self).__name__} was saved with a custom extractor, "
                             "which the file does not hold; load it with "
                             f"{type(self).__name__}.load(path, extractor=my_extractor).")
        if isinstance(self.extractor, str):
            check_in_options(self.extractor, "extractor", _BUILTIN)

    def _get_extractor(self):
        ext = getattr(self, "_extractor", None)
        if ext is not None and getattr(self, "_extractor_param", None) is not self.extractor:
            # set_params(extractor=...) after fit: score with the extractor the parameter
            # names, as a pickled or saved-and-loaded copy does (which rebuild it from the
            # parameter), not with the cached one; another feature shape then raises
            # (feature_shapes_), as documented
            ext = None
        if ext is None:
            ext = resolve_extractor(self.extractor)
            user_object = not (self.extractor is None or isinstance(self.extractor, str))
            if not user_object and isinstance(ext, torch.nn.Module):
                # the library's own backbone (always a module), built on the CPU
                ext = ext.to(self._resolved_device)
            elif isinstance(ext, torch.nn.Module) and _needs_move(ext, self._resolved_device):
                # a copy on the device: Module.to moves in place, and the user's module
                # stays where they put it (not .eval() for good either: it keeps its
                # training flags, each extraction runs it in eval mode, see _extract)
                where = sorted({str(t.device) for t in itertools.chain(ext.parameters(),
                                                                       ext.buffers())})
                warnings.warn(f"the extractor's weights are on {', '.join(where)} but "
                              f"device={str(self._resolved_device)!r}: extraction runs on a "
                              "copy of the extractor on that device (your module is not "
                              "moved); set device to where the weights are to run it there.",
                              UserWarning, stacklevel=user_stacklevel())
                ext = _copy_to_device(ext, self._resolved_device)
            self._extractor = ext
            self._extractor_param = self.extractor  # what the cache was built from
        return ext

    # -- feature extraction -------------------------------------------------
    def _network_size(self, images: torch.Tensor) -> tuple[int, int]:
        hw = check_image_size(self.image_size)
        return (images.shape[-2], images.shape[-1]) if hw is None else hw

    def _images(self, X) -> tuple[torch.Tensor, list[tuple[int, int]] | None]:
        """Validated images in their pixel dtype (image files: an :class:`ImageFiles`
        decoded batch by batch) and, for a list of images of different sizes (resized
        to ``image_size``), their original sizes."""
        return validate_image_source(X, "X", check_image_size(self.image_size))

    def _extract(self, images: torch.Tensor, desc: str, store=None, expect=None,
                 rows: slice | None = None, verbose=None
                 ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Run the extractor in batches: per-layer maps (n, C_l, h_l, w_l), keys (n, D).

        ``images`` are validated (:func:`_validate_images`) but not converted: each
        batch is made float, RGB and resized on its own, so that the memory of the
        pipeline is that of the input plus one batch (not a float copy of the input
        at its full resolution). ``store``, if given, converts each batch's list of
        float32 maps into the per-layer tensors that are kept (e.g. normalised
        patches in the memory dtype), so that only one batch exists in float32. The
        kept tensors are written into buffers allocated once for all images (no
        list of batches next to their concatenation). ``expect``, if given, is the
        list of ``(C, h, w)`` feature map shapes the extractor must return (those of
        the fit, ``feature_shapes_``). ``rows``, if given, extracts ``images[rows]``
        only (a contiguous slice; scoring extracts the images group by group);
        ``verbose`` overrides the estimator's for this call's progress bar. The
        shapes seen are left in ``self._extracted_shapes``.
        """
        ext = self._get_extractor()
        size = self._network_size(images)
        dev = self._resolved_device
        first = 0 if rows is None else int(rows.start or 0)
        n = len(images) - first if rows is None else min(int(rows.stop), len(images)) - first
        bs = self.batch_size
        n_batches = -(-n // bs)
        out: list[torch.Tensor] = []
        raw_shapes = None
        # keys go into a buffer allocated once, like the features: a list of small key
        # batches kept between the extractor's large transient activations pins the heap
        # (mlpapers._utils._blocks), and the resident memory grows by batches
        keys: torch.Tensor | None = None
        log = ProgressLogger(n_batches, desc=desc,
                             verbose=self.verbose if verbose is None else verbose)
        # the module behind the extractor (itself, or the owner of a bound method such
        # as my_net.features) runs in eval mode and gets images in its dtype
        module = module_behind(ext)
        frozen = eval_mode(module) if module is not None else contextlib.nullcontext()
        checked = (refuse_batch_statistics(module) if module is not None
                   else contextlib.nullcontext())
        with torch.inference_mode(), frozen, checked:
            for i in log:
                x = _resize(_unit_rgb(images[first + i * bs:first + min((i + 1) * bs, n)]
                                      .to(dev)), size)
                if module is not None:  # a float64 or half backbone
                    x = _as_module_input(x, module)
                if _shares_memory(x, images):
                    # float images at the network size reach the extractor as a view of
                    # the caller's X: one that works in place would change their data
                    x = x.clone()
                try:
                    out_i = ext(x)
                except RuntimeError as exc:
                    if isinstance(exc, torch.OutOfMemoryError):
                        raise
                    # the image-size hint only for errors about sizes: a dtype, device or
                    # channel mismatch inside a user's extractor is not fixed by image_size
                    text = str(exc).lower()
                    hint = (f"images of {tuple(size)} pixels may be too small for this "
                            "backbone; set image_size, e.g. 224"
                            if any(w in text for w in _SIZE_ERRORS) else
                            f"the extractor is given {x.dtype} images in [0, 1] on {x.device}")
                    raise ValueError(f"the extractor failed on a batch of shape "
                                     f"{tuple(x.shape)}: {exc} ({hint})") from exc
                f, k = check_extractor_output(out_i, len(x), i)
                del out_i
                shapes = [tuple(int(v) for v in t.shape[1:]) for t in f]
                if raw_shapes is not None and shapes != raw_shapes:
                    raise ValueError("the extractor returned feature maps of different shapes "
                                     "for different batches of same-size images.")
                if raw_shapes is None and expect is not None and shapes != list(expect):
                    raise ValueError(
                        f"the extractor returned feature maps of shapes (C, h, w) "
                        f"{shapes}, but the memory was "
                        f"built from maps of shapes {list(expect)}; score with the extractor "
                        "the detector was fitted with.")
                raw_shapes = shapes
                kept = f if store is None else store(f)
                if not out:  # normal (not inference) tensors, as the fitted memory
                    with torch.inference_mode(False):
                        out = [torch.empty((n, *t.shape[1:]), dtype=t.dtype, device=t.device)
                               for t in kept]
                for buf, t in zip(out, kept):
                    buf[i * bs:i * bs + len(x)] = t
                del f, kept
                k = k.float().reshape(len(x), -1)
                if keys is not None and k.shape[1] != keys.shape[1]:
                    raise ValueError(f"the extractor returned keys of dimension {k.shape[1]} "
                                     f"in batch {i} but {keys.shape[1]} before, for "
                                     "same-size images; the key dimension must be fixed.")
                if keys is None:
                    with torch.inference_mode(False):
                        keys = torch.empty((n, k.shape[1]), dtype=k.dtype, device=k.device)
                keys[i * bs:i * bs + len(x)] = k
                log.log(batch=i)
        # (set by the first batch: there is at least one image, validated)
        assert keys is not None and raw_shapes is not None
        self._extracted_shapes = raw_shapes
        return out, keys

    def _fit_store(self):
        """Per-batch conversion of the fit's features (see :meth:`_extract`); ``None``
        keeps the float32 maps."""
        return None

    # -- public API -----------------------------------------------------------
    def fit(self, X: ImageInput, y: object = None) -> Self:
        """Build the memory from normal images.

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Normal images, (n, H, W), (n, H, W, C) or (n, C, H, W); uint8 or float
            in [0, 1].
        y : ignored
            Present for API consistency (anomaly labels are not used).

        Returns
        -------
        self : object
            The fitted detector.
        """
        # the fitted tensors must be normal tensors even when the caller fits inside
        # torch.inference_mode() (inference tensors cannot be updated in place or enter
        # autograd later); the extraction itself runs in inference mode (_extract)
        with torch.inference_mode(False):
            return self._fit(X)

    def _fit(self, X):
        self._init_fit()
        self._check_params()
        images, _ = self._images(X)
        self._forget_fit()
        try:
            feats, keys = self._extract(images, desc=f"{type(self).__name__} fit",
                                        store=self._fit_store())
            self.n_features_in_ = int(3 * images.shape[-2] * images.shape[-1])  # RGB C*H*W
            self.n_train_ = len(images)
            self.feature_shapes_ = list(self._extracted_shapes)
            self.input_size_ = tuple(int(s) for s in self._network_size(images))
            self.decision_scores_ = self._to_numpy(self._fit_memory(feats, keys))
            self.threshold_ = float(np.percentile(self.decision_scores_,
                                                  100.0 * (1.0 - self.contamination)))
            self.labels_ = (self.decision_scores_ > self.threshold_).astype(np.int64)
        except BaseException:
            # a failed refit must not leave the previous memory next to new attributes
            self._forget_fit()
            raise
        return self

    def _forget_fit(self) -> None:
        """Drop the fitted attributes and the cached extractor (unfitted state)."""
        for attr in [k for k in vars(self) if (k.endswith("_") and not k.startswith("__"))
                     or k in ("_extractor", "_extractor_param", "_extracted_shapes")]:
            delattr(self, attr)

    def _maps_and_scores(self, X, return_maps: bool = True):
        """``(maps at the network size or None, scores, input sizes)``; the input sizes
        are one ``(H, W)`` for same-size images, else a list with one per image."""
        self._check_fitted()
        self._check_params()  # scoring reads parameters (set_params after fit)
        images, sizes = self._images(X)
        size = self._network_size(images)
        if tuple(size) != tuple(self.input_size_):
            fitted = tuple(int(v) for v in self.input_size_)
            if self.image_size is None:
                raise ValueError(f"X images are {tuple(images.shape[-2:])} but the memory was "
                                 f"built from {fitted} images (image_size=None); resize "
                                 f"them or set image_size={fitted}.")
            # set_params(image_size=...) after fit: the memory's grids are of the fit's size
            # (the images are fine: the error names image_size, not them)
            raise ValueError(f"image_size={self.image_size!r} but the memory was built at the "
                             f"network input size {fitted}: image_size cannot change after "
                             f"fit; set image_size={fitted} (or None for images of that size) "
                             "again, or refit.")
        expect = getattr(self, "feature_shapes_", None)  # absent from older files
        expect = None if expect is None else [tuple(int(v) for v in sh) for sh in expect]
        fitted_keys = getattr(self, "keys_", None)
        desc = f"{type(self).__name__} score"
        # The test images are extracted and scored group by group, each group's maps and
        # scores written into outputs allocated once: the features of all test images
        # never exist at once (they are several times the size of the maps), so the
        # memory is the output plus one group, whatever the number of images.
        group = self._score_group_size(expect)
        groups = list(row_blocks(len(images), group))
        # one progress bar: per batch for one group (as without groups), else per group
        inner = None if len(groups) == 1 else 0
        log = ProgressLogger(len(groups), verbose=self.verbose if inner == 0 else 0,
                             desc=f"{desc} ({len(images)} images in groups of {group})")

        def score_group(rows: slice):
            feats, keys = self._extract(images, desc=desc, expect=expect, rows=rows,
                                        store=self._score_store(), verbose=inner)
            if fitted_keys is not None and keys.shape[1] != fitted_keys.shape[1]:
                raise ValueError(f"the extractor returned keys of dimension {keys.shape[1]}, "
                                 f"but the memory was built with keys of dimension "
                                 f"{fitted_keys.shape[1]}; score with the extractor the "
                                 "detector was fitted with.")
            maps, scores = self._score_extracted(feats, keys, return_maps, verbose=inner)
            log.log(images=rows.stop)
            return (maps, scores) if return_maps else scores

        # zip draws from the logger first, so that its bar closes with the last group
        out = collect_row_blocks(score_group, len(images), group,
                                 blocks=(rows for _, rows in zip(log, groups)))
        maps, scores = out if return_maps else (None, out)
        return maps, scores, (tuple(images.shape[-2:]) if sizes is None else sizes)

    def _score_group_size(self, shapes) -> int:
        """Test images per scoring group: as many as hold at most ``8 * chunk_size``
        float32 values of scoring features (512 MB at the default), at least one batch,
        in whole batches. Without the fitted feature shapes (files of older versions),
        16 batches."""
        bs = int(self.batch_size)
        if not shapes:
            return 16 * bs
        per_image = max(1, self._score_values_per_image(shapes))
        return max(1, (8 * int(self.chunk_size)) // (per_image * bs)) * bs

    def _score_values_per_image(self, shapes) -> int:
        """Float32 values one test image holds while its group is scored: its feature
        maps of shapes ``(C, h, w)``."""
        return sum(int(np.prod(sh)) for sh in shapes)

    def _score_store(self):
        """Per-batch conversion of the scored features (see :meth:`_extract`); ``None``
        keeps the float32 maps."""
        return None

    def _score_extracted(self, feats, keys, return_maps: bool, verbose=None):
        """Maps and scores of one group of test images from the output of
        :meth:`_extract` with :meth:`_score_store` (``verbose`` overrides the
        estimator's for the group's progress bars)."""
        return self._score_features(feats, keys, exclude=None, return_maps=return_maps)

    def decision_function(self, X: ImageInput) -> np.ndarray:
        """Image anomaly scores (higher is more anomalous, as in PyOD).

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Images as in :meth:`fit`, of the fitted size unless ``image_size`` is
            set.

        Returns
        -------
        ndarray of shape (n_samples,)
            Image anomaly scores, float32, comparable to ``decision_scores_`` and
            ``threshold_``.
        """
        return self._to_numpy(self._maps_and_scores(X, return_maps=False)[1])

    def score_samples(self, X: ImageInput) -> np.ndarray:
        """Alias of :meth:`decision_function`: higher is more anomalous.

        Note that this follows PyOD, not scikit-learn's outlier detectors (where
        ``score_samples`` is higher for *normal* samples).

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Images as in :meth:`fit`.

        Returns
        -------
        ndarray of shape (n_samples,)
            The image anomaly scores of :meth:`decision_function`.
        """
        return self.decision_function(X)

    @overload
    def anomaly_map(self, X: ImageInput, *, return_scores: Literal[False] = False
                    ) -> np.ndarray | list[np.ndarray]: ...
    @overload
    def anomaly_map(self, X: ImageInput, *, return_scores: Literal[True]
                    ) -> tuple[np.ndarray | list[np.ndarray], np.ndarray]: ...
    @overload
    def anomaly_map(self, X: ImageInput, *, return_scores: bool = False
                    ) -> (np.ndarray | list[np.ndarray]
                          | tuple[np.ndarray | list[np.ndarray], np.ndarray]): ...
    def anomaly_map(self, X: ImageInput, *, return_scores: bool = False
                    ) -> (np.ndarray | list[np.ndarray]
                          | tuple[np.ndarray | list[np.ndarray], np.ndarray]):
        """Pixel anomaly maps at the input resolution.

        The maps are computed at the network input size (``input_size_``), or at
        RAD's ``map_size`` when set, and resized bilinearly to each image's own size.

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Images as in :meth:`fit`.
        return_scores : bool, default=False
            Also return the image scores (one extraction for both).

        Returns
        -------
        maps : ndarray of shape (n_samples, H, W), or list of ndarray
            Pixel anomaly scores, float32 (higher is more anomalous). For a list
            of images of different sizes (accepted when ``image_size`` is set), a
            list with one ``(H_i, W_i)`` map per image.
        scores : ndarray of shape (n_samples,), only with ``return_scores``
            The image scores of :meth:`decision_function`.
        """
        check_bool(return_scores, "return_scores")
        maps, scores, hw = self._maps_and_scores(X)
        if isinstance(hw, list):  # images of different sizes: one map each at its size
            maps = [self._to_numpy(resize_maps(m[None], s)[0]) for m, s in zip(maps, hw)]
        else:
            maps = self._to_numpy(resize_maps(maps, hw))
        return (maps, self._to_numpy(scores)) if return_scores else maps

    def predict(self, X: ImageInput) -> np.ndarray:
        """Binary labels: 1 for anomalous (score above ``threshold_``), 0 for normal.

        Follows PyOD (1 = outlier), not scikit-learn's outlier detectors (which
        return -1 for outliers and 1 for inliers).

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Images as in :meth:`fit`.

        Returns
        -------
        ndarray of shape (n_samples,), int64
            ``decision_function(X) > threshold_``.
        """
        scores = self.decision_function(X)
        self._warn_if_single_training_image("predict")
        return (scores > self.threshold_).astype(np.int64)

    def _warn_if_single_training_image(self, method: str) -> None:
        # one-shot ranking with decision_function is the paper's setting and stays quiet;
        # only the methods that read the training scores have nothing to read them from
        if self.n_train_ == 1:
            warnings.warn(
                f"{type(self).__name__} was fitted on a single image, which has no other "
                "image to be scored against: decision_scores_ is [0.0] and threshold_ 0.0, "
                f"so {method} has no threshold or calibration (predict flags every image "
                "scoring above 0). Fit on at least 2 normal images, or rank with "
                "decision_function.", UserWarning, stacklevel=user_stacklevel())

    def predict_proba(self, X: ImageInput, method: ProbaMethod = "linear") -> np.ndarray:
        r"""Probability of being anomalous, as PyOD's ``predict_proba``.

        The test scores are mapped through the training scores
        ``decision_scores_``: ``"linear"`` min-max scales them to the training
        range and clips to [0, 1]; ``"unify"`` is
        :math:`\operatorname{erf}((s - \mu) / (\sigma \sqrt{2}))` clipped at 0,
        with the mean and standard deviation of the training scores (Kriegel et
        al., 2011). A constant training range or standard deviation is replaced
        by 1, as PyOD's min-max scaler does. These are calibrations of the score,
        not probabilities estimated from labels.

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Images as in :meth:`fit`.
        method : {"linear", "unify"}, default="linear"
            The calibration of the scores (above).

        Returns
        -------
        ndarray of shape (n_samples, 2), float64
            Columns: probability of normal (0) and anomalous (1); rows sum to 1.
        """
        check_in_options(method, "method", PROBA_METHODS)
        self._check_fitted()
        scores = self.decision_function(X).astype(np.float64)
        self._warn_if_single_training_image("predict_proba")
        train = np.asarray(self.decision_scores_, dtype=np.float64)
        if method == "linear":
            span = float(train.max() - train.min())
            p = (scores - float(train.min())) / (span if span > 0 else 1.0)
        else:
            sigma = float(train.std())
            p = erf((scores - float(train.mean())) / ((sigma if sigma > 0 else 1.0)
                                                       * np.sqrt(2.0)))
        p = np.clip(p, 0.0, 1.0)
        return np.stack([1.0 - p, p], axis=1)

    def fit_predict(self, X: ImageInput, y: object = None) -> np.ndarray:
        """Fit and return ``labels_`` (leave-one-out labels of the training images).

        The training images are labelled by their leave-one-out scores
        ``decision_scores_`` (each image is scored without itself in the memory), so
        about a ``contamination`` fraction of them is 1; ``predict(X)`` after
        ``fit(X)`` would score each with itself in the memory (near 0) instead.

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Normal images as in :meth:`fit`.
        y : ignored
            Present for API consistency.

        Returns
        -------
        ndarray of shape (n_samples,), int64
            ``labels_``: 1 where ``decision_scores_ > threshold_``, else 0.
        """
        return self.fit(X).labels_

    def score(self, X: ImageInput, y: ArrayLike) -> float:
        """Image-level AUROC of :meth:`decision_function` against ``y`` (1 = anomalous).

        Parameters
        ----------
        X : array-like, tensor, or list of PIL images, arrays or image file paths
            Images as in :meth:`fit`.
        y : array-like of shape (n_samples,)
            Binary labels, 1 for anomalous and 0 for normal images (booleans
            too); both classes must occur, else the AUROC is undefined and a
            ``ValueError`` is raised before any image is scored.

        Returns
        -------
        float
            The area under the ROC curve of the image scores, in [0, 1].
        """
        y = to_numpy(y, "y")  # (a tensor on a GPU or requiring grad too)
        # checked here, before the extraction: scikit-learn's roc_auc_score returns NaN
        # with a warning for a single class (>= 1.8) or raises (older versions); labels
        # in {-1, 1} are refused, as scikit-learn's outlier convention (-1 = outlier)
        # would give 1 - AUROC without a word
        if y.ndim != 1 or not np.isin(y, (0, 1)).all() or len(np.unique(y)) != 2:
            raise ValueError("y must be a 1D array of binary labels (1 = anomalous, 0 = "
                             "normal) holding both classes; the AUROC is undefined "
                             f"otherwise, got values {np.unique(y)[:5].tolist()} of shape "
                             f"{y.shape}.")
        n_images = _image_count(X)
        if n_images is not None and n_images != len(y):  # (before the extraction)
            raise ValueError(f"y has {len(y)} labels, but X holds {n_images} images: "
                             "pass one label per image.")
        return float(roc_auc_score(y, self.decision_function(X)))

    # -- persistence ----------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Save parameters and memory (``torch.load(weights_only=True)``-safe).

        A built-in extractor (``None`` or a name) is rebuilt on load. A custom
        extractor module is code, which a safe file cannot hold: it is left out,
        and :meth:`load` needs it again as ``extractor=`` (the memory, thresholds
        and every other parameter are stored).

        Parameters
        ----------
        path : str or path-like
            Destination file.
        """
        if self.extractor is None or isinstance(self.extractor, str):
            super().save(path)
            return
        self._save_storing(path, "extractor", _CUSTOM_EXTRACTOR)  # a marker, not the code

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: Any = "cpu", *,
             extractor: Callable[..., Any] | None = None) -> Self:
        """Load a detector written by :meth:`save`, safely (``weights_only=True``).

        Parameters
        ----------
        path : str or path-like
            File written by :meth:`save`.
        map_location : str or torch.device, default="cpu"
            Where its tensors are loaded, as for ``torch.load``; the memory is then
            moved to the detector's ``device``, where scoring uses it (a ``device``
            this machine does not have becomes this one, with a warning).
        extractor : callable or None, default=None
            The custom extractor the detector was fitted with (required for a
            detector saved with one, e.g. a :class:`TorchFeatureExtractor` around
            your module with the same weights; not allowed for a built-in one).
            Its feature map shapes are checked against the memory when scoring.

        Returns
        -------
        detector
            A fitted instance of this class.
        """
        est = super().load(path, map_location=map_location)
        custom = est.extractor == _CUSTOM_EXTRACTOR
        if custom and extractor is None:
            raise ValueError(f"{os.fspath(path)!r} was saved from a detector with a custom "
                             f"extractor; pass it again: {cls.__name__}.load(path, "
                             "extractor=my_extractor).")
        if not custom and extractor is not None:
            raise ValueError(f"{os.fspath(path)!r} uses the built-in extractor "
                             f"{est.extractor!r}, which is rebuilt on load; do not pass "
                             "extractor=.")
        if custom:
            est.extractor = extractor
        return est

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        # the memory lives on ``device`` wherever map_location read it (scoring would
        # otherwise copy it there again for every batch and layer)
        try:
            dev = self._resolved_device
        except ValueError:  # a device value that names none: scoring reports it
            return
        for name in ("memory_", "keys_"):
            value = getattr(self, name, None)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(dev))
            elif isinstance(value, list):
                setattr(self, name, [v.to(dev) for v in value])

    def __getstate__(self):
        state = super().__getstate__()  # a copy (TorchEstimatorMixin)
        if (isinstance(self.extractor, str) or self.extractor is None
                or state.get("_extractor") is not self.extractor):
            # rebuilt on demand: a built-in one, or the device copy of the user's module
            # (which would be pickled twice)
            state.pop("_extractor", None)
            state.pop("_extractor_param", None)
        return state

    def _memory_dtype(self) -> torch.dtype:
        return resolve_dtype(self.memory_dtype)

    @classmethod
    def _estimator_check_instances(cls) -> list:
        # These detectors take batches of images (n, C, H, W) and run a CNN on
        # them; scikit-learn's checks feed 2D tabular data, which has no spatial
        # layout to extract patches from, so the checks do not apply.
        return []


def _image_count(X: Any) -> int | None:
    """The number of images ``X`` holds, read off its length without validating it;
    ``None`` where that is not plain (a 3-D array whose last axis has 3 or 4 entries
    may be one ``(H, W, C)`` image, which the validation refuses with its own message)."""
    if isinstance(X, (list, tuple)):
        return len(X)
    shape = getattr(X, "shape", None)
    if shape is None:
        return None
    if len(shape) == 4 or (len(shape) == 3 and shape[-1] not in (3, 4)) or len(shape) == 1:
        return int(shape[0])
    return None
