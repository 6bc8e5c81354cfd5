"""Hostile bundles (tools/chaos_inputs.py's cases ``never_blocks``, ``memory_bombs`` and
``malformed_manifests``): tar streams written by hand (:class:`TarStream`), bombs that claim
gigabytes (sparse maps, gzip, pax and GNU headers, members repeated, huge entries), manifests of
the wrong shape, and inputs that are FIFOs or devices where a bundle or a Triton folder is expected.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tarfile
import zlib
from pathlib import Path
from typing import Any

from chaos_inputs_common import (
    RSS_SMALL,
    GiB,
    MiB,
    child_env,
    cli,
    cli_limited,
    declared_record,
    error_lines,
    kcache_records,
    make_record,
    manifest_bytes,
    one_line_failure,
    text,
    triton_group,
    triton_key,
)

# ----------------------------------------------------------------------------------- tar writing


def tar_header(name: str, size: int, type: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode, info.mtime = size, type, 0o600, 0
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


_ZERO_MIB = bytes(MiB)


class TarStream:
    """Writes a tar (gzip-compressed with ``gz``) block by block. Runs of zeros are cheap: in a
    gzip one compressed MiB of zeros is repeated (each piece is deflated on its own, then
    flushed), so a 2.4 GiB expansion costs a 2.5 MB file and about a second."""

    def __init__(self, path: Path, gz: bool = False) -> None:
        self.f = open(path, "wb")
        self.gz, self.crc, self.size = gz, 0, 0
        if gz:
            self.f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")
            self._zero_chunk = self._deflate(_ZERO_MIB)

    @staticmethod
    def _deflate(data: bytes, final: bool = False, level: int = 9) -> bytes:
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush(zlib.Z_FINISH if final else zlib.Z_FULL_FLUSH)

    def raw(self, data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self.gz:
            self.crc = zlib.crc32(data, self.crc)
            self.f.write(self._deflate(data, level=9 if len(data) < MiB else 1))  # big: fast
        else:
            self.f.write(data)

    def zeros(self, n: int) -> None:
        if not self.gz:
            while n > 0:
                k = min(n, MiB)
                self.f.write(_ZERO_MIB[:k])
                self.size += k
                n -= k
            return
        whole, rest = divmod(n, MiB)
        for _ in range(whole):
            self.f.write(self._zero_chunk)
            self.crc = zlib.crc32(_ZERO_MIB, self.crc)
        self.size += whole * MiB
        self.raw(bytes(rest))

    def repeat(self, data: bytes, times: int) -> None:
        """``data`` ``times`` over, deflated once."""
        if not self.gz:
            for _ in range(times):
                self.raw(data)
            return
        z = self._deflate(data)
        for _ in range(times):
            self.f.write(z)
            self.crc = zlib.crc32(data, self.crc)
        self.size += len(data) * times

    def member(self, name: str, data: bytes) -> None:
        self.raw(tar_header(name, len(data)) + data + _padding(len(data)))

    def zero_member(self, name: str, size: int) -> None:
        self.raw(tar_header(name, size))
        self.zeros(size)
        self.raw(_padding(size))

    def close(self, end: bool = True) -> None:
        if end:
            self.raw(b"\0" * (2 * tarfile.BLOCKSIZE))
        if self.gz:
            self.f.write(self._deflate(b"", final=True))
            self.f.write(
                (self.crc & 0xFFFFFFFF).to_bytes(4, "little") + (self.size & 0xFFFFFFFF).to_bytes(4, "little")
            )
        self.f.close()


def write_bundle(
    path: Path,
    entries: list[tuple[Any, dict[str, bytes]]],
    *,
    secret: bytes | None = None,
    key_tag: str = "",
    gz: bool = False,
    manifest: bytes | None = None,
    extra: list[tuple[str, bytes]] = (),  # type: ignore[assignment]
) -> Path:
    """A bundle in kcache's format: MANIFEST, then ``e/<id>/<name>`` for each member given."""
    t = TarStream(path, gz)
    t.member(
        "MANIFEST",
        manifest
        if manifest is not None
        else manifest_bytes([r for r, _ in entries], key_tag=key_tag, secret=secret),
    )
    for rec, files in entries:
        for name, data in files.items():
            t.member(f"e/{rec.id}/{name}", data)
    for name, data in extra:
        t.member(name, data)
    t.close()
    return path


