"""SimCLR-style image augmentations in plain torch (no torchvision), vectorised per batch.

Every random draw comes from the ``torch.Generator`` passed in (the estimator's),
so two fits with the same ``random_state`` see the same views. The draws are float32
whatever ``torch.get_default_dtype()`` is: a float64 draw consumes the generator
differently, so a caller's default dtype changed every crop.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from mlpapers._utils import on_inputs_device, seeded_global_rng, wrap_public_methods
from mlpapers._utils._modules import module_behind

__all__ = ["DefaultAugment"]


def _rand(n: int | tuple[int, ...], gen: torch.Generator | None) -> torch.Tensor:
    return torch.rand(n, generator=gen, dtype=torch.float32)


def _uniform(n: int | tuple[int, ...], low: float, high: float,
             gen: torch.Generator | None) -> torch.Tensor:
    return low + (high - low) * _rand(n, gen)


def _check_batch(x: Any, generator: Any) -> None:
    """Refuse what the augmentation cannot read: ``x`` must be a float ``(N, C, H, W)``
    tensor with ``N >= 1``, ``generator`` a ``torch.Generator`` or ``None``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"DefaultAugment: x must be a torch.Tensor of images (N, C, H, W), "
                        f"got {type(x).__name__} (convert with torch.as_tensor).")
    if x.ndim != 4 or 0 in x.shape:
        raise ValueError(f"DefaultAugment: x must be a non-empty (N, C, H, W) batch of "
                         f"images, got shape {tuple(x.shape)}.")
    if not x.is_floating_point():
        raise TypeError(f"DefaultAugment: x must hold float images, got {x.dtype} (convert "
                        "8-bit pixels with x.float() / 255).")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"DefaultAugment: generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}.")


