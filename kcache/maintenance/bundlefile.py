"""A bundle file: its format, its bounds and its signature, and the checked reading of one
(:func:`open_bundle`, :func:`next_member`, :func:`read_member`). Writing one and importing one
into a store are :mod:`kcache.bundle`'s; ``kcache explain --against BUNDLE`` reads one here.

A bundle is a tar file (gzip when the name ends in .gz/.tgz) holding ``MANIFEST`` (msgpack: the
bundle's schema, the key tag it was made under, and each entry's record) and one member per
entry file, ``e/<id>/<name>``. With ``KCACHE_SECRET`` set, the manifest carries an HMAC-SHA256
over its body (:func:`sign`), checked when a secret is given.

Hostile inputs: the bundle must be a regular file (a FIFO or ``/dev/zero`` is refused, never
read), a tar or a gzip-compressed tar (what export writes; bz2 and xz are refused); the tar is
read member by member, never extracted. What tarfile itself reads (each header with its pax or
GNU extension records and sparse maps) is bounded by :data:`MAX_HEADER`: the decompressed stream
is read through a window (:class:`Window`) that advances member by member, so neither a header
that claims gigabytes nor compressed data that expands past what the manifest declares is ever
read. The manifest is bounded as msgpack reads it (:data:`MAX_MANIFEST`, :data:`MAX_RECORDS`,
:data:`MAX_RECORD`); what members an import takes, and how large, is :mod:`kcache.bundle`'s.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from ..store import Record
from ..store import trust as _trust
from ..store.records import DECODE_ERRORS, CorruptRecord, validate
from ..userfile import check_depth, open_checked

SCHEMA = 1
MANIFEST = "MANIFEST"
MEMBER_RE = re.compile(r"^e/([0-9a-f]{40})/([^/]+)$")
#: The largest manifest read (msgpack records of every entry; ~600 bytes each).
MAX_MANIFEST = 256 << 20
#: The most records one manifest may hold (a manifest at MAX_MANIFEST of real Triton records,
#: about 1.6 KB each, holds some 160,000): a 40 MB .tgz of 1.1 million tiny records took 1.6 GB
#: to decode. Counted from the array's header, before any record is decoded.
MAX_RECORDS = 250_000
#: The largest record in a manifest (the store reads no larger record file).
MAX_RECORD = 1 << 20
#: The most that one tar header may take with its pax or GNU extension records and sparse maps
#: (kcache's own take under 2 KiB): tarfile reads those whole, at the size the header claims.
MAX_HEADER = 64 << 10
CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be written or read (the message says why)."""


#: A bundle's manifest is signed with no domain (the format of bundles already written).
_DOMAIN = b""


def sign(secret: bytes | None, body: bytes) -> str | None:
    """The manifest body's signature under ``secret`` (hex), or None without a secret."""
    return _trust.sign(secret, _DOMAIN, body).hex() if secret else None


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    """tarfile, gzip and zlib reading bytes that may be hostile: whatever they raise is one
    :class:`BundleError` (``what``, and the error)."""
    try:
        yield
    except BundleError:
        raise
    # broad: tarfile, gzip and zlib raise undocumented types on hostile bytes (IndexError on a cut
    # sparse map, EOFError, zlib.error, MemoryError, ...): each is the same unreadable bundle
    except Exception as e:
        raise BundleError(f"{what} ({type(e).__name__}: {e})") from None


class Window:
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
                b = self._f.read(min(CHUNK, target - self.pos))
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


class Declared:
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
    Made by :func:`open_bundle`; its members are read by :func:`kcache.bundle.import_bundle`."""

    def __init__(
        self,
        path: str,
        tar: tarfile.TarFile,
        fileobj: BinaryIO,
        records: dict[str, Declared],
        signed: bool,
        window: Window | None = None,
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
                with contextlib.suppress(OSError):  # closing goes on whatever one stream met
                    c.close()
            self._fileobj.close()


def next_member(tar: tarfile.TarFile, window: Window, path: str) -> tarfile.TarInfo | None:
    """The next member's header, read through the window (at most :data:`MAX_HEADER` more)."""
    window.allow(max(tar.offset, window.pos) + MAX_HEADER)
    with _reading(f"{path}: not a kcache bundle"):
        got = tar.next()
    return got


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
        window = Window(src, path, compressed=src is not f)
        with _reading(f"{path}: not a kcache bundle"):
            tar = tarfile.open(fileobj=window, mode="r:")  # type: ignore[call-overload]
        try:
            records, signed, carries, tag = _read_manifest(path, tar, secret, key_tag, window, check_key_tag)
        except BaseException:  # re-raised: it only cleans up on the way
            tar.close()
            raise
    except BaseException:  # re-raised: it only cleans up on the way
        for c in closers:
            with contextlib.suppress(OSError):  # closing goes on (the first error is re-raised)
                c.close()
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
    window: Window,
    check_tag: bool = True,
) -> tuple[dict[str, Declared], bool, bool, str]:
    """(records by id, whether the signature verified, whether the bundle carries one, its tag)."""
    first = next_member(tar, window, path)
    if (
        first is None
        or first.name != MANIFEST
        or not first.isreg()
        or first.issparse()
        or first.size > MAX_MANIFEST
    ):
        raise BundleError(f"{path}: not a kcache bundle (no {MANIFEST} first)")
    window.allow(first.offset_data + first.size)
    raw = read_member(tar, first, first.size, path)
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
    except DECODE_ERRORS as e:
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
    records: dict[str, Declared] = {}
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
        records[rec.id] = Declared(rec, blob)
    return records, signed, sig is not None, tag


def read_member(tar: tarfile.TarFile, m: tarfile.TarInfo, limit: int, path: str, sink: Any = None) -> bytes:
    """A member's bytes (at most ``limit``), read in chunks; into ``sink`` (anything with a
    ``write``) when given."""
    if m.size > limit:
        raise BundleError(f"{path}: member {m.name!r} claims {m.size} bytes, over the bound of {limit}")
    with _reading(f"{path}: cannot read member {m.name!r}"):
        src = tar.extractfile(m)
        if src is None:
            raise BundleError(f"{path}: member {m.name!r} is not a regular file")
        chunks, got = [], 0
        while True:
            b = src.read(min(CHUNK, limit + 1 - got))
            if not b:
                break
            got += len(b)
            if got > limit:
                raise BundleError(f"{path}: member {m.name!r} expands past {limit} bytes")
            if sink is not None:
                sink.write(b)
            else:
                chunks.append(b)
    if got != m.size:
        raise BundleError(f"{path}: member {m.name!r} is truncated ({got} of {m.size} bytes)")
    return b"".join(chunks)


def _invalid(rec: Any) -> str | None:
    """Why a bundle's record is refused (numbers out of range, unprintable summary, ...), or None."""
    try:
        validate(rec)
    except CorruptRecord as e:
        return str(e)
    return None
