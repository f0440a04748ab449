"""CLoVE's clients stored back to back: the same draws and losses as padded clients."""

import pytest
import torch

from mlpapers.federated.clove._engine import ClientData, Engine, stack_states
from mlpapers.federated.clove._kernels import batch_pieces, epoch_permutations


def _padded_orders(sizes, generator):
    """The reference: one (n, m) draw of keys, padding sorted last, as one tensor."""
    m = int(sizes.max())
    keys = torch.rand(len(sizes), m, generator=generator, dtype=torch.float32)
    pad = torch.arange(m)[None, :] >= sizes[:, None]
    return keys.masked_fill(pad, 2.0).argsort(dim=1, stable=True)


@pytest.mark.parametrize("sizes", [[3, 1, 7, 2], [2**19, 5, 2**19 - 1, 1, 9]])
def test_epoch_orders_are_those_of_one_padded_draw(sizes):
    # the second case holds 2 clients per block of keys: three blocks drawn in turn give
    # the numbers of one (n, m) draw
    sizes = torch.tensor(sizes)
    flat = epoch_permutations(sizes, torch.Generator().manual_seed(5), torch.device("cpu"))
    ref = _padded_orders(sizes, torch.Generator().manual_seed(5))
    assert flat.shape == (int(sizes.sum()),)
    start = 0
    for i, n_i in enumerate(sizes.tolist()):
        order = flat[start:start + n_i]
        assert torch.equal(order, ref[i, :n_i])
        assert torch.equal(order.sort().values, torch.arange(n_i))  # a permutation
        start += n_i


def test_take_is_the_chosen_clients_back_to_back():
    g = torch.Generator().manual_seed(0)
    Xs = [torch.randn(s, 3, generator=g) for s in (4, 1, 6, 2)]
    Ys = [torch.randn(s, 2, generator=g) for s in (4, 1, 6, 2)]
    data = ClientData.from_lists(Xs, Ys, torch.device("cpu"))
    idx = [2, 0, 3]
    part = data.take(torch.tensor(idx))
    ref = ClientData.from_lists([Xs[i] for i in idx], [Ys[i] for i in idx],
                                torch.device("cpu"))
    for got, want in ((part.X, ref.X), (part.Y, ref.Y), (part.sizes, ref.sizes),
                      (part.offsets, ref.offsets)):
        assert torch.equal(got, want)
    for k, i in enumerate(idx):
        assert torch.equal(part.client(k)[0], Xs[i])
    assert data.take(torch.arange(4)) is data
    unsup = ClientData.from_lists(Xs, None, torch.device("cpu")).take(torch.tensor([1, 2]))
    assert unsup.Y is unsup.X


class _Transposed(torch.nn.Module):
    """A reconstruction returned transposed: checked by its size only."""

    def __init__(self, d, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x).T.contiguous()


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("vectorize", [True, False])
def test_a_model_without_one_row_per_input_row_is_scored_one_client_at_a_time(vectorize, d):
    # blocks of rows would mix the clients inside its output; each client alone is what
    # its training batches see, whatever the block size (with 2 features, a transposed
    # output of 2 rows has 2 rows too)
    sizes = [5, 2, 7]
    g = torch.Generator().manual_seed(1)
    Xs = [torch.randn(s, d, generator=g) for s in sizes]
    data = ClientData.from_lists(Xs, None, torch.device("cpu"))
    mods = [_Transposed(d, seed) for seed in (0, 1)]
    states = stack_states(mods)
    kw = dict(vectorize=vectorize, optimizer="sgd", lr=0.1, batch_size=None, local_epochs=1,
              user_model=True)
    for max_elements in (1, 10**9):
        got = Engine(_Transposed(d, 2), "reconstruction", max_elements=max_elements,
                     **kw).loss_matrix(states, data)
        with torch.no_grad():
            want = torch.tensor([[float((m(x).reshape(x.shape) - x).pow(2).mean())
                                  for m in mods] for x in Xs])
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_finite_mean_loss_stays_finite_when_its_float32_sum_overflows(vectorize):
    # 100 samples of loss 9e36 each: their float32 sum (9e38) overflows, their mean does
    # not; the sums are kept in float64
    template = torch.nn.Linear(1, 1)
    with torch.no_grad():
        template.weight.fill_(1.0)
        template.bias.zero_()
    X = torch.full((100, 1), 3e18)
    data = ClientData.from_lists([X], [torch.zeros(100, 1)], torch.device("cpu"))
    engine = Engine(template, "mse", vectorize=vectorize, optimizer="sgd", lr=0.1,
                    batch_size=None, local_epochs=1)
    L = engine.loss_matrix(stack_states([template]), data)
    assert torch.isfinite(L).all()
    assert float(L[0, 0]) == pytest.approx(9e36, rel=1e-6)


