import math

import numpy as np
import pytest
import scipy.sparse
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlpapers._utils import (
    ProgressLogger,
    check_bool,
    check_generator,
    check_in_options,
    check_positive,
    check_real,
    check_seed,
    check_tensor,
    check_verbose,
    make_generators,
    reject_flat_image_table,
    resolve_device,
    resolve_dtype,
    to_numpy,
)
from mlpapers._utils._ambient import without_inference_tensors


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1),
                  elements=st.floats(-1e6, 1e6)))
def test_numpy_tensor_numpy_round_trip_is_exact(arr):
    t = check_tensor(arr, dtype=torch.float64)
    assert t.dtype == torch.float64 and t.shape == arr.shape
    np.testing.assert_array_equal(to_numpy(t), arr)
    # tensors go through unchanged
    np.testing.assert_array_equal(to_numpy(check_tensor(t, dtype=None)), arr)


def test_lists_and_non_contiguous_arrays_are_accepted():
    t = check_tensor([[1, 2], [3, 4]])
    assert t.dtype == torch.float32
    arr = np.arange(12.0).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(to_numpy(check_tensor(arr, dtype="float64")), arr)


@pytest.mark.parametrize("bad,kind", [(np.nan, "NaN"), (np.inf, "infinity")])
def test_non_finite_values_are_rejected_with_the_name(bad, kind):
    X = np.ones((3, 2))
    X[1, 1] = bad
    with pytest.raises(ValueError, match=f"Input queries contains {kind}"):
        check_tensor(X, name="queries")
    assert torch.isnan(check_tensor(np.full((2, 2), np.nan), allow_nan=True)).all()


def test_wrong_ndim_uses_sklearn_wording():
    with pytest.raises(ValueError, match="Expected 2D array for X, got 1D array instead"):
        check_tensor(np.ones(3))
    with pytest.raises(ValueError, match="Expected 3D or 4D array for images"):
        check_tensor(np.ones((2, 2)), name="images", ndim=(3, 4))
    with pytest.raises(ValueError, match=r"reshape\(1, -1\) if it contains a single sample"):
        check_tensor(np.ones(3))
    with pytest.raises(ValueError, match="Expected 3D or 4D array") as exc:
        check_tensor(np.ones(3), name="images", ndim=(3, 4))
    assert "reshape" not in str(exc.value)  # the 2D hint is only for 2D input


def test_min_samples_and_features():
    with pytest.raises(ValueError, match="0 sample"):
        check_tensor(np.ones((0, 3)))
    with pytest.raises(ValueError, match="minimum of 5 is required"):
        check_tensor(np.ones((3, 3)), min_samples=5)
    assert check_tensor(np.ones((5, 3)), min_samples=5).shape == (5, 3)  # the bound is inclusive
    assert check_tensor(np.ones((2, 4)), min_features=4).shape == (2, 4)
    with pytest.raises(ValueError, match="0 feature"):
        check_tensor(np.ones((3, 0)))


def test_feature_count_mismatch():
    with pytest.raises(ValueError, match="X has 4 features, but this estimator is expecting 3"):
        check_tensor(np.ones((2, 4)), n_features=3)


