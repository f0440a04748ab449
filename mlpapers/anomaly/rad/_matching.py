"""Positional patch matching against the union of the retrieved images.

:func:`shared_patch_similarity` computes exactly what
:func:`~mlpapers.anomaly.rad._kernels.positional_patch_similarity` and
:func:`~mlpapers.anomaly.rad._kernels.tiled_patch_similarity` compute, but scores a
chunk of query images against the *union* of their retrieved images at once, with
one batched matmul per window row and no gathered copies of the windows.
:func:`positional_similarity` dispatches between the kernels (``"auto"`` picks by a
cost rule) and :func:`order_by_neighbours` sorts query images so that images with
similar retrieved sets share a chunk.

Shapes use ``B`` query images, ``N`` memory images, ``L = h * w`` grid positions,
``C`` channels, ``k`` retrieved images and ``U`` the size of the union of the
retrieved sets.
"""

from __future__ import annotations

import torch

from mlpapers.anomaly.rad._kernels import (
    neighbour_indices,
    positional_patch_similarity,
    tiled_patch_similarity,
)

__all__ = [
    "choose_matching",
    "order_by_neighbours",
    "positional_similarity",
    "shared_patch_similarity",
]


def _membership(neighbours: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Union ``U`` (sorted, shape (U,)) of the rows of ``neighbours`` and the (B, U) mask."""
    union, inv = torch.unique(neighbours, return_inverse=True)
    member = torch.zeros(neighbours.shape[0], len(union), dtype=torch.bool,
                         device=neighbours.device)
    member[torch.arange(neighbours.shape[0], device=neighbours.device)[:, None], inv] = True
    return union, member


def _padded_rows(h: int, w: int, ry: int, rx: int, device) -> torch.Tensor:
    """Flat grid position of every cell of the replicate-padded grid.

    Shape ``((h + 2 ry + 1) * (w + 2 rx),)``: cell ``(y', x')`` of the grid padded by
    ``ry`` rows (plus one slack row at the bottom) and ``rx`` columns holds position
    ``(clamp(y' - ry, 0, h-1), clamp(x' - rx, 0, w-1))``.
    """
    ys = (torch.arange(h + 2 * ry + 1, device=device) - ry).clamp(0, h - 1)
    xs = (torch.arange(w + 2 * rx, device=device) - rx).clamp(0, w - 1)
    return (ys[:, None] * w + xs[None, :]).reshape(-1)


def _max_over_dim1_(scores: torch.Tensor) -> torch.Tensor:
    """Maximum over dim 1 of ``scores`` (n, m, B) by in-place halving; returns (n, B).

    Overwrites ``scores``. On CPU this is several times faster than ``amax(dim=1)``,
    whose reduction over a middle dimension with a short inner one is slow.
    """
    m = scores.shape[1]
    while m > 1:
        half = m // 2
        torch.maximum(scores[:, :half], scores[:, m - half:m], out=scores[:, :half])
        m -= half
    return scores[:, 0]


def shared_patch_similarity(
    query: torch.Tensor,
    memory: torch.Tensor,
    neighbours: torch.Tensor,
    grid: tuple[int, int],
    radius: int,
    chunk_size: int = 2**22,
    block_size: int = 2**17,
    memory_block: int = 2**21,
) -> torch.Tensor:
    r"""Positional matching against the union of the retrieved images (exact).

    Computes, for every query image :math:`b` and grid position :math:`j`,

    .. math:: \max_{n \in R_b,\ m \in W_r(j)} \langle q_{b,j}, P_{n,m} \rangle,

    the same value as
    :func:`~mlpapers.anomaly.rad._kernels.positional_patch_similarity`. The
    memory patches of the union :math:`U = \cup_b R_b` of the queries' retrieved
    sets are laid out on the grid padded by ``r`` cells, position-major
    ``(positions, U, C)`` (one ``index_select`` per chunk of union images, into one
    reused buffer), and the queries on rows of the same padded width
    ``Wp = w + 2r``, channel-major ``(positions, C, B)``. For a window offset
    :math:`(d_y, d_x)` the candidate of the query at flat position ``p`` is then the
    padded memory row ``p + (d_y + r) Wp + d_x + r``: the ``2r+1`` offsets of one
    window row are ``2r+1`` consecutive rows, i.e. a strided *view*
    ``(n, (2r+1) U, C)`` of the padded memory. One batched matmul per window row,
    ``((2r+1) U, C) @ (C, B)`` with positions as the batch, scores every query
    against every candidate: each window cell is multiplied once per union image
    (the loop's multiply-add count when the retrieved sets agree), with no
    duplicated windows and no gathered copies.

    Why it is exact: the padding *replicates* the border cells (cell
    :math:`(y', x')` holds the patch at :math:`(\mathrm{clamp}(y'), \mathrm{clamp}(x'))`).
    Clamping moves a cell towards the query, so a padded cell read by a query's
    window is a copy of a grid cell inside that same (clipped) window and cannot
    change the maximum. Images of the union that a query did not retrieve are
    masked to :math:`-\infty` before the maximum over the union (no mask when
    every query retrieved the whole union). Window offsets entirely outside the
    grid (``|d_y| >= h`` or ``|d_x| >= w``) are skipped, so a radius beyond the
    grid costs no more than ``max(h, w) - 1``. The float32 products are those of
    the other kernels; only the matmul's summation order may differ, so results
    agree to float rounding.

    Parameters
    ----------
    query : Tensor of shape (B, L, C)
        L2-normalised query patches, ``L = h * w``.
    memory : Tensor of shape (N, L, C)
        L2-normalised memory patches (any float dtype, e.g. float16; computed in
        float32).
    neighbours : LongTensor of shape (B, k)
        Retrieved memory images per query (duplicates allowed).
    grid : (int, int)
        ``(h, w)``; need not be square.
    radius : int
        Window half-size ``r >= 0``.
    chunk_size : int, default=2**22
        Bounds the working memory: the padded float32 layout of a chunk of union
        images ``(positions, Uc, C)`` and the score block of a chunk of positions
        ``(n, (2r+1) Uc, B)`` each hold at most about ``chunk_size`` values (at
        least one union image and one position per chunk).
    block_size : int, default=2**17
        Further caps the score block so that it stays in cache (faster on CPU).
    memory_block : int, default=2**21
        Further caps the padded memory of a chunk of union images (8 MiB of
        float32 by default), so that it is reused from cache by the ``2r+1``
        window rows, and so that the one buffer it is gathered into is small (a
        large fresh buffer costs its page faults on every call).

    Returns
    -------
    Tensor of shape (B, L), float32

    See Also
    --------
    mlpapers.anomaly.rad._kernels.positional_patch_similarity : gathered windows.
    mlpapers.anomaly.rad._kernels.tiled_patch_similarity : tiles of positions.
    """
    B, L, C = query.shape
    h, w = (int(grid[0]), int(grid[1]))
    dev = query.device
    r = int(radius)
    ry, rx = min(r, h - 1), min(r, w - 1)  # offsets beyond the grid never hold a valid cell
    Wp, Hp = w + 2 * rx, h + 2 * ry + 1  # one slack row for the flat shifts of pad columns
    nx = 2 * rx + 1
    Cp = -(-C // 8) * 8  # channel counts that are multiples of 8 run much faster in BLAS
    union, member = _membership(neighbours)
    everyone = bool(member.all())
    n_rows = h * Wp
    # queries on rows of width Wp, channel-major: (h Wp, Cp, B); pad columns are
    # computed and dropped. Candidates-by-queries products ((2r+1) U, C) @ (C, B) run
    # faster in BLAS than the transposed orientation for these small C and B.
    q = torch.empty((h, Wp, Cp, B), dtype=torch.float32, device=dev)
    q[:, w:] = 0  # zeros, not whatever the fresh memory holds (subnormals are slow)
    q[:, :w, C:] = 0
    q[:, :w, :C] = query.reshape(B, h, w, C).permute(1, 2, 3, 0)
    q = q.reshape(n_rows, Cp, B)
    cells = _padded_rows(h, w, ry, rx, dev)  # (Hp Wp,)
    flat = memory.reshape(-1, C)
    u_chunk = max(1, min(int(chunk_size), int(memory_block)) // (Hp * Wp * Cp))
    # one buffer for the padded memory of every chunk of union images (the first is
    # the largest); its pad channels stay zero
    buf = torch.empty(Hp * Wp * min(u_chunk, len(union)), Cp, dtype=torch.float32,
                      device=dev)
    buf[:, C:] = 0
    best = torch.full((n_rows, B), -torch.inf, dtype=torch.float32, device=dev)
    for u0 in range(0, len(union), u_chunk):
        uidx = union[u0:u0 + u_chunk]
        uc = len(uidx)
        # replicate-padded, position-major layout (Hp Wp, uc, Cp): one gather
        mem = buf[:Hp * Wp * uc]
        rows = (cells[:, None] + uidx[None, :] * L).reshape(-1)
        if Cp == C and flat.dtype == torch.float32:
            torch.index_select(flat, 0, rows, out=mem)
        else:
            mem[:, :C] = flat.index_select(0, rows)
        # -inf for the union images a query did not retrieve, repeated over the nx window
        # columns (adding it is exact and much faster on CPU than a broadcast masked_fill)
        drop = None if everyone else torch.where(
            member[:, u0:u0 + uc], 0.0, -torch.inf).to(torch.float32).T.repeat(nx, 1)  # (nx uc, B)
        rows_per_chunk = max(1, min(int(chunk_size), int(block_size)) // (B * nx * uc))
        for p0 in range(0, n_rows, rows_per_chunk):
            n = min(rows_per_chunk, n_rows - p0)
            acc = None
            for dy in range(2 * ry + 1):
                # rows p .. p + 2 rx of the padded memory, dy padded rows down: a view
                cand = mem.as_strided((n, nx * uc, Cp), (uc * Cp, Cp, 1),
                                      mem.storage_offset() + (p0 + dy * Wp) * uc * Cp)
                s = torch.bmm(cand, q[p0:p0 + n])  # (n, nx uc, B)
                acc = s if acc is None else torch.maximum(acc, s, out=acc)
            assert acc is not None  # the window has 2 ry + 1 >= 1 rows
            if drop is not None:
                acc.add_(drop)
            torch.maximum(best[p0:p0 + n], _max_over_dim1_(acc), out=best[p0:p0 + n])
    return best.reshape(h, Wp, B)[:, :w].reshape(L, B).T.contiguous()


def order_by_neighbours(neighbours: torch.Tensor) -> torch.Tensor:
    """Permutation grouping query images with similar retrieved sets.

    Sorts (stably) by the nearest retrieved image, then by the second nearest, so
    that consecutive chunks of the permuted queries have small unions of retrieved
    images. Scores are computed per image, so any order gives the same scores.

    Parameters
    ----------
    neighbours : LongTensor of shape (B, k)

    Returns
    -------
    LongTensor of shape (B,)
        ``order``; ``neighbours[order]`` is grouped, ``torch.argsort(order)``
        restores the input order.
    """
    order = torch.arange(neighbours.shape[0], device=neighbours.device)
    for col in reversed(range(min(2, neighbours.shape[1]))):
        order = order[torch.sort(neighbours[order, col], stable=True).indices]
    return order


def choose_matching(neighbours: torch.Tensor, grid: tuple[int, int], radius: int,
                    tile: int = 4) -> str:
    r"""Pick ``"shared"`` or ``"tiled"`` for one chunk of queries by a cost rule.

    Per query patch, :func:`shared_patch_similarity` does
    :math:`(2r_y+1)(2r_x+1)\,|U|` multiply-adds of ``C`` channels (``r_y =
    min(r, h-1)``, ``r_x = min(r, w-1)``, ``U`` the union of the chunk's retrieved
    sets) and :func:`~mlpapers.anomaly.rad._kernels.tiled_patch_similarity`
    :math:`k (T + 2r_y)(T + 2r_x)` (``T = min(tile, max(h, w))``) plus the gather of
    its candidate blocks. The rule picks ``"shared"`` when

    .. math:: (2r_y+1)(2r_x+1)\,|U| \le 1.75\, k\, (T + 2r_y)(T + 2r_x),

    i.e. for ``r = 1`` when :math:`|U| \le 7k`: the chunk's retrieved sets overlap
    enough. The factor 1.75 is the measured break-even on one CPU core (torch
    2.13, ``r = 1``, grids 8x8, 14x14 and 28x28 with 64, 112 and 40 channels,
    ``k`` of 5, 20 and 40, 16 queries: the shared kernel took 0.22-0.48 of the
    tiled kernel's time at :math:`|U| = 2k` and 0.70-1.01 at :math:`|U| \approx 7k`;
    at :math:`7.6k` on the 8x8 grid, 1.25).

    Parameters
    ----------
    neighbours : LongTensor of shape (B, k)
    grid : (int, int)
    radius : int
    tile : int, default=4
        Tile size of the tiled kernel.

    Returns
    -------
    {"shared", "tiled"}
    """
    h, w = grid
    r = int(radius)
    k = neighbours.shape[1]
    n_union = int(torch.unique(neighbours).numel())
    T = max(1, min(int(tile), max(h, w)))
    ry, rx = min(r, h - 1), min(r, w - 1)   # both kernels clip the radius per axis
    shared = (2 * ry + 1) * (2 * rx + 1) * n_union
    return "shared" if 4 * shared <= 7 * k * (T + 2 * ry) * (T + 2 * rx) else "tiled"


def positional_similarity(
    query: torch.Tensor,
    memory: torch.Tensor,
    neighbours: torch.Tensor,
    grid: tuple[int, int],
    radius: int,
    matching: str = "auto",
    chunk_size: int = 2**24,
) -> torch.Tensor:
    """Positional matching with the kernel named by ``matching`` (all give the same values).

    Parameters
    ----------
    query : Tensor of shape (B, L, C)
    memory : Tensor of shape (N, L, C)
    neighbours : LongTensor of shape (B, k)
    grid : (int, int)
    radius : int
    matching : {"auto", "shared", "tiled", "gather"}, default="auto"
        ``"auto"`` applies :func:`choose_matching` to this call's queries.
    chunk_size : int, default=2**24
        Working-memory bound passed to the kernel (the tiled kernel caps its
        blocks at ``2**20`` values and the shared one its score blocks at
        ``2**17`` and its memory blocks at ``2**21``: smaller blocks stay in cache).

    Returns
    -------
    Tensor of shape (B, L), float32
    """
    h, w = grid
    if matching == "auto":
        matching = choose_matching(neighbours, grid, radius)
    if matching == "shared":
        return shared_patch_similarity(query, memory, neighbours, grid, radius,
                                       chunk_size=chunk_size)
    if matching == "tiled":
        return tiled_patch_similarity(query, memory, neighbours, grid, radius,
                                      chunk_size=min(int(chunk_size), 2**20))
    if matching == "gather":
        index, mask = neighbour_indices(h, w, radius, device=query.device)
        return positional_patch_similarity(query, memory, neighbours, index, mask, chunk_size)
    raise ValueError(f"matching must be one of 'auto', 'shared', 'tiled', 'gather', "
                     f"got {matching!r}.")
