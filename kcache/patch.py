"""One way to attach to another library's attributes, and to let go of them.

kcache attaches to Triton, torch and nvFuser by replacing attributes (a function, a class
attribute, a module-level name that other modules bound by name, a knob). Every replacement goes
through a :class:`Patches` (one per integration): it records what it replaced, marks what it put
there with one marker (:data:`MARKER`, the original), never wraps its own wrapper twice, and on
:meth:`Patches.undo` puts each original back only if the attribute still holds kcache's
replacement (something that wrapped it since keeps its wrapper, and the chain through ours keeps
working).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .log import logger

#: The attribute a replacement carries: the object it replaced.
MARKER = "__kcache_original__"

_MISSING = object()


def original(obj: Any) -> Any:
    """What a kcache replacement replaced (following a chain of them), or ``obj`` itself."""
    seen = 0
    while seen < 16:
        inner = getattr(obj, MARKER, _MISSING)
        if inner is _MISSING:
            return obj
        obj, seen = inner, seen + 1
    return obj


def is_ours(obj: Any) -> bool:
    """Whether ``obj`` is a replacement that kcache made."""
    return getattr(obj, MARKER, _MISSING) is not _MISSING


def _mark(replacement: Any, orig: Any) -> None:
    try:
        setattr(replacement, MARKER, orig)
    except (AttributeError, TypeError):
        # A builtin or a slotted object: the patch is still undone by identity, only
        # :func:`original` cannot see through it.
        pass


class Patches:
    """The attributes one integration replaced, undone in reverse order by :meth:`undo`.

    Thread-safe; idempotent per (owner, attribute): a second :meth:`wrap` of an attribute that
    already holds a kcache replacement does nothing and returns the one in place."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        # (owner, attribute, original or _MISSING, replacement, in __dict__ only)
        self._done: list[tuple[Any, str, Any, Any, bool]] = []

    def wrap(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> Any:
        """Replace ``owner.attr`` by ``make(current)`` (a wrapper of the current value) unless it
        is kcache's already. Returns what is in place afterwards."""
        with self._lock:
            current = getattr(owner, attr)
            if is_ours(current):
                return current
            replacement = make(current)
            _mark(replacement, current)
            setattr(owner, attr, replacement)
            self._done.append((owner, attr, current, replacement, False))
            return replacement

    def set(self, owner: Any, attr: str, value: Any, *, in_dict: bool = False) -> None:
        """Set ``owner.attr`` to ``value`` (``in_dict``: in the instance's ``__dict__``, past a
        descriptor of its class, as Triton's knobs need), remembering what was there."""
        with self._lock:
            if in_dict:
                before = owner.__dict__.get(attr, _MISSING)
                owner.__dict__[attr] = value
            else:
                before = getattr(owner, attr, _MISSING)
                setattr(owner, attr, value)
            self._done.append((owner, attr, before, value, in_dict))

    def holds(self, owner: Any, attr: str) -> bool:
        """Whether this set replaced ``owner.attr`` and has not undone it."""
        with self._lock:
            return any(o is owner and a == attr for o, a, *_ in self._done)

    def undo(self) -> None:
        """Put back every original whose attribute still holds what this set put there, newest
        first. Never raises: an attribute that cannot be restored is logged and left."""
        with self._lock:
            done, self._done = self._done, []
        for owner, attr, before, replacement, in_dict in reversed(done):
            try:
                now = owner.__dict__.get(attr, _MISSING) if in_dict else getattr(owner, attr, _MISSING)
                if now is not replacement:
                    logger.debug("%s: %s.%s was replaced since; left as it is", self.name, owner, attr)
                    continue
                if before is _MISSING:
                    if in_dict:
                        del owner.__dict__[attr]
                    else:
                        delattr(owner, attr)
                elif in_dict:
                    owner.__dict__[attr] = before
                else:
                    setattr(owner, attr, before)
            except Exception as e:  # broad: a foreign object's __setattr__ may raise anything
                logger.warning("%s: could not restore %s: %s", self.name, attr, e)

    def __len__(self) -> int:
        return len(self._done)
