"""SCENT against its baselines and peers on three compositional entropic risks.

1. Extreme classification (synthetic, ``make_extreme_classification``): a linear
   softmax model trained with 64 sampled negatives per sample by SCENT, SOX,
   BSGD, ASGD, U-max and ASGD-softplus, and by full-softmax SGD (exact, O(C)).
   Equal epochs; after each epoch the exact full-softmax objective is measured
   (outside the timed training). Reported: final objective, test accuracy,
   training time, and training time until the objective first reaches full
   softmax's final value (``t_target``).
2. KL-DRO least squares on scikit-learn's bundled diabetes data, lambda in {0.2, 1, 5}:
   the exact objective after the same epochs, minus the L-BFGS optimum.
3. One-way partial AUC (KL-DRO form) on the bundled breast-cancer data, with
   LibAUC's ``pAUC_DRO_Loss`` + ``SOPAs`` as the peer when ``libauc`` is installed.

Step sizes are picked per method from a small grid (best final objective on
seed 0); results are averaged over the seeds.

    python benchmarks/bench_scent.py --quick
    python benchmarks/bench_scent.py --out scent.json
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from _harness import Case, benchmark_main

from mlpapers.datasets import make_extreme_classification
from mlpapers.optim.scent import KLDRORegressor, SCENTClassifier

METHODS = ("scent", "sox", "bsgd", "asgd", "umax", "asgd_softplus")


# -- 1. extreme classification ----------------------------------------------------------
def _xc_data(quick):
    n, C, d = (6000, 2000, 32) if quick else (20000, 20000, 64)
    X, y = make_extreme_classification(2 * n, C, d, noise=0.7, random_state=0)
    Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
    keep = np.isin(yte, ytr)
    classes = np.unique(ytr)
    return Xtr, np.searchsorted(classes, ytr), Xte[keep], np.searchsorted(classes, yte[keep]), \
        len(classes)


_EVAL = 5000  # exact objective (all classes) on a fixed training subset


def _exact_ce(W, X, y, chunk=2048):
    X, y = X[:_EVAL], y[:_EVAL]
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(X), chunk):
            z = X[i:i + chunk] @ W.T
            total += float(F.cross_entropy(z, y[i:i + chunk], reduction="sum"))
    return total / len(X)


def _full_softmax(X, y, C, epochs, lr, seed, batch_size=256):
    """Peer: plain SGD on the exact cross-entropy over all classes."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.zeros(C, X.shape[1], requires_grad=True)
    opt = torch.optim.SGD([W], lr=lr)
    curve, times, elapsed = [], [], 0.0
    for _ in range(epochs):
        start = time.perf_counter()
        perm = torch.randperm(len(X), generator=gen)
        for i in range(0, len(X), batch_size):
            rows = perm[i:i + batch_size]
            opt.zero_grad()
            F.cross_entropy(X[rows] @ W.T, y[rows]).backward()
            opt.step()
        elapsed += time.perf_counter() - start
        times.append(elapsed)
        curve.append(_exact_ce(W.detach(), X, y))
    return W.detach(), curve, times, W.detach()


def _sampled(X, y, C, epochs, lr, seed, method, eq_epochs):
    clf = SCENTClassifier(n_negatives=64, method=method, lr=lr, lr_schedule="constant",
                          batch_size=256, random_state=seed)
    classes = np.arange(C)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    curve, times, elapsed, W_eq = [], [], 0.0, None
    for epoch in range(epochs):
        start = time.perf_counter()
        try:
            clf.partial_fit(Xt, y, classes=classes)
        except FloatingPointError:  # diverged: the rest of the curve is infinite
            curve += [float("inf")] * (epochs - epoch)
            times += [elapsed] * (epochs - epoch)
            break
        elapsed += time.perf_counter() - start
        times.append(elapsed)
        curve.append(_exact_ce(torch.as_tensor(clf.coef_), Xt, yt))
        if epoch + 1 == eq_epochs:
            W_eq = torch.as_tensor(clf.coef_)
    if W_eq is None:
        W_eq = torch.zeros(C, X.shape[1])
    return torch.as_tensor(clf.coef_), curve, times, W_eq


