"""PyTorch's default layer initialisation, drawn from a private generator.

``nn.Linear(...)`` and ``nn.Conv2d(...)`` initialise themselves from torch's global RNG,
which every thread shares: a fit seeding it (even in a ``fork_rng``) changes the
caller's stream and races with other threads. These helpers draw the same values from
an estimator's own ``torch.Generator`` instead.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mlpapers._utils._typing import M

_DEFAULT_INIT_LAYERS = (nn.Linear, nn.modules.conv._ConvNd)


def default_init_(module: M, generator: torch.Generator | None = None) -> M:
    """Re-draw every ``nn.Linear``/``nn.Conv*`` of ``module`` as its ``reset_parameters`` does.

    The layers are visited in ``module.modules()`` order; each weight is drawn by
    ``kaiming_uniform_(a=sqrt(5))`` and each bias uniformly in ``±1/sqrt(fan_in)``, from
    ``generator`` (``None``: torch's global RNG). With a generator seeded by ``s``
    these are the values the layers get when built after ``torch.manual_seed(s)``.
    Returns ``module``.
    """
    with torch.no_grad():
        for layer in module.modules():
            if not isinstance(layer, _DEFAULT_INIT_LAYERS):
                continue
            nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
            if layer.bias is not None:
                fan_in = math.prod(layer.weight.shape[1:])  # (torch's fan-in, 0 outputs too)
                bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
                nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return module


def seeded_linear(in_features: int, out_features: int, *, bias: bool = True,
                  generator: torch.Generator | None = None,
                  dtype: torch.dtype | None = torch.float32) -> nn.Linear:
    """``nn.Linear(in_features, out_features, bias=bias, dtype=dtype)``, initialised from
    ``generator`` without drawing from the global RNG (``None``: exactly ``nn.Linear``).

    ``dtype=None`` follows torch's default dtype, as ``nn.Linear`` does. With a
    generator the layer is made on the generator's device.
    """
    if generator is None:
        return nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    # on the generator's device, where it draws (skip_init's own default is the CPU)
    layer = nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, dtype=dtype,
                               device=generator.device)
    return default_init_(layer, generator)
