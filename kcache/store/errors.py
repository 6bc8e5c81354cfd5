"""The store's exceptions (shared by its modules; :class:`StoreError` is public)."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be used (the message says why); caching stays off."""


class CorruptEntry(Exception):
    """An entry that fails its checks. Quarantined only if ``ident`` (the record file's identity
    as read: inode, device, mtime, ctime, size) is still what sits at its path: an entry removed
    or replaced while it was read is a plain miss."""

    def __init__(self, msg: str, ident: tuple[int, ...] | None = None) -> None:
        super().__init__(msg)
        self.ident = ident


class RefusedEntry(Exception):
    """Something in the store that is not ours to trust (owner, mode, a link): a miss, never
    served and never deleted by a lookup."""
