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
  dual averaging in warm-up) with ``n_leapfrog=10`` or ``"auto"`` (the default: the
  ChEES-adapted trajectory length) as its note says. At d = 50 a second pair of rows uses
  ``n_leapfrog=5`` and a pair with ``mass="diag"`` show the sensitivity to the fixed
  path length and to the mass matrix, and rows with 16, 64 and 256 chains show what a
  batch of chains buys (the peers run their chains one after the other, so their ESS/s
  does not grow with the number of chains; the logit transform batches too and gets
  256-chain rows). The "analytic grad" rows pass the Gaussian's gradient as
  ``grad_log_prob`` instead of using autograd (the same draws, bit for bit).
* ``ill``: ``N(0, diag(s^2))`` with ``s`` from 0.05 to 1 truncated to ``[-2, 2]^20``,
  identity mass: fixed ``n_leapfrog=10`` versus ``"auto"`` (full run).
* ``chains``: wall time of 1 versus 64 chains (d = 50 corner problem), and of 2 versus 64
  chains with ``n_leapfrog="auto"`` (ChEES needs at least 2 chains).
* ``simplex`` (full run): uniform on the 10-simplex, ReflectiveHMC (fixed and ``"auto"``)
  vs random-walk Metropolis.
* ``annulus`` (full run): Gaussian on the annulus 1 <= |x| <= 2, container disc + thinning
  (fixed and ``"auto"``).
* ``stiefel`` (full run): von Mises-Fisher on the sphere V(3, 1) through the polar expansion.

Columns: min bulk-ESS (deterministic for a seed), min bulk-ESS per 1000 gradient
evaluations of our torch rows (warm-up included; deterministic, so independent of the
machine's load), min bulk-ESS per second (the case's own wall time, warm-up included; the
same rank-normalised estimator for every row), microseconds per leapfrog step of all
chains (wall time over batched gradient calls, every overhead included), max R-hat, the
worst KS statistic of the marginals against exact draws, acceptance rate, reflections per
leapfrog step, kept fraction and, for NUTS, gradient evaluations per draw. PyMC's model
is compiled once before the timed run (pytensor caches it on disk).

* ``--sweep`` (alone): fixed ``n_leapfrog=10`` versus ``"auto"`` with 4 and 16 chains on
  the d = 50 corner, the badly scaled d = 20 target, the uniform 10-simplex and the
  annulus (1000 draws after 500 warm-up iterations): the measurements behind the default.
* ``--seeds`` (alone): the same comparison in ESS/1k grad over 4 seeds with 2, 4 and 16
  chains (500 draws after 300 warm-up iterations), adding a correlated Gaussian and a
  von Mises-Fisher law on the sphere: median, min and max of the per-seed ratio.
* ``--corner`` (alone): only the d = 50 corner table, the issue's goal.
* ``--repeats N``: time every row N times (same seed, so the same draws) and keep the
  median wall time; on a loaded machine single runs vary by up to 2x.

``--quick`` shrinks every mode (fewer draws; 2 seeds with ``--seeds``).

Usage: ``python benchmarks/bench_rehmc.py [--quick] [--sweep | --seeds | --corner]
[--repeats N] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np
import torch
from _harness import (
    Case,
    environment,
    format_table,
    int_at_least,
    run_cases,
    writable_file,
    write_json,
)
from scipy import stats
from scipy.special import ndtr

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


def _metrics(draws, seconds, ks, res=None, grads=None):
    min_ess = float(np.nanmin(ess_fn(draws)))
    out = {"min ESS": min_ess, "min ESS/s": min_ess / seconds,
           "max R-hat": float(np.nanmax(rhat_fn(draws))), "max KS": ks}
    if grads is not None:  # load-independent efficiency: gradients of warm-up + sampling
        out["ESS/1k grad"] = 1000.0 * min_ess / max(grads, 1)
        # wall time per batched gradient call (= per leapfrog step, all overhead included)
        out["us/step"] = 1e6 * seconds * draws.shape[0] / max(grads, 1)
    if res is not None:
        out.update({"accept": float(res.accept_rate.mean()),
                    "refl/step": res.reflections_per_step,
                    "kept": float(res.kept_fraction.mean()),
                    "mean L": res.mean_leapfrog})
    return out


