"""Detectors reading image files in several threads leave the warnings machinery alone.

Each batch of files used to be decoded inside ``warnings.catch_warnings(record=True)``
with an "always" filter. That swaps process-wide state: calls overlapping in threads
restored each other's copies, leaving ``("always", ..., Warning)`` first in the filters
and every later warning of the process appended to a leftover list, never shown.
"""

import concurrent.futures as cf
import warnings

import numpy as np
import pytest
from PIL import Image

from mlpapers.anomaly import PatchCoreDetector, RADDetector


@pytest.fixture
def paths(tmp_path):
    rng = np.random.default_rng(0)
    out = []
    for i in range(8):  # large enough to decode that the threads' batches overlap
        p = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(p)
        out.append(p)
    return out


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_concurrent_fits_on_files_keep_the_filters_and_warnings(cls, paths):
    filters = list(warnings.filters)
    shown = warnings.showwarning

    def fit(_):
        return cls(extractor="random", image_size=32, batch_size=1, random_state=0).fit(paths)

    with cf.ThreadPoolExecutor(3) as ex:
        fitted = list(ex.map(fit, range(3)))
    assert warnings.filters == filters
    assert warnings.showwarning is shown
    with pytest.warns(UserWarning, match="still shown"):
        warnings.warn("still shown", UserWarning, stacklevel=1)
    scores = {tuple(d.decision_scores_) for d in fitted}
    assert len(scores) == 1   # the same fit in every thread


def test_float_files_still_warn_once_per_call_from_threads(tmp_path):
    for i in range(4):  # float ("F") images with values up to 3: outside [0, 1]
        im = (np.random.default_rng(i).random((20, 20)) * 3).astype(np.float32)
        Image.fromarray(im, mode="F").save(tmp_path / f"{i}.tif")
    files = sorted(tmp_path.glob("*.tif"))

    def fit(_):
        with warnings.catch_warnings(record=True) as record:   # (one thread at a time)
            warnings.simplefilter("always")
            RADDetector(extractor="random", image_size=16, batch_size=2).fit(files)
        return record

    record = fit(0)
    assert len([w for w in record if "float images" in str(w.message)]) == 1
    with cf.ThreadPoolExecutor(2) as ex:   # no error; the filters are restored afterwards
        list(ex.map(lambda _: RADDetector(extractor="random", image_size=16,
                                          batch_size=2).fit(files), range(2)))
