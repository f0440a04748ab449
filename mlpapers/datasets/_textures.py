"""Procedural textures with pasted defects and pixel masks, for image anomaly detection."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Literal, TypeAlias, get_args

import numpy as np
from scipy.ndimage import gaussian_filter

from mlpapers._utils import RandomStateLike, check_positive, check_random_state

__all__ = ["make_texture_anomalies"]

#: ``make_texture_anomalies(textures=...)``: the procedural families (``TEXTURES``) and
#: the scikit-image photos (``SKIMAGE_TEXTURES``); ``source=`` and ``defects=`` likewise.
ProceduralTexture: TypeAlias = Literal["stripes", "checker", "grain", "bricks"]
SkimageTexture: TypeAlias = Literal["brick", "grass", "gravel"]
Texture: TypeAlias = Literal[ProceduralTexture, SkimageTexture]
Source: TypeAlias = Literal["procedural", "skimage"]
Defect: TypeAlias = Literal["scratch", "spot", "cutout"]
TEXTURES: tuple[ProceduralTexture, ...] = get_args(ProceduralTexture)
SKIMAGE_TEXTURES: tuple[SkimageTexture, ...] = get_args(SkimageTexture)
SOURCES: tuple[Source, ...] = get_args(Source)
DEFECTS: tuple[Defect, ...] = get_args(Defect)

# two-colour palette per texture family (RGB in [0, 1])
_PALETTES = {
    "stripes": ((0.20, 0.30, 0.55), (0.75, 0.80, 0.90)),
    "checker": ((0.45, 0.30, 0.15), (0.85, 0.70, 0.45)),
    "grain": ((0.25, 0.40, 0.15), (0.60, 0.75, 0.35)),
    "bricks": ((0.55, 0.20, 0.15), (0.80, 0.78, 0.72)),
}


def _pattern(name: str, size: int, rng: np.random.RandomState) -> np.ndarray:
    """A (size, size) intensity pattern in [0, 1] with a random per-image phase."""
    scale = size / 64.0
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    if name == "stripes":
        theta, period = np.deg2rad(30.0), 8.0 * scale
        phase = rng.uniform(0, 2 * np.pi)
        u = xx * np.cos(theta) + yy * np.sin(theta)
        return 0.5 + 0.5 * np.sin(2 * np.pi * u / period + phase)
    if name == "checker":
        period = 12.0 * scale
        px, py = rng.uniform(0, 2 * np.pi, size=2)
        s = np.sin(2 * np.pi * xx / period + px) * np.sin(2 * np.pi * yy / period + py)
        return 0.5 + 0.5 * np.tanh(3.0 * s)
    if name == "grain":
        field = gaussian_filter(rng.standard_normal((size, size)), sigma=1.5 * scale,
                                mode="wrap")
        field = (field - field.mean()) / (field.std() + 1e-12)
        return 1.0 / (1.0 + np.exp(-1.5 * field))
    if name == "bricks":
        bh, bw, mortar = 8.0 * scale, 16.0 * scale, max(1.0, 1.5 * scale)
        oy, ox = rng.uniform(0, bh), rng.uniform(0, bw)
        row = np.floor((yy + oy) / bh)
        x_shift = xx + ox + (row % 2) * bw / 2
        in_mortar = ((yy + oy) % bh < mortar) | (x_shift % bw < mortar)
        return np.where(in_mortar, 1.0, 0.15)
    raise ValueError(f"textures must be a subset of {list(TEXTURES)}, got {name!r}.")


def _colourise(pattern: np.ndarray, name: str) -> np.ndarray:
    c0, c1 = (np.asarray(c)[:, None, None] for c in _PALETTES[name])
    return c0 + (c1 - c0) * pattern[None]


@functools.cache
def _skimage_texture(name: str) -> np.ndarray:
    try:
        from skimage import data
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError("source='skimage' needs scikit-image (the 'data' extra): "
                          "pip install scikit-image; or use the procedural families "
                          f"{list(TEXTURES)} (source='procedural').") from exc
    return getattr(data, name)().astype(np.float64) / 255.0


def _texture_image(name: str, size: int, rng: np.random.RandomState) -> np.ndarray:
    if name in SKIMAGE_TEXTURES:
        # a random 2x-downsampled crop of the bundled 512x512 photo, grey on 3 channels;
        # from half the photo's size on, a random crop at full resolution (a 2x crop
        # would be the whole photo or one fixed corner: identical images)
        full = _skimage_texture(name)
        crop = 2 * size if 2 * size < full.shape[0] else size
        y0, x0 = rng.randint(0, full.shape[0] - crop + 1, size=2)
        patch = full[y0:y0 + crop, x0:x0 + crop]
        f = crop // size
        patch = patch[:f * size, :f * size].reshape(size, f, size, f).mean(axis=(1, 3))
        return np.repeat(patch[None], 3, axis=0) * rng.uniform(0.95, 1.05)
    img = _colourise(_pattern(name, size, rng), name)
    return img * rng.uniform(0.95, 1.05)  # global brightness jitter


def _defect(img: np.ndarray, name: str, kind: str, rng: np.random.RandomState):
    """Paste one defect; return (image, mask)."""
    size = img.shape[-1]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    cy, cx = rng.uniform(0.2 * size, 0.8 * size, size=2)
    colour = rng.uniform(0, 1, size=3)
    if kind == "scratch":
        theta = rng.uniform(0, np.pi)
        half_len = rng.uniform(0.15, 0.3) * size
        width = max(1.0, rng.uniform(0.015, 0.03) * size)
        dx, dy = np.cos(theta), np.sin(theta)
        along = (xx - cx) * dx + (yy - cy) * dy
        across = -(xx - cx) * dy + (yy - cy) * dx
        mask = (np.abs(along) <= half_len) & (np.abs(across) <= width / 2 + 0.5)
        alpha = 0.9
    elif kind == "spot":
        ry, rx = rng.uniform(0.05, 0.11, size=2) * size
        mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
        alpha = 0.85
    elif kind == "cutout":
        half = rng.uniform(0.07, 0.12) * size
        mask = (np.abs(yy - cy) <= half) & (np.abs(xx - cx) <= half)
        family = SKIMAGE_TEXTURES if name in SKIMAGE_TEXTURES else TEXTURES
        others = [t for t in family if t != name]
        colour = _texture_image(others[rng.randint(len(others))], size, rng)
        alpha = 1.0
    else:
        raise ValueError(f"defects must be a subset of {list(DEFECTS)}, got {kind!r}.")
    colour = np.broadcast_to(np.asarray(colour).reshape(3, *([1, 1] if np.ndim(colour) == 1
                                                             else [size, size])),
                             img.shape)
    out = np.where(mask[None], (1 - alpha) * img + alpha * colour, img)
    return out, mask


def _names(value, name: str) -> tuple:
    """A sequence of names as a tuple; one string counts as a one-name sequence."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, AbstractSet):
        # a set's order follows string hashing, which changes between processes: the
        # data (and what the texture indices mean) would not be reproducible
        raise TypeError(f"{name} must be an ordered sequence of strings (a list or tuple), "
                        f"got a {type(value).__name__}: its order decides the data drawn "
                        "and the texture indices returned.")
    try:
        return tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a string or a sequence of strings, "
                        f"got {value!r}.") from None


