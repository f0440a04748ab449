"""The user's own torch modules in reflective HMC: run in eval mode, left as given."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from mlpapers._utils._modules import module_behind

__all__ = ["eval_mode"]

_EVAL_LOCK = threading.Lock()
# id(submodule) -> [samplers using it now, its training flag before the first of them]
_EVAL_USERS: dict[int, list] = {}


@contextlib.contextmanager
def eval_mode(*functions) -> Iterator[None]:
    """Run the modules behind ``functions`` (modules, or bound methods of modules such as
    ``flow.log_prob``) in eval mode, then give every submodule back its own ``training``
    flag (also when the body raises).

    A log density must be a fixed function of each point: a module left in train mode
    (as built) redrew its dropout masks at every call, from the global generator, and a
    BatchNorm normalised each chain by the other chains' positions and rewrote its
    running statistics. The flags are counted per *submodule*, across functions and
    threads: a module nested in another (``log_prob=net``, ``grad_log_prob=net.grad``),
    or a submodule shared by two samplers running in threads, is restored to the flag it
    had before the first user, when the last user leaves.
    """
    owners = [m for m in map(module_behind, functions) if m is not None]
    subs = list({id(m): m for owner in owners for m in owner.modules()}.values())
    with _EVAL_LOCK:
        for m in subs:
            entry = _EVAL_USERS.get(id(m))
            if entry is None:
                _EVAL_USERS[id(m)] = [1, m.training]
            else:
                entry[0] += 1
            m.training = False
    try:
        yield
    finally:
        with _EVAL_LOCK:
            for m in subs:
                entry = _EVAL_USERS[id(m)]
                entry[0] -= 1
                if entry[0] == 0:
                    del _EVAL_USERS[id(m)]
                    m.training = entry[1]
