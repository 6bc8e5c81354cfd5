"""Relocatable, checksummed bundles: ``kcache export FILE`` and ``kcache import FILE``.

A bundle is a tar file holding ``MANIFEST`` (each entry's record) and one member per entry file
(its format, bounds and checked reading: :mod:`kcache.maintenance.bundlefile`). Entries are
re-put by kind and key, so a bundle made from one store path imports into any other: nothing in
it names a path of the machine that made it.

Trust: with ``KCACHE_SECRET`` set, the manifest carries an HMAC-SHA256 over its body; import
checks it and refuses a bundle whose signature does not match. Every file is checked against the
sha256 in its record. Kinds whose bytes run on the host (launcher ``.so`` files, loaded with
dlopen) or get unpickled (Inductor's entries) are imported only from a bundle whose signature
verified; otherwise they are skipped and rebuilt locally. Machine-local kinds (remembered tool
versions, libtriton digests: answers about this machine's own files) are never exported and
never imported, signed or not.

Hostile inputs (besides what reading any bundle refuses, see there): a name that is not
``e/<40 hex>/<plain file name>``, a member that is not a regular file (links, devices, sparse
files), a member that appears twice or whose size differs from its record is refused. Before
anything is read, every member is bounded by :data:`MAX_MEMBER`, every entry by
:data:`MAX_ENTRY` and the whole bundle by the store's size bound (a bundle over any of them is
refused whole, nothing imported). Members are streamed to disk while hashed, never held whole in
memory by the import (the store holds one entry's bytes while it writes it: hence
:data:`MAX_ENTRY`).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import msgpack

from .maintenance.bundlefile import (
    MANIFEST,
    MEMBER_RE,
    SCHEMA,
    Bundle,
    BundleError,
    next_member,
    open_bundle,
    read_member,
    sign,
)
from .store import trust as _trust
from .store.api import Admin, Cache
from .store.fs import atomic_write
from .store.records import valid_name

__all__ = ["Bundle", "BundleError", "export_bundle", "import_bundle", "import_problem", "open_bundle"]

#: The largest single member imported (and never more than the store's size bound).
MAX_MEMBER = 1 << 30
#: The largest entry imported (all its members together): Store.put holds an entry's bytes in
#: memory while it writes it, so this bounds what an import holds (a gzip bomb of many members
#: of 1 GiB each would otherwise pass every per-member check).
MAX_ENTRY = 1 << 30


class ImportTarget(Cache, Admin, Protocol):
    """What an import needs of a store: its key tag and size bound (:class:`Admin`), and a
    ``get``/``put`` of entries and a scratch folder (:class:`Cache`)."""


def export_bundle(
    store: Admin,
    path: str | Path,
    *,
    kinds: list[str] | None = None,
    secret: bytes | None = None,
    progress: Callable[[int], None] | None = None,
    jobs: int | None = None,
) -> dict[str, Any]:
    """Write every verified entry (of ``kinds``, if given) to the bundle ``path``.

    Entries are read and checked (sha256 of every member) ``jobs`` at a time (default: a few
    threads). The file is written through a unique temporary name created exclusively beside
    ``path`` and renamed into place: a link planted at either name is replaced, never followed.
    When no entry can be exported (an empty store, no entry of ``kinds``, every one skipped),
    nothing is written and :class:`BundleError` says why. ``progress(n)`` is called as entries
    are read."""
    from .maintenance.readers import default_jobs, ordered_map

    hits = []
    skipped: list[dict[str, str]] = []

    def read(ident: str) -> tuple[str, Any, str | None]:
        hit, problem = store.read_any(ident, full=True)  # every member against its sha256
        return ident, hit, problem

    ids = sorted(store.iter_entry_ids())
    for ident, hit, problem in ordered_map(read, ids, default_jobs() if jobs is None else jobs):
        if progress is not None:
            progress(1)
        if hit is None:
            skipped.append({"id": ident, "why": f"unreadable: {problem or 'no record'}"})
            continue
        rec = hit.record
        if kinds and rec.kind not in kinds:
            continue
        if _trust.refusal(rec.kind, signed=True) == _trust.MACHINE_LOCAL:
            skipped.append({"id": ident, "kind": rec.kind, "why": "machine-local: never exported"})
            continue
        hits.append(hit)
    if not hits:
        of = f" of kind {', '.join(kinds)}" if kinds else ""
        if skipped:
            raise BundleError(
                f"nothing exported: {count_text(len(skipped))}{of} skipped ({reasons(skipped)})"
            )
        raise BundleError(f"nothing exported: the store at {store.root} holds no entries{of}")
    body = msgpack.packb(
        {
            "format": "kcache-bundle",
            "schema": SCHEMA,
            "created": time.time(),
            "key_tag": store.key_tag,
            "records": [h.record.encode() for h in hits],
        },
        use_bin_type=True,
    )
    manifest = msgpack.packb({"body": body, "hmac": sign(secret, body)}, use_bin_type=True)
    path = Path(path)
    mode = "w:gz" if path.name.endswith((".gz", ".tgz")) else "w"
    nbytes = 0

    def write(f: BinaryIO) -> None:
        nonlocal nbytes
        with tarfile.open(fileobj=f, mode=mode) as tar:  # type: ignore[call-overload]
            _add(tar, MANIFEST, manifest)
            for h in hits:
                for m in h.record.files:
                    data = h.read(m.name)
                    _add(tar, f"e/{h.record.id}/{m.name}", data)
                    nbytes += len(data)

    try:
        atomic_write(str(path), writer=write)
    except IsADirectoryError:
        raise BundleError(f"{path} is a folder; not replacing it") from None
    by_kind: dict[str, int] = {}
    for h in hits:
        by_kind[h.record.kind] = by_kind.get(h.record.kind, 0) + 1
    return {
        "file": str(path),
        "entries": len(hits),
        "bytes": nbytes,
        "by_kind": by_kind,
        "signed": secret is not None,
        "skipped": skipped,
        "skipped_by_reason": by_reason(skipped),
    }


def by_reason(skipped: list[dict[str, str]]) -> dict[str, int]:
    """How many entries were skipped for each reason, the most frequent first."""
    counts: dict[str, int] = {}
    for s in skipped:
        why = str(s.get("why") or "?")
        counts[why] = counts.get(why, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def count_text(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def reasons(skipped: list[dict[str, str]], most: int = 4) -> str:
    """``skipped`` in a few words: "3 machine-local: never exported, 1 unreadable: ..."."""
    items = list(by_reason(skipped).items())
    text = ", ".join(f"{n} {why}" for why, n in items[:most])
    return text + (f", {len(items) - most} other reasons" if len(items) > most else "")


def import_problem(report: dict[str, Any]) -> str | None:
    """Why an import brought nothing of what it was asked to (one line), or None: nothing was
    imported, nothing of the bundle was in the store already, and the bundle was not empty
    (that too is said)."""
    if report.get("imported") or report.get("present"):
        return None
    skipped = report.get("skipped") or []
    name = report.get("file", "the bundle")
    if not skipped:
        return f"nothing imported: {name} holds no entries"
    text = f"nothing imported from {name}: {count_text(len(skipped))} skipped ({reasons(skipped)})"
    if report.get("needs_secret"):
        text += "; the bundle is signed: set KCACHE_SECRET to the secret it was signed with"
    return text


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    info.mtime = 0  # same content, same bundle bytes
    tar.addfile(info, io.BytesIO(data))


def import_bundle(
    store: ImportTarget,
    bundle: Bundle | str | Path,
    *,
    secret: bytes | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Put every entry of ``bundle`` (opened by :func:`open_bundle`, or a path) into ``store``;
    see the module doc for what is refused. Member files are streamed into a private folder
    of the store and checked against their sha256 before they become entries.

    The report: ``imported``, ``present`` (already in the store), ``skipped`` (each with why),
    ``skipped_by_reason``, ``by_kind`` (imported), ``needs_secret`` (the bundle is signed, no
    secret was given, and entries that need a signature were skipped). :func:`import_problem`
    says whether that is a failure. ``progress(n)`` is called with the bytes of each member read."""
    b = bundle if isinstance(bundle, Bundle) else open_bundle(bundle, secret=secret, key_tag=store.key_tag)
    own = b is not bundle
    try:
        report = _import(store, b, progress)
    finally:
        if own:
            b.close()
    report["skipped_by_reason"] = by_reason(report["skipped"])
    report["needs_secret"] = b.unchecked_signature and any(s["why"] == UNSIGNED for s in report["skipped"])
    return report


