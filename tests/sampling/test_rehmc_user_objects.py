"""The user's own objects in reflective HMC: log densities, gradients, containers, regions.

Each callable is called as the user guide's "Your own log-density" section says (one
batched call over the chains, in the sampler's dtype, autograd on, a copy of the chains),
its answer is checked (a clear error naming it, never a broadcast), and nothing it does
to its argument reaches the chains.
"""

from __future__ import annotations

import pickle
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from mlpapers.sampling import (
    Ball,
    Box,
    ConvexContainer,
    ConvexSet,
    ReflectiveHMC,
    Region,
    StiefelSampler,
)

BOX = Box([-1.0, -1.0], [1.0, 1.0])
MU = 0.3


def gauss(x):  # module level: a sampler holding it pickles
    return -0.5 * ((x - MU) ** 2).sum(-1)


def gauss_grad(x):
    return -(x - MU)


def draws(log_prob, grad_log_prob=None, container=BOX, n=40, **kw):
    warmup = kw.pop("warmup", 0)
    kw = {"n_leapfrog": 3, "step_size": 0.3, "random_state": 0, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (short runs: the R-hat warning)
        res = ReflectiveHMC(log_prob, container, grad_log_prob=grad_log_prob, **kw).sample(
            n, n_chains=3, warmup=warmup, return_tensor=True)
    return res


# -- a callable that changes its argument in place must not move the chains ----------
def test_grad_log_prob_changing_its_input_in_place_leaves_the_chains_alone():
    def in_place(x):  # returns its input, overwritten by the gradient
        return x.sub_(MU).neg_()

    ref = draws(gauss, gauss_grad)
    np.testing.assert_array_equal(draws(gauss, in_place).samples, ref.samples)


def test_numpy_log_prob_changing_its_input_in_place_leaves_the_chains_alone():
    def numpy_log_prob(x):  # x.numpy() shares the chains' memory; a -= MU writes into it
        a = x.numpy()
        a -= MU
        return torch.from_numpy(-0.5 * (a * a).sum(-1))

    ref = draws(gauss, gauss_grad)
    np.testing.assert_array_equal(draws(numpy_log_prob, gauss_grad).samples, ref.samples)


def test_log_prob_changing_its_input_outside_autograd_leaves_the_chains_alone():
    w = torch.tensor([1.0, -2.0], dtype=torch.float64)

    def clamping(x):  # linear (autograd saves no input), then clamps x in place
        out = x @ w
        with torch.no_grad():
            x.clamp_(-0.1, 0.1)
        return out

    ref = draws(lambda x: x @ w)
    np.testing.assert_array_equal(draws(clamping).samples, ref.samples)


def test_an_in_place_change_before_use_is_differentiated():
    def shifted_in_place(x):  # was: "a leaf Variable that requires grad ..." at the start
        x.sub_(MU)
        return -0.5 * (x ** 2).sum(-1)

    ref = draws(gauss)
    np.testing.assert_array_equal(draws(shifted_in_place).samples, ref.samples)


def test_requires_grad_in_place_in_grad_log_prob_leaves_no_graph_on_the_states():
    def autograd_gradient(x):  # a common way to write it: x.requires_grad_() in place
        x = x.requires_grad_(True)
        return torch.autograd.grad(gauss(x).sum(), x)[0]

    res = draws(gauss, autograd_gradient)
    assert not res.samples_tensor.requires_grad  # was True: a graph of the whole run
    np.testing.assert_allclose(res.samples, draws(gauss, gauss_grad).samples, rtol=0,
                               atol=1e-12)


def test_region_and_convex_set_changing_their_input_leave_the_chains_alone():
    ring = Region(lambda x: x.norm(dim=-1) >= 0.2)
    ring_mut = Region(lambda x: x.mul_(3.0).norm(dim=-1) >= 0.6)
    ref = draws(gauss, support=ring, container=Ball([0.0, 0.0], 1.0))
    np.testing.assert_array_equal(
        draws(gauss, support=ring_mut, container=Ball([0.0, 0.0], 1.0)).samples, ref.samples)

    ball = ConvexSet(lambda x: (x * x).sum(-1) - 1.0, interior_point=[0.0, 0.0])
    ball_mut = ConvexSet(lambda x: (x.mul_(2.0) ** 2).sum(-1) / 4.0 - 1.0,
                         interior_point=[0.0, 0.0])
    np.testing.assert_allclose(draws(gauss, container=ball_mut, n=15).samples,
                               draws(gauss, container=ball, n=15).samples, rtol=0, atol=1e-12)


# -- what the callables return -----------------------------------------------------
def test_log_prob_returning_a_graph_with_grad_log_prob_is_detached():
    scale = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))

    def with_graph(x):  # switches autograd on itself (a model with parameters)
        with torch.enable_grad():
            return scale * gauss(x)

    res = draws(with_graph, gauss_grad)  # was a RuntimeError after the whole run
    np.testing.assert_array_equal(res.samples, draws(gauss, gauss_grad).samples)
    assert scale.grad is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_log_prob_of_another_dtype_is_cast_to_the_sampler_dtype(dtype):
    res = draws(lambda x: gauss(x).to(dtype), gauss_grad)
    assert res.samples.dtype == np.float64
    lp = res.sample_stats["lp"]
    assert lp.dtype == np.float64
    x = torch.from_numpy(res.samples)
    np.testing.assert_array_equal(lp, gauss(x).to(dtype).double().numpy())


