"""Type aliases of the public signatures (annotations only: nothing here runs checks)."""

from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
import torch

#: What the estimators accept as data: anything ``numpy.asarray`` takes, or a tensor
#: (kept on its device where the estimator computes there).
ArrayLike: TypeAlias = npt.ArrayLike | torch.Tensor

#: What the dataset generators take as ``random_state`` (see ``check_random_state``).
RandomStateLike: TypeAlias = (int | np.integer | np.random.RandomState | np.random.Generator
                               | None)

#: A function type kept by the decorators (so a decorated ``fit`` still returns ``Self``).
F = TypeVar("F", bound=Callable[..., Any])

#: A module type kept by the helpers that initialise a module in place.
M = TypeVar("M", bound=torch.nn.Module)
