"""The integrations kcache has (one line each) and what each declares before it is imported.

:data:`REGISTRY` names each integration's package. Everything kcache must know of an integration
before (or without) importing it is declared in the package's own ``declare.py``: the
:func:`kcache.enable` switch that turns it on, the modules whose import attaches it, the kinds of
entries it keeps (with their trust rules), the parts of the machine's identity that enter their
keys, and where its code is (``"module:attribute"``, imported only when needed). The facade,
:mod:`kcache.kinds`, :mod:`kcache.fingerprint` and ``kcache explain`` read those declarations
here; none of them names an integration. A new integration is its package (with a
``declare.py``) and one line in :data:`REGISTRY` (docs/design.md shows the files of one).

A ``declare.py`` imports nothing at module level: this module reads it at start-up in every
``KCACHE=1`` process, straight from its file, without importing the package around it (whose
``__init__`` may load more). Its functions may import what they need when called.

What a ``declare.py`` holds (module attributes; :class:`Declared` checks their types):

- ``INTEGRATION``: ``"module:attribute"`` of its :class:`kcache.patch.Integration`;
- ``SWITCH``: the :func:`kcache.enable` keyword that turns it on (integrations may share one);
- ``TRIGGERS``: the modules whose import attaches it;
- ``KINDS``: kind -> (what its entries hold, its traits: any of ``host_code``, ``pickled``,
  ``machine_local`` (:mod:`kcache.kinds`), ``inner`` (an entry made inside another's compile:
  credited once, :func:`kcache.counters.credit`), ``counter_only`` (counters, no entries));
- ``COMPONENTS``: the named components of the machine it adds to :mod:`kcache.fingerprint`:
  name -> ``"module:function"`` (no arguments; the value or None), and ``VERSIONS``, those of them
  that name a library build (an entry made under another is stale: ``kcache clear --stale``);
- ``IDENTITY``: ``"module:function"`` giving its parts of ``kcache fingerprint``
  (``function(costly: bool) -> dict``: part -> value; ``costly``: the digests too), ``WORDS``
  (part -> words for ``kcache explain``) and ``KEYED_BY`` (kind -> the parts, its own or the
  machine's, that enter the keys of that kind: a part's name, or a prefix ending in ``.``);
- ``USES`` (optional): the registered integrations whose components it reads (prewarm builds on
  Triton's; nvFuser's fingerprint holds torch's version);
- ``AT_EXIT`` (optional): ``"module:function"`` that pushes the counts it keeps without a lock
  to :mod:`kcache.counters` (before ``kcache.stats()`` and at exit), called only once that module
  is imported.
"""

from __future__ import annotations

import os
import sys

if False:  # annotations only (typing and collections.abc are not loaded at start-up)
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

#: name -> its package. Hooks on one module run in this order (the prewarm recorder after
#: Triton's manager is installed).
REGISTRY: dict[str, str] = {
    "triton": "kcache.triton",
    "prewarm": "kcache.prewarm",
    "nvfuser": "kcache.nvfuser",
    "torch": "kcache.inductor",
}

_HERE = os.path.dirname(os.path.abspath(__file__))
_TRAITS = frozenset({"host_code", "pickled", "signed_only", "machine_local", "inner", "counter_only"})


class Declared:
    """One integration's declaration (its package's ``declare.py``), checked."""

    __slots__ = (
        "name",
        "package",
        "integration",
        "switch",
        "triggers",
        "kinds",
        "components",
        "versions",
        "identity",
        "words",
        "keyed_by",
        "uses",
        "at_exit",
    )

    def __init__(self, name: str, package: str, mod: ModuleType) -> None:
        def get(attr: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
            value = getattr(mod, attr, default)
            if not isinstance(value, kind):
                want = kind[0] if isinstance(kind, tuple) else kind
                raise TypeError(f"{package}.declare.{attr}: {type(value).__name__}, not {want.__name__}")
            return value

        self.name, self.package = name, package
        self.integration: str = get("INTEGRATION", str)
        self.switch: str = get("SWITCH", str)
        self.triggers: tuple[str, ...] = get("TRIGGERS", tuple)
        self.kinds: dict[str, tuple[str, tuple[str, ...]]] = get("KINDS", dict, {})
        for kind, (_what, traits) in self.kinds.items():
            if not set(traits) <= _TRAITS:
                raise ValueError(
                    f"{package}.declare.KINDS[{kind!r}]: unknown traits {sorted(set(traits) - _TRAITS)}"
                )
        self.components: dict[str, str] = get("COMPONENTS", dict, {})
        self.versions: tuple[str, ...] = get("VERSIONS", tuple, ())
        self.identity: str | None = get("IDENTITY", (str, type(None)))
        self.words: dict[str, str] = get("WORDS", dict, {})
        self.keyed_by: dict[str, tuple[str, ...]] = get("KEYED_BY", dict, {})
        self.uses: tuple[str, ...] = get("USES", tuple, ())
        self.at_exit: str | None = get("AT_EXIT", (str, type(None)))

    def __repr__(self) -> str:
        return f"Declared({self.name!r}, {self.package!r})"


_declared: dict[str, Declared] = {}


def _read(package: str) -> ModuleType:
    """The package's ``declare`` module: the one imported with the package when it is, else read
    from its file, without importing the package (and kept here only, not in ``sys.modules``: a
    module there without its package would surprise tools that walk it; a declaration holds only
    literals and functions, so the package's own ``from .declare import ...`` loading it again
    gives the same values)."""
    name = f"{package}.declare"
    imported = sys.modules.get(name)
    if imported is not None:
        return imported
    parts = package.split(".")
    if parts[0] != "kcache":
        import importlib

        return importlib.import_module(name)  # not kcache's own: an ordinary import
    path = os.path.join(_HERE, *parts[1:], "declare.py")
    # importlib.machinery's own loader (bytecode cached as for any import), taken from the frozen
    # module it re-exports: importing importlib (its warnings) or importlib.util (contextlib)
    # would cost every KCACHE=1 process 1 to 6 ms at start-up.
    external: Any = sys.modules.get("_frozen_importlib_external")
    bootstrap: Any = sys.modules.get("_frozen_importlib")
    if external is None or bootstrap is None:  # not CPython
        import importlib.machinery
        import importlib.util

        external, bootstrap = importlib.machinery, importlib.util
    spec = external.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no declaration at {path}")
    mod: ModuleType = bootstrap.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def declared(name: str) -> Declared:
    """The declaration of the integration registered as ``name``."""
    got = _declared.get(name)
    if got is None:
        package = REGISTRY[name]
        got = _declared[name] = Declared(name, package, _read(package))
    return got


def declarations() -> list[Declared]:
    """Every registered integration's declaration, in :data:`REGISTRY`'s order."""
    return [declared(name) for name in REGISTRY]


def switches() -> list[str]:
    """The :func:`kcache.enable` switches, once each, in registry order."""
    out: list[str] = []
    for d in declarations():
        if d.switch not in out:
            out.append(d.switch)
    return out


def resolve(ref: str) -> Any:
    """What ``"module:attribute"`` names (imports the module)."""
    import importlib

    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def owner_of(part: str) -> Declared | None:
    """The declaration that names component or identity part ``part`` as its own, or None."""
    for d in declarations():
        if part in d.components or part in d.words:
            return d
    return None


def imported(ref: str) -> Callable[..., Any] | None:
    """What ``"module:function"`` names, only if its module is imported already (else None)."""
    module, _, attr = ref.partition(":")
    mod = sys.modules.get(module)
    return getattr(mod, attr, None) if mod is not None else None
