"""
BTSP-MSR: placing a one-peer exponential graph on a physical network
=====================================================================

A decentralized-learning round waits for its slowest link. On a backbone network
of 48 nodes we place the virtual positions of the one-peer exponential graph with a
random assignment and with BTSP-MSR, draw the links used in the round with the
largest skip, and compare the bottleneck communication delay (BCD) per round.
"""

import matplotlib.pyplot as plt
import numpy as np

from mlpapers.decentralized.btsp import BottleneckNodeAssigner, make_delay_matrix

D, pos, links = make_delay_matrix(48, "backbone", random_state=0, return_positions=True)
topology = "one_peer_exponential"
btsp = BottleneckNodeAssigner(topology=topology, random_state=0).fit(D)
rand = BottleneckNodeAssigner(topology=topology, method="random", random_state=0).fit(D)
print(f"lower bound {btsp.lower_bound_:.1f} ms, theta* {btsp.theta_:.1f} ms")
for name, est in [("random", rand), ("BTSP-MSR", btsp)]:
    print(f"{name:>9}: BCD {est.bcd_:6.1f} ms/round, per round "
          f"{np.round(est.bcd_per_round_, 1).tolist()}")

fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharex=True, sharey=True)
for ax, (name, est) in zip(axes, [("random", rand), ("BTSP-MSR", btsp)]):
    for u, v in links:
        ax.plot(*pos[[u, v]].T, color="0.85", lw=0.8, zorder=0)
    last = est.edges_[est.edges_[:, 0] == len(est.schedule_) - 1]
    worst = int(est.bcd_per_round_.argmax())
    for _, u, v in last:
        ax.plot(*pos[[u, v]].T, color="tab:blue", lw=0.8, alpha=0.6)
    tour = est.assignment_
    ax.plot(*pos[np.r_[tour, tour[:1]]].T, color="tab:orange", lw=1.2, alpha=0.8)
    ax.scatter(*pos.T, s=12, color="k", zorder=3)
    ax.set_title(f"{name}: {est.bcd_:.1f} ms/round (slowest round {worst})")
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
axes[0].plot([], [], color="tab:orange", label="virtual ring (skip 1)")
axes[0].plot([], [], color="tab:blue", label=f"skip {btsp.schedule_[-1][0]} links")
axes[0].legend(loc="lower left", fontsize=8)
fig.tight_layout()
