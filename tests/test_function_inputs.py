"""Every public function refuses a NaN in a floating array argument, naming it.

The call of each public function (the ``__all__`` of every public module) is taken from
its docstring example: the example runs with the function wrapped to record the
arguments of its first call. The call is then repeated with one floating array
argument at a time holding a NaN; it must raise ``ValueError`` naming that argument.
Functions are discovered, so a new one is checked without editing this file.

The exceptions (a function, or ``function.argument``) are listed in ``PROPAGATES``
with their reason: elementwise math, losses
and the per-step updates of a training loop, where NaN in gives NaN out as in torch
(a diverging run sees its NaN instead of an error from deep inside the step), and the
MCMC diagnostics, where NaN is ArviZ's answer for a chain that holds one.
"""

import doctest
import functools
import inspect
import os
import sys
import tempfile

import numpy as np
import pytest
import torch

from tests._public import names_param, package_modules

LOOP_STEP = "per-step kernel of a training loop: NaN propagates, as in torch"
PROPAGATES = {
    # optim.scent: the dual updates and losses that EntropicRiskLoss calls every step
    "asgd_update": LOOP_STEP,
    "log_mean_exp": LOOP_STEP,
    "objective": LOOP_STEP,
    "softplus_dual_ratio": LOOP_STEP,
    "sox_update": LOOP_STEP,
    "spmd_gamma": LOOP_STEP,
    "spmd_update": LOOP_STEP,
    "umax_update": LOOP_STEP,
    # retrieval: the training losses (in the model's outputs; the data's targets are
    # checked) and the activation of the amortized networks
    "amips_loss": LOOP_STEP,
    "softmax_signed_loss.logits": LOOP_STEP,
    "soft_leaky_relu": "elementwise activation: NaN in, NaN out",
    # ssl.clapp: the layer-local losses, the hand-written gradient and the patch unfolding
    "clapp_layer_loss": LOOP_STEP,
    "contrastive_loss": LOOP_STEP,
    "infonce_loss": LOOP_STEP,
    "patch_prediction_loss": LOOP_STEP,
    "three_factor_grad": LOOP_STEP,
    "extract_patches": "a reshaping of the images (unfold): NaN in, NaN out",
    # sampling.rehmc
    "ess": "a chain holding NaN has an undefined ESS: NaN, as ArviZ returns",
    "rhat": "a chain holding NaN has an undefined R-hat: NaN, as ArviZ returns",
}


def _public_functions():
    found = {}
    for module in package_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isfunction(obj) and obj.__module__.startswith("mlpapers"):
                found.setdefault(name, obj)
    return dict(sorted(found.items()))


FUNCTIONS = _public_functions()


def _example_call(func):
    """``inspect.BoundArguments`` of the first call of ``func`` in its docstring example
    (None when the example does not call it)."""
    calls = []

    @functools.wraps(func)
    def recording(*args, **kwargs):
        if not calls:
            calls.append((args, kwargs))
        return func(*args, **kwargs)

    # the example imports the function from its modules: every module that exports it
    # hands out the recording wrapper while the example runs
    holders = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("mlpapers")
               and getattr(m, func.__name__, None) is func]
    for m in holders:
        setattr(m, func.__name__, recording)
    try:
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        for test in doctest.DocTestFinder(recurse=False).find(func, func.__name__):
            runner.run(test, out=lambda _: None)
    finally:
        for m in holders:
            setattr(m, func.__name__, func)
    if not calls:
        return None
    args, kwargs = calls[0]
    return inspect.signature(func).bind(*args, **kwargs)