REPEATS = [1]  # --repeats: timed runs per row (same seed, same draws); the median is kept


def _timed(fn, *counters):
    """Run ``fn`` ``REPEATS[0]`` times; return its (deterministic) output and the median
    wall time. ``counters`` (:class:`_Counted`) are reset before each run."""
    times = []
    for _ in range(REPEATS[0]):
        for c in counters:
            c.n = 0
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, float(np.median(times))


class _Counted:
    """Wrap a batched ``log_prob`` and count per-chain evaluations (= gradients)."""

    def __init__(self, fn):
        self.fn, self.n = fn, 0

    def __call__(self, x):
        self.n += x.shape[0]
        return self.fn(x)


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
                 variants: tuple[tuple[int, str], ...] = (),
                 batches: tuple[tuple[int | str, int, bool], ...] = (),
                 logit_batches: tuple[tuple[int | str, str, int], ...] = ()) -> list[Case]:
    """The corner problem; ``variants`` adds (n_leapfrog, mass) pairs of rows (ours and
    the logit transform) besides the defaults, ``batches`` adds (n_leapfrog, n_chains,
    analytic gradient) rows of ours and ``logit_batches`` (n_leapfrog, mass, n_chains)
    rows of the logit transform."""
    mu, sd = 1.0, 0.5
    box = Box(np.zeros(d), np.ones(d))

    def log_prob(x):
        return -0.5 * (((x - mu) / sd) ** 2).sum(-1)

    def grad_log_prob(x):  # analytic; the operations autograd runs, so the same draws
        return -((x - mu) / sd) / sd

    lo_cdf, hi_cdf = ndtr(-mu / sd), ndtr((1 - mu) / sd)

    def ks(draws):  # worst marginal KS statistic against truncnorm(mu, sd) on [0, 1]
        flat = np.sort(draws.reshape(-1, d), axis=0)  # all marginals at once (256 chains)
        cdf = (ndtr((flat - mu) / sd) - lo_cdf) / (hi_cdf - lo_cdf)
        i = np.arange(1, len(flat) + 1)[:, None] / len(flat)
        return float(max((i - cdf).max(), (cdf - (i - 1.0 / len(flat))).max()))

    x0 = np.full(d, 0.5)

    def kw(steps, mass="identity"):  # library defaults; each row adapts its own step size
        return dict(n_leapfrog=steps, mass=mass, target_accept=0.8, random_state=0)

    def ours(steps, mass="identity", chains=4, analytic=False):
        def fn():
            if analytic:  # count the gradient calls, not the end-of-trajectory log_prob
                lp, grad = log_prob, _Counted(grad_log_prob)
            else:
                lp = grad = _Counted(log_prob)
            res, t = _timed(lambda: ReflectiveHMC(
                lp, box, grad_log_prob=grad if analytic else None, **kw(steps, mass)).sample(
                n, x0=x0, warmup=warm, n_chains=chains), grad)
            return _metrics(res.samples, t, ks(res.samples), res, grad.n)
        return fn

    def hard():
        res, t = _timed(lambda: hard_rejection_hmc(log_prob, box, n, x0=x0, warmup=warm,
                                                   **kw(n_leapfrog)))
        return _metrics(res.samples, t, ks(res.samples), res)

    def logit(steps, mass="identity", chains=4):
        def fn():
            lp = _Counted(log_prob)
            res, t = _timed(lambda: transform_hmc(lp, box, n, x0=x0, warmup=warm,
                                                  n_chains=chains, **kw(steps, mass)), lp)
            return _metrics(res.samples, t, ks(res.samples), res, lp.n)
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
             Case(f"ReflectiveHMC auto d={d}", ours("auto"), warmup=0, repeats=1,
                  note="ChEES"),
             Case(f"HMC on logit transform auto d={d}", logit("auto"), warmup=0, repeats=1,
                  note="ChEES"),
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
    for steps, chains, analytic in batches:
        tag = "ChEES" if steps == "auto" else f"L={steps}"
        grad = ", analytic grad" if analytic else ""
        name = f"ReflectiveHMC {tag}{grad}" + (f", {chains} chains" if chains != 4 else "")
        cases.append(Case(f"{name} d={d}", ours(steps, chains=chains, analytic=analytic),
                          warmup=0, repeats=1, note=f"{chains} chains{grad}"))
    for steps, mass, chains in logit_batches:  # the transform batches its chains too
        tag = ("ChEES" if steps == "auto" else f"L={steps}") + (
            "" if mass == "identity" else f" mass={mass}")
        cases.append(Case(f"HMC on logit transform {tag}, {chains} chains d={d}",
                          logit(steps, mass, chains), warmup=0, repeats=1,
                          note=f"{chains} chains"))
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

    def run(c, steps=10):
        def fn():
            res = ReflectiveHMC(log_prob, box, n_leapfrog=steps, random_state=0).sample(
                n, n_chains=c, warmup=warm)
            return {"draws": float(res.samples.shape[0] * res.samples.shape[1]),
                    "accept": float(res.accept_rate.mean()), "mean L": res.mean_leapfrog,
                    "max R-hat": float(np.nanmax(rhat_fn(res.samples)))}
        return fn

    # these rows do not time themselves (no _timed): the table's time column is their
    # measurement, so the harness repeats them --repeats times and keeps the median
    once = dict(warmup=0, repeats=REPEATS[0])
    return [Case("1 chain", run(1), **once, note="L=10"),
            Case("64 chains", run(64), **once, note="L=10"),
            Case("2 chains, auto", run(2, "auto"), **once, note="ChEES"),
            Case("64 chains, auto", run(64, "auto"), **once, note="ChEES")]


