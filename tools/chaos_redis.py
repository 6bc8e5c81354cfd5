#!/usr/bin/env python
"""A hostile Redis against concurrent compiles (the chaos tool's ``hostile`` phase):

    python tools/chaos_redis.py [--full] [--dir DIR] [--seed N] [--json OUT]

Each round starts W worker processes, each its own store (a machine), compiling the same K real
Triton kernels (``tools/chaos.py triton-worker``, ``KCACHE=1``, ``KCACHE_REMOTE``) at once, while
one attack runs against their Redis. Every attack runs with ``KCACHE_SECRET`` and without:

none            no attack (the control: how long a round takes on this box now)
planted-locks   entries deleted as they appear and a lock with no expiry planted on each
fake-heartbeats well-formed locks on every entry whose heartbeats an attacker advances (without
                the secret), or signs with another secret (with it); entries deleted as they appear
huge-values     100 MB (first kernel) and 16 MB values planted under the entries' keys
bad-records     entries with valid checksums whose records hold NaN, escapes, huge numbers
pause           ``CLIENT PAUSE`` 400 ms out of every 500 ms
debug-sleep     ``DEBUG SLEEP 0.5`` back to back (the server stops answering anyone)
sigstop         the server SIGSTOPped for 1 s, resumed for 0.3 s, again
flushall        ``FLUSHALL`` every 20 ms
restart         the server stopped and started again on its port every 1.5 s
noeviction      ``maxmemory`` just above what it uses, ``noeviction``: every write refused
trickle         the workers reach Redis through a proxy that replies 512 bytes every 20 ms
sigkill         no attack on Redis: one worker SIGKILLed a moment into its compiles

The entries' ids come from a scout (the kernels compiled once into a private store). Checked per
round: no worker crashes (exit status, tracebacks, errors from ``triton.compile``), every kernel
is byte-identical to Triton's own compile (``wrong_bytes``), and no worker spends more than
:data:`STALL_BOUND_S` in kcache's calls to Redis and its fruitless waits together (``remote_s`` +
``remote_fruitless_s``, its own counters), nor more than twice the control round's time plus
:data:`SLACK_S` on its compiles (a stall the counters would not see). With the secret and a
SIGKILLed worker, the survivors compile each kernel at most once in all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
CHAOS = HERE.parent / "chaos.py"
PYTHON = sys.executable
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STALL_BOUND_S = 2.0  # per worker: seconds in Redis calls plus fruitless waits
SLACK_S = 10.0  # per worker: compile time over twice the control round's
SECRET = "chaos-hostile-redis"
ATTACKS = (
    "none",
    "planted-locks",
    "fake-heartbeats",
    "huge-values",
    "bad-records",
    "pause",
    "debug-sleep",
    "sigstop",
    "flushall",
    "restart",
    "noeviction",
    "trickle",
    "sigkill",
)
SIZES = {"ci": (3, 3), "full": (8, 6)}  # (workers, kernels)


# ------------------------------------------------------------------------------------ the server
class Server:
    """A redis-server of this phase: no persistence, DEBUG allowed, restartable on its port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        for _ in range(50):
            self.proc = subprocess.Popen(
                [
                    self.exe,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]
                + ["--dir", str(self.workdir), "--enable-debug-command", "yes"]
                + ["--logfile", str(self.workdir / "redis.log")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                        c.sendall(b"PING\r\n")
                        if c.recv(7).startswith(b"+PONG"):
                            return
                except OSError:
                    time.sleep(0.02)
            self.stop()
            time.sleep(0.1)  # the port is still held by the last one: again
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)


class Trickle:
    """A proxy to the server that replies ``chunk`` bytes every ``every`` seconds."""

    def __init__(self, port: int, chunk: int = 512, every: float = 0.02) -> None:
        self.port, self.chunk, self.every = port, chunk, every
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.url = f"redis://127.0.0.1:{self.lsock.getsockname()[1]}/0"
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                c, _ = self.lsock.accept()
                up = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                continue
            threading.Thread(target=self._pump, args=(c, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, c, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while not self.closed.is_set():
                data = src.recv(1 << 16)
                if not data:
                    break
                for i in range(0, len(data), self.chunk if slow else len(data)):
                    dst.sendall(data[i : i + (self.chunk if slow else len(data))])
                    if slow:
                        time.sleep(self.every)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.lsock.close()


# ------------------------------------------------------------------------------------ attacks
def _bad_value(kind: str, key: str, ident: str, i: int) -> bytes:
    """An entry whose checksums are all right and whose record is not."""
    from kcache.store.records import Record, file_info
    from kcache.store.tiers import entry as rt

    files = {"x.json": b"{}", "x.cubin": os.urandom(1000)}
    bad = [
        {"compile_s": math.nan},
        {"summary": {"name": "\x1b]0;owned\x07\x1b[2J"}},
        {"components": {"n": (1 << 64) - 1}},
        {"created": math.inf},
    ][i % 4]
    rec = Record(kind, key, ident, [file_info(n, b) for n, b in files.items()], **bad)
    return rt.pack_entry(rec.encode(), files, None)


class Attack:
    """One attack, run by a thread of the parent until :meth:`stop`; ``count`` is how many
    hostile acts it did."""

    def __init__(self, name: str, server: Server, prefix: str, ids: list[tuple[str, str, str]], secret: bool):
        self.name, self.server, self.prefix, self.ids, self.secret = name, server, prefix, ids, secret
        self.count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        self._once()
        fn = getattr(self, "_" + self.name.replace("-", "_"), None)
        if fn is None:
            return
        self._thread = threading.Thread(target=self._loop, args=(fn,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.name in ("sigstop", "restart", "debug-sleep"):
            if self.server.proc is None or self.server.proc.poll() is not None:
                self.server.start()
            else:
                self.server.proc.send_signal(signal.SIGCONT)
        if self.name in ("noeviction", "pause"):
            with contextlib.suppress(Exception):
                r = self.server.client()
                r.execute_command("CLIENT", "UNPAUSE")
                r.config_set("maxmemory", 0)

    def _loop(self, fn: Callable[[Any], float]) -> None:
        r = None
        while not self._stop.is_set():
            try:
                if r is None:
                    r = self.server.client()
                pause = fn(r)
                self.count += 1
            except Exception as e:  # the server down (our own doing): again
                r = None
                pause = 0.05
                if len(self.errors) < 5 and self.name not in ("restart", "sigstop", "debug-sleep"):
                    self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(pause)

    def _once(self) -> None:
        from kcache.store.tiers import redis_keys as rk

        r = self.server.client()
        if self.name == "huge-values":
            for i, (kind, _key, ident) in enumerate(self.ids):
                size = 100_000_000 if i == 0 else 16_000_000
                r.setrange(rk.entry_key(self.prefix, kind, ident), size - 1, b"x")
                self.count += 1
        elif self.name == "bad-records":
            for i, (kind, key, ident) in enumerate(self.ids):
                r.set(rk.entry_key(self.prefix, kind, ident), _bad_value(kind, key, ident, i))
                self.count += 1
        elif self.name == "noeviction":
            used = int(r.info("memory")["used_memory"])
            r.config_set("maxmemory", used + 100_000)
            r.config_set("maxmemory-policy", "noeviction")
            self.count += 1

    # each returns the pause before its next act
    def _planted_locks(self, r: Any) -> float:
        from kcache.store.tiers import redis_keys as rk

        p = r.pipeline(transaction=False)
        for kind, _key, ident in self.ids:
            p.delete(rk.entry_key(self.prefix, kind, ident))
            p.set(rk.lock_key(self.prefix, ident), "compiling-forever")
        p.execute()
        return 0.05

    def _fake_heartbeats(self, r: Any) -> float:
        from kcache.store.tiers import lease as rl
        from kcache.store.tiers import redis_keys as rk

        self._seq = getattr(self, "_seq", 0) + 1
        holder = getattr(self, "_holder", None) or rl.new_holder()
        self._holder = holder
        p = r.pipeline(transaction=False)
        for kind, _key, ident in self.ids:
            p.delete(rk.entry_key(self.prefix, kind, ident))
            p.set(
                rk.lock_key(self.prefix, ident),
                rl.encode_lock(ident, holder, self._seq, b"another-secret" if self.secret else None),
                px=2000,
            )
        p.execute()
        return 0.2

    def _pause(self, r: Any) -> float:
        r.execute_command("CLIENT", "PAUSE", "400", "ALL")
        return 0.5

    def _debug_sleep(self, r: Any) -> float:
        r.execute_command("DEBUG", "SLEEP", "0.5")
        return 0.0

    def _sigstop(self, r: Any) -> float:
        proc = self.server.proc
        if proc is not None:
            proc.send_signal(signal.SIGSTOP)
            self._stop.wait(1.0)
            proc.send_signal(signal.SIGCONT)
        return 0.3

    def _flushall(self, r: Any) -> float:
        r.flushall()
        return 0.02

    def _restart(self, r: Any) -> float:
        self._stop.wait(1.5)
        if self._stop.is_set():
            return 0.0
        self.server.stop()
        self.server.start()
        return 0.0


# ------------------------------------------------------------------------------------ workers
def _worker_env(base: Path, i: int, url: str, prefix: str, secret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env.update(
        HOME=str(base / "home"),
        TRITON_CACHE_DIR=str(base / f"triton-unused-{i}"),
        PYTHONHASHSEED="0",
        KCACHE="1",
        KCACHE_DIR=str(base / f"store-{i}"),
        KCACHE_REMOTE=url,
        KCACHE_REMOTE_PREFIX=prefix,
    )
    if secret:
        env["KCACHE_SECRET"] = SECRET
    return env


def _spawn(env: dict[str, str], kernels: int, seed: int, out: Path, rounds: int = 1) -> subprocess.Popen:
    args = [PYTHON, str(CHAOS), "triton-worker", "--kernels", str(kernels), "--seed", str(seed)]
    args += ["--out", str(out), "--rounds", str(rounds)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _scout(base: Path, kernels: int) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Triton's own compile of the kernels (the reference bytes), and the (kind, key, id) of each
    kernel group as kcache stores it (a private store, no shared tier)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env.update(HOME=str(base / "home"), TRITON_CACHE_DIR=str(base / "triton-ref"), PYTHONHASHSEED="0")
    p = _spawn(env, kernels, 0, base / "ref.json")
    _, err = p.communicate(timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"reference compile failed: {err[-2000:]}")
    reference = json.loads((base / "ref.json").read_text())["kernels"]
    env.update(KCACHE="1", KCACHE_DIR=str(base / "scout"))
    p = _spawn(env, kernels, 0, base / "scout.json")
    _, err = p.communicate(timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"scout compile failed: {err[-2000:]}")
    from kcache.store.records import RECORD_NAME, Record

    ids = []
    for rec_path in sorted((base / "scout" / "entries").glob(f"*/*/{RECORD_NAME}")):
        rec = Record.decode(rec_path.read_bytes())
        if rec.kind == "triton":
            ids.append((rec.kind, rec.key, rec.id))
    if len(ids) != kernels:
        raise RuntimeError(f"the scout stored {len(ids)} kernel groups for {kernels} kernels")
    return reference, ids


def _round(
    base: Path, server: Server, attack: str, secret: bool, workers: int, kernels: int, seed: int,
    ids: list[tuple[str, str, str]], reference: dict[str, Any], control_s: float | None,
) -> dict[str, Any]:  # fmt: skip
    d = base / f"{attack}-{'secret' if secret else 'plain'}"
    d.mkdir(parents=True, exist_ok=True)
    prefix = f"{d.name}:"
    with contextlib.suppress(Exception):
        server.client().flushall()
    proxy = Trickle(server.port) if attack == "trickle" else None
    url = proxy.url if proxy else server.url
    hostile = Attack(attack, server, prefix, ids, secret)
    hostile.start()
    t0 = time.monotonic()
    ps = [
        _spawn(_worker_env(d, i, url, prefix, secret), kernels, seed + i, d / f"w{i}.json")
        for i in range(workers)
    ]
    killed = None
    if attack == "sigkill":
        time.sleep(1.5)  # started, importing or compiling
        ps[0].kill()
        killed = 0
    failures: list[str] = []
    outs = []
    for i, p in enumerate(ps):
        try:
            _, err = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            failures.append(f"worker {i} did not end in 600 s")
        if i == killed:
            continue
        if p.returncode != 0 or "Traceback" in err:
            failures.append(f"worker {i} exited {p.returncode}: {err[-1500:]}")
        outs.append(d / f"w{i}.json")
    wall = time.monotonic() - t0
    hostile.stop()
    if proxy:
        proxy.close()
    crashes = len(failures)
    wrong = stalls = compiles = 0
    worst_remote = worst_compile = 0.0
    for out in outs:
        try:
            res = json.loads(out.read_text())
        except (OSError, ValueError) as e:
            failures.append(f"no result from {out.name}: {e}")
            crashes += 1
            continue
        if res["errors"]:
            crashes += 1
            failures.append(f"{out.name}: {res['errors'][0][-1500:]}")
        for name, dig in res["kernels"].items():
            if dig != reference.get(name):
                wrong += 1
                failures.append(f"{out.name}: {name} differs from Triton's own compile")
        pc = res.get("process_counts", {})
        remote = sum(c.get("remote_s", 0.0) + c.get("remote_fruitless_s", 0.0) for c in pc.values())
        compile_s = sum(res["seconds"].values())
        compiles += int(pc.get("triton", {}).get("puts", 0))
        worst_remote, worst_compile = max(worst_remote, remote), max(worst_compile, compile_s)
        if remote > STALL_BOUND_S:
            stalls += 1
            failures.append(f"{out.name}: {remote:.2f} s in Redis calls and fruitless waits")
        if control_s is not None and compile_s > 2 * control_s + SLACK_S:
            stalls += 1
            failures.append(f"{out.name}: compiles took {compile_s:.1f} s (control {control_s:.1f} s)")
    if attack == "sigkill" and secret and compiles > kernels:
        failures.append(f"the survivors compiled {compiles} times for {kernels} kernels")
    failures += [f"attack: {e}" for e in hostile.errors]
    return {
        "attack": attack,
        "secret": secret,
        "acts": hostile.count,
        "workers": workers,
        "kernels": kernels,
        "wall_s": round(wall, 2),
        "crashes": crashes,
        "wrong_bytes": wrong,
        "stalls": stalls,
        "compiles": compiles,
        "worst_remote_s": round(worst_remote, 3),
        "worst_compile_s": round(worst_compile, 2),
        "failures": failures,
    }


def phase_hostile(
    base: Path,
    seed: int,
    log: Callable[[str], None],
    size: str = "ci",
    attacks: tuple[str, ...] = ATTACKS,
    workers: int | None = None,
    kernels: int | None = None,
) -> dict[str, Any]:
    """Every attack of ``attacks`` (``none`` first) with and without the secret."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    workers = workers or SIZES[size][0]
    kernels = kernels or SIZES[size][1]
    t0 = time.perf_counter()
    reference, ids = _scout(base, kernels)
    server = Server(base / "redis")
    rounds: list[dict[str, Any]] = []
    failures: list[str] = []
    control: dict[bool, float] = {}
    try:
        for attack in ("none", *[a for a in attacks if a != "none"]):
            for secret in (False, True):
                r = _round(
                    base, server, attack, secret, workers, kernels, seed, ids, reference, control.get(secret)
                )
                if attack == "none":
                    control[secret] = r["worst_compile_s"]
                rounds.append(r)
                failures += [f"{attack}/{'secret' if secret else 'plain'}: {f}" for f in r["failures"]]
                log(
                    f"hostile {attack:<15} {'secret' if secret else 'plain ':<6} acts {r['acts']:5d}  "
                    f"wall {r['wall_s']:6.1f} s  crashes {r['crashes']}  wrong {r['wrong_bytes']}  "
                    f"stalls {r['stalls']}  worst remote {r['worst_remote_s']:.2f} s  compiles {r['compiles']}"
                )
    finally:
        server.stop()
    return {
        "rounds": rounds,
        "workers": workers,
        "kernels": kernels,
        "stall_bound_s": STALL_BOUND_S,
        "crashes": sum(r["crashes"] for r in rounds),
        "wrong_bytes": sum(r["wrong_bytes"] for r in rounds),
        "stalls": sum(r["stalls"] for r in rounds),
        "worst_remote_s": max(r["worst_remote_s"] for r in rounds),
        "seconds": round(time.perf_counter() - t0, 1),
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--only", help="comma-separated attacks (default: all)")
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("--dir")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kcache-hostile-"))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        attacks = tuple(a.only.split(",")) if a.only else ATTACKS
        res = phase_hostile(base, a.seed, log, "full" if a.full else "ci", attacks)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k not in ("rounds", "failures")}, indent=1))
    for f in res["failures"][:20]:
        print(f"FAIL {f[:2000]}", file=sys.stderr)
    return 0 if not res["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
