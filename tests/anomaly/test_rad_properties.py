"""Properties that must hold for every valid input, on inputs hypothesis generates.

RAD and its PatchCore baseline, with the torch-only random-conv extractor on tiny
images (2 to 18 pixels a side, so grids down to 1x1) so that every example takes a
few milliseconds. ``PROP_EXAMPLES`` raises the number of examples for exploration
(``HYPOTHESIS_PROFILE=explore PROP_EXAMPLES=500 pytest tests/anomaly/test_rad_properties.py``).

Tolerances: the detectors compute cosines of L2-normalised float32 features (a
cosine of C-dimensional unit vectors is exact to about ``C * 2**-24 < 1e-5`` for the
C <= 64 channels used here) and then apply linear, non-negative, sum-preserving
operators (bilinear upsampling, the Gaussian blur, top-fraction means), which do not
amplify an absolute error; ``1e-5`` absolute is therefore a bound, not a fit.
"""

import os
import pickle
import tempfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector, RandomConvExtractor
from mlpapers.anomaly.rad._kernels import (
    global_patch_similarity,
    l2_normalize,
    retrieve_neighbours,
)
from mlpapers.anomaly.rad._matching import positional_similarity

N_EX = int(os.environ.get("PROP_EXAMPLES", 15))
ATOL = 1e-5
MATCHINGS = ("auto", "shared", "tiled", "gather")
# a small extractor (2 layers, 8 and 16 channels) keeps every example fast
EXT = RandomConvExtractor(channels=(8, 16), seed=3)


# -- strategies -------------------------------------------------------------------------
@st.composite
def image_sets(draw, min_n=1, max_n=6, min_side=2, max_side=18):
    """Float32 (n, 3, H, W) images in [0, 1]: noise, smooth blobs, binary or few-level
    (integer-valued) images, with duplicated images and odd, non-square sizes. Images
    are never uniform mid-gray, for which the extractor gives all-zero features (see
    ``test_memory_images_score_zero``)."""
    n = draw(st.integers(min_n, max_n))
    H = draw(st.integers(min_side, max_side))
    W = draw(st.integers(min_side, max_side))
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["noise", "smooth", "binary", "levels"]))
    rng = np.random.default_rng(seed)
    X = rng.random((n, 3, H, W), dtype=np.float32)
    if kind == "smooth":
        X = F.avg_pool2d(torch.from_numpy(X), 3, stride=1, padding=1,
                         count_include_pad=False).numpy()
    elif kind == "binary":
        X = (X > 0.5).astype(np.float32)
    elif kind == "levels":
        X = np.round(X * 4) / 4
    n_dup = draw(st.integers(0, n - 1))  # the last n_dup images copy earlier ones
    for i in range(n - n_dup, n):
        X[i] = X[rng.integers(0, n - n_dup)]
    return np.ascontiguousarray(X, dtype=np.float32)


def rad_params():
    return st.fixed_dictionaries({
        "k_images": st.integers(1, 8),
        "pos_radius": st.one_of(st.none(), st.integers(0, 4)),
        "top_ratio": st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]),
        "smoothing_sigma": st.sampled_from([0.0, 0.5, 1.0, 2.0]),
        "matching": st.sampled_from(MATCHINGS),
        "blur_padding": st.sampled_from(["zeros", "reflect"]),
        "layer_weights": st.one_of(st.none(), st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]),
                                                       min_size=2, max_size=2)
                                   .filter(lambda w: sum(w) > 0)),
    })


def _rad(**kw):
    kw.setdefault("extractor", EXT)
    kw.setdefault("image_size", None)
    return RADDetector(**kw)


