"""RBE: checks from the paper note of the neural head's training.

The note's neural RBE (section 2, "Neural RBE") trains with Adam at lr 5e-4 on batches
of 128 items sampled with replacement, keeps the best checkpoint by validation (step 0,
i.e. linear RBE, included) and feeds the item's mean training relevance as popularity;
its section 5.7 check is that the training loss decreases on a nonlinear relevance.
Each test compares against an exact reference: a frozen (lr ~ 0) run on the same item
samples, the untrained head and its independently computed hit rate, numpy's
standardisation, ``torch.randint`` on the same generator and a hand-made
``torch.optim.Adam`` step.
"""

import copy
import inspect

import numpy as np
import pytest
import torch

from mlpapers.datasets._relevance import make_relevance_problem
from mlpapers.retrieval.rbe import (
    RelevanceBasedRetriever,
    fit_linear_embeddings,
    hit_rate,
    softmax_signed_loss,
)
from mlpapers.retrieval.rbe import _estimator as rbe_estimator
from mlpapers.retrieval.rbe._heads import build_head, train_head


def _head_setup(n_items=50, rank=6, n_fit=40, n_val=0, hidden=8, seed=0):
    """A built (untrained) head on a rank-``rank`` relevance with 4 supports, and the
    training/validation inputs ``train_head`` takes."""
    rng = np.random.default_rng(seed)
    R = torch.as_tensor(rng.standard_normal((n_fit + n_val, rank))
                        @ rng.standard_normal((rank, n_items)))
    R_fit, R_val = R[:n_fit], R[n_fit:]
    S = [1, 3, 5, 7]
    lin = fit_linear_embeddings(R_fit[:, S], R_fit)

    def u(Rs):
        return ((Rs[:, S] - lin["mean"]) / lin["scale"]).float()

    head = build_head(lin["embeddings"], lin["offsets"], R_fit.mean(dim=0), u(R_fit), hidden,
                      seed=seed, device=torch.device("cpu"))
    return head, u(R_fit), R_fit.float(), u(R_val), R_val


def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- 1. the training loss decreases (note section 5.7) ---------------------------------

def test_training_loss_drops_well_below_an_untrained_run_on_nonlinear_relevance():
    """Section 5.7: on a nonlinear relevance the Adam steps lower the loss; compared with
    a run at lr 1e-12 (same seed, so the same item batches step by step), not only with
    its own first steps (sampling noise alone lowered that mean without any step)."""
    Q, I, f = make_relevance_problem(200, 150, nonlinearity=0.5, random_state=0)
    R = f(Q, I)

    def losses(lr):
        est = RelevanceBasedRetriever(f, n_support=8, head="mlp", mlp_hidden=32, max_iter=150,
                                      lr=lr, validation_fraction=0.0, random_state=0)
        est.fit(Q, I, relevance_matrix=R)
        return np.array([h["loss"] for h in est.history_])

    trained, frozen = losses(3e-3), losses(1e-12)
    assert len(trained) == len(frozen) == 150
    assert trained[-30:].mean() < 0.5 * frozen[-30:].mean()  # measured 0.0011 vs 0.0061
    assert trained[-30:].mean() < 0.5 * trained[:30].mean()  # 0.0011 vs 0.0052
    # the frozen run really is the untrained head: its loss does not trend down
    assert frozen[-30:].mean() > 0.9 * frozen[:30].mean()


# -- 2. step 0 (linear RBE) is a checkpoint candidate -----------------------------------

def test_destructive_training_keeps_the_step_zero_head_and_its_hit_rate():
    """Best-checkpoint selection starts from step 0, the untrained (= linear RBE) head:
    with a destructive lr=1.0 every later checkpoint validates worse, so train_head must
    return the initial head unchanged and report the step-0 validation hit rate."""
    head, U, T, U_val, R_val = _head_setup(n_val=20)
    initial = copy.deepcopy(head.state_dict())
    m = 5  # clip(round((1 - 0.9) * 50), 1, 100)
    with torch.no_grad():
        step0 = hit_rate(R_val, torch.topk(head(U_val), m, dim=1).indices, m)
    history, best = train_head(head, U, T, U_val, R_val, top_quantile=0.9, lr=1.0,
                               max_iter=20, eval_every=5, item_batch=16,
                               generator=torch.Generator().manual_seed(0))
    later = [h["val_hit_rate"] for h in history if "val_hit_rate" in h]
    assert len(later) == 4 and max(later) < step0  # the lr really was destructive
    assert best == step0
    assert _same_state(head.state_dict(), initial)


