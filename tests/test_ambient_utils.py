"""The shared ambient-state helpers, the shared base and the dataset generators are
indifferent to the caller's torch state and leave it untouched."""

import threading
import warnings

import numpy as np
import pytest
import torch

from mlpapers._utils import (
    autograd_enabled,
    check_tensor,
    default_dtype,
    default_init_,
    on_inputs_device,
    seed_from_generator,
    seeded_global_rng,
    seeded_linear,
    usable_outside_inference,
    with_autograd,
)
from mlpapers.datasets import (
    make_federated_linear,
    make_mips_problem,
    make_relevance_problem,
)
from tests._ambient import (
    AMBIENT,
    assert_same_result,
    assert_state_unchanged,
    check_ambient,
    check_state_untouched,
    check_thread_safe,
    global_state,
)
from tests._toy import ToyRidge
from tests.datasets.test_random_state import SMALL


def _grad_of_square(x):
    w = torch.tensor(3.0, requires_grad=True)
    (w * w * x).backward()
    return w.grad


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_autograd_enabled_trains_inside_the_callers_no_grad_and_inference_mode(mode):
    with mode():
        with autograd_enabled():
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            grad = _grad_of_square(torch.tensor(2.0))
        assert not torch.is_grad_enabled()  # the caller's mode is back
    assert float(grad) == 12.0  # d(2 w^2)/dw at w = 3


def test_with_autograd_keeps_the_method_and_restores_the_mode_on_error():
    class Fitter:
        @with_autograd
        def fit(self, fail=False):
            """Docstring kept."""
            if fail:
                raise RuntimeError("boom")
            return torch.is_grad_enabled()

    assert Fitter.fit.__doc__ == "Docstring kept."
    with torch.no_grad():
        assert Fitter().fit() is True
        with pytest.raises(RuntimeError, match="boom"):
            Fitter().fit(fail=True)
        assert not torch.is_grad_enabled()


