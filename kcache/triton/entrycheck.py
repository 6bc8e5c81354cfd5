"""Whether this Triton could use a stored Triton entry: the checks ``kcache verify`` runs on the
Triton kinds (:data:`kcache.triton.INTEGRATION` declares them; maintenance is handed them, it
imports no integration).

A group's metadata is judged by the rules of :mod:`.groupcheck` (this Triton's loader only for
entries of this Triton version), an autotune result by :mod:`.tunecheck` (this Triton's
``Config``: only for entries of this version).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .kinds import KIND_AUTOTUNE, KIND_GROUP


def _triton_version() -> str | None:
    """The installed Triton's version (its rules judge only its own entries); None without it."""
    try:
        from importlib.metadata import version

        return version("triton")
    except ImportError:  # PackageNotFoundError: no triton installed
        return None


def checks() -> dict[str, Callable[[Any], str | None]]:
    """kind -> ``check(hit)``: why Triton could not use this verified entry, or None."""
    triton_version = _triton_version()  # asked once, before verify's readers start

    def same(hit: Any) -> bool:
        return triton_version is not None and hit.record.components.get("triton_version") == triton_version

    def group(hit: Any) -> str | None:
        filename = hit.record.key.rpartition("/")[2]  # <Triton's key>/<its file>
        if not filename.endswith(".json"):
            return None
        from .groupcheck import problem

        why = problem(filename, {n: hit.read(n) for n in hit.names}, with_triton=same(hit))
        return f"Triton could not load it: {why}" if why else None

    def autotune(hit: Any) -> str | None:
        if not same(hit):  # judged by this Triton's Config
            return None
        from .tunecheck import problem

        filename = hit.record.key.rpartition("/")[2].rpartition("@")[0]  # results @<GPU>
        why = problem(hit.read(filename)) if filename in hit.names else None
        return f"Triton could not load it: {why}" if why else None

    return {KIND_GROUP: group, KIND_AUTOTUNE: autotune}
