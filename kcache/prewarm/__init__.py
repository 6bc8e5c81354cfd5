"""kcache prewarm: compile (and on a GPU, autotune) what a spec lists, before the first request.

``kcache.prewarm(spec_or_path, *, target=None, jobs=1, dry_run=False, dir=None, progress=None)``
returns a :class:`~kcache.prewarm.runner.Summary`; ``kcache prewarm SPEC`` is the same on the
command line. ``KCACHE_RECORD=FILE`` makes a program write such a spec (:mod:`.record`).

Importing this package is cheap (nothing of torch or triton): :func:`kcache.enable` imports
:mod:`.record` in every process.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import Summary
    from .spec import SpecError

__all__ = ["prewarm", "Summary", "SpecError", "load_spec"]


def prewarm(
    spec: Any,
    *,
    target: str | None = None,
    jobs: int = 1,
    dry_run: bool = False,
    dir: str | None = None,
    progress: Any = None,
    protect_s: float | None = None,
    paths: list[str] | None = None,
) -> Summary:
    """Prepare what ``spec`` (a path, TOML text, a mapping or a parsed spec) lists.

    ``target`` (``"cuda:90"``...) compiles for that GPU on a machine without it, in a child
    process; otherwise entries run on this machine's GPU. ``jobs`` > 1 spreads the work over that
    many processes. ``dry_run`` checks the spec and lists the work without doing it. ``dir`` is
    the store (default: the ``KCACHE_DIR`` setting). ``progress``: None (a bar on a terminal),
    False, True, or a callable receiving each finished item's result. Entries written are
    protected from eviction until first used, ``protect_s`` seconds at most (default 7 days).

    Raises :class:`~kcache.prewarm.spec.SpecError` (one line naming the entry and field) for a bad
    spec, before anything is compiled or written. Failures of single items are in the summary."""
    from .runner import prewarm as _run

    return _run(
        spec,
        target=target,
        jobs=jobs,
        dry_run=dry_run,
        dir=dir,
        progress=progress,
        protect_s=protect_s,
        paths=paths,
        in_process=None,
    )


def load_spec(spec: Any) -> Any:
    """Parse and check the structure of a spec (imports nothing)."""
    from .spec import load

    return load(spec)


def __getattr__(name: str) -> Any:
    if name == "Summary":
        from .runner import Summary

        return Summary
    if name == "SpecError":
        from .spec import SpecError

        return SpecError
    raise AttributeError(name)


class _CallableModule(types.ModuleType):
    """``kcache.prewarm`` is both this package and the function: importing the package replaces
    the function attribute of ``kcache`` with the module, so the module is callable too."""

    def __call__(self, spec: Any, **kwargs: Any) -> Summary:
        return prewarm(spec, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