# -- an independent float64 reference of the whole RAD pipeline -------------------------------
def _reference_rad(X_train, X_test, *, k_images, pos_radius, top_ratio, smoothing_sigma,
                   blur_padding, layer_weights, exclude_self=False, map_size=None, **_):
    """RAD from its definition in float64 (maps at the input size, or at ``map_size``
    (h, w) when given, scores, retrieved sets).

    Retrieval ranks memory images by key cosine (ties: lower index); per layer the
    score of position j is 1 - max cosine over the retrieved images' patches inside
    the clipped (2r+1)^2 window; layers are upsampled bilinearly, fused with the
    normalised weights and blurred with a 2D Gaussian of 2 ceil(2 sigma) + 1 taps.
    """
    with torch.no_grad():
        f_tr, k_tr = EXT(torch.from_numpy(X_train))
        f_te, k_te = EXT(torch.from_numpy(X_test))
    cos = F.normalize(k_te.double(), dim=1) @ F.normalize(k_tr.double(), dim=1).T
    n_tr = len(X_train)
    H, W = X_test.shape[-2:] if map_size is None else map_size
    w = np.full(len(f_tr), 1.0 / len(f_tr)) if layer_weights is None else (
        np.asarray(layer_weights, float) / np.sum(layer_weights))
    maps = torch.zeros(len(X_test), H, W, dtype=torch.float64)
    sets, gaps = [], []
    for b in range(len(X_test)):
        cands = [i for i in range(n_tr) if not (exclude_self and i == b)]
        ranked = sorted(cands, key=lambda i: (-float(cos[b, i]), i))
        k = max(1, min(k_images, len(ranked)))
        sets.append(ranked[:k])
        # margin between the last retrieved and the first left-out image
        gaps.append(float(cos[b, ranked[k - 1]] - cos[b, ranked[k]]) if k < len(ranked)
                    else np.inf)
        for ft, fq, wl in zip(f_tr, f_te, w):
            mem = F.normalize(ft[ranked[:k]].double(), dim=1)  # (k, C, h, w)
            q = F.normalize(fq[b].double(), dim=0)  # (C, h, w)
            h, wd = q.shape[1:]
            sim = torch.einsum("cyx,kcuv->yxkuv", q, mem)
            ys, xs = torch.arange(h), torch.arange(wd)
            r = np.inf if pos_radius is None else pos_radius
            inside = (((ys[:, None] - ys[None, :]).abs() <= r)[:, None, None, :, None]
                      & ((xs[:, None] - xs[None, :]).abs() <= r)[None, :, None, None, :])
            s = 1 - sim.masked_fill(~inside, -torch.inf).amax(dim=(2, 3, 4))
            maps[b] += wl * F.interpolate(s.clamp_min(0)[None, None], size=(H, W),
                                          mode="bilinear", align_corners=False)[0, 0]
    if smoothing_sigma > 0:
        half = int(np.ceil(2 * smoothing_sigma))
        t = torch.arange(-half, half + 1, dtype=torch.float64)
        g = torch.exp(-0.5 * (t / smoothing_sigma) ** 2)
        g = g / g.sum()
        x = maps[:, None]
        if blur_padding == "reflect":
            # numpy's reflect padding, mirrored again on maps thinner than the kernel
            x = torch.from_numpy(np.pad(x.numpy(), ((0, 0), (0, 0), (half, half), (half, half)),
                                        mode="reflect"))
        else:
            x = F.pad(x, (half, half, half, half))
        maps = F.conv2d(x, (g[:, None] * g[None])[None, None])[:, 0]
    n_top = max(1, int(H * W * top_ratio))
    scores = maps.reshape(len(maps), -1).sort(1, descending=True).values[:, :n_top].mean(1)
    return maps.numpy(), scores.numpy(), sets, min(gaps) if gaps else np.inf


