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
read), a tar or a gzip-compressed tar (what export writes; bz2 and xz are refused); the tar is
read member by member, never extracted; a name that is not ``e/<40 hex>/<plain file name>``, a
member that is not a regular file (links, devices, sparse files), a member that appears twice or
whose size differs from its record is refused. Before anything is read, every member is bounded
by :data:`MAX_MEMBER`, every entry by :data:`MAX_ENTRY` and the whole bundle by the store's size
bound (a bundle over any of them is refused whole, nothing imported). Members are streamed to
disk while hashed, never held whole in memory by the import (the store holds one entry's bytes
while it writes it: hence :data:`MAX_ENTRY`). What tarfile itself reads (each header with its
pax or GNU extension records and sparse maps) is bounded by :data:`MAX_HEADER`: the decompressed
stream is read through a window that advances member by member, so neither a header that claims
gigabytes nor compressed data that expands past what the manifest declares is ever read.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import msgpack

from .store import Record
from .store import trust as _trust
from .store.api import Admin, Cache
from .store.fs import atomic_write
from .store.records import CorruptRecord, valid_name, validate
from .userfile import check_depth, open_checked

SCHEMA = 1
MANIFEST = "MANIFEST"
_MEMBER_RE = re.compile(r"^e/([0-9a-f]{40})/([^/]+)$")
#: The largest manifest read (msgpack records of every entry; ~600 bytes each).
MAX_MANIFEST = 256 << 20
#: The largest single member imported (and never more than the store's size bound).
MAX_MEMBER = 1 << 30
#: The largest entry imported (all its members together): Store.put holds an entry's bytes in
#: memory while it writes it, so this bounds what an import holds (a gzip bomb of many members
#: of 1 GiB each would otherwise pass every per-member check).
MAX_ENTRY = 1 << 30
#: The most records one manifest may hold (a manifest at MAX_MANIFEST of real Triton records,
#: about 1.6 KB each, holds some 160,000): a 40 MB .tgz of 1.1 million tiny records took 1.6 GB
#: to decode. Counted from the array's header, before any record is decoded.
MAX_RECORDS = 250_000
#: The largest record in a manifest (the store reads no larger record file).
MAX_RECORD = 1 << 20
#: The most that one tar header may take with its pax or GNU extension records and sparse maps
#: (kcache's own take under 2 KiB): tarfile reads those whole, at the size the header claims.
MAX_HEADER = 64 << 10
_CHUNK = 1 << 20


class ImportTarget(Cache, Admin, Protocol):
    """What an import needs of a store: its key tag and size bound (:class:`Admin`), and a
    ``get``/``put`` of entries and a scratch folder (:class:`Cache`)."""


class BundleError(Exception):
    """A bundle that cannot be written or read (the message says why)."""


#: A bundle's manifest is signed with no domain (the format of bundles already written).
_DOMAIN = b""


def _sign(secret: bytes | None, body: bytes) -> str | None:
    return _trust.sign(secret, _DOMAIN, body).hex() if secret else None


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


class _Window:
    """The bundle's (decompressed) bytes, readable only up to :attr:`end`, which the reader moves
    ahead one member at a time: a header may take :data:`MAX_HEADER`, a member's data what its
    record declares. tarfile reads a header's pax records, GNU long names and sparse maps in one
    read of the size the header claims (a 1.5 KB tar can ask for 8 GiB) and skips members by
    reading (decompressing) through them: both stop at the window with a :class:`BundleError`,
    before anything is read or allocated."""

    def __init__(self, f: BinaryIO, path: str, compressed: bool = False) -> None:
        self._f, self.path, self.pos, self.end = f, path, 0, MAX_HEADER
        self._compressed = compressed

    def allow(self, end: int) -> None:
        self.end = end

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            n = max(0, self.end - self.pos)
        if self.pos + n > self.end:
            raise BundleError(
                f"{self.path}: the bundle asks to read {n} bytes at offset {self.pos}, past what its "
                f"manifest declares (a tar header over {MAX_HEADER} bytes, or data past a member); stopped"
            )
        b = self._f.read(n)
        self.pos += len(b)
        return b

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self.pos + offset if whence == 1 else -1
        if target < 0 or target > self.end:
            raise BundleError(f"{self.path}: the bundle seeks past what its manifest declares; stopped")
        if target > self.pos and self._compressed:
            # Forward through a compressed stream: decompress and drop, a MiB at a time
            # (GzipFile.seek goes 8 KiB at a time, four times slower).
            while self.pos < target:
                b = self._f.read(min(_CHUNK, target - self.pos))
                if not b:
                    raise BundleError(f"{self.path}: the bundle is cut short; stopped")
                self.pos += len(b)
        elif target != self.pos:
            self._f.seek(target)
            self.pos = target
        return target

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


