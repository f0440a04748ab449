"""collect_row_blocks: the same result as a concatenation of blocks, for any block size."""

import pytest
import torch

from mlpapers._utils._blocks import BLOCK_ELEMENTS, block_rows_for, collect_row_blocks, row_blocks


@pytest.mark.parametrize("n, block", [(1, 1), (7, 3), (9, 3), (10, 100), (5, 0)])
def test_row_blocks_cover_the_rows_in_order(n, block):
    slices = list(row_blocks(n, block))
    covered = [i for s in slices for i in range(s.start, s.stop)]
    assert covered == list(range(n))
    assert all(0 < s.stop - s.start <= max(block, 1) for s in slices)


@pytest.mark.parametrize("n, block", [(1, 1), (7, 3), (64, 8), (10, 100)])
def test_equals_concatenation_for_tensors_and_tuples(n, block):
    X = torch.randn(n, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def compute(rows):
        z = X[rows] @ X.T
        return z.max(dim=1)

    values, index = collect_row_blocks(compute, n, block)
    parts = [compute(rows) for rows in row_blocks(n, block)]
    assert torch.equal(values, torch.cat([p.values for p in parts]))
    assert torch.equal(index, torch.cat([p.indices for p in parts]))
    assert index.dtype == torch.long and values.dtype == torch.float64
    single = collect_row_blocks(lambda rows: X[rows] * 2, n, block)
    assert torch.equal(single, X * 2)


def test_explicit_blocks_and_empty_input():
    X = torch.arange(10.0)
    out = collect_row_blocks(lambda rows: X[rows] + 1, 10, 4,
                             blocks=[slice(0, 2), slice(2, 9), slice(9, 10)])
    assert torch.equal(out, X + 1)
    empty = collect_row_blocks(lambda rows: X[rows].reshape(-1, 1).expand(-1, 3), 0, 4)
    assert empty.shape == (0, 3)


def test_block_with_wrong_row_count_raises():
    with pytest.raises(RuntimeError, match="returned 1 rows"):
        collect_row_blocks(lambda rows: torch.zeros(1), 4, 2)


@pytest.mark.parametrize("row_elements", [0, 1, 7, 1000, 2**22, 2**22 + 1, 10**9])
@pytest.mark.parametrize("cap", [None, 1, 5, 10**12])
def test_block_rows_for_is_the_largest_count_within_budget(row_elements, cap):
    rows = block_rows_for(row_elements, cap=cap)
    assert rows >= 1
    if cap is not None:
        assert rows <= cap
    # within the budget unless a single row is already over it
    per_row = max(1, row_elements)
    assert rows * per_row <= BLOCK_ELEMENTS or rows == 1
    # and the largest such count: one more row would break the budget or the cap
    assert (rows + 1) * per_row > BLOCK_ELEMENTS or rows == cap


def test_block_rows_for_custom_budget():
    assert block_rows_for(3, 10) == 3
    assert block_rows_for(3, 2) == 1
    assert block_rows_for(3, 10, cap=2) == 2