def ill_cases(n: int, warm: int) -> list[Case]:
    """A badly scaled truncated Gaussian (identity mass): where a fixed length is poor."""
    d = 20
    sd = np.geomspace(0.05, 1.0, d)
    box = Box(np.full(d, -2.0), np.full(d, 2.0))
    sd_t = torch.as_tensor(sd)

    def log_prob(x):
        return -0.5 * ((x / sd_t) ** 2).sum(-1)

    margs = [stats.truncnorm(-2 / s, 2 / s, scale=s) for s in sd]

    def ks(draws):
        flat = draws.reshape(-1, d)
        return float(max(stats.kstest(flat[:, j], margs[j].cdf).statistic for j in range(d)))

    def ours(steps):
        def fn():
            lp = _Counted(log_prob)
            res, t = _timed(lambda: ReflectiveHMC(lp, box, n_leapfrog=steps,
                                                  random_state=0).sample(n, x0=x0,
                                                                         warmup=warm), lp)
            return _metrics(res.samples, t, ks(res.samples), res, lp.n)
        return fn

    x0 = np.zeros(d)

    def logit():
        lp = _Counted(log_prob)
        res, t = _timed(lambda: transform_hmc(lp, box, n, x0=x0, warmup=warm,
                                              n_leapfrog=10, random_state=0), lp)
        return _metrics(res.samples, t, ks(res.samples), res, lp.n)

    return [Case("ReflectiveHMC", ours(10), warmup=0, repeats=1, note="L=10"),
            Case("ReflectiveHMC auto", ours("auto"), warmup=0, repeats=1, note="ChEES"),
            Case("HMC on logit transform", logit, warmup=0, repeats=1, note="L=10")]


