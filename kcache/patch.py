"""One way to attach to another library's attributes, and to let go of them; what an integration
declares to attach (:class:`Integration`) and where it keeps the cache it is given (:class:`CacheSlot`).

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
from typing import Any, Generic, TypeVar

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
    targets = [replacement]
    if isinstance(replacement, (staticmethod, classmethod)):
        # Marked with its function too: the class hands out the function (or a method bound to
        # it), never the descriptor.
        targets.append(replacement.__func__)
    for obj in targets:
        try:
            setattr(obj, MARKER, orig)
        except (AttributeError, TypeError):
            # A builtin or a slotted object: the patch is still undone by identity, only
            # :func:`original` cannot see through it.
            pass


def replacing(value: Any) -> Callable[[Any], Any]:
    """A ``make`` for :meth:`Patches.wrap` that puts ``value`` in place, whatever was there."""
    return lambda _current: value


class Patches:
    """The attributes one integration replaced, undone in reverse order by :meth:`undo`.

    Thread-safe; idempotent per (owner, attribute): a second :meth:`wrap` of an attribute that
    already holds a kcache replacement does nothing and returns the one in place."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        # (owner, attribute, original or _MISSING, replacement, how: "attr", "dict" or "raw")
        self._done: list[tuple[Any, str, Any, Any, str]] = []

    def wrap(self, owner: Any, attr: str, make: Callable[[Any], Any], *, raw: bool = False) -> Any:
        """Replace ``owner.attr`` by ``make(current)`` (a wrapper of the current value) unless it
        is kcache's already. Returns what is in place afterwards.

        ``raw``: the attribute as ``owner`` holds it in its own ``__dict__`` (a class's
        staticmethod or classmethod object, an instance's own attribute): ``make`` is given that
        (or the value looked up, when ``owner`` only inherits it), and :meth:`undo` puts that
        back, or deletes the attribute where ``owner`` had none of its own. A replacement of
        kcache's that ``owner`` only inherits (from a base class that kcache wrapped too) is
        wrapped over, as if it were the library's."""
        with self._lock:
            current = getattr(owner, attr)
            before = owner.__dict__.get(attr, _MISSING) if raw else current
            if is_ours(before):  # raw: a replacement that ``owner`` only inherits is not in its way
                return before
            replacement = make(current if before is _MISSING else before)
            _mark(replacement, current)
            setattr(owner, attr, replacement)
            self._done.append((owner, attr, before, replacement, "raw" if raw else "attr"))
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
            self._done.append((owner, attr, before, value, "dict" if in_dict else "attr"))

    def adopt(self, owner: Any, attr: str, orig: Any) -> None:
        """Count ``owner.attr`` in, where it holds a kcache replacement that ``owner`` took itself
        (a module that imported the name after kcache wrapped it where it is defined):
        :meth:`undo` puts ``orig`` back there too."""
        with self._lock:
            current = getattr(owner, attr, _MISSING)
            if not is_ours(current) or any(o is owner and a == attr for o, a, *_ in self._done):
                return
            self._done.append((owner, attr, orig, current, "attr"))

    def holds(self, owner: Any, attr: str) -> bool:
        """Whether this set replaced ``owner.attr`` and has not undone it."""
        with self._lock:
            return any(o is owner and a == attr for o, a, *_ in self._done)

    def undo(self) -> None:
        """Put back every original whose attribute still holds what this set put there, newest
        first. Never raises: an attribute that cannot be restored is logged and left."""
        with self._lock:
            done, self._done = self._done, []
        for owner, attr, before, replacement, how in reversed(done):
            try:
                now = getattr(owner, attr, _MISSING) if how == "attr" else owner.__dict__.get(attr, _MISSING)
                if now is not replacement:
                    logger.debug("%s: %s.%s was replaced since; left as it is", self.name, owner, attr)
                    continue
                if before is _MISSING:
                    if how == "dict":
                        del owner.__dict__[attr]
                    else:
                        delattr(owner, attr)
                elif how == "dict":
                    owner.__dict__[attr] = before
                else:
                    setattr(owner, attr, before)
            except Exception as e:  # broad: a foreign object's __setattr__ may raise anything
                logger.warning("%s: could not restore %s: %s", self.name, attr, e)

    def __len__(self) -> int:
        return len(self._done)


