"""Warnings that point at the user's code."""

from __future__ import annotations

import math
import os
import sys
import warnings
from types import FrameType
from typing import Any

from sklearn.exceptions import ConvergenceWarning

__all__ = ["user_stacklevel", "warn_if_worse_than_constant"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` issued by the calling function, such that
    the warning points at the first frame outside the mlpapers package (the user's
    call), however deep inside the package the warning is raised."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def warn_if_worse_than_constant(estimator: Any, final: float, reference: float, *,
                                loss: str, reference_name: str, learner: str,
                                advice: str) -> None:
    """``ConvergenceWarning`` when the ``final`` loss is more than twice ``reference``,
    the loss of the best constant predictor: the model did not learn (the steps could
    not reach the data's units). A reference of 0 gives no scale to judge by, and an
    infinite loss (float32 overflow) is reported by the fits' own checks."""
    if reference > 0 and math.isfinite(final) and final > 2.0 * reference:
        warnings.warn(
            f"{type(estimator).__name__}: the {loss} ({final:.4g}) is more than twice "
            f"that of a constant predictor ({reference:.4g}, {reference_name}): "
            f"{learner} did not learn. {advice}",
            ConvergenceWarning, stacklevel=user_stacklevel())