def _luma(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma of RGB images ``(N, 3, H, W)``, shape ``(N, 1, H, W)``."""
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype, device=x.device)
    return (x * weights.view(1, 3, 1, 1)).sum(1, keepdim=True)


# torchvision's RandomResizedCrop draws up to 10 (area, ratio) pairs per image and keeps
# the first crop that fits in the image
_CROP_TRIES = 10


class DefaultAugment:
    """Random resized crop, horizontal flip, intensity jitter, grayscale and blur.

    The paper's recipe (SimCLR's), applied independently to each image of a batch
    ``(N, C, H, W)``: random resized crop (area fraction in ``scale``, aspect
    ratio in ``ratio``, resampled bilinearly to the input size) with a horizontal
    flip of probability ``flip``; with probability ``jitter_p`` brightness,
    contrast and (for 3-channel images) saturation jitter of strengths
    ``jitter``; grayscale with probability ``gray_p`` (3-channel images only);
    Gaussian blur with probability ``blur_p``, sigma in ``sigma`` and a kernel of
    about 10% of the image side.

    Parameters
    ----------
    scale : (float, float), default=(0.25, 1.0)
        Crop area range (the paper's CIFAR setting; STL-10 uses 0.08).
    ratio : (float, float), default=(3/4, 4/3)
        Aspect ratio (width / height) range of the crop, drawn log-uniformly.
    flip : float, default=0.5
        Probability of a horizontal flip.
    jitter : (float, float, float), default=(0.8, 0.8, 0.8)
        Brightness, contrast, saturation strengths (hue is not jittered): each
        factor is drawn uniformly in ``[max(0, 1 - s), 1 + s]``.
    jitter_p : float, default=0.8
        Probability that an image is jittered (one draw switches all three factors
        together, as ``RandomApply`` of a colour jitter in the paper's recipe).
    gray_p : float, default=0.2
        Probability of converting a 3-channel image to grayscale (ITU-R 601
        luma, kept on three channels).
    blur_p : float, default=0.5
        Probability of the Gaussian blur.
    sigma : (float, float), default=(0.1, 2.0)
        Range of the blur's standard deviation, in pixels, drawn uniformly.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.ssl.clapp import DefaultAugment
    >>> aug = DefaultAugment()
    >>> aug(torch.rand(4, 1, 16, 16), torch.Generator().manual_seed(0)).shape
    torch.Size([4, 1, 16, 16])
    """

    def __init__(self, *, scale: tuple[float, float] = (0.25, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: float = 0.5,
                 jitter: tuple[float, float, float] = (0.8, 0.8, 0.8), jitter_p: float = 0.8,
                 gray_p: float = 0.2, blur_p: float = 0.5,
                 sigma: tuple[float, float] = (0.1, 2.0)) -> None:
        self.scale = scale
        self.ratio = ratio
        self.flip = flip
        self.jitter = jitter
        self.jitter_p = jitter_p
        self.gray_p = gray_p
        self.blur_p = blur_p
        self.sigma = sigma

    @classmethod
    def light(cls) -> DefaultAugment:
        """Milder settings for small centred-object images such as digits.

        No flip (digits are not mirror-symmetric), crops of at least half the
        area, jitter strength 0.4 and blur probability 0.2.

        Returns
        -------
        DefaultAugment
            ``DefaultAugment(scale=(0.5, 1.0), flip=0.0, jitter=(0.4, 0.4, 0.4),
            blur_p=0.2)``, the other settings at their defaults.
        """
        return cls(scale=(0.5, 1.0), flip=0.0, jitter=(0.4, 0.4, 0.4), blur_p=0.2)

    def __repr__(self) -> str:
        return (f"DefaultAugment(scale={self.scale}, ratio={self.ratio}, flip={self.flip}, "
                f"jitter={self.jitter}, jitter_p={self.jitter_p}, gray_p={self.gray_p}, "
                f"blur_p={self.blur_p}, sigma={self.sigma})")

    @on_inputs_device
    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
        """Augment a batch.

        Parameters
        ----------
        x : Tensor of shape (N, C, H, W)
            Float images (any device; the draws are made on the CPU).
        generator : torch.Generator, optional
            CPU generator for every random draw (``None``: the global torch RNG).

        Returns
        -------
        Tensor of shape (N, C, H, W)
            :meth:`crop_flip`, then :meth:`color`, then :meth:`blur`.
        """
        self._check_params()
        # the public steps (a subclass may override one); each checks the settings again,
        # which costs nothing beside the images' work
        x = self.crop_flip(x, generator)
        x = self.color(x, generator)
        return self.blur(x, generator)

    def _check_params(self) -> None:
        """Refuse settings that would draw silently wrong views (e.g. a reversed
        ``ratio`` read as (min, max), a zero-area crop, a probability above 1)."""
        def number(value):  # Python, numpy and 0-d torch numbers alike
            out = float(value)
            if not math.isfinite(out):
                raise ValueError
            return out

        def pair(name):  # (scale, ratio and sigma are all positive)
            value = getattr(self, name)
            try:
                lo, hi = (number(v) for v in value)
            except (TypeError, ValueError):
                raise ValueError(f"DefaultAugment: {name} must be a (min, max) pair of "
                                 f"finite numbers, got {value!r}.") from None
            if not 0 < lo <= hi:
                raise ValueError(f"DefaultAugment: {name} must be (min, max) with "
                                 f"0 < min <= max, got {value!r}.")

        pair("scale")
        pair("ratio")
        for name in ("flip", "jitter_p", "gray_p", "blur_p"):
            value = getattr(self, name)
            try:
                ok = 0 <= number(value) <= 1
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"DefaultAugment: {name} must be a probability in [0, 1], "
                                 f"got {value!r}.")
        if number(self.blur_p) > 0:  # the blur's sigma only matters when it can blur
            pair("sigma")
        try:
            strengths = [number(v) for v in self.jitter]
        except (TypeError, ValueError):
            strengths = []
        if len(strengths) != 3 or min(strengths) < 0:
            raise ValueError("DefaultAugment: jitter must be three strengths >= 0 "
                             f"(brightness, contrast, saturation), got {self.jitter!r}.")

    # -- pieces ---------------------------------------------------------------
    def crop_flip(self, x: torch.Tensor, gen) -> torch.Tensor:
        """Random resized crop and horizontal flip of each image.

        Parameters
        ----------
        x : Tensor of shape (N, C, H, W)
            Float images.
        gen : torch.Generator or None
            CPU generator of the draws (``None``: the global torch RNG).

        Returns
        -------
        Tensor of shape (N, C, H, W)
            Each image's crop (area fraction in ``scale``, aspect ratio in
            ``ratio``), resampled bilinearly to ``H x W``, flipped with
            probability ``flip``. As torchvision's ``RandomResizedCrop``, up to 10
            draws are tried and the first crop that fits in the image is kept; if
            none fits, the centre crop of the largest size whose aspect ratio is the
            image's clipped to ``ratio``.
        """
        self._check_params()
        _check_batch(x, gen)
        n = x.shape[0]
        area = _uniform((n, _CROP_TRIES), *self.scale, gen)
        log_r = _uniform((n, _CROP_TRIES), math.log(self.ratio[0]),
                         math.log(self.ratio[1]), gen)
        r = torch.exp(log_r)
        # crop sides as fractions of the image's width and height: in pixels the crop is
        # sqrt(area*H*W*r) wide and sqrt(area*H*W/r) high (torchvision's definition), so
        # its aspect ratio is r also when H != W (area*r alone would scale it by W/H)
        height, width = x.shape[-2:]
        w_try = torch.sqrt(area * r * (height / width))
        h_try = torch.sqrt(area / r * (width / height))
        fits = (w_try <= 1) & (h_try <= 1)
        first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)   # first fitting try
        found = fits.any(dim=1)
        # no fit: centre crop at the image's aspect ratio clipped to the ratio range
        in_ratio = width / height
        fw = min(1.0, max(self.ratio[0], min(in_ratio, self.ratio[1])) / in_ratio)
        fh = min(1.0, in_ratio / max(self.ratio[0], min(in_ratio, self.ratio[1])))
        w = torch.where(found, w_try.gather(1, first)[:, 0], torch.tensor(fw))
        h = torch.where(found, h_try.gather(1, first)[:, 0], torch.tensor(fh))
        cx = (1 - w) * (2 * _rand(n, gen) - 1) * found   # centre in [-1, 1] coords
        cy = (1 - h) * (2 * _rand(n, gen) - 1) * found
        sign = torch.where(_rand(n, gen) < self.flip, -1.0, 1.0).to(torch.float32)
        theta = torch.zeros(n, 2, 3, dtype=torch.float32)
        theta[:, 0, 0] = w * sign
        theta[:, 0, 2] = cx
        theta[:, 1, 1] = h
        theta[:, 1, 2] = cy
        theta = theta.to(device=x.device, dtype=x.dtype)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border",
                             align_corners=False)

    def color(self, x: torch.Tensor, gen) -> torch.Tensor:
        """Brightness, contrast and saturation jitter, then random grayscale.

        Parameters
        ----------
        x : Tensor of shape (N, C, H, W)
            Float images; saturation and grayscale apply to ``C = 3`` only.
        gen : torch.Generator or None
            CPU generator of the draws (``None``: the global torch RNG).

        Returns
        -------
        Tensor of shape (N, C, H, W)
            The jittered images (not clipped: values may leave [0, 1]).
        """
        self._check_params()
        _check_batch(x, gen)
        n, c = x.shape[:2]

        # one switch per image for the whole jitter, as torchvision's
        # RandomApply([ColorJitter], p) in the paper's recipe (not one per factor)
        on = _rand(n, gen) < self.jitter_p

        def draw(strength):
            f = _uniform(n, max(0.0, 1 - strength), 1 + strength, gen)
            return torch.where(on, f, torch.ones(n, dtype=torch.float32)).to(
                x.device, x.dtype).view(n, 1, 1, 1)

        b, k, s = (draw(v) for v in self.jitter)
        x = x * b
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = (x - mean) * k + mean
        if c == 3:
            gray = _luma(x)
            x = (x - gray) * s + gray
            to_gray = (_rand(n, gen) < self.gray_p).to(x.device).view(n, 1, 1, 1)
            x = torch.where(to_gray, _luma(x).expand_as(x), x)   # luma of the saturated x
        return x

    def blur(self, x: torch.Tensor, gen) -> torch.Tensor:
        """Separable Gaussian blur of each image with probability ``blur_p``.

        Parameters
        ----------
        x : Tensor of shape (N, C, H, W)
            Float images.
        gen : torch.Generator or None
            CPU generator of the draws (``None``: the global torch RNG).

        Returns
        -------
        Tensor of shape (N, C, H, W)
            Blurred images (sigma drawn in ``sigma``, an odd kernel of about 10%
            of the smaller side, at least 3, replicate padding) or the input.
        """
        self._check_params()
        _check_batch(x, gen)
        n, c, height, width = x.shape
        if float(self.blur_p) == 0:
            # nothing is blurred, and sigma may be unset: the same draws as a blur that
            # never fires, so that the generator's stream does not depend on sigma
            _rand(n, gen), _rand(n, gen)
            return x.clone()
        k = max(3, int(0.1 * min(height, width)) // 2 * 2 + 1)
        sig = _uniform(n, *self.sigma, gen)
        on = _rand(n, gen) < self.blur_p
        t = torch.arange(k, dtype=torch.float32) - (k - 1) / 2
        ker = torch.exp(-0.5 * (t[None] / sig[:, None]) ** 2)
        ker = ker / ker.sum(1, keepdim=True)                   # (n, k)
        ker = ker.to(x.device, x.dtype).repeat_interleave(c, 0)  # (n*c, k)
        y = x.reshape(1, n * c, height, width)
        y = F.pad(y, (k // 2, k // 2, k // 2, k // 2), mode="replicate")
        y = F.conv2d(y, ker.view(n * c, 1, k, 1), groups=n * c)
        y = F.conv2d(y, ker.view(n * c, 1, 1, k), groups=n * c)
        y = y.view(n, c, height, width)
        return torch.where(on.to(x.device).view(n, 1, 1, 1), y, x)


# crop_flip, color and blur compute where the images are, as __call__ does
wrap_public_methods(DefaultAugment, on_inputs_device)


# mixed into the estimator generator's seed for the stream of the augment seeds, so that
# it differs from the generator's own stream
_SEED_SALT = 0x5DEECE66D


_GENERATOR_NAMES = ("generator", "gen", "g", "rng")


def takes_generator(fn: Callable) -> bool:
    """Whether ``fn`` is called ``fn(x, generator)`` (else ``fn(x)``).

    The generator is passed when the signature has a second positional parameter
    without a default, or one named like a generator (``generator``, ``gen``, ``g``,
    ``rng``). A callable taking one argument (a function, an ``nn.Module`` with
    ``forward(x)``, a transform object) or ``(x, strength=0.1)`` gets the batch alone and
    draws from the global torch RNG, which :class:`UserAugment` seeds from
    ``random_state``. A signature that cannot be read (some builtins) counts as
    ``(x, generator)``, the documented form.
    """
    # a module's own signature is ``(*args, **kwargs)``: what it takes is its forward's
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return True
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        return True   # fn(*args): the documented two-argument form
    if len(positional) < 2:
        return False if positional else True   # no parameter: fails with the documented form
    second = positional[1]
    # an optional second parameter is the user's own knob (strength=0.1), not a generator
    return second.default is second.empty or second.name in _GENERATOR_NAMES


def binds_its_call(fn: Callable) -> bool:
    """Whether ``fn``'s signature takes the call :class:`UserAugment` makes (``(x,
    generator)`` or ``(x)``, see :func:`takes_generator`): a ``TypeError`` from such a
    call was raised inside ``fn``, not by the call itself. ``False`` when the
    signature cannot be read."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        inspect.signature(target).bind(*(("x", "generator") if takes_generator(fn) else ("x",)))
    except (TypeError, ValueError):
        return False
    return True


