"""Kinds of Triton entries and their store keys (shared by the manager and the importer; no
Triton import here)."""

from __future__ import annotations

from .declare import KIND_AUTOTUNE, KIND_AUX, KIND_GROUP

__all__ = ["KIND_AUTOTUNE", "KIND_AUX", "KIND_GROUP", "kind_of", "store_key"]


def kind_of(filename: str) -> str | None:
    """The kind of a file Triton puts on its own (None: a member of a group)."""
    if filename.endswith(".autotune.json"):
        return KIND_AUTOTUNE
    if filename.endswith((".so", ".pyd", ".dylib")) or ".so." in filename:
        return KIND_AUX
    return None


def store_key(key: str, filename: str, gpu: str | None = None) -> str:
    """The store key of Triton's file ``filename`` under Triton's cache key ``key`` (base32).

    Groups are stored under their metadata file's name; autotune results also under the model of
    the GPU that measured them (``gpu``), which Triton's key leaves out."""
    if kind_of(filename) == KIND_AUTOTUNE:
        return f"{key}/{filename}@{gpu or 'no-gpu'}"
    return f"{key}/{filename}"
