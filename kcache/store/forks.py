"""Processes that fork: what every open store does before and after a ``fork()``.

A fork copies the locks as they were: one held by another thread at that moment would never be
released in the child, whose first lookup would then hang. So every object registered here
(each open store) has its state locks taken just before a fork and let go just after it, in
the parent; in the child, it makes new ones and drops what is its parent's (buffers, counters,
private folders, connections). An object registers with :func:`register` and offers:

- ``fork_locks() -> list``: the locks that guard in-memory state (held for microseconds);
- ``after_fork_child(keep: list) -> None``: new locks and fresh state; objects the child must
  neither use nor close (a SQLite connection) go into ``keep``, kept for the child's life.

A lock held longer than :data:`LOCK_WAIT_S` (a stuck thread) is not waited for. Two threads
forking at once take turns in these handlers.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any, Protocol

from .. import counters as _counters
from .errors import tolerated

LOCK_WAIT_S = 2.0


class ForkAware(Protocol):
    def fork_locks(self) -> list[Any]: ...

    def after_fork_child(self, keep: list[Any]) -> None: ...


_OBJECTS: weakref.WeakSet[Any] = weakref.WeakSet()
# Per thread: two threads may fork at once, and each must let go of its own locks only.
_HELD = threading.local()
# Two threads forking at once run these handlers at once: one at a time, or each would wait out
# the other's locks (and time out).
_SERIAL = threading.Lock()
# What children keep and never use (their parent's SQLite connections): never closed.
_KEPT: list[Any] = []


def register(obj: ForkAware) -> None:
    """Have ``obj``'s state locks taken around every fork, and its state renewed in children."""
    _OBJECTS.add(obj)


def _before() -> None:
    held: list[Any] = []
    if _SERIAL.acquire(timeout=LOCK_WAIT_S):
        held.append(_SERIAL)
    for obj in list(_OBJECTS):
        for lk in obj.fork_locks():
            if lk.acquire(timeout=LOCK_WAIT_S):
                held.append(lk)
    _HELD.locks = held


def _after_parent() -> None:
    held = getattr(_HELD, "locks", [])
    _HELD.locks = []
    for lk in reversed(held):
        with contextlib.suppress(RuntimeError):
            lk.release()


def _after_child() -> None:
    global _SERIAL
    _SERIAL = threading.Lock()
    _HELD.locks = []
    for obj in list(_OBJECTS):  # one object's failure must not spare the others
        with tolerated("fork", "kcache's reset of a store in a forked child"):
            obj.after_fork_child(_KEPT)
    _counters.GLOBAL.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_parent, after_in_child=_after_child)
