"""What every chaos phase shares (tools/chaos.py and its phases): entries whose content is a pure
function of their (kind, key), so that whatever a store serves can be checked byte for byte by any
process at any time (a hit is exactly right, or it is "wrong bytes", which must never happen); a
store opened as the phases open it, ``kcache verify`` as a user runs it, a scan of every committed
entry, and kcache's warnings captured and sorted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

#: This folder (the chaos tools), the checkout, and the chaos tool whose command line spawns the
#: worker processes (``tools/chaos.py worker``, ``triton-worker``) and loads in child processes.
TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
CHAOS = TOOLS / "chaos.py"
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

KINDS = ("chaos", "chaos-group")
RECORD_NAME = "__kcache__.rec"


# ----------------------------------------------------------------------------------- content


def expand(seed: bytes, size: int) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
        i += 1
    return bytes(out[:size])


@functools.lru_cache(maxsize=4096)
def expected(kind: str, key: str) -> dict[str, bytes]:
    """The one true content of (kind, key): member names, sizes and bytes derived from the key."""
    h = hashlib.sha256(f"{kind}\0{key}".encode()).digest()
    n = 1 if kind == "chaos" else 2 + h[0] % 5
    files = {}
    for i in range(n):
        s = hashlib.sha256(h + bytes([i])).digest()
        r = s[0]
        if r < 8:
            size = 0  # empty members exist (Triton writes some)
        elif r < 200:
            size = 1 + int.from_bytes(s[1:3], "big") % 4096  # Triton-sized
        elif r < 250:
            size = 4096 + int.from_bytes(s[1:4], "big") % (60 * 1024)
        else:
            size = 100 * 1024 + int.from_bytes(s[1:4], "big") % (156 * 1024)
        ext = ("cubin", "ptx", "json", "ttir", "llir", "bin")[s[4] % 6]
        files[f"m{i}.{ext}"] = expand(s, size)
    return files


def key_name(i: int) -> str:
    return f"chaos/key-{i:04d}"


# ----------------------------------------------------------------------------------- helpers


def open_store(root: str | Path, max_size: int = 1 << 40) -> Any:
    from kcache.store import Store

    return Store.open(Path(root), max_size=max_size, network_fs=False)


def check_hit(kind: str, key: str, hit: Any) -> str | None:
    """None if ``hit`` serves exactly the expected content of (kind, key), else what is wrong.
    A member file that vanished after the hit was returned is reported as 'vanished:...'."""
    exp = expected(kind, key)
    if set(hit.paths) != set(exp):
        return f"members {sorted(hit.paths)} != {sorted(exp)}"
    for name, data in exp.items():
        got = hit.read(name)
        if got != data:
            return f"wrong bytes in {name} ({len(got)} bytes, expected {len(data)})"
        try:  # the file a library would open: must hold the same bytes, and stay
            with open(hit.paths[name], "rb") as f:
                on_disk = f.read()
        except FileNotFoundError:
            return f"vanished:{name}"
        if on_disk != data:
            return f"wrong bytes in the file of {name} ({len(on_disk)} bytes, expected {len(data)})"
    return None


def verify(root: str | Path, fix: bool) -> dict[str, Any]:
    """``kcache verify [--fix]`` on the store at ``root``: through the command line when it is
    there (what a user runs), else kcache.maintenance.verify. Adds 'seconds' and 'how'."""
    t0 = time.perf_counter()
    if _cli_available():
        args = [sys.executable, "-m", "kcache", "verify", "--dir", str(root), "--json"]
        if fix:
            args.insert(4, "--fix")
        p = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env_without_kcache())
        try:
            out = json.loads(p.stdout)
        except ValueError:
            out = {
                "ok": False,
                "error": f"rc={p.returncode} stdout={p.stdout[-500:]!r} stderr={p.stderr[-1500:]!r}",
            }
        out["rc"] = p.returncode
        out["how"] = "cli"
    else:
        from kcache import config, maintenance
        from kcache.integrations import entry_checks

        s = config.load(env={}, dir=str(root))
        st = maintenance.open_store(s, write=fix)
        try:
            out = maintenance.verify(st, fix=fix, checks=entry_checks())
        finally:
            maintenance.close_store(st)
        out["how"] = "maintenance"
    out["seconds"] = time.perf_counter() - t0
    return out


@functools.lru_cache(maxsize=1)
def _cli_available() -> bool:
    return (REPO / "kcache" / "cli.py").exists() and (REPO / "kcache" / "__main__.py").exists()


def env_without_kcache(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env.update(extra)
    return env


def scan_entries(root: str | Path) -> tuple[int, list[str]]:
    """(entries, problems): every committed entry directory must be complete and exact."""
    from kcache.store.records import Record

    store = open_store(root)
    problems = []
    n = 0
    try:
        for ident in list(store.iter_entry_ids()):
            n += 1
            hit, why = store.read_any(ident, full=True)
            if hit is None:
                if why != "missing":  # "missing": removed between the listing and the read
                    problems.append(f"{ident[:12]}: {why}")
                continue
            rec: Record = hit.record
            if rec.kind in KINDS:
                bad = check_hit(rec.kind, rec.key, hit)
                if bad and not bad.startswith("vanished:"):
                    problems.append(f"{ident[:12]}: {bad}")
    finally:
        store.close()
    return n, problems


class WarningCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def capture_warnings() -> WarningCapture:
    h = WarningCapture()
    logging.getLogger("kcache").addHandler(h)
    return h


def quiet_kcache_logger() -> None:
    """kcache's warnings go to the captures only (the parent injects hundreds of faults)."""
    from kcache import log as klog

    klog.configure()
    lg = logging.getLogger("kcache")
    for h in list(lg.handlers):
        if type(h) is logging.StreamHandler:
            lg.removeHandler(h)


def warning_kinds(messages: list[str]) -> Counter:
    c: Counter = Counter()
    for m in messages:
        if m.startswith("corrupt "):
            c["corrupt"] += 1
        elif "index" in m:
            c["index"] += 1
        elif "cannot write" in m:
            c["write"] += 1
        elif "cannot read" in m:
            c["read"] += 1
        else:
            c["other"] += 1
    return c