def test_estimator_never_validates_worse_than_linear_rbe():
    """Estimator level: on an exactly rank-3 relevance linear RBE (step 0) validates at
    hit rate 1.0; with lr=1.0 every trained checkpoint is worse, so the fitted head must be
    the step-0 one: best_validation_hit_rate_ is 1.0 and its scores are linear RBE's
    (here the heavy scores themselves)."""
    rng = np.random.default_rng(1)
    Q, I = rng.standard_normal((100, 3)), rng.standard_normal((60, 3))

    def f(q, i):
        return np.asarray(q) @ np.asarray(i).T

    est = RelevanceBasedRetriever(f, n_support=3, head="mlp", mlp_hidden=16, lr=1.0,
                                  max_iter=20, eval_every=5, validation_fraction=0.3,
                                  top_quantile=0.9, random_state=0)
    est.fit(Q[:80], I, relevance_matrix=f(Q[:80], I))
    later = [h["val_hit_rate"] for h in est.history_ if "val_hit_rate" in h]
    assert len(later) == 4 and max(later) < 1.0  # destructive training
    assert est.best_validation_hit_rate_ == 1.0
    np.testing.assert_allclose(est.predict(Q[80:]), f(Q[80:], I), rtol=0, atol=1e-4)


# -- 3. popularity = mean training relevance, standardised over items ----------------

def test_popularity_is_the_standardised_mean_training_relevance():
    """pop_i is the item's mean training relevance R.mean(0), standardised over the items
    with the population standard deviation (ddof=0), as the head's docstring says."""
    Q, I, f = make_relevance_problem(60, 40, random_state=3)
    R = f(Q, I)
    est = RelevanceBasedRetriever(f, n_support=5, head="mlp", mlp_hidden=4, max_iter=2,
                                  validation_fraction=0.0, random_state=0)
    est.fit(Q, I, relevance_matrix=R)
    m = R.mean(axis=0)
    expected = (m - m.mean()) / m.std(ddof=0)
    got = est.head_.popularity.double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# -- 4. item batches sampled with replacement -------------------------------------------

def test_item_batches_are_sampled_with_replacement():
    """Each step draws item_batch item indices uniformly with replacement
    (torch.randint on the given generator): 32 columns out of 10 items, with repeats."""
    head, U, T, U_val, R_val = _head_setup(n_items=10, rank=3)
    seen, forward = [], head.forward
    head.forward = lambda u, items=None: seen.append(items.clone()) or forward(u, items)
    train_head(head, U, T, U_val, R_val, item_batch=32, max_iter=3,
               generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    assert len(seen) == 3
    for cols in seen:
        assert cols.shape == (32,)
        assert torch.equal(cols, torch.randint(10, (32,), generator=g))


# -- 5. Adam, lr 5e-4 and the head's other defaults --------------------------------------

def test_head_training_defaults_are_the_notes():
    """Note: Adam lr 5e-4, 128 items per step, positives at the 0.99 quantile,
    softmax_signed loss, towers of width 100; the estimator and train_head agree."""
    est = inspect.signature(RelevanceBasedRetriever).parameters
    fn = inspect.signature(train_head).parameters
    expected = dict(lr=5e-4, top_quantile=0.99, item_batch=128, loss="softmax_signed")
    assert {k: est[k].default for k in expected} == expected
    assert {k: fn[k].default for k in expected} == expected
    assert est["mlp_hidden"].default == 100


def test_default_estimator_trains_its_head_with_the_notes_settings(monkeypatch):
    """A default head="mlp" fit passes those defaults on to train_head and builds a head of
    width 100."""
    calls = []

    def spy(head, *args, **kwargs):
        calls.append((head.hidden, kwargs))
        return train_head(head, *args, **kwargs)

    monkeypatch.setattr(rbe_estimator, "train_head", spy)
    Q, I, f = make_relevance_problem(30, 20, random_state=0)
    RelevanceBasedRetriever(f, n_support=4, head="mlp", max_iter=1,
                            random_state=0).fit(Q, I, relevance_matrix=f(Q, I))
    (hidden, kwargs), = calls
    assert hidden == 100
    assert {k: kwargs[k] for k in ("lr", "top_quantile", "item_batch", "loss")} == dict(
        lr=5e-4, top_quantile=0.99, item_batch=128, loss="softmax_signed")


def test_one_training_step_is_one_adam_step_at_lr_5e_4():
    """One train_head step with its defaults equals torch.optim.Adam(lr=5e-4) stepped by
    hand on the softmax_signed loss (quantile 0.99) of the same 128 sampled items; an
    SGD step (or another lr) gives different parameters."""
    head, U, T, U_val, R_val = _head_setup()  # no validation queries: the last step is kept
    ref = copy.deepcopy(head)
    train_head(head, U, T, U_val, R_val, max_iter=1, generator=torch.Generator().manual_seed(3))
    cols = torch.randint(T.shape[1], (128,), generator=torch.Generator().manual_seed(3))
    opt = torch.optim.Adam(ref.parameters(), lr=5e-4)
    opt.zero_grad()
    softmax_signed_loss(ref(U, cols), T[:, cols], 0.99).backward()
    opt.step()
    got, want = head.state_dict(), ref.state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-7, msg=k)
    # the step moved the bilinear weights by about lr each (Adam's first step)
    moved = (got["W"] - torch.eye(4)).abs()
    assert moved.max() == pytest.approx(5e-4, rel=1e-3)
