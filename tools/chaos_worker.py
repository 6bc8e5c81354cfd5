"""The process the crash and concurrency phases attack (``tools/chaos.py worker``): random puts,
groups, reads, removals, evictions, flushes, stats and verifies on one store, each acknowledged put
journaled; with ``--kill-at N`` it SIGKILLs itself at the N-th write-side event (a rename, mkdir,
link, utime, unlink, a file write cut in half, an SQLite statement): :class:`KillPoints`.
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import random
import shutil
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

from chaos_base import (
    KINDS,
    capture_warnings,
    check_hit,
    expected,
    key_name,
    open_store,
)

# ----------------------------------------------------------------------------------- kill points


_REAL_WRITE = os.write


class KillPoints:
    """SIGKILL this process at the N-th write-side event. Events: os.rename/replace/mkdir/link/
    utime/unlink, shutil.rmtree, a write to a file opened for writing (cut in half: the first
    half is written, then the kill), and each SQLite statement the index runs."""

    def __init__(self, n: int, root: str, log: str | None = None) -> None:
        self.left = n
        self.root = os.path.abspath(root)
        self.log = log

    def tick(self, what: str) -> None:
        self.left -= 1
        if self.left <= 0:
            if self.log:  # where the kill landed, for the report
                fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                _REAL_WRITE(fd, f"{what}\n".encode())
                os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self, store: Any = None) -> None:
        kp = self

        def write(fd: int, data: Any) -> int:
            # The store writes members and records with os.write: cut the write in half, then
            # the kill point (a torn file, as power loss or SIGKILL mid-write would leave).
            if kp.left == 1 and len(data) > 1:
                _REAL_WRITE(fd, bytes(memoryview(data)[: len(data) // 2]))
            kp.tick("write")
            return _REAL_WRITE(fd, data)

        os.write = write  # type: ignore[assignment]
        for name in ("rename", "replace", "mkdir", "link", "utime", "unlink"):
            orig = getattr(os, name)

            def wrapped(*a: Any, __orig: Callable = orig, __name: str = name, **k: Any) -> Any:
                kp.tick(__name)
                return __orig(*a, **k)

            setattr(os, name, wrapped)
        orig_rmtree = shutil.rmtree

        def rmtree(*a: Any, **k: Any) -> Any:
            kp.tick("rmtree")
            return orig_rmtree(*a, **k)

        shutil.rmtree = rmtree  # type: ignore[assignment]
        real_open = builtins.open

        class HalfWriter:
            def __init__(self, f: Any) -> None:
                self._f = f

            def write(self, data: Any) -> Any:
                if kp.left <= 1 and len(data) > 1:
                    self._f.write(data[: len(data) // 2])
                    self._f.flush()
                kp.tick("write")
                return self._f.write(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._f, name)

            def __enter__(self) -> HalfWriter:
                return self

            def __exit__(self, *exc: Any) -> None:
                self._f.close()

        def open_(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
            f = real_open(file, mode, *a, **k)
            if any(c in mode for c in "wxa+") and isinstance(file, (str, os.PathLike)):
                if os.path.abspath(os.fspath(file)).startswith(kp.root):
                    return HalfWriter(f)
            return f

        builtins.open = open_  # type: ignore[assignment]
        from kcache.store import index as index_mod

        class TickingConnection:
            """The index's SQLite connection, with a kill point before every statement."""

            def __init__(self, conn: Any) -> None:
                self._conn = conn

            def execute(self, *a: Any, **k: Any) -> Any:
                kp.tick("sql")
                return self._conn.execute(*a, **k)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._conn, name)

        orig_init = index_mod.Index.__init__

        def init(self: Any, conn: Any, *a: Any, **k: Any) -> None:
            orig_init(self, TickingConnection(conn), *a, **k)

        index_mod.Index.__init__ = init  # type: ignore[method-assign]
        idx = getattr(store.disk.catalogue, "_index", None)
        if idx is not None:  # opened before the kill points: its statements count too
            idx.conn = TickingConnection(idx.conn)


# ----------------------------------------------------------------------------------- worker

OPS_CRASH = {"put": 30, "put_path": 8, "get": 35, "remove": 6, "flush": 8, "evict": 4, "stats": 2}
OPS_WRITERS = {"put": 45, "put_path": 10, "get": 40, "flush": 5}
OPS_CONCURRENT = {
    "put": 22,
    "put_path": 6,
    "get": 44,
    "remove": 5,
    "evict": 5,
    "flush": 8,
    "stats": 4,
    "verify": 1,
    "verify_fix": 1,
    "clear_older": 1,
}


