"""Validation of image inputs: arrays, tensors and PIL images to (n, C, H, W) pixels."""

from __future__ import annotations

import numbers
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import torch
import torch.nn.functional as F

from mlpapers._utils import (
    ArrayLike,
    check_tensor,
    reject_flat_image_table,
    reject_single_hwc_image,
    to_numpy,
    torch_compatible_array,
    user_stacklevel,
)

__all__ = ["check_images"]

# what a list item that names an image file is
_PATH_TYPES = (str, bytes, os.PathLike)

#: What the detectors take as images: an array or tensor, or a sequence of PIL images,
#: arrays or image file paths.
ImageInput: TypeAlias = ArrayLike | Sequence[Any]


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


def _open_image_file(path: str | bytes | os.PathLike, name: str):
    """``PIL.Image.open`` of an image file (lazy: only the header is read)."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - Pillow ships with matplotlib/sklearn users
        raise ImportError(f"{name} holds file paths; reading image files needs Pillow "
                          "(pip install pillow). Or pass the images as arrays.") from exc
    try:
        return Image.open(os.fsdecode(path))
    except Image.UnidentifiedImageError as exc:  # (an OSError: not a missing path)
        raise ValueError(f"{name} holds {os.fsdecode(path)!r}, which is not an image file "
                         "Pillow can read.") from exc


def _read_image_file(path: str | bytes | os.PathLike, name: str) -> np.ndarray:
    """Pixel array of an image file (any format Pillow reads), as :func:`_pil_to_array`."""
    with _open_image_file(path, name) as image:
        image.load()
        return _pil_to_array(image)


class ImageFiles:
    """A list of image files decoded one slice at a time, shaped like the validated
    tensor of :func:`_validate_images`: ``len``, ``shape`` and ``[start:stop]``.

    The detectors resize every image to ``size`` batch by batch, so the files of a call
    need not be decoded at once: only the headers are read here (sizes, and a missing
    file or one whose header cannot be read fails before any work); each slice is
    decoded and validated by :func:`_validate_images` when the batch is extracted.
    ``sizes`` is ``None`` when the files share one size, else their ``(H, W)``, as
    :func:`_validate_images` returns them. A file whose pixels cannot be decoded or fail
    the checks raises when its batch is reached; a pixel-range warning is given once
    per call, not per batch.
    """

    def __init__(self, paths: Sequence[Any], name: str, size: tuple[int, int]):
        self.paths, self.name, self.size = list(paths), name, tuple(size)
        hw = []
        for path in self.paths:
            with _open_image_file(path, name) as image:
                hw.append((int(image.height), int(image.width)))
        self.sizes = None if len(set(hw)) == 1 else hw
        self.shape = (len(hw), 3, *(hw[0] if self.sizes is None else self.size))
        self._warned = False

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: slice) -> torch.Tensor:
        # the batch's pixel-range warnings are collected in this thread only (not with
        # warnings.catch_warnings, which swaps the process-wide filters: calls
        # overlapping in threads left "always" installed and every later warning of
        # the process captured); one per call is given, as for an array input
        caught: list[str] = []
        _collected.warnings = caught
        try:
            images = _validate_images(self.paths[index], self.name, self.size)[0]
        finally:
            _collected.warnings = None
        if caught and not self._warned:
            self._warned = True
            warnings.warn(caught[0], UserWarning, stacklevel=user_stacklevel())
        return images


#: per thread: ``warnings`` is the list an :class:`ImageFiles` batch collects the
#: pixel-range warnings in, or ``None`` (they are given at once)
_collected = threading.local()


# float pixels are expected in [0, 1]: a maximum above _FLOAT_HIGH looks like 0-255
# values, a minimum below _FLOAT_LOW like normalised data ([-1, 1], [-0.5, 0.5], mean
# subtracted or standardised); noise, resampling overshoot or rounding around 0 of
# images in [0, 1] stays above it (the package's generators clip to [0, 1])
_FLOAT_HIGH = 2.0
_FLOAT_LOW = -0.25


def _check_pixel_range(t: torch.Tensor, name: str) -> None:
    """Check the pixel range of a whole image tensor without copying it: integers
    must be 8-bit values (ValueError otherwise), floats that look like 0-255 values
    (maximum above 2) or normalised data (minimum below -0.25: a quarter of the
    [0, 1] range below zero) get a warning."""
    if t.dtype == torch.bool or not t.numel():
        return
    if not t.is_floating_point():
        if t.dtype in (torch.uint16, torch.uint32, torch.uint64):  # no torch CPU min/max
            arr = t.cpu().numpy()
            lo, hi = int(arr.min()), int(arr.max())
        else:
            lo, hi = (int(v) for v in torch.aminmax(t))
        if lo < 0 or hi > 255:
            raise ValueError(f"{name} has integer values in [{lo}, {hi}]; integer images must "
                             "hold 8-bit pixel values in [0, 255] (or pass floats in [0, 1]).")
        return
    low, high = (float(v) for v in torch.aminmax(t))
    if high > _FLOAT_HIGH or low < _FLOAT_LOW:
        message = (f"{name} is floating point with values in [{low:.4g}, {high:.4g}]; "
                   "float images are expected in [0, 1] (divide 0-255 pixel values by 255, "
                   "or pass uint8; do not normalise them, the extractor does: map "
                   "images in [-1, 1] back with (X + 1) / 2).")
        sink = getattr(_collected, "warnings", None)
        if sink is not None:  # an ImageFiles batch: given once per call
            sink.append(message)
        else:
            warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def _check_items_pixel_range(arrays: list[np.ndarray], name: str) -> None:
    """:func:`_check_pixel_range` of a list of images taken together: integer items one
    by one (an error), the float items' overall range once (one warning, not one per
    image quoting each image's own range)."""
    ranges = []
    for a in arrays:
        if a.dtype.kind == "f" and a.size:
            ranges.append((float(a.min()), float(a.max())))
        elif a.dtype.kind in "iu":
            _check_pixel_range(torch.from_numpy(torch_compatible_array(a)), name)
    if ranges:
        _check_pixel_range(torch.tensor(ranges, dtype=torch.float64), name)


