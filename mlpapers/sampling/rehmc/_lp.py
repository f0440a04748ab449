"""Linear programs of :class:`~mlpapers.sampling.Polytope` (scipy's HiGHS).

The Chebyshev centre and radius, the boundedness test, and the interior point near
the origin used for unbounded polytopes. All take unit-norm rows ``A`` of ``{A x <= b}``.
"""

from __future__ import annotations

import numpy as np

_MAX_RADIUS = 1e6  # cap of the Chebyshev radius: an unbounded polytope reaches it


def _chebyshev_lp(A: np.ndarray, b: np.ndarray, capped: bool = True):
    """Chebyshev-centre LP of ``{A x <= b}`` with unit rows: ``res.x = (centre, radius)``,
    the radius capped at ``_MAX_RADIUS`` when ``capped`` (an unbounded polytope's LP has
    no maximum; a bounded one's radius is its own at any scale)."""
    from scipy.optimize import linprog

    m, d = A.shape
    c = np.zeros(d + 1)
    c[-1] = -1.0  # maximise the radius
    return linprog(c, A_ub=np.hstack([A, np.ones((m, 1))]), b_ub=b,
                   bounds=[(None, None)] * d + [(0, _MAX_RADIUS if capped else None)],
                   method="highs")


def _is_unbounded(A: np.ndarray) -> bool:
    """Whether ``{A x <= b}`` (non-empty) is unbounded: its recession cone ``{u : A u <= 0}``
    is not ``{0}``, i.e. the rows do not positively span ``R^d`` (rank ``d`` and some
    ``y > 0`` with ``A^T y = 0``; by scaling, some ``y >= 1``: a feasibility LP, solved
    by the dual simplex about as fast as the Chebyshev LP)."""
    from scipy.optimize import linprog

    m, d = A.shape
    if np.linalg.matrix_rank(A) < d:
        return True
    res = linprog(np.zeros(m), A_eq=A.T, b_eq=np.zeros(d), bounds=[(1.0, None)] * m,
                  method="highs-ds")
    return res.status != 0


def _nearest_inner_point(A: np.ndarray, b: np.ndarray, radius: float = 1.0
                         ) -> np.ndarray | None:
    """The point ``x`` of smallest ``max_i |x_i|`` whose ball of ``radius`` lies in
    ``{A x <= b}`` (unit rows), or ``None`` if the LP fails (no such ball fits)."""
    from scipy.optimize import linprog

    m, d = A.shape
    c = np.zeros(d + 1)
    c[-1] = 1.0  # minimise s with -s <= x_i <= s
    eye = np.eye(d)
    A_ub = np.vstack([np.hstack([A, np.zeros((m, 1))]),
                      np.hstack([eye, -np.ones((d, 1))]),
                      np.hstack([-eye, -np.ones((d, 1))])])
    b_ub = np.concatenate([b - radius, np.zeros(2 * d)])
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, bounds=[(None, None)] * d + [(0, None)],
                  method="highs")
    return res.x[:d] if res.status == 0 else None
