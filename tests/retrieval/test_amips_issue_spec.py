"""Issue #4 (retrieval.amips) read as an acceptance test: public names, the issue's
spellings and defaults, and the loss as the issue defines it."""

import inspect

import numpy as np
import pytest
import torch

import mlpapers.retrieval as retrieval
import mlpapers.retrieval.amips as amips
from mlpapers.datasets import make_mips_problem


@pytest.mark.parametrize("name", ["ExactMIPS", "AmortizedMIPS", "SupportNet", "KeyNet",
                                  "Homogenize", "match_rate", "recall_at_k",
                                  "mean_reciprocal_rank"])
def test_public_names_in_both_module_paths(name):
    """'Public API (`mlpapers.retrieval.amips`, re-exported from `mlpapers.retrieval`)'."""
    assert getattr(retrieval, name) is getattr(amips, name)


def test_signatures_and_defaults_of_the_issue():
    """`ExactMIPS(batch_size=...)` with `kneighbors(Q, n_neighbors, return_distance)`;
    `AmortizedMIPS(arch="keynet"|"supportnet")` with `fit(database, queries=...)` and
    `kneighbors(Q, k)`; 'soft-leaky-ReLU ... a = 0.1, beta = 20'; 'defaults 0.01 / 1';
    'params_fraction', 'depth 8 by default', `wx_inject`; 'copies with std 0.02'."""
    def params(f):
        return inspect.signature(f).parameters

    assert "batch_size" in params(amips.ExactMIPS)
    assert list(params(amips.ExactMIPS.kneighbors))[1:] == ["X", "n_neighbors",
                                                            "return_distance"]
    p = params(amips.AmortizedMIPS)
    assert p["arch"].default == "keynet" and p["depth"].default == 8
    assert p["score_weight"].default == 0.01 and p["target_weight"].default == 1.0
    assert p["negative_slope"].default == 0.1 and p["beta"].default == 20.0
    assert p["noise_std"].default == 0.02
    assert "params_fraction" in p and "wx_inject" in p
    assert "queries" in params(amips.AmortizedMIPS.fit)
    assert list(params(amips.AmortizedMIPS.kneighbors))[1:3] == ["X", "n_neighbors"]
    for cls in (amips.SupportNet, amips.KeyNet):
        q = params(cls)
        assert q["wx_inject"].default == 4
        assert q["negative_slope"].default == 0.1 and q["beta"].default == 20.0
    assert "resnet" in params(amips.KeyNet)
    keys, queries, sampler = make_mips_problem(30, 4, n_queries=5, random_state=0)
    assert isinstance(sampler, amips.GaussianMixtureQuerySampler)


def test_loss_is_the_issues_weighted_sum_and_checks_shapes():
    """'Loss: score_weight * MSE(score, sigma_K(x)) + target_weight * MSE(key, k*)'.
    Regression: a score of shape (b, 1) against labels of shape (b,) broadcast to (b, b)
    and gave a wrong loss without an error (the docstring also listed the arguments in
    another order than the signature); wrong shapes now raise a ValueError."""
    g = torch.Generator().manual_seed(3)
    b, d = 6, 3
    ps, ts = torch.randn(b, generator=g), torch.randn(b, generator=g)
    pk, tk = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    total, s_loss, k_loss = amips.amips_loss(ps, pk, ts, tk, score_weight=0.3,
                                             target_weight=2.0)
    torch.testing.assert_close(s_loss, ((ps - ts) ** 2).mean())
    torch.testing.assert_close(k_loss, ((pk - tk) ** 2).mean())
    torch.testing.assert_close(total, 0.3 * s_loss + 2.0 * k_loss)
    with pytest.raises(ValueError, match="pred_score and true_score"):
        amips.amips_loss(ps[:, None], pk, ts, tk)
    with pytest.raises(ValueError, match="pred_score and true_score"):
        amips.amips_loss(ps, ts, pk, tk)  # scores and keys swapped
    with pytest.raises(ValueError, match="pred_key and true_key"):
        amips.amips_loss(ps, pk, ts, tk[:-1])
    with pytest.raises(ValueError, match="pred_key and true_key"):
        amips.amips_loss(ps, pk[:, 0], ts, tk[:, 0])


@pytest.mark.parametrize("cls", [amips.SupportNet, amips.KeyNet])
def test_modules_check_wx_inject_as_the_estimator_does(cls):
    """'input re-injection every `wx_inject` layers' (True: every layer, 0/False: none).
    Regression: the modules took wx_inject=-1 as "every layer" (bool(-1)) and a float 3.0
    as 3, where AmortizedMIPS raises; they now raise the estimator's errors."""
    def injected(w):
        return [not isinstance(m, torch.nn.Identity) for m in cls(3, [8] * 5, wx_inject=w).stack.wx]

    assert injected(True) == injected(1) == [True] * 5
    assert injected(False) == injected(0) == [False] * 4 + [True]  # output layer always
    assert injected(2) == [False, True, False, True, True]
    with pytest.raises(ValueError, match="wx_inject must be >= 0"):
        cls(3, [8] * 5, wx_inject=-1)
    with pytest.raises(TypeError, match="wx_inject must be a bool or an int"):
        cls(3, [8] * 5, wx_inject=3.0)
    with pytest.raises(ValueError, match="wx_inject must be >= 0"):
        amips.solve_width(1000, 4, 4, 3, wx_inject=-2)


def test_a_sampler_of_the_wrong_arity_is_named_in_the_error():
    """'Training queries: a user array, or a sampler'. Regression: a one-argument sampler
    (``lambda n: ...``) failed in the first step with Python's "<lambda>() takes 1
    positional argument but 2 were given"; the error now gives the expected call, and a
    fitted estimator keeps its model."""
    keys, queries, sampler = make_mips_problem(40, 4, n_queries=8, random_state=0)
    est = amips.AmortizedMIPS(depth=2, hidden_dim=16, n_steps=3, batch_size=16,
                              random_state=0).fit(keys, queries=sampler)
    before = est.predict_key(queries)
    rng = torch.Generator().manual_seed(0)
    with pytest.raises(TypeError, match=r"sampler\(n, rng\)"):
        est.fit(keys, queries=lambda n: torch.randn(n, 4, generator=rng))
    assert torch.equal(torch.as_tensor(est.predict_key(queries)), torch.as_tensor(before))


def test_queries_passed_as_y_are_refused_not_ignored():
    """"Training queries: a user array, or a sampler": ``fit(keys, Q)`` put them in the
    ignored ``y`` and trained on sphere queries silently; a 1-D ``y`` stays ignored."""
    rng = np.random.default_rng(5)
    keys = rng.standard_normal((12, 3)).astype(np.float32)
    queries = rng.standard_normal((40, 3)).astype(np.float32)
    est = retrieval.AmortizedMIPS(depth=2, hidden_dim=8, n_steps=2, random_state=0)
    for y in (queries, torch.from_numpy(queries), lambda n, g: queries[:n]):
        with pytest.raises(TypeError, match="queries="):
            est.fit(keys, y)
    assert not hasattr(est, "model_")
    est.fit(keys, np.zeros(12))
    assert hasattr(est, "model_")
