"""Client simulation: loss matrices and local training, vectorised or per client.

The vectorised path keeps every client's model as one slice of stacked
parameters and runs a whole federated round as a few batched tensor ops
(:func:`torch.func.vmap` of the client loss; one backward pass gives every client's
gradient). The loop path trains one
``nn.Module`` per client with a ``torch.optim`` optimizer; it accepts any
module (BatchNorm, dropout, in-place ops) and serves as the reference that the
vectorised path is tested against. Both draw the same mini-batch orders from the
same generator, so they agree up to floating-point rounding.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, get_args

import torch
from torch import nn

from mlpapers._utils import (
    check_in_options,
    check_learning_rate,
    check_positive,
    seed_from_generator,
    seeded_global_rng,
)
from mlpapers._utils._blocks import block_rows_for
from mlpapers.federated.clove._kernels import (
    batch_pieces,
    batched_adam_step,
    batched_loss_matrix,
    client_mean_losses,
    epoch_permutations,
    n_steps_per_epoch,
)
from mlpapers.federated.clove._models import (
    frozen_names,
    make_sample_loss_fn,
    per_sample_loss,
    row_elements,
    tied_aliases,
)

Params = dict[str, torch.Tensor]
#: The local optimizers (``optimizer=`` of the estimators and the Flower nodes).
Optimizer: TypeAlias = Literal["adam", "sgd"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)


def check_local_training(local_epochs, lr, batch_size, optimizer) -> None:
    """Validate the local-training settings an :class:`Engine` runs (shared by the
    estimators and the Flower nodes, which train the same way)."""
    check_positive(local_epochs, "local_epochs", integer=True)
    check_in_options(optimizer, "optimizer", OPTIMIZERS)
    check_learning_rate(lr, adam=optimizer == "adam")
    if batch_size is not None:
        check_positive(batch_size, "batch_size", integer=True)


@dataclass
class ClientData:
    """Clients' samples stored back to back, without padding.

    Memory follows the clients' total size: padding every client to the largest one
    held ``n x`` its size (a fit on 100 clients of 20 samples and one of 40,000 peaked
    at 467 MB, 87 MB back to back).

    Attributes
    ----------
    X : Tensor of shape (N, ...)
        Client ``i``'s samples are rows ``offsets[i] .. offsets[i] + sizes[i] - 1``.
    Y : Tensor of shape (N, n_outputs) or (N,) (long), or ``X`` when unsupervised
    sizes : long Tensor of shape (n,)
        Samples of each client (all positive).
    offsets : long Tensor of shape (n,)
        First row of each client (derived from ``sizes``).
    """

    X: torch.Tensor
    Y: torch.Tensor
    sizes: torch.Tensor
    offsets: torch.Tensor = field(init=False)

    def __post_init__(self):
        self.offsets = torch.cumsum(self.sizes, 0) - self.sizes

    @classmethod
    def from_lists(cls, Xs: list[torch.Tensor], Ys: list[torch.Tensor] | None,
                   device: torch.device) -> ClientData:
        X = torch.cat(Xs)  # (a copy, also of a single client: the engine never aliases
        Y = X if Ys is None else torch.cat(Ys)  # the caller's tensors)
        sizes = torch.tensor([len(x) for x in Xs], dtype=torch.long, device=device)
        return cls(X, Y, sizes)

    @property
    def n_clients(self) -> int:
        return int(self.sizes.shape[0])

    def client(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client ``i``'s inputs and targets (views)."""
        rows = slice(int(self.offsets[i]), int(self.offsets[i] + self.sizes[i]))
        return self.X[rows], self.Y[rows]

    def take(self, idx: torch.Tensor) -> ClientData:
        """The clients ``idx``, in that order (``self`` when that is every client)."""
        idx = idx.to(self.sizes.device)
        if idx.shape[0] == self.n_clients and torch.equal(
                idx, torch.arange(self.n_clients, device=idx.device)):
            return self
        sizes = self.sizes[idx]
        starts = torch.cumsum(sizes, 0) - sizes
        within = torch.arange(int(sizes.sum()), device=idx.device) - \
            torch.repeat_interleave(starts, sizes)
        rows = torch.repeat_interleave(self.offsets[idx], sizes) + within
        X = self.X[rows]
        return ClientData(X, X if self.Y is self.X else self.Y[rows], sizes)


def stack_states(modules: list[nn.Module]) -> Params:
    """Stack the state dicts of ``modules`` along a new leading axis."""
    states = [m.state_dict() for m in modules]
    return {k: torch.stack([s[k].detach() for s in states]) for k in states[0]}