def other_cases(n: int, warm: int) -> list[Case]:
    d = 10
    simplex = Polytope(np.vstack([-np.eye(d), np.ones((1, d))]), np.r_[np.zeros(d), 1.0])

    def const(x):
        return torch.zeros(x.shape[0], dtype=x.dtype)

    beta = stats.beta(1, d)

    def ks_simplex(draws):
        flat = draws.reshape(-1, d)
        return float(max(stats.kstest(flat[:, j], beta.cdf).statistic for j in range(d)))

    def simplex_ours(steps=10):
        def fn():
            lp = _Counted(const)
            res, t = _timed(lambda: ReflectiveHMC(lp, simplex, n_leapfrog=steps,
                                                  random_state=0).sample(n, warmup=warm), lp)
            return _metrics(res.samples, t, ks_simplex(res.samples), res, lp.n)
        return fn

    def simplex_rwm():
        x0 = simplex.interior_point()
        draws, t = _timed(lambda: random_walk_metropolis(const, simplex, n, x0=x0,
                                                         warmup=warm, thin=10))
        return _metrics(draws, t, ks_simplex(draws))

    annulus = Region(lambda x: x.norm(dim=-1) >= 1.0)

    def radius_cdf(r):
        r = np.clip(r, 1, 2)
        return (np.exp(-0.5) - np.exp(-0.5 * r**2)) / (np.exp(-0.5) - np.exp(-2.0))

    def annulus_ours(steps=10):
        def fn():
            lp = _Counted(lambda x: -0.5 * (x**2).sum(-1))
            res, t = _timed(lambda: ReflectiveHMC(
                lp, Ball([0.0, 0.0], 2.0), support=annulus,
                n_leapfrog=steps, random_state=0).sample(n, warmup=warm), lp)
            r = np.linalg.norm(res.samples, axis=-1).ravel()
            return _metrics(res.samples, t, float(stats.kstest(r, radius_cdf).statistic), res,
                            lp.n)
        return fn

    mu, kappa = np.array([0.0, 0.0, 1.0]), 3.0
    ref = stats.vonmises_fisher(mu, kappa).rvs(100_000, random_state=0) @ mu

    def stiefel():
        res, t = _timed(lambda: StiefelSampler(
            matrix_von_mises_fisher_log_density((kappa * mu)[:, None]), n=3, k=1,
            n_leapfrog=5, random_state=0).sample(n, warmup=warm))
        proj = res.Q.reshape(-1, 3) @ mu
        return _metrics(res.samples, t, float(stats.ks_2samp(proj, ref).statistic), res)

    return [Case("simplex d=10: ReflectiveHMC", simplex_ours(), warmup=0, repeats=1,
                 note="L=10"),
            Case("simplex d=10: ReflectiveHMC auto", simplex_ours("auto"), warmup=0,
                 repeats=1, note="ChEES"),
            Case("simplex d=10: random-walk Metropolis", simplex_rwm, warmup=0, repeats=1,
                 note="thin 10"),
            Case("annulus: ReflectiveHMC + thinning", annulus_ours(), warmup=0, repeats=1,
                 note="L=10"),
            Case("annulus: ReflectiveHMC auto + thinning", annulus_ours("auto"), warmup=0,
                 repeats=1, note="ChEES"),
            Case("Stiefel V(3,1) vMF: polar ReflectiveHMC", stiefel, warmup=0, repeats=1)]


def sweep_cases(n: int, warm: int) -> list[Case]:
    """Fixed ``n_leapfrog=10`` versus ``"auto"`` with 4 and 16 chains on four targets: the
    measurements behind the choice of the default (``--sweep``)."""
    d = 20
    sd = torch.as_tensor(np.geomspace(0.05, 1.0, d))
    simplex = Polytope(np.vstack([-np.eye(10), np.ones((1, 10))]), np.r_[np.zeros(10), 1.0])
    targets = {
        "corner d=50": (lambda x: -0.5 * (((x - 1.0) / 0.5) ** 2).sum(-1),
                        Box(np.zeros(50), np.ones(50)), None),
        "badly scaled d=20": (lambda x: -0.5 * ((x / sd) ** 2).sum(-1),
                              Box(np.full(d, -2.0), np.full(d, 2.0)), None),
        "uniform simplex d=10": (lambda x: torch.zeros(x.shape[0], dtype=x.dtype), simplex,
                                 None),
        "annulus": (lambda x: -0.5 * (x**2).sum(-1), Ball([0.0, 0.0], 2.0),
                    Region(lambda x: x.norm(dim=-1) >= 1.0)),
    }

    def run(lp_fn, cont, support, steps, chains):
        def fn():
            lp = _Counted(lp_fn)
            res, t = _timed(lambda: ReflectiveHMC(lp, cont, support=support,
                                                  n_leapfrog=steps, random_state=0).sample(
                n, n_chains=chains, warmup=warm), lp)
            min_ess = float(np.nanmin(res.ess()))
            return {"min ESS": min_ess, "ESS/1k grad": 1000 * min_ess / lp.n,
                    "min ESS/s": min_ess / t, "max R-hat": float(np.nanmax(res.rhat())),
                    "mean L": res.mean_leapfrog,
                    "T": res.trajectory_length or float("nan")}
        return fn

    return [Case(f"{name}, {chains} chains, {'auto' if steps == 'auto' else 'L=10'}",
                 run(lp, cont, sup, steps, chains), warmup=0, repeats=1)
            for name, (lp, cont, sup) in targets.items() for chains in (4, 16)
            for steps in (10, "auto")]


