"""The store side: one ``nvfuser`` entry per kernel, one ``nvfuser-manifest`` per fingerprint.

An entry's key is ``<fingerprint hash>/<content hash>``, so the same kernel compiled by two
processes is one entry (the store keeps the first one committed). The manifest lists a
fingerprint's members so that a new process finds its kernels with one read. Why not the store's
index alone: its writes are best-effort (a busy index drops a row), it may be node-local on a
network filesystem, and scanning it decodes every ``nvfuser`` record of every fingerprint. So the
index is only the fallback when the manifest is missing, and the next harvest writes the manifest
again from it. The manifest is replaced (read, merge, remove, put) under the store's lock for it.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgpack

from ... import kinds as _kinds
from ...log import warn_once
from ..declare import NVFUSER, NVFUSER_MANIFEST
from .fingerprint import SCHEMA, Fingerprint
from .folder import Kernel

if TYPE_CHECKING:
    from ...store.api import Cache

KIND = NVFUSER
MANIFEST_KIND = NVFUSER_MANIFEST
LOCK_TIMEOUT_S = 20.0
#: What decoding stored bytes raises when they are not what kcache wrote (hostile or corrupt):
#: msgpack's errors (ValueError and its own base; TypeError for a key that cannot be hashed), a
#: member that is not there (KeyError).
_UNDECODABLE = (ValueError, TypeError, KeyError, msgpack.UnpackException)


def entry_key(fp: Fingerprint, content_hash: str) -> str:
    """The store key of one kernel: ``<fingerprint hash>/<content hash>``."""
    return f"{fp.hash}/{content_hash}"


def _short_name(signature: str) -> str:
    """``nvfuser_pointwise_f0_c1_r0_g0`` from its mangled form, else the signature itself."""
    m = re.match(r"_ZN3nvf(\d+)", signature)
    if m:
        n = int(m.group(1))
        return signature[m.end() : m.end() + n]
    return signature[:80]


def key_components(fp: Fingerprint, k: Kernel | None = None) -> dict[str, Any]:
    comps: dict[str, Any] = dict(fp.components)
    comps["fingerprint"] = fp.hash
    if k is not None:
        comps["kernel"] = _short_name(k.signature)
        comps["kernel_signature"] = k.signature
        comps["compile_args"] = k.compile_args
        comps["source_hash"] = hashlib.sha256(k.code).hexdigest()[:16]
    return comps


def put_kernel(store: Cache, fp: Fingerprint, k: Kernel) -> str | None:
    """Store one kernel: ``"added"``, ``"already"`` (another process committed the same kernel
    first: the store keeps the first, immutable), or None when the store refused."""
    meta = msgpack.packb(
        {
            "schema": SCHEMA,
            "kernel_signature": k.signature,
            "compile_args": k.compile_args,
            "fingerprint": fp.hash,
        },
        use_bin_type=True,
    )
    summary = {
        "kernel": _short_name(k.signature),
        "arch": fp.components.get("arch"),
        "nvfuser": fp.components.get("nvfuser_build") or fp.components.get("nvfuser_version"),
        "nvrtc": fp.components.get("nvrtc"),
    }
    hit = store.put(
        KIND,
        entry_key(fp, k.content_hash),
        {"kernel.cu": k.code, "kernel.cubin": k.cubin, "meta.msgpack": meta},
        components=key_components(fp, k),
        summary=summary,
    )
    if hit is None:
        return None
    mine = hashlib.sha256(k.cubin).hexdigest()
    theirs = next((f.sha256 for f in hit.record.files if f.name == "kernel.cubin"), None)
    return "added" if theirs == mine else "already"


def kernel_from_hit(hit: Any, content_hash: str) -> Kernel | None:
    """The stored kernel, if its members decode and agree with the key they are stored under."""
    try:
        meta = msgpack.unpackb(hit.read("meta.msgpack"), raw=False, max_str_len=1 << 20, max_bin_len=1 << 20)
        if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
            return None
        sig, args = meta.get("kernel_signature"), meta.get("compile_args")
        if not isinstance(sig, str) or not isinstance(args, str):
            return None
        k = Kernel(sig, args, hit.read("kernel.cu"), hit.read("kernel.cubin"))
    except _UNDECODABLE:  # stored bytes that do not make a kernel (hostile or corrupt): a miss
        return None
    if k.problem() or k.content_hash != content_hash:
        return None
    return k


def read_manifest(store: Cache, fp: Fingerprint, count: bool = True) -> list[str] | None:
    hit = store.get(MANIFEST_KIND, fp.hash, count=count)
    if hit is None:
        return None
    try:
        d = msgpack.unpackb(hit.read("manifest.msgpack"), raw=False, max_str_len=1 << 10)
        members = d["members"] if isinstance(d, dict) and d.get("schema") == SCHEMA else None
        if not isinstance(members, list):
            return None
        return [m for m in members if _kinds.valid_id(m)]
    except _UNDECODABLE:  # hostile or corrupt bytes: no manifest
        return None


def _index_members(store: Cache, fp: Fingerprint) -> list[str]:
    """Members of ``fp`` as the store's catalogue lists them (the fallback listing)."""
    prefix = fp.hash + "/"
    out = [key[len(prefix) :] for key in store.keys(KIND, prefix)]
    out = [h for h in out if _kinds.valid_id(h)]
    out.reverse()  # oldest first, as a manifest lists them
    return out


