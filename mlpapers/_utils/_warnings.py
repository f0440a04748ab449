"""Warnings that point at the user's code."""

from __future__ import annotations

import os
import sys
from types import FrameType

__all__ = ["user_stacklevel"]

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
