"""Records: what the store knows about an entry, as schema-versioned msgpack.

A record names the entry's kind and full key, its member files with sizes and checksums (crc32
checked on every hit, sha256 at put and by ``kcache verify``), the named key components (so that
``explain`` can say which one changed), a short human summary and the compile time it saves.

On disk a record is ``MAGIC + crc32(body) + body``: a torn or garbage record fails to decode
instead of being half-read. Only msgpack is ever decoded: no pickle anywhere.

Members also carry an xxh3-64 checksum when the ``xxhash`` module is there at put: a hit then
checks that one (tens of GB/s, against about 1 GB/s for zlib's crc32, which made the check cost
several times the read for a 2 MB cubin). crc32 is always recorded, and is what a hit checks when
the record or this process lacks xxh3.
"""

from __future__ import annotations

import re
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from ..kinds import valid_id

SCHEMA = 1
MAGIC = b"KCR1"
RECORD_NAME = "__kcache__.rec"
_HEADER = struct.Struct(">4sI")

# A member's name is one path component made of ordinary characters: records and index rows come
# from disk, and a crafted name must never reach outside the entry directory.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,254}$")


#: Member names that passed the check above in this process (Triton's are the kernel's name and a
#: suffix, the same for every specialisation of a kernel): a hit decodes a record per lookup, and
#: a set lookup is a tenth of the regex and its companions.
_names_ok: set[str] = set()
_NAMES_OK_MAX = 4096


class CorruptRecord(ValueError):
    """A record that does not decode, or decodes to something that is not a valid record."""


#: What ``msgpack.unpackb`` raises on bytes that are not what they should be (a torn record, a
#: hostile entry, manifest or row): its own errors (``UnpackException``; ``FormatError``,
#: ``StackError`` and ``ExtraData`` are ``ValueError``s too), ``ValueError`` (a truncated body, a
#: length past a bound, invalid UTF-8, a malformed timestamp) and ``TypeError`` (an unhashable map
#: key where ``strict_map_key`` is off). msgpack's docstring warns that it may raise others; a
#: fuzz of 300,000 mutated and random bodies (every option set kcache uses) met none.
DECODE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, msgpack.UnpackException)


def valid_name(name: str) -> bool:
    return bool(isinstance(name, str) and _NAME_RE.match(name)) and name != RECORD_NAME and ".." not in name


def entry_id(kind: str, key: str, tag: str = "") -> str:
    """The entry's directory name: a hash of kind, key tag and key (the full key is in the record)."""
    import hashlib  # here, not at the top: the .pth hook imports this module at start-up

    h = hashlib.sha256()
    h.update(f"kcache/{SCHEMA}\0{kind}\0{tag}\0".encode())
    h.update(key.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:40]


def crc32(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


xxh3: Callable[[bytes], int] | None
try:
    from xxhash import xxh3_64_intdigest as xxh3
except ImportError:  # optional: crc32 alone then
    xxh3 = None


class FileInfo:
    """A member: name, size and checksums. (Plain classes here, not dataclasses: importing
    dataclasses costs ~9 ms, and the .pth hook imports this module in every process.)"""

    __slots__ = ("name", "size", "crc32", "sha256", "xxh3")

    def __init__(self, name: str, size: int, crc32: int, sha256: str, xxh3: int | None = None) -> None:
        self.name, self.size, self.crc32, self.sha256, self.xxh3 = name, size, crc32, sha256, xxh3

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileInfo) and all(
            getattr(self, a) == getattr(other, a) for a in self.__slots__
        )

    def __repr__(self) -> str:
        return f"FileInfo({self.name!r}, {self.size}, {self.crc32}, {self.sha256[:12]!r}..., {self.xxh3})"

    def check(self, blob: bytes) -> bool:
        """The fast check of a hit: xxh3 when both the record and this process have it, else crc32."""
        if self.xxh3 is not None and xxh3 is not None:
            return xxh3(blob) == self.xxh3
        return crc32(blob) == self.crc32


def file_info(name: str, blob: bytes) -> FileInfo:
    """A member's sizes and checksums, as put records them."""
    import hashlib

    return FileInfo(
        name,
        len(blob),
        crc32(blob),
        hashlib.sha256(blob).hexdigest(),
        xxh3(blob) if xxh3 is not None else None,
    )