# -- RAD --------------------------------------------------------------------------------------
@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2, max_n=7), params=rad_params(), n_test=st.integers(1, 3))
def test_rad_equals_float64_reference_for_every_option(X, params, n_test):
    """Maps, scores and leave-one-out training scores against the float64 definition,
    for every matching kernel, radius (None, 0, beyond the grid), k (clamped), blur,
    padding, pooling ratio and layer weighting."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    X_train = X_train if len(X_train) else X
    ref_maps, ref_scores, _, gap = _reference_rad(X_train, X_test, **params)
    # a retrieval decided by less than float32 key rounding is not a property of RAD
    assume(gap > 1e-5)
    det = _rad(**params).fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    np.testing.assert_allclose(maps, ref_maps, atol=ATOL, rtol=0)
    np.testing.assert_allclose(scores, ref_scores, atol=ATOL, rtol=0)
    if len(X_train) >= 2:
        _, loo, _, gap = _reference_rad(X_train, X_train, exclude_self=True, **params)
        if gap > 1e-5:
            np.testing.assert_allclose(det.decision_scores_, loo, atol=ATOL, rtol=0)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2, max_n=5), params=rad_params(),
       map_size=st.one_of(st.integers(1, 24), st.tuples(st.integers(1, 24), st.integers(1, 24))))
def test_rad_map_size_fuses_blurs_and_pools_at_that_size(X, params, map_size):
    """``map_size`` (the paper's 448 px input scored on 256 px maps): the layer maps are
    upsampled to it, fused, blurred (sigma in map pixels) and pooled there, against the
    float64 definition at that size; ``anomaly_map`` then resizes to the input size."""
    hw = (map_size, map_size) if isinstance(map_size, int) else map_size
    X_train, X_test = X[1:], X[:1]
    ref_maps, ref_scores, _, gap = _reference_rad(X_train, X_test, map_size=hw, **params)
    assume(gap > 1e-5)
    det = _rad(**params, map_size=map_size).fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    np.testing.assert_allclose(scores, ref_scores, atol=ATOL, rtol=0)
    resized = F.interpolate(torch.from_numpy(ref_maps)[:, None], size=X.shape[-2:],
                            mode="bilinear", align_corners=False)[:, 0].numpy()
    np.testing.assert_allclose(maps, resized, atol=ATOL, rtol=0)


# |1 - <q, round(q)>| <= u * |q|^2 = u for a unit vector q stored with unit roundoff u
# (and rounding of the float32 sum, far smaller); later steps do not amplify it
ZERO_TOL = {"float32": ATOL, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(), params=rad_params(),
       memory_dtype=st.sampled_from(sorted(ZERO_TOL)))
@example(X=np.stack([np.full((3, 6, 6), 0.2, np.float32), np.full((3, 6, 6), 0.9, np.float32)]),
         params={"k_images": 1, "pos_radius": 0, "top_ratio": 0.0, "smoothing_sigma": 1.0,
                 "matching": "tiled", "blur_padding": "zeros", "layer_weights": None},
         memory_dtype="float32").via("constant images")
def test_memory_images_score_zero(X, params, memory_dtype):
    """An image of the memory retrieves itself (or an identical copy) and every one of
    its patches finds itself: its map is 0 everywhere (the blur of a zero map is zero)
    and so is its score, for every option, up to the rounding of the stored memory
    (documented: about 1e-7, 1e-4 and 1e-3 for float32, float16 and bfloat16). With
    ``image_size`` equal to the input size nothing is resized, as with ``None``. A
    single training image has leave-one-out score 0.

    Limitation (not generated): an image whose features are all zero (for this
    extractor, a uniform 0.5-gray image) has cosine 0 with everything, so it scores 1.
    """
    det = _rad(**params, memory_dtype=memory_dtype).fit(X)
    maps, scores = det.anomaly_map(X, return_scores=True)
    tol = ZERO_TOL[memory_dtype]
    assert np.abs(maps).max() <= tol and np.abs(scores).max() <= tol
    if len(X) == 1:
        np.testing.assert_array_equal(det.decision_scores_, [0.0])
    sized = _rad(**params, memory_dtype=memory_dtype, image_size=X.shape[-2:]).fit(X)
    np.testing.assert_array_equal(sized.decision_scores_, det.decision_scores_)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), params=rad_params(), n_test=st.integers(1, 3),
       dup=st.lists(st.integers(0, 100), min_size=1, max_size=4), perm_seed=st.integers(0, 99))
def test_memory_order_and_duplicates_do_not_matter_when_all_images_are_retrieved(
        X, params, n_test, dup, perm_seed):
    """With ``k_images >= n_train`` every memory image is retrieved: permuting the memory
    or adding copies of memory images cannot change a maximum over the same set of
    patches (scores are equal; the leave-one-out scores permute with the images)."""
    X_train, X_test = X, X[:n_test][::-1].copy()
    params = dict(params, k_images=100)
    base = _rad(**params).fit(X_train)
    want = base.decision_function(X_test)
    perm = np.random.default_rng(perm_seed).permutation(len(X_train))
    permuted = _rad(**params).fit(X_train[perm])
    np.testing.assert_allclose(permuted.decision_function(X_test), want, atol=ATOL, rtol=0)
    np.testing.assert_allclose(permuted.decision_scores_, base.decision_scores_[perm],
                               atol=ATOL, rtol=0)
    X_dup = np.concatenate([X_train, X_train[[d % len(X_train) for d in dup]]])
    doubled = _rad(**params).fit(X_dup)
    np.testing.assert_allclose(doubled.decision_function(X_test), want, atol=ATOL, rtol=0)
    # a duplicated memory image finds its copy when left out: leave-one-out score 0
    assert np.abs(doubled.decision_scores_[len(X_train):]).max() <= ATOL


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=3, max_n=7), params=rad_params(), n_test=st.integers(1, 3))
def test_scores_never_increase_with_more_retrieved_images_or_a_wider_window(X, params,
                                                                             n_test):
    """Retrieved sets are nested in k (one ranking) and windows are nested in r, with
    ``pos_radius=None`` the whole grid: the similarity is a maximum over a growing set,
    and upsampling, fusion, blur and top-fraction pooling are monotone (non-negative
    weights), so maps and scores are non-increasing in ``k_images`` and ``pos_radius``."""
    n_test = min(n_test, len(X) - 1)
    X_train, X_test = X[n_test:], X[:n_test]
    maps = {}
    for k in (1, len(X_train)):
        for r in (0, 2, None):
            det = _rad(**dict(params, k_images=k, pos_radius=r)).fit(X_train)
            maps[k, r] = det.anomaly_map(X_test, return_scores=True)
    for (k, r), (m, s) in maps.items():
        for (k2, r2), (m2, s2) in maps.items():
            wider = r2 is None or (r is not None and r2 >= r)
            if k2 >= k and wider:
                assert np.all(m2 <= m + ATOL) and np.all(s2 <= s + ATOL)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), params=rad_params(), n_test=st.integers(1, 3),
       batch_size=st.integers(1, 8), chunk_size=st.sampled_from([1, 97, 4096, 2**24]),
       perm_seed=st.integers(0, 99))
def test_batch_chunk_and_test_order_invariance(X, params, n_test, batch_size, chunk_size,
                                               perm_seed):
    """Scores and maps do not depend on ``batch_size`` or ``chunk_size`` (the chunked
    kernels compute the same maxima), each image is scored on its own (a permuted test
    set gives permuted scores, one image alone the same score), and the leave-one-out
    training scores do not depend on the batching either."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    ref = _rad(**params).fit(X_train)
    m_ref, s_ref = ref.anomaly_map(X_test, return_scores=True)
    det = _rad(**params, batch_size=batch_size, chunk_size=chunk_size).fit(X_train)
    m, s = det.anomaly_map(X_test, return_scores=True)
    np.testing.assert_allclose(m, m_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(s, s_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(det.decision_scores_, ref.decision_scores_, atol=ATOL, rtol=0)
    perm = np.random.default_rng(perm_seed).permutation(len(X_test))
    np.testing.assert_allclose(det.decision_function(X_test[perm]), s_ref[perm], atol=ATOL,
                               rtol=0)
    np.testing.assert_allclose(det.decision_function(X_test[-1:]), s_ref[-1:], atol=ATOL,
                               rtol=0)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), params=rad_params(), n_test=st.integers(1, 3))
def test_every_matching_kernel_gives_the_same_detector(X, params, n_test):
    """``matching`` only chooses how the positional maxima are computed."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    outs = [_rad(**dict(params, matching=m)).fit(X_train) for m in MATCHINGS]
    m0, s0 = outs[0].anomaly_map(X_test, return_scores=True)
    for det in outs[1:]:
        m, s = det.anomaly_map(X_test, return_scores=True)
        np.testing.assert_allclose(m, m0, atol=ATOL, rtol=0)
        np.testing.assert_allclose(s, s0, atol=ATOL, rtol=0)
        np.testing.assert_allclose(det.decision_scores_, outs[0].decision_scores_, atol=ATOL,
                                   rtol=0)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), params=rad_params(), n_test=st.integers(1, 4),
       contamination=st.sampled_from([0.01, 0.1, 0.25, 0.5]))
def test_maps_scores_labels_and_probabilities_are_consistent(X, params, n_test,
                                                             contamination):
    """With ``image_size=None`` the map is at the network size, so the image score is the
    mean of its top ``max(1, int(H W top_ratio))`` pixels; ``decision_function``,
    ``score_samples`` and the scores of ``anomaly_map`` agree; ``predict`` thresholds
    them at ``threshold_``, the ``1 - contamination`` quantile of ``decision_scores_``;
    ``predict_proba`` rows are in [0, 1], sum to 1 and are ordered like the scores."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    det = _rad(**params, contamination=contamination).fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    H, W = X_test.shape[-2:]
    assert maps.shape == (len(X_test), H, W) and scores.shape == (len(X_test),)
    assert np.all(maps >= 0) and np.all(np.isfinite(maps))
    n_top = max(1, int(H * W * params["top_ratio"]))
    top = -np.sort(-maps.reshape(len(maps), -1), axis=1)[:, :n_top].mean(1)
    np.testing.assert_allclose(scores, top, atol=ATOL, rtol=0)
    assert maps.reshape(len(maps), -1).max(1).max() >= scores.max() - ATOL
    dec = det.decision_function(X_test)
    np.testing.assert_array_equal(dec, det.score_samples(X_test))
    np.testing.assert_allclose(dec, scores, atol=ATOL, rtol=0)
    assert det.threshold_ == pytest.approx(
        np.percentile(det.decision_scores_, 100 * (1 - contamination)))
    np.testing.assert_array_equal(det.predict(X_test), (dec > det.threshold_).astype(int))
    np.testing.assert_array_equal(det.labels_, det.decision_scores_ > det.threshold_)
    for method in ("linear", "unify"):
        p = det.predict_proba(X_test, method=method)
        assert p.shape == (len(X_test), 2) and np.all((p >= 0) & (p <= 1))
        np.testing.assert_allclose(p.sum(1), 1.0)
        order = np.argsort(dec, kind="stable")
        assert np.all(np.diff(p[order, 1]) >= -1e-12)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), params=rad_params(), n_test=st.integers(1, 3),
       a=st.floats(0.1, 10.0), b=st.floats(0.1, 10.0), scale=st.floats(0.01, 100.0))