def unstack_state(states: Params, j: int) -> Params:
    return {k: v[j].clone() for k, v in states.items()}


class Engine:
    """Runs the client side of a round for a fixed model template.

    Parameters
    ----------
    template : nn.Module
        Architecture of every model (its own weights are never used).
    kind : {"mse", "cross_entropy", "reconstruction"}
    vectorize : bool
        Batched (``vmap``) or per-client loop simulation.
    optimizer : {"adam", "sgd"}
    lr, batch_size, local_epochs :
        Local training hyper-parameters; ``batch_size=None`` means full batch.
    user_model : bool
        A user model: local training runs in a fork of torch's global generator seeded
        from the round's generator (:func:`seeded_global_rng`), as its random layers
        (dropout) draw from it (reproducible, the caller's RNG untouched), and it is
        given copies of its inputs (it may modify them in place).

    Losses are computed in eval mode, local training runs in train mode. Parameters
    with ``requires_grad=False`` are never updated; tied parameters are trained once.
    """

    def __init__(self, template: nn.Module, kind: str, *, vectorize: bool, optimizer: str,
                 lr: float, batch_size: int | None, local_epochs: int,
                 max_elements: int = 2**25, user_model: bool = False):
        self.template = template
        self.kind = kind
        self.vectorize = vectorize
        self.optimizer = optimizer
        self.lr = float(lr)
        self.batch_size = batch_size
        self.local_epochs = int(local_epochs)
        self.max_elements = max_elements
        self.user_model = bool(user_model)
        self.aliases = tied_aliases(template)
        self.frozen = frozen_names(template)
        # the trainable names, once each (named_parameters drops the tied aliases)
        self.trainable = [k for k, p in template.named_parameters() if p.requires_grad]
        # whether a BatchNorm of this model gets one value per channel from one sample
        # (torch refuses that in train mode): probed on one sample by check_batches or,
        # if it was not called, by local_train; such a model never gets a batch of one
        self.batch_norm: bool | None = None
        self.row_aligned: bool | None = None  # (see _rows_aligned)
        if vectorize:
            # the vmapped losses follow the modules' modes: eval for the loss matrix, train
            # for local training (dropout; a user template may come in either mode)
            evaluated = copy.deepcopy(template).eval()
            trained = copy.deepcopy(template).train()
            self._sample_loss_fn = make_sample_loss_fn(evaluated, kind, self.aliases,
                                                       self.user_model)
            self._train_sample_loss_fn = make_sample_loss_fn(trained, kind, self.aliases,
                                                             self.user_model)
        self._activations: dict[tuple[tuple[int, ...], torch.dtype], int] = {}

    # -- losses ------------------------------------------------------------
    def loss_matrix(self, states: Params, data: ClientData) -> torch.Tensor:
        """Mean training loss of every model on every client: ``n x K``.

        Computed over blocks of rows of all clients (:func:`client_mean_losses`), so
        the memory is bounded by ``max_elements`` whatever the clients' sizes.
        """
        per_row = self._sample_elements(data.X)
        whole = not self._rows_aligned(data)
        if self.vectorize:
            with self._vmapped_user_model(states, data, train=False):
                return batched_loss_matrix(self._sample_loss_fn, states, data.X, data.Y,
                                           data.sizes, max_elements=self.max_elements,
                                           sample_elements=per_row, whole_clients=whole)
        K = next(iter(states.values())).shape[0]
        module = copy.deepcopy(self.template).eval()
        rows = block_rows_for(per_row, self.max_elements, cap=data.X.shape[0])

        def losses(x, y):
            return per_sample_loss(module(self._input(x)), x, y, self.kind)

        out = torch.empty(data.n_clients, K, dtype=torch.float32, device=data.X.device)
        with torch.no_grad():
            for j in range(K):
                module.load_state_dict(unstack_state(states, j))
                out[:, j] = client_mean_losses(losses, data.X, data.Y, data.sizes,
                                               block_rows=rows, whole_clients=whole)
        return out

    def _rows_aligned(self, data: ClientData) -> bool:
        """Whether the model's output has one row per input row (probed once, on one
        and on two rows in eval mode: a transposed output of two features has two rows
        for two inputs). A reconstruction is only checked by its size at fit: one
        returned flat or transposed mixes the rows of a block, so its losses are taken
        one client at a time, as its training batches are."""
        if self.row_aligned is None:
            if self.kind != "reconstruction" or data.X.shape[0] < 2:
                return True  # (other losses check the output's shape (batch, outputs))
            module = copy.deepcopy(self.template).eval()
            with seeded_global_rng(0, data.X.device), torch.no_grad():
                outs = [module(self._input(data.X[:r])) for r in (1, 2)]
            self.row_aligned = all(out.ndim > 0 and out.shape[0] == r
                                   for r, out in zip((1, 2), outs))
        return self.row_aligned

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        """What the model is given: a user model a copy (``x`` views the clients' data,
        and is the reconstruction target)."""
        return x.clone() if self.user_model else x

    def _sample_elements(self, X: torch.Tensor) -> int:
        """Values one sample holds through the template (cached per input shape): the
        loss matrix's blocks are sized by them, not by the input width alone."""
        key = (tuple(X.shape[1:]), X.dtype)
        if key not in self._activations:
            self._activations[key] = row_elements(self.template, key[0], X.dtype)
        return self._activations[key]

    # -- local training --------------------------------------------------------
    def _probe_batch_norm(self, x: torch.Tensor) -> bool:
        """Whether a BatchNorm that runs in train mode gets a single value per channel
        from the one sample ``x`` (``1 x ...``): torch refuses that ("Expected more than
        1 value per channel"). BatchNorm2d after a convolution, BatchNorm1d on
        ``(N, C, L)`` input or a BatchNorm the forward never calls train on one sample."""
        def batch_norms(module):
            return [m for m in module.modules()
                    if isinstance(m, nn.modules.batchnorm._BatchNorm)]

        if not batch_norms(self.template):  # (no copy, no forward pass)
            return False
        module = copy.deepcopy(self.template).train()
        bns = batch_norms(module)
        single = []

        def hook(_, inputs):
            inp = inputs[0] if inputs else None
            if isinstance(inp, torch.Tensor) and inp.ndim >= 2:
                single.append(inp.numel() == inp.shape[1])

        handles = [m.register_forward_pre_hook(hook) for m in bns]
        try:  # a copy, no gradient, in a seeded fork of the RNG (dropout draws)
            with seeded_global_rng(0, x.device), torch.no_grad():
                module(self._input(x))
        except Exception:  # noqa: BLE001 - the BatchNorm's own refusal, or a model bug
            pass            # that training raises again; the hooks ran up to it
        finally:
            for h in handles:
                h.remove()
        return any(single)

    def check_batches(self, data: ClientData, name: str = "client", *,
                      single: bool = False) -> None:
        """Refuse what no batch split can train when a BatchNorm of the model gets one
        value per channel from one sample (see :meth:`_probe_batch_norm`):
        ``batch_size=1`` or a client of one sample (a batch of one sample fails in train
        mode). Other sizes train: a trailing batch of one sample joins the previous
        batch. Models whose BatchNorms get several values per sample are not affected.
        ``single``: ``data`` is the one ``name`` itself (a Flower node), not indexed."""
        if self.batch_norm is None:
            self.batch_norm = self._probe_batch_norm(data.X[:1])
        if not self.batch_norm:
            return
        if self.batch_size is not None and int(self.batch_size) < 2:
            raise ValueError(
                f"batch_size={self.batch_size} with a model whose BatchNorm layers get "
                "one value per channel from a sample: they normalise each training "
                "batch by its own statistics and need at least 2 samples per batch; use "
                "batch_size >= 2 (or None).")
        small = torch.nonzero(data.sizes < 2).flatten().tolist()
        if small:
            who = f"this {name} holds" if single else f"{name}(s) {small[:10]} hold(s)"
            raise ValueError(
                f"{who} a single sample, but the model's "
                "BatchNorm layers get one value per channel from a sample and need at "
                f"least 2 samples per training batch (batch_size={self.batch_size}): "
                f"give every {name} at least 2 samples or use a model without BatchNorm "
                "on such features.")

    def local_train(self, states: Params, assignment: torch.Tensor, data: ClientData,
                    generator: torch.Generator) -> Params:
        """Train each client's assigned model on its data; return ``n x ...`` states.

        Optimizer state starts fresh every call (every round), as in the paper.
        """
        m = int(data.sizes.max())
        if self.batch_norm is None:  # (check_batches was not called: probe here)
            self.batch_norm = self._probe_batch_norm(data.X[:1])
        b = m if self.batch_size is None else min(int(self.batch_size), m)
        steps = n_steps_per_epoch(data.sizes, b)
        perms = [epoch_permutations(data.sizes, generator, data.X.device)
                 for _ in range(self.local_epochs)]
        init = {k: v[assignment].clone() for k, v in states.items()}
        train = self._train_vmap if self.vectorize else self._train_loop
        if not self.user_model:
            return train(init, data, perms, b, steps)
        with seeded_global_rng(seed_from_generator(generator), data.X.device), \
                self._vmapped_user_model(init, data, train=True):
            return train(init, data, perms, b, steps)

    @contextlib.contextmanager
    def _vmapped_user_model(self, states: Params, data: ClientData, *, train: bool):
        """Name ``vectorize=True`` when a user model fails under ``torch.func.vmap``
        (``.item()``, data-dependent shapes or control flow, in-place ops on its input):
        torch's message names neither the option nor the way out. Only when the model
        runs outside vmap (:meth:`_runs_unbatched`): a genuine model bug raises its own
        error unchanged, which ``vectorize=False`` would not cure."""
        if not (self.vectorize and self.user_model):
            yield
            return
        try:
            yield
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError) as exc:
            if not self._runs_unbatched(states, data, train):
                raise
            raise ValueError(
                "model failed with vectorize=True, which runs it over all clients at "
                f"once with torch.func.vmap: {str(exc).rstrip('. ')}. It runs outside "
                "vmap: use vectorize=False (a per-client loop, which runs any "
                "module).") from exc

    def _runs_unbatched(self, states: Params, data: ClientData, train: bool) -> bool:
        """Replay the model once outside vmap, as the loop path runs it (a copy holding
        the first model's state, in the same mode, on client 0's first batch, with the
        loss and, when training, its backward pass): whether it runs."""
        try:
            module = copy.deepcopy(self.template).train(train)
            module.load_state_dict(unstack_state(states, 0))
            n0 = int(data.sizes[0])
            b = n0 if not train or self.batch_size is None else min(int(self.batch_size), n0)
            x, y = data.X[:b], data.Y[:b]  # (client 0's first rows)
            with seeded_global_rng(0, x.device), torch.enable_grad():
                loss = per_sample_loss(module(self._input(x)), x, y, self.kind).mean()
                if train:
                    loss.backward()
        except Exception:  # noqa: BLE001 - any failure: the model's own bug
            return False
        return True

    def _train_vmap(self, P: Params, data: ClientData, perms, b: int, steps: int) -> Params:
        n, m = data.n_clients, int(data.sizes.max())
        keys = [k for k in P if k in self.trainable]  # not frozen, aliases or buffers
        # rows (client x batch slot) that one forward and backward pass may hold: a step
        # whose batch is larger (full batches of one large client) runs in pieces; not
        # for a model whose output rows do not match its input rows (a piece would split
        # the rows it mixes)
        budget = max(1, self.max_elements // self._sample_elements(data.X)) \
            if self._rows_aligned(data) else n * m
        m1 = {k: torch.zeros_like(P[k]) for k in keys}
        m2 = {k: torch.zeros_like(P[k]) for k in keys}
        count = torch.zeros(n, dtype=torch.long, device=data.X.device)
        sizes = data.sizes.cpu()
        for perm in perms:
            for s in range(steps):
                lo, hi = s * b, min((s + 1) * b, m)
                # only the clients with samples left are computed: one client larger
                # than the others would otherwise cost n x its steps
                busy = torch.nonzero(sizes > lo).flatten()
                part = None if busy.shape[0] == n else busy.to(data.X.device)
                Pp, m1p, m2p, count_p = (P, m1, m2, count) if part is None else (
                    {k: v[part] for k, v in P.items()}, {k: m1[k][part] for k in keys},
                    {k: m2[k][part] for k in keys}, count[part])
                g = self._batch_grads(Pp, keys, data, perm, busy, sizes[busy], lo, hi, budget)
                self._step(Pp, keys, g, m1p, m2p, count_p)
                if part is not None:
                    for k in keys:
                        P[k][part], m1[k][part], m2[k][part] = Pp[k], m1p[k], m2p[k]
                    count[part] = count_p
        for alias, name in self.aliases.items():  # a tied parameter's other names
            if alias in P and name in P:
                P[alias] = P[name].clone()
        return P

    def _batch_grads(self, P: Params, keys: list[str], data: ClientData, perm: torch.Tensor,
                     clients: torch.Tensor, sizes: torch.Tensor, lo: int, hi: int,
                     budget: int) -> Params:
        """Gradients of each client's mean loss over its batch slots ``[lo, hi)``.

        ``P`` holds the models of ``clients`` (CPU indices, their ``sizes`` on the CPU
        too), in order. Client losses depend only on their own parameter slice, so the
        gradient of their sum with respect to the stacked parameters is every client's
        gradient. A batch of more than ``budget`` rows is summed over pieces
        (:func:`batch_pieces`).
        """
        device = data.X.device
        clients = clients.to(device)
        dtype = P[keys[0]].dtype
        # each client's mean runs over its slots in [lo, hi) (at least one: it is busy)
        denom = (sizes - lo).clamp(1, hi - lo).to(device=device, dtype=dtype)
        # "different": each client draws its own dropout masks ("error" refused them)
        losses = torch.func.vmap(self._train_sample_loss_fn, randomness="different")
        out: Params | None = None
        for sel, c0, c1 in batch_pieces(sizes, lo, hi, budget):
            at = None if sel is None else sel.to(device)
            who = clients if at is None else clients[at]
            first, last = data.offsets[who, None], (data.sizes[who] - 1)[:, None]
            pos = torch.arange(c0, c1, device=device)[None, :]
            # a client past its end fills its slots with its own last sample (masked
            # out of the loss): its own data, so a loss finite on it stays finite
            rows = first + perm[first + torch.minimum(pos, last)]
            valid = pos < data.sizes[who, None]
            Pq = P if at is None else {k: v[at] for k, v in P.items()}
            leaves = {k: Pq[k].detach().requires_grad_(True) for k in keys}
            with torch.enable_grad():
                loss = losses({**Pq, **leaves}, data.X[rows], data.Y[rows])
                total = ((loss * valid.to(loss.dtype)).sum(1)
                         / (denom if at is None else denom[at])).sum()
                # a parameter the forward never uses (a spare layer) gets a zero
                # gradient, which leaves it unchanged under SGD and Adam, as the loop
                # path's optimizers (its .grad stays None) do
                grads = dict(zip(leaves, torch.autograd.grad(
                    total, list(leaves.values()), allow_unused=True, materialize_grads=True)))
            if at is None:
                return grads  # (the whole batch in one piece)
            if out is None:
                out = {k: torch.zeros_like(P[k]) for k in keys}
            for k in keys:
                out[k].index_add_(0, at, grads[k])
        assert out is not None  # (a busy client has a slot in [lo, hi))
        return out

    def _step(self, P: Params, keys: list[str], g: Params, m1: Params, m2: Params,
              count: torch.Tensor) -> None:
        """One optimizer step of every client of ``P`` (in place), with gradients ``g``."""
        if self.optimizer == "sgd":
            for k in keys:
                P[k].copy_(P[k] - self.lr * g[k])
            return
        count += 1
        batched_adam_step({k: P[k] for k in keys}, g, m1, m2, count, lr=self.lr)

    def _train_loop(self, P: Params, data: ClientData, perms, b: int, steps: int) -> Params:
        module = copy.deepcopy(self.template)
        out: dict[str, list[torch.Tensor]] = {k: [] for k in P}
        for i in range(data.n_clients):
            module.load_state_dict({k: v[i] for k, v in P.items()})
            module.train()
            params = [p for p in module.parameters() if p.requires_grad]
            opt = (torch.optim.SGD(params, lr=self.lr) if self.optimizer == "sgd"
                   else torch.optim.Adam(params, lr=self.lr))
            n_i, first = int(data.sizes[i]), int(data.offsets[i])
            X_i, Y_i = data.client(i)
            for perm in perms:
                for s in range(steps):
                    start, stop = s * b, min((s + 1) * b, n_i)
                    if self.batch_norm:
                        # no batch of one sample (BatchNorm refuses it in train mode): a
                        # lone trailing sample joins the batch before it, so every sample
                        # is still used once an epoch (unlike PyTorch's drop_last)
                        if n_i - start == 1:
                            continue
                        if n_i - stop == 1:
                            stop = n_i
                    idx = perm[first + start:first + stop]  # (empty past its end)
                    if idx.numel() == 0:
                        continue
                    x, y = X_i[idx], Y_i[idx]
                    opt.zero_grad(set_to_none=True)
                    per_sample_loss(module(self._input(x)), x, y, self.kind).mean().backward()
                    opt.step()
            for k, v in module.state_dict().items():
                out[k].append(v.detach().clone())
        return {k: torch.stack(v) for k, v in out.items()}