def _with_nan(value):
    """A copy of a floating array with a NaN at flat index 1 (off the diagonal of a
    square matrix), or None for any other value."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
        out = value.detach().clone(memory_format=torch.contiguous_format)
    elif isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
        out = np.array(value, order="C")
    else:
        return None
    out.reshape(-1)[min(1, out.reshape(-1).shape[0] - 1)] = float("nan")
    return out


def _example_calls():
    """``{function name: bound arguments}`` of the functions whose example calls them
    (the examples run in a scratch directory: some write files)."""
    calls = {}
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        try:
            for name, func in FUNCTIONS.items():
                bound = _example_call(func)
                if bound is not None:
                    calls[name] = bound
        finally:
            os.chdir(cwd)
    return calls


EXAMPLE_CALLS = _example_calls()
#: ``(function name, argument)`` for every floating array argument of an example call
CASES = [(name, param) for name, bound in EXAMPLE_CALLS.items()
         for param, value in bound.arguments.items() if _with_nan(value) is not None]
#: ``(function name, parameter)`` for every parameter with a numeric default
SCALARS = [(name, param) for name in EXAMPLE_CALLS
           for param, p in inspect.signature(FUNCTIONS[name]).parameters.items()
           if isinstance(p.default, (int, float)) and not isinstance(p.default, bool)
           and param != "random_state"]

#: ``(function name, parameter)`` for every switch (a ``True``/``False`` default)
SWITCHES = [(name, param) for name in EXAMPLE_CALLS
            for param, p in inspect.signature(FUNCTIONS[name]).parameters.items()
            if isinstance(p.default, bool)]




def _propagates(name, param):
    return name in PROPAGATES or f"{name}.{param}" in PROPAGATES


def _call_with(name, param, change):
    """The example call of ``name`` with ``param`` set to ``change(its example value)``
    (the example runs once per call: an earlier call may have modified its arrays)."""
    func = FUNCTIONS[name]
    bound = _example_call(func)
    call = inspect.signature(func).bind_partial()
    call.arguments.update({**bound.arguments, param: change(bound.arguments.get(param))})
    return func(*call.args, **call.kwargs)


def _call_with_nan(name, param):
    return _call_with(name, param, _with_nan)


def test_the_exceptions_are_public_functions_and_arguments():
    assert {key.split(".")[0] for key in PROPAGATES} <= set(FUNCTIONS)
    assert {key for key in PROPAGATES if "." in key} <= {f"{n}.{p}" for n, p in CASES}


def test_most_public_functions_are_checked():
    """The examples reach the functions that take arrays (a guard against a change
    that silently empties the sweep; 19 without the optional extras, 20 with them)."""
    checked = {name for name, param in CASES if not _propagates(name, param)}
    assert len(checked) >= 15, sorted(checked)


@pytest.mark.parametrize(("name", "param"),
                         [case for case in CASES if not _propagates(*case)])
def test_a_nan_argument_raises_a_value_error_naming_it(name, param, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        _call_with_nan(name, param)
    assert names_param(param, str(err.value)), str(err.value)


@pytest.mark.parametrize(("name", "param"), [case for case in CASES if _propagates(*case)])
def test_the_listed_functions_accept_nan(name, param, tmp_path, monkeypatch):
    """The exceptions return without an error, so the list stays true: a function that
    starts refusing NaN must leave it. (Their output holds NaN where the NaN entry is
    read; an example's unused patch rows or a ReLU's zero derivative do not read it.)"""
    monkeypatch.chdir(tmp_path)
    _call_with_nan(name, param)


def test_infinity_and_list_arguments_are_refused_too():
    """What the sweep cannot reach: infinity, and arrays inside a list argument."""
    from mlpapers.retrieval import greedy_selection, mips_topk
    from mlpapers.ssl import exact_linear_feedback

    keys = torch.tensor([[1.0, 0.0], [0.0, torch.inf]])
    with pytest.raises(ValueError, match="^keys contains NaN or infinity"):
        mips_topk(torch.ones(1, 2), keys)
    with pytest.raises(ValueError, match="^X contains NaN or infinity"):
        greedy_selection(keys.double(), 1)
    W = [torch.eye(2), torch.tensor([[1.0, float("nan")], [0.0, 1.0]])]
    with pytest.raises(ValueError, match=r"^weights\[1\] contains NaN or infinity"):
        exact_linear_feedback(W, torch.eye(2))


def test_shape_errors_name_the_argument():
    """Two shape errors that named no argument or the wrong cause."""
    from mlpapers.decentralized import multiplier_relabel

    # (was "c=3 must be coprime with n=0")
    with pytest.raises(ValueError, match="^assignment must not be empty"):
        multiplier_relabel(np.arange(0), 3)
    pytest.importorskip("faiss")
    from mlpapers.retrieval import build_faiss_ivf

    # (was scikit-learn's "Found array with dim 3, while dim <= 2 is required.")
    with pytest.raises(ValueError, match="^Expected 2D array for database, got 3D"):
        build_faiss_ivf(np.zeros((2, 3, 2), dtype=np.float32))


def test_most_scalar_parameters_are_checked():
    assert len(SCALARS) >= 60, SCALARS  # (77 without the optional extras, 80 with them)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize(("name", "param"), SCALARS)
def test_a_non_finite_scalar_parameter_is_refused_by_name(name, param, bad, tmp_path,
                                                           monkeypatch):
    """No numeric parameter of a public function takes NaN or infinity: a temperature,
    a weight, a tolerance or a size that is not finite was used as given (NaN losses,
    a loss of the wrong sign, silently) or failed in the arithmetic (session 23)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ValueError, TypeError)) as err:
        _call_with(name, param, lambda _: bad)
    assert names_param(param, str(err.value)), str(err.value)


