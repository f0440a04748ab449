"""EntropicRiskLoss inside the user's own training loop, and the functional dual updates
applied to the user's tensors: modes, dtypes, autocast, state, and what is mutated."""

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    asgd_update,
    sox_update,
    spmd_update,
    umax_update,
)

METHODS = ["scent", "sox", "asgd", "umax", "asgd_softplus"]


def _scores(shape=(4, 8), shift=0.0, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) + shift


def _plug_in(scores, tau=1.0):
    """tau * mean_i log mean_j exp(s_ij / tau), in float64 from the definition."""
    s = scores.detach().double() / tau
    return float(tau * (torch.logsumexp(s, 1) - np.log(s.shape[1])).mean())


# -- half precision / autocast (regression) ------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_half_precision_scores_are_computed_in_float32(dtype, method):
    # Regression: float16/bfloat16 scores were processed in their own dtype: in float16
    # exp(s - nu) overflowed once a dual lagged its scores by ~11 (asgd: an inf gradient
    # where float32 gives a finite one), and bfloat16 rounded L, so the float64 dual
    # table moved by ~3e-2 from the update of the very same score values.
    low = _scores(shift=12.0).to(dtype)
    idx = torch.arange(4)
    ref = EntropicRiskLoss(4, method=method, nu_init=0.0, log_alpha=-12.0)
    got = EntropicRiskLoss(4, method=method, nu_init=0.0, log_alpha=-12.0)
    s32 = low.float().requires_grad_(True)   # the same values, widened by the user
    slo = low.clone().requires_grad_(True)
    ref(s32, idx).backward()
    out = got(slo, idx)
    out.backward()
    assert out.dtype == torch.float32  # as torch's losses under autocast
    torch.testing.assert_close(got.nu, ref.nu, rtol=0, atol=0)
    assert bool(torch.isfinite(slo.grad).all())
    # the gradient is the float32 one rounded once to the scores' dtype
    torch.testing.assert_close(slo.grad, s32.grad.to(dtype), rtol=0, atol=0)


def test_autocast_bfloat16_user_model_trains_and_updates_like_float32_scores():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 6))
    x, idx = torch.randn(8, 5), torch.arange(10, 18)
    loss_fn = EntropicRiskLoss(20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = model(x)
        loss = loss_fn(scores, idx)
    assert scores.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert loss_fn.nu.dtype == torch.float64
    ref = EntropicRiskLoss(20)
    ref(scores.detach().float(), idx)
    torch.testing.assert_close(loss_fn.nu, ref.nu, rtol=0, atol=0)


# -- train / eval modes (regression) ---------------------------------------------------
@pytest.mark.parametrize("method", METHODS + ["bsgd"])
def test_eval_mode_neither_reads_nor_writes_the_dual_table(method):
    # Regression: a validation pass in eval mode (indices of the validation set, which
    # overlap the training indices) overwrote the training duals of those anchors.
    train = EntropicRiskLoss(10, method=method)
    train(_scores(seed=1), torch.tensor([0, 2, 4, 6]))
    nu, init = train.nu.clone(), train.initialized.clone()
    train.eval()
    val = _scores(seed=2) * 3.0
    with torch.no_grad():
        out = train(val, torch.tensor([0, 1, 2, 3]))
    torch.testing.assert_close(train.nu, nu, rtol=0, atol=0)
    assert torch.equal(train.initialized, init)
    # the exact mini-batch risk, whatever the table holds
    assert float(out) == pytest.approx(_plug_in(val), rel=1e-6)
    fresh = EntropicRiskLoss(10, method=method).eval()
    assert float(fresh(val, torch.tensor([0, 1, 2, 3]))) == float(out)
    # rows do not interact: the batch value is the mean of the rows' values
    rows = [float(fresh(val[i:i + 1], torch.tensor([i]))) for i in range(4)]
    assert float(out) == pytest.approx(np.mean(rows), rel=1e-6)
    train.train()  # back in training mode, the updates resume
    train(val, torch.tensor([0, 1, 2, 3]))
    if method != "bsgd":
        assert bool(train.initialized[[1, 3]].all())


def test_float16_loss_beyond_float16_range_is_finite_and_scales():
    # the loss of a dual lagging its scores by ~12 is ~1.6e5: beyond float16's 65504, so a
    # loss returned in float16 read inf
    low = _scores(shift=12.0).half()
    loss_fn = EntropicRiskLoss(4, method="asgd", nu_init=0.0, log_alpha=-12.0)
    out = loss_fn(low, torch.arange(4))
    assert float(out) > torch.finfo(torch.float16).max and bool(torch.isfinite(out))
    # GradScaler's default scale (65536) times a float16 loss of order 1 is inf in float16,
    # so every scaled gradient was inf; in float32 the scaled gradient is finite
    s16 = _scores().half().requires_grad_(True)
    (EntropicRiskLoss(4)(s16, torch.arange(4)) * 65536.0).backward()
    assert bool(torch.isfinite(s16.grad).all())


def test_eval_mode_takes_indices_outside_the_training_anchors():
    # eval mode never reads the table, so a validation set's own indices (beyond
    # n_anchors, repeated) are accepted; training mode still checks them
    loss_fn = EntropicRiskLoss(4).eval()
    val = _scores(seed=3)[:3]
    out = loss_fn(val, torch.tensor([10, 11, 11]))
    assert float(out) == pytest.approx(_plug_in(val), rel=1e-6)
    with pytest.raises(TypeError, match="index"):
        loss_fn(val, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"index must have shape \(3,\)"):
        loss_fn(val, torch.tensor([0, 1]))
    loss_fn.train()
    with pytest.raises(ValueError, match="must lie in"):
        loss_fn(val, torch.tensor([10, 11, 12]))


def test_model_eval_propagates_to_a_loss_held_by_the_model():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 5)
            self.criterion = EntropicRiskLoss(6)

    net = Net()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    net.criterion(net.lin(x), torch.arange(4))
    before = net.criterion.nu.clone()
    net.eval()
    with torch.no_grad():
        net.criterion(net.lin(x) + 5.0, torch.arange(4))
    torch.testing.assert_close(net.criterion.nu, before, rtol=0, atol=0)


