"""The integrations, named by string, and how the facade attaches them.

:data:`REGISTRY` names each integration's :class:`kcache.patch.Integration` as
``"module:ATTRIBUTE"`` (as Triton names a cache manager class in ``TRITON_CACHE_MANAGER``, and as
Mega-Cache imports its registrants by name): neither this module nor the facade imports an
integration until the program imports a library it attaches to. What must be known before that
(each one's :func:`kcache.enable` switch and its trigger modules) is :data:`STARTUP`, a copy of
what each ``Integration`` declares (tests/test_integrations.py checks that they agree), so that
the ``KCACHE=1`` start-up hook imports none of them.

Adding an integration: its package, with an ``INTEGRATION``, and one line in each table here.

Start-up cost: this module imports nothing (the hook loads it in every ``KCACHE=1`` process).
"""

from __future__ import annotations

if False:  # annotations only (typing and collections.abc are not loaded at start-up)
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from .patch import Integration

#: name -> where its ``Integration`` is. Hooks on one module run in this order (the prewarm
#: recorder after Triton's manager is installed).
REGISTRY: dict[str, str] = {
    "triton": "kcache.triton:INTEGRATION",
    "prewarm": "kcache.prewarm.integration:INTEGRATION",
    "nvfuser": "kcache.nvfuser:INTEGRATION",
    "torch": "kcache.inductor:INTEGRATION",
}

_TORCH = (
    "torch._inductor.config",
    "torch._functorch.config",
    "torch._dynamo.config",
    "torch._inductor.remote_cache",
    "torch._inductor.cpp_builder",
    "torch._dynamo.package",
    "torch._inductor.runtime.triton_heuristics",
    "torch._inductor.cpu_vec_isa",
    "torch._inductor.utils",
    "torch._inductor.codecache",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._dynamo.pgo",
    "torch._inductor.runtime.autotune_cache",
    "torch._inductor.compile_fx",
    "torch._functorch._aot_autograd.aot_autograd_result",
    "torch._functorch._aot_autograd.graph_compile",
    "torch._functorch.aot_autograd",
    "torch._inductor.async_compile",
    "torch._inductor.codegen.triton",
)

#: name -> (its enable() switch, its triggers), as its ``Integration`` declares them.
STARTUP: dict[str, tuple[str, tuple[str, ...]]] = {
    "triton": ("triton", ("triton",)),
    "prewarm": ("triton", ("triton",)),
    "nvfuser": ("nvfuser", ("nvfuser_direct", "nvfuser")),
    "torch": ("torch", _TORCH),
}


def load(name: str) -> Integration:
    """The ``Integration`` registered as ``name`` (imports its module)."""
    import importlib

    module, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def entry_checks() -> dict[str, Callable[[Any], str | None]]:
    """kind -> ``check(hit)`` from every integration that declares checks: what ``kcache verify``
    is handed (why a library could not use a verified entry of its kind, or None). Imports the
    integrations, not the libraries they attach to."""
    out: dict[str, Callable[[Any], str | None]] = {}
    for name in REGISTRY:
        integ = load(name)
        if integ.checks is not None:
            out.update(integ.checks())
    return out


def attach(
    get_cache: Callable[[], Any],
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
    from ._imports import forget, when_imported

    detach: dict[str, Callable[[], None]] = {}  # name -> what undoes its attach, this enable

    def attached(name: str, integration: Integration) -> Integration:
        if name not in detach:
            detach[name] = integration.attach(get_cache)
            undo.append(lambda: detach.pop(name)())
        return integration

    for name, target in REGISTRY.items():
        module, _, attr = target.partition(":")
        switch, triggers = STARTUP[name]

        def on_module(mod: ModuleType, name: str = name, attr: str = attr) -> None:
            attached(name, getattr(mod, attr))

        when_imported(module, on_module)
        undo.append(lambda module=module, fn=on_module: forget(module, fn))
        if not switches.get(switch, True):
            continue

        def on_trigger(mod: ModuleType, name: str = name) -> None:
            if usable():
                attached(name, load(name)).on_import(mod)

        for trigger in triggers:
            when_imported(trigger, on_trigger)
            undo.append(lambda trigger=trigger, fn=on_trigger: forget(trigger, fn))
