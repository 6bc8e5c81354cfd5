"""Module-level locks that a forked child gets back unlocked.

``os.fork()`` copies only the thread that called it. A lock that another thread held at that
moment stays held in the child for ever, and the child's first ``with _lock:`` waits for ever: a
program that forks (a DataLoader worker, Inductor's compile pool under the ``fork`` start method,
a user's ``multiprocessing``) would hang in kcache. A module's lock made by :func:`module_lock`
is replaced by a new, free one in every child, right after the fork (``os.register_at_fork``).

The state such a lock guards is left as the fork found it: each holder here does one step on a
set or dict (atomic under the GIL), or a memo whose worst case is being computed again.
(Objects' own locks are renewed by their ``after_fork`` methods: :mod:`kcache.store.forks`.)
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

# (module name, attribute, factory): the locks to replace in a child
_LOCKS: list[tuple[str, str, Callable[[], Any]]] = []


def module_lock(module: str, name: str, *, reentrant: bool = False) -> Any:
    """A new lock for ``module``'s global ``name`` (``_lock = module_lock(__name__, "_lock")``);
    every forked child gets a new one there. Use it through the global's name (``with _lock:``),
    not through a reference kept elsewhere, which would still name the parent's."""
    factory: Callable[[], Any] = threading.RLock if reentrant else threading.Lock
    _LOCKS.append((module, name, factory))
    return factory()


def _renew_in_child() -> None:
    for module, name, factory in _LOCKS:
        mod = sys.modules.get(module)
        if mod is not None:
            setattr(mod, name, factory())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)