def seed_cases(n: int, warm: int, chains: tuple[int, ...] = (2, 4, 16),
               seeds: int = 4) -> list[Case]:
    """ESS/1k grad of ``"auto"`` against ``n_leapfrog=10`` over ``seeds`` seeds (random
    starts) on six targets, adding a correlated Gaussian and the von Mises-Fisher law on
    the sphere (through :class:`StiefelSampler`) to the sweep's (``--seeds``): the
    spread behind the default."""
    sd = torch.as_tensor(np.geomspace(0.05, 1.0, 20))
    chol = torch.as_tensor(np.linalg.cholesky(0.1 * np.eye(8) + 0.9 * np.ones((8, 8))))
    prec = torch.linalg.inv(chol @ chol.T)
    simplex = Polytope(np.vstack([-np.eye(10), np.ones((1, 10))]), np.r_[np.zeros(10), 1.0])
    targets = {
        "corner d=50": (lambda x: -0.5 * (((x - 1.0) / 0.5) ** 2).sum(-1),
                        Box(np.zeros(50), np.ones(50)), None),
        "badly scaled d=20": (lambda x: -0.5 * ((x / sd) ** 2).sum(-1),
                              Box(np.full(20, -2.0), np.full(20, 2.0)), None),
        "uniform simplex d=10": (lambda x: torch.zeros(x.shape[0], dtype=x.dtype), simplex,
                                 None),
        "correlated d=8 (rho=0.9)": (lambda x: -0.5 * ((x @ prec) * x).sum(-1),
                                     Box(np.full(8, -1.5), np.full(8, 1.5)), None),
        "annulus": (lambda x: -0.5 * (x**2).sum(-1), Ball([0.0, 0.0], 2.0),
                    Region(lambda x: x.norm(dim=-1) >= 1.0)),
        "Stiefel V(3,1) vMF": (lambda q: vmf(q), "stiefel", None),
    }

    vmf = matrix_von_mises_fisher_log_density(np.array([[3.0], [0.0], [0.0]]))

    def draw(lp_fn, cont, support, steps, c, seed):
        lp = _Counted(lp_fn)
        if cont == "stiefel":  # polar expansion of the sphere V(3, 1)
            res = StiefelSampler(lp, n=3, k=1, n_leapfrog=steps, random_state=seed).sample(
                n, n_chains=c, warmup=warm)
        else:
            res = ReflectiveHMC(lp, cont, support=support, n_leapfrog=steps,
                                random_state=seed).sample(n, n_chains=c, warmup=warm)
        return 1000 * float(np.nanmin(res.ess())) / lp.n

    def run(lp_fn, cont, support, c):
        def fn():
            eff = {steps: [draw(lp_fn, cont, support, steps, c, seed) for seed in range(seeds)]
                   for steps in (10, "auto")}
            ratio = np.array(eff["auto"]) / np.array(eff[10])
            return {"L=10 ESS/1k grad": float(np.median(eff[10])),
                    "auto ESS/1k grad": float(np.median(eff["auto"])),
                    "ratio median": float(np.median(ratio)), "ratio min": float(ratio.min()),
                    "ratio max": float(ratio.max())}
        return fn

    # no _timed inside: the harness times these rows --repeats times (median)
    return [Case(f"{name}, {c} chains", run(lp, cont, sup, c), warmup=0, repeats=REPEATS[0])
            for name, (lp, cont, sup) in targets.items() for c in chains]