def test_fused_map_is_the_weighted_mean_of_the_single_layer_maps(X, params, n_test, a, b,
                                                                 scale):
    """Fusion, upsampling and blur are linear: the map of weights (a, b) is
    ``(a M_0 + b M_1) / (a + b)`` with ``M_l`` the one-hot maps, and rescaling the
    weights changes nothing."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    p = dict(params, layer_weights=[a, b])
    fused = _rad(**p).fit(X_train).anomaly_map(X_test)
    m0 = _rad(**dict(p, layer_weights=[1.0, 0.0])).fit(X_train).anomaly_map(X_test)
    m1 = _rad(**dict(p, layer_weights=[0.0, 1.0])).fit(X_train).anomaly_map(X_test)
    np.testing.assert_allclose(fused, (a * m0 + b * m1) / (a + b), atol=ATOL, rtol=0)
    scaled = _rad(**dict(p, layer_weights=[a * scale, b * scale])).fit(X_train)
    np.testing.assert_allclose(scaled.anomaly_map(X_test), fused, atol=ATOL, rtol=0)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2, min_side=5), n_test=st.integers(1, 3), gray=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_input_layouts_and_pixel_types_are_equivalent(X, n_test, gray, seed):
    """uint8 pixels in (n, C, H, W), (n, H, W, C), Fortran-ordered, non-contiguous,
    read-only, as torch tensors, as lists of arrays or of PIL images, and the same
    pixels as floats ``u / 255`` (float32 or float64), all give the same scores.
    Grayscale: (n, H, W), (n, H, W, 1), (n, 1, H, W), 'L' PIL images and the image
    repeated to RGB agree. (Sides >= 5 keep (n, H, W, C) unambiguous: an axis of
    length 1 or 3 after n is read as channels, as documented.)"""
    PIL = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(seed)
    u8 = rng.integers(0, 256, size=X.shape, dtype=np.uint8)
    if gray:
        u8 = np.repeat(u8[:, :1], 3, axis=1)
    train, test = u8[n_test:] if len(u8) > n_test else u8, u8[:n_test]
    det = _rad(k_images=3).fit(train)
    want = det.decision_function(test)
    nhwc = np.ascontiguousarray(test.transpose(0, 2, 3, 1))
    ro = test.copy()
    ro.setflags(write=False)
    strided = np.zeros((len(test), 3, test.shape[2], 2 * test.shape[3]), np.uint8)
    strided[..., ::2] = test
    variants = {
        "nhwc": nhwc, "fortran": np.asfortranarray(test), "read-only": ro,
        "strided": strided[..., ::2], "torch": torch.from_numpy(test),
        "torch-nhwc": torch.from_numpy(nhwc), "list": list(test),
        "pil": [PIL.fromarray(im) for im in nhwc],
        "float32": test.astype(np.float32) / np.float32(255),
        "float64-nhwc": nhwc.astype(np.float64) / 255,
    }
    if gray:
        g = test[:, 0]
        variants.update({"hw": g, "hw1": g[..., None], "1hw": g[:, None],
                         "pil-L": [PIL.fromarray(im) for im in g],
                         "list-hw": list(g)})
    for name, Xv in variants.items():
        # float64 pixels round to float32 once: a few ulps of pixel error
        tol = 1e-4 if name.startswith("float64") else ATOL
        np.testing.assert_allclose(det.decision_function(Xv), want, atol=tol, rtol=0,
                                   err_msg=name)
    # the memory built from another layout is the same memory
    det2 = _rad(k_images=3).fit([PIL.fromarray(im) for im in train.transpose(0, 2, 3, 1)])
    np.testing.assert_allclose(det2.decision_function(test), want, atol=ATOL, rtol=0)


@settings(max_examples=N_EX, deadline=None)
# sides >= 5: an (H, W, 3) image with H in (1, 3) reads as (C, H, W), as documented
@given(X=image_sets(min_n=2, max_n=4, min_side=5), params=rad_params(), sizes=st.lists(
    st.tuples(st.integers(5, 24), st.integers(5, 24)), min_size=1, max_size=4),
    size=st.tuples(st.integers(4, 16), st.integers(4, 16)), seed=st.integers(0, 2**32 - 1))
def test_images_of_different_sizes_are_scored_one_by_one(X, params, sizes, size, seed):
    """With ``image_size`` set, a list of images of different sizes is resized image by
    image: each score and map (at the image's own size) equals that of the image scored
    alone, and a memory built from a list equals the one built image by image."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    det = _rad(**dict(params, image_size=size)).fit(X)
    maps, scores = det.anomaly_map(images, return_scores=True)
    for img, m, s in zip(images, maps if isinstance(maps, list) else list(maps), scores):
        m1, s1 = det.anomaly_map(img[None], return_scores=True)
        assert m.shape == img.shape[:2]
        np.testing.assert_allclose(m, m1[0], atol=ATOL, rtol=0)
        np.testing.assert_allclose(s, s1[0], atol=ATOL, rtol=0)
    # the documented resampling: bilinear, antialiased, on pixels scaled to [0, 1]
    pre = torch.cat([F.interpolate(torch.from_numpy(im).permute(2, 0, 1)[None].float() / 255,
                                   size=size, mode="bilinear", align_corners=False,
                                   antialias=True) for im in images]).numpy()
    train = images + [np.ascontiguousarray(x.transpose(1, 2, 0)) for x in X]
    if len({im.shape for im in train}) > 1:  # a list of one size is stacked, not resized
        listed = _rad(**dict(params, image_size=size)).fit(train)
        stacked = _rad(**dict(params, image_size=size)).fit(
            np.concatenate([pre, F.interpolate(torch.from_numpy(X), size=size, mode="bilinear",
                                               align_corners=False, antialias=True).numpy()]))
        np.testing.assert_allclose(listed.decision_function(X), stacked.decision_function(X),
                                   atol=ATOL, rtol=0)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), params=rad_params(), n_test=st.integers(1, 3))
