"""Inputs refused or taken without noise: ``score``'s label count before the extraction,
a list item that is not an image file, and very large ``layer_weights``."""

import warnings

import numpy as np
import pytest

from mlpapers.anomaly.rad import RADDetector
from mlpapers.datasets import make_texture_anomalies


class _CountingExtractor:
    """The random extractor, counting the images it is asked for."""

    def __init__(self):
        from mlpapers.anomaly.rad import RandomConvExtractor

        self.inner, self.images = RandomConvExtractor(), 0

    def __call__(self, x):
        self.images += len(x)
        return self.inner(x)


@pytest.fixture(scope="module")
def data():
    X_train, X_test, y, _ = make_texture_anomalies(6, 4, image_size=32, random_state=0)
    return X_train, X_test, y


@pytest.mark.parametrize("as_list", [False, True])
def test_score_refuses_a_label_count_other_than_the_images_before_extracting(data, as_list):
    X_train, X_test, y = data
    ext = _CountingExtractor()
    det = RADDetector(extractor=ext, image_size=None, k_images=2).fit(X_train)
    seen = ext.images
    X = list(X_test) if as_list else X_test
    with pytest.raises(ValueError, match="y has 2 labels, but X holds 4 images"):
        det.score(X, [0, 1])
    assert ext.images == seen  # no image was extracted
    assert 0.0 <= det.score(X, y) <= 1.0 and ext.images == seen + len(X_test)


def test_a_file_that_is_not_an_image_is_a_value_error_naming_it(data, tmp_path):
    X_train, _, _ = data
    det = RADDetector(extractor="random", image_size=None, k_images=2).fit(X_train)
    path = tmp_path / "notes.txt"
    path.write_text("not an image")
    with pytest.raises(ValueError, match=r"X holds .*notes\.txt.*not an image file"):
        det.decision_function([path])


def test_huge_finite_layer_weights_are_taken_without_overflow_warnings(data):
    X_train, X_test, _ = data
    ref = RADDetector(extractor="random", image_size=None, k_images=2).fit(X_train)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in reduce"
        det = RADDetector(extractor="random", image_size=None, k_images=2,
                          layer_weights=[1e308, 1e308]).fit(X_train)
        scores = det.decision_function(X_test)
    # equal weights, as the default's
    np.testing.assert_allclose(scores, ref.decision_function(X_test), rtol=1e-6)
    with pytest.raises(ValueError, match="layer_weights"):
        RADDetector(extractor="random", layer_weights=[]).fit(X_train)


@pytest.mark.parametrize("name", ["RADDetector", "PatchCoreDetector"])
def test_input_tags_say_images_not_tables(name):
    from sklearn.utils import get_tags

    import mlpapers.anomaly.rad as rad

    tags = get_tags(getattr(rad, name)()).input_tags
    assert not tags.two_d_array and tags.three_d_array
    with pytest.raises(ValueError, match="a table of rows"):
        getattr(rad, name)(extractor="random", image_size=None).fit(np.random.rand(8, 64))
