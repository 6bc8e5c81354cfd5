"""A user's backend class (``KCACHE_REMOTE=package.module:Class``) as the machinery calls it.

A user's class is foreign code: whatever it raises that the contract does not name
(:mod:`.backend`: ``Unavailable``, ``Answered``, ``Full``, ``TooLarge``; ``ImportError`` from
``open``) is not a bug of kcache's, so it is never raised into the program, not even under
``KCACHE_STRICT=1`` (which raises kcache's own bugs: :mod:`kcache.boundary`). :class:`Foreign`
wraps the class (:func:`kcache.store.tiers.backend_for` makes it) and says, once per method,
what such a failure means: ``open`` turns the tier off (one warning); an operation is a failed
call (``Unavailable``: counted, charged to the breaker and the budget, a miss); ``describe``,
``node_of`` and ``split`` fall back to the defaults (one node); ``close`` is done; ``survey``
reports the error. Each cause is warned once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...log import warn_once
from ...redact import redact
from .backend import Answered, Backend, Full, LeaseView, Op, Outcome, TooLarge, Unavailable

T = TypeVar("T")

#: What the machinery reads of a backend's class (Backend's ``ClassVar`` attributes): the user's
#: values. Read from Backend's own declarations, so that an attribute added there (``poll_s``
#: was, and a hand-kept list here missed it: a user's value was never seen) needs no copy here.
CLASS_ATTRS = tuple(k for k, v in Backend.__annotations__.items() if str(v).startswith("ClassVar"))
#: What a user's class may raise, as the contract says: passed on as it is.
CONTRACT = (Unavailable, Answered, Full, TooLarge)


class Foreign(Backend):
    """``inner`` (an instance of a user's :class:`~.backend.Backend` subclass), its failures
    sorted as the module says. Anything else of it (its own attributes) reads through."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner.cfg)
        self._inner = inner
        for attr in CLASS_ATTRS:  # (class attributes of Backend: here, this instance's)
            setattr(self, attr, getattr(inner, attr))

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def _said(self, method: str, e: Exception, then: str) -> str:
        what = f"{type(e).__name__}: {e}"
        warn_once(
            f"remote-class:{method}:{type(e).__name__}",
            f"KCACHE_REMOTE={self.cfg.url}: its {method}() raised {what}; {then}",
        )
        return what

    def _op(self, method: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except CONTRACT:
            raise
        except Exception as e:  # broad: a user's class is foreign code: a failed call, not kcache's bug
            what = self._said(method, e, "counted as a failed call (a miss)")
            raise Unavailable(what) from e

    # ------------------------------------------------------------------ life
    def open(self) -> None:
        try:
            self._inner.open()
        except (ImportError, Unavailable, ValueError):
            raise  # (the machinery's own words for them: the tier is off, one warning)
        except Exception as e:  # broad: a user's class is foreign code: its failure turns the tier off
            raise ValueError(f"its open() raised {type(e).__name__}: {e}") from e

    def close(self) -> None:
        try:
            self._inner.close()
        except Exception as e:  # broad: a user's class is foreign code: the close goes on
            self._said("close", e, "closing goes on")

    def wants_upkeep(self) -> bool:
        try:
            return bool(self._inner.wants_upkeep())
        except Exception as e:  # broad: a user's class is foreign code: no upkeep then
            self._said("wants_upkeep", e, "no upkeep")
            return False

    def upkeep(self) -> float | None:
        try:
            return self._inner.upkeep()
        except Exception as e:  # broad: a user's class is foreign code: no more upkeep
            self._said("upkeep", e, "no more upkeep")
            return None

    # ------------------------------------------------------------------ nodes
    def node_of(self, ident: str, writer: bool = False) -> str:
        try:
            return self._inner.node_of(ident, writer)
        except Exception as e:  # broad: a user's class is foreign code: one node it is
            self._said("node_of", e, "taken as one node")
            return ""

    def refresh(self) -> bool:
        return self._op("refresh", self._inner.refresh)

    def split(self, items: Sequence[T], ident: Callable[[T], str], writer: bool = False) -> list[list[T]]:
        try:
            return self._inner.split(items, ident, writer)
        except Exception as e:  # broad: a user's class is foreign code: one group, as for one node
            self._said("split", e, "taken as one node")
            return [list(items)] if items else []

    # ------------------------------------------------------------------ entries
    def size(self, kind: str, ident: str) -> int:
        return self._op("size", lambda: self._inner.size(kind, ident))

    def read(self, kind: str, ident: str, size: int, limit: int) -> tuple[bytes, str] | None:
        return self._op("read", lambda: self._inner.read(kind, ident, size, limit))

    def write(self, ops: Sequence[Op]) -> list[Outcome]:
        return self._op("write", lambda: self._inner.write(ops))

    # ------------------------------------------------------------------ leases
    def lease_take(self, kind: str, ident: str, value: bytes, ttl_ms: int) -> LeaseView:
        return self._op("lease_take", lambda: self._inner.lease_take(kind, ident, value, ttl_ms))

    def lease_look(self, kind: str, ident: str) -> LeaseView:
        return self._op("lease_look", lambda: self._inner.lease_look(kind, ident))

    def lease_renew(self, items: Sequence[tuple[str, bytes, bytes]], ttl_ms: int) -> list[Outcome]:
        return self._op("lease_renew", lambda: self._inner.lease_renew(items, ttl_ms))

    def lease_replace(self, ident: str, seen: bytes, value: bytes, ttl_ms: int) -> bool:
        return self._op("lease_replace", lambda: self._inner.lease_replace(ident, seen, value, ttl_ms))

    # ------------------------------------------------------------------ reports
    def describe(self) -> dict[str, Any]:
        try:
            return dict(self._inner.describe())
        except Exception as e:  # broad: a user's class is foreign code: the default description
            self._said("describe", e, "described as a server")
            return super().describe()

    def survey(self, *, limit: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
        try:
            return self._inner.survey(limit=limit, budget_s=budget_s, timeout_s=timeout_s)
        except Exception as e:  # broad: a user's class is foreign code: its failure is the report's error
            return {"reachable": False, "error": redact(f"{type(e).__name__}: {e}")}