def test_default_dtype_builds_float32_modules_and_restores_on_error():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with default_dtype(torch.float32):
            layer = torch.nn.Linear(2, 3)
        assert layer.weight.dtype == torch.float32
        with pytest.raises(RuntimeError, match="boom"), default_dtype(torch.float32):
            raise RuntimeError("boom")
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_default_dtype_is_safe_when_two_threads_enter_it_at_once():
    """Without the lock, the second thread saves the first one's float32 and restores
    it last, leaving the caller with float32 instead of its float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    inside = threading.Barrier(2, timeout=5)
    seen = []

    def work():
        try:
            inside.wait()
        except threading.BrokenBarrierError:
            pass
        with default_dtype(torch.float32):
            seen.append(torch.get_default_dtype())

    try:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [torch.float32, torch.float32]
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_seeded_global_rng_is_reproducible_and_restores_the_callers_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with seeded_global_rng(7):
        first = torch.rand(5)
    assert torch.equal(torch.get_rng_state(), before)
    with seeded_global_rng(7, torch.device("cpu")):
        again = torch.rand(5)
    assert torch.equal(first, again)
    assert torch.equal(first, torch.rand(5, generator=torch.Generator().manual_seed(7)))
    with pytest.raises(KeyError), seeded_global_rng(8):  # restored on error too
        torch.rand(3)
        raise KeyError
    assert torch.equal(torch.get_rng_state(), before)


def test_seeded_global_rng_forks_in_threads_do_not_interleave():
    # each fork holds the one process-wide lock: a thread's draws depend on its seed only
    results, barrier = {}, threading.Barrier(4)

    def run(seed):
        barrier.wait()
        out = []
        for _ in range(50):
            with seeded_global_rng(seed):
                out.append(torch.rand(3))
        results[seed] = torch.stack(out)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for seed, draws in results.items():
        want = torch.rand(3, generator=torch.Generator().manual_seed(seed))
        assert all(torch.equal(d, want) for d in draws)


def test_seed_from_generator_reads_the_state_without_drawing():
    g = torch.Generator().manual_seed(3)
    seed = seed_from_generator(g)
    assert 0 <= seed < 2**63 and seed_from_generator(g) == seed
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(3).get_state())
    torch.rand(1, generator=g)
    assert seed_from_generator(g) != seed  # the stream moves with the generator


def test_inference_tensors_become_trainable_inputs():
    with torch.inference_mode():
        x = torch.ones(4, 2)
    assert x.is_inference()
    y = check_tensor(x, dtype=None)  # same dtype: no cast would copy it
    assert not y.is_inference() and torch.equal(y, x)
    w = torch.ones(2, requires_grad=True)
    (y @ w).sum().backward()  # an inference tensor here raises "cannot be saved for backward"
    assert torch.equal(w.grad, x.sum(0))
    with torch.inference_mode():  # inside the mode the tensor is kept as it is
        assert usable_outside_inference(x) is x
    plain = torch.ones(2)
    assert usable_outside_inference(plain) is plain


def test_read_only_numpy_input_is_accepted_without_a_warning():
    a = np.arange(6.0).reshape(3, 2)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.from_numpy warns on non-writable arrays
        t = check_tensor(a)
    assert torch.equal(t, torch.arange(6.0).reshape(3, 2))


def _toy_fit_predict():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    est = ToyRidge(jitter=0.5, random_state=1).fit(X, y)
    return est.coef_, est.predict(X)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_shared_base_fit_predict_is_indifferent_to_the_ambient_state(context):
    check_ambient(_toy_fit_predict, context)


@pytest.mark.parametrize("context", list(AMBIENT))
def test_save_load_round_trip_under_the_ambient_state(context, tmp_path):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    est = ToyRidge(jitter=0.5, random_state=1).fit(X, y)
    est.save(tmp_path / "toy.pt")
    with AMBIENT[context]():
        before = global_state()
        back = ToyRidge.load(tmp_path / "toy.pt")
        assert_state_unchanged(before, global_state())
    np.testing.assert_array_equal(back.coef_, est.coef_)
    assert back.coef_.dtype == est.coef_.dtype
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


def _generated(make, kw):
    out = make(**kw, random_state=0)
    if make is make_relevance_problem:  # also score with the returned relevance function
        queries, items, relevance = out
        return queries, items, relevance(queries, torch.from_numpy(items))
    if make is make_mips_problem:
        keys, queries, sampler = out
        return keys, queries, sampler(5, np.random.default_rng(1))
    return out


@pytest.mark.parametrize("context", list(AMBIENT))
@pytest.mark.parametrize("make, kw", SMALL, ids=[f.__name__ for f, _ in SMALL])
def test_dataset_generators_are_indifferent_to_the_ambient_state(make, kw, context):
    check_ambient(lambda: _generated(make, kw), context)


@pytest.mark.parametrize("make, kw", SMALL, ids=[f.__name__ for f, _ in SMALL])
def test_dataset_generators_are_thread_safe_and_leave_global_state_alone(make, kw):
    check_state_untouched(lambda: _generated(make, kw))
    check_thread_safe(lambda: _generated(make, kw))


def _torch_built(build, seed):
    torch.manual_seed(seed)
    return build()


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # torch's, both ways
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 3), (1, 1), (0, 4)])
def test_seeded_linear_draws_what_nn_linear_draws_after_manual_seed(shape, bias):
    state = torch.random.get_rng_state()
    ours = seeded_linear(*shape, bias=bias, generator=torch.Generator().manual_seed(7))
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched
    with torch.random.fork_rng(devices=[]):
        ref = _torch_built(lambda: torch.nn.Linear(*shape, bias=bias), 7)
    assert ours.weight.dtype == torch.float32
    assert torch.equal(ours.weight, ref.weight)
    assert (ours.bias is None) == (not bias)
    if bias:
        assert torch.equal(ours.bias, ref.bias)


def test_default_init_matches_reset_parameters_for_convolutions_in_module_order():
    def build():
        return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.ReLU(),
                                   torch.nn.Conv1d(4, 2, 5, groups=2, bias=False),
                                   torch.nn.Linear(3, 2))

    with torch.random.fork_rng(devices=[]):
        ref = _torch_built(build, 3)
        ours = build()  # other values, overwritten below
    default_init_(ours, torch.Generator().manual_seed(3))
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_seeded_linear_without_a_generator_is_nn_linear():
    with torch.random.fork_rng(devices=[]):
        a = _torch_built(lambda: seeded_linear(4, 2), 5)
        b = _torch_built(lambda: torch.nn.Linear(4, 2), 5)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def _fitted_outputs(name):
    """Fit one small trainer: what it learned, or the estimator and how to evaluate it."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 4)).astype(np.float32)
    if name == "KLDRORegressor":
        from mlpapers.optim import KLDRORegressor

        return KLDRORegressor(epochs=2, random_state=0).fit(X, X @ np.arange(4.0)).coef_
    if name == "SCENTClassifier":
        from mlpapers.optim import SCENTClassifier

        est = SCENTClassifier(n_negatives=2, epochs=2, batch_size=8, random_state=0)
        return est.fit(X, np.arange(40) % 4).coef_
    if name == "CLAPPEncoder":
        from mlpapers.ssl import CLAPPEncoder

        est = CLAPPEncoder(n_epochs=1, batch_size=4, random_state=0)
        return [p.detach().clone() for p in est.fit(rng.random((8, 1, 16, 16))).encoder_
                .parameters()]
    if name == "AmortizedMIPS":
        from mlpapers.retrieval import AmortizedMIPS

        est = AmortizedMIPS(depth=2, hidden_dim=8, n_steps=3, batch_size=16, random_state=0)
        return dict(est.fit(X).model_.state_dict())
    if name == "CLoVE":
        from mlpapers.federated import CLoVE

        clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                              n_samples=10, n_features=4, random_state=0)
        est = CLoVE(n_rounds=2, model="mlp", hidden_layer_sizes=(3,), random_state=0)
        return est.fit(clients), lambda e: (e.labels_, e.predict(clients[0][0], cluster=0))
    if name == "DecentralizedSGD":
        from mlpapers.decentralized import DecentralizedSGD

        est = DecentralizedSGD(model="mlp", n_nodes=4, n_rounds=3, hidden=4, random_state=0)
        return est.fit(X, np.arange(40) % 3), lambda e: e.predict_proba(X)
    raise AssertionError(name)


