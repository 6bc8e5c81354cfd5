#!/usr/bin/env python3
"""The shared tier (issues 15, 35): what a hit from Redis or S3 costs against a local hit and a
compile, and what N processes on N "machines" missing the same kernels at once compile in all.

    python tools/bench_remote.py [--repeats 5] [--procs 8] [--json OUT.json] [--redis-server PATH]
                                 [--backends redis,s3] [--sizes 4096,102400,1048576]

Starts its own redis-server (the distribution's package) on 127.0.0.1 at a free port, no
persistence, and, with ``s3`` in ``--backends``, moto's S3 server (``python -m moto.server``:
the S3 HTTP API, not a real S3), and stops them at the end. Each store path stands for one
machine.

1. Hit latency, in this process, median over ``--iters`` lookups, for each of ``--sizes`` (a
   group of Triton-like members of about that many bytes) and each backend:
   ``Store.get`` plus ``Hit.paths`` (the files Triton opens), from
   * the local store (a hit; its served files made anew each time, as a new process would),
   * Redis (the entry removed locally before each lookup: a local miss, ``GET``, checks,
     commit to the local store, served files), with and without ``KCACHE_SECRET`` (HMAC),
   * and the first lookup in a fresh process, attaching the tier, importing redis and
     connecting included.
2. Fresh processes (``python -m kernels.run``, tests/kernels, 10 kernels for ``cuda:90``, no GPU):
   the time to get every kernel when Triton compiles them (cold), from the local store (warm),
   and from Redis into an empty local store (remote); medians of ``--repeats``.
3. ``--procs`` processes with a store each (8 machines) start cold on the same 10 kernels at
   once (a barrier), sharing one Redis; then the same without Redis; then one process alone.
   Compiles are counted from Triton's own listener (``cache_hit=False``) and kcache's puts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from kernels.harness import clean_env, release_barrier, start_kernels  # noqa: E402
from kernels.specs import SPECS  # noqa: E402

from kcache import config  # noqa: E402
from kcache.store import Store  # noqa: E402

KIND = "triton"


# ------------------------------------------------------------------------------------ Redis
class Redis:
    def __init__(self, exe: str, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--dir", str(workdir), "--logfile", str(workdir / "redis.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(7).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("redis-server did not start")
            time.sleep(0.02)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.split()[2]

    env: dict[str, str] = {}

    def cpu_s(self) -> float:
        return _cpu_s(self.proc.pid)

    def flush(self) -> None:
        import redis

        redis.Redis(port=self.port).flushall()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class S3:
    """moto's S3 server on 127.0.0.1 at a free port: ``url`` is ``s3://<bucket>/bench`` (a new
    bucket at each :meth:`flush`); ``env`` the AWS configuration that points at it."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit("the moto server did not start") from None
                time.sleep(0.1)
        self.env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        os.environ.update(self.env)  # this process's stores (part 1) use it too
        import moto

        self.version = f"moto {moto.__version__}"
        self.n = 0
        self.flush()

    def cpu_s(self) -> float:
        return _cpu_s(self.proc.pid)

    def flush(self) -> None:
        import boto3

        self.n += 1
        bucket = f"bench-{self.n}"
        boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
        self.url = f"s3://{bucket}/bench"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # (a moto server busy in a request ignores SIGTERM)
            self.proc.kill()
            self.proc.wait(timeout=10)