class Record:
    """What the store knows about one entry (see the module doc)."""

    __slots__ = (
        "kind",
        "key",
        "id",
        "files",
        "created",
        "compile_s",
        "components",
        "summary",
        "schema",
        "protect_until",
    )

    def __init__(
        self,
        kind: str,
        key: str,
        id: str,
        files: list[FileInfo],
        created: float | None = None,
        compile_s: float = 0.0,
        components: dict[str, Any] | None = None,
        summary: dict[str, Any] | None = None,
        schema: int = SCHEMA,
        protect_until: float = 0.0,
    ) -> None:
        self.kind, self.key, self.id, self.files = kind, key, id, files
        #: Kept from eviction until then (the store's clock) unless used first (prewarm); 0: not.
        self.protect_until = protect_until
        self.created = time.time() if created is None else created
        self.compile_s = compile_s
        self.components = {} if components is None else components
        self.summary = {} if summary is None else summary
        self.schema = schema

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and all(
            getattr(self, a) == getattr(other, a) for a in self.__slots__
        )

    def __repr__(self) -> str:
        return f"Record(kind={self.kind!r}, key={self.key!r}, id={self.id!r}, files={len(self.files)})"

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": self.schema,
            "kind": self.kind,
            "key": self.key,
            "id": self.id,
            "files": [
                [f.name, f.size, f.crc32, f.sha256] + ([f.xxh3] if f.xxh3 is not None else [])
                for f in self.files
            ],
            "created": self.created,
            "compile_s": self.compile_s,
            "components": self.components,
            "summary": self.summary,
        }
        if self.protect_until:  # only when set: every other record is what it always was
            d["protect_until"] = self.protect_until
        return d

    def encode(self) -> bytes:
        body = msgpack.packb(self.to_dict(), use_bin_type=True)
        return _HEADER.pack(MAGIC, crc32(body)) + body

    @classmethod
    def decode(cls, data: bytes) -> Record:
        if len(data) < _HEADER.size:
            raise CorruptRecord("record too short")
        magic, crc = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        if magic != MAGIC:
            raise CorruptRecord("bad record magic")
        if crc32(body) != crc:
            raise CorruptRecord("record checksum mismatch")
        try:
            d = msgpack.unpackb(
                body, raw=False, strict_map_key=True, max_bin_len=1 << 20, max_str_len=1 << 20
            )
        except DECODE_ERRORS as e:  # all mean the same here
            raise CorruptRecord(f"record does not decode: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Any) -> Record:
        try:
            if not isinstance(d, dict) or d.get("schema") != SCHEMA:
                raise CorruptRecord(
                    f"unknown record schema {d.get('schema') if isinstance(d, dict) else d!r}"
                )
            files: list[FileInfo] = []
            append, match, new, info = files.append, _NAME_RE.match, FileInfo.__new__, FileInfo
            for member in d["files"]:
                # (type() is, not isinstance, and the FileInfo filled in place: a hit decodes a
                # record per lookup; msgpack gives exact types)
                n = len(member) if type(member) is list else 0
                if n == 5:
                    name, size, crc, sha, fast = member
                    if fast is not None and type(fast) is not int:
                        raise CorruptRecord(f"bad member {name!r}")
                elif n == 4:
                    name, size, crc, sha = member
                    fast = None
                else:
                    raise CorruptRecord("bad member entry")
                if type(name) is not str or type(size) is not int or size < 0 or type(crc) is not int:
                    raise CorruptRecord(f"bad member {name!r}")
                if name not in _names_ok:
                    if match(name) is None or name == RECORD_NAME or ".." in name:
                        raise CorruptRecord(f"bad member {name!r}")
                    if len(_names_ok) >= _NAMES_OK_MAX:
                        _names_ok.clear()
                    _names_ok.add(name)
                fi = new(info)
                fi.name, fi.size, fi.crc32, fi.xxh3 = name, size, crc, fast
                fi.sha256 = sha if type(sha) is str else str(sha)
                append(fi)
            kind, key, ident = d["kind"], d["key"], d["id"]
            if not (type(kind) is str and type(key) is str and type(ident) is str):
                raise CorruptRecord("bad kind/key/id")
            if not valid_id(ident):
                raise CorruptRecord("bad id")
            comps, summary = d.get("components"), d.get("summary")
            return cls(
                kind,
                key,
                ident,
                files,
                float(d.get("created", 0.0)),
                float(d.get("compile_s", 0.0)),
                dict(comps) if comps else {},
                dict(summary) if summary else {},
                SCHEMA,
                float(d.get("protect_until") or 0.0),
            )
        except CorruptRecord:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptRecord(f"malformed record: {e}") from None


# ------------------------------------------------------------------ records from outside
# A record that came from another machine (the shared tier, a bundle) is validated before any of
# it is used: its numbers reach the index (a NaN broke a NOT NULL column and, from then on, every
# index write of every process that read it), and its strings reach terminals (inspect, explain).
MAX_FILES = 4096  # members of one entry
MAX_MEMBER_SIZE = 1 << 40
MAX_COMPILE_S = 1e6  # seconds (11 days): what one entry may claim to save
MAX_CREATED = 1e11  # seconds since 1970 (the year 5138)
MAX_KEY = 1 << 16  # characters of a key (Triton's: about 100)
MAX_COMPONENTS = 1024  # named key components
MAX_SUMMARY = 64  # summary fields, each printable and at most MAX_SUMMARY_TEXT characters
MAX_SUMMARY_TEXT = 1024
MAX_TEXT = 1 << 16  # characters of any other string in a record
MAX_NODES = 16384  # values in all components together (nested lists and maps count each)
_KIND_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


def _finite(v: Any, low: float, high: float) -> bool:
    return type(v) in (int, float) and low <= v <= high  # NaN and inf fail the comparison


def _check_value(v: Any, where: str, budget: list[int], depth: int = 0) -> None:
    """A component value: None, a bool, a 64-bit int, a finite float, a bounded string or bytes, or
    (at most four deep) lists and maps of those."""
    budget[0] -= 1
    if budget[0] < 0:
        raise CorruptRecord(f"{where}: more than {MAX_NODES} values")
    t = type(v)
    if v is None or t is bool:
        return
    if t is int:
        if not -(1 << 63) <= v < 1 << 64:
            raise CorruptRecord(f"{where}: an integer out of range")
    elif t is float:
        if not -1e300 < v < 1e300:
            raise CorruptRecord(f"{where}: a number that is not finite")
    elif t is str or t is bytes:
        if len(v) > MAX_TEXT:
            raise CorruptRecord(f"{where}: a value of {len(v)} characters")
    elif (t is list or t is dict) and depth < 4:
        items = v.items() if t is dict else enumerate(v)
        for k, x in items:
            if t is dict and (type(k) is not str or len(k) > 256):
                raise CorruptRecord(f"{where}: a bad key")
            _check_value(x, where, budget, depth + 1)
    else:
        raise CorruptRecord(f"{where}: a value of type {t.__name__}")


def validate(rec: Record) -> None:
    """Raise :class:`CorruptRecord` unless every field of ``rec`` is in range (see
    :func:`record_problem`)."""
    why = record_problem(rec)
    if why:
        raise CorruptRecord(why)


def record_problem(rec: Record) -> str | None:
    """What is wrong with a record from outside (the shared tier, a bundle), or None when every
    field is in range: finite numbers (``compile_s``, ``created``, sizes, checksums), bounded
    strings (a key without control characters but tab and newline), a printable summary of
    scalars, components of plain bounded values. One that fails is refused and counted, never
    written to the store or its index."""
    try:
        _check_record(rec)
    except CorruptRecord as e:
        return str(e)
    return None


def _check_record(rec: Record) -> None:
    if not _KIND_RE.match(rec.kind):
        raise CorruptRecord("bad kind")
    if len(rec.key) > MAX_KEY:
        raise CorruptRecord(f"a key of {len(rec.key)} characters")
    if not rec.key.isprintable() and not rec.key.replace("\t", "").replace("\n", "").isprintable():
        raise CorruptRecord("a key with control characters")
    if not _finite(rec.compile_s, 0.0, MAX_COMPILE_S):
        raise CorruptRecord(f"compile_s out of range: {str(rec.compile_s)[:20]}")
    if not _finite(rec.created, 0.0, MAX_CREATED):
        raise CorruptRecord(f"created out of range: {str(rec.created)[:20]}")
    if len(rec.files) > MAX_FILES:
        raise CorruptRecord(f"{len(rec.files)} members")
    for f in rec.files:
        if not (
            0 <= f.size <= MAX_MEMBER_SIZE
            and 0 <= f.crc32 < 1 << 32
            and _HEX64_RE.match(f.sha256)
            and (f.xxh3 is None or 0 <= f.xxh3 < 1 << 64)
        ):
            raise CorruptRecord(f"member {f.name}: size or checksums out of range")
    if type(rec.components) is not dict or len(rec.components) > MAX_COMPONENTS:
        raise CorruptRecord("components: not a map of at most 1024 names")
    _check_value(rec.components, "components", [MAX_NODES])
    s = rec.summary
    if type(s) is not dict or len(s) > MAX_SUMMARY:
        raise CorruptRecord(f"summary: not a map of at most {MAX_SUMMARY} fields")
    for k, v in s.items():
        if type(k) is not str or not 0 < len(k) <= 64 or not k.isprintable():
            raise CorruptRecord("summary: a field name that is not short printable text")
        if type(v) is str:
            if len(v) > MAX_SUMMARY_TEXT or not v.isprintable():
                raise CorruptRecord(f"summary {k}: not short printable text")
        elif not (v is None or type(v) is bool or _finite(v, -1e300, 1e300)):
            raise CorruptRecord(f"summary {k}: not a string, a finite number or null")
