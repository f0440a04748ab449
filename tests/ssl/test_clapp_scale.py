"""CLAPP at user scale: memory of ``transform`` on many images."""

from __future__ import annotations

import numpy as np

from mlpapers.ssl import CLAPPEncoder
from tests._scale import peak_mb, requires_peak_rss

_SETUP = """
import numpy as np
from mlpapers.ssl import CLAPPEncoder
rng = np.random.default_rng(0)
enc = CLAPPEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(
    rng.random((8, 1, 8, 8), dtype=np.float32))
X = rng.random(({n}, 1, 8, 8), dtype=np.float32)
"""
# tiny architecture on 8x8 images: block maps 8x8, 4x4, 2x2 of 16, 32, 64 channels,
# pooled to grids 4, 4, 2: 16*16 + 32*16 + 64*4 = 1024 float32 features per image
_CALL = "F = enc.transform(X, spatial_pool=[4, 4, 2])"
_FEATURES = 1024


@requires_peak_rss
def test_transform_memory_grows_by_the_output_once():
    # The chunks' features used to be kept in a list and concatenated (the features
    # held twice) and then checked with torch.isfinite on the whole output (temporaries
    # of 1.5 outputs): the peak grew by 4 times the output (measured: 124 MB for 31 MB).
    # Written into one output and checked per chunk, it grows by the output itself
    # (one chunk's temporaries are the same at both sizes); 30 % slack for the allocator.
    n_small, n_big = 2_000, 10_000
    small = peak_mb(_SETUP.format(n=n_small), _CALL)
    big = peak_mb(_SETUP.format(n=n_big), _CALL)
    grown_output_mb = (n_big - n_small) * _FEATURES * 4 / 2**20  # 31 MB
    assert big - small < 1.3 * grown_output_mb, (small, big, grown_output_mb)


def test_transform_in_chunks_equals_chunks_transformed_alone():
    # the output written chunk by chunk (256 images each) is, bitwise, the features of
    # the same chunks transformed on their own, and each image's features are those of
    # the image alone up to float rounding (convolutions round by batch size)
    rng = np.random.default_rng(1)
    enc = CLAPPEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(
        rng.random((8, 1, 8, 8), dtype=np.float32))
    X = rng.random((600, 1, 8, 8), dtype=np.float32)
    full = enc.transform(X, spatial_pool=[4, 4, 2])
    assert full.shape == (600, _FEATURES) and full.dtype == np.float32
    parts = np.concatenate([enc.transform(X[s:s + 256], spatial_pool=[4, 4, 2])
                            for s in range(0, 600, 256)])
    np.testing.assert_array_equal(full, parts)
    for i in (0, 255, 256, 599):
        one = enc.transform(X[i:i + 1], spatial_pool=[4, 4, 2])
        np.testing.assert_allclose(full[i:i + 1], one, rtol=1e-5, atol=1e-6)
    top = enc.transform(X, layers=[0, 2], spatial_pool=[4, 4, 2])
    np.testing.assert_array_equal(top, np.concatenate([full[:, :256], full[:, 768:]], axis=1))