class _Declared:
    """What an import needs of one manifest record until it writes the entry: its id, kind and
    members, and the record's bytes (decoded again then). Decoded records (key, components,
    summary) are not all held at once: a manifest costs about its own size in memory."""

    __slots__ = ("id", "kind", "files", "blob", "invalid")

    def __init__(self, rec: Record, blob: bytes) -> None:
        self.id, self.kind, self.files, self.blob = rec.id, rec.kind, rec.files, blob
        self.invalid = _invalid(rec)  # why the record is refused (a NaN, escape codes), or None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def record(self) -> Record:
        return Record.decode(self.blob)


class Bundle:
    """An opened, checked bundle: its manifest's records and whether its signature verified.
    Made by :func:`open_bundle`; its members are read by :func:`import_bundle`."""

    def __init__(
        self,
        path: str,
        tar: tarfile.TarFile,
        fileobj: BinaryIO,
        records: dict[str, _Declared],
        signed: bool,
        window: _Window | None = None,
        closers: list[Any] | None = None,
    ):
        self.path, self.tar, self._fileobj, self.records, self.signed = path, tar, fileobj, records, signed
        #: The bundle carries a signature that was not checked (no secret was given).
        self.unchecked_signature = False
        #: The KCACHE_KEY_TAG it was made under.
        self.key_tag = ""
        self.window = window
        self._closers = closers or []

    def close(self) -> None:
        try:
            self.tar.close()
        finally:
            for c in self._closers:
                try:
                    c.close()
                except Exception:  # broad: closing goes on whatever one stream met
                    pass
            self._fileobj.close()


def _next(tar: tarfile.TarFile, window: _Window, path: str) -> tarfile.TarInfo | None:
    """The next member's header, read through the window (at most :data:`MAX_HEADER` more)."""
    window.allow(max(tar.offset, window.pos) + MAX_HEADER)
    try:
        return tar.next()
    except BundleError:
        raise
    except Exception as e:  # tarfile, gzip and zlib raise many types (IndexError on a cut sparse map)
        raise BundleError(f"{path}: not a kcache bundle ({type(e).__name__}: {e})") from None


def open_bundle(
    path: str | Path, *, secret: bytes | None = None, key_tag: str = "", check_key_tag: bool = True
) -> Bundle:
    """Open ``path`` and check it: a regular file, a kcache bundle of this schema, made under
    ``key_tag`` (unless not ``check_key_tag``: to read what it holds), signed with ``secret`` if
    the bundle is signed and a secret is given. Raises :class:`BundleError` with a one-line
    reason; nothing is written."""
    path = str(path)
    # Not a regular file (a FIFO, /dev/stdin on a pipe, /dev/zero, a folder), or one that cannot
    # be opened: UserFileError, a bad argument (exit 2), before anything is read or waited on.
    fd = open_checked(path, what="a bundle")
    f = os.fdopen(fd, "rb")
    closers: list[Any] = []
    try:
        try:
            magic = f.read(6)
            f.seek(0)
        except OSError as e:
            raise BundleError(f"{path}: {e.strerror or e}") from None
        src: Any = f
        if magic[:2] == b"\x1f\x8b":
            src = gzip.GzipFile(fileobj=f, mode="rb")  # decompressed as read, never whole
            closers.append(src)
        elif magic[:3] == b"BZh" or magic == b"\xfd7zXZ\x00":
            raise BundleError(f"{path}: not a kcache bundle (bz2 or xz; kcache export writes tar or tar.gz)")
        window = _Window(src, path, compressed=src is not f)
        try:
            tar = tarfile.open(fileobj=window, mode="r:")  # type: ignore[call-overload]
        except BundleError:
            raise
        except Exception as e:  # broad: tarfile raises many kinds on hostile bytes: all one BundleError
            raise BundleError(f"{path}: not a kcache bundle ({type(e).__name__}: {e})") from None
        try:
            records, signed, carries, tag = _read_manifest(path, tar, secret, key_tag, window, check_key_tag)
        except BaseException:  # re-raised: it only cleans up on the way
            tar.close()
            raise
    except BaseException:  # re-raised: it only cleans up on the way
        for c in closers:
            try:
                c.close()
            except Exception:  # broad: closing goes on (the first error is re-raised)
                pass
        f.close()
        raise
    b = Bundle(path, tar, f, records, signed, window, closers)
    b.unchecked_signature = carries and not signed
    b.key_tag = tag
    return b


