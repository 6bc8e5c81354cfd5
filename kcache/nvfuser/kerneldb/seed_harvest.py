"""Seeding a private folder from the store, and harvesting what nvFuser added to it.

:func:`seed` writes every kernel stored for a fingerprint into a fresh folder in nvFuser's
format, as ``seed_<i>.cu``/``.cubin``: names nvFuser never writes (it numbers its own
``kernel_<N>`` from the size of its in-memory map, which is below the row count when two stored
kernels share a source), so its new files can never land on a seeded one. Seeded files get access
time 0, so that a later read by nvFuser shows.

:func:`harvest` stores the rows nvFuser added, counts the seeded kernels nvFuser read as hits (the
others are not touched, so eviction ages out kernels nobody loads) and updates the manifest.
Neither needs nvFuser: they take a folder and the store (its :class:`~kcache.store.api.Cache` face).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...store.fs import atomic_write
from .entries import (
    KIND,
    entry_key,
    kernel_from_hit,
    key_components,
    list_members,
    put_kernel,
    update_manifest,
)
from .fingerprint import Fingerprint
from .folder import DB_FILE, HEADER, Kernel, load_kernel, read_rows

if TYPE_CHECKING:
    from ...store.api import Cache


@dataclass
class SeedResult:
    """What :func:`seed` wrote, and what it left out."""

    #: content hash -> the seeded binary's file name
    seeded: dict[str, str] = field(default_factory=dict)
    #: listed members that are gone or corrupt (not seeded)
    missing: list[str] = field(default_factory=list)
    #: members left out because another one has the same source (KernelDb keeps one per source)
    shadowed: int = 0
    source: str = ""
    bytes: int = 0
    seconds: float = 0.0


def _write_new(path: str, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)


def _zero_atime(path: str) -> None:
    """Access time 0, so that a later read by nvFuser shows (relatime updates atime < mtime)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        os.utime(path, ns=(0, st.st_mtime_ns))


def seed(store: Cache, db_dir: str | os.PathLike, fp: Fingerprint) -> SeedResult:
    """Write every kernel stored for ``fp`` into ``db_dir`` in nvFuser's format (a fresh db.csv
    with ``seed_<i>`` files). ``db_dir`` is created if needed and must hold no db.csv yet.
    Corrupt or mismatching entries are skipped (and reported in ``missing``)."""
    t0 = time.perf_counter()
    d = os.fspath(db_dir)
    os.makedirs(d, mode=0o700, exist_ok=True)
    res = SeedResult()
    members, res.source = list_members(store, fp)
    chosen: dict[bytes, tuple[str, Kernel]] = {}  # source digest -> (content hash, kernel)
    for h in members:
        hit = store.get(KIND, entry_key(fp, h), count=False)
        k = kernel_from_hit(hit, h) if hit is not None else None
        if k is None:
            res.missing.append(h)
            continue
        src = hashlib.sha256(k.code).digest()
        if src in chosen:
            res.shadowed += 1
            del chosen[src]  # the later one (newer in the list) wins, as in nvFuser's own reader
        chosen[src] = (h, k)
    lines = [HEADER]
    for i, (h, k) in enumerate(chosen.values()):
        cu, cubin = f"seed_{i}.cu", f"seed_{i}.cubin"
        _write_new(os.path.join(d, cu), k.code)
        _write_new(os.path.join(d, cubin), k.cubin)
        _zero_atime(os.path.join(d, cubin))
        lines.append(f"{k.signature},{k.compile_args},{cu},{cubin}")
        res.seeded[h] = cubin
        res.bytes += len(k.code) + len(k.cubin)
    csv = os.path.join(d, DB_FILE)
    atomic_write(csv, ("\n".join(lines) + "\n").encode("ascii"))
    _zero_atime(csv)
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class HarvestResult:
    """What one :func:`harvest` stored, skipped and counted."""

    added: list[str] = field(default_factory=list)  # content hashes newly stored
    already: int = 0  # new here, but already in the store (another process stored them)
    bad: int = 0  # rows skipped: malformed, files missing or inconsistent
    failed: int = 0  # store refused (read-only, full, broken)
    used: int = 0  # seeded kernels nvFuser read this time (counted as hits)
    manifest: bool = False  # the manifest was updated


def harvest(
    store: Cache,
    db_dir: str | os.PathLike,
    fp: Fingerprint,
    known: set[str] | None = None,
    *,
    done_files: set[str] | None = None,
    seeded: Mapping[str, str] | None = None,
    used: set[str] | None = None,
    missing: Iterable[str] = (),
    pending: set[str] | None = None,
) -> HarvestResult:
    """Store the kernels nvFuser added to ``db_dir`` that are not stored yet, and list them in
    ``fp``'s manifest. Never raises for a bad folder: bad rows are skipped and counted.

    ``known`` (content hashes already stored or seeded) and ``done_files`` (rows already looked
    at, by file name) are updated in place so that repeated harvests of one folder skip quickly.
    ``seeded`` (content hash -> binary file name) and ``used`` count the seeded kernels nvFuser
    read since the last harvest as hits. ``missing`` members are pruned from the manifest when
    confirmed absent. ``pending`` holds members not yet in the manifest (a locked manifest is
    retried at the next harvest)."""
    res = HarvestResult()
    if store.readonly:
        return res
    d = os.fspath(db_dir)
    known = set() if known is None else known
    done_files = set() if done_files is None else done_files
    pending = set() if pending is None else pending
    rows, res.bad = read_rows(d)
    for row in rows:
        if row.cubin_file.startswith("seed_") or row.cubin_file in done_files:
            continue
        done_files.add(row.cubin_file)
        k = load_kernel(d, row)
        if k is None:
            res.bad += 1
            continue
        h = k.content_hash
        if h in known:
            continue
        key = entry_key(fp, h)
        # Counted: a miss (with its key components, for `kcache explain`) is what this process
        # had; a hit only when another process stored the same kernel since this one started.
        if store.get(KIND, key, components=functools.partial(key_components, fp, k)) is not None:
            res.already += 1
        else:
            how = put_kernel(store, fp, k)
            if how is None:
                res.failed += 1
                continue
            if how == "added":
                res.added.append(h)
            else:
                res.already += 1
        known.add(h)
        pending.add(h)
    if seeded:
        used = set() if used is None else used
        for h, cubin in seeded.items():
            if h in used:
                continue
            try:
                read_by_nvfuser = os.stat(os.path.join(d, cubin)).st_atime_ns > 0
            except OSError:
                continue
            if read_by_nvfuser:
                used.add(h)
                res.used += 1
                store.get(KIND, entry_key(fp, h))  # a hit: counted, and its last use refreshed
    drop = list(missing)
    if pending or drop:
        order = [h for h in res.added if h in pending] + sorted(pending - set(res.added))
        if update_manifest(store, fp, add=order, drop=drop) is not None:
            pending.clear()
            res.manifest = True
    return res
