"""Relocatable, checksummed bundles: ``kcache export FILE`` and ``kcache import FILE``.

A bundle is a tar file (gzip when the name ends in .gz/.tgz) holding ``MANIFEST`` (msgpack: the
bundle's schema, the key tag it was made under, and each entry's record) and one member per
entry file, ``e/<id>/<name>``. Entries are re-put by kind and key, so a bundle made from one
store path imports into any other: nothing in it names a path of the machine that made it.

Trust: with ``KCACHE_SECRET`` set, the manifest carries an HMAC-SHA256 over its body; import
checks it and refuses a bundle whose signature does not match. Every file is checked against the
sha256 in its record. Kinds whose bytes run on the host (launcher ``.so`` files, loaded with
dlopen) or get unpickled (Inductor's entries) are imported only from a bundle whose signature
verified; otherwise they are skipped and rebuilt locally. Machine-local kinds (remembered tool
versions, libtriton digests: answers about this machine's own files) are never exported and
never imported, signed or not.

Hostile inputs: the bundle must be a regular file (a FIFO or ``/dev/zero`` is refused, never
read); the tar is read member by member, never extracted; a name that is not
``e/<40 hex>/<plain file name>``, a member that is not a regular file (links, devices, sparse
files) or whose size differs from its record is refused; every member is bounded by
:data:`MAX_MEMBER` and the whole bundle by the store's size bound before anything is read, and
members are streamed to disk while hashed, never held whole in memory.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from . import kinds as _kinds
from .store import Record, Store
from .store.fs import UnsafePath, atomic_write, open_input
from .store.records import CorruptRecord, valid_name

SCHEMA = 1
MANIFEST = "MANIFEST"
_MEMBER_RE = re.compile(r"^e/([0-9a-f]{40})/([^/]+)$")
#: The largest manifest read (msgpack records of every entry; ~600 bytes each).
MAX_MANIFEST = 256 << 20
#: The largest single member imported (and never more than the store's size bound).
MAX_MEMBER = 1 << 30
_CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be written or read (the message says why)."""


def _sign(secret: bytes | None, body: bytes) -> str | None:
    return hmac.new(secret, body, hashlib.sha256).hexdigest() if secret else None


def export_bundle(
    store: Store, path: str | Path, *, kinds: list[str] | None = None, secret: bytes | None = None
) -> dict[str, Any]:
    """Write every verified entry (of ``kinds``, if given) to the bundle ``path``.

    The file is written through a unique temporary name created exclusively beside ``path`` and
    renamed into place: a link planted at either name is replaced, never followed."""
    hits = []
    skipped: list[dict[str, str]] = []
    for ident in sorted(store.iter_entry_ids()):
        # Every member checked against its sha256 as it is read.
        hit, problem = store.read_any(ident, full=True)
        if hit is None:
            skipped.append({"id": ident, "why": problem or "unreadable"})
            continue
        rec = hit.record
        if kinds and rec.kind not in kinds:
            continue
        if _kinds.machine_local(rec.kind):
            skipped.append({"id": ident, "kind": rec.kind, "why": "machine-local: never exported"})
            continue
        hits.append(hit)
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
    manifest = msgpack.packb({"body": body, "hmac": _sign(secret, body)}, use_bin_type=True)
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
    }


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    info.mtime = 0  # same content, same bundle bytes
    tar.addfile(info, io.BytesIO(data))


class Bundle:
    """An opened, checked bundle: its manifest's records and whether its signature verified.
    Made by :func:`open_bundle`; its members are read by :func:`import_bundle`."""

    def __init__(
        self, path: str, tar: tarfile.TarFile, fileobj: BinaryIO, records: dict[str, Record], signed: bool
    ):
        self.path, self.tar, self._fileobj, self.records, self.signed = path, tar, fileobj, records, signed

    def close(self) -> None:
        try:
            self.tar.close()
        finally:
            self._fileobj.close()