def test_save_load_and_pickle_give_identical_scores(X, params, n_test):
    """A saved (safe ``torch.load``) or pickled detector scores exactly as the original."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    det = _rad(**dict(params, extractor="random")).fit(X_train)
    want = det.decision_function(X_test)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rad.pt")
        det.save(path)
        loaded = RADDetector.load(path)
    np.testing.assert_array_equal(loaded.decision_function(X_test), want)
    np.testing.assert_array_equal(loaded.decision_scores_, det.decision_scores_)
    clone = pickle.loads(pickle.dumps(det))
    np.testing.assert_array_equal(clone.decision_function(X_test), want)


# -- the matching kernels on generated grids -------------------------------------------------
@st.composite
def matching_problems(draw):
    B = draw(st.integers(1, 5))
    N = draw(st.integers(1, 7))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    C = draw(st.integers(1, 24))
    k = draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**32 - 1))
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(B, h * w, C, generator=g))
    m = l2_normalize(torch.randn(N, h * w, C, generator=g))
    if draw(st.booleans()):  # ties: memory images / patches that repeat, a query in memory
        m[-1] = m[0]
        q[0] = m[min(1, N - 1)]
    # retrieved sets: any indices, duplicates allowed (a set padded to k)
    nbrs = torch.randint(0, N, (B, k), generator=g)
    if draw(st.booleans()):  # or the same set for every query (one shared union)
        nbrs = nbrs[:1].expand(B, k).contiguous()
    return q, m, nbrs, (h, w)


def _brute_force(q, m, nbrs, hw, r):
    h, w = hw
    sim = torch.einsum("blc,nmc->blnm", q.double(), m.double())
    ys, xs = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    win = torch.ones(h * w, h * w, dtype=torch.bool) if r is None else (
        ((ys[:, None] - ys[None, :]).abs() <= r) & ((xs[:, None] - xs[None, :]).abs() <= r))
    got = torch.zeros(len(q), len(m), dtype=torch.bool)
    got[torch.arange(len(q))[:, None], nbrs] = True
    return sim.masked_fill(~(got[:, None, :, None] & win[None, :, None, :]),
                           -torch.inf).amax(dim=(2, 3))


@settings(max_examples=N_EX, deadline=None)
@given(prob=matching_problems(), r=st.one_of(st.none(), st.integers(0, 10)),
       chunk=st.sampled_from([97, 1000, 2**24]), half=st.booleans())
def test_matching_kernels_equal_brute_force_on_any_grid(prob, r, chunk, half):
    """Every kernel (and the ``pos_radius=None`` global one) equals the float64 maximum
    over the retrieved images' window cells: any grid down to 1x1, non-square, radius
    0 to beyond the grid, duplicated neighbours, one shared or disjoint retrieved sets,
    tiny chunks, and a half-precision memory (compared with the memory it stores)."""
    q, m, nbrs, hw = prob
    if half:
        m = m.half()
    want = _brute_force(q, m.float(), nbrs, hw, r).float()
    if r is None:
        outs = {"global": global_patch_similarity(q, m, nbrs, chunk_size=chunk)}
    else:
        outs = {name: positional_similarity(q, m, nbrs, hw, r, matching=name,
                                            chunk_size=chunk) for name in MATCHINGS}
    for name, got in outs.items():
        assert got.shape == (len(q), hw[0] * hw[1]) and got.dtype == torch.float32, name
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=name)


@settings(max_examples=max(N_EX, 30), deadline=None)
@given(n_q=st.integers(1, 6), n_m=st.integers(1, 8), d=st.integers(1, 6), k=st.integers(1, 10),
       seed=st.integers(0, 2**32 - 1), ties=st.booleans(), scale=st.floats(1e-3, 1e3))
# found by hypothesis: a matmul rounded the two tied cosines differently by position and
# batch, so the tie went to the higher index for a lone query
@example(n_q=2, n_m=5, d=3, k=1, seed=1, ties=True, scale=1.0)
@example(n_q=1, n_m=5, d=3, k=1, seed=2, ties=True, scale=3.0)
@example(n_q=2, n_m=5, d=3, k=2, seed=1, ties=True, scale=1.0)  # both tied images kept
def test_retrieval_is_the_stable_ranking_and_scale_invariant(n_q, n_m, d, k, seed, ties,
                                                              scale):
    """``retrieve_neighbours`` retrieves the first ``min(k, N)`` of the ranking by
    decreasing key cosine with ties to the lower index, the same images whatever the
    batch, and positive rescaling of either side changes nothing. (Only the set is
    compared across calls: the order inside it follows the matmul's rounding, and no
    score depends on it.)"""
    g = torch.Generator().manual_seed(seed)
    mem = torch.randn(n_m, d, generator=g)
    qry = torch.randn(n_q, d, generator=g)
    if ties:
        mem[-1] = mem[0] * 2.0  # same direction: an exact cosine tie
        qry[0] = mem[0]
    got = retrieve_neighbours(qry, mem, k)
    assert got.shape == (n_q, min(k, n_m))
    cos = (F.normalize(qry.double(), dim=1) @ F.normalize(mem.double(), dim=1).T).numpy()
    for b in range(n_q):
        ranked = sorted(range(n_m), key=lambda i: (-round(cos[b, i], 6), i))
        # compare as sets of cosines (rounded cosines tie where float32 may not)
        assert sorted(np.round(cos[b, got[b].numpy()], 5)) == sorted(
            np.round(cos[b, ranked[:min(k, n_m)]], 5))
    as_sets = got.sort(dim=1).values
    assert torch.equal(retrieve_neighbours(qry * scale, mem / scale, k).sort(dim=1).values,
                       as_sets)
    rows = [retrieve_neighbours(qry[i:i + 1], mem, k) for i in range(n_q)]
    assert torch.equal(torch.cat(rows).sort(dim=1).values, as_sets)


class _TopRowKey(torch.nn.Module):
    """Patch features: a fixed 1x1 convolution; key: the pixels of the top row only, so
    that images sharing their top row have equal keys but different patches."""

    def __init__(self):
        super().__init__()
        self.w = torch.randn(6, 3, 1, 1, generator=torch.Generator().manual_seed(0))

    def forward(self, x):
        return [F.conv2d(x - 0.5, self.w)], x[:, :, 0, :].reshape(len(x), -1)


def test_tied_keys_go_to_the_lower_index_whatever_the_batch():
    """Regression (found by the retrieval property): with equal keys, which memory image
    a query retrieved depended on the batch size (matmul rounding), and so did its score
    (in 15 of 200 such configurations); the tie must go to the lower index, as
    documented, for every batch size."""
    for seed in range(12, 24):
        rng = np.random.default_rng(seed)
        W, n, n_test = int(rng.integers(2, 5)), int(rng.integers(2, 9)), int(rng.integers(1, 7))
        X = rng.random((n, 3, 5, W), dtype=np.float32)
        X[-1, :, 0] = X[0, :, 0]  # the last image has image 0's key and other patches
        T = rng.random((n_test, 3, 5, W), dtype=np.float32)
        T[:, :, 0] = X[0, :, 0]  # every query ties between image 0 and the last one
        want = _rad(extractor=_TopRowKey(), k_images=1).fit(X[:1]).decision_function(T)
        for bs in (1, n_test):
            det = _rad(extractor=_TopRowKey(), k_images=1, batch_size=bs).fit(X)
            np.testing.assert_allclose(det.decision_function(T), want, atol=ATOL, rtol=0,
                                       err_msg=f"seed {seed}, batch_size {bs}")


# -- PatchCore --------------------------------------------------------------------------------
def _pc(**kw):
    kw.setdefault("extractor", EXT)
    kw.setdefault("image_size", None)
    kw.setdefault("random_state", 0)
    return PatchCoreDetector(**kw)


def _pc_embed(X):
    """PatchCore's patch embedding from its definition: each layer 3x3-averaged (no
    padding counted), resized to the first layer's grid, concatenated."""
    with torch.no_grad():
        feats, _ = EXT(torch.from_numpy(X))
    h, w = feats[0].shape[-2:]
    out = [F.interpolate(F.avg_pool2d(f, 3, 1, 1, count_include_pad=False).double(),
                         size=(h, w), mode="bilinear", align_corners=False) for f in feats]
    e = torch.cat(out, 1)
    return e.flatten(2).transpose(1, 2), (h, w)  # (n, L, C)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), n_test=st.integers(1, 3),
       sigma=st.sampled_from([0.0, 1.0, 4.0]))
