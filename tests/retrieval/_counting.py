"""Test helper shared by the rbe tests: a heavy ranker wrapper that counts its calls."""


class CountingRelevance:
    """Wraps a heavy ranker and counts the query-item pairs it scores."""

    def __init__(self, fn):
        self.fn, self.pairs, self.calls = fn, 0, 0

    def __call__(self, queries, items):
        self.calls += 1
        self.pairs += len(queries) * len(items)
        return self.fn(queries, items)