#: Why an entry of a kind that runs on the host or is unpickled was not imported.
UNSIGNED = "host code or pickled entry from an unsigned bundle"


def _import(store: ImportTarget, b: Bundle, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {
        "file": b.path, "signed": b.signed, "imported": 0, "present": 0, "by_kind": {}, "skipped": [],
    }  # fmt: skip
    refused: dict[str, str] = {}
    for ident, rec in b.records.items():
        why = _trust.refusal(rec.kind, b.signed)
        if rec.invalid:
            refused[ident] = f"bad record: {rec.invalid}"
        elif why == _trust.MACHINE_LOCAL:
            refused[ident] = "machine-local: never imported"
        elif why == _trust.UNSIGNED:
            refused[ident] = UNSIGNED
    declared = {(r.id, f.name): f for r in b.records.values() for f in r.files}
    total_bound = max(0, store.max_size)
    member_bound = min(MAX_MEMBER, total_bound)
    entry_bound = min(MAX_ENTRY, total_bound)
    total = sum(f.size for f in declared.values())
    if total > total_bound:
        raise BundleError(
            f"{b.path}: the bundle holds {total} bytes, more than the store's bound ({total_bound}); nothing imported"
        )
    for ident, rec in b.records.items():
        # Decided from the manifest, before anything is read (the store holds an entry's bytes
        # in memory while it writes it). Refused whole, as for the total: skipping it would
        # still mean decompressing through it.
        big = max((f.size for f in rec.files), default=0)
        if big > member_bound or rec.size > entry_bound:
            raise BundleError(
                f"{b.path}: entry {ident[:12]} ({rec.kind}) holds {rec.size} bytes, over the bound "
                f"(members at most {member_bound}, an entry at most {entry_bound}); nothing imported"
            )
    window = b.window
    if window is None:
        raise BundleError(f"{b.path}: not opened by open_bundle")
    scratch = store.scratch_dir()
    staged: dict[str, dict[str, str]] = {}
    bad: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    n = 0
    try:
        while True:
            m = next_member(b.tar, window, b.path)
            if m is None:
                break
            match = MEMBER_RE.match(m.name)
            if not match or not valid_name(match.group(2)) or match.group(1) not in b.records:
                raise BundleError(f"{b.path}: unexpected member {m.name!r}; stopped")
            if not m.isreg() or m.issparse():
                raise BundleError(f"{b.path}: member {m.name!r} is not a plain file; stopped")
            ident, name = match.group(1), match.group(2)
            info = declared.get((ident, name))
            if info is None:
                raise BundleError(f"{b.path}: member {m.name!r} is not in its record; stopped")
            if (ident, name) in seen:
                # Each copy would be read (decompressed) and staged again: a small gzip file could
                # write many times the store's bound. kcache export writes each member once.
                raise BundleError(f"{b.path}: member {m.name!r} appears twice; stopped")
            seen.add((ident, name))
            if m.size != info.size:
                raise BundleError(
                    f"{b.path}: member {m.name!r} is {m.size} bytes, its record says {info.size}; stopped"
                )
            if ident in refused:
                continue  # skipped unread: tarfile seeks (or reads past) its data, at most its declared size
            n += 1
            dst = os.path.join(scratch, f"import.{n}")
            h = hashlib.sha256()
            window.allow(m.offset_data + m.size)
            with open(dst, "xb", opener=_private_opener) as out:
                read_member(b.tar, m, member_bound, b.path, sink=_Hashing(out, h))
            if progress is not None:
                progress(m.size)
            if h.hexdigest() != info.sha256:
                bad[ident] = f"checksum mismatch: {name}"
                os.unlink(dst)
                continue
            staged.setdefault(ident, {})[name] = dst
    except (OSError, tarfile.TarError, EOFError) as e:
        raise BundleError(f"{b.path}: cannot read the bundle ({type(e).__name__}: {e})") from None
    for ident, d in b.records.items():
        if ident in refused:
            report["skipped"].append({"id": ident, "kind": d.kind, "why": refused[ident]})
            continue
        got = staged.get(ident, {})
        missing = [f.name for f in d.files if f.name not in got]
        if ident in bad or missing:
            why = bad.get(ident) or f"missing members: {', '.join(missing)}"
            report["skipped"].append({"id": ident, "kind": d.kind, "why": why})
            continue
        entry = d.record()
        if store.get(entry.kind, entry.key, count=False) is not None:
            report["present"] += 1
            continue
        hit = store.put(
            entry.kind,
            entry.key,
            {f.name: got[f.name] for f in entry.files},
            components=entry.components,
            summary=entry.summary,
            compile_s=entry.compile_s,
        )
        if hit is None:
            report["skipped"].append({"id": ident, "kind": entry.kind, "why": "the store could not write it"})
        else:
            report["imported"] += 1
            report["by_kind"][entry.kind] = report["by_kind"].get(entry.kind, 0) + 1
    for files in staged.values():
        for p in files.values():
            try:
                os.unlink(p)
            except OSError:
                pass
    return report


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


class _Hashing:
    """A file that hashes what is written to it."""

    def __init__(self, out: BinaryIO, h: Any) -> None:
        self.out, self.h = out, h

    def write(self, b: bytes) -> None:
        self.h.update(b)
        self.out.write(b)