#: functions whose example passes a ``random_state``
SEEDED = [name for name in EXAMPLE_CALLS
          if "random_state" in inspect.signature(FUNCTIONS[name]).parameters]


def test_most_seeded_functions_are_checked():
    assert len(SEEDED) >= 12, SEEDED


@pytest.mark.parametrize("bad", ["x", -1, 1.5, True])
@pytest.mark.parametrize("name", SEEDED)
def test_a_bad_random_state_is_refused_by_name(name, bad, tmp_path, monkeypatch):
    """``bottleneck_tsp`` handed the seed to numpy, whose SeedSequence errors do not name
    it, and read True as 1, as scikit-learn's KMeans did in ``clove_assign``."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ValueError, TypeError)) as err:
        _call_with(name, "random_state", lambda _: bad)
    assert names_param("random_state", str(err.value)), str(err.value)


def test_most_switches_are_checked():
    assert len(SWITCHES) >= 12, SWITCHES


@pytest.mark.parametrize("bad", ["no", None])
@pytest.mark.parametrize(("name", "param"), SWITCHES)
def test_a_switch_takes_only_true_or_false(name, param, bad, tmp_path, monkeypatch):
    """``"no"`` or ``None`` was read as a truth value (``directed="no"`` computed the
    directed answer); scikit-learn's functions refuse them too."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError) as err:
        _call_with(name, param, lambda _: bad)
    assert names_param(param, str(err.value)), str(err.value)


def test_switches_of_public_classes_take_only_true_or_false():
    from mlpapers.retrieval import GaussianMixtureQuerySampler, KeyNet, SupportNet

    with pytest.raises(TypeError, match="bias must be a bool"):
        SupportNet(3, [4], bias="no")
    for kw in (dict(bias=None), dict(resnet="no")):
        with pytest.raises(TypeError, match=f"{next(iter(kw))} must be a bool"):
            KeyNet(3, [4], **kw)
    with pytest.raises(TypeError, match="normalize must be a bool"):
        GaussianMixtureQuerySampler(np.eye(2), 0.1, normalize="no")
    from mlpapers.anomaly import DinoViTExtractor

    with pytest.raises(TypeError, match="norm must be a bool"):
        DinoViTExtractor(torch.nn.Identity(), norm="no")


def test_out_of_range_scalar_parameters_are_refused():
    """Finite values the sweep above does not try: each was used as given."""
    import networkx as nx

    from mlpapers.decentralized import delays_from_graph
    from mlpapers.federated import clove_assign
    from mlpapers.retrieval import SupportNet, select_support, soft_leaky_relu, solve_width
    from mlpapers.ssl.clapp import infonce_loss

    x = torch.linspace(-1, 1, 5)
    for kw, match in [(dict(beta=0.0), "beta must be > 0"),
                      (dict(negative_slope=1.5), r"negative_slope must be in \[0, 1\)"),
                      (dict(negative_slope=-0.5), "negative_slope must be >= 0")]:
        with pytest.raises(ValueError, match=match):
            soft_leaky_relu(x, **kw)
        with pytest.raises(ValueError, match=match):  # (SupportNet was then not convex)
            SupportNet(3, [4], **kw)
    with pytest.raises(ValueError, match="multiple must be > 0"):  # (ZeroDivisionError)
        solve_width(100, 4, 4, 2, multiple=0)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        solve_width(-5, 4, 4, 2)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        infonce_loss(torch.randn(4, 3), temperature=-0.1)
    with pytest.raises(TypeError, match="n_init must be an integer"):
        clove_assign(np.eye(3), 2, n_init=True)
    R = np.random.default_rng(0).random((5, 6))
    with pytest.raises(ValueError, match="tol must be >= 0"):  # (read by "greedy" only)
        select_support(R, 2, "random", tol=-1.0, random_state=0)
    G = nx.Graph()
    G.add_edge("a", "b", distance=1.0)
    with pytest.raises(ValueError, match="overhead must be >= 0"):
        delays_from_graph(G, overhead=-1.0)