def test_type_errors():
    with pytest.raises(TypeError, match="X must contain numbers"):
        check_tensor(np.array([["a", "b"]]))
    with pytest.raises(ValueError, match="Complex data not supported"):
        check_tensor(torch.ones(2, 2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="Complex data not supported"):
        check_tensor(np.ones((2, 2), dtype=complex))
    with pytest.raises(TypeError, match="array-like"):
        check_tensor({"a": 1})
    with pytest.raises(TypeError, match=r"queries is a scipy sparse csr_matrix.*toarray"):
        check_tensor(scipy.sparse.eye(3, format="csr"), name="queries")
    with pytest.raises(TypeError, match=r"sparse torch tensor.*to_dense"):
        check_tensor(torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match="None"):
        check_tensor(None)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's prototype/deprecation notes
@pytest.mark.parametrize("make, error, match", [
    (lambda: torch.empty(2, 3, device="meta"), ValueError, "meta device"),
    (lambda: torch.quantize_per_tensor(torch.rand(2, 3), 0.1, 0, torch.quint8), TypeError,
     r"quantized torch tensor.*dequantize"),
    (lambda: torch.nested.nested_tensor([torch.rand(2), torch.rand(3)]), TypeError,
     r"nested torch tensor.*to_padded_tensor"),
    (lambda: torch.nested.nested_tensor([torch.rand(2), torch.rand(3)], layout=torch.jagged),
     TypeError, "nested torch tensor"),
])
def test_tensors_without_plain_values_are_refused_by_name(make, error, match):
    """Regression: meta, quantized and nested tensors reached torch ("Cannot copy out of
    meta tensor", "NestedTensorImpl doesn't support sizes"), also through the image
    checks, which read the shape first."""
    t = make()
    with pytest.raises(error, match=match):
        check_tensor(t, name="X")
    if t.is_nested:  # no shape to read: the image checks leave it to check_tensor
        reject_flat_image_table(t, takes="images")


def test_without_inference_tensors_copies_them_once_and_keeps_their_kind():
    with torch.inference_mode():
        net = torch.nn.BatchNorm1d(3)
        shared = torch.ones(2)
        state = {"net": net, "pair": (shared, [shared]), "plain": 1.5}
    net.weight.requires_grad_(False)  # (a flag only: allowed outside inference mode)
    assert net.weight.is_inference() and shared.is_inference()
    out = without_inference_tensors(state)
    assert out["net"] is net and out["plain"] == 1.5
    for t in [*net.parameters(), *net.buffers(), *out["pair"][:1], out["pair"][1][0]]:
        assert not t.is_inference()
    assert isinstance(net.weight, torch.nn.Parameter) and not net.weight.requires_grad
    assert net.bias.requires_grad
    assert out["pair"][0] is out["pair"][1][0]  # one tensor, one copy
    torch.testing.assert_close(out["pair"][0], torch.ones(2))
    net(torch.rand(4, 3)).sum().backward()  # trainable again
    assert net.bias.grad is not None
    lazy = torch.nn.LazyLinear(2)  # no data yet: left as it is
    assert without_inference_tensors({"m": lazy})["m"] is lazy


def test_dates_and_durations_are_refused_by_name():
    with pytest.raises(TypeError, match=r"X must contain numbers.*datetime64"):
        check_tensor(np.array([["2020-01-01"]], dtype="datetime64[D]"))
    with pytest.raises(TypeError, match=r"lags must contain numbers.*timedelta64"):
        check_tensor(np.array([[1, 2]], dtype="timedelta64[s]"), name="lags")


def test_pandas_missing_values_are_reported_as_nan():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": pd.array([1, None], dtype="Int64"), "b": [0.5, 2.0]})
    with pytest.raises(ValueError, match="X contains NaN"):
        check_tensor(frame)
    t = check_tensor(frame, allow_nan=True, dtype=torch.float64)
    assert torch.isnan(t[1, 0]) and t[0].tolist() == [1.0, 0.5] and t[1, 1] == 2.0
    full = pd.DataFrame({"a": pd.array([1, 3], dtype="Int64"), "b": [0.5, 2.0]})
    assert check_tensor(full, dtype=torch.float64).tolist() == [[1.0, 0.5], [3.0, 2.0]]
    with pytest.raises(TypeError, match="must contain numbers"):  # NA next to a word
        check_tensor(np.array([[pd.NA, "a"]], dtype=object))


def test_reversed_axis_of_length_one_is_accepted():
    # numpy calls x[:, ::-1] of one column C-contiguous, yet its stride is negative
    x = np.arange(3.0).reshape(3, 1)[:, ::-1]
    assert x.flags.c_contiguous and min(x.strides) < 0
    t = check_tensor(x, dtype=torch.float64)
    np.testing.assert_array_equal(t.numpy(), x)


def test_long_double_becomes_float64():
    x = np.arange(6, dtype=np.longdouble).reshape(3, 2) / 3
    t = check_tensor(x, dtype=None)
    assert t.dtype == torch.float64
    np.testing.assert_array_equal(t.numpy(), x.astype(np.float64))


def test_dtype_none_keeps_integer_labels():
    t = check_tensor(np.array([1, 2, 3]), ndim=1, dtype=None)
    assert t.dtype == torch.int64


def test_resolve_dtype_and_device():
    assert resolve_dtype("float64") is torch.float64
    assert resolve_dtype(np.float32) is torch.float32
    with pytest.raises(TypeError):
        resolve_dtype(torch.int64)
    with pytest.raises(TypeError):
        resolve_dtype("int8")
    assert resolve_device(None).type == "cpu"
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ValueError, match="device"):
        resolve_device("not-a-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    assert resolve_dtype("double") is torch.float64  # numpy spellings
    assert resolve_dtype("<f4") is torch.float32
    for bad in ("not-a-dtype", object(), "int8"):
        with pytest.raises(TypeError, match="dtype must be"):
            resolve_dtype(bad)


def test_cuda_without_an_index_resolves_to_the_current_device(monkeypatch):
    """Pinned (session 26): an unindexed ``torch.device("cuda")`` never equals a tensor's
    ``cuda:0``, so ExactMIPS's device cache of the keys missed on every call, and a
    later ``torch.cuda.set_device`` moved an estimator's computations. Simulated: no
    GPU is needed to build a device object."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="only 2 CUDA device"):
        resolve_device("cuda:2")


def test_ragged_nested_lists_are_refused_by_name():
    from mlpapers._utils._validation import reject_flat_image_table

    with pytest.raises(ValueError, match="Z could not be converted to an array"):
        check_tensor([[1.0, 2.0], [3.0]], name="Z")
    # the image-table check leaves ragged input to the general checks above
    assert reject_flat_image_table([[1.0, 2.0], [3.0]], takes="images") is None


def test_dtype_none_reads_half_precision_tensors_as_float32_on_the_cpu():
    """CPU kernels of float16 are slow or missing: ``dtype=None`` keeps every other
    floating dtype but widens float16 (exactly)."""
    x = torch.tensor([[0.1, 65504.0]], dtype=torch.float16)
    out = check_tensor(x, dtype=None)
    assert out.dtype == torch.float32
    assert torch.equal(out, x.float())
    assert check_tensor(x.bfloat16(), dtype=None).dtype == torch.bfloat16


def test_to_numpy_half_precision():
    out = to_numpy(torch.ones(2, dtype=torch.bfloat16))
    assert out.dtype == np.float32


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32))
def test_generators_are_deterministic_per_seed(seed):
    g1, n1 = make_generators(seed)
    g2, n2 = make_generators(seed)
    assert torch.equal(torch.rand(5, generator=g1), torch.rand(5, generator=g2))
    np.testing.assert_array_equal(n1.random(5), n2.random(5))


def test_int_seeds_must_lie_in_numpys_range():
    from mlpapers._utils import check_random_state

    for seed in (0, 2**32 - 1):
        assert isinstance(check_random_state(seed), np.random.RandomState)
    for seed in (-1, 2**32):
        with pytest.raises(ValueError, match=r"random_state must be in \[0, 2\*\*32\)"):
            check_random_state(seed)


def test_generators_differ_between_seeds_and_accept_numpy_rngs():
    a = torch.rand(4, generator=make_generators(0)[0])
    b = torch.rand(4, generator=make_generators(1)[0])
    assert not torch.equal(a, b)
    for rs in (np.random.RandomState(0), np.random.default_rng(0), None):
        g, n = make_generators(rs)
        assert isinstance(g, torch.Generator) and isinstance(n, np.random.Generator)
    with pytest.raises(TypeError, match="random_state"):
        make_generators("seed")
    with pytest.raises(ValueError, match="random_state"):
        make_generators(-1)
    g = torch.Generator()
    assert check_generator(g) is g


def test_check_positive_and_options():
    assert check_positive(3, "n", integer=True) == 3
    assert check_positive(0.0, "lr", strict=False) == 0.0
    with pytest.raises(ValueError, match="n_epochs must be > 0"):
        check_positive(0, "n_epochs", integer=True)
    with pytest.raises(TypeError, match="n_epochs must be an integer"):
        check_positive(1.5, "n_epochs", integer=True)
    with pytest.raises(TypeError):
        check_positive(True, "n", integer=True)
    for bad in (float("nan"), float("inf")):  # ("must be > 0, got inf" contradicted itself)
        with pytest.raises(ValueError, match="^lr must be finite and > 0, got"):
            check_positive(bad, "lr")
    with pytest.raises(ValueError, match=r"^lr must be finite and >= 0, got inf\."):
        check_positive(float("inf"), "lr", strict=False)
    with pytest.raises(ValueError, match=r"^lr must be > 0, got -1\."):
        check_positive(-1, "lr")
    with pytest.raises(ValueError, match=r"method must be one of \['a', 'b'\]"):
        check_in_options("c", "method", ["a", "b"])


def test_progress_logger_records_history_and_shows_bar(capsys):
    log = ProgressLogger(4, verbose=1, desc="fit")
    for step in log:
        log.log(epoch=step, loss=float(4 - step), note="x")
    assert log.column("loss") == [4.0, 3.0, 2.0, 1.0]
    assert len(log.history) == 4
    err = capsys.readouterr().err
    assert "fit" in err and "loss=1" in err  # numeric metrics on the bar, strings not
    assert "note" not in err
    quiet = ProgressLogger(2, verbose=0)
    for _ in quiet:
        quiet.log(loss=1.0)
    assert capsys.readouterr().err == ""


def test_probe_module_has_no_side_effects_and_names_the_model():
    from mlpapers._utils import probe_module

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    before = net[1].running_mean.clone()
    out = probe_module(net, torch.randn(2, 3) * 5 + 3)
    assert out.shape == (2, 4) and not out.requires_grad
    assert net.training  # the training flag is restored
    torch.testing.assert_close(net[1].running_mean, before)  # eval mode: stats untouched
    with pytest.raises(ValueError, match=r"net must accept inputs of shape \(batch, \*\(5,\)\)"):
        probe_module(net, torch.randn(2, 5), name="net")
    assert net.training


# -- regressions of the fifth-session audit -------------------------------------
def test_check_in_options_does_not_match_bools_to_numbers_or_arrays():
    with pytest.raises(ValueError, match="order must be one of"):
        check_in_options(True, "order", [1, 2])  # True == 1 in Python
    assert check_in_options(True, "flag", [True, False]) is True
    assert check_in_options(np.str_("a"), "method", ["a", "b"]) == "a"
    with pytest.raises(ValueError, match="method must be one of"):
        check_in_options(np.array(["a", "b"]), "method", ["a", "b"])


def test_check_positive_handles_huge_integers():
    # no OverflowError from float(value): a huge real is accepted, a count beyond any
    # index is refused with a message naming it (tqdm and torch failed on it without)
    with pytest.raises(ValueError, match=r"n must be at most 2\*\*63 - 1"):
        check_positive(2**70, "n", integer=True)
    assert check_positive(10**400, "scale") == 10**400
    with pytest.raises(ValueError, match="n must be > 0"):
        check_positive(-(2**70), "n", integer=True)


def test_check_bool_takes_only_true_or_false():
    assert check_bool(True, "flag") is True and check_bool(np.bool_(False), "flag") is False
    for bad in ("no", "False", 0, 1, None, np.array([True])):
        with pytest.raises(TypeError, match="flag must be a bool"):
            check_bool(bad, "flag")


def test_check_verbose_takes_bools_and_non_negative_ints():
    for good in (0, 2, True, np.bool_(False), np.int64(1)):
        assert check_verbose(good) is good
    with pytest.raises(ValueError, match="verbose must be >= 0"):
        check_verbose(-1)
    for bad in (float("nan"), 1.5, "1", None):
        with pytest.raises(TypeError, match="verbose must be an integer"):
            check_verbose(bad)


def test_check_seed_refuses_what_make_generators_refuses_without_drawing():
    gen = np.random.default_rng(0)
    before = gen.bit_generator.state
    for ok in (None, 0, 2**40, np.random.RandomState(0), gen):
        check_seed(ok)
    assert gen.bit_generator.state == before
    for bad, err in ((-1, ValueError), (1.0, TypeError), (True, TypeError), ("0", TypeError)):
        with pytest.raises(err, match="random_state"):
            check_seed(bad)
        with pytest.raises(err, match="random_state"):
            make_generators(bad)


def test_device_and_dtype_spellings():
    assert resolve_dtype("double") is torch.float64
    assert resolve_dtype("f4") is torch.float32
    assert resolve_dtype("half") is torch.float16
    with pytest.raises(ValueError, match="meta"):
        resolve_device("meta")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="MPS is not available"):
            resolve_device("mps")


def test_to_numpy_resolves_lazy_conjugate_and_negative_views():
    z = torch.tensor([1 + 2j])
    np.testing.assert_array_equal(to_numpy(z.conj()), np.array([1 - 2j]))
    np.testing.assert_array_equal(to_numpy(z.conj().imag), np.array([-2.0]))


def test_check_tensor_reads_non_native_byte_order():
    x = np.arange(6.0).reshape(2, 3)
    swapped = x.astype(x.dtype.newbyteorder(">" if np.little_endian else "<"))
    torch.testing.assert_close(check_tensor(swapped, dtype="float64"), torch.from_numpy(x))


def test_finite_check_works_in_bounded_blocks(monkeypatch):
    from mlpapers._utils import _validation

    seen = []
    isfinite = torch.isfinite
    monkeypatch.setattr(_validation.torch, "isfinite", lambda t: seen.append(t.numel())
                        or isfinite(t))
    X = torch.full((50, 40), 3e38)  # finite values whose float32 sum overflows
    assert _validation._all_finite(X, block=100)
    # the finite-sum shortcut (one 0-d test) fails, then 3 rows of 40 values at a time
    assert seen[0] == 1 and max(seen[1:]) <= 120 and sum(seen[1:]) == X.numel()
    for bad in (float("nan"), float("inf"), -float("inf")):
        for Z in (X, torch.zeros(50, 40)):
            Y = Z.clone()
            Y[-1, -1] = bad  # in the last block
            assert not _validation._all_finite(Y, block=100)
            assert not _validation._all_finite(Y.T, block=100)  # non-contiguous rows
    with pytest.raises(ValueError, match="NaN"):
        check_tensor(np.full((3, 2), np.nan))


def test_finite_check_takes_one_reduction_when_the_sum_is_finite(monkeypatch):
    """The elementwise test ran over every value of a relevance matrix (70 ms on
    2000 x 5000, twice per RBE fit); a finite sum proves the values finite at once."""
    from mlpapers._utils import _validation

    seen = []
    isfinite = torch.isfinite
    monkeypatch.setattr(_validation.torch, "isfinite", lambda t: seen.append(t.numel())
                        or isfinite(t))
    X = torch.randn(50, 40, dtype=torch.float64)
    assert _validation._all_finite(X, block=100) and seen == [1]
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        big = torch.finfo(dtype).max
        for fill in (0.0, big):  # a finite sum, and one that overflows to inf
            for bad in (float("nan"), float("inf"), -float("inf")):
                Y = torch.full((37, 11), fill, dtype=dtype)
                Y.view(-1)[int(torch.randint(Y.numel(), (1,), generator=g))] = bad
                assert not _validation._all_finite(Y, block=50), (dtype, fill, bad)
            assert _validation._all_finite(torch.full((37, 11), fill, dtype=dtype), block=50)
        # +inf and -inf together sum to NaN, not to a finite value
        Y = torch.zeros(4, dtype=dtype)
        Y[0], Y[1] = float("inf"), -float("inf")
        assert not _validation._all_finite(Y)


def test_power_of_two_unit_is_one_inside_the_window_and_an_exact_power_outside():
    from mlpapers._utils import power_of_two_unit

    assert power_of_two_unit(0.0, 30) == 1.0
    assert power_of_two_unit(3.0, 30) == 1.0 and power_of_two_unit(2.0**30, 30) == 1.0
    for amax in (1e-300, 3e-20, 7e40, 1e300):
        unit = power_of_two_unit(amax, 30)
        assert unit <= amax < 2 * unit
        assert math.frexp(unit)[0] == 0.5  # a power of two: dividing by it is exact


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_row_power_of_two_is_an_exact_normal_power_near_each_rows_maximum(dtype):
    from mlpapers._utils import row_power_of_two

    info = torch.finfo(dtype)
    x = torch.tensor([[0.0, 0.0], [3.0, -5.0], [info.tiny / 8, 0.0], [info.max, 1.0],
                      [float("inf"), 1.0], [float("nan"), 2.0], [2.0, 1.0], [-1e-3, 0.0]],
                     dtype=dtype)
    s = row_power_of_two(x)
    assert s.shape == (8, 1) and s.dtype == dtype
    m, e = np.frexp(s.double().numpy())
    assert (m == 0.5).all() and (s >= info.tiny).all() and torch.isfinite(s).all()
    assert s[0, 0] == 1 and s[4, 0] == 1 and s[5, 0] == 1       # zero, inf, NaN rows
    amax = x.abs().amax(1, keepdim=True)
    ok = [1, 3, 6, 7]                                           # normal rows
    ratio = (amax[ok] / s[ok]).double()
    assert ((ratio >= 0.5) & (ratio < 2)).all()
    assert torch.equal((x[ok] / s[ok]) * s[ok], x[ok])          # exact round trip
    # a subnormal row gets the smallest normal power: its entries scale up exactly
    assert s[2, 0] == info.tiny and x[2, 0] / s[2, 0] == 0.125


@pytest.mark.parametrize("shape, dim, expected", [((3, 0), -1, (3, 1)), ((0, 4), 0, (1, 4)),
                                                  ((0, 4), 1, (0, 1))])
def test_row_power_of_two_on_an_empty_axis_is_ones_of_the_kept_shape(shape, dim, expected):
    # an empty reduction used to raise IndexError from torch.amax
    from mlpapers._utils import row_power_of_two

    s = row_power_of_two(torch.zeros(shape, dtype=torch.float32), dim=dim)
    assert s.shape == expected and s.dtype == torch.float32 and bool((s == 1).all())


def _public_tensor_calls():
    from mlpapers.optim import log_mean_exp, objective, softplus_dual_ratio
    from mlpapers.retrieval import (
        amips_loss,
        cur_query_weights,
        fit_linear_embeddings,
        greedy_selection,
        mips_topk,
        rank_by_key,
        soft_leaky_relu,
        softmax_signed_loss,
        support_function,
    )

    a = np.ones((3, 2), dtype=np.float32)
    return {
        "mips_topk": (lambda x: mips_topk(x, torch.ones(4, 2)), "queries"),
        "rank_by_key": (lambda x: rank_by_key(torch.ones(3, 2), keys=x, k=1), "keys"),
        "support_function": (lambda x: support_function(x, torch.ones(4, 2)), "queries"),
        "amips_loss": (lambda x: amips_loss(torch.ones(3), torch.ones(3, 2), torch.ones(3),
                                            x), "true_key"),
        "soft_leaky_relu": (lambda x: soft_leaky_relu(x), "x"),
        "softmax_signed_loss": (lambda x: softmax_signed_loss(x, torch.ones(3, 2)), "logits"),
        "fit_linear_embeddings": (lambda x: fit_linear_embeddings(torch.ones(3, 2), x), "R"),
        "cur_query_weights": (lambda x: cur_query_weights(x[None], torch.ones(1, 3)), "C"),
        "greedy_selection": (lambda x: greedy_selection(x, 1), "X"),
        "log_mean_exp": (lambda x: log_mean_exp(x), "scores"),
        "softplus_dual_ratio": (lambda x: softplus_dual_ratio(x, torch.ones(3), 0.1), "scores"),
        "objective": (lambda x: objective(scores=x), "scores"),
    }, a


def test_public_tensor_functions_name_the_parameter_given_a_numpy_array():
    """A numpy array gave an AttributeError ('numel', 'detach') from deep inside."""
    calls, array = _public_tensor_calls()
    for name, (call, param) in calls.items():
        with pytest.raises(TypeError, match=rf"{name}: {param} must be a torch\.Tensor "
                                            rf"\(torch\.from_numpy\({param}\)\), got ndarray"):
            call(array)
        call(torch.from_numpy(array))  # the same call with a tensor runs


def test_optional_tensor_arguments_are_checked_when_given():
    """An optional tensor argument given as a list or a numpy array (``mask=[...]``) gave
    ``AttributeError: 'list' object has no attribute 'to'`` from deep inside; ``None``
    still means "not given"."""
    from mlpapers.optim import log_mean_exp, objective, softplus_dual_ratio
    from mlpapers.retrieval import cur_query_weights

    s = torch.zeros(2, 3)
    mask = [[True, True, False], [True, False, False]]
    calls = {
        "log_mean_exp": lambda m: log_mean_exp(s, mask=m),
        "objective": lambda m: objective(s, mask=m),
        "softplus_dual_ratio": lambda m: softplus_dual_ratio(s, torch.zeros(2), 0.1, mask=m),
    }
    for name, call in calls.items():
        for bad in (mask, np.asarray(mask)):
            with pytest.raises(TypeError, match=rf"{name}: mask must be a torch\.Tensor"):
                call(bad)
        assert torch.equal(call(torch.tensor(mask)), call(torch.tensor(mask)))
        call(None)
    C, u = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"cur_query_weights: gram must be a torch\.Tensor"):
        cur_query_weights(C, u, gram=(C @ C.mT).numpy())
    np.testing.assert_allclose(cur_query_weights(C, u, gram=C @ C.mT),
                               cur_query_weights(C, u), rtol=1e-8)
    assert float(log_mean_exp(s, mask=torch.tensor(mask))[1]) == 0.0


def test_pairwise_covering_array_covers_every_pair_and_is_deterministic():
    from tests._pairwise import covering_array, uncovered_pairs

    options = {"a": [0, 1, 2], "b": ["x", "y"], "c": [None, (1, 2), [3]], "d": [True, False]}
    rows = covering_array(options)
    assert uncovered_pairs(options, rows) == []
    assert rows == covering_array(options)
    assert len(rows) < 3 * 2 * 3 * 2                    # far fewer than the full product
    assert len(rows) >= 9                               # the two 3-valued options need 9
    assert uncovered_pairs(options, rows[1:]) != []     # the check can fail
    assert covering_array({"a": [1, 2]}) == [{"a": 1}, {"a": 2}]
    with pytest.raises(ValueError, match="no values"):
        covering_array({"a": [1, 2], "b": []})


def test_check_learning_rate_bounds_the_step_by_the_float32_maximum():
    from mlpapers._utils import check_learning_rate

    top = float(torch.finfo(torch.float32).max)
    assert check_learning_rate(top) == top
    assert check_learning_rate(3) == 3
    with pytest.raises(ValueError, match=r"step_size must be at most 3.403e\+38"):
        check_learning_rate(1e39, "step_size")
    with pytest.raises(ValueError, match="lr must be > 0"):
        check_learning_rate(0.0)
    with pytest.raises(TypeError, match="lr must be a real number"):
        check_learning_rate(True)
    # the bound is the one torch's optimisers enforce on float32 weights
    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.ones(2)
    torch.optim.SGD([w], lr=top).step()
    with pytest.raises(RuntimeError, match="overflow"):
        torch.optim.SGD([w], lr=1e39).step()


def test_encode_labels_maps_to_class_positions_and_names_unseen_labels():
    from mlpapers._utils import encode_labels

    classes = np.array([2, 5, 9])
    codes = encode_labels([9, 2, 5, 5], classes)
    assert codes.dtype == torch.long and codes.tolist() == [2, 0, 1, 1]
    # searchsorted alone maps 6 to class 9 and 10 past the end: both are refused by name
    with pytest.raises(ValueError, match=r"eval y contains labels not seen in y: \[ 6 10\]"):
        encode_labels([2, 6, 10], classes, name="eval y", seen_in="y")
    with pytest.raises(ValueError, match="labels not seen in fit"):
        encode_labels(np.array(["a"]), classes)  # another kind of label altogether
    assert encode_labels(np.array(["b", "a"]), np.array(["a", "b"])).tolist() == [1, 0]


def test_encode_labels_of_unorderable_labels_falls_back_to_lookups():
    from mlpapers._utils import encode_labels

    classes = np.array([None, 1, "a"], dtype=object)  # not orderable: no binary search
    assert encode_labels(np.array(["a", None, 1], dtype=object), classes).tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match=r"not seen in fit: \[2\]"):
        encode_labels(np.array([2, "a"], dtype=object), classes)


@pytest.mark.parametrize("value", [torch.tensor([1 + 2j]), np.array([1.0, 2j]), [1.0, 3j]])
def test_check_real_refuses_complex_tensors_arrays_and_lists_by_name(value):
    with pytest.raises(TypeError, match="spam must hold real numbers .*complex"):
        check_real(value, "spam")


@pytest.mark.parametrize("value", [torch.tensor([1, 2]), np.array([1.5, -2.0]), [1.0, 3.0],
                                   torch.tensor([True])])
def test_check_real_passes_real_values(value):
    assert check_real(value, "spam") is None


def test_power_of_two_units_is_the_scalar_rule_elementwise_and_never_above_amax():
    from mlpapers._utils import power_of_two_unit, power_of_two_units

    just_below = [2.0**k * (1 - 2.0**-53) for k in (40, 600, -600)]
    amax = np.array([0.0, 3.0, 1e-320, 7e40, 1e300, np.nan, np.inf, *just_below])
    units = power_of_two_units(amax, 30)
    assert units.shape == amax.shape
    assert list(units[[0, 1, 5, 6]]) == [1.0, 1.0, 1.0, 1.0]
    big = units != 1.0
    assert big.sum() == 6
    assert np.all(units[big] <= amax[big]) and np.all(amax[big] < 2 * units[big])
    assert np.all(np.frexp(units)[0] == 0.5)
    assert [power_of_two_unit(a, 30) for a in amax] == list(units)
