"""Benchmark of reflective HMC (``mlpapers.sampling.rehmc``) against its baselines.

Problems
--------
* ``corner``: ``N(1, 0.5^2 I)`` truncated to ``[0, 1]^d`` (mass in a corner), d = 10 and 50.
  Rows: ReflectiveHMC; HMC that rejects trajectories leaving the box; HMC on a logit
  transform; random-walk Metropolis (thin 10); exact rejection sampling (d = 10 only);
  the peers hopsy (reflective BilliardMALA, and its Gaussian-only truncated-Gaussian
  proposal) and PyMC NUTS on ``TruncatedNormal`` when installed (``bench`` extra).
  Every row runs 4 chains, the same warm-up and the same number of draws from the same
  start; every HMC row uses the library defaults (``target_accept=0.8``, step size by
  dual averaging in warm-up, ``n_leapfrog=10``); at d = 50 a second pair of rows uses
  ``n_leapfrog=5`` and a pair with ``mass="diag"`` show the sensitivity to the fixed
  path length and to the mass matrix.
* ``chains``: wall time of 1 versus 64 chains (d = 50 corner problem).
* ``simplex`` (full run): uniform on the 10-simplex, ReflectiveHMC vs random-walk Metropolis.
* ``annulus`` (full run): Gaussian on the annulus 1 <= |x| <= 2, container disc + thinning.
* ``stiefel`` (full run): von Mises-Fisher on the sphere V(3, 1) through the polar expansion.

Columns: min bulk-ESS (deterministic for a seed) and min bulk-ESS per second (the case's
own wall time, warm-up included; the same
rank-normalised estimator for every row), max R-hat, the worst KS statistic of the
marginals against exact draws, acceptance rate, reflections per leapfrog step, kept
fraction and, for NUTS, gradient evaluations per draw. PyMC's model is compiled once
before the timed run (pytensor caches it on disk).

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
    min_ess = float(np.nanmin(ess_fn(draws)))
    out = {"min ESS": min_ess, "min ESS/s": min_ess / seconds,
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


def hopsy_billiard_mala(mu, sd, box: Box, n: int, warm: int, *, x0, n_chains: int = 4,
                        seed: int = 0):
    """hopsy's reflective BilliardMALA on the truncated Gaussian.

    hopsy reports an acceptance rate near 1 for every step size on this target, so
    acceptance targeting cannot tune it; the warm-up instead tries 9 step sizes
    (``0.25 ... 64``, equal shares of the warm-up iterations) and keeps the one with
    the largest expected squared jump distance, hopsy's own ``esjd`` tuning target.
    """
    import hopsy

    d = box.dim
    A, b = np.vstack([np.eye(d), -np.eye(d)]), np.r_[box.hi, -box.lo]
    prob = hopsy.Problem(A, b, hopsy.Gaussian(mean=mu, covariance=np.diag(sd**2)))
    rngs = [hopsy.RandomNumberGenerator(seed=seed + i) for i in range(n_chains)]

    def chains(start, step):
        return [hopsy.MarkovChain(prob, hopsy.BilliardMALAProposal(
            prob, starting_point=s0, stepsize=float(step), max_reflections=100 * d),
            starting_point=s0) for s0 in start]

    start = [np.asarray(x0, dtype=float)] * n_chains
    grid = np.geomspace(0.25, 64.0, 9)
    esjd = []
    for step in grid:
        _, draws = hopsy.sample(chains(start, step), rngs, n_samples=max(warm // len(grid), 2))
        start = list(draws[:, -1])
        esjd.append(float((np.diff(draws, axis=1) ** 2).sum(-1).mean()))
    step = grid[int(np.argmax(esjd))]
    acc, draws = hopsy.sample(chains(start, step), rngs, n_samples=n)
    return np.asarray(draws), float(np.mean(acc)), float(step)


def hopsy_truncated_gaussian(mu, sd, box: Box, n: int, warm: int, *, x0, n_chains: int = 4,
                             seed: int = 0):
    """hopsy's default proposal for a Gaussian model: its specialised truncated-Gaussian
    sampler (Gaussian targets only; no tuning)."""
    import hopsy

    d = box.dim
    A, b = np.vstack([np.eye(d), -np.eye(d)]), np.r_[box.hi, -box.lo]
    prob = hopsy.Problem(A, b, hopsy.Gaussian(mean=mu, covariance=np.diag(sd**2)))
    x0 = np.asarray(x0, dtype=float)
    mcs = [hopsy.MarkovChain(prob, hopsy.TruncatedGaussianProposal, starting_point=x0)
           for _ in range(n_chains)]
    rngs = [hopsy.RandomNumberGenerator(seed=seed + i) for i in range(n_chains)]
    hopsy.sample(mcs, rngs, n_samples=warm)
    acc, draws = hopsy.sample(mcs, rngs, n_samples=n)
    return np.asarray(draws), float(np.mean(acc))


def pymc_nuts_model(mu, sd, box: Box):
    """PyMC's ``TruncatedNormal`` (NUTS on its interval/logit transform)."""
    import pymc as pm

    with pm.Model() as model:
        pm.TruncatedNormal("x", mu=mu, sigma=sd, lower=box.lo, upper=box.hi, shape=box.dim)
    return model


def pymc_nuts(model, n: int, warm: int, *, x0, n_chains: int = 4, target_accept: float = 0.8):
    import pymc as pm

    with model:
        idata = pm.sample(draws=n, tune=warm, chains=n_chains, cores=1, random_seed=0,
                          target_accept=target_accept, progressbar=False,
                          compute_convergence_checks=False,
                          initvals={"x": np.asarray(x0, dtype=float)})
    stats_ = idata.sample_stats
    return (idata.posterior["x"].values, float(stats_["acceptance_rate"].mean()),
            float(stats_["n_steps"].mean()))


