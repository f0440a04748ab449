"""VGG-like convolutional blocks without BatchNorm, trained block by block.

An architecture is a sequence of blocks; a block is a sequence of layer codes:
an ``int`` is a 3x3 convolution (padding 1) to that many channels followed by a
ReLU, ``"M"`` a 2x2 max-pool. Each block is one locally trained unit: in local
mode its input is ``detach()``-ed, so no gradient crosses block boundaries.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlpapers._utils import default_init_
from mlpapers._utils._typing import M

__all__ = ["ARCHITECTURES", "VGGEncoder", "check_architecture", "pool_representations"]

#: Named architectures. ``"vgg6"`` is the paper's 6-block STL-10/CIFAR encoder.
ARCHITECTURES: dict[str, list[tuple]] = {
    "small": [(32,), (64, "M"), (64,), (128, "M")],
    "tiny": [(16,), (32, "M"), (64, "M")],
    "vgg6": [(128,), (256, "M"), (256,), (512, "M"), (1024, "M"), (1024, "M")],
}


def check_architecture(architecture) -> list[tuple]:
    """Validate an architecture (a name or a list of blocks); return the block list."""
    if isinstance(architecture, str):
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)} or a list "
                             f"of blocks, got {architecture!r}.")
        return [tuple(b) for b in ARCHITECTURES[architecture]]
    if not isinstance(architecture, Sequence) or len(architecture) == 0:
        raise ValueError("architecture must be a non-empty list of blocks such as "
                         f"[(32,), (64, 'M')], got {architecture!r}.")
    blocks = []
    for block in architecture:
        if isinstance(block, (numbers.Integral, str)):
            block = (block,)
        elif not isinstance(block, Iterable):
            raise ValueError("architecture must be a list of blocks, each a sequence of "
                             f"channel counts and 'M', got the block {block!r}.")
        block = tuple(block)
        n_conv = 0
        for code in block:
            if isinstance(code, (bool, np.bool_)) or not (
                (isinstance(code, str) and code == "M")
                or (isinstance(code, numbers.Integral) and int(code) > 0)
            ):
                raise ValueError("architecture entries must be positive ints (conv channels) "
                                 f"or 'M' (max-pool), got {code!r} in block {block!r}.")
            n_conv += not isinstance(code, str)
        if n_conv == 0:
            raise ValueError(f"every block needs at least one convolution, got {block!r}.")
        # plain ints (numpy integers, e.g. from np.arange, are accepted): the block list
        # is stored in saved files and compared
        blocks.append(tuple(code if isinstance(code, str) else int(code) for code in block))
    return blocks


class VGGEncoder(nn.Module):
    """Stack of conv blocks returning every block's output map.

    Parameters
    ----------
    in_channels : int
        Channels of the input images.
    blocks : list of tuple
        Validated architecture (see :func:`check_architecture`).
    generator : torch.Generator, optional
        Seeds the (PyTorch-default) initialisation without the global RNG.

    Notes
    -----
    The parameters are float32 whatever ``torch.get_default_dtype()`` is (the estimators
    validate images to float32), and building the network never draws from the global
    torch RNG (the layers are made on the ``meta`` device, then initialised from
    ``generator``).
    """

    def __init__(self, in_channels: int, blocks: list[tuple],
                 generator: torch.Generator | None = None):
        super().__init__()
        mods: list[nn.Sequential] = []
        c = in_channels
        for block in blocks:
            layers: list[nn.Module] = []
            for code in block:
                if code == "M":
                    layers.append(nn.MaxPool2d(2))
                else:
                    layers += [nn.Conv2d(c, code, 3, padding=1, **_META), nn.ReLU()]
                    c = code
            mods.append(nn.Sequential(*layers))
        self.blocks = nn.ModuleList(mods)
        self.channels = [next(m.out_channels for m in reversed(b) if isinstance(m, nn.Conv2d))
                         for b in mods]
        self.downsample = [sum(code == "M" for code in b) for b in blocks]
        materialize(self, generator)

    def forward(self, x: torch.Tensor, detach: bool = True) -> list[torch.Tensor]:
        """Return the output map of every block.

        Parameters
        ----------
        x : Tensor of shape (N, C, H, W)
        detach : bool, default=True
            Detach each block's input (layer-local learning).

        Returns
        -------
        list of Tensor, entry l of shape (N, C_l, H_l, W_l)
        """
        outs = []
        for block in self.blocks:
            x = block(x.detach() if detach else x)
            outs.append(x)
        return outs

    def map_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """Spatial size of every block's output for an input of ``height x width``."""
        sizes = []
        for k in self.downsample:
            for _ in range(k):
                height, width = height // 2, width // 2
            sizes.append((height, width))
        return sizes


#: Factory arguments of the library's layers: float32 whatever the caller's default dtype
#: (under float64 the convolutions failed on the float32 images, under float16 they lost
#: precision), on the ``meta`` device so that construction does not draw its throwaway
#: initialisation from the global torch RNG (:func:`materialize` then initialises them).
_META: dict[str, Any] = {"device": "meta", "dtype": torch.float32}


def linear(in_features: int, out_features: int) -> nn.Linear:
    """A bias-free ``nn.Linear`` built as the encoders' layers are (float32, meta device):
    pass the module holding it through :func:`materialize`."""
    return nn.Linear(in_features, out_features, bias=False, **_META)




def materialize(module: M, generator: torch.Generator | None) -> M:
    """Allocate a module built with ``_META`` on the CPU and initialise it from
    ``generator`` (PyTorch's default initialisation); returns ``module``."""
    module.to_empty(device="cpu")
    default_init_(module, generator)
    return module


def pool_representations(maps: Sequence[torch.Tensor], grids: Sequence[int]
                         ) -> list[torch.Tensor]:
    """Average-pool every map to a ``g x g`` grid and flatten it.

    Parameters
    ----------
    maps : list of Tensor of shape (N, C_l, H_l, W_l)
    grids : list of int
        Grid side per map; ``1`` is the global average.

    Returns
    -------
    list of Tensor of shape (N, C_l * g_l * g_l)
        Channel-major flattening: feature ``c * g * g + i * g + j``.
    """
    out = []
    for h, g in zip(maps, grids):
        p = h.mean(dim=(2, 3)) if g == 1 else F.adaptive_avg_pool2d(h, g).flatten(1)
        out.append(p)
    return out
