"""Paths handed to a library, kept valid exactly as long as the program keeps them.

kcache hands a library (Triton) paths of files it must be able to open later: a held entry
folder's members, private links, a compile's scratch files. Keeping every such file for the life
of the process made a long-lived process's share of the disk grow with every entry it ever
touched (issue 34). What decides when a file may go is whether anything in the process can still
name it through what it was given, so that is what is tracked:

- every path handed out is a :class:`HeldPath`, a ``str`` (equal to, and used as, the plain
  path) that refers to a :class:`Ticket`; the ticket refers to its :class:`Lease`, what keeps the
  files (a held folder's descriptor, a private folder);
- when the last object that refers to the ticket goes (the dict Triton keeps in a
  ``CompiledKernel``, a :class:`~.hit.Hit`, a path the program kept), Python frees it and the
  lease's ``sink`` is told, from a weakref callback, which only queues it, so that no lock is
  ever waited for at whatever point the collector runs; its owner lets go of the files then (a
  held folder whose entry is still committed, which costs no disk, is kept idle until its entry
  is removed: see :mod:`.served`);
- a ticket is never live again once it has gone (``Lease.ticket()`` is None from then on: a
  weakref is cleared before its callback runs); files kept idle are handed out again under a
  new lease.

Triton keeps the group's dict in each ``CompiledKernel`` (``metadata_group``), and reads it there
again only through its load hooks at a kernel's first launch (Proton's instrumentation parses
the ``.ttgir`` then) and at its unload (3.9): the files last as long as the kernel object that
may still read them, and no longer. A copy of a path made by the program (``str(p)``, an
f-string) does not keep the files: only the object handed out does. Pickling or copying a
:class:`HeldPath` gives a plain ``str``: the entry's own path in the store where the files are an
entry's (a ``/proc/self/fd`` path means nothing in another process).
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Callable

from ..forksafe import module_lock

#: What a sink raised in a weakref callback, which may neither raise nor wait for a lock (a
#: warning takes one): kept here (a deque's append takes none) and reported by the owner's next
#: turn outside one (:meth:`kcache.store.served.Served.drain`).
unreported: deque[BaseException] = deque(maxlen=8)
#: Held by whoever reports them (any store's flush thread, or a caller of ``drain``), never by
#: the callback: one reporter takes the lot (re-entrant: a report may run kcache code again).
reporting = module_lock(__name__, "reporting", reentrant=True)  # (a forked child gets its own)


class Ticket:
    """What every path of one hand-out refers to; its lease is let go when the last one goes."""

    __slots__ = ("lease", "__weakref__")

    def __init__(self, lease: Lease) -> None:
        self.lease = lease


class Lease:
    """Files kept for paths handed out: ``release()`` lets them go (run by the owner, where it is
    safe: see the module doc); ``sink(lease)`` is told when the last path has gone."""

    __slots__ = ("_ref", "release", "sink", "pid", "__weakref__")

    def __init__(self, release: Callable[[], None], sink: Callable[[Lease], None]) -> None:
        self.release, self.sink, self.pid = release, sink, os.getpid()
        self._ref: weakref.ref[Ticket] | None = None

    def start(self) -> Ticket:
        """The lease's ticket (made once: the paths handed out refer to it)."""
        t = Ticket(self)
        self._ref = weakref.ref(t, self._gone)
        return t

    def ticket(self) -> Ticket | None:
        """The live ticket (a strong reference: the lease is kept while it is held), or None once
        every path handed out has gone (never live again)."""
        ref = self._ref
        return ref() if ref is not None else None

    def _gone(self, _ref: object) -> None:
        try:
            self.sink(self)
        # broad: a weakref callback must not raise (it runs wherever the collector does): kept
        except Exception as e:
            q = unreported
            if q is not None:  # None: the interpreter is tearing modules down (none left to tell)
                q.append(e)


class HeldPath(str):
    """A path kcache handed out (a plain ``str`` in every use) that keeps its files while it lives."""

    def __reduce__(self) -> tuple[type, tuple[str]]:
        # Pickled or copied: a plain path, and where the files are an entry's, the entry's own
        # path in the store. A ``/proc/self/fd/N/...`` path means this process' descriptor N:
        # pickled into another process (Inductor sends a compiled kernel's ``metadata_group``
        # from its compile workers to the parent, and into its FX graph entries), it would name
        # whatever that process has at N (another entry's folder, with a kernel of the same
        # name). The store's path names the same bytes everywhere while the entry lives.
        return (str, (getattr(self, "_c", None) or str(self),))


def hold_paths(paths: dict[str, str], ticket: Ticket, entry_dir: str | None = None) -> dict[str, str]:
    """``paths`` (name -> path) as :class:`HeldPath` objects that keep ``ticket`` alive;
    ``entry_dir``: the folder of the entry whose members they are (what a copy names)."""
    out: dict[str, str] = {}
    for name, p in paths.items():
        hp = HeldPath(p)
        hp._t = ticket  # type: ignore[attr-defined]  # (a str subclass has no slots of its own)
        if entry_dir is not None:
            hp._c = os.path.join(entry_dir, name)  # type: ignore[attr-defined]
        out[name] = hp
    return out
