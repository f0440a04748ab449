"""Tensors numpy cannot read, wherever a signature says ``ArrayLike`` (tensors welcome).

``np.asarray`` refuses a tensor that requires grad ("Can't call numpy() on Tensor that
requires grad"), a bfloat16 tensor ("Got unsupported ScalarType BFloat16") and a CUDA
tensor ("can't convert cuda:0 device type tensor"): each public argument that may be a
tensor goes through ``to_numpy`` (or the estimator's validation) instead. Requires-grad
and bfloat16 reach the same ``Tensor.__array__`` refusal as CUDA, so they stand for it
on a machine without a GPU.

The first tests pin the arguments found broken. The sweep at the end is a coarser net:
it reads the annotations of the estimators' main methods and gives the float data
arguments it has values for (``X``, ``y``, ...: not ``sample_weight``, ``eval_set`` or
integer-only arguments) as tensors that require grad, comparing with the numpy call.
"""

import inspect
import typing
import warnings

import numpy as np
import pytest
import torch

from mlpapers.anomaly import PatchCoreDetector, RADDetector, RandomConvExtractor
from mlpapers.datasets import make_federated_linear
from mlpapers.decentralized import (
    BottleneckNodeAssigner,
    DecentralizedSGD,
    bottleneck_tsp,
    is_biconnected,
    make_delay_matrix,
    multiplier_relabel,
)
from mlpapers.federated import IFCA, CLoVE
from mlpapers.optim import (
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
)
from mlpapers.retrieval import (
    AdaCURRetriever,
    AmortizedMIPS,
    AnnCURRetriever,
    ExactMIPS,
    RelevanceBasedRetriever,
)
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _unreadable(a, kind):
    """``a`` as a tensor numpy cannot read, and the numpy array that holds its values."""
    a = np.asarray(a)
    if kind == "requires_grad":  # float, since integer tensors cannot require grad
        return torch.tensor(a, dtype=torch.float64, requires_grad=True), a.astype(np.float64)
    if kind == "bfloat16":
        t = torch.tensor(a, dtype=torch.float32).bfloat16()
        return t, t.float().numpy()  # the values it holds: what numpy is given
    assert kind == "cuda"
    return torch.tensor(a, device="cuda"), a


_KINDS = ["requires_grad", "bfloat16", pytest.param("cuda", marks=_CUDA)]


@pytest.fixture(scope="module")
def delays():
    D = make_delay_matrix(8, random_state=0)
    return D, bottleneck_tsp(D, random_state=0)[0]


# --- decentralized: permutations, adjacency matrices and node labels -------------------

@pytest.mark.parametrize("kind", _KINDS)
def test_multiplier_relabel_assignment_tensor(delays, kind):
    _, perm = delays
    t, ref = _unreadable(perm, kind)
    np.testing.assert_array_equal(multiplier_relabel(t, 3), multiplier_relabel(ref, 3))


@pytest.mark.parametrize("kind", _KINDS)
def test_is_biconnected_adjacency_tensor(delays, kind):
    D, _ = delays
    for adjacency in ((D < 60).astype(float), np.roll(np.eye(5), 1, axis=1),
                      np.roll(np.eye(5), 1, axis=1)[:4, :4]):
        t, ref = _unreadable(adjacency, kind)
        assert is_biconnected(t) is is_biconnected(ref)


def _dsgd_probs(delays_matrix, X, y, assignment):
    clf = DecentralizedSGD(delays=delays_matrix, assignment=assignment, n_rounds=3,
                           random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return clf.fit(X, y).predict_proba(X)


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 3))
    return X, (X[:, 0] > 0).astype(int)


@pytest.mark.parametrize("kind", _KINDS)
def test_decentralized_sgd_assignment_tensor(delays, xy, kind):
    D, perm = delays
    t, ref = _unreadable(perm, kind)
    np.testing.assert_array_equal(_dsgd_probs(D, *xy, assignment=t),
                                  _dsgd_probs(D, *xy, assignment=ref))


