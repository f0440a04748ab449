"""
Reflective HMC: billiard trajectories, a truncated Gaussian and thinning
=========================================================================

:class:`mlpapers.sampling.ReflectiveHMC` samples a density restricted to a bounded
set by letting Hamiltonian trajectories bounce off the boundary of a convex
container. Left: one billiard drift in a triangle, with its reflections. Middle: draws
of a Gaussian truncated to the triangle, with its mass in a corner. Right: a
non-convex annulus sampled by running the chain on the enclosing disc and keeping
the draws that fall in the annulus (container plus thinning).
"""

import matplotlib.pyplot as plt
import numpy as np
import torch

from mlpapers.sampling import Ball, Polytope, ReflectiveHMC, Region

# The triangle {x >= 0, y >= 0, x + y <= 1} as a polytope A x <= b.
tri = Polytope([[-1.0, 0.0], [0.0, -1.0], [1.0, 1.0]], [0.0, 0.0, 1.0])
mu = torch.tensor([0.9, 0.6], dtype=torch.float64)


def log_prob(x):
    return -0.5 * ((x - mu) ** 2).sum(-1) / 0.3**2


# %%
# The billiard drift, the position update inside each leapfrog step: the particle
# flies straight until the container's ``hit`` oracle reports the first face, where
# its velocity is mirrored in the face's normal, :math:`v - 2 (v^\top n) n`. Here
# one drift of duration 3 from (0.2, 0.2), with the face just hit excluded from the
# next search (``exclude``), as the sampler does against round-off.
x = torch.tensor([[0.2, 0.2]], dtype=torch.float64)
v = torch.tensor([[2.0, 0.7]], dtype=torch.float64)
face = torch.tensor([-1])
path, remaining = [x[0].numpy().copy()], 3.0
while remaining > 0:
    hit = tri.hit(x, v, exclude=face)
    t = min(float(hit.t[0]), remaining)
    x = x + t * v
    path.append(x[0].numpy().copy())
    if t < remaining:  # reflect
        v = v - 2 * (v * hit.normal).sum(-1, keepdim=True) * hit.normal
        face = hit.face
    remaining -= t
path = np.array(path)
print("bounces in one drift:", len(path) - 2)

# %%
# Sampling: four chains advance together; the step size is tuned in warm-up.
res = ReflectiveHMC(log_prob, tri, n_leapfrog=6, random_state=0).sample(500, warmup=200)
print("acceptance", res.accept_rate.round(2), "R-hat", res.rhat().round(3),
      "reflections/step", round(res.reflections_per_step, 2))

annulus = Region(lambda x: x.norm(dim=-1) >= 1.0)
res_ann = ReflectiveHMC(lambda x: -0.5 * (x**2).sum(-1), Ball([0.0, 0.0], 2.0),
                        support=annulus, n_leapfrog=6, random_state=0).sample(500, warmup=200)
print("kept fraction on the annulus", res_ann.kept_fraction.round(2))

fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
corners = np.array([[0, 0], [1, 0], [0, 1], [0, 0]])
for ax in axes[:2]:
    ax.plot(corners[:, 0], corners[:, 1], "k-", lw=1)
    ax.set_aspect("equal")
axes[0].plot(path[:, 0], path[:, 1], ".-", ms=3, lw=0.8)
axes[0].set_title("a billiard drift (free flight)")
s = res.samples.reshape(-1, 2)
axes[1].plot(s[:, 0], s[:, 1], ".", ms=1, alpha=0.4)
axes[1].set_title("truncated Gaussian draws")
a = res_ann.samples.reshape(-1, 2)
axes[2].plot(a[:, 0], a[:, 1], ".", ms=1, alpha=0.4)
t = np.linspace(0, 2 * np.pi, 200)
for r in (1, 2):
    axes[2].plot(r * np.cos(t), r * np.sin(t), "k-", lw=1)
axes[2].set_aspect("equal")
axes[2].set_title("thinned annulus (container: disc)")
fig.tight_layout()
