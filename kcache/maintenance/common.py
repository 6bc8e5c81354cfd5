"""What several maintenance commands share: their error, and records as plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.records import Record


class MaintenanceError(Exception):
    """A maintenance operation cannot be done (the message says why); the CLI exits 1."""


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a component or summary value (bytes as hex, tuples as lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def entry_dict(
    rec: Record, *, last_used: float | None = None, hits: int | None = None, size: int | None = None
) -> dict[str, Any]:
    """What ``inspect`` lists for one entry (``protected_until``: kept from eviction until then
    unless used first, for prewarmed entries; None otherwise)."""
    return {
        "id": rec.id,
        "kind": rec.kind,
        "key": rec.key,
        "size": rec.size if size is None else size,
        "created": rec.created,
        "last_used": last_used,
        "hits": hits,
        "compile_s": rec.compile_s,
        "summary": jsonable(rec.summary),
        "protected_until": rec.protect_until or None,
    }
