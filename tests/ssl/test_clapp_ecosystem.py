"""Audit regressions: the encoders in scikit-learn workflows (set_output, pipelines)."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder

pd = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def data():
    return make_shifted_digits(n_samples=48, random_state=0)


@pytest.mark.parametrize("cls", [CLAPPEncoder, GlobalSSLEncoder])
def test_pandas_output_names_the_columns_of_the_requested_layers(data, cls):
    X, _ = data
    enc = cls(architecture="tiny", n_epochs=1, batch_size=16, random_state=0).fit(X)
    arrays = {}
    for kw in [{}, {"layers": 0}, {"layers": [2, 0]}, {"spatial_pool": 1},
               {"layers": -1, "spatial_pool": 3}]:
        arrays[str(kw)] = enc.transform(X[:3], **kw)
    enc.set_output(transform="pandas")
    for kw in [{}, {"layers": 0}, {"layers": [2, 0]}, {"spatial_pool": 1},
               {"layers": -1, "spatial_pool": 3}]:
        # the columns used to be get_feature_names_out() (every layer): a length error
        df = enc.transform(X[:3], **kw)
        assert isinstance(df, pd.DataFrame)
        assert list(df.columns) == list(enc.get_feature_names_out(**kw))
        np.testing.assert_array_equal(df.to_numpy(), arrays[str(kw)])
    assert isinstance(enc.fit_transform(X), pd.DataFrame)
    enc.set_output(transform="default")
    assert isinstance(enc.transform(X[:3], layers=0), np.ndarray)


def test_pipeline_with_pandas_output(data):
    X, y = data
    pipe = make_pipeline(CLAPPEncoder(architecture="tiny", n_epochs=1, batch_size=16,
                                      random_state=0),
                         StandardScaler(), LogisticRegression(max_iter=1000))
    pipe.set_output(transform="pandas").fit(X, y)
    feats = pipe[:-1].transform(X[:4])
    assert isinstance(feats, pd.DataFrame)
    assert list(feats.columns) == list(pipe[0].get_feature_names_out())
    assert pipe.predict(X[:4]).shape == (4,)
