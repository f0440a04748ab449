"""Class labels as indices into the classes a fit saw."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def encode_labels(y: Any, classes: np.ndarray, *, name: str = "y", seen_in: str = "fit",
                  device: str | torch.device | None = None) -> torch.Tensor:
    """Positions of the labels ``y`` in the sorted ``classes``, as a long tensor on
    ``device``.

    A label outside ``classes`` raises ``ValueError("{name} contains labels not seen in
    {seen_in}: [...]")`` (up to five of them): ``np.searchsorted`` alone would map it
    to a neighbouring class, silently.
    """
    y = np.asarray(y)
    unseen = ~np.isin(y, classes)
    if unseen.any():
        raise ValueError(f"{name} contains labels not seen in {seen_in}: "
                         f"{np.unique(y[unseen])[:5]}.")
    return torch.as_tensor(np.searchsorted(classes, y), dtype=torch.long, device=device)
