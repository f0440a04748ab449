"""Benchmark of reflective HMC (``mlpapers.sampling.rehmc``) against its baselines.

Problems
--------
* ``corner``: ``N(1, 0.5^2 I)`` truncated to ``[0, 1]^d`` (mass in a corner), d = 10 and 50.
  Rows: ReflectiveHMC; HMC that rejects trajectories leaving the box; HMC on a logit
  transform; random-walk Metropolis (thin 10); exact rejection sampling (d = 10 only);
  the peers hopsy (BilliardMALA) and PyMC NUTS when installed.
* ``chains``: wall time of 1 versus 64 chains (d = 50 corner problem).
* ``simplex`` (full run): uniform on the 10-simplex, ReflectiveHMC vs random-walk Metropolis.
* ``annulus`` (full run): Gaussian on the annulus 1 <= |x| <= 2, container disc + thinning.
* ``stiefel`` (full run): von Mises-Fisher on the sphere V(3, 1) through the polar expansion.

Columns: min bulk-ESS per second (the case's own wall time, warm-up included), max
R-hat, the worst KS statistic of the marginals against exact draws, acceptance rate,
reflections per leapfrog step and kept fraction.

Usage: ``python benchmarks/bench_rehmc.py [--quick] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from _harness import Case, environment, format_table, run_cases
from scipy import stats

from mlpapers.sampling import (
    Ball,
    Box,
    Polytope,
    ReflectiveHMC,
    Region,
    StiefelSampler,
    matrix_von_mises_fisher_log_density,
)
from mlpapers.sampling import ess as ess_fn
from mlpapers.sampling import rhat as rhat_fn
from mlpapers.sampling.rehmc._baselines import (
    hard_rejection_hmc,
    random_walk_metropolis,
    rejection_truncated_normal,
    transform_hmc,
)


def _metrics(draws, seconds, ks, res=None):
    out = {"min ESS/s": float(np.nanmin(ess_fn(draws))) / seconds,
           "max R-hat": float(np.nanmax(rhat_fn(draws))), "max KS": ks}
    if res is not None:
        out.update({"accept": float(res.accept_rate.mean()),
                    "refl/step": res.reflections_per_step,
                    "kept": float(res.kept_fraction.mean())})
    return out


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def corner_cases(d: int, n: int, warm: int) -> list[Case]:
    mu, sd = 1.0, 0.5
    box = Box(np.zeros(d), np.ones(d))

    def log_prob(x):
        return -0.5 * (((x - mu) / sd) ** 2).sum(-1)

    marg = stats.truncnorm(-mu / sd, (1 - mu) / sd, loc=mu, scale=sd)

    def ks(draws):
        flat = draws.reshape(-1, d)
        return float(max(stats.kstest(flat[:, j], marg.cdf).statistic for j in range(d)))

    x0 = np.full(d, 0.5)
    kw = dict(n_leapfrog=5, target_accept=0.95, random_state=0)

    def ours():
        res, t = _timed(lambda: ReflectiveHMC(log_prob, box, **kw).sample(
            n, x0=x0, warmup=warm))
        return _metrics(res.samples, t, ks(res.samples), res)

    def hard():
        res, t = _timed(lambda: hard_rejection_hmc(log_prob, box, n, x0=x0, warmup=warm, **kw))
        return _metrics(res.samples, t, ks(res.samples), res)

    def logit():
        res, t = _timed(lambda: transform_hmc(log_prob, box, n, x0=x0, warmup=warm, **kw))
        return _metrics(res.samples, t, ks(res.samples), res)

    def rwm():
        draws, t = _timed(lambda: random_walk_metropolis(log_prob, box, n, x0=x0,
                                                         warmup=warm, thin=10))
        return _metrics(draws, t, ks(draws))

    def rejection():
        (draws, acc), t = _timed(lambda: rejection_truncated_normal(
            np.full(d, mu), np.full(d, sd), box, 4 * n))
        m = _metrics(draws.reshape(4, n, d), t, ks(draws))
        m["kept"] = acc
        return m

    cases = [Case(f"ReflectiveHMC d={d}", ours, warmup=0, repeats=1),
             Case(f"HMC + hard rejection d={d}", hard, warmup=0, repeats=1),
             Case(f"HMC on logit transform d={d}", logit, warmup=0, repeats=1),
             Case(f"random-walk Metropolis d={d}", rwm, warmup=0, repeats=1, note="thin 10")]
    if d <= 10:
        cases.append(Case(f"rejection sampling d={d}", rejection, warmup=0, repeats=1,
                          note="exact, iid"))
    try:
        import hopsy  # noqa: F401
    except ImportError:
        cases.append(Case(f"hopsy BilliardMALA d={d}", lambda: {}, warmup=0, repeats=1,
                          note="peer not installed (bench extra)"))
    return cases


def chain_cases(d: int, n: int, warm: int) -> list[Case]:
    box = Box(np.zeros(d), np.ones(d))

    def log_prob(x):
        return -0.5 * (((x - 1.0) / 0.5) ** 2).sum(-1)

    def run(c):
        def fn():
            res = ReflectiveHMC(log_prob, box, n_leapfrog=5, random_state=0).sample(
                n, n_chains=c, warmup=warm)
            return {"draws": float(res.samples.shape[0] * res.samples.shape[1]),
                    "accept": float(res.accept_rate.mean())}
        return fn

    return [Case("1 chain", run(1), warmup=0, repeats=1),
            Case("64 chains", run(64), warmup=0, repeats=1)]


def other_cases(n: int, warm: int) -> list[Case]:
    d = 10
    simplex = Polytope(np.vstack([-np.eye(d), np.ones((1, d))]), np.r_[np.zeros(d), 1.0])

    def const(x):
        return torch.zeros(x.shape[0], dtype=x.dtype)

    beta = stats.beta(1, d)

    def ks_simplex(draws):
        flat = draws.reshape(-1, d)
        return float(max(stats.kstest(flat[:, j], beta.cdf).statistic for j in range(d)))

    def simplex_ours():
        res, t = _timed(lambda: ReflectiveHMC(const, simplex, random_state=0).sample(
            n, warmup=warm))
        return _metrics(res.samples, t, ks_simplex(res.samples), res)

    def simplex_rwm():
        x0 = simplex.interior_point()
        draws, t = _timed(lambda: random_walk_metropolis(const, simplex, n, x0=x0,
                                                         warmup=warm, thin=10))
        return _metrics(draws, t, ks_simplex(draws))

    annulus = Region(lambda x: x.norm(dim=-1) >= 1.0)

    def radius_cdf(r):
        r = np.clip(r, 1, 2)
        return (np.exp(-0.5) - np.exp(-0.5 * r**2)) / (np.exp(-0.5) - np.exp(-2.0))

    def annulus_ours():
        res, t = _timed(lambda: ReflectiveHMC(
            lambda x: -0.5 * (x**2).sum(-1), Ball([0.0, 0.0], 2.0), support=annulus,
            random_state=0).sample(n, warmup=warm))
        r = np.linalg.norm(res.samples, axis=-1).ravel()
        return _metrics(res.samples, t, float(stats.kstest(r, radius_cdf).statistic), res)

    mu, kappa = np.array([0.0, 0.0, 1.0]), 3.0
    ref = stats.vonmises_fisher(mu, kappa).rvs(100_000, random_state=0) @ mu

    def stiefel():
        res, t = _timed(lambda: StiefelSampler(
            matrix_von_mises_fisher_log_density((kappa * mu)[:, None]), n=3, k=1,
            n_leapfrog=5, random_state=0).sample(n, warmup=warm))
        proj = res.Q.reshape(-1, 3) @ mu
        return _metrics(res.samples, t, float(stats.ks_2samp(proj, ref).statistic), res)

    return [Case("simplex d=10: ReflectiveHMC", simplex_ours, warmup=0, repeats=1),
            Case("simplex d=10: random-walk Metropolis", simplex_rwm, warmup=0, repeats=1,
                 note="thin 10"),
            Case("annulus: ReflectiveHMC + thinning", annulus_ours, warmup=0, repeats=1),
            Case("Stiefel V(3,1) vMF: polar ReflectiveHMC", stiefel, warmup=0, repeats=1)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    q = args.quick
    groups = [("Truncated Gaussian in a box corner, d=10", corner_cases(10, *(
        (300, 200) if q else (1000, 500))), "ReflectiveHMC d=10")]
    if not q:
        groups.append(("Truncated Gaussian in a box corner, d=50",
                       corner_cases(50, 1000, 500), "ReflectiveHMC d=50"))
    groups.append(("Chains in one batch (d=50)", chain_cases(50, *((100, 100) if q else
                                                                    (500, 300))), "1 chain"))
    if not q:
        groups.append(("Other supports", other_cases(1000, 300), None))
    payload = {"environment": environment(), "quick": q, "groups": []}
    for title, cases, base in groups:
        print(f"# {title}", file=sys.stderr)
        results = run_cases(cases)
        print(f"\n## {title}\n")
        print(format_table(results, base))
        payload["groups"].append({"title": title, "baseline": base,
                                  "results": [r.__dict__ for r in results]})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=2)


if __name__ == "__main__":
    main()
