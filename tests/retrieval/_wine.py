"""Wine features as a MIPS problem made outside ``mlpapers.datasets`` (shared by the
AMIPS other-data and centring tests)."""

import numpy as np
from sklearn.datasets import load_wine


def wine_keys_and_queries():
    """120 standardised wines as keys; 20 noisy copies of the other 58 as queries,
    split 800 (training) / 360 (test). 30 keys ever win; the most frequent answers
    11.7% of the test queries."""
    X = load_wine().data
    X = (X - X.mean(0)) / X.std(0)
    rng = np.random.default_rng(0)
    p = rng.permutation(len(X))
    K, rest = X[p[:120]], X[p[120:]]
    Q = np.vstack([rest + 0.1 * rng.standard_normal(rest.shape) for _ in range(20)])
    return K, Q[:800], Q[800:]
