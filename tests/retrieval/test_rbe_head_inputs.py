"""Inputs of the public neural RBE head: clear errors instead of torch's matmul traces."""

import pytest
import torch

from mlpapers.retrieval.rbe import NeuralRBEHead


def _head(k=2, n_items=5, hidden=4):
    g = torch.Generator().manual_seed(0)
    E = torch.randn(n_items, k, generator=g)
    return NeuralRBEHead(E, torch.zeros(n_items), torch.rand(n_items, generator=g),
                         torch.zeros(k), torch.ones(k), hidden, generator=g)


@pytest.mark.parametrize("u", [torch.randn(3, 3), torch.randn(3), torch.randn(2, 3, 2)])
def test_queries_of_the_wrong_shape_name_u_and_k(u):
    head = _head()
    for score in (head, head.all_items_scorer()):
        with pytest.raises(ValueError, match=r"u must be a Tensor of shape \(n, 2\)"):
            score(u)


def test_queries_of_another_dtype_or_type_are_refused():
    head = _head()
    with pytest.raises(TypeError, match="u must have the head's dtype torch.float32"):
        head(torch.randn(3, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="u must be a Tensor"):
        head([[1.0, 2.0]])


@pytest.mark.parametrize("items", [torch.tensor([1.0]), [1, 2], torch.tensor([[1]])])
def test_items_must_be_a_1d_integer_tensor(items):
    with pytest.raises(TypeError, match="items must be a 1-D LongTensor"):
        _head()(torch.randn(3, 2), items)


def test_valid_calls_still_score_the_chosen_items():
    head = _head()
    u = torch.randn(3, 2)
    items = torch.tensor([4, 0, 4])
    full = head(u)
    torch.testing.assert_close(head(u, items), full[:, items])
    torch.testing.assert_close(head.all_items_scorer()(u), full)


@pytest.mark.parametrize("shape", [(5, 0), (0, 2)])
def test_a_head_without_items_or_supports_is_refused(shape):
    with pytest.raises(ValueError, match="at least one item and one support column"):
        NeuralRBEHead(torch.zeros(shape), torch.zeros(shape[0]), torch.zeros(shape[0]),
                      torch.zeros(shape[1]), torch.ones(shape[1]), 4)


def _parts(k=2, n_items=5):
    g = torch.Generator().manual_seed(0)
    return {"embeddings": torch.randn(n_items, k, generator=g), "offsets": torch.zeros(n_items),
            "popularity": torch.rand(n_items, generator=g), "query_mean": torch.zeros(k),
            "query_scale": torch.ones(k)}


@pytest.mark.parametrize("name", ["embeddings", "offsets", "popularity", "query_mean"])
def test_non_finite_or_integer_inputs_name_the_parameter(name):
    # NaN inputs gave NaN scores for every item without an error; integer ones failed in
    # torch's mean / std / requires_grad with messages naming no parameter
    bad = _parts()
    bad[name] = bad[name].clone()
    bad[name].view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match=f"{name} must hold finite values"):
        NeuralRBEHead(*bad.values(), 4)
    ints = _parts()
    ints[name] = ints[name].long()
    with pytest.raises(TypeError, match=f"{name} must be a floating tensor"):
        NeuralRBEHead(*ints.values(), 4)


@pytest.mark.parametrize("items", [torch.tensor([-1]), torch.tensor([0, 5])])
def test_item_indices_outside_the_catalogue_are_refused(items):
    # -1 scored the last item (negative indexing), silently
    head = NeuralRBEHead(*_parts().values(), 0)
    with pytest.raises(ValueError, match=r"items must be indices in \[0, 5\)"):
        head(torch.randn(2, 2), items)
    assert head(torch.randn(2, 2), torch.tensor([4, 0])).shape == (2, 2)
