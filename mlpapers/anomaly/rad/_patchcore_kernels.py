"""Kernels of the PatchCore baseline: chunked k-NN distances and the greedy coreset.

Re-exported from :mod:`mlpapers.anomaly.rad._kernels`.
"""

from __future__ import annotations

import math

import torch

from mlpapers._utils import ProgressLogger
from mlpapers._utils._blocks import collect_row_blocks

__all__ = ["greedy_coreset", "knn_distances"]


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
    running top-k over memory chunks, so memory is bounded by ``chunk_size``. Both
    sides are first centred on the memory mean (distances are unchanged): the
    identity cancels catastrophically in float32 when the features share a large
    common offset, as non-negative CNN activations do; the distances of the
    selected neighbours are then recomputed directly (exact down to 0).

    Parameters
    ----------
    query : Tensor of shape (Q, C)
    memory : Tensor of shape (P, C)
    k : int, default=1
    chunk_size : int, default=2**24
        Maximum number of (query, memory) pairs per chunk (queries in blocks of
        at most 4096, and at most ``chunk_size``).
    exclude_query_group, memory_group : LongTensor of shape (Q,) and (P,), optional
        Pairs with equal group ids are skipped (leave-one-image-out scores).

    Returns
    -------
    Tensor of shape (Q, k), float32, sorted ascending.
    """
    Q, P = query.shape[0], memory.shape[0]
    q_block = max(1, min(Q, 4096, int(chunk_size)))  # q_block * m_block <= chunk_size
    m_block = max(1, int(chunk_size) // q_block)
    center = (memory.float().sum(0) / P) if P else query.new_zeros(query.shape[1]).float()
    # the per-block results are written into outputs allocated once (collect_row_blocks):
    # a list of small results kept between the large transient distance blocks pins the
    # heap and the resident memory grows by blocks (mlpapers._utils._blocks)
    m2 = collect_row_blocks(
        lambda ms: (memory[ms].float() - center).pow(2).sum(1), P, m_block
    ) if P else memory.new_zeros(0).float()

    def nearest(qs: slice) -> torch.Tensor:
        q = query[qs].float() - center
        q2 = (q * q).sum(1, keepdim=True)
        best = torch.full((len(q), 0), torch.inf, dtype=torch.float32, device=q.device)
        best_idx = torch.zeros((len(q), 0), dtype=torch.long, device=q.device)
        for ms in range(0, P, m_block):
            m = memory[ms:ms + m_block].float() - center
            # (|q|^2 + |m|^2) - 2 q.m, rounded as the plain expression (the factor -2 is
            # exact), with one (q, m) block in place of three
            d2 = torch.addmm(q2 + m2[None, ms:ms + m_block], q, m.T, alpha=-2.0)
            d2.clamp_min_(0.0)
            if exclude_query_group is not None and memory_group is not None:
                d2.masked_fill_(exclude_query_group[qs, None]
                                == memory_group[None, ms:ms + m_block], torch.inf)
            vals, pos = torch.topk(d2, min(k, d2.shape[1]), dim=1, largest=False)
            del d2
            both = torch.cat([best, vals], dim=1)  # merge with the running top-k
            idx = torch.cat([best_idx, pos + ms], dim=1)
            best, pos = torch.topk(both, min(k, both.shape[1]), dim=1, largest=False)
            best_idx = idx.gather(1, pos)
        # the identity loses ~sqrt(eps) * |x| near zero: recompute the selected pairs directly
        diff = q[:, None, :] - (memory[best_idx.reshape(-1)].float() - center).reshape(
            *best_idx.shape, memory.shape[1])
        exact = diff.pow(2).sum(-1)
        best = torch.where(torch.isfinite(best), exact, best)
        return best.sort(dim=1).values

    if Q == 0:
        return torch.empty(0, min(k, P) if P else 0, dtype=torch.float32,
                           device=query.device)
    return collect_row_blocks(nearest, Q, q_block).sqrt_()


def greedy_coreset(
    features: torch.Tensor,
    n_select: int,
    generator: torch.Generator | None = None,
    projection_dim: int | None = 128,
    verbose: int = 0,
    return_assignment: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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
    verbose : int, default=0
        Show a progress bar over the selections (one pass over the rows each).
    return_assignment : bool, default=False
        Also return each row's nearest selected row (the one that covers it).

    Returns
    -------
    LongTensor of shape (n_select,)
        Selected row indices, in selection order.
    LongTensor of shape (P,)
        Only with ``return_assignment``: for each row, the position in the selection
        of its nearest selected row, in the (projected) distances of the selection.
    """
    P, C = features.shape
    n_select = max(1, min(int(n_select), P))
    x = features.float()
    if projection_dim is not None and C > projection_dim:
        # float32 whatever the default dtype: the same projection (and coreset)
        proj = torch.randn(C, projection_dim, generator=generator, dtype=torch.float32,
                           device="cpu").to(x.device)
        x = x @ (proj / math.sqrt(projection_dim))
    x = x - x.mean(0)  # same distances, less float32 cancellation in the identity below
    first = int(torch.randint(P, (1,), generator=generator).item())
    selected = torch.empty(n_select, dtype=torch.long, device=x.device)
    selected[0] = first
    x2 = x.pow(2).sum(1)
    min_d = (x2 - 2.0 * (x @ x[first]) + x2[first]).clamp_min_(0.0)
    assignment = (torch.zeros(P, dtype=torch.long, device=x.device) if return_assignment
                  else None)
    for i in ProgressLogger(n_select, verbose=verbose, desc="greedy coreset"):
        if i == 0:
            continue
        nxt = torch.argmax(min_d)
        selected[i] = nxt
        d = (x2 - 2.0 * (x @ x[nxt]) + x2[nxt]).clamp_min_(0.0)
        if assignment is not None:
            assignment.masked_fill_(d < min_d, i)
        torch.minimum(min_d, d, out=min_d)
    return (selected, assignment) if assignment is not None else selected