@pytest.mark.parametrize("bad", [lambda x: gauss(x)[:, None], lambda x: gauss(x).sum(),
                                 lambda x: float(gauss(x).sum()),
                                 lambda x: gauss(x).detach().numpy()])
def test_log_prob_of_the_wrong_shape_or_type_names_log_prob_without_a_guess(bad):
    with pytest.raises(ValueError, match=r"log_prob must return a tensor of shape \(3,\)") as e:
        draws(bad)
    assert not getattr(e.value, "__notes__", None)


def test_non_finite_start_names_the_function():
    with pytest.raises(ValueError, match="log_prob .* not finite"):
        draws(lambda x: gauss(x) + torch.where(x[:, 0] > -2, torch.nan, 0.0))


@pytest.mark.parametrize("value", [-np.inf, np.nan])
@pytest.mark.parametrize("with_grad", [False, True])
def test_a_minus_inf_or_nan_set_inside_the_container_is_never_entered(value, with_grad):
    def cut(x):
        return torch.where(x[:, 0] > 0.5, value, gauss(x))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ReflectiveHMC(cut, BOX, grad_log_prob=gauss_grad if with_grad else None,
                            n_leapfrog=3, random_state=0).sample(150, x0=[0.0, 0.0],
                                                                 n_chains=3, warmup=50)
    assert (res.samples[..., 0] <= 0.5).all() and res.n_divergent.sum() > 0
    assert np.isfinite(res.sample_stats["lp"]).all()


# -- hints at the start ----------------------------------------------------------------
def test_numpy_log_prob_without_gradient_gets_the_numpy_hint():
    from scipy import stats

    def scipy_log_prob(x):
        return torch.as_tensor(stats.norm.logpdf(x.numpy()).sum(-1))

    with pytest.raises(RuntimeError, match="numpy") as e:
        draws(scipy_log_prob)
    note = " ".join(e.value.__notes__)
    assert "grad_log_prob" in note and "one point" not in note  # was the one-point guess
    draws(scipy_log_prob, lambda x: -x)  # the way out the note gives


def test_autograd_inside_log_prob_with_grad_log_prob_gets_a_hint_and_enable_grad_works():
    def score_penalised(x, switch=False):
        with torch.enable_grad() if switch else torch.no_grad():
            xr = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(gauss(xr).sum(), xr)
        return gauss(x) - 0.0 * (g * g).sum(-1)

    with pytest.raises(RuntimeError, match="does not require grad") as e:
        draws(lambda x: score_penalised(x), gauss_grad)
    assert "torch.enable_grad()" in " ".join(e.value.__notes__)
    res = draws(lambda x: score_penalised(x, switch=True), gauss_grad)
    np.testing.assert_array_equal(res.samples, draws(gauss, gauss_grad).samples)


def test_in_place_change_after_use_gets_the_in_place_hint():
    def late_in_place(x):
        out = -0.5 * (x ** 2).sum(-1)  # autograd saved x
        x.mul_(0.5)
        return out

    with pytest.raises(RuntimeError, match="inplace") as e:
        draws(late_in_place)
    note = " ".join(e.value.__notes__)
    assert "in place" in note and "one point" not in note