def test_patchcore_full_memory_equals_brute_force_nearest_patch(X, n_test, sigma):
    """``coreset_ratio=1``: each test patch scores its Euclidean distance to the nearest
    training patch, the image score is the maximum; training scores are the same with
    the image's own patches left out; memory images score 0."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    det = _pc(coreset_ratio=1.0, smoothing_sigma=sigma).fit(X_train)
    e_tr, _ = _pc_embed(X_train)
    e_te, _ = _pc_embed(X_test)
    mem = e_tr.reshape(-1, e_tr.shape[-1])
    d = torch.cdist(e_te, mem[None].expand(len(e_te), -1, -1)).amin(2)  # (n, L)
    scale = float(mem.abs().max()) + 1.0
    tol = 1e-4 * scale  # float32 distances of features of magnitude ``scale``
    np.testing.assert_allclose(det.decision_function(X_test), d.amax(1).numpy(), atol=tol,
                               rtol=1e-4)
    if len(X_train) >= 2:
        ids = torch.arange(len(X_train)).repeat_interleave(e_tr.shape[1])
        loo = []
        for i in range(len(X_train)):
            dd = torch.cdist(e_tr[i], mem[ids != i]).amin(1)
            loo.append(float(dd.max()))
        np.testing.assert_allclose(det.decision_scores_, loo, atol=tol, rtol=1e-4)
    np.testing.assert_allclose(det.decision_function(X_train), 0.0, atol=tol)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    np.testing.assert_allclose(scores, det.decision_function(X_test), atol=ATOL, rtol=0)
    assert maps.shape == X_test.shape[:1] + X_test.shape[2:] and np.all(maps >= -ATOL)


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), n_test=st.integers(1, 3), seed=st.integers(0, 1000),
       ratios=st.lists(st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.0]), min_size=2,
                       max_size=3, unique=True))
def test_patchcore_scores_never_increase_with_a_larger_coreset(X, n_test, seed, ratios):
    """Greedy k-center selection from the same start (same ``random_state``) is a prefix
    of one sequence, so a larger coreset holds a smaller one: the nearest-patch distance,
    hence every score, cannot increase."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    ratios = sorted(ratios)
    dets = [_pc(coreset_ratio=r, random_state=seed).fit(X_train) for r in ratios]
    mems = [set(map(tuple, d.memory_.numpy().round(6).tolist())) for d in dets]
    assert all(a <= b for a, b in zip(mems, mems[1:]))
    scores = [d.decision_function(X_test) for d in dets]
    for s, s2 in zip(scores, scores[1:]):
        assert np.all(s2 <= s + 1e-5 * (1 + np.abs(s)))