def list_members(store: Cache, fp: Fingerprint) -> tuple[list[str], str]:
    """Content hashes stored for ``fp`` (oldest first) and where the list came from:
    ``manifest``, or ``index`` when there is no readable manifest."""
    members = read_manifest(store, fp)
    if members is None and not store.readonly:
        # A harvester replaces the manifest (remove, then put) under the lock: read it there.
        lk = store.lock(MANIFEST_KIND, fp.hash, timeout=5.0)
        try:
            members = read_manifest(store, fp, count=False)
        finally:
            if lk is not None:
                lk.release()
    if members is not None:
        return members, "manifest"
    return _index_members(store, fp), "index"


def update_manifest(
    store: Cache, fp: Fingerprint, add: Iterable[str] = (), drop: Iterable[str] = ()
) -> list[str] | None:
    """Add members to (and remove confirmed-absent members from) ``fp``'s manifest, under the
    store's lock for it. Returns the new member list, or None if it could not be written."""
    if store.readonly:
        return None
    add, drop = list(add), list(drop)
    lk = store.lock(MANIFEST_KIND, fp.hash, timeout=LOCK_TIMEOUT_S)
    if lk is None:
        warn_once("nvfuser-manifest-lock", "nvfuser: the kernel list of this store is locked; not updated")
        return None
    try:
        cur = read_manifest(store, fp, count=False)
        existed = cur is not None
        if cur is None:
            cur = _index_members(store, fp)
        gone = set()
        for h in drop:
            if h in cur:
                if store.get(KIND, entry_key(fp, h), count=False) is None:
                    # missing or corrupt (a corrupt one is removed): confirmed here, under the lock
                    gone.add(h)
        seen = set()
        new = []
        for h in [*cur, *add]:
            if h not in seen and h not in gone:
                seen.add(h)
                new.append(h)
        if existed and new == cur:
            return new
        blob = msgpack.packb(
            {"schema": SCHEMA, "fingerprint": fp.hash, "members": new, "updated": time.time()},
            use_bin_type=True,
        )
        if existed:
            store.forget(MANIFEST_KIND, fp.hash)
        hit = store.put(
            MANIFEST_KIND,
            fp.hash,
            {"manifest.msgpack": blob},
            components=key_components(fp),
            summary={
                "kernels": len(new),
                "arch": fp.components.get("arch"),
                "nvfuser": fp.components.get("nvfuser_build") or fp.components.get("nvfuser_version"),
            },
        )
        return new if hit is not None else None
    finally:
        lk.release()
