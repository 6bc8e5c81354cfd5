"""The one place where a failure inside kcache becomes a miss for the library that called it.

Triton, torch and nvFuser call kcache at a few edges (a cache manager's methods, Inductor's
remote-cache backend, nvFuser's execute wrapper, import hooks). The store and its tiers handle
the failures they expect themselves (a corrupt entry, a full disk, a server that does not answer:
each a counted miss with one warning) and raise anything else. At each edge, :func:`fail_open`
(or :func:`guarded`) turns what is left, which is a bug, into one warning per topic, an
``errors`` count, and the edge's fallback (compile as if kcache were not there), as JAX's
``_cache_read`` does and sccache's ``CacheReadError`` does.

Broad catches inside kcache that are no edge (the store's housekeeping, a probe of the machine)
sort what they met with :func:`expected`: the failures the place expects stay its own (a counted
miss), anything else is reported by the same rule as at an edge.

``KCACHE_STRICT=1`` makes every edge re-raise instead (JAX's ``raise_persistent_cache_errors``):
the test suite runs strict, so a bug that production would swallow fails a test. An exception so
re-raised is marked (:func:`raised_strict`): where kcache calls a library function broadly
guarded (torch's own errors are not kcache's to report) and that function calls back into one of
kcache's edges, the guard lets the marked exception through instead of swallowing it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from . import counters
from .log import warn_once

F = TypeVar("F", bound=Callable[..., Any])

#: Set on an exception that an edge re-raised under ``KCACHE_STRICT=1``.
_MARK = "__kcache_strict__"


def strict() -> bool:
    """Whether edges raise (``KCACHE_STRICT=1``); read at each failure, so tests can set it."""
    return os.environ.get("KCACHE_STRICT", "").strip() == "1"


def failed(
    topic: str,
    what: str,
    e: BaseException,
    kind: str = "",
    then: str = "compiling without kcache",
    *,
    cause: str | None = None,
) -> None:
    """Record a failure at an edge: raise it under ``KCACHE_STRICT=1``, else count it and warn
    once per topic (``then``: what happens instead, for the warning). ``cause``: the warning
    topic of a cause said elsewhere too (a full disk, ``kcache.store.errors.DISK_FULL``): one
    warning for it, whichever part of kcache met it first."""
    if strict():
        try:
            setattr(e, _MARK, True)
        except (AttributeError, TypeError):  # an exception type without a __dict__
            pass
        raise e
    counters.add(kind or "kcache", errors=1)
    warn_once(cause or f"edge:{topic}", f"{what} failed ({type(e).__name__}: {e}); {then}")


def expected(
    e: BaseException,
    kinds: tuple[type[BaseException], ...],
    topic: str,
    what: str,
    then: str = "going on without it",
    kind: str = "",
) -> bool:
    """Sort what a broad ``except`` inside kcache met, by this module's rule. True: ``e`` is a
    failure the place expects (one of ``kinds``: a full disk, a corrupt entry, a locked index),
    which the caller handles as it does (a counted miss, a skipped write). Anything else is a bug:
    raised under ``KCACHE_STRICT=1`` (as :func:`failed`), else one warning per topic and an
    ``errors`` count, and False: the caller goes on with its fallback all the same (a flush thread
    must not die, a close must finish, a lookup is a miss)."""
    if isinstance(e, kinds):
        return True
    failed(topic, what, e, kind, then)
    return False


def fail_open(
    topic: str, what: str, fallback: Callable[..., Any] | Any = None, kind: str = ""
) -> Callable[[F], F]:
    """Decorate an edge: an exception from it is :func:`failed` and the call returns
    ``fallback`` (called with the edge's arguments when callable)."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def edge(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # the edge: anything left here is a bug, reported once
                failed(topic, what, e, kind)
                return fallback(*args, **kwargs) if callable(fallback) else fallback

        return edge  # type: ignore[return-value]

    return deco


def raised_strict(e: BaseException | None) -> bool:
    """Whether ``e``, or an exception it was raised from or while handling, is one an edge
    re-raised under ``KCACHE_STRICT=1``: a broad ``except`` around a library's own function lets
    it through (it is a bug of kcache's, met in a call back into kcache)."""
    for _ in range(32):  # a chain, not a cycle (bounded all the same)
        if e is None:
            return False
        if getattr(e, _MARK, False):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def guarded(topic: str, what: str, kind: str = "", then: str = "compiling without kcache") -> Iterator[None]:
    """The same rule for a block: ``with guarded("topic", "..."):`` swallows (and reports) an
    exception from the block, or re-raises it under ``KCACHE_STRICT=1``."""
    try:
        yield
    except Exception as e:  # the edge: see fail_open
        failed(topic, what, e, kind, then)