@settings(max_examples=N_EX, deadline=None)
@given(X=image_sets(min_n=2), n_test=st.integers(1, 3), batch_size=st.integers(1, 8),
       chunk_size=st.sampled_from([50, 997, 2**24]), perm_seed=st.integers(0, 99),
       dup=st.lists(st.integers(0, 100), min_size=1, max_size=3))
def test_patchcore_batching_order_and_duplicate_invariance(X, n_test, batch_size,
                                                           chunk_size, perm_seed, dup):
    """Full-memory PatchCore: batch and chunk sizes, the order of the training images
    and duplicated training images do not change the test scores; a duplicated training
    image has leave-one-out score 0 (its copy stays in the memory)."""
    X_train, X_test = X[n_test:] if len(X) > n_test else X, X[:n_test]
    ref = _pc(coreset_ratio=1.0).fit(X_train)
    want = ref.decision_function(X_test)
    tol = 1e-4 * (1 + np.abs(want))
    det = _pc(coreset_ratio=1.0, batch_size=batch_size, chunk_size=chunk_size).fit(X_train)
    assert np.all(np.abs(det.decision_function(X_test) - want) <= tol)
    np.testing.assert_allclose(det.decision_scores_, ref.decision_scores_, atol=1e-4,
                               rtol=1e-4)
    perm = np.random.default_rng(perm_seed).permutation(len(X_train))
    assert np.all(np.abs(_pc(coreset_ratio=1.0).fit(X_train[perm]).decision_function(X_test)
                         - want) <= tol)
    tperm = np.random.default_rng(perm_seed).permutation(len(X_test))
    assert np.all(np.abs(det.decision_function(X_test[tperm]) - want[tperm]) <= tol[tperm])
    X_dup = np.concatenate([X_train, X_train[[d % len(X_train) for d in dup]]])
    doubled = _pc(coreset_ratio=1.0).fit(X_dup)
    assert np.all(np.abs(doubled.decision_function(X_test) - want) <= tol)
    assert np.abs(doubled.decision_scores_[len(X_train):]).max() <= 1e-4