@pytest.mark.parametrize("lo, hi, budget", [(0, 9, 1000), (0, 9, 7), (2, 6, 5), (0, 9, 1),
                                            (4, 9, 3)])
def test_batch_pieces_cover_each_clients_slots_once_within_the_budget(lo, hi, budget):
    sizes = torch.tensor([9, 1, 4, 9, 6, 3, 9])
    seen = torch.zeros(len(sizes), hi, dtype=torch.long)
    pieces = list(batch_pieces(sizes, lo, hi, budget))
    for sel, c0, c1 in pieces:
        who = torch.arange(len(sizes)) if sel is None else sel
        assert lo <= c0 < c1 <= hi
        assert len(who) * (c1 - c0) <= budget or (len(who) == 1 or c1 - c0 == 1)
        if sel is not None:  # only clients with samples left; at most half filler slots
            assert bool((sizes[who] > c0).all())
            real = int((sizes[who].clamp(max=c1) - c0).sum())
            assert 2 * real >= len(who) * (c1 - c0)
        seen[who, c0:c1] += 1
    if len(sizes) * (hi - lo) <= budget:
        assert [p[0] for p in pieces] == [None]
    else:
        for i, n_i in enumerate(sizes.tolist()):
            want = torch.zeros(hi, dtype=torch.long)
            want[lo:min(hi, n_i)] = 1
            if n_i > lo:  # a busy client's filler slots: at most once
                want[n_i:] = seen[i, n_i:].clamp(max=1)
            assert torch.equal(seen[i], want)


def test_a_step_slightly_over_the_budget_runs_in_few_pieces():
    # a piece ended wherever any client ran out: 3000 clients of 20-299 samples, a step
    # of 100 slots 24% over the budget ran as 81 pieces (4x slower than one pass)
    sizes = torch.randint(20, 300, (3000,), generator=torch.Generator().manual_seed(0))
    pieces = list(batch_pieces(sizes, 0, 100, 241_398))
    assert len(pieces) <= 3


@pytest.mark.parametrize("optimizer, batch_size", [("adam", None), ("sgd", None),
                                                   ("adam", 4)])
def test_training_in_pieces_is_training_in_one_pass(optimizer, batch_size):
    # a step whose batch exceeds the element budget is summed over pieces (gradient
    # accumulation): the same update up to float rounding, and the loop's
    from mlpapers.federated.clove._models import build_module

    g = torch.Generator().manual_seed(3)
    sizes = [3, 40, 1, 17, 2]
    Xs = [torch.randn(s, 4, generator=g) for s in sizes]
    Ys = [torch.randn(s, 1, generator=g) for s in sizes]
    data = ClientData.from_lists(Xs, Ys, torch.device("cpu"))
    template = build_module("mlp", 4, 1, (8,), seed=0)
    states = stack_states([template])
    assignment = torch.zeros(len(sizes), dtype=torch.long)
    kw = dict(optimizer=optimizer, lr=0.05, batch_size=batch_size, local_epochs=2)
    out = {}
    for name, vectorize, max_elements in (("one pass", True, 10**9), ("pieces", True, 200),
                                          ("loop", False, 10**9)):
        engine = Engine(template, "mse", vectorize=vectorize, max_elements=max_elements, **kw)
        out[name] = engine.local_train(states, assignment, data,
                                       torch.Generator().manual_seed(0))
    for k in out["one pass"]:
        torch.testing.assert_close(out["pieces"][k], out["one pass"][k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out["loop"][k], out["one pass"][k], rtol=1e-5, atol=1e-6)


def test_a_model_without_one_row_per_input_row_trains_in_one_pass():
    # a piece would split the rows its output mixes: a budget of 8 rows for a client of
    # 9 samples changed the update by 17%
    g = torch.Generator().manual_seed(1)
    data = ClientData.from_lists([torch.randn(9, 3, generator=g), torch.randn(4, 3, generator=g)],
                                 None, torch.device("cpu"))
    states = stack_states([_Transposed(3, 0)])
    assignment = torch.zeros(2, dtype=torch.long)
    kw = dict(optimizer="sgd", lr=0.1, batch_size=None, local_epochs=1, user_model=True)
    out = [Engine(_Transposed(3, 0), "reconstruction", vectorize=True, max_elements=me, **kw)
           .local_train(states, assignment, data, torch.Generator().manual_seed(0))
           for me in (48, 10**9)]
    for k in out[0]:
        torch.testing.assert_close(out[0][k], out[1][k])
