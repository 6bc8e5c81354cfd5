"""Prewarm's part in a program that uses kcache (named in :mod:`.declare`, which :mod:`kcache.registry` reads): when
Triton is imported, warn once if the store was prewarmed with another Triton build
(:func:`.meta.check_store_build`), or, with ``KCACHE_RECORD`` set, record the kernels the program
compiles into a spec (:func:`.record.attach`). Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..log import logger
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
            try:
                _undo.pop()()
            except Exception as e:  # broad: what a recorder's undo raises must not stop disable()
                from ..boundary import strict

                if strict():
                    raise
                logger.debug("prewarm detach: %s", e)

    return detach


def _on_triton(_mod: ModuleType) -> None:
    from .. import settings

    record_path = settings().record
    if record_path:
        from .record import attach

        _undo.append(attach(record_path))  # checks the store's build too
        return
    from .meta import check_store_build

    try:
        check_store_build(_cache())
    except Exception as e:  # broad: an advisory check at Triton's import; raised under KCACHE_STRICT=1
        from ..boundary import strict

        if strict():
            raise
        logger.debug("prewarm build check: %s", e)


INTEGRATION = Integration(
    "prewarm",
    attach=_attach,
    on_import=_on_triton,
)