def _dsgd_fit_nodes(D, X, y, nodes):
    clf = DecentralizedSGD(delays=D, n_rounds=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return clf.fit(X, y, nodes=nodes).predict_proba(X)


@pytest.mark.parametrize("shards", [False, True], ids=["labels", "shards"])
@pytest.mark.parametrize("kind", _KINDS)
def test_decentralized_sgd_fit_nodes_tensor(delays, xy, kind, shards):
    D, _ = delays
    labels = np.arange(len(xy[0])) % 8
    value = [np.flatnonzero(labels == k) for k in range(8)] if shards else labels
    as_tensor = (lambda a: [_unreadable(s, kind)[0] for s in a]) if shards else \
        (lambda a: _unreadable(a, kind)[0])
    if kind == "cuda":  # integer labels: the same fit as from numpy
        np.testing.assert_array_equal(_dsgd_fit_nodes(D, *xy, as_tensor(value)),
                                      _dsgd_fit_nodes(D, *xy, value))
        return
    # float tensors hold no integer labels: the documented ValueError, as for float
    # numpy arrays (it was numpy's RuntimeError/TypeError from inside)
    with pytest.raises(ValueError, match="nodes"):
        _dsgd_fit_nodes(D, *xy, [np.asarray(s, dtype=float) for s in value] if shards
                        else value.astype(float))
    with pytest.raises(ValueError, match="nodes"):
        _dsgd_fit_nodes(D, *xy, as_tensor(value))


# --- optim: the classes of SCENTClassifier.partial_fit ---------------------------------

@pytest.mark.parametrize("call", ["first", "later"])
@pytest.mark.parametrize("kind", _KINDS)
def test_scent_partial_fit_classes_tensor(xy, kind, call):
    X, _ = xy
    y = np.arange(len(X)) % 3
    t, ref = _unreadable(np.arange(3), kind)

    def run(classes):
        clf = SCENTClassifier(n_negatives=2, epochs=1, batch_size=16, random_state=0)
        if call == "later":
            clf.partial_fit(X, y, classes=np.arange(3))
        return clf.partial_fit(X, y, classes=classes).decision_function(X)

    np.testing.assert_array_equal(run(t), run(ref))


# --- anomaly: RAD's layer weights and lists of image tensors ---------------------------

_IMAGES = np.random.default_rng(0).random((3, 16, 16, 3)).astype(np.float32)


@pytest.mark.parametrize("kind", _KINDS)
def test_rad_layer_weights_tensor(kind):
    # learned fusion weights (an nn.Parameter requires grad) given as layer_weights
    t, ref = _unreadable([1.0, 2.0], kind)

    def scores(weights):
        det = RADDetector(extractor="random", k_images=2, image_size=16, layer_weights=weights,
                          random_state=0)
        return det.fit(_IMAGES).decision_function(_IMAGES)

    np.testing.assert_array_equal(scores(t), scores(ref))


@pytest.mark.parametrize("kind", ["bfloat16", "float16"])
def test_rad_list_of_half_precision_image_tensors(kind):
    # a list of images, each a tensor: its items were read with Tensor.numpy(), which
    # refuses bfloat16 (a batch tensor of the same images was accepted)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[kind]
    batch = torch.from_numpy(_IMAGES).to(dtype)
    det = RADDetector(extractor="random", k_images=2, image_size=16, random_state=0)
    det.fit(_IMAGES)
    np.testing.assert_array_equal(det.decision_function(list(batch)),
                                  det.decision_function(batch))


# --- the sweep: every ArrayLike argument of the estimators' main methods ---------------

_METHODS = ("fit", "partial_fit", "predict", "predict_proba", "predict_log_proba",
            "decision_function", "transform", "score", "score_samples", "kneighbors",
            "objective", "value", "predict_key", "bcd", "anomaly_map", "assign")


def _heavy(q, i):
    return np.tanh(np.asarray(q) @ np.asarray(i).T)


def _sweep_cases():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(24, 3))
    y3, y2 = np.arange(24) % 3, (X[:, 0] > 0).astype(int)
    keys, Q = rng.standard_normal((16, 3)), rng.standard_normal((5, 3))
    D = make_delay_matrix(8, random_state=0)
    images = rng.random((4, 32, 32, 3)).astype(np.float32)
    chw = rng.random((8, 1, 8, 8)).astype(np.float32)
    clients, truth, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                              n_samples=20, n_features=3, random_state=0)
    fast = dict(random_state=0)
    federated = dict(fit=dict(clients=clients, cluster_labels=truth), X=clients[0][0],
                     y=clients[0][1], client=0)
    return {
        "CLoVE": (lambda: CLoVE(n_clusters=2, n_rounds=2, local_epochs=2, **fast), federated),
        "IFCA": (lambda: IFCA(n_clusters=2, n_rounds=2, local_epochs=2, **fast), federated),
        "SCENTClassifier": (lambda: SCENTClassifier(n_negatives=2, epochs=1, batch_size=8,
                                                    **fast), dict(X=X, y=y3)),
        "KLDROClassifier": (lambda: KLDROClassifier(epochs=1, **fast), dict(X=X, y=y3)),
        "KLDRORegressor": (lambda: KLDRORegressor(epochs=1, **fast), dict(X=X, y=X[:, 0])),
        "PartialAUCClassifier": (lambda: PartialAUCClassifier(epochs=1, **fast),
                                 dict(X=X, y=y2)),
        "DecentralizedSGD": (lambda: DecentralizedSGD(delays=D, n_rounds=2, **fast),
                             dict(X=X, y=y2)),
        "BottleneckNodeAssigner": (lambda: BottleneckNodeAssigner(**fast), dict(delays=D)),
        "ExactMIPS": (lambda: ExactMIPS(), dict(X=keys, fit=dict(X=keys), query=Q)),
        "AmortizedMIPS": (lambda: AmortizedMIPS(depth=2, hidden_dim=8, n_steps=2,
                                                batch_size=16, **fast),
                          dict(X=keys, queries=Q, query=Q)),
        "RelevanceBasedRetriever": (
            lambda: RelevanceBasedRetriever(_heavy, n_support=4, n_rerank=3, **fast),
            dict(fit=dict(train_queries=X[:12], items=keys, relevance_matrix=_heavy(X[:12], keys)),
                 query=Q, relevance=_heavy(Q, keys), n_neighbors=3)),
        "AnnCURRetriever": (lambda: AnnCURRetriever(_heavy, n_support=4, **fast),
                            dict(fit=dict(train_queries=X[:12], items=keys,
                                          relevance_matrix=_heavy(X[:12], keys)),
                                 query=Q, relevance=_heavy(Q, keys), n_neighbors=3)),
        "AdaCURRetriever": (lambda: AdaCURRetriever(_heavy, n_calls=4, n_rounds=2, **fast),
                            dict(fit=dict(train_queries=X[:12], items=keys,
                                          relevance_matrix=_heavy(X[:12], keys)),
                                 query=Q, n_neighbors=2)),
        "RADDetector": (lambda: RADDetector(extractor="random", k_images=2, image_size=32,
                                            **fast), dict(X=images, y=np.array([0, 0, 1, 1]))),
        "PatchCoreDetector": (lambda: PatchCoreDetector(
            extractor=RandomConvExtractor(channels=(8, 16)), image_size=32, **fast),
            dict(X=images, y=np.array([0, 1, 0, 1]))),
        "CLAPPEncoder": (lambda: CLAPPEncoder(architecture=[(4,), (4, "M")], n_epochs=1,
                                              batch_size=4, augment=None, **fast),
                         dict(X=chw)),
        "GlobalSSLEncoder": (lambda: GlobalSSLEncoder(
            loss="infonce", projection_dim=4, architecture=[(4,)], n_epochs=1, batch_size=4,
            augment=None, **fast), dict(X=chw)),
    }


