"""Benchmark: local CLAPP / CLAPP++ variants vs end-to-end BP-SSL on shifted digits.

Every arm uses the same encoder (``architecture``), augmentations, batch size,
learning rate, epochs and seeds. Metrics:

* ``acc_all`` / ``acc_last``: linear-probe accuracy (mean over seeds) of a logistic
  regression on standardised features of all blocks / of the last block. The
  inverse regularisation ``C`` is chosen per arm and seed by 3-fold
  cross-validation on the training images only (``LogisticRegressionCV``), so no
  arm is judged with a regularisation tuned for another.
* ``rand_all`` / ``gain_all``: the all-block probe of the *same* arm's encoder before
  training (same seed, hence the same initial weights and the same feature map:
  grid, global pool or patch average) and the points gained by training,
  ``100 * (acc_all - rand_all)`` averaged over seeds. The "random init" row is one
  shared reference (2x2-grid features); arms whose features are pooled differently
  (CLAPP: global pool, CLAPP 2021: patch average) have a different random baseline.
* ``cos_local_bp``: mean per-block cosine between the local and the backprop update
  (local two-view arms, blocks below the top, 5 batches).
* ``epoch_s``: training time per epoch.
* ``act_kb``: peak memory of the activations autograd keeps during one training
  step (tensors saved for backward, see ``mlpapers/ssl/clapp/_memory.py``). The
  harness' "peak mem" column is the resident-set growth of the whole arm (fits,
  transforms and probes of all seeds) and is dominated by the probe, not by training.

Run ``python benchmarks/bench_clapp.py`` (or ``--quick`` for a smoke run; one torch
thread, ``BENCH_THREADS=N`` for more): every arm
gets the same settings (``SETTINGS``) and ``EPOCHS_DEFAULT`` = 40 epochs, and the
script ends with the verdicts on the goals of the issue. On a slow machine the arms
can be split over runs with ``--arms "CLAPP,CLAPP++" --out part1.json`` (the random-init
row, the reference of the ratios, is always included; each arm is deterministic, so
the split changes no accuracy) and the parts merged into one table and verdict with
``--merge part1.json part2.json ...`` (``--out`` writes the merge; files of runs with other
settings than the arms, recorded in each ``--out`` file, are refused); ``--epochs N``
overrides the training epochs (also with ``--quick``, whose default is 2).
``--probe-pool G`` probes every arm on features average-pooled to a G x G grid per
block, whatever grid its loss used, as the official evaluation does (it pools every
model with the same kernels); by default each arm is probed on its training grids
(global pool for CLAPP, 2x2 otherwise). Arms already trained on a G x G grid give the
same numbers either way.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (  # noqa: E402
    Case,
    benchmark_main,
    benchmark_parser,
    env_threads,
    environment,
    format_table,
    int_at_least,
    read_results,
    write_json,
)

from mlpapers.datasets import make_shifted_digits  # noqa: E402
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder, update_similarity  # noqa: E402
from mlpapers.ssl.clapp._memory import training_step_activation_bytes  # noqa: E402

#: Shared training settings (see docs/user_guide/clapp.rst, "Benchmark").
SETTINGS = dict(architecture="tiny", augment="light", batch_size=16, lr=1e-3)
#: Training epochs of every arm (the table of docs/user_guide/clapp.rst).
EPOCHS_DEFAULT = 40
#: The issue's goals: SSL gain over random init (points), DFB vs BP-CLAPP gap (points).
MIN_GAIN, MAX_GAP = 5.0, 3.0
LOCAL_ARMS = ("CLAPP", "CLAPP++", "CLAPP++DFB", "CLAPP++both", "CLAPP 2021")
GLOBAL_ARMS = ("BP-CLAPP", "BP-InfoNCE")


def _probe(enc, Xtr, ytr, Xte, yte, layers="all") -> float:
    pool = PROBE_POOL                     # None: each arm's own training grids
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(),
                        LogisticRegressionCV(Cs=[0.1, 1.0], cv=3, max_iter=1000))
    with warnings.catch_warnings():       # scikit-learn 1.9's notices of future defaults
        warnings.simplefilter("ignore", FutureWarning)
        clf.fit(enc.transform(Xtr, layers=layers, spatial_pool=pool), ytr)
    return float(clf.score(enc.transform(Xte, layers=layers, spatial_pool=pool), yte))


def make_cases(quick: bool):
    n_train, n_test = (300, 200) if quick else (800, 400)
    epochs, seeds = _epochs(quick), _seeds(quick)
    X, y = make_shifted_digits(n_samples=n_train + n_test, random_state=0)
    Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]

    def arm(factory, epochs, similarity=False):
        def run():
            acc_all, acc_last, sims, per_epoch, rand_all = [], [], [], [], []
            act = None
            for seed in seeds:
                if epochs > 0:            # the same seed's untrained encoder, same features
                    init = factory(n_epochs=0, random_state=seed, **SETTINGS).fit(Xtr)
                    rand_all.append(_probe(init, Xtr, ytr, Xte, yte))
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
                gain = 100 * (np.asarray(acc_all) - np.asarray(rand_all))
                out.update(rand_all=np.mean(rand_all), gain_all=gain.mean(),
                           gain_all_std=gain.std(), epoch_s=np.mean(per_epoch), act_kb=act)
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


def goal_verdicts(results) -> list[str]:
    """The issue's three goals, judged on the measured rows (absent arms are skipped).

    1. Every SSL arm >= ``MIN_GAIN`` points above random init on the all-block probe,
       against both references: the shared "random init" row and the arm's own
       untrained encoder (``gain_all``).
    2. CLAPP++DFB within ``MAX_GAP`` points of BP-CLAPP (all-block probe).
    3. Every local arm keeps fewer activation bytes for backward than every global one.
    """
    rows = {r.name: r.metrics for r in results if not r.error}
    lines = []
    if "random init" in rows:
        base = rows["random init"]["acc_all"]
        ok_all = True
        for name in (*LOCAL_ARMS, *GLOBAL_ARMS):
            if name not in rows:
                continue
            m = rows[name]
            shared, own = 100 * (m["acc_all"] - base), m.get("gain_all", float("nan"))
            ok = shared >= MIN_GAIN and own >= MIN_GAIN
            ok_all &= ok
            lines.append(f"  {name}: {shared:+.1f} vs shared random init, {own:+.1f} vs its own "
                         f"untrained encoder -> {'met' if ok else 'NOT met'}")
        lines.insert(0, f"goal 1, every SSL arm >= {MIN_GAIN:g} points above random init: "
                        f"{'met' if ok_all else 'NOT met'}")
    if "CLAPP++DFB" in rows and "BP-CLAPP" in rows:
        gap = 100 * (rows["BP-CLAPP"]["acc_all"] - rows["CLAPP++DFB"]["acc_all"])
        lines.append(f"goal 2, CLAPP++DFB within {MAX_GAP:g} points of BP-CLAPP: "
                     f"{'met' if gap <= MAX_GAP else 'NOT met'} (BP-CLAPP - DFB = {gap:+.1f})")
    local = {n: rows[n]["act_kb"] for n in LOCAL_ARMS if n in rows and "act_kb" in rows[n]}
    glob = {n: rows[n]["act_kb"] for n in GLOBAL_ARMS if n in rows and "act_kb" in rows[n]}
    if local and glob:
        two_view = {n: v for n, v in local.items() if n != "CLAPP 2021"}
        ok = bool(two_view) and max(two_view.values()) < min(glob.values())
        detail = ", ".join(f"{n} {v / 1024:.2f}" for n, v in {**local, **glob}.items())
        lines.append(f"goal 3, local (two-view) training keeps less activation memory than "
                     f"global BP: {'met' if ok else 'NOT met'} (MiB: {detail}; CLAPP 2021 "
                     "encodes 49 patches per image, not two views, and is not compared)")
    return lines


def _epochs(quick: bool) -> int:
    """``--epochs``, else 2 for a smoke run and ``EPOCHS_DEFAULT`` for a full one."""
    return EPOCHS or (2 if quick else EPOCHS_DEFAULT)


def _seeds(quick: bool) -> list[int]:
    return [0] if quick else [0, 1, 2]


#: Settings a merge may differ in: which arms ran (each arm is deterministic).
_MERGEABLE = ("arms", "merge")


def _merge(paths: list[str]) -> dict:
    """The payload of several ``--out`` files, one row per arm (first occurrence wins).

    Rows can only be compared when they were measured alike: files of another benchmark
    (title) or with other settings than the arms (``--probe-pool``, ``--epochs``,
    ``--quick``, threads, ...) are refused, since e.g. a "random init" row probed with
    another pooling flips the verdicts of goal 1.
    """
    payloads = []
    for path in paths:
        try:
            payload = read_results(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"--merge: {path} is not a results file written by --out "
                             f"({type(exc).__name__}: {exc})") from None
        if payload.get("title") != TITLE:
            raise SystemExit(f"--merge: {path} holds {payload.get('title')!r}, "
                             f"not {TITLE!r}")
        if "settings" not in payload:
            raise SystemExit(f"--merge: {path} does not record its settings (written by an "
                             "older version of this script); rerun it")
        payloads.append((path, payload))

    def comparable(payload):
        return {k: v for k, v in payload["settings"].items() if k not in _MERGEABLE}

    first_path, first = payloads[0]
    for path, payload in payloads[1:]:
        a, b = comparable(first), comparable(payload)
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if diff:
            detail = ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in diff)
            raise SystemExit(f"--merge: {first_path} and {path} were run with different "
                             f"settings ({detail}); only the arms may differ")
    seen, results = set(), []
    for _, payload in payloads:
        for r in payload["results"]:
            if r.name not in seen:
                seen.add(r.name)
                results.append(r)
    arms = ",".join(r.name for r in results if r.name != "random init")
    return {"title": TITLE, "quick": first["quick"], "baseline": "random init",
            "settings": {**first["settings"], "arms": arms, "merge": None},
            "merged_from": list(paths), "environment": environment(), "results": results}


ARMS: list[str] | None = None
EPOCHS: int | None = None
PROBE_POOL: int | None = None
TITLE = "CLAPP: local vs global self-supervised learning (shifted digits)"


def main(argv: list[str] | None = None) -> list:
    global ARMS, EPOCHS, PROBE_POOL
    import torch

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--arms", help="comma-separated arms to run (the random-init row "
                                      "is always included)")
    extra.add_argument("--probe-pool", type=int_at_least(1), default=None, metavar="G",
                       help="probe every arm on features pooled to a G x G grid")
    extra.add_argument("--epochs", type=int_at_least(1), default=None,
                       help=f"training epochs (default {EPOCHS_DEFAULT}, 2 with --quick)")
    extra.add_argument("--merge", nargs="+", metavar="JSON",
                       help="merge the tables of earlier --out runs made with the same "
                            "settings but the arms (runs nothing; --out writes the merge)")
    parser = benchmark_parser(TITLE, parents=[extra])
    args = parser.parse_args(argv)
    if args.merge:
        # a merge runs nothing: options of a run would be ignored (the merged files
        # carry their own settings, --quick included)
        ignored = [f"--{k.replace('_', '-')}" for k in ("arms", "probe_pool", "epochs",
                                                         "quick", "repeats", "warmup")
                   if getattr(args, k) != parser.get_default(k)]
        if ignored:
            parser.error(f"--merge runs nothing and cannot use {', '.join(ignored)} "
                         "(the merged files carry their own settings)")
        payload = _merge(args.merge)
        results, quick = payload["results"], payload["quick"]
        print(f"## {TITLE} (merged)\n")
        print(format_table(results, "random init"))
        if args.out:
            write_json(args.out, {**payload, "results": [r.__dict__ for r in results]})
        epochs = payload["settings"].get("epochs")
    else:
        # one torch thread, as the docs' table was measured (like the other benchmarks;
        # the default of two on this machine would also change the float sums, hence
        # the digits); set after parsing, so that --help works whatever BENCH_THREADS
        torch.set_num_threads(env_threads(1))
        ARMS = (None if args.arms is None
                else [n.strip() for n in args.arms.split(",") if n.strip()])
        PROBE_POOL, EPOCHS = args.probe_pool, args.epochs
        quick, epochs = args.quick, _epochs(args.quick)
        # the values the defaults stand for, so that --merge compares like with like
        settings = {"epochs": epochs, "seeds": _seeds(quick), "threads": torch.get_num_threads(),
                    **SETTINGS}
        results = benchmark_main(make_cases, baseline="random init", title=TITLE, args=args,
                                 settings=settings)
    if quick:
        print(f"\n(quick smoke run: {epochs} epochs, 1 seed; the verdicts below mean nothing)")
    print("\n" + "\n".join(goal_verdicts(results)))
    return results


if __name__ == "__main__":
    main()
