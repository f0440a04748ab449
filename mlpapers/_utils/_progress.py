"""A ``verbose``-aware tqdm progress bar that also records a history of metrics."""

from __future__ import annotations

import numbers
from typing import Any

from tqdm.auto import tqdm


class ProgressLogger:
    """Iterate with an optional progress bar and keep every logged metric.

    Parameters
    ----------
    total : int
        Number of steps (epochs, rounds, iterations).
    verbose : int or bool, default=0
        ``0`` (or less) hides the bar; anything else truthy shows it with the last
        metrics.
    desc : str, optional
        Label shown in front of the bar.

    Attributes
    ----------
    history : list of dict
        One dict per :meth:`log` call, in call order.

    Examples
    --------
    >>> from mlpapers._utils import ProgressLogger
    >>> log = ProgressLogger(3, verbose=0)
    >>> for step in log:
    ...     log.log(step=step, loss=1.0 / (step + 1))
    >>> [round(h["loss"], 2) for h in log.history]
    [1.0, 0.5, 0.33]
    """

    def __init__(self, total: int, verbose: int | bool = 0, desc: str | None = None):
        self.total = int(total)
        self.verbose = verbose
        self.desc = desc
        self.history: list[dict[str, Any]] = []
        self._bar: tqdm | None = None

    def __iter__(self):
        # leave=True: the bar's final metrics stay in the log when the loop ends
        self._bar = bar = tqdm(
            range(self.total), desc=self.desc, disable=not self._shows(), leave=True,
            dynamic_ncols=True,
        )
        try:
            yield from bar
        finally:
            bar.close()

    def _shows(self) -> bool:
        """Whether the bar is shown: a verbosity above 0 (a negative number, which the
        estimators refuse, hides it as 0 does, rather than showing it)."""
        v = self.verbose
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            return bool(v > 0)
        return bool(v)

    def log(self, **metrics: Any) -> None:
        """Record ``metrics`` and show the numeric ones on the bar."""
        self.history.append(dict(metrics))
        if self._bar is not None and not self._bar.disable:
            shown = {
                k: f"{v:.4g}" for k, v in metrics.items()
                if isinstance(v, numbers.Real) and not isinstance(v, bool)
            }
            self._bar.set_postfix(shown, refresh=False)

    def column(self, key: str) -> list[Any]:
        """Return the logged values of ``key``, skipping entries without it."""
        return [h[key] for h in self.history if key in h]