def test_retrieval_is_the_same_when_float32_matmuls_may_use_lower_precision():
    """With ``torch.set_float32_matmul_precision("medium")`` a float32 matmul may round to
    bf16 or TF32, far beyond the band within which near-ties are re-ranked; the ranking
    matmul is float64, which the setting does not touch, so the same images are
    retrieved. (It can only fail where matmuls honour the setting: CUDA, CPUs with
    bf16/AMX units.)"""
    g = torch.Generator().manual_seed(3)
    mem = torch.randn(40, 24, generator=g)
    mem[7] = mem[2] * 4.0  # an exact tie
    qry = torch.cat([mem[2:3], torch.randn(5, 24, generator=g)])
    want = retrieve_neighbours(qry, mem, 9)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        got = retrieve_neighbours(qry, mem, 9)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)


@settings(max_examples=max(N_EX, 30), deadline=None)
@given(n_q=st.integers(1, 5), copies=st.lists(st.integers(1, 4), min_size=1, max_size=5),
       d=st.integers(1, 6), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_retrieval_takes_the_lowest_indices_of_a_tied_group_in_any_batch(n_q, copies, d,
                                                                         seed, data):
    """Memory of a few directions, each repeated at power-of-two scales (equal keys after
    normalisation) in shuffled positions: for any ``k`` the retrieved images are the
    groups ranked by float64 cosine, the group cut at the ``k``-th place contributing
    its lowest indices, the same for every batch and for each query alone."""
    g = torch.Generator().manual_seed(seed)
    base = F.normalize(torch.randn(len(copies), d, generator=g, dtype=torch.float64), dim=1)
    group = np.repeat(np.arange(len(copies)), copies)
    group = group[data.draw(st.permutations(range(len(group))))]
    scale = 2.0 ** torch.randint(-3, 4, (len(group),), generator=g).double()
    mem = (base[torch.as_tensor(group)] * scale[:, None]).float()
    qry = torch.randn(n_q, d, generator=g)
    qry[0] = base[int(group[0])].float()  # a query on a memory direction
    unit = F.normalize(mem, dim=1)
    # tie groups: memory rows equal after normalisation (a draw may repeat a direction)
    _, tie = torch.unique(unit, dim=0, return_inverse=True)
    cos = F.normalize(qry.double(), dim=1) @ unit.double().T
    gaps = [abs(float(cos[b, i] - cos[b, j])) for b in range(n_q)
            for i in range(len(group)) for j in range(len(group)) if tie[i] != tie[j]]
    assume(not gaps or min(gaps) > 1e-4)  # distinct directions: no near-ties to round
    k = data.draw(st.integers(1, len(group)))
    got = retrieve_neighbours(qry, mem, k)
    for b in range(n_q):
        # by decreasing cosine, then by index: ties go to the lower index
        ranked = sorted(range(len(group)), key=lambda i: (-round(float(cos[b, i]), 8), i))
        assert sorted(got[b].tolist()) == sorted(ranked[:k]), b
    as_sets = got.sort(dim=1).values
    for lo in range(n_q):
        alone = retrieve_neighbours(qry[lo:lo + 1], mem, k)
        assert torch.equal(alone.sort(dim=1).values, as_sets[lo:lo + 1])


def test_retrieval_works_when_the_matmul_precision_cannot_be_read(monkeypatch):
    """torch refuses ``get_float32_matmul_precision`` once the newer ``fp32_precision``
    API has been used: retrieval then ranks with a float64 matmul and retrieves the same
    images (it used to raise from inside ``fit``)."""
    g = torch.Generator().manual_seed(5)
    mem = torch.randn(30, 12, generator=g)
    mem[9] = mem[4] * 0.5  # an exact tie
    qry = torch.cat([mem[4:5], torch.randn(4, 12, generator=g)])
    want = retrieve_neighbours(qry, mem, 6)

    def refuse():
        raise RuntimeError("mixing the old and new fp32 precision APIs")

    monkeypatch.setattr(torch, "get_float32_matmul_precision", refuse)
    got = retrieve_neighbours(qry, mem, 6)
    assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)
    assert {4, 9} <= set(got[0].tolist())  # the query and its tied copy


def test_retrieval_of_an_empty_batch_is_empty():
    mem = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    got = retrieve_neighbours(torch.empty(0, 4), mem, 3)
    assert got.shape == (0, 3) and got.dtype == torch.long
