"""SCENT at user scale: resident memory of predict grows with the output only."""

from tests._scale import peak_mb, requires_peak_rss

_FITTED = """
import numpy as np
from mlpapers.datasets import make_extreme_classification
from mlpapers.optim import SCENTClassifier
X, y = make_extreme_classification(5000, 5000, 8, min_samples_per_class=1, random_state=0)
clf = SCENTClassifier(n_negatives=4, epochs=1, random_state=0).fit(X, y)
X = np.random.default_rng(0).standard_normal((40000, 8))
"""


@requires_peak_rss
def test_predict_resident_memory_is_bounded_by_one_block():
    # predict kept each 32 MB logit block's argmax in a list: every block pinned new heap
    # memory (40 000 rows x 5 000 classes = 48 blocks: 1.5 GB). Bound: the float64 copy of
    # X (2.6 MB), the output (0.3 MB) and a few blocks of transient logits and matmul
    # temporaries (2 x 32 MB each), with room for the allocator, whose retention varies
    # from run to run (65 to 193 MB over three runs of the same code, 324 MB once in CI):
    # 500 MB, a third of the regression's 1.5 GB.
    assert peak_mb(_FITTED, "clf.predict(X)") < 500
