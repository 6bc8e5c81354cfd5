"""A lookup's counts, for :class:`~.cache.TieredCache` (its ``_count_hit`` and ``_count_miss``):
hits, misses and what a hit saved (``kcache stats``), each hit's last use (``inspect``), and each
miss's key components (``explain``).

What they must add up to (issue 36): a hit is a lookup a program made that the store served, so
every entry's own hit count adds up to the store's hits. A prewarm's lookups (the store
protecting what it writes: ``hits_are_use`` off) are checks of what the store holds, not uses:
they count in this process's totals (the prewarm's summary reads them), not in the store's. A hit
of a kind nested in a served torch.compile graph credits only what the graph's time does not
cover (:func:`kcache.counters.credit`); the rest is counted as ``covered_s``, so that stats can
say why such hits saved "0.0 s".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import counters as _counters
from ..boundary import guarded

if TYPE_CHECKING:
    from .api import Components
    from .hit import Hit


def count_hit(cache: Any, hit: Hit, **more: float) -> None:
    """Count ``hit`` (with ``more`` counters, e.g. ``waited=1``) and note its use."""
    rec = hit.record
    # credit(): nested entries (a graph's kernels) are credited once, not each.
    saved = _counters.credit(rec.kind, rec.compile_s)
    if not cache.disk.hits_are_use:  # prewarming: a check of what the store holds, not a use
        cache.counts.add_here(rec.kind, hits=1, saved_s=saved, **more)
        return
    covered = _counters.covered(rec.kind, rec.compile_s, saved)
    if covered:
        more = {**more, "covered_s": covered}
    if more:
        cache.counts.add(rec.kind, hits=1, saved_s=saved, **more)
    else:
        cache.counts.hit(rec.kind, saved)
    cache.disk.note_use(rec)


def count_miss(cache: Any, kind: str, key: str, components: Components, **more: float) -> None:
    """Count a miss of (kind, key) (with ``more``, e.g. ``recached=1``) and remember its key
    components for ``kcache explain``."""
    (cache.counts.add if cache.disk.hits_are_use else cache.counts.add_here)(kind, misses=1, **more)
    if components is not None and not cache.readonly:
        comps: dict[str, Any] = {}
        # An integration's code, for explain only: nothing is expected of it, what it raises is a
        # bug (raised under KCACHE_STRICT=1, else one warning), and the lookup goes on.
        with guarded("store-components", f"kcache's key components of a {kind} entry", then="not logged"):
            comps = dict(components() if callable(components) else components)
        cache.disk.note_miss(kind, key, comps)
