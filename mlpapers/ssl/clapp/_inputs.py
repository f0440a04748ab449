"""Input checks of the encoders that need more than ``check_tensor``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _reject_flat_pixels(X: Any, owner: str, fitted_shape=None) -> None:
    """A ``ValueError`` saying how to reshape a 2D table of flattened images
    (to ``fitted_shape`` (C, H, W), the images of the fit, when given)."""
    shape = getattr(X, "shape", None)
    if shape is None and isinstance(X, (list, tuple)):
        try:
            shape = np.shape(X)
        except ValueError:  # ragged: check_tensor explains
            return
    if shape is None or len(shape) != 2:
        return
    n, d = (int(v) for v in shape)
    side = math.isqrt(d)
    if fitted_shape is not None and math.prod(fitted_shape) == d:
        eg = f"X.reshape({n}, {', '.join(str(v) for v in fitted_shape)})"
    elif side * side == d:
        eg = f"X.reshape({n}, 1, {side}, {side})"
    else:
        eg = "X.reshape(n, C, H, W)"
    raise ValueError(f"X has shape {(n, d)}, a table of rows: {owner} takes images, (n, H, W) "
                     f"or (n, C, H, W). For one (H, W) image pass X[None]; with one flattened "
                     f"image per row, reshape flattened images first, e.g. {eg}.")
