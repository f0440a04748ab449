"""RAD kernels: the documented ``chunk_size`` memory bounds hold, and chunking at and
around every boundary gives the unchunked (brute-force) result."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from mlpapers.anomaly.rad._kernels import (
    global_patch_similarity,
    l2_normalize,
    neighbour_indices,
    positional_patch_similarity,
    tiled_patch_similarity,
)


class _LargestNewTensor(TorchFunctionMode):
    """Records the largest tensor a torch call returns (views of its inputs excluded)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel())
        return out


def _data(B, h, w, C, N, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    mem = l2_normalize(torch.randn(N, h * w, C, generator=g))
    q = l2_normalize(torch.randn(B, h * w, C, generator=g))
    nb = torch.stack([torch.randperm(N, generator=g)[:k] for _ in range(B)])
    return q, mem, nb


def _brute(q, mem, nb, h, w, r):
    """float64 loop over positions: max cosine over the retrieved images' (clipped) windows."""
    B, L, _ = q.shape
    out = torch.empty(B, L, dtype=torch.float64)
    for b in range(B):
        cand = mem[nb[b]].double()
        for j in range(L):
            y, x = divmod(j, w)
            pos = list(range(L)) if r is None else [
                yy * w + xx for yy in range(max(0, y - r), min(h, y + r + 1))
                for xx in range(max(0, x - r), min(w, x + r + 1))]
            out[b, j] = (cand[:, pos] @ q[b, j].double()).max()
    return out.float()


def test_kernels_keep_their_documented_chunk_bounds():
    # One query image and many retrieved images: before the fix, the tiled kernel
    # gathered all of an image's tiles x retrieved blocks at once (here 9.6x the
    # bound; 32x at k=150 on a 28x28 grid), the global kernel one (L, L) similarity per
    # image whatever the bound, and the gather kernel all k windows of a row.
    h = w = 6
    q, mem, nb = _data(B=1, h=h, w=w, C=8, N=8, k=5)
    bound = 600
    index, mask = neighbour_indices(h, w, 2)  # (L, 25): an input of the kernel
    assert 4 * 16 * 8 <= bound  # the tile-padded query (4 tiles of 4x4 cells) fits
    cases = {
        "tiled": lambda: tiled_patch_similarity(q, mem, nb, (h, w), 1, chunk_size=bound),
        "global": lambda: global_patch_similarity(q, mem, nb, chunk_size=bound),
        "gather": lambda: positional_patch_similarity(q, mem, nb, index, mask,
                                                      chunk_size=bound),
    }
    for name, run in cases.items():
        with _LargestNewTensor() as probe:
            got = run()
        assert probe.largest <= bound, (name, probe.largest)
        r = {"tiled": 1, "global": None, "gather": 2}[name]
        torch.testing.assert_close(got, _brute(q, mem, nb, h, w, r), rtol=0, atol=1e-6)


@pytest.mark.parametrize("h, w, C, r, k, B", [(5, 7, 3, 1, 4, 3), (9, 4, 10, 2, 5, 2),
                                              (1, 5, 4, 1, 2, 2), (7, 1, 5, 3, 3, 1)])
def test_chunking_at_and_around_every_boundary_equals_brute_force(h, w, C, r, k, B):
    q, mem, nb = _data(B, h, w, C, N=8, k=k, seed=h * w + r)
    ref, ref_global = _brute(q, mem, nb, h, w, r), _brute(q, mem, nb, h, w, None)
    index, mask = neighbour_indices(h, w, r)
    T = min(4, max(h, w))
    tile_unit = (T + 2 * r) ** 2 * max(C, T * T)      # one tile x one retrieved image
    row_unit = (2 * r + 1) ** 2 * C                   # one gather row x one retrieved image
    n_tiles = -(-h // T) * -(-w // T)
    for u in (tile_unit, row_unit, k * tile_unit, n_tiles * k * tile_unit):
        for cs in (1, u - 1, u, u + 1):
            cs = max(cs, 1)
            torch.testing.assert_close(
                tiled_patch_similarity(q, mem, nb, (h, w), r, chunk_size=cs), ref,
                rtol=0, atol=1e-6)
            torch.testing.assert_close(
                positional_patch_similarity(q, mem, nb, index, mask, chunk_size=cs), ref,
                rtol=0, atol=1e-6)
    L = h * w
    unit = L * max(L, C)                              # one query image x one retrieved image
    for cs in (1, L - 1, L, unit - 1, unit, unit + 1, k * unit, B * k * unit + 1):
        torch.testing.assert_close(global_patch_similarity(q, mem, nb, chunk_size=max(cs, 1)),
                                   ref_global, rtol=0, atol=1e-6)


def test_knn_distance_chunks_hold_at_most_chunk_size_pairs():
    # the query block was 4096 rows whatever chunk_size, so a chunk_size below 4096
    # gave (4096, 1) distance blocks instead of at most chunk_size pairs
    from mlpapers.anomaly.rad._kernels import knn_distances

    class _PairBlocks(TorchFunctionMode):
        largest = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.topk:  # every (query, memory) distance block is ranked
                self.largest = max(self.largest, args[0].numel())
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    q, mem = torch.randn(4500, 3, generator=g), torch.randn(40, 3, generator=g)
    with _PairBlocks() as probe:
        d = knn_distances(q, mem, k=2, chunk_size=1000)
    # a chunk of 1000 pairs is 1000 query rows here (40 memory rows do not fit twice);
    # the merge with the running top-k adds k = 2 columns per row
    assert 0 < probe.largest <= 1000 * (1 + 2)
    torch.testing.assert_close(d, torch.cdist(q, mem).sort(1).values[:, :2], rtol=0,
                               atol=1e-5)
