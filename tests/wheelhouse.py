"""Wheels of installed distributions, made from the installed files (no network, no pip cache).

tests/test_examples.py builds a fresh virtual environment and installs into it what the docs say,
with pip, from a folder of wheels (``PIP_NO_INDEX=1``, ``PIP_FIND_LINKS``): pip resolves the
documented commands' requirements as it would from an index, and a requirement the project
forgot to declare is missing there, as on a user's machine. The wheels are packed again from the
running environment's own installed files (its RECORD, less what pip writes at install time and
files outside site-packages, such as console scripts, which pip makes again from
``entry_points.txt``): what this machine has is what the fresh environment gets, whichever index
or cache it first came from.

The bytecode this environment already compiled goes along (:func:`_checked_pyc`), as
hash-checked ``.pyc`` files: the fresh environment's first imports of torch, Inductor and Triton
(about 2,400 modules) read them instead of compiling every module again, 12-15 s of CPU of the
examples test. A pip install from an index compiles them too (its default), so the fresh
environment is no further from a user's for having them.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import importlib.util
import os
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path

#: Files of a dist-info folder that pip writes at install time: not part of a wheel.
_INSTALL_TIME = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: Iterable[str], extras: dict[str, set[str]] | None = None) -> list[md.Distribution]:
    """The installed distributions ``roots`` need, and theirs, transitively (markers evaluated for
    this interpreter; extras only as asked in ``extras``)."""
    from packaging.requirements import Requirement

    extras = extras or {}
    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        dist = md.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            asked = extras.get(name, set())
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (asked or {""})):
                continue
            todo.append(req.name)
    return list(seen.values())


def _copy_in(z: zipfile.ZipFile, path: Path, arc: str) -> str:
    """``path`` stored in ``z`` as ``arc``, read once: its RECORD row (sha256 and size of what was
    written). ``ZipFile.write`` copies in 8 KB pieces and the hash would read the file again: over
    torch's and Triton's 1.4 GB that was 12 s of CPU of the examples test, half of it done twice."""
    info = zipfile.ZipInfo.from_file(path, arc)  # its mode and mtime, as ZipFile.write keeps them
    info.compress_type = zipfile.ZIP_STORED
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as src, z.open(info, "w") as dst:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            dst.write(chunk)
            n += len(chunk)
    return _record_row(arc, h.digest(), n)


def _write(z: zipfile.ZipFile, path: Path, arc: str, data: bytes) -> str:
    """``data`` stored in ``z`` as ``arc``, with ``path``'s mode and time: its RECORD row."""
    z.writestr(zipfile.ZipInfo.from_file(path, arc), data)  # (ZipInfo's default: stored)
    return _record_row(arc, hashlib.sha256(data).digest(), len(data))


def _checked_pyc(src: bytes, path: Path) -> bytes | None:
    """The bytecode this interpreter compiled for the source file ``path`` (contents ``src``), as a
    hash-checked ``.pyc`` (PEP 552), or None where there is none or it is stale. pip gives the
    files it installs new modification times, so a timestamp ``.pyc`` would be stale there and
    compiled again; a hash-checked one is valid wherever its source is the same bytes (Python
    hashes the source at import to check). The code itself is the compiled file's, unchanged:
    its recorded file name is fixed to the new place at import, as for any moved ``.pyc``."""
    try:
        pyc = Path(importlib.util.cache_from_source(str(path)))
        data = pyc.read_bytes()
        st = os.stat(path)
    except (OSError, NotImplementedError, ValueError):
        return None
    magic = importlib.util.MAGIC_NUMBER
    fresh = (
        len(data) > 16
        and data[:4] == magic
        and int.from_bytes(data[4:8], "little") == 0  # timestamp-checked: compare it with the source
        and int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(data[12:16], "little") == st.st_size & 0xFFFFFFFF
        and st.st_size == len(src)
    )
    if not fresh:
        return None
    return magic + (0b11).to_bytes(4, "little") + importlib.util.source_hash(src) + data[16:]


def _record_row(arc: str, digest: bytes, size: int) -> str:
    """A RECORD line: the member's name, its sha256 (urlsafe base64, unpadded) and its size."""
    return f"{arc},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{size}"


def repack(dist: md.Distribution, out: Path) -> Path:
    """A wheel of ``dist`` from its installed files, in ``out``."""
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel_meta.splitlines() if ln.startswith("Tag:")]
    if not tags:
        raise RuntimeError(f"{dist.metadata['Name']}: no wheel tag in its WHEEL file")
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    info_dir = f"{name}-{dist.version}.dist-info"
    whl = out / f"{name}-{dist.version}-{tags[0]}.whl"
    rows = []
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as z:
        for f in dist.files or []:
            rel = str(f).replace("\\", "/")
            if rel.startswith("../") or "/__pycache__/" in f"/{rel}" or rel.endswith(".pyc"):
                continue
            top, _, base = rel.partition("/")
            if top.endswith(".dist-info") and base in _INSTALL_TIME:
                continue
            path = Path(str(dist.locate_file(f)))
            if not path.is_file():
                continue
            arc = f"{info_dir}/{base}" if top.endswith(".dist-info") else rel
            if not arc.endswith(".py"):
                rows.append(_copy_in(z, path, arc))
                continue
            src = path.read_bytes()  # read once: stored, and hashed for its .pyc
            rows.append(_write(z, path, arc, src))
            pyc = _checked_pyc(src, path)
            if pyc is not None:
                rows.append(_write(z, path, importlib.util.cache_from_source(arc), pyc))
        rows.append(f"{info_dir}/RECORD,,")
        z.writestr(f"{info_dir}/RECORD", "\n".join(rows) + "\n")
    return whl


def build(roots: Iterable[str], out: Path, extras: dict[str, set[str]] | None = None) -> list[Path]:
    """Wheels of ``roots`` and everything they need, in ``out`` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    return [repack(d, out) for d in closure(roots, extras)]
