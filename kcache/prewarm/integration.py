"""Prewarm's part in a program that uses kcache (named in :mod:`.declare`, which :mod:`kcache.registry` reads): when
Triton is imported, warn once if the store was prewarmed with another Triton build
(:func:`.meta.check_store_build`), or, with ``KCACHE_RECORD`` set, record the kernels the program
compiles into a spec (:func:`.record.attach`). Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..boundary import guarded
from ..patch import CacheSlot, Integration

if TYPE_CHECKING:
    from ..store.api import Cache

_cache: CacheSlot[Cache] = CacheSlot()
_undo: list[Callable[[], None]] = []


def _attach(get_cache: Callable[[], Any]) -> Callable[[], None]:
    unbind = _cache.bind(get_cache)

    def detach() -> None:
        unbind()
        while _undo:
            # An undo expects nothing to fail: a bug, reported (raised when strict), must not
            # stop disable() from undoing the rest.
            with guarded("prewarm-detach", "undoing KCACHE_RECORD's recorder", then="going on"):
                _undo.pop()()

    return detach


def _on_triton(_mod: ModuleType) -> None:
    from .. import settings

    record_path = settings().record
    if record_path:
        from .record import attach

        _undo.append(attach(record_path))  # checks the store's build too
        return
    from .meta import check_store_build

    # An advisory check at Triton's import, which reads the store (a miss for what it cannot read):
    # what it raises is a bug, reported once (raised when strict); the program goes on.
    with guarded("prewarm-build-check", "kcache's check of the store's prewarm build", then="not checked"):
        check_store_build(_cache())


INTEGRATION = Integration(
    "prewarm",
    attach=_attach,
    on_import=_on_triton,
)
