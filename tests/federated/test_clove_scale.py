"""CLoVE at user scale: the loss matrix's memory is bounded by its element budget."""

import torch

from tests._scale import peak_mb, requires_peak_rss

# 40 clients x 500 samples of 10 features, 4 MLP models of width 512, a budget of
# 2^22 elements (16 MB of float32) for the loss matrix's intermediates
_ENGINE = """
import torch
from mlpapers.federated.clove._engine import ClientData, Engine, stack_states
from mlpapers.federated.clove._models import build_module
K, d, n, m = 4, 10, 40, 500
mods = [build_module("mlp", d, 1, (512,), seed=j) for j in range(K)]
states = stack_states(mods)
engine = Engine(mods[0], "mse", vectorize=True, optimizer="adam", lr=0.01, batch_size=100,
                local_epochs=1, max_elements=2 ** 22)
g = torch.Generator().manual_seed(0)
data = ClientData(torch.randn(n * m, d, generator=g), torch.randn(n * m, 1, generator=g),
                  torch.full((n,), m))
"""


@requires_peak_rss
def test_loss_matrix_memory_counts_the_model_activations():
    # The chunks of clients were sized by the input width alone (4 x 10 features per
    # sample), so a width-512 MLP held all 40 clients' activations at once:
    # 4 models x 40 x 500 x 1025 floats = 330 MB. Sized by the activations, a chunk
    # holds at most 2^22 elements (16 MB); bound: that, plus the 3 MB of data and room
    # for the allocator and vmap's temporaries.
    assert peak_mb(_ENGINE, "engine.loss_matrix(states, data)") < 64


def test_activation_elements_sums_the_leaf_outputs():
    from mlpapers.federated.clove._models import activation_elements

    net = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.ReLU(),
                              torch.nn.Sequential(torch.nn.Linear(7, 3), torch.nn.Tanh()))
    net.train()
    assert activation_elements(net, torch.zeros(5, 10)) == 7 + 7 + 3 + 3
    assert net.training  # probed in eval mode, flag restored


def test_chunked_loss_matrix_is_the_unchunked_one():
    from mlpapers.federated.clove._engine import ClientData, Engine, stack_states
    from mlpapers.federated.clove._models import build_module

    K, d, n, m = 3, 4, 9, 6
    mods = [build_module("mlp", d, 2, (16,), seed=j) for j in range(K)]
    states = stack_states(mods)
    g = torch.Generator().manual_seed(1)
    sizes = torch.tensor([6, 3, 5, 6, 1, 2, 6, 4, 6])
    mask = torch.arange(m)[None, :] < sizes[:, None]
    X, Y = torch.randn(n, m, d, generator=g), torch.randint(0, 2, (n, m), generator=g)
    data = ClientData(X[mask], Y[mask], sizes)  # the real rows, back to back
    kw = dict(vectorize=True, optimizer="adam", lr=0.01, batch_size=None, local_epochs=1)
    tiny = Engine(mods[0], "cross_entropy", max_elements=1, **kw)  # one row per block
    full = Engine(mods[0], "cross_entropy", max_elements=10 ** 12, **kw)
    loop = Engine(mods[0], "cross_entropy", **{**kw, "vectorize": False})
    torch.testing.assert_close(tiny.loss_matrix(states, data), full.loss_matrix(states, data))
    torch.testing.assert_close(tiny.loss_matrix(states, data), loop.loss_matrix(states, data))


_FITTED = """
import numpy as np
from mlpapers.datasets import make_federated_linear
from mlpapers.federated import CLoVE
clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=50,
                                      random_state=0)
clients = [(X, (y > 0).astype(int)) for X, y in clients]
est = CLoVE(n_clusters=2, n_rounds=1, model="mlp", hidden_layer_sizes=(512,),
            random_state=0).fit(clients)
X = np.random.default_rng(0).standard_normal((100000, clients[0][0].shape[1]))
X = X.astype(np.float32)
"""


@requires_peak_rss
def test_predict_memory_grows_with_the_output_only():
    # predict ran the MLP on all 100,000 rows at once: two 100,000 x 512 float32
    # activations (0.4 GB, growing with n). In blocks of 2^22 activation values: the
    # float32 copy of X (4 MB), the outputs (1 MB), a block's activations and the
    # matmul temporaries (2 x 16 MB), with room for the allocator.
    assert peak_mb(_FITTED, "est.predict(X, client=0); est.predict_proba(X, client=0)") < 100


def test_predict_in_blocks_is_the_model_on_all_rows(monkeypatch):
    import numpy as np

    from mlpapers.datasets import make_federated_linear
    from mlpapers.federated import CLoVE
    from mlpapers.federated.clove import _inference

    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=30, random_state=0)
    clients = [(X, (y > 0).astype(int)) for X, y in clients]
    est = CLoVE(n_clusters=2, n_rounds=1, model="mlp", hidden_layer_sizes=(8,),
                random_state=0).fit(clients)
    X = np.random.default_rng(1).standard_normal((103, clients[0][0].shape[1]))
    X = X.astype(np.float32)
    with torch.no_grad():
        logits = est.models_[1](torch.as_tensor(X))
    monkeypatch.setattr(_inference, "_PREDICT_ELEMENTS", 140)  # blocks of a few rows
    np.testing.assert_allclose(est.predict_proba(X, cluster=1),
                               torch.softmax(logits, 1).numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(est.predict(X, cluster=1),
                                  est.classes_[logits.argmax(1).numpy()])


def _fitted_mlp(n_samples=30):
    from mlpapers.datasets import make_federated_linear
    from mlpapers.federated import CLoVE

    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=n_samples, random_state=0)
    clients = [(X, (y > 0).astype(int)) for X, y in clients]
    return CLoVE(n_clusters=2, n_rounds=1, model="mlp", hidden_layer_sizes=(8,),
                 random_state=0).fit(clients), clients