# ----------------------------------------------------------------------------------- bombs


def _gnu_sparse_header(
    name: str, realsize: int, stored: int, regions: list[tuple[int, int]], extended: bool
) -> bytes:
    """An old-GNU sparse header ('S'): ``regions`` (offset, bytes) of the first four map slots,
    ``realsize`` the size the file claims, ``stored`` the bytes that follow in the archive."""
    buf = bytearray(tar_header(name, stored, tarfile.GNUTYPE_SPARSE)[: tarfile.BLOCKSIZE])
    pos = 386
    for off, n in regions[:4]:
        buf[pos : pos + 12] = tarfile.itn(off, 12, tarfile.GNU_FORMAT)
        buf[pos + 12 : pos + 24] = tarfile.itn(n, 12, tarfile.GNU_FORMAT)
        pos += 24
    buf[482] = 1 if extended else 0
    buf[483:495] = tarfile.itn(realsize, 12, tarfile.GNU_FORMAT)
    buf[148:156] = b" " * 8
    chk = tarfile.calc_chksums(bytes(buf))[0]
    buf[148:155] = b"%06o\0" % chk
    return bytes(buf)


def sparse_bundle(path: Path, claim: int = 8 * GiB) -> Path:
    """About 3 KB: a manifest declaring one member of ``claim`` bytes, and that member as a GNU
    sparse file (one 512-byte region at its end). Read whole, it is ``claim`` bytes of memory."""
    rec = declared_record("triton", "bomb/sparse", {"k.cubin": claim})
    t = TarStream(path)
    t.member("MANIFEST", manifest_bytes([rec]))
    t.raw(_gnu_sparse_header(f"e/{rec.id}/k.cubin", claim, 512, [(claim - 512, 512)], extended=False))
    t.raw(b"\x01" * 512)
    t.close()
    return path


def gzip_bomb_bundle(path: Path, sizes: tuple[int, ...] = (1288 * MiB, 1288 * MiB)) -> Path:
    """A .tgz of about 2.5 MB whose entries (declared as they are) hold ``sizes`` bytes of zeros:
    inflated into memory, 2.4 GiB."""
    recs = [declared_record("triton", f"bomb/gzip-{i}", {"k.cubin": n}) for i, n in enumerate(sizes)]
    t = TarStream(path, gz=True)
    t.member("MANIFEST", manifest_bytes(recs))
    for rec, n in zip(recs, sizes):
        t.zero_member(f"e/{rec.id}/k.cubin", n)
    t.close()
    return path