def _xc_cases(quick):
    Xtr, ytr, Xte, yte, C = _xc_data(quick)
    Xt, yt = torch.as_tensor(Xtr), torch.as_tensor(ytr)
    Xv, yv = torch.as_tensor(Xte), torch.as_tensor(yte)
    epochs = 3 if quick else 4
    seeds = (0,) if quick else (0, 1)
    grid = (3.0,) if quick else (3.0, 10.0)
    target = {}

    def run(name, train, max_epochs):
        def fn():
            # step size: best objective at `epochs` epochs on seed 0 over the grid
            first = {lr: train(lr, 0, max_epochs) for lr in grid}
            best = min(grid, key=lambda lr: first[lr][1][epochs - 1])
            finals, accs, tt, tot = [], [], [], []
            for seed in seeds:
                W, curve, times, W_eq = first[best] if seed == 0 else train(best, seed,
                                                                           max_epochs)
                finals.append(curve[epochs - 1])
                accs.append(float(((Xv @ W_eq.T).argmax(1) == yv).float().mean()))
                tot.append(times[epochs - 1])
                goal = target.get("value", curve[epochs - 1])
                hit = [t for c, t in zip(curve, times) if c <= goal + 1e-9]
                tt.append(hit[0] if hit else float("nan"))
            if name == "full softmax":
                target["value"] = float(np.mean(finals))
            return {"objective": float(np.mean(finals)), "test acc": float(np.mean(accs)),
                    "train s": float(np.mean(tot)), "t_target s": float(np.mean(tt)),
                    "lr": best}
        return Case(name, fn, warmup=0, repeats=1)

    cases = [run("full softmax", lambda lr, s, e: _full_softmax(Xt, yt, C, e, lr, s), epochs)]
    for m in METHODS:  # sampled methods may run 2x the epochs to reach the target
        cases.append(run(m, lambda lr, s, e, m=m: _sampled(Xtr, ytr, C, e, lr, s, m, epochs),
                         2 * epochs))
    return cases


# -- 2. KL-DRO regression ----------------------------------------------------------------
def _dro_optimum(X, y, lam):
    from scipy.optimize import minimize
    from scipy.special import logsumexp

    A = np.c_[X, np.ones(len(X))]

    def f(theta):
        r = A @ theta - y
        ell = r**2 / lam
        p = np.exp(ell - logsumexp(ell))
        return lam * (logsumexp(ell) - math.log(len(y))), A.T @ (p * 2 * r)

    theta0 = np.linalg.lstsq(A, y, rcond=None)[0]
    return minimize(f, theta0, jac=True, method="L-BFGS-B", options={"maxiter": 5000}).fun


def _dro_cases(quick):
    from sklearn.datasets import load_diabetes
    from sklearn.preprocessing import StandardScaler

    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    y = (y - y.mean()) / y.std()
    lams = (0.2, 1.0, 5.0)
    opt = {lam: _dro_optimum(X, y, lam) for lam in lams}
    epochs = 10 if quick else 50
    seeds = (0,) if quick else (0, 1, 2)
    grid = (1e-3, 1e-2) if quick else (3e-4, 1e-3, 3e-3)

    def fit(method, lam, setting, seed):
        lr, log_alpha = setting
        try:
            reg = KLDRORegressor(lam=lam, method=method, lr=lr, epochs=epochs,
                                 log_alpha=log_alpha, random_state=seed).fit(X, y)
            value = reg.objective(X, y)
            return value if np.isfinite(value) else float("inf")
        except FloatingPointError:
            return float("inf")

    def case(method):
        # SCENT is tuned over log_alpha in {0 (default), "auto" (= -nu_0)} as well
        alphas = (None, "auto") if method == "scent" else (None,)
        settings = [(lr, a) for lr in grid for a in alphas]

        def fn():
            out = {}
            for lam in lams:
                first = {st: fit(method, lam, st, 0) for st in settings}
                best = min(settings, key=first.get)
                vals = [first[best]] + [fit(method, lam, best, s) for s in seeds[1:]]
                out[f"gap lam={lam:g}"] = float(np.mean(vals) - opt[lam])
            return out
        return Case(method, fn, warmup=0, repeats=1)

    return [case(m) for m in METHODS]


