"""Benchmark: local CLAPP / CLAPP++ variants vs end-to-end BP-SSL on shifted digits.

Every arm uses the same encoder (``architecture``), augmentations, batch size,
learning rate, epochs and seeds. Metrics:

* ``acc_all`` / ``acc_last``: linear-probe accuracy (mean over seeds) of a logistic
  regression on standardised features of all blocks / of the last block. The
  inverse regularisation ``C`` is chosen per arm and seed by 3-fold
  cross-validation on the training images only (``LogisticRegressionCV``), so no
  arm is judged with a regularisation tuned for another.
* ``cos_local_bp``: mean per-block cosine between the local and the backprop update
  (local two-view arms, blocks below the top, 5 batches).
* ``epoch_s``: training time per epoch.
* ``act_kb``: peak memory of the activations autograd keeps during one training
  step (tensors saved for backward, see ``mlpapers/ssl/clapp/_memory.py``). The
  harness' "peak mem" column is the resident-set growth of the whole arm (fits,
  transforms and probes of all seeds) and is dominated by the probe, not by training.

Run ``python benchmarks/bench_clapp.py`` (or ``--quick`` for a smoke run). On a slow
machine the arms can be split over runs with ``--arms "CLAPP,CLAPP++"`` (the random-init
row, the reference of the ratios, is always included); ``--epochs N`` overrides the 20
training epochs.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Case, benchmark_main  # noqa: E402

from mlpapers.datasets import make_shifted_digits  # noqa: E402
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder, update_similarity  # noqa: E402
from mlpapers.ssl.clapp._memory import training_step_activation_bytes  # noqa: E402

#: Shared training settings (see docs/user_guide/clapp.rst, "Benchmark").
SETTINGS = dict(architecture="tiny", augment="light", batch_size=16, lr=1e-3)


def _probe(enc, Xtr, ytr, Xte, yte, layers="all") -> float:
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(),
                        LogisticRegressionCV(Cs=[0.1, 1.0], cv=3, max_iter=1000))
    with warnings.catch_warnings():       # scikit-learn 1.9's notices of future defaults
        warnings.simplefilter("ignore", FutureWarning)
        clf.fit(enc.transform(Xtr, layers=layers), ytr)
    return float(clf.score(enc.transform(Xte, layers=layers), yte))


def make_cases(quick: bool):
    n_train, n_test = (300, 200) if quick else (800, 400)
    epochs = 2 if quick else (EPOCHS or 20)
    seeds = [0] if quick else [0, 1, 2]
    X, y = make_shifted_digits(n_samples=n_train + n_test, random_state=0)
    Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]

    def arm(factory, epochs, similarity=False):
        def run():
            acc_all, acc_last, sims, per_epoch = [], [], [], []
            act = None
            for seed in seeds:
                enc = factory(n_epochs=epochs, random_state=seed, **SETTINGS)
                start = time.perf_counter()
                enc.fit(Xtr)
                per_epoch.append((time.perf_counter() - start) / max(epochs, 1))
                acc_all.append(_probe(enc, Xtr, ytr, Xte, yte))
                acc_last.append(_probe(enc, Xtr, ytr, Xte, yte, layers=-1))
                if similarity:
                    sim = update_similarity(enc, Xtr, n_batches=5, random_state=seed)
                    sims.append(np.mean([v for k, v in sim.items() if k < len(sim) - 1]))
                if act is None and epochs > 0:
                    act = training_step_activation_bytes(enc, Xtr) / 1024
            out = {"acc_all": np.mean(acc_all), "acc_all_std": np.std(acc_all),
                   "acc_last": np.mean(acc_last), "acc_last_std": np.std(acc_last)}
            if epochs > 0:
                out.update(epoch_s=np.mean(per_epoch), act_kb=act)
            if similarity:
                out["cos_local_bp"] = np.mean(sims)
            return out
        return run

    def local(variant):
        return lambda **kw: CLAPPEncoder(variant=variant, **kw)

    def glob(loss):
        return lambda **kw: GlobalSSLEncoder(loss=loss, **kw)

    once = dict(warmup=0, repeats=1)
    cases = [
        Case("random init", arm(local("clapp++dfb"), 0), **once, note="untrained encoder"),
        Case("CLAPP", arm(local("clapp"), epochs, True), **once, note="lateral, global pool"),
        Case("CLAPP++", arm(local("clapp++"), epochs, True), **once, note="lateral, 2x2 grid"),
        Case("CLAPP++DFB", arm(local("clapp++dfb"), epochs, True), **once,
             note="direct feedback from the top"),
        Case("CLAPP++both", arm(local("clapp++both"), epochs, True), **once,
             note="DFB loss + lateral loss"),
        Case("CLAPP 2021", arm(local("clapp2021"), epochs), **once,
             note="patch prediction, 4 px patches, stride 2, 5 steps"),
        Case("BP-CLAPP", arm(glob("clapp"), epochs), **once, note="end-to-end, hinge at top"),
        Case("BP-InfoNCE", arm(glob("infonce"), epochs), **once, note="end-to-end SimCLR"),
    ]
    if ARMS is None:
        return cases
    unknown = set(ARMS) - {c.name for c in cases}
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}")
    return [c for c in cases if c.name == "random init" or c.name in ARMS]


def _pop_option(argv: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` from ``argv`` (the harness parses the rest); return VALUE."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


ARMS: list[str] | None = None
EPOCHS: int | None = None


if __name__ == "__main__":
    _arms = _pop_option(sys.argv, "--arms")
    ARMS = None if _arms is None else [n.strip() for n in _arms.split(",") if n.strip()]
    _epochs = _pop_option(sys.argv, "--epochs")
    EPOCHS = None if _epochs is None else int(_epochs)
    benchmark_main(make_cases, baseline="random init",
                   title="CLAPP: local vs global self-supervised learning (shifted digits)")