def test_scalar_parameters_of_public_classes_are_refused_by_name():
    """Three constructors that stored a bad value and failed (or returned NaN) later."""
    from mlpapers.anomaly import RandomConvExtractor
    from mlpapers.retrieval import Homogenize, SupportNet

    for eps in (float("nan"), 0.0, -1.0):  # (NaN values; no floor at x = 0)
        with pytest.raises(ValueError, match=r"eps must be (finite and )?> 0"):
            Homogenize(SupportNet(3, [4]), eps=eps)
    with pytest.raises(TypeError, match="seed must be an integer"):
        RandomConvExtractor(seed=1.5)
    pytest.importorskip("flwr")
    from mlpapers.federated.flower import CLoVEStrategy

    with pytest.raises(ValueError, match="poll_interval must be finite and >= 0"):
        CLoVEStrategy(2, poll_interval=float("nan"))
    with pytest.raises(TypeError, match="n_init must be an integer"):
        CLoVEStrategy(2, n_init=2.5)
    for seed in ("x", -1, 1.5, np.random.default_rng(0)):  # (failed in start, late)
        with pytest.raises(ValueError, match="random_state must be None"):
            CLoVEStrategy(2, random_state=seed)


def _as_dtype(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.detach().round().long() if dtype == "int64" else value.detach().to(dtype)
    return value.round().astype(np.int64) if dtype == "int64" else value.astype(
        {torch.float64: np.float64, torch.float16: np.float16}[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, "int64"])
@pytest.mark.parametrize(("name", "param"), CASES)
def test_an_argument_of_another_dtype_is_computed_or_refused_by_name(name, param, dtype,
                                                                      tmp_path, monkeypatch):
    """One array argument in float64, float16 or int64 beside the example's others: the
    function computes (promoting) or raises ValueError/TypeError naming the argument,
    never torch's "expected m1 and m2 to have the same dtype" or "not implemented for
    'Long'" (the CLAPP and RBE kernels failed so, session 23)."""
    monkeypatch.chdir(tmp_path)
    try:
        _call_with(name, param, lambda value: _as_dtype(value, dtype))
    except (ValueError, TypeError) as err:
        assert names_param(param, str(err)), str(err)


def test_arrays_outside_the_examples_and_tensor_parameters():
    """is_biconnected's example passes a boolean matrix (out of the sweep): a NaN entry
    was read as an edge. Tensor scalars (a learnable temperature or weight) are the
    caller's: accepted without a check, as before."""
    from mlpapers.decentralized import is_biconnected
    from mlpapers.retrieval import amips_loss, soft_leaky_relu
    from mlpapers.ssl.clapp import infonce_loss

    A = np.ones((4, 4))
    A[0, 1] = A[1, 0] = np.nan
    with pytest.raises(ValueError, match="^adjacency contains NaN or infinity"):
        is_biconnected(A)
    assert is_biconnected(np.nan_to_num(A, nan=1.0))
    tau = torch.nn.Parameter(torch.tensor(0.5))
    infonce_loss(torch.randn(4, 3), tau).backward()
    assert tau.grad is not None
    assert soft_leaky_relu(torch.zeros(2), torch.tensor(0.2)).shape == (2,)
    total = amips_loss(torch.ones(1), torch.ones(1, 2), torch.zeros(1), torch.zeros(1, 2),
                       score_weight=torch.tensor(0.5))[0]
    assert float(total) == pytest.approx(0.5 * 1 + 1.0 * 1)


#: functions that only move values around, for which a complex array is as valid as a real one
COMPLEX_PASSES = {"extract_patches": "a reshape (unfold): complex patches keep both parts"}


def _as_complex(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.complex128 if value.dtype == torch.float64
                                 else torch.complex64)
    return np.asarray(value).astype(complex)


@pytest.mark.parametrize(("name", "param"),
                         [case for case in CASES if case[0] not in COMPLEX_PASSES])
def test_a_complex_argument_is_refused(name, param, tmp_path, monkeypatch):
    """Complex arrays were cast to real with the imaginary part dropped (a numpy or torch
    warning at most: 14 public functions returned a value), or failed in torch."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises((TypeError, ValueError)) as err:
        _call_with(name, param, _as_complex)
    message = str(err.value).lower()
    assert "complex" in message or "real" in message, str(err.value)
    assert names_param(param, str(err.value)), str(err.value)
