"""Pure tensor kernels of RAD and the PatchCore baseline.

Shapes use ``B`` query images, ``N`` memory images, ``L = h * w`` grid
positions, ``C`` channels, ``k`` retrieved images and ``M`` window positions.
Nothing here holds state; the estimators in :mod:`._estimator` compose these
functions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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
    """Divide ``x`` by its L2 norm along ``dim`` (zero vectors stay zero)."""
    return x / x.norm(dim=dim, keepdim=True).clamp_min(eps)


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
        (``M = (2r+1)^2``, or ``L`` when ``radius is None``). Cells outside the
        grid are padded with ``j`` itself.
    mask : BoolTensor of shape (L, M)
        ``True`` where the cell lies inside the grid (the window is clipped at the
        borders, as in the official code).
    """
    L = h * w
    if radius is None:
        index = torch.arange(L, device=device).expand(L, L)
        return index, torch.ones(L, L, dtype=torch.bool, device=device)
    r = int(radius)
    offs = torch.arange(-r, r + 1, device=device)
    dy, dx = torch.meshgrid(offs, offs, indexing="ij")
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
        Sorted by decreasing similarity, ``k' = min(k, available)``. Ties are
        broken by the lower index, so results do not depend on the batch.
    """
    q = l2_normalize(query_keys.float())
    m = l2_normalize(memory_keys.float())
    sim = q @ m.T  # (B, N)
    n_avail = m.shape[0]
    if exclude is not None:
        rows = torch.nonzero(exclude >= 0).squeeze(1)
        sim[rows, exclude[rows]] = -torch.inf
        n_avail -= int((exclude >= 0).any())
    k = max(1, min(int(k), n_avail))
    # stable descending sort gives deterministic tie-breaking (topk does not)
    return torch.sort(sim, dim=1, descending=True, stable=True).indices[:, :k]


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
        ``(rows, k, M, C)`` (64 MB in float32 by default).

    Returns
    -------
    Tensor of shape (B, L), float32
        ``max_{n in R, m in window(j)} <q_j, P[n, m]>``.
    """
    B, L, C = query.shape
    k = neighbours.shape[1]
    M = index.shape[1]
    rows_per_chunk = max(1, int(chunk_size) // (k * M * C))
    q_rows = query.reshape(B * L, C).float()
    out = torch.empty(B * L, dtype=torch.float32, device=query.device)
    for start in range(0, B * L, rows_per_chunk):
        rows = torch.arange(start, min(start + rows_per_chunk, B * L), device=query.device)
        b, j = rows // L, rows % L
        img = neighbours[b][:, :, None]  # (R, k, 1)
        pos = index[j][:, None, :]  # (R, 1, M)
        cand = memory[img, pos].float()  # (R, k, M, C)
        sim = torch.bmm(cand.reshape(len(rows), k * M, C), q_rows[rows, :, None])
        sim = sim.reshape(len(rows), k, M).masked_fill(~mask[j][:, None, :], -torch.inf)
        out[rows] = sim.amax(dim=(1, 2))
    return out.reshape(B, L)


def tiled_patch_similarity(
    query: torch.Tensor,
    memory: torch.Tensor,
    neighbours: torch.Tensor,
    grid: tuple[int, int],
    radius: int,
    tile: int = 8,
    chunk_size: int = 2**24,
) -> torch.Tensor:
    """Positional matching by tiles: the same result as :func:`positional_patch_similarity`.

    The query grid is cut into ``tile x tile`` tiles; a tile's candidates are the
    ``(tile + 2r)^2`` memory cells around it (zero-padded at the borders). One
    batched matmul per chunk scores every query cell of a tile against every
    candidate cell of every retrieved image; the ``(2r+1)^2`` window of each
    cell is then picked with a static padded index and a validity mask, and
    max-reduced. Compared with gathering every window separately this reads the
    memory about once instead of ``(2r+1)^2`` times and runs as dense matmuls,
    at the price of ``(tile + 2r)^2 / (2r+1)^2`` times more multiply-adds.

    Parameters
    ----------
    query : Tensor of shape (B, L, C)
        L2-normalised query patches, ``L = h * w``.
    memory : Tensor of shape (N, L, C)
        L2-normalised memory patches (any float dtype).
    neighbours : LongTensor of shape (B, k)
    grid : (int, int)
        ``(h, w)``.
    radius : int
        Window half-size ``r >= 0``.
    tile : int, default=8
    chunk_size : int, default=2**24
        Maximum number of values in one similarity / gathered chunk.

    Returns
    -------
    Tensor of shape (B, L), float32
    """
    B, L, C = query.shape
    h, w = grid
    k = neighbours.shape[1]
    r = int(radius)
    T = max(1, min(int(tile), max(h, w)))
    nth, ntw = -(-h // T), -(-w // T)
    Hp, Wp = nth * T, ntw * T
    P = T + 2 * r
    dev = query.device
    # static window index of every tile cell inside its (P x P) candidate block
    ty, tx = torch.meshgrid(torch.arange(T, device=dev), torch.arange(T, device=dev),
                            indexing="ij")
    offs = torch.arange(-r, r + 1, device=dev)
    dy, dx = torch.meshgrid(offs, offs, indexing="ij")
    win = ((ty.reshape(-1, 1) + r + dy.reshape(1, -1)) * P
           + (tx.reshape(-1, 1) + r + dx.reshape(1, -1)))  # (T*T, M)
    # validity of memory cells in the padded grid, cut into the same blocks
    valid = torch.zeros(Hp + 2 * r, Wp + 2 * r, dtype=torch.bool, device=dev)
    valid[r:r + h, r:r + w] = True
    valid = valid.unfold(0, P, T).unfold(1, P, T).reshape(nth * ntw, P * P)
    valid = valid[:, win]  # (n_tiles, T*T, M)
    q = query.float().reshape(B, h, w, C)
    q = F.pad(q, (0, 0, 0, Wp - w, 0, Hp - h))
    q = q.reshape(B, nth, T, ntw, T, C).permute(0, 1, 3, 2, 4, 5).reshape(B, nth * ntw, T * T, C)
    per_img = k * Hp * Wp * max(P * P, C * P * P // (T * T) + 1)
    b_chunk = max(1, int(chunk_size) // per_img)
    out = []
    for start in range(0, B, b_chunk):
        nb = neighbours[start:start + b_chunk]
        b = len(nb)
        mem = memory[nb].float().reshape(b * k, h, w, C).permute(0, 3, 1, 2)  # (bk, C, h, w)
        mem = F.pad(mem, (r, r + Wp - w, r, r + Hp - h))
        mem = mem.unfold(2, P, T).unfold(3, P, T)  # (bk, C, nth, ntw, P, P)
        mem = mem.reshape(b, k, C, nth * ntw, P * P).permute(0, 3, 2, 1, 4)
        mem = mem.reshape(b, nth * ntw, C, k * P * P)  # (b, t, C, k * PP)
        sim = torch.matmul(q[start:start + b], mem)  # (b, t, TT, k * PP): one gemm per tile
        sim = sim.reshape(b, nth * ntw, T * T, k, P * P)
        idx = win[None, None, :, None, :].expand(b, nth * ntw, T * T, k, win.shape[1])
        sim = sim.gather(-1, idx).masked_fill(~valid[None, :, :, None, :], -torch.inf)
        sim = sim.amax(dim=(3, 4))  # (b, t, TT)
        sim = sim.reshape(b, nth, ntw, T, T).permute(0, 1, 3, 2, 4).reshape(b, Hp, Wp)
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
        Maximum number of values in the similarity ``(B, L, kc * L)`` and gathered
        ``(B, kc * L, C)`` chunks.

    Returns
    -------
    Tensor of shape (B, L), float32
    """
    B, L, C = query.shape
    k = neighbours.shape[1]
    per_chunk = max(1, int(chunk_size) // (B * L * max(L, C)))
    q = query.float()
    best = torch.full((B, L), -torch.inf, device=query.device)
    for start in range(0, k, per_chunk):
        cand = memory[neighbours[:, start:start + per_chunk]].float()  # (B, kc, L, C)
        cand = cand.reshape(B, -1, C)
        sim = torch.bmm(q, cand.transpose(1, 2))  # (B, L, kc * L)
        best = torch.maximum(best, sim.amax(dim=2))
    return best


def knn_distances(
    query: torch.Tensor,
    memory: torch.Tensor,
    k: int = 1,
    chunk_size: int = 2**24,
    exclude_query_group: torch.Tensor | None = None,
    memory_group: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Euclidean distances to the ``k`` nearest memory rows, chunked.

    Uses :math:`\|a-b\|^2 = \|a\|^2 + \|b\|^2 - 2 a^\top b` (clamped at 0) with a
    running top-k over memory chunks, so memory is bounded by ``chunk_size``.

    Parameters
    ----------
    query : Tensor of shape (Q, C)
    memory : Tensor of shape (P, C)
    k : int, default=1
    chunk_size : int, default=2**24
        Maximum number of (query, memory) pairs per chunk (queries in blocks of
        4096).
    exclude_query_group, memory_group : LongTensor of shape (Q,) and (P,), optional
        Pairs with equal group ids are skipped (leave-one-image-out scores).

    Returns
    -------
    Tensor of shape (Q, k), float32, sorted ascending.
    """
    Q, P = query.shape[0], memory.shape[0]
    q_block = max(1, min(Q, 4096))
    m_block = max(1, int(chunk_size) // q_block)
    m2 = memory.float().pow(2).sum(1)
    out = []
    for qs in range(0, Q, q_block):
        q = query[qs:qs + q_block].float()
        q2 = (q * q).sum(1, keepdim=True)
        best = torch.full((len(q), 0), torch.inf, device=q.device)
        for ms in range(0, P, m_block):
            m = memory[ms:ms + m_block].float()
            d2 = (q2 + m2[None, ms:ms + m_block] - 2.0 * q @ m.T).clamp_min_(0.0)
            if exclude_query_group is not None and memory_group is not None:
                same = (exclude_query_group[qs:qs + q_block, None]
                        == memory_group[None, ms:ms + m_block])
                d2 = d2.masked_fill(same, torch.inf)
            both = torch.cat([best, d2], dim=1)
            best = torch.topk(both, min(k, both.shape[1]), dim=1, largest=False).values
        out.append(best)
    return torch.cat(out).sqrt()


def greedy_coreset(
    features: torch.Tensor,
    n_select: int,
    generator: torch.Generator | None = None,
    projection_dim: int | None = 128,
) -> torch.Tensor:
    """Greedy k-center coreset (the PatchCore memory subsampling).

    Starting from a random row, repeatedly add the row farthest from the
    selected set. Distances are computed in a random Gaussian projection of
    dimension ``projection_dim`` (Johnson-Lindenstrauss, as in PatchCore) when
    the features are wider.

    Parameters
    ----------
    features : Tensor of shape (P, C)
    n_select : int
        Number of rows to keep (clamped to ``P``).
    generator : torch.Generator, optional
        Seeds the start row and the projection.
    projection_dim : int or None, default=128

    Returns
    -------
    LongTensor of shape (n_select,)
        Selected row indices, in selection order.
    """
    P, C = features.shape
    n_select = max(1, min(int(n_select), P))
    x = features.float()
    if projection_dim is not None and C > projection_dim:
        proj = torch.randn(C, projection_dim, generator=generator, device="cpu").to(x.device)
        x = x @ (proj / math.sqrt(projection_dim))
    first = int(torch.randint(P, (1,), generator=generator).item())
    selected = torch.empty(n_select, dtype=torch.long, device=x.device)
    selected[0] = first
    x2 = x.pow(2).sum(1)
    min_d = (x2 - 2.0 * (x @ x[first]) + x2[first]).clamp_min_(0.0)
    for i in range(1, n_select):
        nxt = torch.argmax(min_d)
        selected[i] = nxt
        d = (x2 - 2.0 * (x @ x[nxt]) + x2[nxt]).clamp_min_(0.0)
        torch.minimum(min_d, d, out=min_d)
    return selected


def resize_maps(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of maps (B, h, w) -> (B, *size) (``align_corners=False``)."""
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return F.interpolate(maps[:, None], size=tuple(size), mode="bilinear",
                         align_corners=False)[:, 0]


def gaussian_blur(
    maps: torch.Tensor, sigma: float, kernel_size: int | None = None, padding: str = "zeros"
) -> torch.Tensor:
    """Separable Gaussian blur of maps (B, H, W).

    Parameters
    ----------
    maps : Tensor of shape (B, H, W)
    sigma : float
        Standard deviation in pixels; ``0`` returns ``maps`` unchanged.
    kernel_size : int or None
        Odd size; ``None`` uses ``2 * ceil(2 * sigma) + 1`` (5 for ``sigma=1``,
        the official RAD kernel).
    padding : {"zeros", "reflect"}, default="zeros"
        ``"zeros"`` matches the official code (it darkens a 2-pixel border).

    Returns
    -------
    Tensor of shape (B, H, W)
    """
    if sigma <= 0:
        return maps
    if kernel_size is None:
        kernel_size = 2 * math.ceil(2 * sigma) + 1
    half = kernel_size // 2
    t = torch.arange(kernel_size, dtype=torch.float32, device=maps.device) - half
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    g = (g / g.sum()).to(maps.dtype)
    x = maps[:, None]
    if padding == "reflect":
        ph = min(half, maps.shape[-2] - 1)
        pw = min(half, maps.shape[-1] - 1)
        x = F.pad(x, (pw, pw, ph, ph), mode="reflect")
        x = F.pad(x, (half - pw, half - pw, half - ph, half - ph))
    else:
        x = F.pad(x, (half, half, half, half))
    x = F.conv2d(x, g.view(1, 1, -1, 1))
    x = F.conv2d(x, g.view(1, 1, 1, -1))
    return x[:, 0]


def top_ratio_pool(maps: torch.Tensor, ratio: float) -> torch.Tensor:
    """Mean of the top ``ratio`` fraction of each map's pixels (at least one pixel).

    Parameters
    ----------
    maps : Tensor of shape (B, H, W) or (B, P)
    ratio : float in [0, 1]
        ``0`` is the plain maximum.

    Returns
    -------
    Tensor of shape (B,)
    """
    flat = maps.reshape(maps.shape[0], -1)
    n = max(1, int(flat.shape[1] * float(ratio)))
    return torch.topk(flat, n, dim=1).values.mean(dim=1)
