"""Peak memory of the activations autograd keeps during one training step.

CPU resident-set size is dominated by the interpreter, the allocator's caches and
the data, so it cannot show the difference between layer-local and end-to-end
training of a small network. This module measures what that difference is about:
the tensors saved for the backward pass (the "activations"). Every tensor that
autograd saves goes through :func:`torch.autograd.graph.saved_tensors_hooks`; the
tracker counts the bytes of the distinct storages that are alive (parameters
excluded) and records the maximum. A storage is released when the last graph
holding it is freed (after its backward pass), so per-block backward passes show up
as a lower peak. On CUDA the same step can be measured with
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np
import torch

from mlpapers._utils import ArrayLike, check_positive, on_cpu_default_device, with_autograd

if TYPE_CHECKING:
    from mlpapers.ssl.clapp._estimator import CLAPPEncoder
    from mlpapers.ssl.clapp._global import GlobalSSLEncoder

__all__ = ["SavedActivationTracker", "training_step_activation_bytes"]


class _Saved:
    """Holder of one saved tensor; tells the tracker when the graph drops it."""

    __slots__ = ("key", "tensor", "tracker")

    def __init__(self, tensor: torch.Tensor, key, tracker: SavedActivationTracker):
        self.tensor = tensor
        self.key = key
        self.tracker = tracker

    def __del__(self):
        if self.key is not None:
            self.tracker._release(self.key)


class SavedActivationTracker:
    """Context manager counting the live bytes of tensors saved for backward.

    Attributes
    ----------
    current : int
        Bytes of distinct saved storages alive now.
    peak : int
        Maximum of ``current`` since entering.

    Examples
    --------
    >>> import torch
    >>> from mlpapers.ssl.clapp._memory import SavedActivationTracker
    >>> w = torch.ones(3, 3, requires_grad=True)
    >>> with SavedActivationTracker() as t:
    ...     y = (torch.ones(10, 3) @ w).relu().sum()
    >>> t.peak >= 10 * 3 * 4
    True
    """

    def __init__(self, exclude=()):
        self._exclude = {p.untyped_storage().data_ptr() for p in exclude}
        self._refs: dict[tuple, int] = {}
        self._sizes: dict[tuple, int] = {}
        self.current = 0
        self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._exclude or isinstance(t, torch.nn.Parameter):
            return _Saved(t, None, self)
        key = (t.device.type, ptr)
        if key not in self._refs:
            self._refs[key] = 0
            self._sizes[key] = storage.nbytes()
            self.current += self._sizes[key]
            self.peak = max(self.peak, self.current)
        self._refs[key] += 1
        return _Saved(t, key, self)

    @staticmethod
    def _unpack(saved: _Saved) -> torch.Tensor:
        return saved.tensor

    def _release(self, key) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.current -= self._sizes.pop(key)

    def __enter__(self) -> SavedActivationTracker:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


# it runs a training step: autograd on even inside the caller's no_grad / inference_mode
@with_autograd
@on_cpu_default_device
def training_step_activation_bytes(encoder: CLAPPEncoder | GlobalSSLEncoder, X: ArrayLike, *,
                                   batch_size: int | None = None,
                                   random_state: int = 0) -> int:
    """Peak bytes of saved activations in one training step of a fitted encoder.

    Runs the encoder's own training step (the same code as ``fit``: for
    :class:`~mlpapers.ssl.clapp.CLAPPEncoder` block-by-block backward passes, for
    :class:`~mlpapers.ssl.clapp.GlobalSSLEncoder` one end-to-end backward pass) on one
    batch of two augmented views; the gradients are discarded and the weights are
    not changed.

    Parameters
    ----------
    encoder : CLAPPEncoder or GlobalSSLEncoder
        Fitted (``n_epochs=0`` is enough).
    X : array-like of shape (n_samples, C, H, W) or (n_samples, H, W)
        Images of the encoder's input shape; the batch is drawn from them.
    batch_size : int or None, default=None
        Images in the batch (clipped to ``n_samples``; at least 2 are needed);
        ``None`` uses ``encoder.batch_size``.
    random_state : int, default=0
        Seed in ``[0, 2**63)`` of the choice of the batch, its two views and the
        negatives (the encoder's own generator is not used).

    Returns
    -------
    int
        Peak bytes of the distinct storages saved for backward (parameters
        excluded) during the step.

    Examples
    --------
    The layer-local step keeps one block's graph at a time, the end-to-end step
    all of them:

    >>> from mlpapers.datasets import make_shifted_digits
    >>> from mlpapers.ssl.clapp import (CLAPPEncoder, GlobalSSLEncoder,
    ...                                 training_step_activation_bytes)
    >>> X, _ = make_shifted_digits(n_samples=16, random_state=0)
    >>> local = CLAPPEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(X)
    >>> bp = GlobalSSLEncoder(architecture="tiny", n_epochs=0, random_state=0).fit(X)
    >>> (training_step_activation_bytes(local, X, batch_size=8)
    ...  < training_step_activation_bytes(bp, X, batch_size=8))
    True
    """
    from mlpapers.ssl.clapp._base_encoder import _SSLImageEncoder

    if not isinstance(encoder, _SSLImageEncoder):
        raise TypeError(f"encoder must be a CLAPPEncoder or GlobalSSLEncoder, got "
                        f"{type(encoder).__name__}.")
    # the seed of a torch.Generator: checked here, torch's own error names no parameter
    if isinstance(random_state, bool | np.bool_) or not isinstance(random_state,
                                                                   numbers.Integral):
        raise TypeError(f"random_state must be an int, got {random_state!r} of type "
                        f"{type(random_state).__name__}.")
    if not 0 <= int(random_state) < 2 ** 63:
        raise ValueError(f"random_state must be in [0, 2**63), got {random_state}.")
    if batch_size is not None:
        check_positive(batch_size, "batch_size", integer=True)
    X = encoder._check_images(X, reset=False)
    encoder._check_structure(encoder._HEAD_PARAMS, "its losses would not match the fitted "
                             "prediction heads")
    bs = min(encoder.batch_size if batch_size is None else batch_size, X.shape[0])
    if bs < 2:  # the negatives are the batch's other images
        raise ValueError(f"a training step needs a batch of >= 2 images, got {bs} (batch_size="
                         f"{batch_size!r}, {X.shape[0]} images in X).")
    gen = torch.Generator().manual_seed(int(random_state))
    views, neg = encoder._random_batch(X, bs, encoder._augment_fn(), gen)
    params = [*encoder.encoder_.parameters(), *encoder.heads_.parameters()]
    was_training = encoder.encoder_.training
    encoder.encoder_.train()
    try:
        with SavedActivationTracker(exclude=params) as tracker:
            encoder._train_step(views, neg)
    finally:
        for p in params:
            p.grad = None
        encoder.encoder_.train(was_training)
    return int(tracker.peak)