def test_train_mode_updates_also_under_no_grad_as_documented():
    loss_fn = EntropicRiskLoss(4)
    with torch.no_grad():
        out = loss_fn(_scores(), torch.arange(4))
    assert not out.requires_grad
    assert bool(loss_fn.initialized.all())


# -- the user's scores and indices -----------------------------------------------------
def test_gradient_through_a_user_model_is_the_scent_direction():
    # d loss / d s_ij = exp(s_ij / tau - nu_i) / (B k), nu the updated dual (float64 ref)
    tau = 0.7
    s = _scores(seed=3).double().requires_grad_(True)
    loss_fn = EntropicRiskLoss(4, temperature=tau, nu_init=0.5, log_alpha=0.0)
    loss_fn(s, torch.arange(4)).backward()
    want = torch.exp(s.detach() / tau - loss_fn.nu[:, None]) / s.numel()
    torch.testing.assert_close(s.grad, want, rtol=1e-12, atol=0)


def test_scores_are_not_modified_and_may_be_modified_after_the_call():
    s = _scores().requires_grad_(True)
    work = s * 1.0
    before = work.detach().clone()
    loss = EntropicRiskLoss(4)(work, torch.arange(4))
    torch.testing.assert_close(work.detach(), before, rtol=0, atol=0)
    ref = s.detach().clone().requires_grad_(True)
    EntropicRiskLoss(4)(ref * 1.0, torch.arange(4)).backward()
    with torch.no_grad():
        work.add_(100.0)  # the user's in-place change after the forward
    loss.backward()
    torch.testing.assert_close(s.grad, ref.grad, rtol=0, atol=0)


@pytest.mark.parametrize("index", [
    np.array([7, 1, 4], dtype=np.int32), [7, 1, 4], torch.tensor([7, 1, 4], dtype=torch.int32),
    np.array([7, 1, 4], dtype=np.uint8)])
def test_user_sample_ids_of_any_integer_type_index_the_same_duals(index):
    s = _scores((3, 5))
    ref = EntropicRiskLoss(9)
    ref(s, torch.tensor([7, 1, 4]))
    got = EntropicRiskLoss(9)
    got(s, index)
    torch.testing.assert_close(got.nu, ref.nu, rtol=0, atol=0)
    assert got.initialized.nonzero().flatten().tolist() == [1, 4, 7]


def test_float_or_repeated_sample_ids_are_rejected():
    with pytest.raises(TypeError, match="index must hold integers"):
        EntropicRiskLoss(9)(_scores((3, 5)), torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="repeat"):
        EntropicRiskLoss(9)(_scores((3, 5)), [1, 1, 2])


# -- state -------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_state_dict_pickle_and_deepcopy_resume_identically(method):
    loss_fn = EntropicRiskLoss(12, method=method, log_alpha=0.3)
    loss_fn(_scores(seed=4), torch.tensor([0, 5, 6, 11]))
    buf = io.BytesIO()
    torch.save(loss_fn.state_dict(), buf)
    buf.seek(0)
    from_sd = EntropicRiskLoss(12, method=method, log_alpha=0.3)
    from_sd.load_state_dict(torch.load(buf, weights_only=True))
    copies = [from_sd, pickle.loads(pickle.dumps(loss_fn)), copy.deepcopy(loss_fn)]
    nxt, idx = _scores(seed=5), torch.tensor([5, 1, 11, 3])
    want = loss_fn(nxt, idx)
    for c in copies:
        assert c.nu.dtype == torch.float64
        torch.testing.assert_close(c(nxt, idx), want, rtol=0, atol=0)
        torch.testing.assert_close(c.nu, loss_fn.nu, rtol=0, atol=0)
        assert torch.equal(c.initialized, loss_fn.initialized)