# -- how the callables are called (the user guide's contract) -------------------------
def test_log_prob_is_called_as_documented():
    seen, n_leapfrog, n_transitions = [], 4, 10

    def spy(x):
        seen.append((tuple(x.shape), x.dtype, torch.is_grad_enabled(), x.requires_grad))
        return gauss(x)

    with torch.no_grad():  # the caller's grad mode plays no role
        draws(spy, n=n_transitions, n_leapfrog=n_leapfrog, jitter=False)
    # the start, then one batched call per leapfrog step
    assert len(seen) == 1 + n_transitions * n_leapfrog
    assert set(seen) == {((3, 2), torch.float64, True, True)}


def test_with_grad_log_prob_log_prob_runs_without_autograd_once_per_transition():
    seen_lp, seen_glp, n_leapfrog, n_transitions = [], [], 4, 10

    def lp(x):
        seen_lp.append((tuple(x.shape), torch.is_grad_enabled(), x.requires_grad))
        return gauss(x)

    def glp(x):
        seen_glp.append((tuple(x.shape), x.dtype, torch.is_grad_enabled()))
        return gauss_grad(x)

    with torch.inference_mode():
        draws(lp, glp, n=n_transitions, n_leapfrog=n_leapfrog, jitter=False,
              dtype=torch.float32)
    assert len(seen_lp) == 1 + n_transitions and set(seen_lp) == {((3, 2), False, False)}
    assert len(seen_glp) == 1 + n_transitions * n_leapfrog
    assert set(seen_glp) == {((3, 2), torch.float32, True)}


def test_log_prob_using_torch_func_inside_works_in_both_modes():
    def with_func(x):
        g = torch.func.vmap(torch.func.grad(lambda z: gauss(z[None])[0]))(x)
        return gauss(x) - 0.0 * (g * g).sum(-1)

    np.testing.assert_array_equal(draws(with_func, n=8).samples, draws(gauss, n=8).samples)
    np.testing.assert_array_equal(draws(with_func, gauss_grad, n=8).samples,
                                  draws(gauss, gauss_grad, n=8).samples)


# -- a torch module as the log density ------------------------------------------------
class NeuralDensity(torch.nn.Module):
    """A Gaussian plus a small network with dropout or batch norm, built in train mode."""

    def __init__(self, layer, d=2):
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(d, 8).double()
        self.mid = layer.double()
        self.out = torch.nn.Linear(8, 1).double()

    def forward(self, x):
        if getattr(self, "fail", False):
            raise RuntimeError("boom")
        x = x.reshape(x.shape[0], -1)
        return gauss(x) + 0.1 * self.out(torch.tanh(self.mid(self.inner(x)))).squeeze(-1)


@pytest.mark.parametrize("layer", [lambda: torch.nn.Dropout(0.5),
                                   lambda: torch.nn.BatchNorm1d(8)],
                         ids=["dropout", "batchnorm"])
def test_a_module_log_prob_runs_in_eval_mode_and_is_left_as_given(layer):
    net = NeuralDensity(layer())
    net.out.eval()  # a submodule the user set apart keeps its own mode
    state = {k: v.clone() for k, v in net.state_dict().items()}
    frozen = NeuralDensity(layer()).eval()
    frozen.load_state_dict(state)
    rng = torch.random.get_rng_state()
    ours = draws(net, n=15)
    # was: a fresh dropout mask at every call (a random density, the global generator
    # advanced), or each chain normalised by the others and the running stats rewritten
    np.testing.assert_array_equal(ours.samples, draws(frozen, n=15).samples)
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())
    assert net.training and net.mid.training and not net.out.training
    assert all(p.grad is None and p.requires_grad for p in net.parameters())
    net.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        draws(net)
    assert net.training and net.mid.training and not net.out.training


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (catch_warnings is per process)
def test_samplers_sharing_a_module_in_threads_restore_its_mode_at_the_end():
    from concurrent.futures import ThreadPoolExecutor

    net = NeuralDensity(torch.nn.Dropout(0.5))
    frozen = NeuralDensity(torch.nn.Dropout(0.5)).eval()
    frozen.load_state_dict(net.state_dict())
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda seed: draws(net, n=10, random_state=seed), range(3)))
    for seed, res in enumerate(runs):
        np.testing.assert_array_equal(res.samples,
                                      draws(frozen, n=10, random_state=seed).samples)
    assert net.training and net.mid.training


class GradNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return gauss_grad(x) + 0.0 * self.drop(x)

    def log_prob(self, x):
        return gauss(x) + 0.0 * self.drop(x).sum(-1)


class WithGrad(torch.nn.Module):
    """A density module whose gradient is a submodule (nested modules)."""

    def __init__(self):
        super().__init__()
        self.grad = GradNet()

    def forward(self, x):
        return gauss(x)


