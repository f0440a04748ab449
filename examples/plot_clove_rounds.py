"""
CLoVE vs IFCA vs FedAvg: cluster recovery round by round
=========================================================

Clustered federated learning assumes that the clients fall into groups with
different data distributions and trains one model per group.
:class:`mlpapers.federated.CLoVE <mlpapers.federated.clove.CLoVE>` finds the groups by
clustering the clients'
*loss vectors* (each client's loss under every current model) with k-means,
matching clusters to models with the Hungarian algorithm. IFCA instead lets
every client take its lowest-loss model, and FedAvg trains one global model.

Here 20 clients hold scikit-learn digits whose labels are permuted differently
in each of 4 clusters (concept shift). We plot the adjusted Rand index (ARI) of
the recovered clusters and the training loss per round, and report the mean
per-client test accuracy.
"""

import matplotlib.pyplot as plt

from mlpapers.datasets import make_federated_digits
from mlpapers.federated import IFCA, CLoVE, FedAvg

clients, truth = make_federated_digits("label_swap", n_clusters=4, n_clients_per_cluster=5,
                                       n_samples=100, random_state=0)
train = [(X[:80], y[:80]) for X, y in clients]
test = [(X[80:], y[80:]) for X, y in clients]
params = dict(model="logistic", n_rounds=12, local_epochs=5, lr=0.05, batch_size=40,
              random_state=0)
estimators = {
    "CLoVE": CLoVE(n_clusters=4, **params),
    "IFCA": IFCA(n_clusters=4, **params),
    "FedAvg": FedAvg(**params),
}
for name, est in estimators.items():
    est.fit(train, cluster_labels=truth)
    print(f"{name:6s} final ARI {est.history_[-1]['ari']:.2f}  "
          f"test accuracy {est.score(test):.3f}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
for name, est in estimators.items():
    rounds = [h["round"] for h in est.history_]
    ax1.plot(rounds, [h["ari"] for h in est.history_], marker="o", label=name)
    ax2.plot(rounds, [h["loss"] for h in est.history_], marker="o",
             label=f"{name} (test acc {est.score(test):.2f})")
ax1.set(xlabel="round", ylabel="ARI of client clusters", ylim=(-0.05, 1.05))
ax2.set(xlabel="round", ylabel="training loss of assigned model", yscale="log")
ax1.legend()
ax2.legend()
fig.tight_layout()
