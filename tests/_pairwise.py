"""Pairwise covering arrays for the option-interaction tests (``test_*_option_pairs.py``).

Every pair of values of any two options appears together in at least one generated
configuration: the usual way to find bugs that only two options together trigger,
with far fewer runs than the full product.
"""

from __future__ import annotations

import itertools
import random


def covering_array(options: dict, seed: int = 0, n_candidates: int = 30) -> list[dict]:
    """Greedy pairwise covering array over ``options`` (name -> list of values).

    Each configuration fixes the smallest uncovered pair and completes the other
    options with the best of ``n_candidates`` random completions (most pairs newly
    covered). Deterministic for a given ``seed``.
    """
    names, values = list(options), [list(v) for v in options.values()]
    empty = [n for n, v in zip(names, values) if not v]
    if empty:  # it would drop the option, or yield no configuration (a test of nothing)
        raise ValueError(f"options {empty} have no values.")
    pairs = list(itertools.combinations(range(len(names)), 2))
    todo = {(i, a, j, b) for i, j in pairs
            for a in range(len(values[i])) for b in range(len(values[j]))}
    rng, rows = random.Random(seed), []
    while todo:
        i, a, j, b = min(todo)
        best, gain = None, -1
        for _ in range(n_candidates):
            row = [rng.randrange(len(v)) for v in values]
            row[i], row[j] = a, b
            g = sum((p, row[p], q, row[q]) in todo for p, q in pairs)
            if g > gain:
                best, gain = row, g
        todo -= {(p, best[p], q, best[q]) for p, q in pairs}
        rows.append({n: values[k][best[k]] for k, n in enumerate(names)})
    if not rows:  # fewer than two options: one configuration per value of the first
        rows = [{names[0]: v} for v in values[0]] if names else [{}]
    return rows


def uncovered_pairs(options: dict, configs: list[dict]) -> list[tuple]:
    """The ``(name_a, value_a, name_b, value_b)`` pairs no configuration holds
    (compared by ``repr``, so unhashable values work); empty for a covering array."""
    missing = []
    for a, b in itertools.combinations(list(options), 2):
        seen = {(repr(c[a]), repr(c[b])) for c in configs}
        missing += [(a, x, b, y) for x in options[a] for y in options[b]
                    if (repr(x), repr(y)) not in seen]
    return missing