def test_predict_neither_copies_nor_probes_the_fitted_models(monkeypatch):
    # predict counted the activations on a deep copy of the fitted model at every call:
    # a model holding a lock could no longer predict, and the user's hooks saw an extra
    # one-row call. The count is taken once, on the library's template, at fit and load.
    import threading

    import numpy as np

    from mlpapers.federated.clove import _inference

    est, clients = _fitted_mlp()
    X = clients[0][0][:7].astype(np.float32)
    est.models_[1].lock = threading.Lock()
    seen = []
    est.models_[1][0].register_forward_hook(lambda m, i, o: seen.append(o.shape[0]))
    monkeypatch.setattr(_inference, "_PREDICT_ELEMENTS", 3 * est._predict_row_elements)
    est.predict(X, cluster=1)
    assert seen == [3, 3, 1]  # blocks of 3 rows, nothing else


def test_models_without_one_output_row_per_input_row_run_on_all_rows(monkeypatch):
    # a reconstruction is checked by its size only: a model returning its output
    # transposed was reshaped block by block into different rows

    from mlpapers.federated.clove import _inference

    class Transposed(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.lin = torch.nn.Linear(d, d)

        def forward(self, x):
            return self.lin(x).T.contiguous()

    model = Transposed(3)
    X = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(X).reshape(10, -1)
    monkeypatch.setattr(_inference, "_PREDICT_ELEMENTS", 4 * 6)  # blocks of 4 rows
    assert torch.equal(_inference._forward_in_blocks(model, X, 6), whole)
    flat = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Flatten(0))
    with torch.no_grad():
        whole = flat(X).reshape(10, -1)
    assert torch.equal(_inference._forward_in_blocks(flat, X, 6), whole)


# one client far larger than the others: memory follows the clients' total size
_ONE_LARGE = """
import numpy as np
from mlpapers.federated import CLoVE
rng = np.random.default_rng(0)
clients = [(rng.standard_normal((20, 10)).astype(np.float32), rng.standard_normal(20))
           for _ in range(100)]
clients.append((rng.standard_normal((40000, 10)).astype(np.float32),
                rng.standard_normal(40000)))
est = CLoVE(n_clusters=2, n_rounds=1, model="linear", random_state=0)
"""


@requires_peak_rss
def test_fit_memory_follows_the_total_size_not_the_largest_client():
    # every client was padded to the largest one: 101 x 40,000 x 10 float32 for X and
    # again for y, plus the (101, 40,000) sort keys of every epoch (467 MB in all). Back
    # to back the data are 1.7 MB; a tiny fit's own start-up (vmap, allocator) is about
    # 50 MB of the bound (87 MB measured).
    assert peak_mb(_ONE_LARGE, "est.fit(clients)") < 200


_LARGE_LOSS = _ENGINE.replace("K, d, n, m = 4, 10, 40, 500", "K, d, n, m = 2, 10, 1, 50000")


@requires_peak_rss
def test_loss_matrix_memory_is_bounded_for_a_client_larger_than_a_block():
    # a block held at least one whole client: 2 models x 50,000 rows x (512 + 513)
    # activations of the width-512 MLP (395 MB measured); in blocks of rows of all
    # clients it is the 2^22-element bound (16 MB) plus the 2 MB of data (47 MB measured)
    assert peak_mb(_LARGE_LOSS, "engine.loss_matrix(states, data)") < 100


@requires_peak_rss
def test_assign_memory_is_bounded_for_a_large_client():
    # assign ran each model on all 100,000 rows at once (399 MB measured through the
    # width-512 MLP); now in predict's blocks of 2^22 activation values (21 MB measured)
    setup = _FITTED + "y = np.zeros(len(X), dtype=np.float32)\n"
    assert peak_mb(setup.replace("(X, (y > 0).astype(int))", "(X, y)"),
                   "est.assign(X, y)") < 100


@requires_peak_rss
def test_full_batch_training_memory_follows_the_total_size():
    # batch_size=None made every vectorised step a (201, 80,000) batch, each client
    # filled up to the largest one (1.2 GB measured); in pieces that end where the small
    # clients run out, the large one trains alone (100 MB measured, 93 MB for the
    # per-client loop)
    setup = """
import numpy as np
from mlpapers.federated import IFCA
rng = np.random.default_rng(0)
clients = [(rng.normal(size=(s, 10)).astype(np.float32), rng.normal(size=s))
           for s in [20] * 200 + [80000]]
est = IFCA(n_clusters=2, model="linear", batch_size=None, n_rounds=1, vectorize=True,
           random_state=0)
"""
    assert peak_mb(setup, "est.fit(clients)") < 250
