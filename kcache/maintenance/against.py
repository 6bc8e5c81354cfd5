"""``kcache explain --against OTHER``: why this machine misses what another one has.

OTHER is another store (a folder), a bundle (``kcache export``) or a fingerprint file
(``kcache fingerprint --json`` on the other machine). For a store or a bundle, each entry it
holds is compared, part by part, with what this machine would put in the same kind's key
(:mod:`.identity`): a part that differs means this machine's lookups never find that entry, even
in a copy of that store. The parts: ``KCACHE_KEY_TAG`` (the entry's id does not come out of its
key under this machine's tag), the Triton and torch builds, the Python ABI, the GPU, Triton's
cache-invalidating variables. For a fingerprint, the two machines' parts are compared, and each
difference is counted against the latest misses of this store whose kind it enters. One table,
the causes that explain the most entries first; an entry can have several.

An entry with no differing part would be found here: if this store lacks it, it was made there
and not (yet) here (another kernel, shape or model; or evicted here), which is its own row;
if this store holds it, it is counted as present.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..store import Record
from ..store.api import Admin
from ..store.errors import EXPECTED
from ..store.index import MAX_MISSES
from ..store.records import entry_id
from ..userfile import UserFileError
from .common import MaintenanceError, jsonable
from .identity import applies, describe, read_document, this_machine

#: The row of entries that no named part explains.
UNEXPLAINED = "(no named part differs)"
#: At most this many example names per cause.
EXAMPLES = 3


class Other:
    """The other side: its records (a store or bundle) or its parts (a fingerprint)."""

    def __init__(self, path: str, kind: str, records: Iterable[Record] = (), parts: dict[str, Any] | None = None,
                 key_tag: str | None = None, closer: Any = None) -> None:  # fmt: skip
        self.path, self.kind, self.records, self.parts = path, kind, records, parts
        self.key_tag, self._closer = key_tag, closer

    def close(self) -> None:
        if self._closer is not None:
            self._closer()


#: The largest fingerprint file read (``kcache fingerprint --json`` writes about 2 KiB).
MAX_FINGERPRINT = 1 << 20


def load_other(path: str) -> Other:
    """Open OTHER: a store folder, a fingerprint file (JSON) or a bundle. Raises
    :class:`MaintenanceError` with one line when it is none of them, and
    :class:`~kcache.userfile.UserFileError` (exit 2) when it is not a regular file (a FIFO, a
    link to one, ``/dev/stdin`` on a pipe: refused, never waited on), a fingerprint over
    :data:`MAX_FINGERPRINT` (never read whole) or one nested too deep."""
    from ..userfile import open_checked, parse_json, read_fd

    p = os.path.abspath(os.path.expanduser(path))
    try:
        is_dir = os.path.isdir(p)
    except ValueError:  # a NUL in the name: the checked open below says so
        is_dir = False
    if is_dir:
        return _store_side(p)
    what = "a fingerprint file or a bundle"
    fd = open_checked(p, what=what)  # a folder swapped in since is refused here, not followed
    try:
        head = os.read(fd, 1)
        size = os.fstat(fd).st_size
    except OSError as e:
        os.close(fd)
        raise MaintenanceError(f"{path}: {e.strerror or e}") from None
    if head == b"{":
        if size > MAX_FINGERPRINT:
            os.close(fd)
            raise UserFileError(
                f"{p} is larger than {MAX_FINGERPRINT} bytes ({size}); not read as a fingerprint file"
            )
        os.lseek(fd, 0, os.SEEK_SET)
        data = read_fd(fd, MAX_FINGERPRINT, p, "a fingerprint file")
        try:
            doc = parse_json(data, p, "a fingerprint file")
        except ValueError as e:
            if isinstance(e, UserFileError):
                raise
            raise MaintenanceError(f"{path}: not a fingerprint file ({e})") from None
        parts = read_document(doc)
        if parts is None:
            raise MaintenanceError(
                f"{path}: not a fingerprint file (write one with `kcache fingerprint --json`)"
            )
        return Other(p, "fingerprint", parts=parts, key_tag=parts.get("key_tag"))
    os.close(fd)
    from .bundlefile import BundleError, open_bundle

    try:
        b = open_bundle(p, check_key_tag=False)
    except BundleError as e:
        raise MaintenanceError(f"{e} (OTHER is a store folder, a bundle or a fingerprint file)") from None

    def records() -> Iterator[Record]:
        for d in b.records.values():
            yield d.record()

    return Other(p, "bundle", records(), key_tag=b.key_tag, closer=b.close)


def _store_side(path: str) -> Other:
    from ..config import load
    from .lifecycle import close_store, open_store

    settings = load(env={}, dir=path)
    store = open_store(settings)

    def records() -> Iterator[Record]:
        seen = set()
        try:
            for row in store.index().rows():
                if row.record is not None:
                    seen.add(row.id)
                    yield row.record
        except EXPECTED:  # a locked or corrupt index only speeds this up: the entries on disk decide
            pass
        for ident in store.iter_entry_ids():  # entries the index does not know (yet)
            if ident not in seen:
                rec, _why = store.read_record(ident)
                if rec is not None:
                    yield rec

    return Other(path, "store", records(), closer=lambda: close_store(store))


def _here_ids(store: Admin) -> set[str]:
    try:
        ids = store.index().ids()
    except EXPECTED:  # as above: the entries on disk decide
        ids = set()
    return ids | set(store.iter_entry_ids())


def _there(rec: Record, part: str, other: Other) -> Any:
    """The value of ``part`` in the key of ``rec`` as the other side made it (``...`` unknown)."""
    c = rec.components
    if part == "arch":
        t = c.get("target")
        return t if isinstance(t, str) else ...
    if part.startswith("env."):
        if "src_hash" not in c:  # no captured components: the entry does not say
            return ...
        return c.get(part)
    if part in c:
        return c[part]
    if other.parts is not None and part in other.parts:
        return other.parts[part]
    return ...


def _same(part: str, there: Any, here: Any) -> bool:
    if part == "arch":  # "cuda:90" (an entry's target) against "sm_90a" (this GPU)
        if here is None:
            return True  # no GPU here: the target is not this machine's to judge
        digits = "".join(ch for ch in str(here) if ch.isdigit())
        return str(there).split(":")[-1] == digits
    return str(there) == str(here) if there is not None and here is not None else there == here


def _shown(v: Any) -> Any:
    if v is None:
        return "(unset)"
    if v == "":
        return "(empty)"
    return jsonable(v)


def explain_against(store: Admin, other_path: str, *, key_tag: str) -> dict[str, Any]:
    """The comparison of ``store`` (this machine) with OTHER; see the module doc."""
    other = load_other(other_path)
    try:
        if other.kind == "fingerprint":
            return _against_fingerprint(store, other, key_tag)
        return _against_entries(store, other, key_tag)
    finally:
        other.close()


def _against_entries(store: Admin, other: Other, key_tag: str) -> dict[str, Any]:
    here = this_machine(key_tag, with_digest=False)
    have = _here_ids(store)
    causes: dict[str, dict[str, Any]] = {}
    total = lacking = 0
    tags_seen: set[str] = set()
    for rec in other.records:
        if rec.kind is None:
            continue
        from ..kinds import machine_local

        if machine_local(rec.kind):
            continue  # answers about that machine's own files: never meant to cross
        total += 1
        found: list[tuple[str, Any, Any]] = []
        if rec.id != entry_id(rec.kind, rec.key, key_tag):
            tag = other.key_tag
            if tag is None:
                tag = "" if rec.id == entry_id(rec.kind, rec.key, "") else "(another tag)"
            tags_seen.add(tag)
            found.append(("key_tag", tag, key_tag))
        names = set(rec.components) | {k for k in here if k.startswith("env.")} | {"arch"}
        for part in sorted(names):
            if part == "key_tag" or part not in here and not part.startswith("env."):
                continue
            if not applies(part, rec.kind):
                continue
            there = _there(rec, part, other)
            if there is ...:
                continue
            now = here.get(part)
            if not _same(part, there, now):
                found.append((part, there, now))
        if not found:
            if entry_id(rec.kind, rec.key, key_tag) in have:
                continue  # this machine's lookups would find it, and this store holds it
            found.append((UNEXPLAINED, None, None))
        lacking += 1
        name = rec.summary.get("name") or rec.components.get("kernel") or rec.kind
        for part, there, now in found:
            c = causes.setdefault(
                part, {"part": part, "entries": 0, "there": {}, "here": now, "kinds": {}, "examples": []}
            )
            c["entries"] += 1
            key = json.dumps(_shown(there))
            c["there"][key] = c["there"].get(key, 0) + 1
            c["kinds"][rec.kind] = c["kinds"].get(rec.kind, 0) + 1
            if len(c["examples"]) < EXAMPLES and str(name) not in c["examples"]:
                c["examples"].append(str(name))
    rows = []
    for c in sorted(causes.values(), key=lambda c: (c["part"] == UNEXPLAINED, -c["entries"], c["part"])):
        there = [json.loads(k) for k, _n in sorted(c["there"].items(), key=lambda kv: -kv[1])]
        rows.append(
            {
                "part": c["part"],
                "what": "not in this store, nothing differs (copy or share it; or not compiled here yet)"
                if c["part"] == UNEXPLAINED
                else describe(c["part"]),
                "entries": c["entries"],
                "there": there,
                "here": None if c["part"] == UNEXPLAINED else _shown(c["here"]),
                "kinds": c["kinds"],
                "examples": c["examples"],
            }
        )
    return {
        "other": {"path": other.path, "type": other.kind, "entries": total},
        "here": {"dir": str(store.root)},
        "lacking": lacking,
        "present": total - lacking,
        "causes": rows,
    }


def _against_fingerprint(store: Admin, other: Other, key_tag: str) -> dict[str, Any]:
    assert other.parts is not None
    here = this_machine(key_tag)
    misses: list[tuple[float, str, str, dict[str, Any]]] = []
    try:
        misses = list(store.index().misses(limit=MAX_MISSES))
    except EXPECTED:  # misses are advice; a locked or corrupt index leaves none
        pass
    rows = []
    for part in sorted(set(here) | set(other.parts)):
        there, now = other.parts.get(part), here.get(part)
        if _same(part, there, now) if part != "arch" else there == now:
            continue
        kinds: dict[str, int] = {}
        for _t, kind, _key, _comps in misses:
            if applies(part, kind):
                kinds[kind] = kinds.get(kind, 0) + 1
        rows.append(
            {
                "part": part,
                "what": describe(part),
                "entries": sum(kinds.values()),
                "there": [_shown(there)],
                "here": _shown(now),
                "kinds": kinds,
                "examples": [],
            }
        )
    rows.sort(key=lambda r: (-r["entries"], r["part"]))
    return {
        "other": {"path": other.path, "type": "fingerprint", "entries": None},
        "here": {"dir": str(store.root)},
        "misses": len(misses),
        "causes": rows,
    }


def write_fingerprint(path: str | Path, doc: dict[str, Any]) -> None:
    from ..store.fs import atomic_write

    atomic_write(str(path), (json.dumps(doc, indent=1) + "\n").encode(), mode=0o644)