@pytest.mark.parametrize("order", ["outer_first", "inner_first"])
def test_nested_modules_get_their_own_modes_back(order):
    # log_prob=net and grad_log_prob=net.grad (a submodule): the flags were saved per
    # top-level module and restored in entry order, so net.grad was left in eval mode
    net = WithGrad()
    if order == "outer_first":
        draws(net, grad_log_prob=net.grad)
    else:
        draws(lambda x: net(x), grad_log_prob=net.grad)
        draws(net.grad.log_prob, grad_log_prob=net.grad)  # a bound method's module
    assert all(m.training for m in net.modules())


def test_a_bound_method_of_a_module_runs_in_eval_mode():
    net = NeuralDensity(torch.nn.Dropout(0.5))
    frozen = NeuralDensity(torch.nn.Dropout(0.5)).eval()
    frozen.load_state_dict(net.state_dict())
    np.testing.assert_array_equal(draws(net.forward).samples, draws(frozen).samples)
    assert all(m.training for m in net.modules())


def test_a_submodule_shared_by_two_samplers_in_threads_is_restored_after_both():
    shared = torch.nn.Dropout(0.5)
    a, b = NeuralDensity(shared), NeuralDensity(shared)
    gate = threading.Barrier(2)

    def run(net):
        gate.wait()
        return [draws(net, n=5).samples for _ in range(3)]

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(run, [a, b]))
    # dropout stayed off in each thread while the other one left (the draws are those
    # of a sequential run), and the shared layer is back in train mode after both
    reference = draws(NeuralDensity(torch.nn.Dropout(0.5)).eval(), n=5).samples
    for samples in runs:
        for s in samples:
            np.testing.assert_array_equal(s, reference)
    assert shared.training and a.training and b.training


def test_a_module_log_density_of_stiefel_runs_in_eval_mode():
    net = NeuralDensity(torch.nn.Dropout(0.5), d=6)
    frozen = NeuralDensity(torch.nn.Dropout(0.5), d=6).eval()
    frozen.load_state_dict(net.state_dict())

    def run(g):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return StiefelSampler(g, 3, 2, n_leapfrog=3, random_state=0).sample(
                8, n_chains=2, warmup=8).Q

    np.testing.assert_array_equal(run(net), run(frozen))
    assert net.training


# -- the user's own containers and regions --------------------------------------------
class DelegatingBall(ConvexContainer):
    """A user's container: a Ball's oracles, optionally spoiled."""

    def __init__(self, bad=None):
        self._ball, self.dim, self.bad = Ball([0.0, 0.0, 0.0], 1.0), 3, bad
        if bad == "dim":
            self.dim = 3.0

    def contains(self, x, tol=0.0):
        out = self._ball.contains(x, tol)
        return {"contains_column": out[:, None], "contains_float": out.double()}.get(
            self.bad, out)

    def hit(self, x, v, t_max=None, exclude=None):
        h = self._ball.hit(x, v, t_max, exclude)
        (t, n), face = h, h.face
        if self.bad == "four_values":
            return t, n, face, face
        return ({"t_column": t[:, None], "t_numpy": t.numpy()}.get(self.bad, t),
                n[:, :1] if self.bad == "normal_column" else n, face)

    def interior_point(self):
        return np.zeros(2) if self.bad == "interior_point" else np.zeros(3)

    def width(self):  # (it caps the step size)
        return self._ball.width()


def test_a_valid_user_container_gives_the_draws_of_the_built_in_one():
    kw = {"n_leapfrog": "auto", "step_size": "auto", "warmup": 30}
    ours = draws(gauss, container=DelegatingBall(), **kw)
    ref = draws(gauss, container=Ball([0.0, 0.0, 0.0], 1.0), **kw)
    np.testing.assert_array_equal(ours.samples, ref.samples)


@pytest.mark.parametrize("bad", ["contains_column", "contains_float", "t_column", "t_numpy",
                                 "normal_column", "four_values", "interior_point", "dim"])
