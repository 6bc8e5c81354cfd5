"""kcache prewarm: compile (and on a GPU, autotune) what a spec lists, before the first request.

``kcache.prewarm(spec_or_path, *, target=None, jobs=1, dry_run=False, dir=None, progress=None,
protect_s=None, paths=None)`` returns a :class:`~kcache.prewarm.summary.Summary` (the function is
:func:`kcache.prewarm.runner.prewarm`); ``kcache prewarm SPEC`` is the same on the command line.
``KCACHE_RECORD=FILE`` makes a program write such a spec (:mod:`.record`).

The modules, in the order a prewarm walks them: :mod:`.spec` (the schema, parsed; its values in
:mod:`.values`, expressions in :mod:`.expr`), :mod:`.kernels` (what the spec names, imported and
checked), :mod:`.runner` (the request, in this process or in :mod:`.workers`), :mod:`.executors`
(one per kind of entry; Triton's through :mod:`.triton_aot`), :mod:`.summary`.

Importing this package is cheap (nothing of torch or triton): :func:`kcache.enable` imports
:mod:`.record` in every process.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import prewarm
    from .spec import SpecError
    from .summary import Summary

__all__ = ["prewarm", "Summary", "SpecError", "load_spec"]


def load_spec(spec: Any) -> Any:
    """Parse and check the structure of a spec (imports nothing)."""
    from .spec import load

    return load(spec)


def __getattr__(name: str) -> Any:
    # Imported when first asked for: importing the package stays cheap.
    if name == "prewarm":
        from .runner import prewarm

        return prewarm
    if name == "Summary":
        from .summary import Summary

        return Summary
    if name == "SpecError":
        from .spec import SpecError

        return SpecError
    raise AttributeError(name)


class _CallableModule(types.ModuleType):
    """``kcache.prewarm`` is both this package and the function: importing the package makes the
    import system set the attribute ``prewarm`` of ``kcache`` to the package, in place of the
    facade's function, so the package is callable too (``kcache.prewarm(spec)`` works either way)."""

    def __call__(self, spec: Any, **kwargs: Any) -> Summary:
        from .runner import prewarm

        return prewarm(spec, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