def _peer_installed(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def corner_cases(d: int, n: int, warm: int, *, peers: bool = True, n_leapfrog: int = 10,
                 variants: tuple[tuple[int, str], ...] = ()) -> list[Case]:
    """The corner problem; ``variants`` adds (n_leapfrog, mass) pairs of rows (ours and
    the logit transform) besides the defaults."""
    mu, sd = 1.0, 0.5
    box = Box(np.zeros(d), np.ones(d))

    def log_prob(x):
        return -0.5 * (((x - mu) / sd) ** 2).sum(-1)

    marg = stats.truncnorm(-mu / sd, (1 - mu) / sd, loc=mu, scale=sd)

    def ks(draws):
        flat = draws.reshape(-1, d)
        return float(max(stats.kstest(flat[:, j], marg.cdf).statistic for j in range(d)))

    x0 = np.full(d, 0.5)

    def kw(steps, mass="identity"):  # library defaults; each row adapts its own step size
        return dict(n_leapfrog=steps, mass=mass, target_accept=0.8, random_state=0)

    def ours(steps, mass="identity"):
        def fn():
            res, t = _timed(lambda: ReflectiveHMC(log_prob, box, **kw(steps, mass)).sample(
                n, x0=x0, warmup=warm))
            return _metrics(res.samples, t, ks(res.samples), res)
        return fn

    def hard():
        res, t = _timed(lambda: hard_rejection_hmc(log_prob, box, n, x0=x0, warmup=warm,
                                                   **kw(n_leapfrog)))
        return _metrics(res.samples, t, ks(res.samples), res)

    def logit(steps, mass="identity"):
        def fn():
            res, t = _timed(lambda: transform_hmc(log_prob, box, n, x0=x0, warmup=warm,
                                                  **kw(steps, mass)))
            return _metrics(res.samples, t, ks(res.samples), res)
        return fn

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

    mu_v, sd_v = np.full(d, mu), np.full(d, sd)

    def bmala():
        (draws, acc, step), t = _timed(lambda: hopsy_billiard_mala(mu_v, sd_v, box, n, warm,
                                                                   x0=x0))
        return {**_metrics(draws, t, ks(draws)), "accept": acc, "step": step}

    def tgauss():
        (draws, acc), t = _timed(lambda: hopsy_truncated_gaussian(mu_v, sd_v, box, n, warm,
                                                                  x0=x0))
        return {**_metrics(draws, t, ks(draws)), "accept": acc}

    def nuts():
        model = pymc_nuts_model(mu, sd, box)
        pymc_nuts(model, 10, 10, x0=x0)  # compile (pytensor's disk cache), untimed
        (draws, acc, steps), t = _timed(lambda: pymc_nuts(model, n, warm, x0=x0))
        return {**_metrics(draws, t, ks(draws)), "accept": acc, "grad/draw": steps}

    L = n_leapfrog
    cases = [Case(f"ReflectiveHMC d={d}", ours(L), warmup=0, repeats=1, note=f"L={L}"),
             Case(f"HMC + hard rejection d={d}", hard, warmup=0, repeats=1, note=f"L={L}"),
             Case(f"HMC on logit transform d={d}", logit(L), warmup=0, repeats=1,
                  note=f"L={L}"),
             Case(f"random-walk Metropolis d={d}", rwm, warmup=0, repeats=1, note="thin 10")]
    for steps, mass in variants:
        tag = f"L={steps}" + ("" if mass == "identity" else f" mass={mass}")
        cases += [Case(f"ReflectiveHMC {tag} d={d}", ours(steps, mass), warmup=0, repeats=1,
                       note=tag),
                  Case(f"HMC on logit transform {tag} d={d}", logit(steps, mass), warmup=0,
                       repeats=1, note=tag)]
    if d <= 10:
        cases.append(Case(f"rejection sampling d={d}", rejection, warmup=0, repeats=1,
                          note="exact, iid"))
    missing = "peer not installed (bench extra)"
    if _peer_installed("hopsy"):
        cases += [Case(f"hopsy BilliardMALA d={d}", bmala, warmup=0, repeats=1,
                       note="peer, reflective"),
                  Case(f"hopsy TruncatedGaussian d={d}", tgauss, warmup=0, repeats=1,
                       note="peer, Gaussian-only")]
    else:
        cases.append(Case(f"hopsy BilliardMALA d={d}", dict, warmup=0, repeats=1, note=missing))
    if not peers:  # --quick: skip PyMC's compile time
        pass
    elif _peer_installed("pymc"):
        cases.append(Case(f"PyMC NUTS d={d}", nuts, warmup=0, repeats=1,
                          note="peer, logit transform"))
    else:
        cases.append(Case(f"PyMC NUTS d={d}", dict, warmup=0, repeats=1, note=missing))
    return cases


def chain_cases(d: int, n: int, warm: int) -> list[Case]:
    box = Box(np.zeros(d), np.ones(d))

    def log_prob(x):
        return -0.5 * (((x - 1.0) / 0.5) ** 2).sum(-1)

    def run(c):
        def fn():
            res = ReflectiveHMC(log_prob, box, random_state=0).sample(
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
        (300, 200) if q else (1000, 500)), peers=not q), "ReflectiveHMC d=10")]
    if not q:
        variants = ((5, "identity"), (10, "diag"))
        groups.append(("Truncated Gaussian in a box corner, d=50",
                       corner_cases(50, 1000, 500, variants=variants), "ReflectiveHMC d=50"))
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