def test_a_user_container_with_wrong_answers_is_rejected_before_sampling(bad):
    # was a torch broadcast error deep in a transition, or (normal_column) silently
    # wrong reflections
    with pytest.raises((ValueError, TypeError), match=r"container \(DelegatingBall\)"):
        draws(gauss, container=DelegatingBall(bad))
    # a support is only asked whether it contains points: only contains is checked
    ball = Ball([0.0, 0.0, 0.0], 1.0)
    if bad in ("contains_column", "contains_float"):
        with pytest.raises(ValueError, match=r"support \(DelegatingBall\).contains"):
            draws(gauss, container=ball, support=DelegatingBall(bad))
    else:  # its other oracles are never called
        np.testing.assert_array_equal(
            draws(gauss, container=ball, support=DelegatingBall(bad)).samples,
            draws(gauss, container=ball, support=DelegatingBall()).samples)


def test_a_support_needs_only_contains():
    # a support class with dim and contains only (no interior_point, no hit), as before
    class HalfSpace(ConvexContainer):
        dim = 3

        def contains(self, x, tol=0.0):
            return x[:, 0] >= 0

    res = draws(gauss, container=Ball([0.0, 0.0, 0.0], 1.0), support=HalfSpace())
    assert (res.samples[..., 0] >= 0).all()


def test_an_interior_point_of_shape_one_by_d_is_accepted():
    class RowPoint(DelegatingBall):
        def interior_point(self):
            return np.zeros((1, 3))

    np.testing.assert_array_equal(draws(gauss, container=RowPoint()).samples,
                                  draws(gauss, container=DelegatingBall()).samples)


def test_convex_set_functions_of_the_wrong_batch_shape_are_rejected():
    def column_g(x):  # right for the one point of the constructor, a column for chains
        out = (x * x).sum(-1) - 1.0
        return out if x.shape[0] == 1 else out[:, None]

    with pytest.raises(ValueError, match=r"g must map \(C, d\) to \(C,\)"):
        draws(gauss, container=ConvexSet(column_g, interior_point=[0.0, 0.0]))
    one_row = ConvexSet(lambda x: (x * x).sum(-1) - 1.0, lambda x: 2.0 * x[0],
                        interior_point=[0.0, 0.0])
    with pytest.raises(ValueError, match=r"grad_g must map \(C, d\) to \(C, d\)"):
        draws(gauss, container=one_row)


def test_region_returning_scores_is_rejected_and_zero_one_numbers_accepted():
    ball = Ball([0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="Region.contains must return booleans"):
        draws(gauss, container=ball, support=Region(lambda x: x.norm(dim=-1)))
    as_float = draws(gauss, container=ball, support=Region(lambda x: (x[:, 0] > 0).double()))
    as_bool = draws(gauss, container=ball, support=Region(lambda x: x[:, 0] > 0))
    np.testing.assert_array_equal(as_float.samples, as_bool.samples)
    assert (as_bool.samples[..., 0] > 0).all()


# -- StiefelSampler's log_density ------------------------------------------------------
def test_stiefel_log_density_errors_name_log_density_without_a_log_prob_guess():
    def run(g):
        return StiefelSampler(g, 3, 2, n_leapfrog=3, random_state=0).sample(
            5, n_chains=2, warmup=5)

    with pytest.raises(ValueError, match=r"log_density must map a \(2, 3, 2\)") as e:
        run(lambda Q: Q.sum())  # a scalar
    assert not getattr(e.value, "__notes__", None)  # was a note about log_prob on (2, 6)
    with pytest.raises(ValueError, match="log_density .* not finite"):
        run(lambda Q: Q.sum((-2, -1)) * torch.nan)


def test_stiefel_log_density_changing_its_input_leaves_the_chains_alone():
    F = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)

    def run(g):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a short run: the R-hat warning)
            return StiefelSampler(g, 3, 2, n_leapfrog=3, random_state=0).sample(
                10, n_chains=2, warmup=10).Q

    def in_place(Q):
        out = (F * Q.clone()).sum((-2, -1))
        Q.mul_(2.0)
        return out

    np.testing.assert_array_equal(run(in_place), run(lambda Q: (F * Q).sum((-2, -1))))


# -- persistence ---------------------------------------------------------------------
def test_a_sampler_pickles_with_module_level_functions_and_a_lambda_says_why_not():
    hmc = ReflectiveHMC(gauss, BOX, grad_log_prob=gauss_grad, n_leapfrog=3, random_state=0)
    copy = pickle.loads(pickle.dumps(hmc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = (h.sample(10, n_chains=2, warmup=0) for h in (hmc, copy))
    np.testing.assert_array_equal(a.samples, b.samples)
    with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):
        pickle.dumps(ReflectiveHMC(lambda x: gauss(x), BOX))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(a)).samples, a.samples)
