"""Pure tensor kernels of RAD and the PatchCore baseline.

Shapes use ``B`` query images, ``N`` memory images, ``L = h * w`` grid
positions, ``C`` channels, ``k`` retrieved images and ``M`` window positions.
Nothing here holds state; the estimators in :mod:`._estimator` compose these
functions.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from mlpapers.anomaly.rad._maps import gaussian_blur, resize_maps, top_ratio_pool
from mlpapers.anomaly.rad._patchcore_kernels import greedy_coreset, knn_distances

__all__ = [
    "gaussian_blur",
    "global_patch_similarity",
    "greedy_coreset",
    "knn_distances",
    "l2_normalize",
    "neighbour_indices",
    "positional_patch_similarity",
    "resize_maps",
    "retrieve_neighbours",
    "tiled_patch_similarity",
    "top_ratio_pool",
]


def l2_normalize(x: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    """Divide ``x`` by its L2 norm along ``dim`` (zero vectors stay zero).

    Any finite nonzero vector becomes a unit vector, whatever its scale: when a sum
    of squares overflows or comes near underflow (float32 features beyond about
    ``1e19`` or below ``1e-19``), the vectors are first divided by their largest
    magnitude. ``eps`` only guards the division of zero vectors.
    """
    # a plain sum of squares: several times faster than ``Tensor.norm`` on CPU when
    # ``dim`` is strided (the channel axis of the (n, h w, c) patch views)
    sq = x.square().sum(dim=dim, keepdim=True)
    info = torch.finfo(sq.dtype)
    if not bool(((sq > info.tiny ** 0.5) & (sq < info.max ** 0.5)).all()):
        # rare (zero vectors, extreme scales): rescale, then the squares are safe
        x = x / x.abs().amax(dim=dim, keepdim=True).clamp_min(info.tiny)
        sq = x.square().sum(dim=dim, keepdim=True)
    return x / sq.sqrt().clamp_min(eps)


def neighbour_indices(
    h: int, w: int, radius: int | None, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat grid indices of the ``(2r+1)^2`` window around every position.

    Parameters
    ----------
    h, w : int
        Grid height and width (``L = h * w``).
    radius : int or None
        Window half-size ``r``; ``None`` means the whole grid.
    device : torch.device, optional

    Returns
    -------
    index : LongTensor of shape (L, M)
        ``index[j, m]`` is the flat position of the m-th window cell around ``j``
        (``M = (2 r_y + 1)(2 r_x + 1)`` with ``r_y = min(r, h - 1)`` and
        ``r_x = min(r, w - 1)``: offsets beyond the grid never hold a cell, so a
        radius beyond the grid costs no more than one covering it; ``M = L`` when
        ``radius is None``). Cells outside the grid are padded with ``j`` itself.
    mask : BoolTensor of shape (L, M)
        ``True`` where the cell lies inside the grid (the window is clipped at the
        borders, as in the official code).
    """
    L = h * w
    if radius is None:
        index = torch.arange(L, device=device).expand(L, L)
        return index, torch.ones(L, L, dtype=torch.bool, device=device)
    r = int(radius)
    # clipped per axis: an offset of h rows (w columns) or more is outside the grid for
    # every position, so the window is the same and its size no longer grows as (2r+1)^2
    # (pos_radius=100 on a 28x28 grid: 40401 cells per position without the clip)
    ry, rx = min(r, h - 1), min(r, w - 1)
    dy, dx = torch.meshgrid(torch.arange(-ry, ry + 1, device=device),
                            torch.arange(-rx, rx + 1, device=device), indexing="ij")
    rows = torch.arange(h, device=device).repeat_interleave(w)  # (L,)
    cols = torch.arange(w, device=device).repeat(h)
    ny = rows[:, None] + dy.reshape(1, -1)  # (L, M)
    nx = cols[:, None] + dx.reshape(1, -1)
    mask = (ny >= 0) & (ny < h) & (nx >= 0) & (nx < w)
    self_idx = torch.arange(L, device=device)[:, None].expand_as(ny)
    index = torch.where(mask, ny * w + nx, self_idx)
    return index, mask