def make_texture_anomalies(
    n_train: int = 30,
    n_test: int = 40,
    *,
    image_size: int = 64,
    textures: Texture | Iterable[Texture] | None = None,
    source: Source | None = None,
    defects: Defect | Iterable[Defect] = DEFECTS,
    anomaly_ratio: float = 0.5,
    noise: float = 0.03,
    return_texture: bool = False,
    random_state: RandomStateLike = None,
) -> tuple[np.ndarray, ...]:
    """Normal and defective texture images with pixel masks (no download).

    With ``source="procedural"`` (numpy/scipy only) each image is a
    colour texture from one of four procedural families (``"stripes"``,
    ``"checker"``, ``"grain"`` -- a smoothed random field like gravel or grass --
    and ``"bricks"``) with a random phase/offset per image. With
    ``source="skimage"`` images are random crops (downsampled 2x) of the
    grayscale 512x512 ``"brick"``, ``"grass"`` and ``"gravel"`` photos bundled in
    scikit-image (the ``data`` extra; nothing is downloaded); sizes of 256 and
    above are random crops at full resolution, and at most 512 are possible. Every image gets a
    +-5% brightness jitter and Gaussian pixel noise. A fraction
    ``anomaly_ratio`` of the test images receives one defect: a thin
    ``"scratch"``, an elliptic ``"spot"`` of a foreign colour, or a square
    ``"cutout"`` filled with another texture family. Images are assigned to the
    families in turn, so ``len(textures) > 1`` gives the multi-class setting.

    Parameters
    ----------
    n_train : int, default=30
        Number of normal training images.
    n_test : int, default=40
        Number of test images.
    image_size : int, default=64
        Side of the square images (at least 16; at most 512 with
        ``source="skimage"``).
    textures : str, sequence of str or None, default=None
        Subset of the families of ``source`` (one name is a one-family
        subset); ``None`` uses all of them. Its order numbers the families of
        ``texture_*``, so a ``set`` (unordered) is refused.
    source : {"procedural", "skimage"} or None, default=None
        ``None`` picks the source from ``textures``: ``"skimage"`` when every
        name is one of the photos (``"brick"``, ``"grass"``, ``"gravel"``),
        else ``"procedural"`` (so ``textures=None`` gives the procedural
        families, which need no extra).
    defects : str or sequence of str, default=("scratch", "spot", "cutout")
        Kinds of defect drawn from (uniformly, one per defective image); a
        non-empty subset of the three kinds above (one name is a one-kind subset;
        ordered, a ``set`` is refused).
    anomaly_ratio : float in [0, 1], default=0.5
        Fraction of defective test images (rounded).
    noise : float, default=0.03
        Standard deviation of the pixel noise.
    return_texture : bool, default=False
        Also return the texture index of every image.
    random_state : int, RandomState, Generator or None, default=None
        Seeds the textures, the defects, the test order and the noise. ``None``
        draws from numpy's global ``RandomState`` (as scikit-learn's generators
        do); an int gives the same data on every call.

    Returns
    -------
    X_train : ndarray of shape (n_train, 3, image_size, image_size), float32
        Normal images in [0, 1].
    X_test : ndarray of shape (n_test, 3, image_size, image_size), float32
        Test images in [0, 1], normal and defective, the families in random order.
    y_test : ndarray of shape (n_test,), int64
        1 for defective images.
    mask_test : ndarray of shape (n_test, image_size, image_size), uint8
        1 on defect pixels (all zero for normal images).
    texture_train, texture_test : ndarray of shape (n_train,) and (n_test,), int64
        Index into ``textures`` (only with ``return_texture=True``).

    Examples
    --------
    >>> from mlpapers.datasets import make_texture_anomalies
    >>> X_train, X_test, y_test, mask = make_texture_anomalies(4, 6, image_size=32,
    ...                                                        random_state=0)
    >>> X_train.shape, X_test.shape, y_test.tolist(), mask.shape
    ((4, 3, 32, 32), (6, 3, 32, 32), [0, 1, 0, 1, 1, 0], (6, 32, 32))
    """
    check_positive(n_train, "n_train", integer=True)
    check_positive(n_test, "n_test", integer=True, strict=False)
    check_positive(image_size, "image_size", integer=True)
    if image_size < 16:
        raise ValueError(f"image_size must be >= 16, got {image_size}.")
    check_positive(noise, "noise", strict=False)
    check_positive(anomaly_ratio, "anomaly_ratio", strict=False)
    if not 0.0 <= anomaly_ratio <= 1.0:
        raise ValueError(f"anomaly_ratio must be in [0, 1], got {anomaly_ratio!r}.")
    if not isinstance(return_texture, bool | np.bool_):
        raise TypeError(f"return_texture must be a bool, got {return_texture!r}.")
    if source is None:
        # the photos' names select the photos: make_texture_anomalies(textures="brick")
        # is scikit-image's brick (the procedural family is "bricks"); everything else,
        # textures=None included, stays procedural (no extra needed)
        if textures is not None:
            textures = _names(textures, "textures")   # once: an iterator is read once
        source = ("skimage" if textures and all(t in SKIMAGE_TEXTURES for t in textures)
                  else "procedural")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {list(SOURCES)} or None, got {source!r}.")
    if source == "skimage" and image_size > 512:  # a crop cannot exceed the 512x512 photo
        raise ValueError(f"image_size must be <= 512 with source='skimage' (the photos are "
                         f"512x512), got {image_size}.")
    family = TEXTURES if source == "procedural" else SKIMAGE_TEXTURES
    textures = family if textures is None else _names(textures, "textures")
    defects = _names(defects, "defects")
    if not textures or any(t not in family for t in textures):
        hint = (f" (or of the photos {list(SKIMAGE_TEXTURES)}, with source='skimage' or "
                "None)" if source == "procedural" else "")
        raise ValueError(f"textures must be a non-empty subset of {list(family)} for "
                         f"source={source!r}{hint}, got {list(textures)}.")
    if not defects or any(d not in DEFECTS for d in defects):
        raise ValueError(f"defects must be a non-empty subset of {list(DEFECTS)}, "
                         f"got {list(defects)}.")
    rng = check_random_state(random_state)
    tex_train = np.arange(n_train) % len(textures)
    tex_test = rng.permutation(np.arange(n_test) % len(textures))
    y_test = np.zeros(n_test, dtype=np.int64)
    y_test[rng.permutation(n_test)[:int(round(anomaly_ratio * n_test))]] = 1

    def render(tex_idx):
        return np.stack([_texture_image(textures[t], image_size, rng) for t in tex_idx]) \
            if len(tex_idx) else np.zeros((0, 3, image_size, image_size))

    X_train = render(tex_train)
    X_test = render(tex_test)
    mask = np.zeros((n_test, image_size, image_size), dtype=np.uint8)
    for i in np.flatnonzero(y_test):
        kind = defects[rng.randint(len(defects))]
        X_test[i], m = _defect(X_test[i], textures[tex_test[i]], kind, rng)
        mask[i] = m
    if noise > 0:
        with np.errstate(over="ignore"):  # (+-inf near noise = 1e308: clipped to 0 or 1)
            X_train = X_train + noise * rng.standard_normal(X_train.shape)
            X_test = X_test + noise * rng.standard_normal(X_test.shape)
    X_train = np.clip(X_train, 0, 1).astype(np.float32)
    X_test = np.clip(X_test, 0, 1).astype(np.float32)
    out: tuple[np.ndarray, ...] = (X_train, X_test, y_test, mask)
    if return_texture:
        out = (*out, tex_train.astype(np.int64), tex_test.astype(np.int64))
    return out