TRAINERS = ["KLDRORegressor", "SCENTClassifier", "CLAPPEncoder", "AmortizedMIPS", "CLoVE",
            "DecentralizedSGD"]


@pytest.mark.parametrize("name", TRAINERS)
def test_fits_train_in_their_own_precision_under_the_callers_autocast(name):
    """``torch.autocast`` would run the fit's matmuls and convolutions in bfloat16; fits
    switch it off (the caller's inference calls still follow it, as torch modules do)."""
    expected = _fitted_outputs(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = _fitted_outputs(name)
        assert torch.is_autocast_enabled("cpu")  # the caller's autocast is back
    if isinstance(expected, tuple) and callable(expected[1]):  # evaluated outside autocast
        expected, actual = expected[1](expected[0]), actual[1](actual[0])
    assert_same_result(expected, actual)


def test_autograd_enabled_switches_the_callers_autocast_off_and_back_on():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with autograd_enabled():
            assert not torch.is_autocast_enabled("cpu")
            out = torch.ones(2, 2) @ torch.ones(2, 2)
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert out.dtype == torch.float32


def _inference_tensors(obj, seen=None):
    """Paths of the inference tensors held by an estimator (attributes, containers, modules)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return ["tensor"] if obj.is_inference() else []
    if isinstance(obj, torch.nn.Module):
        return [n for n, t in [*obj.named_parameters(), *obj.named_buffers()] if t.is_inference()]
    if isinstance(obj, dict):
        return [f"{k}/{p}" for k, v in obj.items() for p in _inference_tensors(v, seen)]
    if isinstance(obj, (list, tuple)):
        return [f"{i}/{p}" for i, v in enumerate(obj) for p in _inference_tensors(v, seen)]
    return []


def _small_fitted(name):
    rng = np.random.default_rng(0)
    if name == "RADDetector":
        from mlpapers.anomaly import RADDetector

        return RADDetector(image_size=32, extractor="random").fit(rng.random((3, 32, 32, 3)))
    if name == "PatchCoreDetector":
        from mlpapers.anomaly import PatchCoreDetector

        return PatchCoreDetector(image_size=32, extractor="random", random_state=0).fit(
            rng.random((3, 32, 32, 3)))
    from mlpapers.decentralized import DecentralizedSGD

    X = rng.normal(size=(20, 3)).astype(np.float32)
    return DecentralizedSGD(n_nodes=2, n_rounds=2, random_state=0).fit(X, np.arange(20) % 2)


@pytest.mark.parametrize("name", ["RADDetector", "PatchCoreDetector", "DecentralizedSGD"])
def test_load_inside_inference_mode_gives_normal_tensors(name, tmp_path):
    est = _small_fitted(name)
    est.save(tmp_path / "est.pt")
    with torch.inference_mode():
        back = type(est).load(tmp_path / "est.pt")
        assert torch.is_inference_mode_enabled()  # the caller's mode is back
    assert _inference_tensors(vars(back)) == []
    assert _inference_tensors(vars(est)) == []  # (the fit's own tensors are normal too)


def test_on_inputs_device_computes_where_the_first_tensor_argument_is():
    @on_inputs_device
    def made_here(x=None, *, y=None):
        return torch.zeros(1).device

    cpu, meta = torch.ones(1, device="cpu"), torch.ones(1, device="meta")
    assert made_here(cpu) == torch.device("cpu")  # default CPU: nothing to do
    with AMBIENT["default_device_meta"]():
        assert made_here(cpu).type == "cpu"
        assert made_here(y=cpu).type == "cpu"
        assert made_here().type == "cpu"  # numpy or no inputs: the CPU
        assert made_here(meta).type == "meta"
        assert torch.zeros(1).device.type == "meta"  # the caller's default is back


def test_estimator_methods_run_on_the_cpu_default_device_including_subclasses():
    class MyRidge(ToyRidge):
        def fitted_device(self):
            return torch.zeros(1).device

        @classmethod
        def made_device(cls):
            return torch.zeros(1).device

    est = MyRidge()
    with AMBIENT["default_device_meta"]():
        assert est.fitted_device().type == "cpu" and MyRidge.made_device().type == "cpu"
        assert torch.zeros(1).device.type == "meta"
    assert MyRidge.fitted_device.__name__ == "fitted_device"  # (functools.wraps)
    assert MyRidge.get_params is ToyRidge.get_params  # scikit-learn's methods untouched
    assert not hasattr(MyRidge.get_params, "_on_cpu_default_device")
    assert MyRidge.fit is ToyRidge.fit  # wrapped once, where it is defined


def test_device_wrappers_do_not_break_a_torch_compile_graph():
    @on_inputs_device
    def scaled(x):
        return x * torch.ones(1)

    compiled = torch.compile(scaled, fullgraph=True, backend="eager")
    x = torch.arange(3.0)
    assert torch.equal(compiled(x), x)


def test_a_with_torch_device_block_is_handled_like_set_default_device():
    @on_inputs_device
    def made_here(x):
        return torch.zeros(1).device

    with torch.device("meta"):
        assert made_here(torch.ones(1, device="cpu")).type == "cpu"


def test_unbound_estimator_methods_still_pickle_by_reference():
    import pickle

    from mlpapers.federated import CLoVE
    from mlpapers.retrieval import ExactMIPS

    for method in (ExactMIPS.save, ExactMIPS.kneighbors, CLoVE.score, CLoVE.predict):
        assert pickle.loads(pickle.dumps(method)) is method


def test_support_and_augmentation_methods_compute_on_the_inputs_device():
    from mlpapers.sampling import Ball, Box
    from mlpapers.ssl import DefaultAugment

    with torch.device("cpu"):
        images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    with AMBIENT["default_device_meta"]():
        for support in (Box([-1.0, -1.0], [1.0, 1.0]), Ball([0.0, 0.0], 1.0)):
            assert support.random_interior(3, gen).device.type == "cpu"
        aug = DefaultAugment()
        for out in (aug.crop_flip(images, gen), aug.color(images, gen), aug.blur(images, gen)):
            assert out.device.type == "cpu"


def test_modules_drawn_from_a_generator_are_made_where_it_draws():
    """A CPU generator cannot draw on another device: under a CUDA default device,
    ``RandomConvExtractor()`` and ``KeyNet``/``SupportNet(generator=...)`` were a torch
    error ("Expected a 'cuda' device type for generator"), and with the meta device
    (which ignores generators) the networks came out split across two devices
    (session 26). ``NeuralRBEHead`` is made on its embeddings' device. The weights
    are those of a build with the CPU as default device."""
    from mlpapers.anomaly.rad import RandomConvExtractor
    from mlpapers.retrieval.amips import KeyNet, SupportNet
    from mlpapers.retrieval.rbe import NeuralRBEHead
    from mlpapers.ssl.clapp import PatchPredictor

    def builds():
        emb = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), device="cpu")
        ones = torch.ones(3, device="cpu")
        return {
            "conv": RandomConvExtractor(),
            "keynet": KeyNet(3, [4, 4], generator=torch.Generator().manual_seed(1)),
            "supportnet": SupportNet(3, [4], generator=torch.Generator().manual_seed(2)),
            "predictor": PatchPredictor(4, 2, generator=torch.Generator().manual_seed(4)),
            "head": NeuralRBEHead(emb, torch.zeros(6, device="cpu"),
                                  torch.arange(6.0, device="cpu"), 0 * ones, ones, hidden=5,
                                  generator=torch.Generator().manual_seed(3)),
        }

    want = builds()
    with AMBIENT["default_device_meta"]():
        got = builds()
    for name, module in got.items():
        tensors = dict(module.state_dict())
        assert {t.device.type for t in tensors.values()} == {"cpu"}, name
        for key, value in want[name].state_dict().items():
            assert torch.equal(tensors[key], value), (name, key)
    # without a generator they follow the default device, as torch.nn modules do
    with AMBIENT["default_device_meta"]():
        for module in (KeyNet(3, [4, 4]), SupportNet(3, [4]), PatchPredictor(4, 2)):
            assert {p.device.type for p in module.parameters()} == {"meta"}