# (n_leapfrog, n_chains, analytic gradient) rows of ours on the d = 50 corner, besides the
# 4-chain defaults: chains in one batch, and the Gaussian's analytic gradient (no autograd)
CORNER_BATCHES = ((10, 16, False), ("auto", 16, False), (10, 64, False), ("auto", 64, False),
                  ("auto", 256, False), ("auto", 4, True), ("auto", 64, True),
                  ("auto", 256, True))
# (n_leapfrog, mass, n_chains): the logit transform's default and its best 4-chain setting,
# batched like ours (the peers run their chains one after the other)
CORNER_LOGIT_BATCHES = (("auto", "identity", 256), (10, "diag", 256))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes for a smoke run (also with --sweep, --seeds or "
                             "--corner)")
    parser.add_argument("--out", type=writable_file, help="write the tables as JSON here")
    # one table each: two of them used to run only the first silently
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true",
                      help="only the fixed-versus-auto sweep behind the default")
    mode.add_argument("--seeds", action="store_true",
                      help="only the fixed-versus-auto comparison over 4 seeds (2 with "
                           "--quick)")
    mode.add_argument("--corner", action="store_true",
                      help="only the d=50 corner table (the issue's goal)")
    parser.add_argument("--repeats", type=int_at_least(1), default=1,
                        help="timed runs per row (median wall time; the draws are the same)")
    args = parser.parse_args(argv)
    REPEATS[0] = args.repeats
    torch.set_num_threads(1)
    # every table has a "max R-hat" column: the samplers' own warning about it (expected
    # for the hard-rejection baseline and for short quick runs) would only repeat it
    warnings.filterwarnings("ignore", message="the chains disagree", category=RuntimeWarning)
    q = args.quick
    # --quick scales every mode down (it used to run --sweep/--seeds/--corner at full
    # size while the JSON said quick)
    if args.sweep:
        return _run_groups([("Fixed n_leapfrog=10 versus auto",
                             sweep_cases(*((200, 100) if q else (1000, 500))), None)],
                           q, args.out)
    if args.seeds:
        return _run_groups([("auto / n_leapfrog=10 over seeds",
                             seed_cases(*((100, 100) if q else (500, 300)),
                                        seeds=2 if q else 4), None)],
                           q, args.out)
    groups = [("Truncated Gaussian in a box corner, d=10", corner_cases(10, *(
        (300, 200) if q else (1000, 500)), peers=not q), "ReflectiveHMC d=10")]
    if args.corner:
        corner50 = ("Truncated Gaussian in a box corner, d=50",
                    corner_cases(50, *((300, 200) if q else (1000, 500)), peers=not q,
                                 variants=((5, "identity"), (10, "diag")),
                                 batches=CORNER_BATCHES, logit_batches=CORNER_LOGIT_BATCHES),
                    "ReflectiveHMC d=50")
        return _run_groups([corner50], q, args.out)
    if not q:
        groups.append(("Truncated Gaussian in a box corner, d=50",
                       corner_cases(50, 1000, 500, variants=((5, "identity"), (10, "diag")),
                                    batches=CORNER_BATCHES,
                                    logit_batches=CORNER_LOGIT_BATCHES),
                       "ReflectiveHMC d=50"))
        groups.append(("Badly scaled truncated Gaussian, d=20", ill_cases(1000, 500),
                       "ReflectiveHMC"))
    groups.append(("Chains in one batch (d=50)", chain_cases(50, *((100, 100) if q else
                                                                    (500, 300))), "1 chain"))
    if not q:
        groups.append(("Other supports", other_cases(1000, 300), None))
    _run_groups(groups, q, args.out)


def _run_groups(groups, q, out):
    payload = {"environment": environment(), "quick": q, "repeats": REPEATS[0], "groups": []}
    for title, cases, base in groups:
        print(f"# {title}", file=sys.stderr)
        results = run_cases(cases)
        print(f"\n## {title}\n")
        print(format_table(results, base))
        payload["groups"].append({"title": title, "baseline": base,
                                  "results": [r.__dict__ for r in results]})
    if out:
        write_json(out, payload)  # NaN (a row without a metric) as null: strict JSON


if __name__ == "__main__":
    main()
