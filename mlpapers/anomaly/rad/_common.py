"""Image input validation and the shared shell of the patch-based detectors."""

from __future__ import annotations

import numbers
import os
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.metrics import roc_auc_score

from mlpapers._base import TorchEstimatorMixin
from mlpapers._utils import (
    ProgressLogger,
    check_in_options,
    check_positive,
    check_tensor,
    reject_single_hwc_image,
    resolve_dtype,
    torch_compatible_array,
)
from mlpapers.anomaly.rad._extractors import resolve_extractor
from mlpapers.anomaly.rad._maps import resize_maps

_MEMORY_DTYPES = ("float32", "float16", "bfloat16")


def _pil_to_array(image: Any) -> np.ndarray:
    """Pixel array of a PIL image: 8-bit modes as uint8 L or RGB, wider modes as stored.

    32-bit integer (``"I"``), 16-bit (``"I;16"``...) and float (``"F"``) images keep
    their values, so that :func:`check_images` validates them like arrays of the
    same dtype (PIL's ``convert("L")`` would clip them to 0..255 silently).
    """
    mode = image.mode
    if mode == "F" or mode == "I" or mode.startswith("I;"):
        return torch_compatible_array(np.asarray(image))
    return np.asarray(image.convert("L" if mode in ("L", "1") else "RGB"))


def _pixels_to_unit(t: torch.Tensor, name: str) -> torch.Tensor:
    """Pixels as float in [0, 1]: booleans as 0/1, integers (8-bit values, any integer
    dtype) divided by 255, floats as they are (warning when they look like 0-255)."""
    if t.dtype == torch.bool:
        return t.float()
    if not t.is_floating_point():
        if not t.numel():
            lo, hi = 0, 0
        elif t.dtype in (torch.uint16, torch.uint32, torch.uint64):  # no torch CPU min/max
            arr = t.cpu().numpy()
            lo, hi = int(arr.min()), int(arr.max())
        else:
            lo, hi = (int(v) for v in torch.aminmax(t))
        if lo < 0 or hi > 255:
            raise ValueError(f"{name} has integer values in [{lo}, {hi}]; integer images must "
                             "hold 8-bit pixel values in [0, 255] (or pass floats in [0, 1]).")
        return t.float() / 255.0
    t = t.float()
    lo, hi = (float(v) for v in torch.aminmax(t)) if t.numel() else (0.0, 0.0)
    if hi > 2.0 or lo < -1.0:
        warnings.warn(f"{name} is floating point with values in [{lo:.4g}, {hi:.4g}]; float "
                      "images are expected in [0, 1] (divide 0-255 pixel values by 255, "
                      "or pass uint8; do not normalise them, the extractor does).",
                      UserWarning, stacklevel=4)
    return t


