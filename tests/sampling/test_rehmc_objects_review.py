"""Box bounds stay consistent with the fold; results compare by identity; diagnostics
refuse non-numeric draws."""

import copy
import pickle

import numpy as np
import pytest

from mlpapers.sampling import Box, ReflectiveHMC, ess, rhat


def test_box_bounds_cannot_go_stale():
    # the fold's widths were computed once: box.hi = ... (or box.hi[:] = ...) after
    # construction gave 66% of the draws outside the new box, silently
    box = Box([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="read-only"):
        box.hi[:] = 0.5
    box.hi = np.array([0.5, 0.5])
    res = ReflectiveHMC(lambda x: -(x**2).sum(-1), box, n_leapfrog=5, random_state=0).sample(
        100, [0.25, 0.25], n_chains=2, warmup=50)
    assert box.contains(res.samples.reshape(-1, 2)).all() and res.samples.max() > 0.4
    np.testing.assert_array_equal(box.width(), [0.5, 0.5])
    box.lo = -1.0  # a scalar is broadcast, as in the constructor
    np.testing.assert_array_equal(box.lo, [-1.0, -1.0])
    np.testing.assert_array_equal(box.width(), [1.5, 1.5])


def test_box_bound_assignment_is_checked_and_all_or_nothing():
    box = Box([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="lo < hi"):
        box.hi = [-1.0, 2.0]
    np.testing.assert_array_equal(box.hi, [1.0, 1.0])
    np.testing.assert_array_equal(box.width(), [1.0, 1.0])
    for other in (pickle.loads(pickle.dumps(box)), copy.deepcopy(box)):
        np.testing.assert_array_equal(other.hi, box.hi)
        with pytest.raises(ValueError, match="read-only"):
            other.lo[0] = 5.0


def test_box_pickled_with_plain_bound_attributes_loads():
    box = Box([0.0], [2.0])
    state = {k: v for k, v in box.__dict__.items() if k not in ("_lo", "_hi")}
    state.update(lo=np.array([0.0]), hi=np.array([3.0]))  # (the former layout)
    old = Box.__new__(Box)
    old.__setstate__(state)
    np.testing.assert_array_equal(old.width(), [3.0])
    assert not old.hi.flags.writeable


def test_results_compare_by_identity_and_hash():
    # the dataclass __eq__ compared array fields as tuples: "truth value of an array
    # with more than one element is ambiguous"
    res = ReflectiveHMC(lambda x: -(x**2).sum(-1), Box([-1.0], [1.0]), n_leapfrog=3,
                        random_state=0).sample(10, n_chains=2, warmup=10)
    again = pickle.loads(pickle.dumps(res))
    assert res == res and res != again and len({res, again}) == 2


@pytest.mark.parametrize("draws", [[[None] * 8] * 2,
                                   np.array([[1, 2, 3, 4, "a"]], dtype=object)])
@pytest.mark.parametrize("diagnostic", [ess, rhat])
def test_diagnostics_refuse_non_numeric_draws(draws, diagnostic):
    with pytest.raises(TypeError, match="draws must hold real numbers .* got dtype object"):
        diagnostic(draws)