def _read_manifest(
    path: str,
    tar: tarfile.TarFile,
    secret: bytes | None,
    key_tag: str,
    window: _Window,
    check_tag: bool = True,
) -> tuple[dict[str, _Declared], bool, bool, str]:
    """(records by id, whether the signature verified, whether the bundle carries one, its tag)."""
    first = _next(tar, window, path)
    if (
        first is None
        or first.name != MANIFEST
        or not first.isreg()
        or first.issparse()
        or first.size > MAX_MANIFEST
    ):
        raise BundleError(f"{path}: not a kcache bundle (no {MANIFEST} first)")
    window.allow(first.offset_data + first.size)
    raw = _read_member(tar, first, first.size, path)
    try:
        # Every length is bounded as msgpack reads its header, before it allocates: the outer
        # map is {"body": bytes, "hmac": str}, the body a small map whose records are at most
        # MAX_RECORDS byte strings of at most MAX_RECORD each. Each copy is dropped when done
        # with: the peak is about twice the manifest.
        outer = msgpack.unpackb(
            raw, raw=False, max_map_len=16, max_array_len=16, max_str_len=1 << 10, max_bin_len=MAX_MANIFEST,
            max_ext_len=0,
        )  # fmt: skip
        del raw
        if not isinstance(outer, dict) or not isinstance(outer.get("body"), bytes):
            raise ValueError("no body")
        body, sig = outer["body"], outer.get("hmac")
        del outer
        manifest = msgpack.unpackb(
            body, raw=False, max_map_len=64, max_array_len=MAX_RECORDS, max_str_len=1 << 16,
            max_bin_len=MAX_RECORD, max_ext_len=0,
        )  # fmt: skip
    except Exception as e:  # broad: msgpack raises more than its documented errors on hostile bytes
        raise BundleError(
            f"{path}: unreadable manifest ({type(e).__name__}: {e}; at most {MAX_RECORDS} records)"
        ) from None
    # msgpack's C unpacker never recurses (a fixed stack of 1,024 levels); what kcache does with
    # the manifest may (str() of a value): nothing nested past MAX_DEPTH goes on.
    check_depth(manifest, path, "a bundle's manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != "kcache-bundle":
        raise BundleError(f"{path}: not a kcache bundle")
    if manifest.get("schema") != SCHEMA:
        raise BundleError(f"{path}: bundle schema {manifest.get('schema')!r} is not {SCHEMA}")
    signed = False
    if sig is not None and secret is not None:
        if not isinstance(sig, str) or not _trust.verify(secret, _DOMAIN, body, sig):
            raise BundleError(f"{path}: signature does not match KCACHE_SECRET; nothing imported")
        signed = True
    elif secret is not None:
        signed = False  # unsigned: what needs a signature is skipped below
    tag = str(manifest.get("key_tag", ""))
    if check_tag and tag != key_tag:
        raise BundleError(
            f"{path}: made under KCACHE_KEY_TAG={manifest.get('key_tag')!r}, this store uses {key_tag!r}; nothing imported"
        )
    del body
    records: dict[str, _Declared] = {}
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
        records[rec.id] = _Declared(rec, blob)
    return records, signed, sig is not None, tag


def _read_member(
    tar: tarfile.TarFile, m: tarfile.TarInfo, limit: int, path: str, sink: BinaryIO | _Hashing | None = None
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
    except BundleError:
        raise
    except Exception as e:  # OSError, tarfile's, gzip's EOFError, zlib.error, MemoryError
        raise BundleError(f"{path}: cannot read member {m.name!r} ({type(e).__name__}: {e})") from None
    if got != m.size:
        raise BundleError(f"{path}: member {m.name!r} is truncated ({got} of {m.size} bytes)")
    return b"".join(chunks)


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
            m = _next(b.tar, window, b.path)
            if m is None:
                break
            match = _MEMBER_RE.match(m.name)
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
                _read_member(b.tar, m, member_bound, b.path, sink=_Hashing(out, h))
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


def _invalid(rec: Any) -> str | None:
    """Why a bundle's record is refused (numbers out of range, unprintable summary, ...), or None."""
    try:
        validate(rec)
    except CorruptRecord as e:
        return str(e)
    return None


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


class _Hashing:
    """A file that hashes what is written to it."""

    def __init__(self, out: BinaryIO, h: Any) -> None:
        self.out, self.h = out, h

    def write(self, b: bytes) -> None:
        self.h.update(b)
        self.out.write(b)