def _to_unit(t: torch.Tensor) -> torch.Tensor:
    """Pixels as float32 in [0, 1]: booleans as 0/1, integers divided by 255, floats
    as they are (the range was checked by :func:`_check_pixel_range`)."""
    if t.dtype == torch.bool:
        return t.float()
    if not t.is_floating_point():
        return t.float() / 255.0
    return t.float()


def _pixels_to_unit(t: torch.Tensor, name: str) -> torch.Tensor:
    """Check the range (:func:`_check_pixel_range`) and convert to float in [0, 1]."""
    _check_pixel_range(t, name)
    return _to_unit(t)


def _unit_rgb(t: torch.Tensor) -> torch.Tensor:
    """A batch of validated images ``(b, 1 or 3, H, W)`` of any pixel dtype as a
    contiguous float32 tensor ``(b, 3, H, W)`` in [0, 1]."""
    t = _to_unit(t)
    if t.shape[1] == 1:
        t = t.expand(-1, 3, -1, -1)
    return t.contiguous()


def _resize(x: torch.Tensor, size) -> torch.Tensor:
    """Bilinear, antialiased resize of ``(b, C, H, W)`` images to ``size`` (the
    resampling of the extractor input)."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False,
                         antialias=True)


def _as_item_list(X: Any, name: str) -> Any:
    """A 1-D numpy array of file names, object array or pandas Series as a list (other
    inputs unchanged); a single path is a clear error."""
    if isinstance(X, _PATH_TYPES):
        raise TypeError(f"{name} is a single path ({X!r}); pass a list of image files, e.g. "
                        "sorted(pathlib.Path(folder).glob('*.png')), or of arrays.")
    if isinstance(X, np.ndarray) and X.dtype.kind in "US":  # np.array of file names
        if X.ndim != 1:
            raise ValueError(f"{name} is an array of file names of shape {X.shape}; pass a "
                             "1-D list or array of image files.")
        return X.tolist()
    if (getattr(X, "ndim", None) == 1
            and getattr(getattr(X, "dtype", None), "kind", None) == "O"):
        # an object array, or a pandas Series / Index of images or file names (pandas'
        # string dtypes report kind "O" too)
        return list(X)
    return X


def validate_image_source(X: Any, name: str = "X", size=None):
    """:func:`_validate_images`, except that a list of image files, when ``size`` (the
    network input size) is given, becomes an :class:`ImageFiles` decoded batch by batch
    (the memory of a call on a folder is one batch of decoded images, not all of them).

    Returns ``(images, sizes)`` as :func:`_validate_images`.
    """
    X = _as_item_list(X, name)
    if (size is not None and isinstance(X, (list, tuple)) and len(X) > 0
            and all(isinstance(item, _PATH_TYPES) for item in X)):
        files = ImageFiles(X, name, size)
        return files, files.sizes
    return _validate_images(X, name, size)


def _pil_layout_to_chw(a: np.ndarray) -> np.ndarray:
    """A decoded PIL image, ``(H, W)`` or ``(H, W, 3)`` by construction, as ``(C, H, W)``
    (its layout is known: it must not be guessed from its shape as an array's is)."""
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _channels_last(first: int, last: int) -> bool | None:
    """The layout rule of :func:`check_images` for an image whose first non-batch axis
    has ``first`` entries and last axis ``last``: ``(C, H, W)`` wins over ``(H, W, C)``
    and 1 or 3 channels over 4. ``None`` when neither axis holds 1, 3 or 4 channels."""
    if first in (1, 3):
        return False
    if last in (1, 3, 4):
        return True
    return False if first == 4 else None


def _item_to_chw(a: np.ndarray) -> np.ndarray:
    """One image of a list as ``(C, H, W)`` with ``C`` in ``{1, 3}`` by the rule of a
    batch (:func:`_channels_last`; ``(H, W)`` is grayscale, alpha is dropped). Anything
    else is returned as is, for the checks of the stacked batch to explain."""
    if a.ndim == 2:
        return a[None]
    if a.ndim != 3 or (layout := _channels_last(a.shape[0], a.shape[-1])) is None:
        return a
    if layout:
        a = a.transpose(2, 0, 1)
    return a[:3] if a.shape[0] == 4 else a


def _validate_images(X: Any, name: str = "X", size=None, *, check_range: bool = True
                     ) -> tuple[torch.Tensor, list[tuple[int, int]] | None]:
    """Validate images without converting them (see :func:`check_images`).

    Returns ``(images, sizes)``. ``images`` is ``(n, C, H, W)`` with ``C`` in
    ``{1, 3}`` in the input's pixel dtype (a view of the input where possible:
    ``uint8`` stays ``uint8``, so that the float conversion is done batch by batch,
    :func:`_unit_rgb`); ``sizes`` is ``None``. A list of images of different
    sizes is accepted when ``size`` (the network input size) is given: each image
    is converted and resized to ``size`` (as the extractor would), ``images`` is
    then float ``(n, 3, *size)`` and ``sizes`` the original ``(H, W)`` of each.
    """
    X = _as_item_list(X, name)
    if isinstance(X, (list, tuple)) and len(X) == 0:
        # np.asarray([]) is 1-D: the generic "Expected 3D or 4D array, got 1D" would
        # not say that the set of images is empty
        raise ValueError(f"{name} holds no images (an empty list): pass at least one "
                         "image.")
    if isinstance(X, (list, tuple)) and not isinstance(X[0], numbers.Number):
        arrays, given = [], []  # each item as (C, H, W), and its shape as given
        decoded = False  # whether some item was a PIL image or a file
        for item in X:
            if isinstance(item, _PATH_TYPES):  # an image file
                a, known = _read_image_file(item, name), True
            elif hasattr(item, "mode") and hasattr(item, "convert"):  # PIL image
                a, known = _pil_to_array(item), True
            else:
                a, known = to_numpy(item), False
            decoded |= known
            given.append(a.shape)
            arrays.append(_pil_layout_to_chw(a) if known else _item_to_chw(a))
        if len({a.shape[0] for a in arrays if a.ndim == 3}) > 1:  # grayscale next to colour
            arrays = [np.repeat(a, 3, axis=0) if a.ndim == 3 and a.shape[0] == 1 else a
                      for a in arrays]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1 and any(a.ndim != 3 or a.shape[0] not in (1, 3) for a in arrays):
            raise ValueError(f"each item of {name} must be one image, (H, W), (H, W, C) or "
                             f"(C, H, W) with 1, 3 or 4 channels; got items of shapes "
                             f"{sorted(set(given))}.")
        if len(shapes) > 1 and size is not None:
            # images of different sizes: each one validated, converted and resized to the
            # network input size on its own (what the extractor would do to it)
            _check_items_pixel_range(arrays, name)  # one warning for all, as for an array
            out, sizes = [], []
            for a in arrays:
                t, _ = _validate_images(a[None], name, check_range=False)
                sizes.append((int(t.shape[-2]), int(t.shape[-1])))
                out.append(_resize(_unit_rgb(t), size))
            return torch.cat(out), sizes
        kinds = {a.dtype.kind for a in arrays}
        # integer items next to float or boolean ones: np.stack would give them one
        # dtype, read by one rule (booleans of a list with uint8 images became 0 or 1/255)
        if len(kinds & set("biuf")) > 1 and kinds & set("bf"):
            arrays = [a if a.dtype.kind == "f" else
                      _pixels_to_unit(torch.from_numpy(torch_compatible_array(a)), name).numpy()
                      for a in arrays]
        if len(shapes) > 1:
            raise ValueError(f"{name} holds images of mixed sizes {sorted(set(given))}; resize "
                             "them to a common size first, or set image_size (each image is "
                             "then resized to it).")
        if not decoded and len(set(given)) == 1 and len(given[0]) == 2:
            # rows of one (H, W, C) image (a nested list, list(image)) read as the array
            # of the same values would be: refused, not taken for grayscale images
            reject_single_hwc_image(np.broadcast_to(0, (len(given), *given[0])), name,
                                    fix="X[None] (or a list of images)")
        X = np.stack(arrays)
    reject_flat_image_table(X, name, takes="images must be (n, H, W), (n, H, W, C) or "
                            "(n, C, H, W), or a list of images")
    t = check_tensor(X, name=name, ndim=(3, 4), dtype=None, min_samples=1)
    reject_single_hwc_image(t, name, fix="X[None] (or a list of images)")
    if check_range:
        _check_pixel_range(t, name)
    if t.ndim == 3:
        t = t[:, None]
    elif (layout := _channels_last(t.shape[1], t.shape[-1])) is None:
        raise ValueError(f"{name} must have 1, 3 or 4 channels, in (n, C, H, W) or "
                         f"(n, H, W, C) layout; got shape {tuple(t.shape)}.")
    elif layout:
        t = t.permute(0, 3, 1, 2)
    if t.shape[1] == 4:  # RGBA: drop alpha
        t = t[:, :3]
    if t.shape[-1] < 2 or t.shape[-2] < 2:
        raise ValueError(f"{name} images must be at least 2x2 pixels, got {tuple(t.shape[-2:])}.")
    return t, None


def check_images(X: ImageInput, name: str = "X") -> torch.Tensor:
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
    ``UserWarning`` flags data that look like 0-255 pixel values, a maximum above 2,
    or normalised ones, a minimum below -0.25). Grayscale is
    repeated to three channels; the alpha channel of 4-channel (RGBA) data is
    dropped, as PIL's ``convert("RGB")`` does. PIL images of 16/32-bit integer or
    float modes (``"I;16"``, ``"I"``, ``"F"``) follow the same rules as arrays of
    their dtype (they are not clipped to 8 bits). In a list mixing integer and
    float images, each image is scaled by its own dtype; the layout of each item of
    a list is read on its own by the rules above (so grayscale, RGB and RGBA items,
    channels-first and channels-last, mix), except that PIL images are always
    ``(H, W)`` or ``(H, W, C)``; the images of a list must share one size ``(H, W)``
    (the detectors, whose ``image_size`` resizes every image anyway, also accept
    lists of different sizes). Items of a list may also be image file paths (``str``
    or ``pathlib.Path``; read with Pillow, then as PIL images); a 1-D object array or
    pandas Series of images or paths is taken as the list.

    This is the validation the detectors apply to their ``X`` (which also resize
    each image to ``image_size``); call it to see what a detector will see.

    Parameters
    ----------
    X : array-like, tensor, or list of PIL images, arrays or image file paths
        The images, in one of the layouts above.
    name : str, default="X"
        Name of the argument in error and warning messages.

    Returns
    -------
    Tensor of shape (n, 3, H, W)
        Contiguous float32 RGB images with values in [0, 1], on the CPU (floats
        as given; a contiguous float32 ``(n, 3, H, W)`` CPU tensor is returned
        without a copy: the result shares its storage, so in-place changes affect
        both; a tensor on another device is copied to the CPU, and the detectors
        move each batch to their ``device``).

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.anomaly.rad import check_images
    >>> gray = np.full((2, 8, 6), 255, dtype=np.uint8)           # (n, H, W) uint8
    >>> images = check_images(gray)
    >>> tuple(images.shape), images.dtype, float(images.max())
    ((2, 3, 8, 6), torch.float32, 1.0)
    >>> tuple(check_images(np.zeros((2, 8, 6, 3))).shape)       # channels-last
    (2, 3, 8, 6)
    """
    return _unit_rgb(_validate_images(X, name)[0])