def check_images(X: Any, name: str = "X") -> torch.Tensor:
    """Validate images into a float tensor (n, 3, H, W) with values in [0, 1].

    Accepts numpy arrays, tensors, or lists of PIL images / arrays, shaped
    ``(n, H, W)`` (grayscale; a 3D array whose last axis has 3 or 4 entries is
    taken for one ``(H, W, C)`` image and rejected), ``(n, H, W, C)`` or
    ``(n, C, H, W)`` with ``C`` in
    ``{1, 3, 4}`` (when both axes could hold the channels, ``(n, C, H, W)`` wins,
    and 1 or 3 channels win over 4). Integer data (any integer dtype, e.g. ``uint8`` or the
    ``int64`` of a nested list of pixel values) are 8-bit pixel values and are
    divided by 255; values outside ``[0, 255]`` raise a ``ValueError``. Boolean
    data become 0/1. Float data are taken as is (expected in ``[0, 1]``; a
    ``UserWarning`` flags data that look like 0-255 pixel values). Grayscale is
    repeated to three channels; the alpha channel of 4-channel (RGBA) data is
    dropped, as PIL's ``convert("RGB")`` does. PIL images of 16/32-bit integer or
    float modes (``"I;16"``, ``"I"``, ``"F"``) follow the same rules as arrays of
    their dtype (they are not clipped to 8 bits). In a list mixing integer and
    float images, each image is scaled by its own dtype.
    """
    if isinstance(X, (list, tuple)) and len(X) > 0 and not isinstance(X[0], numbers.Number):
        arrays = []
        for item in X:
            if hasattr(item, "mode") and hasattr(item, "convert"):  # PIL image
                item = _pil_to_array(item)
            arrays.append(item.detach().cpu().numpy() if isinstance(item, torch.Tensor)
                          else np.asarray(item))
        if len({a.shape for a in arrays}) > 1:  # grayscale next to colour: repeat channels
            colour = [a.shape for a in arrays if a.ndim == 3 and a.shape[-1] in (3, 4)]
            if colour:
                arrays = [np.repeat(a[..., None], colour[0][-1], axis=-1)
                          if a.ndim == 2 and a.shape == colour[0][:2] else a for a in arrays]
        kinds = {a.dtype.kind for a in arrays}
        if "f" in kinds and kinds & set("biu"):  # 8-bit items next to float items
            arrays = [a if a.dtype.kind == "f" else
                      _pixels_to_unit(torch.from_numpy(torch_compatible_array(a)), name).numpy()
                      for a in arrays]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError(f"{name} holds images of mixed sizes {sorted(shapes)}; resize them "
                             "to a common size first.")
        X = np.stack(arrays)
    t = check_tensor(X, name=name, ndim=(3, 4), dtype=None, min_samples=1)
    reject_single_hwc_image(t, name, fix="X[None] (or a list of images)")
    t = _pixels_to_unit(t, name)
    if t.ndim == 3:
        t = t[:, None]
    elif t.shape[1] in (1, 3):
        pass
    elif t.shape[-1] in (1, 3, 4):
        t = t.permute(0, 3, 1, 2)
    elif t.shape[1] != 4:
        raise ValueError(f"{name} must have 1, 3 or 4 channels, in (n, C, H, W) or "
                         f"(n, H, W, C) layout; got shape {tuple(t.shape)}.")
    if t.shape[1] == 4:  # RGBA: drop alpha
        t = t[:, :3]
    if t.shape[-1] < 2 or t.shape[-2] < 2:
        raise ValueError(f"{name} images must be at least 2x2 pixels, got {tuple(t.shape[-2:])}.")
    if t.shape[1] == 1:
        t = t.expand(-1, 3, -1, -1)
    return t.contiguous()


def _check_extractor_output(feats: Any, key: Any, n: int, batch: int) -> list[torch.Tensor]:
    """Check what a user extractor returned for a batch of ``n`` images."""
    if (not isinstance(feats, (list, tuple)) or len(feats) == 0
            or not all(isinstance(f, torch.Tensor) for f in feats)
            or not isinstance(key, torch.Tensor)):
        raise TypeError("the extractor must return (list of (B, C, h, w) feature tensors, "
                        f"(B, D) key tensor), got ({type(feats).__name__}, "
                        f"{type(key).__name__}).")
    for i, f in enumerate(feats):
        if f.ndim != 4 or f.shape[0] != n:
            raise ValueError(f"the extractor's feature map {i} has shape {tuple(f.shape)} for a "
                             f"batch of {n} images; expected ({n}, C, h, w).")
    if key.ndim == 0 or key.shape[0] != n:
        raise ValueError(f"the extractor's key has shape {tuple(key.shape)} for a batch of "
                         f"{n} images; expected ({n}, D).")
    for t, what in [*((f, f"feature map {i}") for i, f in enumerate(feats)), (key, "key")]:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"the extractor returned NaN or infinite values in its {what} "
                             f"(batch {batch}).")
    return [f.float() for f in feats]


def _check_image_size(image_size) -> tuple[int, int] | None:
    if image_size is None:
        return None
    if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool):
        check_positive(image_size, "image_size", integer=True)
        return int(image_size), int(image_size)
    if isinstance(image_size, (tuple, list)) and len(image_size) == 2:
        for s in image_size:
            check_positive(s, "image_size", integer=True)
        return int(image_size[0]), int(image_size[1])
    raise ValueError(f"image_size must be None, an int or a pair (height, width), "
                     f"got {image_size!r}.")


