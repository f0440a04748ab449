"""Docstring fragments shared by several public methods, written once.

A docstring holds a placeholder line ``%(name)s`` (alone on its line); :func:`fill_doc`
replaces it by the fragment, indented as the placeholder. Sibling classes' methods
(e.g. the supports' ``contains``/``hit``) keep their own docstrings for numpydoc and
``help()`` while sharing the parameter entries they have in common.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")  # a function or a class

__all__ = ["fill_doc"]


def fill_doc(**fragments: str) -> Callable[[T], T]:
    """Decorator: replace each ``%(name)s`` line of the docstring by ``fragments[name]``.

    Parameters
    ----------
    **fragments : str
        Text of each fragment, without indentation (it is dedented, then indented as
        its placeholder line).

    Returns
    -------
    callable
        The decorator; it returns the function or class with its ``__doc__`` filled
        (left as is under ``python -OO``, where docstrings are stripped).

    Examples
    --------
    >>> from mlpapers._utils._docs import fill_doc
    >>> @fill_doc(x="x : int\\n    The input.")
    ... def f(x):
    ...     '''Identity.
    ...
    ...     Parameters
    ...     ----------
    ...     %(x)s
    ...     '''
    ...     return x
    >>> print(f.__doc__.splitlines()[4])
        x : int
    """
    def decorate(obj: T) -> T:
        if obj.__doc__ is None:
            return obj
        lines = []
        for line in obj.__doc__.split("\n"):
            name = line.strip()
            if name.startswith("%(") and name.endswith(")s") and name[2:-2] in fragments:
                indent = line[: len(line) - len(line.lstrip())]
                text = textwrap.dedent(fragments[name[2:-2]]).strip("\n")
                lines.append(textwrap.indent(text, indent))
            else:
                lines.append(line)
        obj.__doc__ = "\n".join(lines)
        return obj
    return decorate
