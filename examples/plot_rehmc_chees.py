"""
Reflective HMC: an adaptive trajectory length with ChEES
========================================================

With a fixed number of leapfrog steps, the integration time of
:class:`mlpapers.sampling.ReflectiveHMC` is set by the step size, which the
narrowest direction of the target limits. On a badly scaled target the wide
directions then move by a random walk. ``n_leapfrog="auto"`` (the default) adapts the
trajectory length during warm-up with ChEES (Hoffman, Radul and Sountsov, 2021)
and freezes it for sampling; ``T`` starts at one step and climbs, so give the
warm-up a few hundred iterations. The target here is a Gaussian with standard
deviations 0.05 and 1, truncated to the square ``[-2, 2]^2``. Left: traces of the
wide coordinate. Right: its autocorrelation, with the bulk ESS of each run.
"""

import matplotlib.pyplot as plt
import numpy as np
import torch

from mlpapers.sampling import Box, ReflectiveHMC

sd = torch.tensor([0.05, 1.0], dtype=torch.float64)


def log_prob(x):
    return -0.5 * ((x / sd) ** 2).sum(-1)


box = Box([-2.0, -2.0], [2.0, 2.0])
runs = {}
for n_leapfrog in (10, "auto"):
    hmc = ReflectiveHMC(log_prob, box, n_leapfrog=n_leapfrog, random_state=0)
    runs[n_leapfrog] = hmc.sample(400, x0=[0.0, 0.0], n_chains=8, warmup=300)


def autocorr(x, max_lag=40):
    x = x - x.mean()
    return np.array([1.0] + [np.corrcoef(x[:-k], x[k:])[0, 1] for k in range(1, max_lag)])


fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
for key, res in runs.items():
    label = (f"n_leapfrog={key}" if key != "auto" else
             f"auto: T={res.trajectory_length:.2f}, {res.mean_leapfrog:.1f} steps")
    ax1.plot(res.samples[0, :200, 1], lw=1, label=label)
    acf = np.mean([autocorr(res.samples[c, :, 1]) for c in range(res.samples.shape[0])], 0)
    ax2.plot(acf, marker=".", label=f"{label}\nbulk ESS {res.ess()[1]:.0f} of 3200")
ax1.set(xlabel="draw", ylabel="x[1] (sd 1)", title="trace, chain 0")
ax2.axhline(0, color="k", lw=0.5)
ax2.set(xlabel="lag", ylabel="autocorrelation", title="wide coordinate")
ax1.legend(fontsize=8)
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()