# -- 3. partial AUC ----------------------------------------------------------------------
def _pauc_cases(quick):
    try:
        from mlpapers.optim.scent import PartialAUCClassifier
    except ImportError:
        return []
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    y = 1 - y  # malignant (the minority) as positives
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    sc = StandardScaler().fit(Xtr)
    Xtr, Xte = sc.transform(Xtr), sc.transform(Xte)
    epochs = 10 if quick else 40
    seeds = (0,) if quick else (0, 1, 2)
    cases = []
    for m in METHODS:
        def fn(m=m):
            objs, paucs = [], []
            for s in seeds:
                clf = PartialAUCClassifier(method=m, epochs=epochs, random_state=s)
                try:
                    clf.fit(Xtr, ytr)
                except FloatingPointError:
                    objs.append(float("inf"))
                    paucs.append(float("nan"))
                    continue
                objs.append(clf.objective(Xtr, ytr))
                paucs.append(clf.score(Xte, yte))
            return {"pAUC objective": float(np.mean(objs)),
                    "test pAUC(FPR<=0.3)": float(np.nanmean(paucs))}
        cases.append(Case(m, fn, warmup=0, repeats=1))
    if importlib.util.find_spec("libauc") is not None:
        cases.append(Case("libauc SOPAs", lambda: _libauc_pauc(Xtr, ytr, Xte, yte, epochs),
                          warmup=0, repeats=1, note="peer: libauc"))
    return cases


def _libauc_pauc(Xtr, ytr, Xte, yte, epochs):
    from libauc.losses import pAUC_DRO_Loss  # noqa: F401 (optional peer)
    from libauc.optimizers import SOPAs
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(0)
    model = torch.nn.Linear(Xtr.shape[1], 1)
    loss_fn = pAUC_DRO_Loss(data_len=len(Xtr), gamma=0.9, margin=1.0, Lambda=1.0)
    opt = SOPAs(model.parameters(), loss_fn=loss_fn, mode="adam", lr=1e-3)
    Xt, yt = torch.as_tensor(Xtr, dtype=torch.float32), torch.as_tensor(ytr, dtype=torch.float32)
    for _ in range(epochs):
        perm = torch.randperm(len(Xt))
        for i in range(0, len(Xt), 64):
            idx = perm[i:i + 64]
            if yt[idx].sum() == 0 or yt[idx].sum() == len(idx):
                continue
            opt.zero_grad()
            loss_fn(torch.sigmoid(model(Xt[idx])), yt[idx][:, None], idx).backward()
            opt.step()
    with torch.no_grad():
        s = model(torch.as_tensor(Xte, dtype=torch.float32))[:, 0].numpy()
    return {"test pAUC(FPR<=0.3)": roc_auc_score(yte, s, max_fpr=0.3)}


SECTIONS = (
    ("xc", _xc_cases, "full softmax",
     "SCENT: extreme classification, 64 sampled negatives vs full softmax"),
    ("dro", _dro_cases, "bsgd",
     "SCENT: KL-DRO least squares (diabetes), gap to the exact optimum"),
    ("pauc", _pauc_cases, "bsgd", "SCENT: one-way partial AUC (breast cancer)"),
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="JSON path; one file per section (suffix _xc, ...)")
    parser.add_argument("--only", choices=[s[0] for s in SECTIONS], action="append")
    args, rest = parser.parse_known_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    for key, make, baseline, title in SECTIONS:
        if args.only and key not in args.only:
            continue
        sub = (["--quick"] if args.quick else []) + ["--repeats", "1", "--warmup", "0"] + rest
        if args.out:
            sub += ["--out", args.out.replace(".json", f"_{key}.json")]
        benchmark_main(make, baseline=baseline, title=title, argv=sub)


if __name__ == "__main__":
    main()
