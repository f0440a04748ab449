"""The user guide's math (docs/user_guide/btsp.rst) checked against float64 references.

Each reference is written from the page's text alone on small random inputs of odd
sizes. Only formulas that no other test compares with an independent reference are
here: the BCD, the MSR identity, theta* and the schedules are covered in test_btsp.py.
"""
import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.decentralized.btsp import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    best_multiplier,
    biconnected_threshold,
    circulant_schedule,
    mixing_matrices,
    multiplier_relabel,
)


def _mixing_reference(n, schedule):
    """W_l = (I + sum_{s in S_l} P^s) / (|S_l| + 1); node j receives from j - s."""
    out = []
    for skips in schedule:
        skips = sorted({s % n for s in skips})
        W = np.eye(n)
        for s in skips:
            W[np.arange(n), (np.arange(n) - s) % n] += 1.0
        out.append(W / (len(skips) + 1))
    return np.array(out)


@pytest.mark.parametrize("n", [2, 5, 9, 12])
@pytest.mark.parametrize("topology", ["ring", "exponential", "one_peer_exponential",
                                      "sparse_exponential", [[1, 3], [1, 1 + 12]]])
def test_mixing_matrices_entries(n, topology):
    """Section "Choices ...", Simulator: W_t = (I + sum_{s in S_t} P^s)/(|S_t| + 1) with
    the convention of "The problem" (virtual i sends to i + s, j receives from j - s)
    and skips taken as a set modulo n (the schedule table)."""
    k_max = int(math.floor(math.log2(n - 1))) if n > 2 else 0
    table = {"ring": [[1]], "exponential": [[2 ** j for j in range(k_max + 1)]],
             "one_peer_exponential": [[2 ** j] for j in range(k_max + 1)],
             "sparse_exponential": [[1, 2 ** (k_max - 1) if k_max else 1]]}
    schedule = table[topology] if isinstance(topology, str) else topology
    np.testing.assert_allclose(mixing_matrices(n, topology), _mixing_reference(n, schedule),
                               rtol=0, atol=1e-15)


class _BiasOnly(nn.Module):
    """Logits that ignore the features: a node holding one class c has the exact local
    gradient softmax(b) - e_c whatever its minibatch."""

    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.tensor([0.3, -0.2, 0.1]))

    def forward(self, x):
        return x[:, :1] * 0 + self.b


@pytest.mark.parametrize("topology", ["one_peer_exponential", "exponential", [[1, 2], [3]]])
def test_dsgd_rounds_are_adapt_then_combine_in_physical_indices(topology):
    """Section "Choices ...", Simulator: each round is x <- W_t (x - eta m) with the local
    heavy-ball momentum m <- mu m + g + wd x, W_t the virtual mixing matrix of round
    t mod tau mapped to physical nodes through the assignment (physical pi(i) at
    virtual position i)."""
    n, T, lr, mom, wd = 7, 6, 0.3, 0.5, 0.1
    perm = np.random.default_rng(1).permutation(n)
    X = np.random.default_rng(2).normal(size=(7 * n, 4)).astype(np.float32)
    node = np.repeat(np.arange(n), 7)
    y = node % 3
    clf = DecentralizedSGD(model=_BiasOnly(), topology=topology, assignment=perm, lr=lr,
                           momentum=mom, weight_decay=wd, n_rounds=T, eval_every=T,
                           random_state=0).fit(X, y, nodes=node)
    W_virt = _mixing_reference(n, circulant_schedule(n, topology))
    W_phys = np.zeros_like(W_virt)
    for t, W in enumerate(W_virt):
        W_phys[t][np.ix_(perm, perm)] = W
    x = np.tile([0.3, -0.2, 0.1], (n, 1))
    v = np.zeros_like(x)
    onehot = np.eye(3)[np.arange(n) % 3]
    for t in range(T):
        p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
        v = mom * v + (p - onehot + wd * x)
        x = W_phys[t % len(W_phys)] @ (x - lr * v)
    np.testing.assert_allclose(clf.node_params_["b"].double().numpy(), x, atol=1e-6)


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("n, topology", [(12, "one_peer_exponential"), (12, [[2, 4], [3], [1]]),
                                         (15, [[3, 6], [5, 10], [7]])])