class Worker:
    """Random operations on a store; counts what the caller saw."""

    def __init__(
        self,
        root: str,
        seed: int,
        keys: int,
        max_size: int,
        journal: str | None,
        ops: dict[str, int],
        scratch: str,
        events: str | None = None,
    ) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.keys = keys
        self.store = open_store(root, max_size=max_size)
        self.journal = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if journal else None
        self.names = list(ops)
        self.weights = list(ops.values())
        self.scratch = scratch
        self.c: Counter = Counter()
        self.errors: list[str] = []
        self.wrong: list[str] = []
        self.events = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if events else None
        self.current = ""
        self.evicting = False
        self.trace_removals(self.store)

    def log(self, line: str) -> None:
        # The journal is the parent's record of what was acknowledged, not the store under test:
        # written with the real write (one small O_APPEND write: a SIGKILL cannot tear it), never
        # through the kill points, which would cut a line in half and let the next trial's first
        # line run into it (a lost "R" line then made a removed entry look lost).
        if self.journal is not None:
            _REAL_WRITE(self.journal, (line + "\n").encode())

    def pick(self) -> tuple[str, str]:
        return self.rng.choice(KINDS), key_name(self.rng.randrange(self.keys))

    def trace_removals(self, store: Any) -> None:
        """Log every entry directory this process removes, with the operation that did it, so
        that a hit whose files vanish can be attributed (explicit removal or eviction)."""
        if self.events is None:
            return
        entries = store.disk.entries
        orig = entries.remove
        orig_evict = store.evict

        def remove(ident: str, *, later: bool = False, **kw: Any) -> Any:
            why = "evict" if self.evicting or later else self.current
            self.event(f"D {time.time():.6f} {why} {ident}")
            return orig(ident, later=later, **kw)  # (its other keywords, as they are)

        def evict(*a: Any, **k: Any) -> Any:
            self.evicting = True
            try:
                return orig_evict(*a, **k)
            finally:
                self.evicting = False

        entries.remove = remove
        store.evict = evict

    def event(self, line: str) -> None:
        if self.events is not None:
            os.write(self.events, (line + "\n").encode())

    def check(self, kind: str, key: str, hit: Any, what: str, t0: float) -> None:
        bad = check_hit(kind, key, hit)
        if bad is None:
            self.c["verified_hits"] += 1
        elif bad.startswith("vanished:"):
            self.c["vanished_after_hit"] += 1
            self.event(f"V {t0:.6f} {time.time():.6f} {what} {hit.record.id}")
        else:
            self.wrong.append(f"{what} {kind} {key}: {bad}")

    def op(self, name: str) -> None:
        st = self.store
        t0 = time.time()
        if name in ("put", "put_path"):
            kind, key = self.pick()
            files: dict[str, Any] = dict(expected(kind, key))
            if name == "put_path":
                d = os.path.join(self.scratch, f"{os.getpid()}-{self.c['ops']}")
                os.makedirs(d, exist_ok=True)
                for n, b in list(files.items()):
                    p = os.path.join(d, n)
                    with open(p, "wb") as f:
                        f.write(b)
                    files[n] = p
            hit = st.put(kind, key, files, components={"key": key, "pid": os.getpid()}, compile_s=0.01)
            if name == "put_path":
                shutil.rmtree(d, ignore_errors=True)
            if hit is None:
                self.c["put_none"] += 1
                return
            self.check(kind, key, hit, "put", t0)
            self.log(f"A {kind} {key}")
            self.c["acked"] += 1
        elif name == "get":
            kind, key = self.pick()
            hit = st.get(kind, key, {"key": key})
            if hit is None:
                self.c["misses"] += 1
            else:
                self.check(kind, key, hit, "get", t0)
        elif name == "remove":
            kind, key = self.pick()
            self.log(f"R {kind} {key}")
            st.remove([st.entry_id(kind, key)])
            self.c["removed"] += 1
        elif name == "flush":
            st.flush(force=True)
        elif name == "evict":
            st.evict()
        elif name == "stats":
            from kcache.maintenance.stats import store_stats

            try:
                store_stats(st)
            except Exception as e:  # the index may be busy: stats is a command, it may fail
                self.c[f"stats_failed:{type(e).__name__}"] += 1
        elif name in ("verify", "verify_fix"):
            from kcache import config, maintenance

            s = config.load(env={}, dir=self.root)
            ms = maintenance.open_store(s, write=name == "verify_fix")
            self.trace_removals(ms)
            orig_rs = getattr(ms, "remove_stray", None)

            def remove_stray(shard: str, name: str = "", member: str = "") -> bool:
                self.event(f"D {time.time():.6f} verify_fix:stray {name or shard}")
                return orig_rs(shard, name, member)  # type: ignore[misc]

            if orig_rs is not None:
                ms.remove_stray = remove_stray
            try:
                from kcache.integrations import entry_checks

                r = maintenance.verify(ms, fix=name == "verify_fix", checks=entry_checks())
            finally:
                maintenance.close_store(ms)
            # Nothing here is damaged: whatever verify reports while other processes write is
            # what it saw of their in-between states (counted, for the report; not an error).
            for prob in r["problems"]:
                self.c[f"verify_live:{prob['type']}"] += 1
            self.c["verify_runs"] += 1
        elif name == "clear_older":
            from kcache import maintenance

            maintenance.clear(st, older_than=3.0)
        self.c[f"op:{name}"] += 1

    def run(self, n_ops: int | None) -> None:
        i = 0
        while n_ops is None or i < n_ops:
            name = self.rng.choices(self.names, self.weights)[0]
            self.current = name
            try:
                self.op(name)
            except Exception:
                self.errors.append(f"{name}: {traceback.format_exc(limit=6)}")
            self.c["ops"] += 1
            i += 1


def worker_main(a: argparse.Namespace) -> int:
    import kcache.store.tunables as local

    if a.grace is not None:
        local.GRACE_S = a.grace
        local.TOUCH_EVERY_S = min(local.TOUCH_EVERY_S, a.grace / 4)
    cap = capture_warnings()
    ops = {"concurrent": OPS_CONCURRENT, "writers": OPS_WRITERS}.get(a.mix, OPS_CRASH)
    w = Worker(a.dir, a.seed, a.keys, a.max_size, a.journal, ops, a.scratch, a.events)
    if a.warm:  # the index opened before the kill points count (the first open runs a dozen statements)
        w.store.disk.catalogue.call(lambda idx: idx.total_bytes())
    if a.kill_at:
        KillPoints(a.kill_at, a.dir, a.kill_log).install(w.store)
    print("READY", flush=True)
    w.run(a.ops)
    w.store.close()
    if a.out:
        res = {
            "counts": dict(w.c),
            "errors": w.errors,
            "wrong": w.wrong,
            "warnings": cap.messages,
        }
        with open(a.out, "w") as f:
            json.dump(res, f)
    return 0