def retrieve_neighbours(
    query_keys: torch.Tensor,
    memory_keys: torch.Tensor,
    k: int,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indices of the ``k`` memory images with the highest key cosine similarity.

    Parameters
    ----------
    query_keys : Tensor of shape (B, D)
    memory_keys : Tensor of shape (N, D)
    k : int
        Clamped to ``N`` (or ``N - 1`` with ``exclude``); at least 1.
    exclude : LongTensor of shape (B,), optional
        A memory index per query that must not be retrieved (leave-one-out
        scores of the training images); ``-1`` excludes nothing.

    Returns
    -------
    LongTensor of shape (B, k')
        ``k' = min(k, available)``. Which images are retrieved does not depend on
        the batch: a tie at the ``k``-th place (keys equal after normalisation, e.g.
        one a power-of-two multiple of the other) goes to the lower index. They are
        sorted by decreasing similarity as one matmul rounds it (exact ties by the
        lower index), so near-equal similarities may come in another order for
        another batch; no score depends on the order.
    """
    q = l2_normalize(query_keys.float())
    m = l2_normalize(memory_keys.float())
    # The ranking matmul's rounding depends on its batch and position (handled below).
    # Float32 when its matmuls are IEEE; if the user allowed TF32/bf16 float32 matmuls,
    # float64, which those settings never lower.
    ieee = _float32_matmuls_are_ieee()
    sim = q @ m.T if ieee else q.double() @ m.double().T  # (B, N)
    sim_eps = 2.0**-24 if ieee else 2.0**-53
    n_avail = m.shape[0]
    if exclude is not None:
        rows = torch.nonzero(exclude >= 0).squeeze(1)
        sim[rows, exclude[rows]] = -torch.inf
        n_avail -= int((exclude >= 0).any())
    k = max(1, min(int(k), n_avail))
    if len(q) == 0:
        return torch.empty(0, k, dtype=torch.long, device=q.device)
    # Which images make the k best must not depend on the batch: a matmul rounds a dot
    # product differently by its row, column and batch, so an exact tie at the k-th place
    # (equal unit keys) could go either way. The float32 position-free reduction
    # (_position_free_cosines) is within D * 2**-24 of the exact cosine of the unit keys,
    # the matmul within D * sim_eps; with ``band`` twice their sum on each side (a 2x
    # margin), an image above the matmul's k-th value plus ``band`` is surely in the k
    # best, one below it minus ``band`` surely out; only the images in between are
    # ranked by the position-free cosines, with ties to the lower index.
    band = 4.0 * q.shape[1] * (2.0**-24 + sim_eps)
    kth = sim.topk(k, dim=1).values[:, -1:]
    chosen = sim > kth + band  # surely in: fewer than k per row
    maybe = (sim >= kth - band) & ~chosen & (sim > -torch.inf)  # (excluded: -inf)
    n_maybe = int(maybe.sum(dim=1).max())
    # (the k-th image itself is always in the band, so n_maybe is 0 only when every memory
    # image is excluded: a one-image memory scored leave-one-out, which fit never asks)
    if n_maybe:
        cand = sim.masked_fill(~maybe, -torch.inf).topk(n_maybe, dim=1).indices
        cand = torch.sort(cand, dim=1).values  # ascending index: stable sorts then
        exact = _position_free_cosines(q, m, cand).to(sim.dtype).masked_fill(
            ~torch.gather(maybe, 1, cand), -torch.inf)
        ranked = torch.gather(cand, 1, torch.sort(exact, dim=1, descending=True,
                                                  stable=True).indices)
        need = k - chosen.sum(dim=1, keepdim=True)  # (B, 1) places left for the band
        take = torch.arange(n_maybe, device=sim.device)[None, :] < need
        query = torch.arange(len(sim), device=sim.device)[:, None].expand_as(ranked)
        chosen[query[take], ranked[take]] = True
    # the chosen k, by decreasing (matmul) cosine; the order inside the set does not
    # change any score
    key = sim.masked_fill(~chosen, -torch.inf)
    # a copy: the slice was a view that kept the whole (B, N) int64 sort alive, and the
    # callers keep every batch's result (RAD's fit grew with n_train**2: +593 MB at 8000
    # 16 px images, +244 MB now)
    return torch.sort(key, dim=1, descending=True, stable=True).indices[:, :k].clone()


def _float32_matmuls_are_ieee() -> bool:
    """False when float32 matmuls may round to TF32 or bf16 (or the settings cannot be
    read: torch refuses the old query once the newer ``fp32_precision`` API is used)."""
    try:
        return torch.get_float32_matmul_precision() == "highest"
    except RuntimeError:
        return False


def _position_free_cosines(q: torch.Tensor, m: torch.Tensor, cand: torch.Tensor,
                           block: int = 2**22) -> torch.Tensor:
    """``q[b] . m[cand[b, j]]`` as elementwise products summed over ``D``: the same
    reduction for every pair wherever it sits (a matmul rounds a dot product differently
    by its row, column and batch), in chunks of about ``block`` values.

    Shapes: q (B, D), m (N, D), cand (B, c) -> (B, c).
    """
    step = max(1, block // max(1, q.shape[0] * q.shape[1]))
    return torch.cat([(q[:, None, :] * m[cand[:, s:s + step]]).sum(-1)
                      for s in range(0, cand.shape[1], step)], dim=1)


def positional_patch_similarity(
    query: torch.Tensor,
    memory: torch.Tensor,
    neighbours: torch.Tensor,
    index: torch.Tensor,
    mask: torch.Tensor,
    chunk_size: int = 2**24,
) -> torch.Tensor:
    """Max cosine of every query patch over the retrieved images' window patches.

    Every (query image, position) pair is one row; its candidates are the
    ``k * M`` memory patches at the ``M`` window positions of the ``k`` retrieved
    images. The candidates of a chunk of rows are gathered with padded indices,
    scored with one batched matmul, masked and max-reduced: there is no Python
    loop over positions or images, only over chunks.

    Parameters
    ----------
    query : Tensor of shape (B, L, C)
        L2-normalised query patch features.
    memory : Tensor of shape (N, L, C)
        L2-normalised memory patch features (any float dtype, e.g. float16).
    neighbours : LongTensor of shape (B, k)
        Retrieved memory images per query.
    index, mask : Tensors of shape (L, M)
        From :func:`neighbour_indices`.
    chunk_size : int, default=2**24
        Maximum number of values in the gathered candidate chunk
        ``(rows, k_c, M, C)`` (64 MB in float32 by default): chunks of rows, and of
        ``k_c < k`` retrieved images (running maximum) when one row's ``k M C``
        candidates exceed the bound (at least one image's window per chunk).

    Returns
    -------
    Tensor of shape (B, L), float32
        ``max_{n in R, m in window(j)} <q_j, P[n, m]>``.
    """
    B, L, C = query.shape
    k = neighbours.shape[1]
    M = index.shape[1]
    kc = min(k, max(1, int(chunk_size) // (M * C)))  # retrieved images per chunk
    rows_per_chunk = max(1, int(chunk_size) // (kc * M * C))
    q_rows = query.reshape(B * L, C).float()
    out = torch.empty(B * L, dtype=torch.float32, device=query.device)
    for start in range(0, B * L, rows_per_chunk):
        rows = torch.arange(start, min(start + rows_per_chunk, B * L), device=query.device)
        b, j = rows // L, rows % L
        pos = index[j][:, None, :]  # (R, 1, M)
        outside = ~mask[j][:, None, :]
        best = None
        for k0 in range(0, k, kc):
            img = neighbours[b, k0:k0 + kc][:, :, None]  # (R, kc, 1)
            nk = img.shape[1]
            cand = memory[img, pos].float()  # (R, kc, M, C)
            sim = torch.bmm(cand.reshape(len(rows), nk * M, C), q_rows[rows, :, None])
            sim = sim.reshape(len(rows), nk, M).masked_fill(outside, -torch.inf)
            sim = sim.amax(dim=(1, 2))
            best = sim if best is None else torch.maximum(best, sim)
        assert best is not None  # k >= 1 retrieved images
        out[rows] = best
    return out.reshape(B, L)


def _tile_window_index(h: int, w: int, ry: int, rx: int, T: int, device
                       ) -> tuple[torch.Tensor, ...]:
    """Static indices of :func:`tiled_patch_similarity`.

    Returns ``cells (n_tiles, Py Px)``: the flat grid position of every cell of each
    tile's ``Py x Px`` candidate block (``Py = T + 2 ry``, ``Px = T + 2 rx``; cells
    outside the grid point to position 0, they are masked later), ``win (T^2, M)``:
    the block index of the ``M = (2 ry + 1)(2 rx + 1)`` window cells of each tile
    cell, ``cell (T^2, 1)`` and ``valid (n_tiles, 1, T^2, M)``: whether a window cell
    lies inside the grid.
    """
    nth, ntw = -(-h // T), -(-w // T)
    Py, Px = T + 2 * ry, T + 2 * rx
    ar = partial(torch.arange, device=device)
    by = (ar(nth)[:, None] * T - ry + ar(Py)[None, :])  # (nth, Py) grid rows of block rows
    bx = (ar(ntw)[:, None] * T - rx + ar(Px)[None, :])  # (ntw, Px)
    inside = (((by >= 0) & (by < h))[:, None, :, None]
              & ((bx >= 0) & (bx < w))[None, :, None, :])  # (nth, ntw, Py, Px)
    cells = by[:, None, :, None] * w + bx[None, :, None, :]
    cells = torch.where(inside, cells, torch.zeros((), dtype=cells.dtype, device=device))
    ty, tx = torch.meshgrid(ar(T), ar(T), indexing="ij")
    dy, dx = torch.meshgrid(ar(-ry, ry + 1), ar(-rx, rx + 1), indexing="ij")
    win = ((ty.reshape(-1, 1) + ry + dy.reshape(1, -1)) * Px
           + (tx.reshape(-1, 1) + rx + dx.reshape(1, -1)))  # (T*T, M)
    valid = inside.reshape(nth * ntw, 1, Py * Px)[:, :, win]
    return cells.reshape(nth * ntw, Py * Px), win, ar(T * T)[:, None], valid


def tiled_patch_similarity(
    query: torch.Tensor,
    memory: torch.Tensor,
    neighbours: torch.Tensor,
    grid: tuple[int, int],
    radius: int,
    tile: int = 4,
    chunk_size: int = 2**20,
) -> torch.Tensor:
    """Positional matching by tiles: the same result as :func:`positional_patch_similarity`.

    The query grid is cut into ``tile x tile`` tiles; a tile's candidates are the
    ``P^2 = (tile + 2r)^2`` memory cells around it in each of the ``k``
    retrieved images (cells outside the grid are masked). Per tile and query image, one dense
    matmul ``(tile^2, C) @ (C, k P^2)`` scores every candidate against every
    query cell; the maximum over the ``k`` images is taken first (it commutes
    with the window maximum), then the ``(2r+1)^2`` window of each cell is
    picked from the ``P^2`` block with a static index and a validity mask (cells
    outside the grid never win) and max-reduced. Candidates are laid out with
    channels innermost so that the gather and the matmul stream contiguous
    memory. Compared with gathering every window separately, this reads each
    retrieved patch ``P^2 / tile^2`` times (2.25 for ``tile=4, r=1``) instead of
    ``(2r+1)^2`` times, as dense matmuls, at the price of ``P^2 / (2r+1)^2``
    times more multiply-adds (4 for ``tile=4, r=1``). The candidate blocks are
    gathered with a single ``index_select`` of memory rows (no padded copy of the
    memory: cells outside the grid read an arbitrary row and are masked).

    Parameters
    ----------
    query : Tensor of shape (B, L, C)
        L2-normalised query patches, ``L = h * w``.
    memory : Tensor of shape (N, L, C)
        L2-normalised memory patches (any float dtype; computed in float32).
    neighbours : LongTensor of shape (B, k)
    grid : (int, int)
        ``(h, w)``.
    radius : int
        Window half-size ``r >= 0``; it is clipped per axis to ``h - 1`` rows and
        ``w - 1`` columns (offsets beyond the grid hold no cell: the same windows,
        candidate blocks bounded by the grid).
    tile : int, default=4
    chunk_size : int, default=2**20
        Maximum number of values in one chunk's candidate block
        ``(t, b, k_c P^2, max(C, tile^2))``: query images are processed in
        chunks of ``b`` images, and when one image's blocks exceed the bound, in
        chunks of ``t`` tiles and ``k_c`` retrieved images (running maximum; at
        least one of each). Small chunks stay in cache.

    Returns
    -------
    Tensor of shape (B, L), float32
    """
    B, L, C = query.shape
    if B == 0:
        return torch.zeros(0, L, dtype=torch.float32, device=query.device)
    h, w = grid
    k = neighbours.shape[1]
    # row offsets of h or more and column offsets of w or more are outside the grid
    # (same windows): the per-axis clip keeps the (tile + 2 ry) x (tile + 2 rx)
    # candidate blocks bounded by the grid for a radius beyond it
    ry, rx = min(int(radius), h - 1), min(int(radius), w - 1)
    T = max(1, min(int(tile), max(h, w)))
    nth, ntw = -(-h // T), -(-w // T)
    nt, Hp, Wp = nth * ntw, nth * T, ntw * T
    PP = (T + 2 * ry) * (T + 2 * rx)   # candidate cells per tile
    cells, win, cell, valid = _tile_window_index(h, w, ry, rx, T, query.device)
    q = F.pad(query.float().reshape(B, h, w, C), (0, 0, 0, Wp - w, 0, Hp - h))
    q = q.reshape(B, nth, T, ntw, T, C).permute(1, 3, 0, 2, 4, 5)  # (nth, ntw, B, T, T, C)
    q = q.reshape(nt, B, T * T, C)
    flat_memory = memory.reshape(-1, C)
    # chunks of b images x t tiles x kc retrieved images, each at most ``chunk_size``
    # values (at least one of each): images first, then tiles, then retrieved images
    unit = PP * max(C, T * T)
    kc = min(k, max(1, int(chunk_size) // unit))
    t_chunk = min(nt, max(1, int(chunk_size) // (k * unit))) if kc == k else 1
    b_chunk = max(1, int(chunk_size) // (nt * k * unit)) if t_chunk == nt else 1
    out = []
    for start in range(0, B, b_chunk):
        nb = neighbours[start:start + b_chunk]
        b = len(nb)
        tiles = []
        for t0 in range(0, nt, t_chunk):
            t = min(t_chunk, nt - t0)
            qt = q[t0:t0 + t, start:start + b]
            best = None
            for k0 in range(0, k, kc):
                nk = min(kc, k - k0)
                # one gather of the tiles' candidate blocks, channels innermost
                rows = (nb[:, k0:k0 + nk].reshape(1, b, nk, 1) * L
                        + cells[t0:t0 + t].reshape(t, 1, 1, PP))
                mem = flat_memory.index_select(0, rows.reshape(-1)).float().reshape(
                    t, b, nk * PP, C)
                # (T^2, C) @ (C, nk P^2) per tile and image; the transposed operand is a view
                sim = torch.matmul(qt, mem.transpose(-1, -2))
                sim = sim.reshape(t, b, T * T, nk, PP).amax(dim=3)  # best retrieved image
                best = sim if best is None else torch.maximum(best, sim, out=best)
            assert best is not None  # k >= 1 retrieved images
            tiles.append(best[:, :, cell, win].masked_fill_(~valid[t0:t0 + t], -torch.inf)
                         .amax(dim=-1))  # (t, b, T^2)
        sim = torch.cat(tiles).reshape(nth, ntw, b, T, T).permute(2, 0, 3, 1, 4).reshape(
            b, Hp, Wp)
        out.append(sim[:, :h, :w].reshape(b, L))
    return torch.cat(out)


def global_patch_similarity(
    query: torch.Tensor,
    memory: torch.Tensor,
    neighbours: torch.Tensor,
    chunk_size: int = 2**24,
) -> torch.Tensor:
    """Max cosine of every query patch over *all* patches of the retrieved images.

    The ``pos_radius=None`` case of :func:`positional_patch_similarity`, computed
    without the ``L x L`` index: per query image one matmul against the
    ``k * L`` retrieved patches, chunked over retrieved images.

    Parameters
    ----------
    query : Tensor of shape (B, L, C)
    memory : Tensor of shape (N, L, C)
    neighbours : LongTensor of shape (B, k)
    chunk_size : int, default=2**24
        Maximum number of values in the similarity ``(b, L, kc * L)`` and gathered
        ``(b, kc * L, C)`` chunks: chunks of ``b`` query images and ``kc``
        retrieved images (when one pair exceeds the bound, the ``L`` query
        positions are cut into row chunks; the gathered ``(L, C)`` patches of one
        retrieved image are the smallest unit).

    Returns
    -------
    Tensor of shape (B, L), float32
    """
    B, L, C = query.shape
    k = neighbours.shape[1]
    unit = L * max(L, C)  # one query image against one retrieved image
    kc = min(k, max(1, int(chunk_size) // unit))
    b_chunk = min(B, max(1, int(chunk_size) // (kc * unit))) if kc == k else 1
    # a single pair above the bound: score the query positions in row chunks
    rows = L if kc > 1 or unit <= int(chunk_size) else max(1, int(chunk_size) // L)
    q = query.float()
    best = torch.full((B, L), -torch.inf, dtype=torch.float32, device=query.device)
    for b0 in range(0, B, b_chunk):
        nb = neighbours[b0:b0 + b_chunk]
        for start in range(0, k, kc):
            cand = memory[nb[:, start:start + kc]].float()  # (b, kc, L, C)
            cand = cand.reshape(len(nb), -1, C).transpose(1, 2)
            for j0 in range(0, L, rows):
                sim = torch.bmm(q[b0:b0 + b_chunk, j0:j0 + rows], cand)  # (b, rows, kc L)
                torch.maximum(best[b0:b0 + b_chunk, j0:j0 + rows], sim.amax(dim=2),
                              out=best[b0:b0 + b_chunk, j0:j0 + rows])
    return best