def _arraylike_params(method):
    hints = typing.get_type_hints(method)
    return [p for p, h in hints.items()
            if p != "return" and ("Tensor" in repr(h) or "_SupportsArray" in repr(h))]


def _same(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif isinstance(a, (np.ndarray, float, int, np.number)):
        np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                                   rtol=1e-5, atol=1e-7)
    else:  # a result this comparison does not know: compare it before trusting it
        assert a is None and b is None, f"cannot compare {type(a).__name__} results"


def _call(est, name, data, tensors):
    """``est.name(...)`` on ``data`` (its own entry, else the shared names; ``query``
    for the queries after fit), the ``ArrayLike`` arguments as requires-grad tensors
    when ``tensors``; ``None`` when the method takes no array argument."""
    method = getattr(est, name)
    params = _arraylike_params(method)
    values = dict(data.get(name, {}))
    for p in inspect.signature(method).parameters:
        if p not in values and p in data:
            values[p] = data[p]
        if p not in values and p in ("X", "queries") and name != "fit" and "query" in data:
            values[p] = data["query"]
    if not set(values) & set(params):
        return None
    if tensors:
        values = {k: (torch.tensor(v, dtype=torch.float64, requires_grad=True)
                      if isinstance(v, np.ndarray) and k in params else v)
                  for k, v in values.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return method(**values)


@pytest.mark.parametrize("name", sorted(_sweep_cases()))
def test_estimator_methods_accept_requires_grad_tensors(name):
    make, data = _sweep_cases()[name]
    ref, est = make(), make()
    assert _call(ref, "fit", data, tensors=False) is not None
    assert _call(est, "fit", data, tensors=True) is not None
    for m in _METHODS[2:]:
        if not hasattr(est, m) or m == "partial_fit":
            continue
        _same(_call(est, m, data, tensors=True), _call(ref, m, data, tensors=False))