class UserAugment:
    """A user's ``augment(x, generator) -> x`` (or ``augment(x) -> x``) callable, called
    as the encoders promise.

    Each call gets its own copy of the batch (an augment that modifies its input in
    place would otherwise make the two views of a pair one tensor, or change the next
    view's input), and runs with the global torch RNG of the CPU (and of the batch's
    accelerator) forked and seeded from a stream derived from the estimator's
    generator: an augment drawing from ``torch.rand`` instead of ``generator`` is then
    reproducible under ``random_state`` and leaves the caller's global RNG as it was.
    The estimator's generator itself is not advanced by this (an augment that draws
    from it sees the same stream as before). An augment module runs in the mode it was
    given (dropout in it stays random), and its buffers (BatchNorm running statistics)
    are restored after each call.
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self._seeds: torch.Generator | None = None
        # the module behind the callable (itself, or the owner of a bound method): its
        # buffers are restored after each call, so that a BatchNorm in train mode
        # normalises with the batch as the user built it but does not accumulate
        # running statistics into the user's module
        self._module = module_behind(fn)
        self._with_generator = takes_generator(fn)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self._seeds is None:  # one stream per fit (a new UserAugment each fit)
            base = generator.initial_seed() if generator is not None else 0
            self._seeds = torch.Generator().manual_seed((base ^ _SEED_SALT) % 2 ** 63)
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=self._seeds))
        with seeded_global_rng(seed, x.device):
            buffers = [] if self._module is None else list(self._module.buffers())
            saved = [b.detach().clone() for b in buffers]
            try:
                if self._with_generator:
                    return self.fn(x.clone(), generator)
                return self.fn(x.clone())
            finally:
                with torch.no_grad():
                    for b, v in zip(buffers, saved):
                        b.copy_(v)