#: What a slot holds: the face of the store an integration is typed against (``CacheSlot[Cache]``,
#: :class:`kcache.store.api.Cache`); this module, below the store, names no face itself.
C = TypeVar("C")


class CacheSlot(Generic[C]):
    """Where an integration keeps the getter of the active cache it was given at attach (see
    :class:`Integration`): calling the slot gives the cache in use now, or None (kcache off, not
    attached). A getter rather than the cache: enabling, disabling and switching stores reach
    every integration without attaching again. Declared with the face its integration uses
    (``cache: CacheSlot[Cache] = CacheSlot()``): the type checker then holds every use of the
    cache to that face."""

    __slots__ = ("_get",)

    def __init__(self) -> None:
        self._get: Callable[[], C | None] | None = None

    def bind(self, get_cache: Callable[[], C | None]) -> Callable[[], None]:
        """Use ``get_cache`` from now on; returns the function that lets go of it (only if it is
        still the one bound)."""
        self._get = get_cache

        def unbind() -> None:
            if self._get is get_cache:
                self._get = None

        return unbind

    @property
    def bound(self) -> bool:
        return self._get is not None

    def __call__(self) -> C | None:
        get = self._get
        return get() if get is not None else None


class Hooks:
    """An integration's ``attach`` and ``on_import`` (see :class:`Integration`) when it patches
    its library as it is imported: ``attach`` keeps the getter in ``slot`` (a :class:`CacheSlot`,
    or a function giving it, for an integration that loads its slot late); the ``detach`` it
    returns lets go of the getter and, when ``install`` ran since, calls ``uninstall``."""

    __slots__ = ("_install", "_slot", "_uninstall", "hooked")

    def __init__(
        self,
        slot: CacheSlot[Any] | Callable[[], CacheSlot[Any]],
        install: Callable[[Any], None],
        uninstall: Callable[[], None],
    ) -> None:
        self._slot, self._install, self._uninstall = slot, install, uninstall
        self.hooked = False  # install ran since the last attach: the detach uninstalls

    def attach(self, get_cache: Callable[[], Any]) -> Callable[[], None]:
        slot = self._slot if isinstance(self._slot, CacheSlot) else self._slot()
        unbind = slot.bind(get_cache)

        def detach() -> None:
            unbind()
            if self.hooked:
                self.hooked = False
                self._uninstall()

        return detach

    def on_import(self, mod: Any) -> None:
        self.hooked = True
        self._install(mod)


class Integration:
    """An integration's code, as the facade attaches it. What must be known before it is
    imported (its switch, the modules whose import attaches it, its kinds) it declares in its
    package's ``declare.py``, which names this object by string (:mod:`kcache.registry`); it is
    imported when one of its triggers is.

    - ``name``: its name in the registry;
    - ``attach(get_cache) -> detach``: called once per :func:`kcache.enable` (before anything
      else of it runs, even with its switch off: the integration's own objects may be used
      directly): it keeps the getter of the active cache, and ``detach`` undoes all it did;
    - ``on_import(module)``: called for each trigger imported while its switch is on (it
      patches the library; ``detach`` undoes that too);
    - ``checks()`` (optional): kind -> ``check(hit)``, why the library could not use a verified
      entry of that kind, or None (what ``kcache verify`` is handed).
    """

    __slots__ = ("attach", "checks", "name", "on_import")

    def __init__(
        self,
        name: str,
        *,
        attach: Callable[[Callable[[], Any]], Callable[[], None]],
        on_import: Callable[[Any], None],
        checks: Callable[[], dict[str, Callable[[Any], str | None]]] | None = None,
    ) -> None:
        self.name = name
        self.attach = attach
        self.on_import = on_import
        self.checks = checks

    def __repr__(self) -> str:
        return f"Integration({self.name!r})"
