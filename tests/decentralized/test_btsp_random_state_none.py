"""``bottleneck_tsp(random_state=None)`` follows scikit-learn's convention: one seed from
numpy's global ``RandomState`` (it read fresh OS entropy, so ``np.random.seed`` did not
make it reproducible, unlike every other function of the package)."""

import numpy as np

from mlpapers.decentralized.btsp import bottleneck_tsp

PTS = np.random.default_rng(0).random((60, 2))
D = np.linalg.norm(PTS[:, None] - PTS[None], axis=-1)


def test_np_random_seed_makes_the_default_reproducible():
    tours = set()
    for _ in range(3):
        np.random.seed(0)
        tours.add(tuple(bottleneck_tsp(D)[0]))
    assert len(tours) == 1


def test_the_default_takes_one_draw_from_the_global_stream():
    np.random.seed(0)
    bottleneck_tsp(D)
    second = bottleneck_tsp(D)[0]     # the global stream moved on: another seed
    np.random.seed(0)
    np.random.randint(0, 2**31 - 1)   # the one draw the first call made
    assert np.array_equal(bottleneck_tsp(D)[0], second)


def test_a_random_state_instance_is_accepted_and_reproducible():
    a = bottleneck_tsp(D, random_state=np.random.RandomState(3))[0]
    b = bottleneck_tsp(D, random_state=np.random.RandomState(3))[0]
    np.testing.assert_array_equal(a, b)