def header_bomb_bundle(
    path: Path, how: str, claim: int = 8 * GiB, *, gz: bool = False, first: bool = True
) -> Path:
    """A bundle with one tar header that claims ``claim`` bytes of extension data, which tarfile
    reads in one go: ``how`` is ``pax`` (an extended header), ``gnulong`` (a GNU long name) or
    ``sparsemap`` (a GNU sparse map continued over ``claim`` bytes of extension blocks). With
    ``gz`` the claimed bytes are really there (zeros, or map blocks), compressed; else the file
    ends after the header. ``first``: before MANIFEST (else after it, on a member)."""
    rec = declared_record("triton", "bomb/header", {"k.cubin": 16})
    t = TarStream(path, gz=gz)
    if not first:
        t.member("MANIFEST", manifest_bytes([rec]))
    name = "MANIFEST" if first else f"e/{rec.id}/k.cubin"
    if how == "sparsemap":
        t.raw(_gnu_sparse_header(name, 16, 0, [(0, 16)], extended=True))
        if gz:
            block = bytearray(tarfile.BLOCKSIZE)
            for i in range(21):
                block[i * 24 : i * 24 + 12] = tarfile.itn(1 + i, 12, tarfile.GNU_FORMAT)
                block[i * 24 + 12 : i * 24 + 24] = tarfile.itn(1, 12, tarfile.GNU_FORMAT)
            block[504] = 1
            t.repeat(bytes(block) * (MiB // tarfile.BLOCKSIZE), claim // MiB)
    else:
        t.raw(tar_header("././@PaxHeader" if how == "pax" else "././@LongLink", claim,
                         tarfile.XHDTYPE if how == "pax" else tarfile.GNUTYPE_LONGNAME))  # fmt: skip
        if gz:
            t.zeros(claim)
    t.close(end=gz)
    return path


def duplicate_member_bundle(path: Path, size: int = 4 * MiB, copies: int = 16) -> tuple[Path, int]:
    """One entry of one ``size``-byte member (right checksums), the member repeated ``copies``
    times (gzip: a few KB). Returns (path, the bytes a reader that stages every copy writes)."""
    data = bytes(size)
    rec = make_record("triton", "bomb/dup", {"k.cubin": data})
    t = TarStream(path, gz=True)
    t.member("MANIFEST", manifest_bytes([rec]))
    for _ in range(copies):
        t.zero_member(f"e/{rec.id}/k.cubin", size)
    t.close()
    return path, size * copies


def big_entry_bundle(path: Path, sizes: tuple[int, ...] = (700 * MiB, 700 * MiB)) -> Path:
    """One entry whose members (each under the per-member bound) hold ``sizes`` bytes of zeros,
    with right checksums: a store write holds them all in memory."""
    sha: dict[int, str] = {}
    for n in sorted(set(sizes)):
        h = hashlib.sha256()
        left = n
        while left:
            k = min(left, MiB)
            h.update(_ZERO_MIB[:k])
            left -= k
        sha[n] = h.hexdigest()
    r = kcache_records()
    names = [f"m{i}.bin" for i in range(len(sizes))]
    files = [r.FileInfo(nm, n, 0, sha[n]) for nm, n in zip(names, sizes)]
    rec = r.Record(
        kind="triton", key="bomb/big-entry", id=r.entry_id("triton", "bomb/big-entry", ""), files=files
    )
    # crc32 too, so that nothing but the size could refuse it
    for fi, n in zip(files, sizes):
        c, left = 0, n
        while left:
            k = min(left, MiB)
            c = zlib.crc32(_ZERO_MIB[:k], c)
            left -= k
        fi.crc32 = c & 0xFFFFFFFF
    t = TarStream(path, gz=True)
    t.member("MANIFEST", manifest_bytes([rec]))
    for nm, n in zip(names, sizes):
        t.zero_member(f"e/{rec.id}/{nm}", n)
    t.close()
    return path


def many_records_bundle(path: Path, n: int = 600_000) -> Path:
    """A .tgz of a few MB whose manifest holds ``n`` distinct records of one empty member each
    (about 225 bytes a record): decoded whole, several times the manifest in memory."""
    import msgpack

    r = kcache_records()
    # One record packed once with placeholders of fixed width, then each record's key and id put
    # in by byte replacement (msgpack's string headers depend on the length alone): the same
    # records as a packb of each (1.3 s of CPU for 400,000), at a fifth of the cost.
    key0, id0 = "many/" + "K" * 7, "I" * 40
    tmpl = make_record("triton", key0, {"k.cubin": b""}).to_dict()
    tmpl["id"] = id0
    packed = msgpack.packb(tmpl, use_bin_type=True)
    assert packed.count(key0.encode()) == 1 and packed.count(id0.encode()) == 1
    head, rest = packed.split(key0.encode())
    if id0.encode() in head:  # the id before the key in the map
        a, b = head.split(id0.encode())
        parts, order = (a, b, rest), "ik"
    else:
        b, c = rest.split(id0.encode())
        parts, order = (head, b, c), "ki"
    header, magic, crc32 = r._HEADER.pack, r.MAGIC, r.crc32
    blobs = []
    for i in range(n):
        k, d = f"many/{i:07d}".encode(), f"{i:040x}".encode()
        x, y = (d, k) if order == "ik" else (k, d)
        body = parts[0] + x + parts[1] + y + parts[2]
        blobs.append(header(magic, crc32(body)) + body)
    t = TarStream(path, gz=True)
    t.member("MANIFEST", manifest_bytes(blobs))
    t.close()
    return path


def legit_entries(n: int = 24, size: int = 160 * 1024, seed: int = 0) -> list[tuple[Any, dict[str, bytes]]]:
    """``n`` entries of about ``size`` bytes each (a few MB in all), random bytes."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        files = {"k.cubin": rng.randbytes(size), "k.json": json.dumps({"name": f"k{i}"}).encode()}
        out.append((make_record("triton", f"legit/{i}", files), files))
    return out


def _record_blob(d: dict[str, Any]) -> bytes:
    """A record body ``d`` with a valid magic and checksum (so only its content is wrong)."""
    import msgpack

    r = kcache_records()
    body = msgpack.packb(d, use_bin_type=True)
    return r._HEADER.pack(r.MAGIC, r.crc32(body)) + body


def malformed_manifests() -> dict[str, bytes]:
    """MANIFEST bytes, each wrong in one way (name -> bytes)."""
    import msgpack

    good = make_record("triton", "m/ok", {"k.cubin": b"x"})
    gd = good.to_dict()
    out = {
        "records-are-text": manifest_bytes(["abc", "def"]),
        "records-are-numbers": manifest_bytes([1, 2.5, None]),
        "records-a-map": manifest_bytes(
            [], body={"format": "kcache-bundle", "schema": 1, "key_tag": "", "records": {"a": 1}}
        ),
        "records-a-number": manifest_bytes(
            [], body={"format": "kcache-bundle", "schema": 1, "key_tag": "", "records": 7}
        ),
        "records-a-string": manifest_bytes(
            [], body={"format": "kcache-bundle", "schema": 1, "key_tag": "", "records": "xyz"}
        ),
        "record-garbage-bytes": manifest_bytes([b"not a record"]),
        "record-kind-a-number": manifest_bytes([_record_blob({**gd, "kind": 5})]),
        "record-files-a-string": manifest_bytes([_record_blob({**gd, "files": "x"})]),
        "record-files-wrong-items": manifest_bytes([_record_blob({**gd, "files": [[1, 2, 3, 4]]})]),
        "record-files-a-number": manifest_bytes([_record_blob({**gd, "files": 3})]),
        "record-created-text": manifest_bytes([_record_blob({**gd, "created": "yesterday"})]),
        "record-components-a-list": manifest_bytes([_record_blob({**gd, "components": [1, 2]})]),
        "record-not-a-map": manifest_bytes([_record_blob([1, 2, 3])]),  # type: ignore[arg-type]
        "manifest-a-list": manifest_bytes([], body=[1, 2, 3]),
        "manifest-a-string": manifest_bytes([], body="kcache-bundle"),
        "manifest-a-number": manifest_bytes([], body=42),
        "outer-a-list": msgpack.packb([b"body", None]),
        "outer-body-text": manifest_bytes([], outer={"body": "text", "hmac": None}),
        "outer-body-missing": manifest_bytes([], outer={"hmac": None}),
        "outer-not-msgpack": b"\xc1\xc1\xc1 this is not msgpack",
        "schema-huge": manifest_bytes([good], schema=2**63),
        "key-tag-a-list": manifest_bytes([good], key_tag=[1, 2]),
    }
    return out


def case_never_blocks(d: Path) -> dict[str, Any]:
    env = child_env(d)
    fails: list[str] = []
    fifo = d / "fifo"
    os.mkfifo(fifo)
    os.symlink("/dev/zero", d / "zero-link")
    inputs = {
        "dev-zero": "/dev/zero",
        "fifo": str(fifo),
        "folder": str(d),
        "link-to-dev-zero": str(d / "zero-link"),
    }
    for name, path in inputs.items():
        r = cli(["import", path, "--dir", str(d / "store")], env, timeout=30)
        why = one_line_failure(r, path, want=2)  # a file that is no file to read: a bad argument
        if why:
            fails.append(f"import {name}: {why}")
    if (d / "store").exists():
        fails.append("a refused import created the store")
    tc = d / "triton-cache"
    triton_group(tc / triton_key(0))  # a good one, imported
    (tc / triton_key(1)).mkdir()
    os.mkfifo(tc / triton_key(1) / "__grp__k.json")
    g = triton_group(tc / triton_key(2))
    for n in ("k.json", "k.cubin"):
        os.unlink(g / n)
        os.mkfifo(g / n)
    r = cli(["import", "--triton-cache", str(tc), "--dir", str(d / "store2"), "--json"], env, timeout=30)
    if r.returncode != 0 or b"Traceback" in r.stderr:
        fails.append(f"--triton-cache with FIFOs: rc={r.returncode} {text(r.stderr)[-500:]}")
    else:
        rep = json.loads(r.stdout)
        if rep["kernels"] != 1 or len(rep["skipped"]) != 2:
            fails.append(f"--triton-cache with FIFOs: {rep}")
    r = cli(["import", "--triton-cache", str(fifo), "--dir", str(d / "store3")], env, timeout=30)
    why = one_line_failure(r, str(fifo))
    if why:
        fails.append(f"--triton-cache FIFO: {why}")
    return {"inputs": len(inputs) + 2, "failures": fails}


def case_memory_bombs(d: Path) -> dict[str, Any]:
    env = child_env(d)
    fails: list[str] = []
    measures: dict[str, Any] = {}
    bombs: dict[str, tuple[Path, str]] = {
        # name: (bundle, "refused" (exit 1) | "skipped" (exit 0, nothing imported))
        "sparse-8GiB": (sparse_bundle(d / "sparse.tar"), "refused"),
        "gzip-2x1.2GiB": (gzip_bomb_bundle(d / "gzip-bomb.tgz"), "refused"),
        "pax-8GiB": (header_bomb_bundle(d / "pax.tar", "pax"), "refused"),
        "gnulong-8GiB": (header_bomb_bundle(d / "gnulong.tar", "gnulong"), "refused"),
        "pax-gz-1.2GiB": (
            header_bomb_bundle(d / "pax.tgz", "pax", 1288 * MiB, gz=True, first=False),
            "refused",
        ),
        "sparsemap-gz-1GiB": (header_bomb_bundle(d / "map.tgz", "sparsemap", GiB, gz=True), "refused"),
        "entry-2x700MiB": (big_entry_bundle(d / "big.tgz"), "refused"),
    }
    dup, dup_bytes = duplicate_member_bundle(d / "dup.tgz")
    bombs["member-16-times"] = (dup, "refused")
    bombs["manifest-600k-records"] = (many_records_bundle(d / "many.tgz"), "refused")
    for name, (path, want) in bombs.items():
        r, m = cli_limited(["import", str(path), "--dir", str(d / f"store-{name}"), "--json"], env, d)
        measures[name] = {
            "rc": r.returncode,
            "maxrss": m["maxrss"],
            "wchar": m["wchar"],
            "file": path.stat().st_size,
        }
        if want == "refused":
            lines = error_lines(r)
            if r.returncode != 1 or len(lines) != 1 or "MemoryError" in lines[0] or str(path) not in lines[0]:
                fails.append(f"{name}: rc={r.returncode} {lines[-3:]}")
        else:
            try:
                rep = json.loads(r.stdout)
                ok = r.returncode == 0 and rep["imported"] == 0 and rep["skipped"]
            except ValueError:
                ok = False
            if not ok:
                fails.append(f"{name}: rc={r.returncode} {text(r.stdout)[-300:]} {text(r.stderr)[-300:]}")
        # The manifest is read whole (at most MAX_MANIFEST): up to about twice its size.
        rss = RSS_SMALL if name != "manifest-600k-records" else 2.5 * 145 * MiB + 64 * MiB
        if m["maxrss"] is None or m["maxrss"] > rss:
            fails.append(f"{name}: peak RSS {m['maxrss']}")
        if m["wchar"] is None or m["wchar"] > 32 * MiB:
            fails.append(f"{name}: wrote {m['wchar']} bytes (the repeated member alone is {dup_bytes})")
    # A legitimate bundle of a few MB imports under the same limits.
    entries = legit_entries()
    legit = write_bundle(d / "legit.tgz", entries, gz=True)
    r, m = cli_limited(["import", str(legit), "--dir", str(d / "store-legit"), "--json"], env, d)
    measures["legit"] = {"rc": r.returncode, "maxrss": m["maxrss"], "file": legit.stat().st_size}
    if r.returncode != 0 or json.loads(r.stdout or b"{}").get("imported") != len(entries):
        fails.append(f"legit bundle: rc={r.returncode} {text(r.stderr)[-500:]}")
    if m["maxrss"] is None or m["maxrss"] > RSS_SMALL:
        fails.append(f"legit bundle: peak RSS {m['maxrss']}")
    # A Triton cache folder with a __grp__ file linked to /dev/zero, sparse files of 900 MiB.
    tc = d / "triton-cache"
    triton_group(tc / triton_key(0))
    g = triton_group(tc / triton_key(1))
    os.unlink(g / "__grp__k.json")
    os.symlink("/dev/zero", g / "__grp__k.json")
    g = triton_group(tc / triton_key(2))
    with open(g / "__grp__k.json", "r+b") as f:
        f.truncate(8 * GiB)
    g = triton_group(tc / triton_key(3), files={f"k.{x}": b"" for x in ("json", "cubin", "ptx")})
    for n in ("k.json", "k.cubin", "k.ptx"):
        os.truncate(g / n, 900 * MiB)
    g = tc / triton_key(4)
    g.mkdir(mode=0o700)
    with open(g / "big.so", "wb") as f:
        f.truncate(900 * MiB)
    r, m = cli_limited(["import", "--triton-cache", str(tc), "--dir", str(d / "store-tc"), "--json"], env, d)
    measures["triton-cache"] = {"rc": r.returncode, "maxrss": m["maxrss"]}
    try:
        rep = json.loads(r.stdout)
        if rep["kernels"] != 1 or len(rep["skipped"]) != 4:
            fails.append(f"triton cache: {rep}")
    except ValueError:
        fails.append(f"triton cache: rc={r.returncode} {text(r.stderr)[-500:]}")
    if m["maxrss"] is None or m["maxrss"] > RSS_SMALL:
        fails.append(f"triton cache: peak RSS {m['maxrss']}")
    return {"measures": measures, "failures": fails}


def case_malformed(d: Path, rng: random.Random) -> dict[str, Any]:
    env = child_env(d)
    fails: list[str] = []
    names = sorted(malformed_manifests())
    picked = rng.sample(names, min(8, len(names)))
    variants = malformed_manifests()
    for name in picked:
        path = write_bundle(d / f"{name}.tar", [], manifest=variants[name])
        r = cli(["import", str(path), "--dir", str(d / "store")], env)
        why = one_line_failure(r, str(path))
        if why:
            fails.append(f"{name}: {why}")
    if (d / "store").exists():
        fails.append("a malformed bundle created the store")
    return {"variants": picked, "failures": fails}
