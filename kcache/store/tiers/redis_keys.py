"""Where the shared tier keeps what it keeps: one key layout, for a single server and a cluster.

    <prefix>e:<kind>:{<id>}    an entry (msgpack: record, members, signature)
    <prefix>l:{<id>}           its single-flight lock

Redis Cluster puts a key on the node that owns the hash slot of the first ``{...}`` in its name
(the whole name when there is none). Everything kcache does to one entry in one pipeline or one
Lua script (the entry, its size, its lock) names keys with the same ``{<id>}``, so they live on
one node, and a pipeline of them is one round trip to it; entries themselves spread over every
node by their ids (a hash). There is no key that every machine writes (no index): ``kcache
remote`` lists entries with ``SCAN`` per node, and the kind in an entry's name is what lets it
count them by kind without reading them.

The prefix (``KCACHE_REMOTE_PREFIX``) may hold no ``{`` or ``}`` (:mod:`kcache.config` refuses
them): a brace there would become the hash tag of every key, all on one node. Ids are 40 hex
digits and kinds are kcache's own names (letters and '-'), so neither holds a brace or a ':'.
"""

from __future__ import annotations

ENTRY = "e:"
LOCK = "l:"


def entry_key(prefix: str, kind: str, ident: str) -> str:
    return f"{prefix}{ENTRY}{kind}:{{{ident}}}"


def lock_key(prefix: str, ident: str) -> str:
    return f"{prefix}{LOCK}{{{ident}}}"


def entry_pattern(prefix: str) -> str:
    """``SCAN ... MATCH`` for every entry under ``prefix`` (the prefix holds no glob character:
    :mod:`kcache.config` allows letters, digits and ``_.:/-`` only)."""
    return f"{prefix}{ENTRY}*:{{*}}"


def parse_entry_key(prefix: str, key: bytes | str) -> tuple[str, str] | None:
    """(kind, id) of an entry's key, or None for a key that is not one."""
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    if not text.startswith(prefix + ENTRY) or not text.endswith("}"):
        return None
    kind, sep, ident = text[len(prefix) + len(ENTRY) : -1].partition(":{")
    if not sep or not kind or not ident or "{" in ident or "}" in ident:
        return None
    return kind, ident
