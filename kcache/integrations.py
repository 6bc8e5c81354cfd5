"""How the facade attaches the integrations :mod:`kcache.registry` names.

Neither this module nor the facade imports an integration until the program imports a library
it attaches to: what must be known before that (each one's :func:`kcache.enable` switch and its
trigger modules) is its declaration (its package's ``declare.py``, read by the registry without
importing the package), so that the ``KCACHE=1`` start-up hook imports none of them. An
integration's ``Integration`` (:class:`kcache.patch.Integration`) is named there by string, as
Triton names a cache manager class in ``TRITON_CACHE_MANAGER`` and as Mega-Cache imports its
registrants by name.

Start-up cost: this module and the registry import nothing that a bare interpreter has not
loaded (the hook loads them in every ``KCACHE=1`` process).
"""

from __future__ import annotations

from . import registry

if False:  # annotations only (typing and collections.abc are not loaded at start-up)
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from .patch import Integration
    from .store.api import Cache


def load(name: str) -> Integration:
    """The ``Integration`` registered as ``name`` (imports its module)."""
    integration: Integration = registry.resolve(registry.declared(name).integration)
    return integration


def entry_checks() -> dict[str, Callable[[Any], str | None]]:
    """kind -> ``check(hit)`` from every integration that declares checks: what ``kcache verify``
    is handed (why a library could not use a verified entry of its kind, or None). Imports the
    integrations, not the libraries they attach to."""
    out: dict[str, Callable[[Any], str | None]] = {}
    for name in registry.REGISTRY:
        integ = load(name)
        if integ.checks is not None:
            out.update(integ.checks())
    return out


def attach(
    get_cache: Callable[[], Cache | None],
    usable: Callable[[], bool],
    switches: dict[str, bool],
    undo: list[Callable[[], None]],
) -> None:
    """Attach every registered integration for one :func:`kcache.enable`, appending to ``undo``
    what undoes it (the facade runs it last-in first-out at :func:`kcache.disable`).

    Each integration is given ``get_cache`` as soon as its module is imported (now, if it is
    already), whatever its switch: its objects may be used directly (a cache manager Triton was
    told to build, a program's own calls). When one of its triggers is imported, its switch is on
    and ``usable()`` (the settings are good), it is imported and its ``on_import`` patches the
    library."""
    from ._imports import when_imported

    detach: dict[str, Callable[[], None]] = {}  # name -> what undoes its attach, this enable

    def attached(name: str, integration: Integration) -> Integration:
        if name not in detach:
            detach[name] = integration.attach(get_cache)
            undo.append(lambda: detach.pop(name)())
        return integration

    for declared in registry.declarations():
        name = declared.name
        module, _, attr = declared.integration.partition(":")

        def on_module(mod: ModuleType, name: str = name, attr: str = attr) -> None:
            attached(name, getattr(mod, attr))

        when_imported(module, on_module)
        undo.append(_forgetting(module, on_module))
        if not switches.get(declared.switch, True):
            continue

        def on_trigger(mod: ModuleType, name: str = name) -> None:
            if usable():
                attached(name, load(name)).on_import(mod)

        for trigger in declared.triggers:
            when_imported(trigger, on_trigger)
            undo.append(_forgetting(trigger, on_trigger))


def _forgetting(module: str, fn: Callable[[ModuleType], None]) -> Callable[[], None]:
    """What undoes ``when_imported(module, fn)``."""
    from ._imports import forget

    return lambda: forget(module, fn)


def push_counts() -> None:
    """Each integration that counts without a lock (its declaration's ``AT_EXIT``) pushes its
    counts to :mod:`kcache.counters` now, if its module is imported (nothing is imported for it)."""
    from .boundary import guarded

    for declared in registry.declarations():
        if declared.at_exit is None:
            continue
        fn = registry.imported(declared.at_exit)
        if fn is not None:
            with guarded(f"{declared.name}-counts", f"kcache's count of {declared.name}'s cache hits"):
                fn()
