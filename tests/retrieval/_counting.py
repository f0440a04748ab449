"""Test helper shared by the rbe tests: a heavy ranker wrapper that counts its calls."""


class CountingRelevance:
    """Wraps a heavy ranker and counts the query-item pairs it scores."""

    def __init__(self, fn):
        self.fn, self.pairs, self.calls = fn, 0, 0

    def __call__(self, queries, items):
        self.calls += 1
        self.pairs += len(queries) * len(items)
        return self.fn(queries, items)


class CatStorageSpy:
    """Records the largest storage (bytes) held by the inputs of one ``torch.cat`` call.

    Chunked searches concatenate per-chunk results at the end; a per-chunk result that
    is a slice of a chunk-sized buffer keeps the whole buffer alive, so the storage of
    the inputs (not their numel) shows whether memory grew with ``n_queries x n_items``.
    Use with ``monkeypatch.setattr(torch, "cat", CatStorageSpy(torch.cat))``.
    """

    def __init__(self, cat):
        self.cat, self.max_bytes = cat, 0

    def __call__(self, tensors, *args, **kwargs):
        tensors = list(tensors)
        held = sum(t.untyped_storage().nbytes() for t in tensors)
        self.max_bytes = max(self.max_bytes, held)
        return self.cat(tensors, *args, **kwargs)
