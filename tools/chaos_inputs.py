#!/usr/bin/env python
"""Hostile inputs against kcache (issue 18): bundles, Triton cache folders, settings, clocks, a
full disk, files a user names. The builders here are shared with
``tests/reliability/test_hostile_inputs.py``, ``tests/reliability/test_clock_and_disk.py`` and
``tests/reliability/test_hostile_files.py``; :func:`phase_inputs` runs every case once (the
chaos tool's ``inputs`` phase):

    python tools/chaos_inputs.py [--dir DIR] [--seed N]

Every case runs kcache in a fresh child process (``PYTHONPATH`` = this checkout), with a time
limit (a case that blocks fails, it does not hang the run) and, for the memory bombs, an address
space limit (``RLIMIT_AS`` 1.5 GiB): reading a bomb into memory ends in MemoryError, which fails
the case, and the child's peak RSS and bytes written are measured.

Cases (each a ``"name": {...}`` in the result; ``failures`` lists what went wrong):

poisoned meta
    A bundle whose ``triton-meta`` entries answer ``ptxas --version`` wrongly for this machine's
    ptxas (and give a wrong libtriton digest), under every key format kcache ever used, signed
    and unsigned; ``kcache export`` of a store holding such entries; the same answers planted
    straight in a store. A real Triton compile under ``KCACHE=1`` must work and be Triton's own.
never blocks
    ``kcache import`` of ``/dev/zero``, a FIFO, a folder; ``--triton-cache`` with a FIFO or a
    device where ``__grp__*.json`` or a member is expected.
memory bombs
    A 3 KB sparse tar claiming 8 GiB, a gzip bomb (2 x 1.2 GiB), tar headers (pax, GNU long
    name, sparse map) claiming gigabytes, a member repeated, an entry of 2 x 700 MiB, a
    ``__grp__`` file linked to /dev/zero, sparse files of 900 MiB in a Triton cache folder.
malformed manifests
    Drawn at random (``seed``): records that are not bytes, a records field that is not a list,
    records with wrong types inside, manifests that are not maps.
clock skew
    A process whose clock runs an hour ahead evicts under a tiny bound while another uses
    entries: what was used within the grace period stays.
full disk
    ``kcache clear --kind`` and ``clear --all`` on a tmpfs filled to the last byte (root only).
user files
    (issue 34) ``explain --against``, ``import`` and ``prewarm`` against a FIFO, a link to one,
    ``/dev/stdin`` on a silent pipe, a 1 GiB sparse file that starts like the real thing and a
    document nested 100,000 deep: refused at once (exit 2, one line), under 1.5 GiB.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
PYTHON = sys.executable
GiB = 1 << 30
MiB = 1 << 20
#: The child's address space limit for the memory bomb cases.
AS_LIMIT = 1536 * MiB
#: What "the peak RSS stays small" means for a CLI child (Python, kcache, msgpack, sqlite: ~30 MiB;
#: with Triton imported, ~80 MiB).
RSS_SMALL = 300 * MiB
#: A wrong ``ptxas --version`` that looks right: Triton makes PTX ".version 95.9" from it.
WRONG_PTXAS = b"ptxas: NVIDIA (R) Ptx optimizing assembler\nCuda compilation tools, release 99.9, V99.9.1\n"
#: Wrong ones that do not: "Cannot find ptxas" from the first, nothing usable from the second.
IMPLAUSIBLE_PTXAS = (b"ptxas version: none\n", b"\xff\xfe\x00garbage")
WRONG_DIGEST = b"ab" * 32
SKEW_S = 3600.0


# ----------------------------------------------------------------------------------- children


def child_env(base: Path, **extra: str) -> dict[str, str]:
    """os.environ without KCACHE_*/TRITON_* settings, HOME and caches under ``base``, and this
    checkout first on the path (the code under test, also for a worktree of an older commit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env["PYTHONPATH"] = str(REPO)
    env["HOME"] = str(base / "home")
    env["XDG_CACHE_HOME"] = str(base / "xdg")
    env["TRITON_CACHE_DIR"] = str(base / "triton-file-cache")
    env["PYTHONHASHSEED"] = "0"
    env.update(extra)
    return env


def cli(
    args: list[Any], env: dict[str, Any], timeout: float = 60, stdin: Any = subprocess.DEVNULL
) -> subprocess.CompletedProcess:
    """``python -m kcache ARGS`` (arguments may be bytes). Raises TimeoutExpired if it blocks.
    ``stdin``: what the child reads as its standard input (a pipe's read end: ``/dev/stdin``)."""
    return subprocess.run(
        [PYTHON, "-m", "kcache", *args], env=env, capture_output=True, timeout=timeout, check=False, cwd="/",
        stdin=stdin,
    )  # fmt: skip


LIMITED_CLI = r"""
import json, resource, sys
limit, out = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from kcache.cli import main
try:
    rc = main(sys.argv[3:])
except BaseException as e:  # what main let through: reported, then the usual traceback
    rc = -1
    raise
finally:
    # VmHWM: this program's own peak RSS (getrusage's ru_maxrss also counts what the process
    # held before its exec, a copy of a large parent).
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    hwm = int(status["VmHWM"].split()[0]) * 1024
    io_ = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    with open(out, "w") as f:
        json.dump({"rc": rc, "maxrss": hwm, "wchar": int(io_["wchar"])}, f)
sys.exit(rc)
"""


def cli_limited(
    args: list[Any],
    env: dict[str, Any],
    work: Path,
    *,
    limit: int = AS_LIMIT,
    timeout: float = 120,
    stdin: Any = subprocess.DEVNULL,
) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """``kcache ARGS`` in a child whose address space is limited to ``limit``; returns the process
    and its measures: ``maxrss`` (bytes), ``wchar`` (bytes it wrote), ``rc``. Raises
    TimeoutExpired (the child killed) if it does not end within ``timeout``."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"measure.{os.getpid()}.{time.monotonic_ns()}.json"
    r = subprocess.run(
        [PYTHON, "-c", LIMITED_CLI, str(limit), str(out), *args],
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
        cwd="/",
        stdin=stdin,
    )
    try:
        m = json.loads(out.read_text())
        out.unlink()
    except (OSError, ValueError):
        m = {"rc": None, "maxrss": None, "wchar": None}
    return r, m


def text(b: bytes | str) -> str:
    return b if isinstance(b, str) else b.decode("utf-8", "replace")


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in text(r.stderr).splitlines() if ln.strip()]


def one_line_failure(r: subprocess.CompletedProcess, names: str | None = None, want: int = 1) -> str | None:
    """None if the command failed as it should (exit ``want``: 1 a failure, 2 a bad argument such
    as a file that is no file to read; one ``kcache: error:`` line (``kcache prewarm: error:``),
    naming ``names`` if given, no traceback, no MemoryError), else what is wrong."""
    lines = error_lines(r)
    if r.returncode != want:
        return f"exit {r.returncode} (want {want}): {lines[-3:]}"
    if len(lines) != 1 or not lines[0].startswith(("kcache: error:", "kcache prewarm: error:")):
        return f"want one error line, got {lines[-5:]}"
    if "MemoryError" in lines[0] or "Traceback" in text(r.stderr):
        return f"memory error or traceback: {lines[0]}"
    if names is not None and names not in lines[0]:
        return f"the message does not name {names!r}: {lines[0]}"
    return None


# ----------------------------------------------------------------------------------- records


def _kcache_records() -> Any:
    from kcache.store import records  # the code under test (PYTHONPATH)

    return records


def make_record(kind: str, key: str, files: dict[str, bytes], key_tag: str = "") -> Any:
    r = _kcache_records()
    return r.Record(
        kind=kind,
        key=key,
        id=r.entry_id(kind, key, key_tag),
        files=[r.file_info(n, b) for n, b in files.items()],
    )


def declared_record(
    kind: str, key: str, sizes: dict[str, int], key_tag: str = "", sha: str | None = None
) -> Any:
    """A record that declares members of ``sizes`` (checksums of nothing: for bundles refused
    before any member is read, or whose members fail their checksum)."""
    r = _kcache_records()
    files = [r.FileInfo(n, s, 0, sha or "0" * 64) for n, s in sizes.items()]
    return r.Record(kind=kind, key=key, id=r.entry_id(kind, key, key_tag), files=files)


def manifest_bytes(
    records: Iterable[Any],
    *,
    key_tag: Any = "",
    secret: bytes | None = None,
    body: Any = None,
    outer: Any = None,
    schema: Any = 1,
) -> bytes:
    """A MANIFEST as kcache writes it (``records``: Record objects or anything, for malformed
    ones); ``body`` replaces the decoded manifest, ``outer`` the whole outer map."""
    import msgpack

    if outer is not None:
        return msgpack.packb(outer, use_bin_type=True)
    if body is None:
        body = {
            "format": "kcache-bundle",
            "schema": schema,
            "created": time.time(),
            "key_tag": key_tag,
            "records": [r.encode() if hasattr(r, "encode") and hasattr(r, "files") else r for r in records],
        }
    raw = msgpack.packb(body, use_bin_type=True)
    sig = hmac.new(secret, raw, hashlib.sha256).hexdigest() if secret else None
    return msgpack.packb({"body": raw, "hmac": sig}, use_bin_type=True)


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
    r = _kcache_records()
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

    r = _kcache_records()
    tmpl = make_record("triton", "many/0", {"k.cubin": b""}).to_dict()
    blobs = []
    for i in range(n):
        tmpl["key"], tmpl["id"] = f"many/{i}", f"{i:040x}"
        body = msgpack.packb(tmpl, use_bin_type=True)
        blobs.append(r._HEADER.pack(r.MAGIC, r.crc32(body)) + body)
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

    r = _kcache_records()
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


# ----------------------------------------------------------------------------------- Triton folders


TRITON_KEY = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST"


def triton_key(i: int) -> str:
    """A folder name shaped like Triton's cache keys (52 base32 characters)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return alphabet[i % 32] + alphabet[(i // 32) % 32] + TRITON_KEY[2:]


def triton_group(folder: Path, name: str = "k", files: dict[str, bytes] | None = None) -> Path:
    """A Triton cache key folder holding one kernel group (``__grp__<name>.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    files = (
        files
        if files is not None
        else {
            f"{name}.json": b'{"name": "k", "triton_version": "0"}',
            f"{name}.cubin": b"\x7fELF" + b"c" * 200,
        }
    )
    for n, data in files.items():
        (folder / n).write_bytes(data)
    children = {n: str(folder / n) for n in files}
    (folder / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    return folder


# ----------------------------------------------------------------------------------- meta poisoning

META_KEYS = r'''
import importlib.util, os, subprocess, sysconfig
def meta_keys(current=True):
    """{key: wrong answer} for this machine's ptxas and libtriton, in every key format kcache
    used (v1 before efe2a87, v2 at efe2a87, and the running code's own with ``current``)."""
    tdir = importlib.util.find_spec("triton").submodule_search_locations[0]
    ptxas = os.path.join(tdir, "backends", "nvidia", "bin", "ptxas")
    ext = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").split(".")[-1]
    lib = os.path.join(tdir, "_C", f"libtriton.{ext}")
    out = {}
    st = os.stat(ptxas)
    ident = f"{os.path.realpath(ptxas)}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}|ctime={st.st_ctime_ns}"
    for s in (None, subprocess.STDOUT):
        out[("tool", f"tool-version|{ident}|stderr={s!r}")] = WRONG_PTXAS
        out[("tool", f"tool-version/v2|{ident}|stderr={s!r}")] = WRONG_PTXAS
    from kcache import fingerprint
    ver = fingerprint.current("triton_version")
    st = os.stat(lib)
    lident = f"{os.path.realpath(lib)}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}|ctime={st.st_ctime_ns}|triton={ver}"
    out[("lib", lident)] = WRONG_DIGEST
    out[("lib", "v2|" + lident)] = WRONG_DIGEST
    if current:
        try:
            from kcache.triton import toolmemo
            for s in (None, subprocess.STDOUT):
                if hasattr(toolmemo, "memo_key"):
                    out[("tool", toolmemo.memo_key(ptxas, s))] = WRONG_PTXAS
        except ImportError:
            pass
        try:
            from kcache.triton import keymemo
            out[("lib", keymemo.file_identity(lib))] = WRONG_DIGEST
        except ImportError:
            pass
    return out
'''

POISON_CHILD = r"""
import json, sys
sys.path.insert(0, {here!r})
import chaos_inputs as ci
exec(ci.META_KEYS, globals())
WRONG_PTXAS, WRONG_DIGEST = {wrong!r}, ci.WRONG_DIGEST
mode, target = {mode!r}, {target!r}
keys = meta_keys(current={current!r})
if mode == "plant":
    from kcache.store import Store
    st = Store.open(target)
    n = 0
    for (what, key), ans in keys.items():
        name = "output" if what == "tool" else "digest"
        n += st.put("triton-meta", key, {{name: ans}}) is not None
    st.close()
    print(json.dumps({{"planted": n, "keys": len(keys)}}))
elif mode == "redis":  # straight into a shared tier, as the remote store packs its entries
    import redis
    from kcache.store.tiers.entry import pack_entry
    from kcache.store.tiers.redis_keys import entry_key
    url, prefix = target.split("|", 1)
    r = redis.Redis.from_url(url)
    n = 0
    for (what, key), ans in keys.items():
        name = "output" if what == "tool" else "digest"
        rec = ci.make_record("triton-meta", key, {{name: ans}})
        r.set(entry_key(prefix, rec.kind, rec.id), pack_entry(rec.encode(), {{name: ans}}, {secret!r}))
        n += 1
    print(json.dumps({{"planted": n}}))
else:
    secret = {secret!r}
    entries = []
    for (what, key), ans in keys.items():
        name = "output" if what == "tool" else "digest"
        entries.append((ci.make_record("triton-meta", key, {{name: ans}}), {{name: ans}}))
    odd = {{"output": WRONG_PTXAS}}
    entries.append((ci.make_record("triton-meta-v9", "a kind no kcache knows", odd), odd))
    ok = {{"k.cubin": b"\x7fELF" + b"k" * 64, "k.json": b"{{}}"}}
    entries.append((ci.make_record("triton", "poison/benign", ok), ok))
    ci.write_bundle(__import__("pathlib").Path(target), entries, secret=secret)
    print(json.dumps({{"entries": len(entries)}}))
"""


def poison(
    mode: str,
    target: Path,
    env: dict[str, str],
    *,
    secret: bytes | None = None,
    current: bool = True,
    wrong: bytes = WRONG_PTXAS,
) -> dict[str, Any]:
    """``mode`` "plant": put wrong ``triton-meta`` answers straight into the store at ``target``;
    "bundle": write a hand-made bundle at ``target`` holding them (plus an entry of a kind no
    kcache knows and one ordinary kernel); "redis": set them in the shared tier ``target``
    (``URL|PREFIX``), signed with ``secret`` if given. Runs in a child with the code under test."""
    code = POISON_CHILD.format(
        here=str(HERE.parent), mode=mode, target=str(target), current=current, secret=secret, wrong=wrong
    )
    r = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"poison {mode} failed: {text(r.stderr)[-3000:]}")
    return json.loads(text(r.stdout).strip().splitlines()[-1])


def bundle_records(path: Path) -> list[Any]:
    """The records of a bundle's manifest (read with tarfile and msgpack, not with kcache)."""
    import msgpack

    with tarfile.open(path, "r:*") as t:
        m = t.next()
        assert m is not None and m.name == "MANIFEST"
        raw = t.extractfile(m).read()  # type: ignore[union-attr]
    body = msgpack.unpackb(msgpack.unpackb(raw, raw=False)["body"], raw=False)
    r = _kcache_records()
    return [r.Record.decode(b) for b in body["records"]]


COMPILE_CHILD = r"""
import importlib.util, json, sys, traceback
spec = importlib.util.spec_from_file_location("kcache_chaos", {chaos!r})
chaos = importlib.util.module_from_spec(spec); sys.modules["kcache_chaos"] = chaos
spec.loader.exec_module(chaos)
import triton, kcache
out = {{"enabled": kcache.is_enabled(), "kernels": {{}}, "errors": []}}
for spec in {specs!r}:
    try:
        out["kernels"]["/".join(map(str, spec))] = chaos.kernel_digest(chaos.compile_kernel(tuple(spec)))
    except Exception:
        out["errors"].append(traceback.format_exc(limit=3)[-1500:])
print(json.dumps(out))
"""


def compile_kernels(
    specs: list[tuple], env: dict[str, Any], timeout: float = 300
) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    """Compile chaos kernels (real Triton, for sm_90, no GPU) in a child; their digests."""
    code = COMPILE_CHILD.format(chaos=str(REPO / "tools" / "chaos.py"), specs=[list(s) for s in specs])
    r = subprocess.run(
        [PYTHON, "-c", code], env=env, capture_output=True, timeout=timeout, check=False, cwd="/"
    )
    try:
        out = json.loads(text(r.stdout).strip().splitlines()[-1])
    except (ValueError, IndexError):
        out = {"enabled": None, "kernels": {}, "errors": [f"rc={r.returncode}: {text(r.stderr)[-2000:]}"]}
    return out, r


# ----------------------------------------------------------------------------------- clock skew

SKEW_SITE = """
# A clock that runs CHAOS_SKEW_S seconds ahead (tests of kcache's eviction grace period).
import os as _os, time as _t
_off = float(_os.environ.get("CHAOS_SKEW_S", "0") or 0)
if _off:
    _real_time, _real_time_ns = _t.time, _t.time_ns
    _t.time = lambda: _real_time() + _off
    _t.time_ns = lambda: _real_time_ns() + int(_off * 1e9)
"""


def skewed_env(env: dict[str, str], folder: Path, seconds: float = SKEW_S) -> dict[str, str]:
    """``env`` for a child whose time.time() and time.time_ns() run ``seconds`` ahead (a
    sitecustomize in ``folder``, first on PYTHONPATH); the kernel's clock is untouched."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SKEW_SITE)
    return {
        **env,
        "PYTHONPATH": f"{folder}{os.pathsep}{env.get('PYTHONPATH', '')}",
        "CHAOS_SKEW_S": str(seconds),
    }


def content(key: str, size: int = 8192) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(f"{key}/{i}".encode()).digest()
        i += 1
    return bytes(out[:size])


STORE_CHILD = r"""
import json, os, sys, time
from kcache.store import Store
root, mode, arg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def content(key, size=8192):
    import hashlib
    out = bytearray(); i = 0
    while len(out) < size:
        out += hashlib.sha256(f"{key}/{i}".encode()).digest(); i += 1
    return bytes(out[:size])
res = {"clock": time.time(), "errors": []}
if mode == "fill":
    st = Store.open(root)
    res["ids"] = {}
    for key in arg["keys"]:
        h = st.put("chaos", key, {"m.bin": content(key)}, protect_s=arg.get("protect", {}).get(key, 0))
        res["ids"][key] = h.record.id
    st.close()
elif mode == "use":  # hit the keys until the time is up; every miss and error noted
    st = Store.open(root)
    res.update(hits=0, misses=[], wrong=0)
    end = time.monotonic() + arg["seconds"]
    while time.monotonic() < end:
        for key in arg["keys"]:
            try:
                h = st.get("chaos", key)
            except Exception as e:
                res["errors"].append(repr(e)); continue
            if h is None:
                res["misses"].append(key)
            elif h.read("m.bin") != content(key) or open(h.paths["m.bin"], "rb").read() != content(key):
                res["wrong"] += 1
            else:
                res["hits"] += 1
        time.sleep(0.02)
    st.close()
elif mode == "evict":  # evict under a tiny bound, over and over
    st = Store.open(root, max_size=arg["max_size"])
    res["evicted"] = 0
    end = time.monotonic() + arg["seconds"]
    while time.monotonic() < end:
        try:
            n, _ = st.evict()
            res["evicted"] += n
        except Exception as e:
            res["errors"].append(repr(e))
        time.sleep(0.05)
    st.close()
elif mode == "aggressor":  # evict under a tiny bound and remove everything, over and over
    st = Store.open(root, max_size=arg["max_size"])
    res.update(evicted=0, removed=0, rounds=0)
    end = time.monotonic() + arg["seconds"]
    while time.monotonic() < end:
        try:
            n, _ = st.evict()
            res["evicted"] += n
            if res["rounds"] % arg["remove_every"] == 0:
                res["removed"] += st.remove(sorted(st.iter_entry_ids()))
        except Exception as e:
            res["errors"].append(repr(e))
        res["rounds"] += 1
        time.sleep(0.05)
    st.close()
print(json.dumps(res))
"""


def store_child(
    root: Path, mode: str, arg: dict[str, Any], env: dict[str, str], timeout: float = 300
) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-c", STORE_CHILD, str(root), mode, json.dumps(arg)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
    )  # fmt: skip


def finish(p: subprocess.Popen, timeout: float = 300) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0 or b"Traceback" in err:
        return {"errors": [f"rc={p.returncode}: {text(err)[-2000:]}"]}
    res = json.loads(text(out).strip().splitlines()[-1])
    res["stderr"] = text(err)
    return res


def age_entries(root: Path, ids: Iterable[str], seconds: float, env: dict[str, str]) -> None:
    """Make entries look unused for ``seconds``: their record files' mtimes go back, and the index
    is rebuilt from those (``kcache verify --fix`` after removing the index)."""
    t = time.time() - seconds
    for ident in ids:
        os.utime(root / "entries" / ident[:2] / ident / "__kcache__.rec", (t, t))
    for p in (root / "index").iterdir():
        p.unlink()
    r = cli(["verify", "--fix", "--dir", str(root)], env)
    if r.returncode != 0:
        raise RuntimeError(f"verify --fix: {text(r.stdout)[-1000:]} {text(r.stderr)[-1000:]}")


def entry_bytes(root: Path, ident: str) -> int:
    """What an entry counts for against the size bound: the bytes of its members."""
    d = root / "entries" / ident[:2] / ident
    return sum(p.stat().st_size for p in d.iterdir() if p.name != "__kcache__.rec")


def entry_ids_on_disk(root: Path) -> set[str]:
    out: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for shard in os.listdir(root / "entries"):
            out.update(os.listdir(root / "entries" / shard))
    return out


# ----------------------------------------------------------------------------------- full disk


def fill_to_the_last_byte(path: Path) -> int:
    """Grow the file ``path`` until its filesystem refuses even one more byte. Returns its size."""
    with open(path, "ab", buffering=0) as f:
        for chunk in (256 * 1024, 4096, 1):
            block = bytes(chunk)
            while True:
                try:
                    if f.write(block) != chunk:
                        break
                except OSError:
                    break
        return os.fstat(f.fileno()).st_size


def fill_inodes(folder: Path, leave: int = 0) -> int:
    """Create empty files in ``folder`` until its filesystem has no inode left, then remove
    ``leave`` of them (that many inodes stay free). Returns how many files remain."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        try:
            os.close(os.open(folder / f"f{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except OSError:
            break
        n += 1
    for i in range(min(leave, n)):
        os.unlink(folder / f"f{n - 1 - i}")
    return n - min(leave, n)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


FILL_CHILD = r"""
import json, os, sys
from kcache.store import Store
root, size = sys.argv[1], int(sys.argv[2])
st = Store.open(root)
kinds = ("triton", "nvfuser")
n = {k: 0 for k in kinds}
i = refused = 0
while refused < 3 and i < 2000:
    kind = kinds[i % 2]
    h = st.put(kind, f"fill/{i}", {"k.bin": os.urandom(size)})
    if h is None:
        refused += 1
    else:
        n[kind] += 1
    i += 1
st.close()
print(json.dumps(n))
"""


def fill_store(root: Path, env: dict[str, str], size: int = 48 * 1024) -> dict[str, int]:
    """Put entries of ``triton`` and ``nvfuser`` kinds until the store's filesystem is full."""
    r = subprocess.run(
        [PYTHON, "-c", FILL_CHILD, str(root), str(size)], env=env, capture_output=True, timeout=300
    )
    if r.returncode != 0:
        raise RuntimeError(text(r.stderr)[-2000:])
    return json.loads(text(r.stdout).strip().splitlines()[-1])


# ----------------------------------------------------------------------------------- files a user names
# (issue 34) Every command that reads a file a user names, against each attack on that name.
#: The commands, each with the kind of file it reads there (``{path}``: the attack's path,
#: ``{store}``: a store of the case's own).
USER_FILE_COMMANDS: dict[str, tuple[str, list[str]]] = {
    "explain --against": ("fingerprint", ["explain", "--against", "{path}", "--dir", "{store}"]),
    "import": ("bundle", ["import", "{path}", "--dir", "{store}"]),
    "prewarm": ("spec", ["prewarm", "{path}", "--target", "cuda:90", "--dir", "{store}"]),
}
#: The attacks on a name: a FIFO (nobody writes), a link to one, ``/dev/stdin`` on a pipe whose
#: writer stays open and silent, a 1 GiB sparse file that starts like the real thing (read
#: whole, it takes a gigabyte), and a document nested 100,000 deep (Python's parsers recurse).
USER_FILE_ATTACKS = ("fifo", "fifo-link", "stdin-pipe", "sparse-1GiB", "deep")
#: Bundles are large by nature: a sparse one is bounded by its manifest's limits (exit 1, as any
#: bundle whose content is refused; test_hostile_inputs.py's bombs), not by the file's size.
USER_FILE_CONTENT_BOUNDED = {("import", "sparse-1GiB")}
DEEP = 100_000


def fingerprint_head() -> bytes:
    """The start of a fingerprint file as ``kcache fingerprint --json`` writes it."""
    return b'{\n "format": "kcache-fingerprint",\n "parts": {\n  "key_tag": "",\n  "triton_version": "'


def deep_fingerprint(depth: int = DEEP) -> bytes:
    return b'{"format": "kcache-fingerprint", "parts": {"x": ' + b"[" * depth + b"]" * depth + b"}}"


SPEC_HEAD = b'version = 1\n\n[[triton]]\nkernel = "kernels:add_kernel"\nsizes = [{ N = 1024 }]\n# '


def deep_spec(depth: int = DEEP) -> bytes:
    return (
        b'version = 1\n\n[[triton]]\nkernel = "kernels:add_kernel"\nsizes = '
        + b"[" * depth
        + b"]" * depth
        + b"\n"
    )


def deep_bundle(path: Path, depth: int = 1000) -> Path:
    """A bundle whose manifest nests ``depth`` deep (msgpack's C unpacker takes up to 1,024; what
    is done with the value after, ``str()`` of its key tag, recursed)."""
    nested: Any = []
    for _ in range(depth):
        nested = [nested]
    body = {"format": "kcache-bundle", "schema": 1, "created": 0.0, "key_tag": nested, "records": []}
    return write_bundle(path, [], manifest=manifest_bytes([], body=body))


def user_file(d: Path, attack: str, fmt: str) -> tuple[str, int | None]:
    """The path of ``attack`` for a file of ``fmt`` (fingerprint, bundle, spec) under ``d``, and
    for ``stdin-pipe`` the read end of a pipe to give the child as its standard input (the test
    keeps the write end open, silent, and closes both after)."""
    d.mkdir(parents=True, exist_ok=True)
    name = {"fingerprint": "other.json", "bundle": "other.kcb", "spec": "spec.toml"}[fmt]
    if attack == "fifo":
        os.mkfifo(d / name)
        return str(d / name), None
    if attack == "fifo-link":
        os.mkfifo(d / "the-fifo")
        os.symlink(d / "the-fifo", d / name)
        return str(d / name), None
    if attack == "stdin-pipe":
        r, w = os.pipe()
        _PIPES[r] = w
        return "/dev/stdin", r
    if attack == "sparse-1GiB":
        head = {"fingerprint": fingerprint_head(), "spec": SPEC_HEAD, "bundle": tar_header("MANIFEST", GiB)}[
            fmt
        ]
        with open(d / name, "wb") as f:
            f.write(head)
            f.truncate(GiB)
        return str(d / name), None
    if attack == "deep":
        if fmt == "bundle":
            return str(deep_bundle(d / name)), None
        (d / name).write_bytes(deep_fingerprint() if fmt == "fingerprint" else deep_spec())
        return str(d / name), None
    raise ValueError(attack)


_PIPES: dict[int, int] = {}


def close_pipe(r: int | None) -> None:
    """Close a pipe :func:`user_file` made (both ends)."""
    if r is None:
        return
    for fd in (r, _PIPES.pop(r, None)):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def user_file_case(
    d: Path, command: str, attack: str, env: dict[str, str], timeout: float = 30
) -> str | None:
    """Run ``command`` against ``attack``, in a child with its address space limited (1.5 GiB) and
    a time limit; None when it was refused as it should be (within the time, exit 2 with one
    line naming the file: a bad argument; 1 for a bundle bounded by its content), else what
    went wrong."""
    fmt, args = USER_FILE_COMMANDS[command]
    path, stdin = user_file(d, attack, fmt)
    argv = [a.format(path=path, store=str(d / "store")) for a in args]
    try:
        r, m = cli_limited(
            argv,
            env,
            d / "measure",
            timeout=timeout,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"blocked: still running after {timeout:.0f} s"
    finally:
        close_pipe(stdin)
    want = 1 if (command, attack) in USER_FILE_CONTENT_BOUNDED else 2
    why = one_line_failure(r, path, want=want)
    if why is None and m.get("maxrss") and m["maxrss"] > RSS_SMALL:
        why = f"peak RSS {m['maxrss'] >> 20} MiB"
    if why is None and (d / "store").exists() and command == "import":
        why = "a refused import made the store"
    return why


# ----------------------------------------------------------------------------------- the phase


def phase_inputs(base: Path, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every hostile-input case once; ``failures`` says what did not hold."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    failures: list[str] = []
    cases: dict[str, Any] = {}
    t0 = time.perf_counter()

    def case(name: str, fn: Callable[[Path], dict[str, Any]]) -> None:
        d = base / name
        d.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        try:
            res = fn(d)
        except subprocess.TimeoutExpired as e:
            res = {"failures": [f"blocked: {e.cmd!r:.200} did not end in {e.timeout} s"]}
        except Exception as e:  # the case itself broke: a failure, with what it was
            res = {"failures": [f"{type(e).__name__}: {e}"]}
        res["seconds"] = round(time.perf_counter() - t, 2)
        failures.extend(f"{name}: {f}" for f in res.get("failures", []))
        cases[name] = res
        log(f"inputs {name}: {len(res.get('failures', []))} failures, {res['seconds']} s")

    case("never_blocks", _case_never_blocks)
    case("memory_bombs", _case_memory_bombs)
    case("malformed_manifests", lambda d: _case_malformed(d, rng))
    case("poisoned_meta", _case_poisoned_meta)
    case("clock_skew", _case_clock_skew)
    case("full_disk", _case_full_disk)
    case("user_files", _case_user_files)
    return {"cases": cases, "seconds": round(time.perf_counter() - t0, 1), "failures": failures}


def _case_user_files(d: Path) -> dict[str, Any]:
    """Every command that reads a file a user names against every attack on that name (issue
    34): refused at once, exit 2, one line (see :func:`user_file_case`)."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = [(c, a) for c in USER_FILE_COMMANDS for a in USER_FILE_ATTACKS]

    def one(pair: tuple[str, str]) -> str | None:
        c, a = pair
        sub = d / f"{c.replace(' ', '_')}-{a}"
        return user_file_case(sub, c, a, child_env(sub))

    with ThreadPoolExecutor(4) as ex:
        whys = list(ex.map(one, pairs))
    fails = [f"{c} {a}: {why}" for (c, a), why in zip(pairs, whys) if why]
    return {"cases": len(pairs), "failures": fails}


def _case_never_blocks(d: Path) -> dict[str, Any]:
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


def _case_memory_bombs(d: Path) -> dict[str, Any]:
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


def _case_malformed(d: Path, rng: random.Random) -> dict[str, Any]:
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


def _case_poisoned_meta(d: Path) -> dict[str, Any]:
    fails: list[str] = []
    env = child_env(d)
    specs = [("add", "fp32", 64, 90), ("scale", "fp16", 128, 90)]
    ref, r = compile_kernels(specs, env)
    if ref["errors"] or len(ref["kernels"]) != len(specs):
        return {"failures": [f"reference compile: {ref['errors'][:1]}"]}
    secret = b"chaos-secret"
    store = d / "store"
    for signed in (False, True):
        b = d / f"poison-{'signed' if signed else 'unsigned'}.tar"
        poison("bundle", b, env, secret=secret if signed else None)
        ienv = child_env(d, KCACHE_SECRET=secret.decode()) if signed else env
        r = cli(["import", str(b), "--dir", str(store), "--json"], ienv)
        if r.returncode != 0:
            fails.append(
                f"import ({'signed' if signed else 'unsigned'}): rc={r.returncode} {text(r.stderr)[-500:]}"
            )
    r = cli(["inspect", "--kind", "triton-meta", "--json", "--dir", str(store)], env)
    if r.returncode != 0 or json.loads(r.stdout or b"[]"):
        fails.append(f"triton-meta entries imported: {text(r.stdout)[:500]}")
    out, r = compile_kernels(specs, child_env(d, KCACHE="1", KCACHE_DIR=str(store)))
    if out["errors"] or out["kernels"] != ref["kernels"] or not out["enabled"]:
        fails.append(f"compile after importing poisoned bundles: {out['errors'][:1] or 'digests differ'}")
    # Wrong answers planted straight in a store (in the formats an older kcache's import wrote).
    for i, wrong in enumerate((WRONG_PTXAS, *IMPLAUSIBLE_PTXAS)):
        s = d / f"planted-{i}"
        poison("plant", s, env, current=False, wrong=wrong)
        out, r = compile_kernels(specs[:1], child_env(d, KCACHE="1", KCACHE_DIR=str(s)))
        if (
            out["errors"]
            or out["kernels"] != {k: v for k, v in ref["kernels"].items() if k in out["kernels"]}
            or not out["kernels"]
        ):
            fails.append(
                f"compile with planted answer {wrong[:40]!r}: {out['errors'][:1] or 'digests differ'}"
            )
    return {"failures": fails}


def _case_clock_skew(d: Path) -> dict[str, Any]:
    env = child_env(d)
    root = d / "store"
    old = [f"old/{i}" for i in range(12)]
    hot = [f"hot/{i}" for i in range(8)]
    res = finish(store_child(root, "fill", {"keys": old + hot}, env))
    if res.get("errors"):
        return {"failures": res["errors"]}
    ids = res["ids"]
    age_entries(root, [ids[k] for k in old], 1000, env)
    user = store_child(root, "use", {"keys": hot, "seconds": 4}, env)
    time.sleep(0.5)
    ev = finish(store_child(root, "evict", {"max_size": 1024, "seconds": 2}, skewed_env(env, d / "skew")))
    used = finish(user)
    fails = list(ev.get("errors", [])) + list(used.get("errors", []))
    on_disk = entry_ids_on_disk(root)
    lost = [k for k in hot if ids[k] not in on_disk]
    if lost or used.get("misses"):
        fails.append(f"entries in use evicted by a process an hour ahead: {lost or used.get('misses')[:5]}")
    if not ev.get("evicted"):
        fails.append("the skewed process evicted nothing (not even entries unused for 1000 s)")
    return {"evicted": ev.get("evicted"), "hot_kept": len(hot) - len(lost), "failures": fails}


def _case_full_disk(d: Path) -> dict[str, Any]:
    mnt = d / "mnt"
    if not mount_tmpfs(mnt, "4m"):
        return {"skipped": "mounting a tmpfs needs root", "failures": []}
    fails: list[str] = []
    try:
        env = child_env(d)
        root = mnt / "store"
        n = fill_store(root, env)
        fill_to_the_last_byte(mnt / "filler")
        if free_bytes(mnt) != 0:
            fails.append(f"not full: {free_bytes(mnt)} bytes free")
        r = cli(["clear", "--kind", "triton", "--dir", str(root)], env)
        out = text(r.stdout).splitlines()
        if r.returncode != 0 or not out or not out[0].startswith(f"removed {n['triton']} entr"):
            fails.append(
                f"clear --kind triton on a full disk: rc={r.returncode} {out} {text(r.stderr)[-300:]}"
            )
        if free_bytes(mnt) == 0:
            fails.append("clear --kind freed nothing")
        fill_to_the_last_byte(mnt / "filler")
        r = cli(["clear", "--all", "--dir", str(root), "--json"], env)
        try:
            rep = json.loads(r.stdout)
        except ValueError:
            rep = {}
        if r.returncode != 0 or rep.get("count") != n["nvfuser"]:
            fails.append(f"clear --all on a full disk: rc={r.returncode} {rep or text(r.stderr)[-300:]}")
        if entry_ids_on_disk(root):
            fails.append(f"entries left: {len(entry_ids_on_disk(root))}")
        os.unlink(mnt / "filler")
        r = cli(["verify", "--fix", "--dir", str(root)], env)
        r2 = cli(["verify", "--dir", str(root)], env)
        if r2.returncode != 0:
            fails.append(f"verify after clear: {text(r2.stdout)[-500:]} (fix: {text(r.stdout)[-300:]})")
        return {"entries": n, "failures": fails}
    finally:
        umount(mnt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kcache against hostile inputs (issue 18)")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kcache-inputs-"))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        res = phase_inputs(base, a.seed, log)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "cases"}, indent=2, default=str))
    return 0 if not res["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
