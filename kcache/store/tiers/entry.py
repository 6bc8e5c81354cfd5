"""What a shared tier holds for one entry, and how it is signed: one format for every backend.

One value per entry: a msgpack map ``{"f": 1, "r": record, "m": {name: bytes}, "s": sig}`` where
``record`` is :meth:`Record.encode` (every member's size, crc32 and sha256), and ``sig`` is, with
``KCACHE_SECRET``, an HMAC-SHA256 over the record (:mod:`..trust`, domain ``kcache-remote/1``).
Members are checked against the record's sha256 before anything is committed, so the signature
over the record covers them. Never pickle.

:func:`unpack_entry` is the one check of what comes back, whatever backend it came from: the
value decodes, the record decodes (its own crc32) and is the one asked for, every field of it is
within bounds (:func:`..records.validate`), the members are exactly the record's with their
sizes and checksums, and with a secret the signature holds. Anything else raises
:class:`Refused`, which the tier counts (``remote_refused``) and warns about once.
"""

from __future__ import annotations

import hashlib

import msgpack

from .. import trust as _trust
from ..records import DECODE_ERRORS, CorruptRecord, Record, crc32, validate

FORMAT = 1
SIG_DOMAIN = b"kcache-remote/1\0"
RECORD_MAX = 1 << 20
VALUE_OVERHEAD = 64 << 10  # a value may exceed KCACHE_REMOTE_MAX_ENTRY by this (record, framing)


class Refused(Exception):
    """A remote entry that is not taken: ``what`` names the reason (for counting, warnings)."""

    def __init__(self, what: str, detail: str = "") -> None:
        super().__init__(f"{what}: {detail}" if detail else what)
        self.what = what


def eligible(kind: str, secret: bytes | None) -> bool:
    """Whether entries of ``kind`` may go to and come from the shared tier: with a secret every
    entry is signed, without one only what may cross unsigned goes (:mod:`..trust`)."""
    return _trust.may_cross(kind, signed=bool(secret))


def trust_line(secret: bytes | None) -> str:
    """What ``kcache config`` and ``kcache remote`` say of the shared tier's trust."""
    if secret:
        return "shared tier: authenticated (KCACHE_SECRET): unsigned entries and locks are refused"
    return "shared tier: not authenticated (set KCACHE_SECRET)"


def sign(secret: bytes, record: bytes) -> bytes:
    return _trust.sign(secret, SIG_DOMAIN, record)


def pack_entry(record: bytes, members: dict[str, bytes], secret: bytes | None) -> bytes:
    """The value stored for an entry."""
    out: bytes = msgpack.packb(
        {"f": FORMAT, "r": record, "m": members, "s": sign(secret, record) if secret else None},
        use_bin_type=True,
    )
    return out


def unpack_entry(
    raw: bytes, *, kind: str, key: str, ident: str, secret: bytes | None, max_entry: int
) -> tuple[Record, dict[str, bytes]]:
    """The record and members of a value, checked (see the module). Raises :class:`Refused`."""
    if len(raw) > max_entry + VALUE_OVERHEAD:
        raise Refused("too large", f"{len(raw)} bytes")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_str_len=1 << 16, max_map_len=4096)
    except DECODE_ERRORS as e:
        raise Refused("malformed", f"does not decode ({type(e).__name__})") from None
    if not isinstance(d, dict) or d.get("f") != FORMAT:
        raise Refused("malformed", "not a kcache entry of this format")
    rec_bytes, members, sig = d.get("r"), d.get("m"), d.get("s")
    if not isinstance(rec_bytes, bytes) or len(rec_bytes) > RECORD_MAX or not isinstance(members, dict):
        raise Refused("malformed", "no record or members")
    if secret:
        if sig is None:
            raise Refused("unsigned", "KCACHE_SECRET is set and the entry carries no signature")
        if not isinstance(sig, bytes) or not _trust.verify(secret, SIG_DOMAIN, rec_bytes, sig):
            raise Refused("bad signature", "the signature does not match KCACHE_SECRET")
    elif _trust.refusal(kind, signed=False) == _trust.UNSIGNED:
        raise Refused("unsigned", "host code and pickles are taken only when signed")
    try:
        rec = Record.decode(rec_bytes)
    except CorruptRecord as e:
        raise Refused("corrupt", f"record: {e}") from None
    if rec.id != ident or rec.kind != kind or rec.key != key:
        raise Refused("corrupt", "the record is not the one asked for")
    try:
        validate(rec)  # numbers in range, bounded printable text: before any of it is used
    except CorruptRecord as e:
        raise Refused("bad record", str(e)) from None
    if set(members) != {f.name for f in rec.files}:
        raise Refused("corrupt", "members differ from the record")
    out: dict[str, bytes] = {}
    for f in rec.files:
        b = members[f.name]
        if not isinstance(b, bytes) or len(b) != f.size:
            raise Refused("corrupt", f"member {f.name}: size")
        if crc32(b) != f.crc32 or hashlib.sha256(b).hexdigest() != f.sha256:
            raise Refused("corrupt", f"member {f.name}: checksum mismatch")
        out[f.name] = b
    return rec, out
