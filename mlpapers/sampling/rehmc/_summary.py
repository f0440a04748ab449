"""``SampleSummary``: the per-dimension table of :meth:`SampleResult.summary`.

A plain ``dict`` (the keys and arrays it always had) that prints as a table, one row per
dimension, in the spirit of NumPyro's ``print_summary`` and ArviZ's ``az.summary``, and
converts to a pandas ``DataFrame`` with :meth:`SampleSummary.to_frame`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

__all__ = ["PER_DIM_KEYS", "SampleSummary", "check_names"]

# (key, column header) of the per-dimension entries, in table order
PER_DIM_KEYS = (("mean", "mean"), ("sd", "sd"), ("q5", "5%"), ("median", "50%"),
                ("q95", "95%"), ("ess_bulk", "ess_bulk"), ("ess_tail", "ess_tail"),
                ("rhat", "r_hat"))
# (key, label) of the sampler-level figures printed under the table
_FOOTER = (("accept_rate", "accept rate"), ("n_divergent", "divergent"),
           ("reflections_per_step", "reflections/step"), ("kept_fraction", "kept fraction"),
           ("mean_leapfrog", "mean leapfrog steps"))
MAX_ROWS = 50  # longer tables print their first and last MAX_ROWS // 2 rows


def check_names(names, d: int, default: list[str]) -> list[str]:
    """``names`` as a list of ``d`` distinct strings (``default`` when ``None``).

    Any iterable of labels is accepted (a list, a tuple, a numpy array, a pandas
    ``Index`` or ``Series``, ``dict.keys()``, ...), except a single string.

    Raises
    ------
    TypeError
        If ``names`` is a single string (or bytes) or not iterable.
    ValueError
        If it is not one-dimensional, does not hold ``d`` labels, or repeats a label.
    """
    if names is None:
        return default
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a sequence of {d} strings (one per dimension), "
                        f"got {type(names).__name__}.")
    arr = np.asarray(names if isinstance(names, np.ndarray) else list(names), dtype=object)
    if arr.ndim != 1:
        raise ValueError(f"names must be one-dimensional (one label per dimension), got "
                         f"shape {arr.shape}.")
    labels = [str(n) for n in arr]
    if len(labels) != d:
        raise ValueError(f"names has {len(labels)} entries but the draws have {d} dimensions.")
    dup = sorted(n for n, k in Counter(labels).items() if k > 1)
    if dup:
        raise ValueError(f"names must be distinct (ArviZ cannot label repeated "
                         f"coordinates): {', '.join(map(repr, dup))} repeated.")
    return labels


def _fmt(v: float, sci: bool = False, integer: bool = False) -> str:
    if not np.isfinite(v):
        return str(v)
    if integer:
        return f"{v:.0f}"
    return f"{v:.2e}" if sci else f"{v:.3f}"


def _column(values: np.ndarray, integer: bool = False) -> list[str]:
    """One format per column (as a table reads): fixed 3 decimals, or scientific when
    the column's largest finite magnitude is below 1e-2 or at least 1e5."""
    v = np.asarray(values, dtype=float)
    fin = np.abs(v[np.isfinite(v)])
    big = float(fin.max()) if fin.size else 1.0
    sci = big != 0 and (big < 1e-2 or big >= 1e5)
    return [_fmt(float(x), sci=sci, integer=integer) for x in v]


class SampleSummary(dict):
    """Result of :meth:`SampleResult.summary`: a ``dict`` that prints as a table.

    Keys ``mean``, ``sd``, ``q5``, ``median``, ``q95`` (equal-tailed 90% interval),
    ``ess_bulk``, ``ess_tail`` and ``rhat`` hold arrays of shape ``(d,)``;
    ``accept_rate``, ``n_divergent``, ``reflections_per_step``, ``kept_fraction`` and
    ``mean_leapfrog`` are sampler-level numbers, printed under the table.

    Parameters
    ----------
    data : dict
        The entries above (the per-dimension arrays and the sampler-level
        numbers), as :meth:`SampleResult.summary` computes them.
    names : list of str
        One row label per dimension.

    Attributes
    ----------
    names : list of str
        Row labels (``x[0]``, ``x[1]``, ... unless ``names`` was passed).

    Examples
    --------
    >>> from mlpapers.sampling import Box, ReflectiveHMC
    >>> res = ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box([-1, -1], [1, 1]),
    ...                     n_leapfrog=5, random_state=0).sample(100, n_chains=2, warmup=100)
    >>> summary = res.summary(names=["a", "b"])
    >>> summary.names, summary["mean"].shape
    (['a', 'b'], (2,))
    >>> print(summary)  # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
         mean     sd  ...  r_hat
    a  ...
    b  ...
    <BLANKLINE>
    accept rate ...
    """

    def __init__(self, data: dict, names: list[str]):
        super().__init__(data)
        self.names = list(names)

    def to_frame(self):
        """The per-dimension entries as a ``pandas.DataFrame`` indexed by ``names``.

        Returns
        -------
        pandas.DataFrame of shape (d, 8)
            Columns ``mean``, ``sd``, ``5%``, ``50%``, ``95%``, ``ess_bulk``,
            ``ess_tail`` and ``r_hat`` (as printed), index ``parameter``.

        Raises
        ------
        ImportError
            If pandas is not installed.
        """
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - optional
            raise ImportError("SampleSummary.to_frame needs pandas: pip install pandas") from exc
        return pd.DataFrame({col: np.asarray(self[key]) for key, col in PER_DIM_KEYS},
                            index=pd.Index(self.names, name="parameter"))

    def __str__(self) -> str:
        cols = [col for _, col in PER_DIM_KEYS]
        cells = [_column(self[key], integer=key.startswith("ess")) for key, _ in PER_DIM_KEYS]
        rows = [list(r) for r in zip(*cells)]
        names = list(self.names)
        if len(rows) > MAX_ROWS + 1:  # "(1 more)" would take the row's place
            h = MAX_ROWS // 2
            skipped = len(rows) - 2 * h
            rows = rows[:h] + [["..."] * len(cols)] + rows[-h:]
            names = names[:h] + [f"({skipped} more)"] + names[-h:]
        wn = max([len(n) for n in names] + [1])
        widths = [max([len(c)] + [len(r[j]) for r in rows]) for j, c in enumerate(cols)]
        lines = [" " * wn + "  " + "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
        for n, r in zip(names, rows):
            lines.append(n.ljust(wn) + "  " + "  ".join(v.rjust(w) for v, w in zip(r, widths)))
        footer = ", ".join(
            f"{label} {self[key] if key == 'n_divergent' else f'{float(self[key]):.4g}'}"
            for key, label in _FOOTER if key in self)
        return "\n".join(lines + ["", footer])

    def __repr__(self) -> str:
        return self.__str__()

    def _repr_pretty_(self, p, cycle) -> None:  # IPython / Jupyter
        p.text(self.__str__())

    def __reduce__(self):  # pickle with the names (a dict subclass's attributes are lost)
        return (SampleSummary, (dict(self), self.names))