Server = Redis | S3


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used so far (Linux; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# ------------------------------------------------------------------------------------ 1. latency
def group(size: int) -> dict[str, bytes]:
    """Members as Triton names them, about ``size`` bytes in all (the cubin the largest)."""
    small = {
        "k.json": b'{"name": "k", "num_warps": 4}' * 8,
        "k.ttir": os.urandom(size // 16),
        "k.ttgir": os.urandom(size // 16),
        "k.llir": os.urandom(size // 8),
        "k.ptx": os.urandom(size // 4),
    }
    small["k.cubin"] = os.urandom(max(64, size - sum(len(v) for v in small.values())))
    return small


def _settings(url: str, prefix: str, secret: str | None) -> Any:
    env = {"KCACHE_REMOTE": url, "KCACHE_REMOTE_PREFIX": prefix}
    if secret:
        env["KCACHE_SECRET"] = secret
    return config.load(env)


def hit_latency(redis: Server, tmp: Path, size: int, iters: int, secret: str | None) -> dict[str, float]:
    prefix = f"bench{size}{'s' if secret else ''}:"
    files = group(size)
    key = f"K{size}"
    tag = f"{type(redis).__name__}{size}{bool(secret)}"
    a = Store.open(tmp / f"a{tag}")
    a.attach_remote(_settings(redis.url, prefix, secret))
    a.put(KIND, key, files, compile_s=1.0)
    assert a.tiers[0].flush(10)
    b = Store.open(tmp / f"b{tag}")
    b.attach_remote(_settings(redis.url, prefix, secret))
    ident = b.entry_id(KIND, key)
    b.get(KIND, "warm-up")  # redis imported, connected
    local, remote = [], []
    for _ in range(iters):
        b.remove([ident])
        b.disk.served._cache.clear()
        t = time.perf_counter()
        h = b.get(KIND, key)
        _ = h.paths  # type: ignore[union-attr]
        remote.append(time.perf_counter() - t)
        assert b.counts.process_totals()[KIND].get("remote_refused", 0) == 0
        b.disk.served._cache.clear()  # as a new process: its served files made anew
        t = time.perf_counter()
        h = b.get(KIND, key)
        _ = h.paths  # type: ignore[union-attr]
        local.append(time.perf_counter() - t)
    value_bytes = int(b.counts.process_totals()[KIND]["remote_bytes_in"] / iters)
    a.close()
    b.close()
    return {
        "group_bytes": sum(len(v) for v in files.values()),
        "value_bytes": value_bytes,
        "local_ms": statistics.median(local) * 1000,
        "remote_ms": statistics.median(remote) * 1000,
    }


FIRST = """
import sys, time
t0 = time.perf_counter()
from kcache import config
from kcache.store import Store
s = Store.open(sys.argv[1])
settings = config.load({"KCACHE_REMOTE": sys.argv[2], "KCACHE_REMOTE_PREFIX": sys.argv[3]})
t = time.perf_counter()
s.attach_remote(settings)  # an empty store: redis is imported here (or, before, at the lookup)
h = s.get("triton", sys.argv[4]); h.paths
print((time.perf_counter() - t) * 1000, "redis" in sys.modules)
"""


def first_lookup(redis: Redis, tmp: Path, repeats: int) -> float:
    out = []
    for i in range(repeats):
        r = subprocess.run(
            [sys.executable, "-c", FIRST, str(tmp / f"first{i}"), redis.url, "bench4096:", "K4096"],
            capture_output=True,
            text=True,
            check=True,
        )
        out.append(float(r.stdout.split()[0]))
    return statistics.median(out)


# ------------------------------------------------------------------------------------ 2. processes
def run_key_first(env: dict[str, str], out: Path, names: str) -> dict[str, Any]:
    """``kernels.run`` with Triton's key computed before the timed loop (reported apart)."""
    cmd = [sys.executable, "-m", "kernels.run", "--out", str(out), "--specs", names, "--key-first"]
    p = subprocess.run(cmd, env=env, cwd=str(out.parent), capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(out.read_text())


def fresh_processes(redis: Server, tmp: Path, repeats: int) -> dict[str, Any]:
    names = ",".join(SPECS)
    rows: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": [], "remote": []}
    for rep in range(repeats):
        d = tmp / f"proc{rep}"
        prefix = f"proc{rep}:"
        for sub in ("a", "b"):
            (d / sub).mkdir(parents=True)
        env_a = clean_env(d / "a", kcache_dir=d / "a" / "store", KCACHE_REMOTE=redis.url)
        env_a["KCACHE_REMOTE_PREFIX"] = prefix
        env_b = clean_env(d / "b", kcache_dir=d / "b" / "store", KCACHE_REMOTE=redis.url)
        env_b["KCACHE_REMOTE_PREFIX"] = prefix
        for label, env, out in (
            ("cold", env_a, d / "a" / "cold.json"),  # compiles, writes through to Redis
            ("warm", env_a, d / "a" / "warm.json"),  # the same machine again: local hits
            ("remote", env_b, d / "b" / "remote.json"),  # another machine: from Redis
        ):
            rows[label].append(run_key_first(env, out, names))
    out: dict[str, Any] = {}
    for label, rs in rows.items():
        compiled = [sum(x["cache_hit"] is False for x in r["results"]) for r in rs]
        per = {
            name: statistics.median(
                next(x["seconds"] for x in r["results"] if x["label"] == name) for r in rs
            )
            * 1000
            for name in ("add", "matmul_64x64x32")
        }
        out[label] = {
            "kernels_ms": statistics.median(r["t_compile_all"] for r in rs) * 1000,
            "first_kernel_ms": statistics.median(r["results"][0]["seconds"] for r in rs) * 1000,
            "per_kernel_ms": per,
            "compiled": compiled,
            "process_s": statistics.median(r["t_total"] for r in rs),
        }
    return out


# ------------------------------------------------------------------------------------ 3. at once
def at_once(
    redis: Server | None, tmp: Path, procs: int, secret: str | None = None, timeout: str | None = None
) -> dict[str, Any]:
    """``procs`` fresh processes, a store each, released at once on the same kernels; with
    ``redis`` they share it (and ``secret`` as KCACHE_SECRET). Besides the wall time: where it
    went, from each kernel's completion time in every process: the compiles on the critical path
    (per kernel, the first process to finish it) and how long the others took to have it too."""
    tmp.mkdir(parents=True)
    names = ",".join(SPECS)
    barrier = tmp / "go"
    ps = []
    prefix = f"{tmp.name}:"
    for i in range(procs):
        (tmp / f"m{i}").mkdir()
        extra = {"KCACHE_REMOTE": redis.url, "KCACHE_REMOTE_PREFIX": prefix, **redis.env} if redis else {}
        if redis and secret:
            extra["KCACHE_SECRET"] = secret
        if redis and timeout:
            extra["KCACHE_REMOTE_TIMEOUT"] = timeout
        env = clean_env(tmp / f"m{i}", kcache_dir=tmp / f"m{i}" / "store", **extra)
        ps.append(start_kernels(env, tmp / f"m{i}" / "r.json", specs=names, barrier=barrier))
    release_barrier(barrier, ps)
    t_release = time.time()
    for p in ps:
        p.wait(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.read()[-3000:] if p.stderr else "process failed")
    results = [json.loads((tmp / f"m{i}" / "r.json").read_text()) for i in range(procs)]
    end = max(r["t_go_wall"] + r["t_compile_all"] for r in results)
    tri = [r["process"].get("triton", {}) for r in results]
    first_done, spread = [], []
    for k in range(len(results[0]["results"])):
        done = sorted(r["results"][k]["t_done_wall"] - t_release for r in results)
        first_done.append(done[0])
        spread.append(done[-1] - done[0])
    steps = [b - a for a, b in zip([0.0, *first_done[:-1]], first_done)]
    return {
        "wall_s": end - t_release,
        "first_kernel_s": first_done[0],  # includes each process's first Redis call (import, connect)
        "critical_path_s": first_done[-1],  # when the last kernel was first done somewhere
        "kernel_steps_s": [round(x, 3) for x in steps],
        "last_spread_s": spread[-1],  # from there to the last process having it
        "median_spread_s": statistics.median(spread),
        "triton_compiles": sum(x["cache_hit"] is False for r in results for x in r["results"]),
        "kcache_puts": int(sum(c.get("puts", 0) for c in tri)),
        "remote_hits": int(sum(c.get("remote_hits", 0) for c in tri)),
        "remote_waited": int(sum(c.get("remote_waited", 0) for c in tri)),
        "remote_wait_s": round(sum(c.get("remote_wait_s", 0.0) for c in tri), 3),
        "remote_fruitless_s": round(sum(c.get("remote_fruitless_s", 0.0) for c in tri), 3),
        "errors": sum(x["error"] is not None for r in results for x in r["results"]),
        "distinct_binaries": len({(x["label"], x["cubin_sha256"]) for r in results for x in r["results"]}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200, help="lookups per latency figure")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--json", default=None)
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--fleet-only", action="store_true", help="only part 3 (processes at once)")
    ap.add_argument("--backends", default="redis", help="redis, s3 or both (default: %(default)s)")
    ap.add_argument("--sizes", default="4096,102400", help="part 1's group sizes in bytes")
    ap.add_argument("--no-processes", action="store_true", help="skip part 2 (fresh processes)")
    ap.add_argument("--s3-timeout", default=None, help="KCACHE_REMOTE_TIMEOUT of part 3's S3 processes")
    ap.add_argument(
        "--conditions",
        default="redis,redis-secret,no-redis,alone",
        help="part 3's conditions, interleaved in each round: redis, redis-secret, s3, s3-secret, "
        "no-redis, alone (default: %(default)s)",
    )
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kcache-bench-remote-"))
    backends = [b for b in a.backends.split(",") if b]
    servers: dict[str, Server] = {}
    if "redis" in backends or any(c.startswith("redis") for c in a.conditions.split(",")):
        servers["redis"] = Redis(a.redis_server, root / "redis")
    if "s3" in backends or any(c.startswith("s3") for c in a.conditions.split(",")):
        servers["s3"] = S3(root / "s3")
    res: dict[str, Any] = {}
    try:
        if not a.fleet_only:
            print(f"1. hit latency (ms, median of {a.iters} lookups; get + served files)", flush=True)
            res["latency"] = {}
            for name in backends:
                for size in (int(x) for x in a.sizes.split(",")):
                    for secret in (None, "bench-secret"):
                        r = hit_latency(servers[name], root, size, a.iters, secret)
                        tag = f"{name}-{size // 1024}KB" + ("-signed" if secret else "")
                        res["latency"][tag] = r
                        print(
                            f"  {tag:<22} local {r['local_ms']:.3f}  remote {r['remote_ms']:.3f}  "
                            f"({r['remote_ms'] / r['local_ms']:.1f}x; value {r['value_bytes']} B)",
                            flush=True,
                        )
            if "redis" in servers and not a.no_processes:
                redis = servers["redis"]
                assert isinstance(redis, Redis)
                res["first_lookup_ms"] = first_lookup(redis, root, a.repeats)
                print(
                    f"  first remote lookup in a fresh process: {res['first_lookup_ms']:.1f} ms", flush=True
                )
                print(f"2. fresh processes, {len(SPECS)} kernels, median of {a.repeats}", flush=True)
                res["processes"] = fresh_processes(redis, root, a.repeats)
                for label, r in res["processes"].items():
                    print(
                        f"  {label:<7} kernels {r['kernels_ms']:8.1f} ms  first {r['first_kernel_ms']:7.1f} ms  "
                        f"add {r['per_kernel_ms']['add']:7.1f}  matmul {r['per_kernel_ms']['matmul_64x64x32']:7.1f}  "
                        f"compiled {r['compiled']}",
                        flush=True,
                    )
        print(f"3. {a.procs} processes, a store each, cold at once; median of {a.repeats}", flush=True)
        conditions = [c for c in a.conditions.split(",") if c]
        rounds: dict[str, list[dict[str, Any]]] = {c: [] for c in conditions}
        for rep in range(a.repeats):
            for srv in servers.values():
                srv.flush()
            for name in conditions:
                kind = name.split("-")[0]
                red = servers.get(kind) if kind in ("redis", "s3") else None
                n = 1 if name == "alone" else a.procs
                cpu0 = red.cpu_s() if red is not None else 0.0
                r = at_once(
                    red,
                    root / f"{name}-{rep}",
                    n,
                    "bench-secret" if name.endswith("-secret") else None,
                    a.s3_timeout if kind == "s3" else None,
                )
                # the server's own CPU over the round (whether it, not the clients, was the limit)
                r["server_cpu_s"] = round(red.cpu_s() - cpu0, 3) if red is not None else 0.0
                rounds[name].append(r)
                print(
                    f"  round {rep + 1} {name:<12} wall {r['wall_s']:6.2f} s  Triton compiles "
                    f"{r['triton_compiles']:3d}  kcache puts {r['kcache_puts']:3d}  from the tier "
                    f"{r['remote_hits']:3d} (waited {r['remote_waited']}, {r['remote_wait_s']:.1f} s, "
                    f"{r['remote_fruitless_s']:.1f} s for nothing)  first kernel {r['first_kernel_s']:.2f} s  "
                    f"last one's spread {r['last_spread_s']:.3f} s  server CPU {r['server_cpu_s']:.2f} s  "
                    f"errors {r['errors']}",
                    flush=True,
                )
        res["at_once"] = {
            name: {
                "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                "wall_s_all": [round(r["wall_s"], 3) for r in rs],
                "first_kernel_s_median": statistics.median(r["first_kernel_s"] for r in rs),
                "last_spread_s_median": statistics.median(r["last_spread_s"] for r in rs),
                "median_spread_s_median": statistics.median(r["median_spread_s"] for r in rs),
                "kernel_steps_s": [r["kernel_steps_s"] for r in rs],
                "server_cpu_s": [r["server_cpu_s"] for r in rs],
                "triton_compiles": [r["triton_compiles"] for r in rs],
                "kcache_puts": [r["kcache_puts"] for r in rs],
                "remote_hits": [r["remote_hits"] for r in rs],
                "remote_waited": [r["remote_waited"] for r in rs],
                "remote_fruitless_s": [r["remote_fruitless_s"] for r in rs],
                "errors": sum(r["errors"] for r in rs),
            }
            for name, rs in rounds.items()
        }
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(root, ignore_errors=True)
    alone = res["at_once"]["alone"]["wall_s_median"] if "alone" in res["at_once"] else None
    for name, s in res["at_once"].items():
        s["ratio_vs_alone"] = s["wall_s_median"] / alone if alone else None
        ratio = f" ({s['ratio_vs_alone']:.2f}x alone)" if alone else ""
        print(f"  {name:<12} wall {s['wall_s_median']:.2f} s{ratio}")
    import redis as redis_py
    import triton

    res.update(
        date=datetime.datetime.now().isoformat(timespec="minutes"),
        python=platform.python_version(),
        triton=triton.__version__,
        servers={name: srv.version for name, srv in servers.items()},
        redis_py=redis_py.__version__,
        cpus=os.cpu_count(),
        load=os.getloadavg(),
        procs=a.procs,
        repeats=a.repeats,
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    shared = [n for n in res["at_once"] if n.startswith(("redis", "s3"))]
    exact = all(c == len(SPECS) for n in shared for c in res["at_once"][n]["triton_compiles"])
    print(f"\nexactly {len(SPECS)} compiles in every round with a shared tier: {'yes' if exact else 'NO'}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