def open_bundle(path: str | Path, *, secret: bytes | None = None, key_tag: str = "") -> Bundle:
    """Open ``path`` and check it: a regular file, a kcache bundle of this schema, made under
    ``key_tag``, signed with ``secret`` if the bundle is signed and a secret is given. Raises
    :class:`BundleError` with a one-line reason; nothing is written."""
    path = str(path)
    try:
        fd = open_input(path)
    except UnsafePath as e:
        raise BundleError(f"{e}; not a bundle") from None
    except OSError as e:
        raise BundleError(f"{path}: {e.strerror or e}") from None
    f = os.fdopen(fd, "rb")
    try:
        try:
            tar = tarfile.open(fileobj=f, mode="r:*")
        except (OSError, tarfile.TarError, EOFError, ValueError) as e:
            raise BundleError(f"{path}: not a kcache bundle ({e})") from None
        try:
            records, signed = _read_manifest(path, tar, secret, key_tag)
        except BaseException:
            tar.close()
            raise
    except BaseException:
        f.close()
        raise
    return Bundle(path, tar, f, records, signed)


def _read_manifest(
    path: str, tar: tarfile.TarFile, secret: bytes | None, key_tag: str
) -> tuple[dict[str, Record], bool]:
    try:
        first = tar.next()
    except (OSError, tarfile.TarError, EOFError, ValueError) as e:
        raise BundleError(f"{path}: not a kcache bundle ({e})") from None
    if first is None or first.name != MANIFEST or not first.isreg() or first.size > MAX_MANIFEST:
        raise BundleError(f"{path}: not a kcache bundle (no {MANIFEST} first)")
    raw = _read_member(tar, first, first.size, path)
    try:
        outer = msgpack.unpackb(raw, raw=False)
        if not isinstance(outer, dict) or not isinstance(outer.get("body"), bytes):
            raise ValueError("no body")
        body, sig = outer["body"], outer.get("hmac")
        manifest = msgpack.unpackb(body, raw=False)
    except Exception as e:
        raise BundleError(f"{path}: unreadable manifest ({type(e).__name__}: {e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "kcache-bundle":
        raise BundleError(f"{path}: not a kcache bundle")
    if manifest.get("schema") != SCHEMA:
        raise BundleError(f"{path}: bundle schema {manifest.get('schema')!r} is not {SCHEMA}")
    signed = False
    if sig is not None and secret is not None:
        if not isinstance(sig, str) or not hmac.compare_digest(sig, _sign(secret, body) or ""):
            raise BundleError(f"{path}: signature does not match KCACHE_SECRET; nothing imported")
        signed = True
    elif secret is not None:
        signed = False  # unsigned: what needs a signature is skipped below
    if str(manifest.get("key_tag", "")) != key_tag:
        raise BundleError(
            f"{path}: made under KCACHE_KEY_TAG={manifest.get('key_tag')!r}, this store uses {key_tag!r}; nothing imported"
        )
    records: dict[str, Record] = {}
    blobs = manifest.get("records", [])
    if not isinstance(blobs, list):
        raise BundleError(f"{path}: bad manifest (records is not a list)")
    for i, blob in enumerate(blobs):
        try:
            if not isinstance(blob, bytes):
                raise CorruptRecord(f"record {i} is {type(blob).__name__}, not bytes")
            rec = Record.decode(blob)
        except CorruptRecord as e:
            raise BundleError(f"{path}: bad record in manifest ({e})") from None
        records[rec.id] = rec
    return records, signed


def _read_member(
    tar: tarfile.TarFile, m: tarfile.TarInfo, limit: int, path: str, sink: BinaryIO | None = None
) -> bytes:
    """A member's bytes (at most ``limit``), read in chunks; into ``sink`` when given."""
    if m.size > limit:
        raise BundleError(f"{path}: member {m.name!r} claims {m.size} bytes, over the bound of {limit}")
    try:
        src = tar.extractfile(m)
        if src is None:
            raise BundleError(f"{path}: member {m.name!r} is not a regular file")
        chunks, got = [], 0
        while True:
            b = src.read(min(_CHUNK, limit + 1 - got))
            if not b:
                break
            got += len(b)
            if got > limit:
                raise BundleError(f"{path}: member {m.name!r} expands past {limit} bytes")
            if sink is not None:
                sink.write(b)
            else:
                chunks.append(b)
    except (OSError, tarfile.TarError, EOFError, ValueError, MemoryError) as e:
        raise BundleError(f"{path}: cannot read member {m.name!r} ({type(e).__name__}: {e})") from None
    if got != m.size:
        raise BundleError(f"{path}: member {m.name!r} is truncated ({got} of {m.size} bytes)")
    return b"".join(chunks)


def import_bundle(
    store: Store, bundle: Bundle | str | Path, *, secret: bytes | None = None
) -> dict[str, Any]:
    """Put every entry of ``bundle`` (opened by :func:`open_bundle`, or a path) into ``store``;
    see the module doc for what is refused. Member files are streamed into a private folder
    of the store and checked against their sha256 before they become entries."""
    own = not isinstance(bundle, Bundle)
    b = open_bundle(bundle, secret=secret, key_tag=store.key_tag) if own else bundle  # type: ignore[arg-type]
    try:
        return _import(store, b)
    finally:
        if own:
            b.close()


def _import(store: Store, b: Bundle) -> dict[str, Any]:
    report: dict[str, Any] = {"file": b.path, "signed": b.signed, "imported": 0, "present": 0, "skipped": []}
    refused: dict[str, str] = {}
    for ident, rec in b.records.items():
        k = _kinds.get(rec.kind)
        if k.machine_local:
            refused[ident] = "machine-local: never imported"
        elif k.needs_signature and not b.signed:
            refused[ident] = "host code or pickled entry from an unsigned bundle"
    declared = {(r.id, f.name): f for r in b.records.values() for f in r.files}
    total_bound = max(0, store.max_size)
    member_bound = min(MAX_MEMBER, total_bound)
    total = sum(f.size for f in declared.values())
    if total > total_bound:
        raise BundleError(
            f"{b.path}: the bundle holds {total} bytes, more than the store's bound ({total_bound}); nothing imported"
        )
    scratch = store.scratch_dir()
    staged: dict[str, dict[str, str]] = {}
    bad: dict[str, str] = {}
    n = 0
    try:
        for i, m in enumerate(b.tar):
            if i == 0 and m.name == MANIFEST:
                continue  # read by open_bundle
            match = _MEMBER_RE.match(m.name)
            if not match or not valid_name(match.group(2)) or match.group(1) not in b.records:
                raise BundleError(f"{b.path}: unexpected member {m.name!r}; stopped")
            if not m.isreg() or m.issparse():
                raise BundleError(f"{b.path}: member {m.name!r} is not a plain file; stopped")
            ident, name = match.group(1), match.group(2)
            info = declared.get((ident, name))
            if info is None:
                raise BundleError(f"{b.path}: member {m.name!r} is not in its record; stopped")
            if m.size != info.size:
                raise BundleError(
                    f"{b.path}: member {m.name!r} is {m.size} bytes, its record says {info.size}; stopped"
                )
            if ident in refused:
                continue  # skipped unread: tarfile seeks (or reads past) its data
            n += 1
            dst = os.path.join(scratch, f"import.{n}")
            h = hashlib.sha256()
            with open(dst, "xb", opener=_private_opener) as out:
                _read_member(b.tar, m, member_bound, b.path, sink=_Hashing(out, h))
            if h.hexdigest() != info.sha256:
                bad[ident] = f"checksum mismatch: {name}"
                os.unlink(dst)
                continue
            staged.setdefault(ident, {})[name] = dst
    except (OSError, tarfile.TarError, EOFError) as e:
        raise BundleError(f"{b.path}: cannot read the bundle ({type(e).__name__}: {e})") from None
    for ident, rec in b.records.items():
        if ident in refused:
            report["skipped"].append({"id": ident, "kind": rec.kind, "why": refused[ident]})
            continue
        got = staged.get(ident, {})
        missing = [f.name for f in rec.files if f.name not in got]
        if ident in bad or missing:
            why = bad.get(ident) or f"missing members: {', '.join(missing)}"
            report["skipped"].append({"id": ident, "kind": rec.kind, "why": why})
            continue
        if store.get(rec.kind, rec.key, count=False) is not None:
            report["present"] += 1
            continue
        hit = store.put(
            rec.kind,
            rec.key,
            {f.name: got[f.name] for f in rec.files},
            components=rec.components,
            summary=rec.summary,
            compile_s=rec.compile_s,
        )
        if hit is None:
            report["skipped"].append({"id": ident, "kind": rec.kind, "why": "the store could not write it"})
        else:
            report["imported"] += 1
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