class BaseImageDetector(TorchEstimatorMixin, OutlierMixin, BaseEstimator):
    """Shared shell: input handling, extraction in batches, PyOD-style thresholds.

    Subclasses implement ``_check_params()``, ``_fit_memory(feats, keys)`` (stores
    the memory, returns the leave-one-out training scores) and
    ``_score_features(feats, keys, exclude, return_maps=True)`` returning ``(maps (B,
    H', W') or None without return_maps, scores (B,))`` at the network input resolution.
    """

    # -- parameter checks ---------------------------------------------------
    def _check_common_params(self) -> None:
        _check_image_size(self.image_size)
        check_positive(self.smoothing_sigma, "smoothing_sigma", strict=False)
        if not isinstance(self.contamination, numbers.Real) or not (
                0.0 < self.contamination <= 0.5):
            raise ValueError(f"contamination must be in (0, 0.5], got {self.contamination!r}.")
        check_in_options(self.memory_dtype, "memory_dtype", _MEMORY_DTYPES)
        check_positive(self.batch_size, "batch_size", integer=True)
        check_positive(self.chunk_size, "chunk_size", integer=True)
        if isinstance(self.extractor, str):
            check_in_options(self.extractor, "extractor", ("random", "efficientnet-lite0"))

    def _get_extractor(self):
        ext = getattr(self, "_extractor", None)
        if ext is None:
            ext = resolve_extractor(self.extractor)
            if isinstance(ext, torch.nn.Module):
                ext = ext.to(self._resolved_device).eval()
            self._extractor = ext
        return ext

    # -- feature extraction -------------------------------------------------
    def _network_size(self, images: torch.Tensor) -> tuple[int, int]:
        hw = _check_image_size(self.image_size)
        return tuple(images.shape[-2:]) if hw is None else hw

    def _extract(self, images: torch.Tensor, desc: str) -> tuple[list[torch.Tensor],
                                                                  torch.Tensor]:
        """Run the extractor in batches: per-layer maps (n, C_l, h_l, w_l), keys (n, D)."""
        ext = self._get_extractor()
        size = self._network_size(images)
        dev = self._resolved_device
        n_batches = -(-len(images) // self.batch_size)
        feats: list[list[torch.Tensor]] = []
        keys = []
        log = ProgressLogger(n_batches, verbose=self.verbose, desc=desc)
        with torch.inference_mode():
            for i in log:
                x = images[i * self.batch_size:(i + 1) * self.batch_size].to(dev)
                if tuple(x.shape[-2:]) != tuple(size):
                    x = F.interpolate(x, size=size, mode="bilinear", align_corners=False,
                                      antialias=True)
                try:
                    f, k = ext(x)
                except RuntimeError as exc:
                    if isinstance(exc, torch.OutOfMemoryError):
                        raise
                    raise ValueError(
                        f"the extractor failed on a batch of shape {tuple(x.shape)}: {exc} "
                        f"(images of {tuple(size)} pixels may be too small for this "
                        "backbone; set image_size, e.g. 224)") from exc
                f = _check_extractor_output(f, k, len(x), i)
                if feats and [t.shape[1:] for t in f] != [t.shape[1:] for t in feats[0]]:
                    raise ValueError("the extractor returned feature maps of different shapes "
                                     "for different batches of same-size images.")
                feats.append(f)
                keys.append(k.float().reshape(len(x), -1))
                log.log(batch=i)
        layers = [torch.cat([b[li] for b in feats]) for li in range(len(feats[0]))]
        return layers, torch.cat(keys)

    # -- public API -----------------------------------------------------------
    def fit(self, X, y=None):
        """Build the memory from normal images.

        Parameters
        ----------
        X : array-like, tensor or list of PIL images
            Normal images, (n, H, W), (n, H, W, C) or (n, C, H, W); uint8 or float
            in [0, 1].
        y : ignored
            Present for API consistency (anomaly labels are not used).

        Returns
        -------
        self
        """
        self._init_fit()
        self._check_params()
        images = check_images(X)
        self._forget_fit()
        try:
            feats, keys = self._extract(images, desc=f"{type(self).__name__} fit")
            self.n_features_in_ = int(np.prod(images.shape[1:]))
            self.n_train_ = len(images)
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
                     or k == "_extractor"]:
            delattr(self, attr)

    def _maps_and_scores(self, X, return_maps: bool = True
                         ) -> tuple[torch.Tensor | None, torch.Tensor, tuple[int, int]]:
        self._check_fitted()
        self._check_params()  # scoring reads parameters (set_params after fit)
        images = check_images(X)
        size = self._network_size(images)
        if tuple(size) != tuple(self.input_size_):
            raise ValueError(f"X images are {tuple(images.shape[-2:])} but the memory was built "
                             f"from {tuple(self.input_size_)} images (image_size=None); resize "
                             "them or set image_size.")
        feats, keys = self._extract(images, desc=f"{type(self).__name__} score")
        # scores alone do not keep the (n, H', W') maps of every image
        maps, scores = self._score_features(feats, keys, exclude=None, return_maps=return_maps)
        return maps, scores, tuple(images.shape[-2:])

    def decision_function(self, X) -> np.ndarray:
        """Image anomaly scores (higher is more anomalous, as in PyOD).

        Parameters
        ----------
        X : array-like, tensor or list of PIL images
            Images as in :meth:`fit`.

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        return self._to_numpy(self._maps_and_scores(X, return_maps=False)[1])

    def score_samples(self, X) -> np.ndarray:
        """Alias of :meth:`decision_function`: higher is more anomalous.

        Note that this follows PyOD, not scikit-learn's outlier detectors (where
        ``score_samples`` is higher for *normal* samples).
        """
        return self.decision_function(X)

    def anomaly_map(self, X, *, return_scores: bool = False):
        """Pixel anomaly maps at the input resolution.

        Parameters
        ----------
        X : array-like, tensor or list of PIL images
        return_scores : bool, default=False
            Also return the image scores (one extraction for both).

        Returns
        -------
        maps : ndarray of shape (n_samples, H, W)
        scores : ndarray of shape (n_samples,), only with ``return_scores``
        """
        maps, scores, hw = self._maps_and_scores(X)
        maps = self._to_numpy(resize_maps(maps, hw))
        return (maps, self._to_numpy(scores)) if return_scores else maps

    def predict(self, X) -> np.ndarray:
        """Binary labels: 1 for anomalous (score above ``threshold_``), 0 for normal."""
        return (self.decision_function(X) > self.threshold_).astype(np.int64)

    def fit_predict(self, X, y=None) -> np.ndarray:
        """Fit and return ``labels_`` (leave-one-out labels of the training images)."""
        return self.fit(X).labels_

    def score(self, X, y) -> float:
        """Image-level AUROC of :meth:`decision_function` against ``y`` (1 = anomalous)."""
        return float(roc_auc_score(np.asarray(y), self.decision_function(X)))

    # -- persistence ----------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Save parameters and memory (``torch.load(weights_only=True)``-safe).

        Only estimators whose ``extractor`` is ``None`` or a built-in name can be
        saved this way (the extractor is rebuilt on load); pickle the estimator
        for a custom extractor module.
        """
        if self.extractor is not None and not isinstance(self.extractor, str):
            raise TypeError("save supports extractor=None or a built-in name "
                            "('random', 'efficientnet-lite0'); a custom extractor module "
                            "cannot be stored safely. Use pickle for trusted files instead.")
        super().save(path)

    def __getstate__(self):
        state = super().__getstate__()  # a copy (TorchEstimatorMixin)
        if isinstance(self.extractor, str) or self.extractor is None:
            state.pop("_extractor", None)  # rebuilt on demand
        return state

    def _memory_dtype(self) -> torch.dtype:
        return resolve_dtype(self.memory_dtype)

    @classmethod
    def _estimator_check_instances(cls) -> list:
        # These detectors take batches of images (n, C, H, W) and run a CNN on
        # them; scikit-learn's checks feed 2D tabular data, which has no spatial
        # layout to extract patches from, so the checks do not apply.
        return []