def test_lower_bound_definition(n, topology, directed):
    """Section "Choices ...", Lower bound: the mean over rounds of the largest
    nearest-neighbour delay (directed: the larger of the largest cheapest outgoing and
    incoming delays), raised to theta* (on max(D, D^T), or min(D, D^T) when directed)
    for rounds with a skip coprime with n."""
    D = np.random.default_rng(n).uniform(1, 10, (n, n))
    np.fill_diagonal(D, 0.0)
    est = BottleneckNodeAssigner(topology=topology, method="btsp", directed=directed,
                                 random_state=0).fit(D)
    theta = biconnected_threshold(np.minimum(D, D.T) if directed else np.maximum(D, D.T))
    assert est.theta_ == theta
    off = (D if directed else np.maximum(D, D.T)) + np.diag(np.full(n, np.inf))
    nearest = max(off.min(axis=1).max(), off.min(axis=0).max())
    per_round = [max(theta, nearest) if any(math.gcd(s, n) == 1 for s in r) else nearest
                 for r in circulant_schedule(n, topology)]
    assert est.lower_bound_ == pytest.approx(math.fsum(per_round) / len(per_round),
                                             rel=1e-15)


@pytest.mark.parametrize("n, topology", [(9, "exponential"), (12, "one_peer_exponential"),
                                         (13, "sparse_exponential")])
def test_msr_scores_every_coprime_multiplier(n, topology):
    """Section "The method", MSR step: all phi(n) multipliers c coprime with n are scored,
    pi*(i) = pi(c i mod n), and the best per-round mean BCD is kept (c = 1 included);
    the estimator's assignment_ is multiplier_relabel(ring_tour_, multiplier_)."""
    g = np.random.default_rng(n)
    D = g.uniform(1, 10, (n, n))
    D = np.maximum(D, D.T)
    np.fill_diagonal(D, 0.0)
    pi = g.permutation(n)
    schedule = circulant_schedule(n, topology)

    def bcd(assign):  # per-round mean of the round bottlenecks, from the definition
        rounds = [max(D[assign[i], assign[(i + s) % n]] for i in range(n) for s in skips)
                  for skips in schedule]
        return math.fsum(rounds) / len(rounds)

    scores = {c: bcd([pi[(c * i) % n] for i in range(n)])
              for c in range(1, n) if math.gcd(c, n) == 1}
    c, new, value = best_multiplier(D, pi, topology)
    assert value == pytest.approx(min(scores.values()), rel=1e-15)
    assert scores[c] == pytest.approx(min(scores.values()), rel=1e-15)
    assert new.tolist() == [pi[(c * i) % n] for i in range(n)]
    est = BottleneckNodeAssigner(topology=topology, random_state=0).fit(D)
    assert np.array_equal(est.assignment_, multiplier_relabel(est.ring_tour_, est.multiplier_))
    # and the estimator's multiplier is the best one for its own ring tour (MSR not skipped)
    c_tour, _, bcd_tour = best_multiplier(D, est.ring_tour_, topology)
    assert est.multiplier_ == c_tour and est.bcd_ == pytest.approx(bcd_tour, rel=1e-15)


def test_directed_lower_bound_takes_the_nearest_bound_when_it_exceeds_theta():
    """Section "Choices ...", Lower bound, directed: nodes cheap to reach but costly to
    leave make the nearest-outgoing bound exceed theta* on min(D, D^T); the bound is
    the larger of the two, and still below the exact optimum (brute force). Regression:
    coprime rounds used theta* alone."""
    n = 7
    g = np.random.default_rng(5)
    D = g.uniform(1, 2, (n, n))
    D[:3] += 20.0               # nodes 0-2 are costly to leave, cheap to reach
    np.fill_diagonal(D, 0.0)
    est = BottleneckNodeAssigner(topology="ring", method="exact", directed=True).fit(D)
    off = D + np.diag(np.full(n, np.inf))
    nearest = max(off.min(axis=1).max(), off.min(axis=0).max())
    assert nearest > est.theta_
    assert est.lower_bound_ == nearest
    rings = [max(D[p[i], p[(i + 1) % n]] for i in range(n))
             for p in ((0, *q) for q in itertools.permutations(range(1, n)))]
    assert est.lower_bound_ <= min(rings) == est.bcd_
