"""Relocatable, checksummed bundles: ``kcache export FILE`` and ``kcache import FILE``.

A bundle is a tar file (gzip when the name ends in .gz/.tgz) holding ``MANIFEST`` (msgpack: the
bundle's schema, the key tag it was made under, and each entry's record) and one member per
entry file, ``e/<id>/<name>``. Entries are re-put by kind and key, so a bundle made from one
store path imports into any other: nothing in it names a path of the machine that made it.

Trust: with ``KCACHE_SECRET`` set, the manifest carries an HMAC-SHA256 over its body; import
checks it and refuses a bundle whose signature does not match. Every file is checked against
the sha256 in its record. ``triton-aux`` entries (launcher libraries: host code loaded with
dlopen) are imported only from a bundle whose signature verified; otherwise they are skipped
and rebuilt locally on first use. The tar is read member by member, never extracted: a name
that is not ``e/<40 hex>/<plain file name>`` or a member that is not a regular file is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import msgpack

from .store import Record, Store
from .store.records import CorruptRecord, valid_name

SCHEMA = 1
MANIFEST = "MANIFEST"
HOST_CODE_KINDS = frozenset({"triton-aux"})
_MEMBER_RE = re.compile(r"^e/([0-9a-f]{40})/([^/]+)$")
_MAX_MANIFEST = 256 << 20


class BundleError(Exception):
    """A bundle that cannot be written or read (the message says why)."""


def _sign(secret: bytes | None, body: bytes) -> str | None:
    return hmac.new(secret, body, hashlib.sha256).hexdigest() if secret else None


def export_bundle(
    store: Store, path: str | Path, *, kinds: list[str] | None = None, secret: bytes | None = None
) -> dict[str, Any]:
    """Write every verified entry (of ``kinds``, if given) to the bundle ``path``."""
    records: list[Record] = []
    skipped: list[dict[str, str]] = []
    for ident in sorted(store.iter_entry_ids()):
        if not re.fullmatch(r"[0-9a-f]{40}", ident):
            continue
        # The fast check here; every byte written below is checked against its sha256 as it is read.
        hit, problem = store.read_any(ident)
        if hit is None:
            skipped.append({"id": ident, "why": problem or "unreadable"})
            continue
        if kinds and hit.record.kind not in kinds:
            continue
        records.append(hit.record)
    body = msgpack.packb(
        {
            "format": "kcache-bundle",
            "schema": SCHEMA,
            "created": time.time(),
            "key_tag": store.key_tag,
            "records": [r.encode() for r in records],
        },
        use_bin_type=True,
    )
    manifest = msgpack.packb({"body": body, "hmac": _sign(secret, body)}, use_bin_type=True)
    path = Path(path)
    if path.exists() and not path.is_file():
        raise BundleError(f"{path} exists and is not a regular file; not replacing it")
    mode = "w:gz" if path.name.endswith((".gz", ".tgz")) else "w"
    tmp = path.with_name(f".{path.name}.tmp")
    nbytes = 0
    try:
        with tarfile.open(tmp, mode) as tar:
            _add(tar, MANIFEST, manifest)
            for rec in records:
                d = store.entry_dir(rec.id)
                for f in rec.files:
                    data = (Path(d) / f.name).read_bytes()
                    if hashlib.sha256(data).hexdigest() != f.sha256:
                        raise BundleError(f"entry {rec.id[:12]} changed while exporting; try again")
                    _add(tar, f"e/{rec.id}/{f.name}", data)
                    nbytes += len(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    by_kind: dict[str, int] = {}
    for r in records:
        by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
    return {
        "file": str(path),
        "entries": len(records),
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


def import_bundle(store: Store, path: str | Path, *, secret: bytes | None = None) -> dict[str, Any]:
    """Put every entry of the bundle ``path`` into ``store``; see the module doc for what is refused."""
    try:
        tar = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as e:
        raise BundleError(f"{path}: not a kcache bundle ({e})") from None
    with tar:
        first = tar.next()
        if first is None or first.name != MANIFEST or not first.isfile() or first.size > _MAX_MANIFEST:
            raise BundleError(f"{path}: not a kcache bundle (no {MANIFEST} first)")
        raw = tar.extractfile(first).read()  # type: ignore[union-attr]
        try:
            outer = msgpack.unpackb(raw, raw=False)
            body, sig = outer["body"], outer.get("hmac")
            manifest = msgpack.unpackb(body, raw=False)
        except Exception as e:
            raise BundleError(f"{path}: unreadable manifest ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != "kcache-bundle":
            raise BundleError(f"{path}: not a kcache bundle")
        if manifest.get("schema") != SCHEMA:
            raise BundleError(f"{path}: bundle schema {manifest.get('schema')!r} is not {SCHEMA}")
        signed = False
        if sig is not None or secret is not None:
            if secret is None:
                pass  # signed, but we cannot check: treated as unsigned
            elif sig is None or not hmac.compare_digest(str(sig), _sign(secret, body) or ""):
                raise BundleError(f"{path}: signature does not match KCACHE_SECRET; nothing imported")
            else:
                signed = True
        if str(manifest.get("key_tag", "")) != store.key_tag:
            raise BundleError(
                f"{path}: made under KCACHE_KEY_TAG={manifest.get('key_tag')!r}, this store uses "
                f"{store.key_tag!r}; nothing imported"
            )
        records: dict[str, Record] = {}
        for blob in manifest.get("records", []):
            try:
                rec = Record.decode(blob)
            except CorruptRecord as e:
                raise BundleError(f"{path}: bad record in manifest ({e})") from None
            records[rec.id] = rec
        files: dict[str, dict[str, bytes]] = {}
        for m in tar:
            if m is first:
                continue
            match = _MEMBER_RE.match(m.name)
            if not match or not m.isfile() or not valid_name(match.group(2)) or match.group(1) not in records:
                raise BundleError(f"{path}: unexpected member {m.name!r}; nothing imported")
            files.setdefault(match.group(1), {})[match.group(2)] = tar.extractfile(m).read()  # type: ignore[union-attr]
    report: dict[str, Any] = {"file": str(path), "signed": signed, "imported": 0, "present": 0, "skipped": []}
    for ident, rec in records.items():
        if rec.kind in HOST_CODE_KINDS and not signed:
            report["skipped"].append(
                {"id": ident, "kind": rec.kind, "why": "host code from an unsigned bundle"}
            )
            continue
        got = files.get(ident, {})
        bad = [
            f.name for f in rec.files if hashlib.sha256(got.get(f.name, b"\0missing")).hexdigest() != f.sha256
        ]
        if bad:
            report["skipped"].append(
                {"id": ident, "kind": rec.kind, "why": f"checksum mismatch: {', '.join(bad)}"}
            )
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
    return report