def test_double_keeps_the_table_and_gives_float64_losses():
    loss_fn = EntropicRiskLoss(4)
    loss_fn(_scores(), torch.arange(4))
    nu = loss_fn.nu.clone()
    moved = copy.deepcopy(loss_fn).double()
    torch.testing.assert_close(moved.nu, nu, rtol=0, atol=0)
    out = moved(_scores(seed=1).double(), torch.arange(4))
    assert out.dtype == torch.float64


# -- functional updates on user tensors --------------------------------------------------
UPDATES = [(spmd_update, (0.3,)), (sox_update, (0.5,)), (asgd_update, (0.1,)),
           (umax_update, (0.1, 1.0))]


@pytest.mark.parametrize("fn,args", UPDATES, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("convert", [lambda t: t.to(torch.int64), lambda t: t.tolist(),
                                     lambda t: t.numpy().astype(np.int32)])
def test_updates_take_integer_tensors_lists_and_arrays(fn, args, convert):
    # Regression: integer nu turned gamma / dual_lr into integers (0.5 -> 0, 0.1 -> 0):
    # sox_update and asgd_update silently returned nu unchanged; lists and arrays
    # failed with "'list' object has no attribute 'device'" (spmd_update took them)
    nu = torch.tensor([0.0, 1.0, -2.0])
    L = torch.tensor([2.0, 2.0, 0.5])
    want = fn(nu, L, *args)
    got = fn(convert(nu), L, *args)
    assert got.is_floating_point()
    torch.testing.assert_close(got.to(want.dtype), want, rtol=0, atol=0)


@pytest.mark.parametrize("fn,args", UPDATES, ids=lambda v: getattr(v, "__name__", ""))
def test_updates_neither_mutate_nor_alias_nor_track_their_inputs(fn, args):
    nu = torch.tensor([0.0, 1.0, 3.0], requires_grad=True)
    L = torch.tensor([2.0, 1.0, 0.5], requires_grad=True)
    nu0, L0 = nu.detach().clone(), L.detach().clone()
    out = fn(nu, L, *args)
    assert not out.requires_grad
    assert out.data_ptr() not in (nu.data_ptr(), L.data_ptr())
    out.add_(1.0)  # the caller may change the result in place
    torch.testing.assert_close(nu.detach(), nu0, rtol=0, atol=0)
    torch.testing.assert_close(L.detach(), L0, rtol=0, atol=0)


@pytest.mark.parametrize("fn,args", UPDATES, ids=lambda v: getattr(v, "__name__", ""))
def test_updates_reject_mismatched_shapes_naming_them(fn, args):
    with pytest.raises(ValueError, match="broadcastable"):
        fn(torch.zeros(3), torch.zeros(2), *args)


def test_sox_update_with_gamma_one_has_the_general_dtype_and_shape():
    # Regression: gamma = 1 returned L itself (a copy): float32 L with float64 nu came
    # back float32, a scalar L with (B,) nu a scalar, unlike any gamma < 1
    nu = torch.zeros(3, dtype=torch.float64)
    L = torch.tensor(2.0)
    for gamma in (1.0, 0.999):
        out = sox_update(nu, L, gamma)
        assert out.dtype == torch.float64 and out.shape == (3,)
    torch.testing.assert_close(sox_update(nu, L, 1.0), torch.full((3,), 2.0, dtype=torch.float64))


@pytest.mark.parametrize("update", [lambda nu, L: sox_update(nu, L, 0.9),
                                    lambda nu, L: asgd_update(nu, L, 0.9),
                                    lambda nu, L: umax_update(nu, L, 0.9, 0.5)])
def test_integer_nu_beside_float64_values_is_not_rounded_to_float32(update):
    # integers and lists take the other argument's floating dtype: an integer nu beside a
    # float64 log-mean-exp was converted to float32 first, off by ~3e-8 from float64
    lme = torch.tensor([0.1, 1.3, -2.7], dtype=torch.float64)
    nu_int = torch.tensor([0, 1, -2])
    got = update(nu_int, lme)
    want = update(nu_int.to(torch.float64), lme)
    assert got.dtype == torch.float64
    assert torch.equal(got, want)
    assert torch.equal(update([0, 1, -2], lme), want)


def test_python_floats_and_float_lists_take_the_tensors_dtype():
    # torch.as_tensor(0.1) is float32: beside float64 values it was rounded first
    lme = torch.tensor([0.1, 1.3, -2.7], dtype=torch.float64)
    want = sox_update(torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), lme, 0.9)
    got = sox_update([0.1, 0.2, 0.3], lme, 0.9)
    assert got.dtype == torch.float64 and torch.equal(got, want)
    scalar = asgd_update(0.1, lme, 0.5)
    assert torch.equal(scalar, asgd_update(torch.full((3,), 0.1, dtype=torch.float64), lme,
                                           0.5))
    # a numpy array keeps its own dtype (float32 stays float32, then promotes)
    assert sox_update(np.zeros(3, np.float32), lme, 0.9).dtype == torch.float64
