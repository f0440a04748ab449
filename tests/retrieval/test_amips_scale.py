"""Memory of amortized MIPS at user scale (10**5 - 10**6 keys or queries).

Peak resident memory is measured in a fresh interpreter (``tests._scale.peak_mb``).
"""

import math

import numpy as np
import torch

from mlpapers.retrieval.amips import _kernels as amips_kernels
from mlpapers.retrieval.amips._training import power_of_two_scale
from tests._scale import peak_mb, requires_peak_rss


def test_power_of_two_scale_is_the_float64_rms_rounded_to_a_power_of_two():
    # summed in row chunks now: the same value as the float64 definition
    rng = np.random.default_rng(0)
    for scale in (1e-30, 3.0, 1e25):
        x = (rng.standard_normal((70_000, 5)) * scale).astype(np.float32)
        rms = math.sqrt(np.mean(np.sum(x.astype(np.float64) ** 2, axis=1)))
        assert power_of_two_scale(torch.from_numpy(x)) == 2.0 ** round(math.log2(rms))
    assert power_of_two_scale(torch.zeros(3, 2)) == 1.0
    assert power_of_two_scale(torch.zeros(0, 2)) == 1.0


_SETUP = """
import numpy as np, torch
torch.set_num_threads(1)
from mlpapers.retrieval.amips import AmortizedMIPS
rng = np.random.default_rng(0)
{make}
"""


@requires_peak_rss
def test_fit_makes_no_float64_or_rescaled_copy_of_the_database():
    # The key scale was measured on a float64 copy of the keys and its square (4x the
    # float32 keys) and unit-norm keys were copied once more by a division by 1.0:
    # 4.2x the keys in all (214 MB for 51 MB of keys). Left: the search chunk of
    # batch_size=16 queries x n keys (12 MB, a quarter of the keys) and the network.
    n, d = 200_000, 64
    keys_mb = n * d * 4 / 2**20
    make = (f"keys = rng.standard_normal(({n}, {d})).astype(np.float32)\n"
            "keys /= np.linalg.norm(keys, axis=1, keepdims=True)\n"
            "small = AmortizedMIPS(n_steps=1, batch_size=16, hidden_dim=16, random_state=0)\n"
            "small.fit(keys[:500])  # warm-up: torch's lazy first-use allocations")
    call = "AmortizedMIPS(n_steps=1, batch_size=16, hidden_dim=16, random_state=0).fit(keys)"
    peak = peak_mb(_SETUP.format(make=make), call)
    # no full-size copy of the keys: 16 MB typical, 39 MB once in CI (the allocator
    # keeping a second search chunk), against 214 MB before
    bound = keys_mb
    assert peak < bound, (peak, bound)


@requires_peak_rss
def test_predict_key_holds_its_output_once():
    # the blocks' keys were kept in a list and concatenated: the (n, d) output twice
    # (2.2x the 51 MB of keys at n = 2 * 10**5); now written into one preallocated output
    n, d = 100_000, 64
    out_mb = n * d * 4 / 2**20
    make = ("keys = rng.standard_normal((500, 64)).astype(np.float32)\n"
            "est = AmortizedMIPS(n_steps=1, batch_size=64, hidden_dim=64, "
            "random_state=0).fit(keys)\n"
            f"Q = rng.standard_normal(({n}, {d})).astype(np.float32)")
    peak = peak_mb(_SETUP.format(make=make), "est.predict_key(Q)")
    bound = 1.3 * out_mb  # the output, and the network's blocks of 64 rows
    assert peak < bound, (peak, bound)


def test_gather_dot_is_chunk_independent(monkeypatch):
    # chunks of at most GATHER_ELEMENTS gathered entries: the same values as one
    # gather of every row (and the inner products of the definition, in float64)
    rng = np.random.default_rng(1)
    keys = torch.as_tensor(rng.standard_normal((300, 8)).astype(np.float32))
    Q = torch.as_tensor(rng.standard_normal((50, 8)).astype(np.float32))
    idx = torch.as_tensor(rng.integers(0, 300, size=(50, 7)))
    full = torch.einsum("nkd,nd->nk", keys[idx], Q)
    monkeypatch.setattr(amips_kernels, "GATHER_ELEMENTS", 3 * 7 * 8)
    assert torch.equal(amips_kernels.gather_dot(keys, idx, Q), full)
    ref = np.einsum("nkd,nd->nk", keys.double().numpy()[idx.numpy()], Q.double().numpy())
    np.testing.assert_allclose(full.numpy(), ref, rtol=1e-5, atol=1e-5)


@requires_peak_rss
def test_kneighbors_memory_grows_with_the_queries_not_a_256_mib_gather():
    # the true inner products of the returned keys were gathered in chunks of up to
    # 2**26 entries (256 MiB), and the predicted keys were rescaled into a copy:
    # 290 MB for 10**5 queries. Left: the predicted keys (n x d float32), the outputs
    # (n x k float32 + int64), a search chunk (8192 queries x 500 keys) and a gather
    # chunk (GATHER_ELEMENTS float32), with a 48 MB margin for the allocator (57 - 74 MB
    # measured against a 67 MB sum; the old code took 337 MB).
    n, d, k, n_keys = 100_000, 64, 10, 500
    make = (f"keys = rng.standard_normal(({n_keys}, {d})).astype(np.float32)\n"
            "est = AmortizedMIPS(n_steps=1, batch_size=64, hidden_dim=64, "
            "random_state=0).fit(keys)\n"
            f"Q = rng.standard_normal(({n}, {d})).astype(np.float32)")
    peak = peak_mb(_SETUP.format(make=make), f"est.kneighbors(Q, {k})")
    mib = 2**20
    bound = (n * d * 4 + n * k * 12 + 8192 * n_keys * 4
             + amips_kernels.GATHER_ELEMENTS * 4) / mib + 48
    assert peak < bound, (peak, bound)
