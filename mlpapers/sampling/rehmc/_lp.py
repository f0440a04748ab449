"""Linear programs of :class:`~mlpapers.sampling.Polytope` (scipy's HiGHS).

The Chebyshev centre and radius, the boundedness test, and the interior point near
the origin used for unbounded polytopes. All take unit-norm rows ``A`` of ``{A x <= b}``.
"""

from __future__ import annotations

import numpy as np

from mlpapers._utils import power_of_two_unit

_MAX_RADIUS = 1e6  # cap of the Chebyshev radius: an unbounded polytope reaches it


def _rhs_unit(b: np.ndarray) -> float:
    """The power of two the right-hand sides are divided by before HiGHS sees them (the
    one at or below max|b|, outside [2**-20, 2**20]; 1 inside): its bounds of 1e20 read
    as infinite and its tolerances are absolute, so a problem is solved at unit scale
    and its solution scaled back exactly (the LPs are homogeneous in (x, b))."""
    return power_of_two_unit(float(np.abs(b).max()) if b.size else 0.0, 20)


def _chebyshev_lp(A: np.ndarray, b: np.ndarray, capped: bool = True):
    """Chebyshev-centre LP of ``{A x <= b}`` with unit rows: ``res.x = (centre, radius)``,
    the radius capped at ``_MAX_RADIUS`` when ``capped`` (an unbounded polytope's LP has
    no maximum; a bounded one's radius is its own at any scale)."""
    from scipy.optimize import linprog

    m, d = A.shape
    c = np.zeros(d + 1)
    c[-1] = -1.0  # maximise the radius
    # at unit scale (_rhs_unit): unscaled, a bounded triangle with b = 1e21 came out
    # "unbounded" and an inradius of 1e-13 read as 0; res.scale is the unit
    scale = _rhs_unit(b)
    res = linprog(c, A_ub=np.hstack([A, np.ones((m, 1))]), b_ub=b / scale,
                  bounds=[(None, None)] * d + [(0, _MAX_RADIUS / scale if capped else None)],
                  method="highs")
    if res.x is not None:
        res.x = res.x * scale
    res.scale = scale
    return res


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


def _extreme_points(A: np.ndarray, b: np.ndarray, n_pairs: int = 4) -> np.ndarray:
    """Points of the bounded ``{A x <= b}`` (unit rows) that maximise and minimise
    ``u_k^T x`` for ``n_pairs`` fixed generic directions ``u_k`` (a generator seeded by
    the shape, so the same polytope always gets the same points): ``2 n_pairs`` LPs,
    shape ``(<= 2 n_pairs, d)`` (an LP that fails adds no row). Along a generic direction
    the optimum of a long, thin polytope lies at one of its far ends, which rays in
    random directions from the centre almost never reach."""
    from scipy.optimize import linprog

    m, d = A.shape
    dirs = np.random.default_rng([m, d]).standard_normal((n_pairs, d))
    scale = _rhs_unit(b)  # (as for the Chebyshev LP)
    ends = []
    for u in np.concatenate([dirs, -dirs]):
        res = linprog(-u, A_ub=A, b_ub=b / scale, bounds=[(None, None)] * d, method="highs")
        if res.status == 0:
            ends.append(res.x * scale)
    return np.asarray(ends, dtype=np.float64).reshape(-1, d)
