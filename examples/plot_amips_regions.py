"""
Amortized MIPS in 2-D: learned argmax regions
=============================================

:class:`mlpapers.retrieval.AmortizedMIPS <mlpapers.retrieval.amips.AmortizedMIPS>` learns to map
a query :math:`x` to the key
:math:`k^*(x) = \\arg\\max_i \\langle x, k_i\\rangle`, which is the gradient of the
support function :math:`\\sigma_K(x) = \\max_i \\langle x, k_i \\rangle`. The exact
answer partitions the plane into cones, one for each key on the convex hull of the
keys (keys inside the hull never win). Here KeyNet and the homogenized
SupportNet learn these cones from queries on the unit circle.
"""

import matplotlib.pyplot as plt
import numpy as np
import torch

from mlpapers.retrieval import AmortizedMIPS, ExactMIPS

torch.set_num_threads(1)
rng = np.random.default_rng(0)
angles = np.sort(rng.uniform(0, 2 * np.pi, 12))
keys = (np.c_[np.cos(angles), np.sin(angles)] * rng.lognormal(0, 0.3, (12, 1))).astype(
    np.float32)

exact = ExactMIPS().fit(keys)
models = {
    arch: AmortizedMIPS(arch=arch, depth=3, hidden_dim=64, n_steps=400, batch_size=256,
                        lr=1e-2, random_state=0).fit(keys)
    for arch in ("keynet", "supportnet")
}

theta = np.linspace(0, 2 * np.pi, 2000, endpoint=False)
circle = np.c_[np.cos(theta), np.sin(theta)].astype(np.float32)
truth = exact.predict(circle)
for arch, model in models.items():
    ip = model.set_params(retrieval="ip").score(circle)
    l2 = model.set_params(retrieval="l2").score(circle)
    print(f"{arch}: match rate on the circle {ip:.3f} (ip rule), {l2:.3f} (l2 rule), "
          f"{model.n_params_} parameters")

# %%
# The first two panels colour each query direction by the index of the key it
# retrieves (outer ring: exact search, inner ring: KeyNet with either rule). Black
# dots are the keys; the ones inside the hull are never retrieved.
fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
cmap = plt.get_cmap("tab20")
for ax, rule in zip(axes[:2], ("ip", "l2")):
    pred = models["keynet"].set_params(retrieval=rule).predict(circle)
    ax.scatter(*(1.6 * circle.T), c=cmap(truth % 20), s=4)
    ax.scatter(*(1.3 * circle.T), c=cmap(pred % 20), s=4)
    ax.scatter(*keys.T, c="k", s=15)
    ax.set_title(f"KeyNet, {rule} rule: outer exact, inner learned", fontsize=9)
    ax.set_aspect("equal")
    ax.axis("off")
for arch, model in models.items():
    hist = model.history_
    axes[2].semilogy([h["step"] for h in hist], [h["key_loss"] for h in hist], label=arch)
axes[2].set_xlabel("step")
axes[2].set_ylabel("key MSE")
axes[2].legend()
fig.tight_layout()
