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
    to a neighbouring class, silently. The cost is a binary search per label, whatever
    the number of classes (``partial_fit`` steps over millions of classes call it).
    """
    y = np.asarray(y)
    try:
        pos = np.clip(np.searchsorted(classes, y), 0, max(len(classes) - 1, 0))
        unseen = np.asarray(classes[pos] != y) if len(classes) else np.ones(y.shape, bool)
        if unseen.shape != y.shape:  # numpy could not compare elementwise
            raise TypeError
    except TypeError:  # labels numpy cannot order against the classes (None, mixed kinds)
        pos, unseen = None, ~np.isin(y, classes)
    if unseen.any():
        raise ValueError(f"{name} contains labels not seen in {seen_in}: "
                         f"{np.unique(y[unseen])[:5]}.")
    if pos is None:  # every label is a class, but not orderable: look them up
        index = {c: i for i, c in enumerate(classes.tolist())}
        pos = np.array([index[v] for v in y.ravel().tolist()], dtype=np.int64).reshape(y.shape)
    return torch.as_tensor(pos, dtype=torch.long, device=device)
