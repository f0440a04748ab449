"""Training loop of :class:`SCENTClassifier`: row-sparse primal-dual steps on sampled negatives."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from mlpapers._utils import ProgressLogger, user_stacklevel
from mlpapers.optim.scent._common import (
    GammaMeter,
    load_nu,
    lr_factor,
    make_loss,
    nu_to_numpy,
    set_lrs,
    surrogate_overflow,
)
from mlpapers.optim.scent._sampled import sparse_rows_grad, sparse_sgd_step
from mlpapers.optim.scent._sparse_input import SparseRows, sparse_row_dot
from mlpapers.optim.scent._xc import batch_scores, draw_negatives


class SampledTrainingMixin:
    """State and steps of the sampled-negative training (weights ``_W``, ``_b``, the
    SGD optimizer ``_opt`` and the dual table ``_loss_fn``)."""

    # set by the estimator that mixes this in
    fit_intercept: bool
    lr: float
    momentum: float
    alpha: float
    method: str
    log_alpha: float | None
    delta: float
    rho: float
    temperature: float
    loss: str
    negatives: str
    n_negatives: int
    batch_size: int
    verbose: int
    classes_: np.ndarray
    loss_curve_: list[float]
    gamma_curve_: list[float]
    _torch_gen: torch.Generator
    _resolved_device: torch.device
    _objective_of: Callable[[Any, torch.Tensor], float]

    def _params(self) -> list[torch.Tensor]:
        return [self._W, self._b] if self.fit_intercept else [self._W]

    def _new_optimizer(self) -> torch.optim.SGD:
        return torch.optim.SGD(self._params(), lr=self.lr, momentum=self.momentum)

    def _resolve_log_alpha(self) -> float:
        """The SCENT ``log_alpha`` in use (stored as ``_log_alpha``); ``None`` means log C."""
        self._log_alpha = (math.log(len(self.classes_)) if self.log_alpha is None
                           else float(self.log_alpha))
        return self._log_alpha

    def _start_training(self, n_anchors: int, n_features: int) -> None:
        C = len(self.classes_)
        dev = self._device
        self._W = torch.zeros(C, n_features, dtype=torch.float32, device=dev,
                              requires_grad=True)
        self._b = torch.zeros(C, dtype=torch.float32, device=dev,
                              requires_grad=bool(self.fit_intercept))
        self._loss_fn = make_loss(self, n_anchors, self._resolve_log_alpha()).to(dev)
        self._opt = self._new_optimizer()
        self.n_iter_ = 0

    def _resume_training(self, n_anchors: int) -> None:
        dev = self._resolved_device
        if not hasattr(self, "_W"):  # after load or unpickling: rebuild from the fitted state
            self._device = dev
            self._W = torch.as_tensor(self.coef_, dtype=torch.float32, device=dev).clone()
            self._W.requires_grad_(True)
            self._b = torch.as_tensor(self.intercept_, dtype=torch.float32, device=dev).clone()
            self._b.requires_grad_(bool(self.fit_intercept))
            self._loss_fn = make_loss(self, max(n_anchors, len(self.nu_)),
                                      self._resolve_log_alpha()).to(dev)
            load_nu(self._loss_fn, self.nu_)
            self._opt = self._new_optimizer()
            buffers = getattr(self, "_momentum_buffers", None)
            # saved heavy-ball state, also while momentum is 0: the live optimizer keeps
            # its buffers through such calls and uses them again once momentum is back
            if buffers is not None:
                for p, buf in zip(self._params(), buffers):
                    if buf is not None:
                        self._opt.state[p]["momentum_buffer"] = buf.to(dev).clone()
        elif n_anchors > self._loss_fn.n_anchors:
            old = self._loss_fn
            self._loss_fn = make_loss(self, n_anchors, self._log_alpha).to(dev)
            self._loss_fn.nu[: old.n_anchors] = old.nu
            self._loss_fn.initialized[: old.n_anchors] = old.initialized

    def _sync_params(self) -> None:
        """Apply what ``set_params`` changed since the last call, as a rebuilt (loaded or
        unpickled) model does: ``lr``, ``gamma``, ``dual_lr`` and ``temperature`` are read
        every step; the dual rule, the optimizer's momentum and whether the intercept
        trains are refreshed here."""
        if self._b.requires_grad != bool(self.fit_intercept):
            # the optimizer's parameter list changes: keep the weights' heavy-ball state
            state = self._opt.state.get(self._W)
            self._b.requires_grad_(bool(self.fit_intercept))
            self._opt = self._new_optimizer()
            if state:
                self._opt.state[self._W] = state
        lf = self._loss_fn
        lf.method, lf.log_alpha = self.method, self._resolve_log_alpha()
        lf.delta, lf.rho = float(self.delta), float(self.rho)
        for group in self._opt.param_groups:
            group["momentum"] = self.momentum

    def _momentum_state(self) -> list | None:
        """Heavy-ball buffers of the optimizer (``None`` entries before the first step)."""
        if not hasattr(self, "_opt"):
            return getattr(self, "_momentum_buffers", None)
        return [None if (b := self._opt.state[p].get("momentum_buffer")) is None
                else b.detach().cpu().clone() for p in self._params()]

    def _step(self, Xb: torch.Tensor, yb: torch.Tensor, index: torch.Tensor
              ) -> tuple[float, int]:
        """One primal-dual step on a batch; only the touched rows of ``W`` change.

        Returns the summed surrogate value and the number of anchors used.
        """
        C, tau = len(self.classes_), float(self.temperature)
        draw = draw_negatives(self.loss, self.negatives, C, int(self.n_negatives), yb,
                              self._torch_gen)
        W = self._W.detach()
        Wp = W.index_select(0, yb).requires_grad_(True)          # (B, d)
        Wc = W.index_select(0, draw.cand).requires_grad_(True)   # (m, d)
        if Xb.is_sparse:  # a batch of CSR rows: O(nnz k), X never densified
            z_pos = sparse_row_dot(Xb, Wp) + self._b[yb]
            z_neg = torch.sparse.mm(Xb, Wc.T) + self._b[draw.cand]
        else:
            z_pos = (Xb * Wp).sum(1) + self._b[yb]
            z_neg = Xb @ Wc.T + self._b[draw.cand]
        if draw.cols is not None:
            z_neg = z_neg.gather(1, draw.cols)
        scores, mask, keep = batch_scores(self.loss, self.negatives, z_pos, z_neg,
                                          draw.valid, C, tau)
        if keep is not None:
            index = index[keep.to(index.device)]
            if index.numel() == 0:  # the batch holds a single class: no negatives
                return 0.0, 0
        if not bool(torch.isfinite(scores.detach()).all()):
            raise FloatingPointError(
                f"SCENTClassifier(method={self.method!r}) diverged at epoch "
                f"{self.n_iter_ + 1}: non-finite scores (logit differences / temperature); "
                "lower lr (or dual_lr), or raise temperature.")
        self._opt.zero_grad()
        loss = tau * self._loss_fn(scores, index, mask)
        loss.backward()
        grad_p, grad_c = Wp.grad, Wc.grad
        assert grad_p is not None and grad_c is not None  # both leaves feed the loss
        rows = [(yb, grad_p), (draw.cand, grad_c)]
        value = float(loss.detach())
        if not math.isfinite(value):  # ASGD's exp(L - nu) overflowed (nu = inf, weights 0)
            raise surrogate_overflow("SCENTClassifier", self.method, self.n_iter_ + 1,
                                     "score / temperature")
        if self.momentum == 0 and self.alpha == 0:
            sparse_sgd_step(self._W, rows, self._opt.param_groups[0]["lr"])
        else:  # momentum / L2 need the dense gradient
            grad = sparse_rows_grad(W, rows)
            if self.alpha > 0:
                grad.add_(W, alpha=self.alpha)
                # (again in float64 where the float32 sum of squares overflows, from
                # |W| ~ 1e19: a float64 copy every step cost 4x the float32 sum)
                squares = float((W * W).sum())
                if not math.isfinite(squares):
                    squares = float(torch.linalg.vector_norm(W, dtype=torch.float64)) ** 2
                value += 0.5 * self.alpha * squares
            self._W.grad = grad
        self._opt.step()
        return value * len(index), len(index)

    def _run(self, X, y, index, epochs: int, schedule: str) -> None:
        n, tau = X.shape[0], float(self.temperature)
        self._sync_params()
        # a model pickled or saved before gamma_curve_ existed continues with NaNs
        self.__dict__.setdefault("gamma_curve_", [float("nan")] * len(self.loss_curve_))
        y = y.to(X.device)
        bs = min(int(self.batch_size), n)
        total, step = epochs * math.ceil(n / bs), 0
        # the softmax risk is the cross-entropy minus tau log C: report the cross-entropy
        shift = tau * math.log(len(self.classes_)) if self.loss == "softmax" else 0.0
        log = ProgressLogger(epochs, self.verbose, desc=f"SCENTClassifier[{self.method}]")
        for _ in log:
            perm = torch.randperm(n, generator=self._torch_gen).to(X.device)
            running, used, gammas = 0.0, 0, GammaMeter()
            for start in range(0, n, bs):
                rows = perm[start:start + bs]
                set_lrs(self._opt, self._loss_fn, self, lr_factor(schedule, step, total))
                value, count = self._step(X[rows], y[rows], index[rows.cpu()])
                running += value
                used += count
                if count:  # a skipped batch left the previous batch's statistics
                    gammas.add(self._loss_fn)
                step += 1
            self.n_iter_ += 1
            if not (bool(torch.isfinite(self._W.detach()).all())
                    and bool(torch.isfinite(self._b.detach()).all())):
                # (the scores are checked before each step, so the last step's overflow
                # returned infinite coef_ without a word)
                raise FloatingPointError(
                    f"SCENTClassifier(method={self.method!r}) diverged at epoch "
                    f"{self.n_iter_}: the weights overflowed; lower lr (now {self.lr!r}) "
                    "or standardise X.")
            self.loss_curve_.append(running / used + shift if used else float("nan"))
            self.gamma_curve_.append(gammas.mean())
            log.log(epoch=self.n_iter_, loss=self.loss_curve_[-1])
        self.coef_ = self._W.detach().cpu().numpy().copy()
        self.intercept_ = self._b.detach().cpu().numpy().copy()
        self.nu_ = nu_to_numpy(self._loss_fn)
        self._warn_if_worse_than_zero(shift, X, y)

    def _warn_if_worse_than_zero(self, zero_value: float, X, y: torch.Tensor) -> None:
        """Warn when the last epoch's loss is above that of the all-zero model.

        ``loss_curve_`` holds, per epoch, the mean over the anchors of the surrogate
        ``tau (mean_j e^{s_ij / tau - nu_i} + nu_i - 1)`` (plus ``alpha/2 |W|^2``), an
        estimate from above of the risk (the dual objective is >= the log-mean-exp),
        shifted by ``tau log C`` for ``"softmax"``: an estimate of the cross-entropy.
        The all-zero model (the start of ``fit``) has every score 0, risk 0 and no
        penalty, so its value on this scale is exactly ``zero_value`` (``tau log C``,
        or 0 for ``"negatives"``). A fit whose average over its last epoch is still above
        that is far worse than predicting the uniform distribution took steps too large
        for the data (raw features in large units, too large an ``lr``): on digits offset
        by 1e4 the last epoch averaged 1e9. A healthy fit's last epoch is far below the
        zero model's value, but on labels with nothing to learn (random labels, tiny data)
        SGD at a large ``lr`` hovers around it, up to 0.22 tau above at C = 2 over the test
        suite: the margin ``tau max(1, log C)`` (the softmax loss at least doubled) keeps
        those quiet. The surrogate only bounds the loss from above, and duals left high
        by a spike at a large ``lr`` (the dual step shrinks with the schedule) kept it
        there after the model recovered (wine, ``asgd_softplus`` at ``lr=2``: 5.6 against
        an exact objective of 0.11): past the threshold, the exact :meth:`objective` on
        the data of this call decides.
        """
        last = self.loss_curve_[-1] if self.loss_curve_ else float("nan")
        tau = float(self.temperature)
        limit = zero_value + tau * max(1.0, math.log(len(self.classes_)))
        if not last > limit:
            return
        # (the training rows as they are: a validated tensor, or the CSR matrix behind
        # the sparse batches; through objective() they were validated again, which
        # sparse rows failed and a DataFrame's feature names warned about)
        exact = self._objective_of(X.X if isinstance(X, SparseRows) else X, y)
        if exact > limit:
            warnings.warn(
                f"{type(self).__name__}(method={self.method!r}) ended with a training loss "
                f"of {exact:.4g}, far above the {zero_value:.4g} of the all-zero model "
                f"(uniform predictions): the steps are too large for the features' units. "
                f"Standardise X (e.g. StandardScaler) or lower lr (now {self.lr!r}).",
                ConvergenceWarning, stacklevel=user_stacklevel())
