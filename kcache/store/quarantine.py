"""Entries whose use raised: taken out of service, so that the work is redone instead.

A checked hit proves that an entry's bytes are the ones its record names, not that the library
can use them: without ``KCACHE_SECRET`` the shared tier trusts its writers, and anyone who can
write to it can publish a well-formed entry that makes Triton's loader (or torch's, or
nvFuser's) raise. When an integration sees that (before serving, or when the library fails on
what was served), it calls the cache's ``quarantine(rec, why)``
(:meth:`kcache.store.cache.TieredCache.quarantine`):

- the entry is removed from the local store (only while it is still the entry that failed: a
  fresh one written meanwhile is kept), so the next process does not meet it again;
- the shared tier is asked to drop it (:meth:`SharedTier.mark_bad`, :mod:`kcache.store.tiers.shared`), so no other machine is
  served it;
- it is counted (``quarantined``, per kind, in ``kcache stats``) and said once per kind;
- its exact content (entry id and member digests) is remembered for the life of the process
  (:func:`remember`): a read-only store, or a shared tier that still holds it, cannot serve it
  to this process again (:func:`is_bad`, asked by the cache on every hit), while a good entry
  for the same key is served as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..forksafe import module_lock
from ..log import warn_once
from .records import Record

if TYPE_CHECKING:
    from .api import Cache

_lock = module_lock(__name__, "_lock")
_bad: set[tuple[str, tuple[str, ...]]] = set()
_BAD_MAX = 4096  # contents remembered per process, at most


def _content(rec: Record) -> tuple[str, tuple[str, ...]]:
    return rec.id, tuple(f"{f.name}:{f.sha256}" for f in rec.files)


def is_bad(rec: Record) -> bool:
    """Whether this very content was quarantined in this process (on every hit: nothing to do
    while nothing was)."""
    if not _bad:
        return False
    with _lock:
        return _content(rec) in _bad


def remember(rec: Record, why: str) -> None:
    """Remember ``rec``'s content as bad for the life of the process, and say so once per kind
    (the composed cache's :meth:`~kcache.store.cache.TieredCache.quarantine` does the rest)."""
    with _lock:
        if len(_bad) >= _BAD_MAX:
            _bad.clear()
        _bad.add(_content(rec))
    warn_once(
        f"quarantine:{rec.kind}",
        f"a cached {rec.kind} entry {rec.id[:12]} cannot be used ({why[:300]}); "
        "removed from the cache, compiling instead",
    )


def refuse(store: Cache, rec: Record, why: str) -> None:
    """A hit that the library cannot use after all: quarantined (``store.quarantine``) and
    counted as the miss it turned out to be."""
    store.quarantine(rec, why)
    store.count(rec.kind, hits=-1, misses=1)


def judge(store: Cache, rec: Record, problem: Callable[[], str | None], what: str) -> bool:
    """Whether a verified hit may be served: not when this very content was quarantined in this
    process, nor when ``problem()`` says why the library could not use it (or raises: judging
    hostile bytes with the library's own rules, any error says why not); then it is refused
    (:func:`refuse`, the reason prefixed with ``what``) and the library does the work again.
    Never raises."""
    try:
        why = "quarantined earlier in this process" if is_bad(rec) else problem()
    # broad: problem() judges hostile bytes by a library's own code: any error it raises says why not
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    if why is None:
        return True
    refuse(store, rec, f"{what}: {why}")
    return False
