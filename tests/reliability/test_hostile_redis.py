"""The shared tier against a hostile or failing Redis, on a real redis-server (tests/conftest.py):
anyone who can write to it plants locks, fakes heartbeats, plants huge values and bad records; a
link trickles bytes. Nothing of it may stall a process beyond the documented bounds, exhaust its
memory, or reach its local store. Two stores at different paths stand for two machines.

The bounds asserted are kcache's own accounting (seconds waited, charged as fruitless) and wall
times with wide margins: each attack here costs minutes on a tier that waits by the lease or by
socket read, and at most a few seconds with the bounds.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tier_stores import DEADLINE, counts, flushed

from kcache.store import Store
from kcache.store.records import Record, file_info
from kcache.store.tiers import entry as rt
from kcache.store.tiers import lease as rl
from kcache.store.tiers import redis_keys as rk

PYTHON = sys.executable
SECRET = "hostile-redis-tests"


# ------------------------------------------------------------------------------------ helpers
@pytest.fixture
def prefix() -> str:
    return f"h{uuid.uuid4().hex[:8]}:"


def group(n: int = 4096) -> dict[str, bytes]:
    return {"k.json": b'{"name": "k"}', "k.cubin": os.urandom(n), "k.ptx": b"// ptx\n" * 20}


class FakeHeartbeats:
    """An attacker without the secret: well-formed kcache locks on ``idents`` whose heartbeat
    advances every 0.2 s (a changing value, a renewed expiry), as a live holder's would."""

    def __init__(self, server: Any, prefix: str, idents: list[str], secret: bytes | None = None) -> None:
        self.r = server.client()
        self.keys = {ident: rk.lock_key(prefix, ident) for ident in idents}
        self.secret = secret
        self.stop = threading.Event()
        self.beats = 0
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        holder = rl.new_holder()
        seq = 0
        while not self.stop.is_set():
            seq += 1
            for ident, key in self.keys.items():
                self.r.set(key, rl.encode_lock(ident, holder, seq, self.secret), px=2000)
            self.beats += 1
            self.stop.wait(0.2)

    def __enter__(self) -> FakeHeartbeats:
        self.t.start()
        while self.beats == 0:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.t.join(5)


# ------------------------------------------------------------------------------------ 1. locks
@pytest.mark.parametrize("secret", [None, SECRET], ids=["no-secret", "secret"])
def test_planted_locks_on_every_kernel_cost_a_process_at_most_the_budget(
    redis_server, stores, prefix, secret, kcache_warnings
) -> None:
    """Locks on every entry a process will miss: foreign values with no expiry (the attack that
    cost a lease per kernel), well-formed ones with no expiry or a long one, and well-formed
    locks whose heartbeats an attacker fakes. None costs a lease; with a secret none is waited
    on; without one, all of them together cost at most the budget."""
    env = {"KCACHE_REMOTE_LOCK_LEASE": "30s", **({"KCACHE_SECRET": secret} if secret else {})}
    b = stores("b", redis_server.url, prefix, **env)
    r = redis_server.client()
    keys = [f"K{i}" for i in range(8)]
    idents = [b.entry_id("triton", k) for k in keys]
    fake = rl.encode_lock(idents[2], rl.new_holder(), 1, b"not-the-secret")
    r.set(rk.lock_key(prefix, idents[0]), "held-forever")  # foreign, no expiry
    r.set(rk.lock_key(prefix, idents[1]), rl.encode_lock(idents[1], rl.new_holder(), 1, None))  # no expiry
    r.set(rk.lock_key(prefix, idents[2]), fake, px=600_000)  # forged signature, an expiry of 10 minutes
    t0 = time.monotonic()
    with FakeHeartbeats(redis_server, prefix, idents[3:]):
        for k in keys:
            with b.single_flight("triton", k) as hit:
                assert hit is None  # compile here
                b.put("triton", k, group(500))
    wall = time.monotonic() - t0
    assert wall < 15, wall  # a lease per lock: 4 minutes
    c = counts(b)
    if secret:
        assert c["remote_ignored"] == 8, c  # not one of them waited on
        assert c.get("remote_wait_s", 0) < 0.5, c
    else:
        assert c["remote_ignored"] == 3, c  # no expiry, or a long one; the others are waited on...
        assert c["remote_fruitless_s"] <= rl.FRUITLESS_BUDGET_S + 0.5, c  # ...within the budget
        assert c["remote_wait_s"] <= rl.FRUITLESS_BUDGET_S + 0.5, c  # (+ one look, on a busy box)
        assert any("not waiting on unproven locks" in m for m in kcache_warnings), kcache_warnings
    assert c.get("remote_waited", 0) == 0 and c.get("remote_errors", 0) == 0, c


def test_a_real_holder_is_waited_for_while_it_beats_with_a_secret(redis_server, stores, prefix) -> None:
    """With a secret a holder's signed heartbeats are the evidence: a compile longer than the
    budget is waited for, and the entry it writes is what the waiter gets."""
    a = stores("a", redis_server.url, prefix, KCACHE_SECRET=SECRET)
    b = stores("b", redis_server.url, prefix, KCACHE_SECRET=SECRET)
    fa = a.single_flight("triton", "LONG")
    assert fa.hit is None  # a compiles, its lock kept alive
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(hit=b.single_flight("triton", "LONG").hit))
    t.start()
    time.sleep(rl.FRUITLESS_BUDGET_S + 1.5)  # longer than any unproven wait
    assert t.is_alive()
    files = group(2000)
    a.put("triton", "LONG", files)
    fa.release()
    t.join(15)
    assert got["hit"] is not None and got["hit"].read("k.cubin") == files["k.cubin"]
    c = counts(b)
    assert c["remote_waited"] == 1 and c.get("remote_fruitless_s", 0) == 0, c
    assert a.tiers[0].keeper.renewals >= 3


def test_without_a_secret_a_long_holder_is_waited_for_at_most_the_budget(
    redis_server, stores, prefix
) -> None:
    a = stores("a", redis_server.url, prefix)
    b = stores("b", redis_server.url, prefix)
    fa = a.single_flight("triton", "LONG")
    assert fa.hit is None
    t0 = time.monotonic()
    with b.single_flight("triton", "LONG") as hit:
        assert hit is None  # b compiles too: duplicate work, no stall
    assert time.monotonic() - t0 < rl.FRUITLESS_BUDGET_S + 2
    assert counts(b)["remote_fruitless_s"] == pytest.approx(rl.FRUITLESS_BUDGET_S, abs=0.5)
    t0 = time.monotonic()
    with b.single_flight("triton", "LONG") as hit:
        assert hit is None  # the budget is spent: not waited on again
    assert time.monotonic() - t0 < 0.5
    fa.release()


HOLDER = """
import sys, time
from kcache import config
from kcache.store import Store
s = Store.open(sys.argv[1])
s.attach_remote(config.load({"KCACHE_REMOTE": sys.argv[2], "KCACHE_REMOTE_PREFIX": sys.argv[3],
                              "KCACHE_SECRET": sys.argv[4]}))
flight = s.single_flight("triton", "DEAD")  # held for the life of the process
assert flight.hit is None
print("held", flush=True)
time.sleep(3600)
"""


def test_a_holder_killed_mid_compile_is_compiled_once_more_with_a_secret(
    redis_server, stores, prefix, tmp_path
) -> None:
    """Three machines wait on a holder that is SIGKILLed: its heartbeats stop, its lock expires,
    one of them takes it and compiles, the other two wait for that compile. Bounded by the
    lock's expiry, not by the lease."""
    holder = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(tmp_path / "h"), redis_server.url, prefix, SECRET],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        ws = [stores(f"w{i}", redis_server.url, prefix, KCACHE_SECRET=SECRET) for i in range(3)]
        got: dict[int, Any] = {}
        done = threading.Event()

        def wait(i: int) -> None:
            with ws[i].single_flight("triton", "DEAD") as hit:
                got[i] = hit
                if hit is None:  # this one compiles
                    ws[i].put("triton", "DEAD", group(3000))
            done.set()

        threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(1.0)  # they have seen the holder's heartbeats advance
        holder.kill()
        for t in threads:
            t.join(30)
        wall = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait(10)
    assert len(got) == 3
    assert sum(h is None for h in got.values()) == 1, got  # compiled once more, not three times
    assert wall < 1.0 + rl.LOCK_TTL_S + 5, wall  # the lease is 60 s
    assert sum(counts(w).get("remote_waited", 0) for w in ws) == 2


def test_a_full_redis_never_holds_up_a_flight(redis_private, stores, prefix, monkeypatch) -> None:
    """maxmemory with noeviction refuses every write, the lock's too: compile at once. Counted,
    not timed (a loaded box made the two round trips of a refused lock take 0.1 s): the flight
    never sleeps to poll a lock, and no wait for another machine's entry is counted."""
    from kcache.store.tiers import flight

    slept: list[float] = []
    real_sleep = time.sleep

    def sleep(s: float) -> None:
        if sys._getframe(1).f_globals.get("__name__") == flight.__name__:
            slept.append(s)
        real_sleep(s)

    server = redis_private()
    r = server.client()
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 10_000)
    r.config_set("maxmemory-policy", "noeviction")
    b = stores("b", server.url, prefix)
    monkeypatch.setattr(time, "sleep", sleep)
    for i in range(5):
        with b.single_flight("triton", f"F{i}") as hit:
            assert hit is None
    monkeypatch.undo()
    assert slept == [], slept
    c = counts(b)
    assert not c.get("remote_waited"), c


@pytest.mark.parametrize("how", ["sigstop", "debug-sleep"])
def test_a_server_that_stops_answering_costs_at_most_a_second(redis_private, stores, prefix, how) -> None:
    """Kept so: a server SIGSTOPped, or busy in DEBUG SLEEP, costs a few timeouts, then the
    breaker skips it; lookups, flights and puts never raise and never wait long."""
    import signal

    server = redis_private("--enable-debug-command", "yes")
    b = stores("b", server.url, prefix, KCACHE_REMOTE_TIMEOUT=DEADLINE)
    assert b.get("triton", "warm-up") is None  # connected
    sleeper = None
    if how == "sigstop":
        server.proc.send_signal(signal.SIGSTOP)
    else:
        sleeper = threading.Thread(
            target=lambda: server.client().execute_command("DEBUG", "SLEEP", "4"), daemon=True
        )
        sleeper.start()
        time.sleep(0.2)
    try:
        t0 = time.monotonic()
        for i in range(6):
            with b.single_flight("triton", f"S{i}") as hit:
                assert hit is None
                assert b.put("triton", f"S{i}", group(300)) is not None
        took = time.monotonic() - t0
    finally:
        if how == "sigstop":
            server.proc.send_signal(signal.SIGCONT)
        if sleeper is not None:
            sleeper.join(10)
    c = counts(b)
    assert c["remote_s"] + c.get("remote_fruitless_s", 0) <= 1.3, c
    assert took < 3.0, took
    assert c["remote_errors"] >= 1 and c["remote_bypassed"] >= 1, c


# ------------------------------------------------------------------------------------ 2. deadline
class TrickleProxy:
    """A TCP proxy to Redis that passes requests at once and replies ``chunk`` bytes at a time,
    ``every`` seconds apart: a link at a crawl that never goes quiet for a whole read timeout."""

    def __init__(self, port: int, chunk: int = 512, every: float = 0.02) -> None:
        self.port, self.chunk, self.every = port, chunk, every
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.url = f"redis://127.0.0.1:{self.lsock.getsockname()[1]}/0"
        self.closed = threading.Event()
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.port))
            self.socks += [c, up]
            threading.Thread(target=self._pump, args=(c, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, c, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while not self.closed.is_set():
                data = src.recv(1 << 16)
                if not data:
                    break
                if not slow:
                    dst.sendall(data)
                    continue
                for i in range(0, len(data), self.chunk):
                    dst.sendall(data[i : i + self.chunk])
                    time.sleep(self.every)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        for s in [self.lsock, *self.socks]:
            try:
                s.close()
            except OSError:
                pass


def test_a_trickling_link_ends_the_call_at_its_deadline(redis_server, stores, prefix) -> None:
    """2 MiB replied 512 bytes every 20 ms (25 KiB/s: 80 s): no socket read ever waits 100 ms,
    so only a deadline on the whole call ends it. The lookup ends by its deadline, is counted as
    an error, and the compile goes on (its entry is stored and served)."""
    a = stores("a", redis_server.url, prefix)
    big = group(2 << 20)
    a.put("triton", "BIG", big)
    flushed(a)
    proxy = TrickleProxy(redis_server.port)
    try:
        b = stores("b", proxy.url, prefix, KCACHE_REMOTE_TIMEOUT=DEADLINE)
        assert b.get("triton", "warm-up") is None  # connected (a short reply passes quickly)
        t0 = time.monotonic()
        assert b.get("triton", "BIG") is None
        took = time.monotonic() - t0
        assert took < 5.0, took  # its deadline: 0.1 s + 1/16 s for 2 MiB (80 s at this rate)
        c = counts(b)
        assert c["remote_errors"] >= 1 and c.get("remote_hits", 0) == 0, c
        assert b.put("triton", "BIG", big) is not None  # the compile goes on
        assert b.get("triton", "BIG").read("k.cubin") == big["k.cubin"]
        # more such lookups, small calls answering between them: three cut calls open the breaker
        for i in range(6):
            a.put("triton", f"BIG{i}", group(1 << 20))
        flushed(a)
        for i in range(6):
            assert b.get("triton", f"BIG{i}") is None
        c = counts(b)
        assert c["remote_bypassed"] >= 1 and c["remote_s"] < 3.0, c
    finally:
        proxy.close()


# ------------------------------------------------------------------------------------ 3. size
PEAK = """
import json, resource, sys
from kcache import config
from kcache.store import Store
s = Store.open(sys.argv[1])
s.attach_remote(config.load({"KCACHE_REMOTE": sys.argv[2], "KCACHE_REMOTE_PREFIX": sys.argv[3],
                              "KCACHE_REMOTE_TIMEOUT": "5s"}))  # time enough to read it all
s.get("triton", "warm-up")  # redis imported, connected
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
hit = s.get("triton", sys.argv[4])
flight = s.single_flight("triton", sys.argv[4]).hit
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
c = s.counts.process_totals().get("triton", {})
print(json.dumps({"hit": hit is not None, "flight": flight is not None, "grew_kib": after - before,
                  "too_large": c.get("remote_too_large", 0), "errors": c.get("remote_errors", 0)}))
"""


def test_a_huge_planted_value_is_never_read(redis_server, tmp_path, prefix) -> None:
    """100 MB planted under an entry's key: its size is known first (STRLEN), it is over
    KCACHE_REMOTE_MAX_ENTRY, so not a byte of it is fetched (the server's own count of bytes
    sent) and the process's peak memory does not move."""
    from kcache.store.records import entry_id

    ident = entry_id("triton", "HUGE")
    r = redis_server.client()
    r.setrange(rk.entry_key(prefix, "triton", ident), 100_000_000 - 1, b"x")  # 100 MB made on the server
    sent = int(r.info("stats")["total_net_output_bytes"])
    p = subprocess.run(
        [PYTHON, "-c", PEAK, str(tmp_path / "s"), redis_server.url, prefix, "HUGE"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert int(r.info("stats")["total_net_output_bytes"]) - sent < 1 << 20
    assert out["grew_kib"] < 20 << 10, out  # reading it: 100 MB at least
    assert out["hit"] is False and out["flight"] is False, out
    assert out["too_large"] >= 2 and out["errors"] == 0, out


def test_a_huge_planted_lock_value_is_never_read(redis_server, stores, prefix) -> None:
    b = stores("b", redis_server.url, prefix)
    ident = b.entry_id("triton", "L")
    r = redis_server.client()
    r.setrange(rk.lock_key(prefix, ident), 50_000_000 - 1, b"x")
    r.pexpire(rk.lock_key(prefix, ident), 2000)
    sent = int(r.info("stats")["total_net_output_bytes"])
    with b.single_flight("triton", "L") as hit:
        assert hit is None
    assert int(r.info("stats")["total_net_output_bytes"]) - sent < 1 << 20
    assert counts(b)["remote_ignored"] == 1


# ------------------------------------------------------------------------------------ 4. records
def _plant(server: Any, prefix: str, store: Store, key: str, rec_fields: dict[str, Any]) -> None:
    files = group(300)
    rec = Record(
        "triton",
        key,
        store.entry_id("triton", key),
        [file_info(n, b) for n, b in files.items()],
        **rec_fields,
    )
    server.client().set(rk.entry_key(prefix, rec.kind, rec.id), rt.pack_entry(rec.encode(), files, None))


@pytest.mark.parametrize(
    "fields",
    [
        {"compile_s": math.nan},
        {"compile_s": math.inf},
        {"compile_s": -1.0},
        {"created": 1e300},
        {"summary": {"name": "k\x1b]0;owned\x07\x1b[2J"}},
        {"summary": {"name": "k\u202egnp.exe"}},
        {"components": {"kernel": "x" * 100_000}},
        {"summary": {"n": 1e308}},
        {"components": {"deep": [[[[["too deep"]]]]]}},
        {"summary": {f"f{i}": i for i in range(5000)}},
    ],
    ids=["nan", "inf", "negative", "created", "escape", "bidi", "long", "huge", "deep", "many"],
)
def test_records_from_the_tier_are_validated(redis_server, stores, prefix, fields, kcache_warnings) -> None:
    """Checksums and the record's own crc32 all valid, one field out of bounds: refused,
    counted, never written to the local store or its index; the caller compiles."""
    b = stores("b", redis_server.url, prefix)
    _plant(redis_server, prefix, b, "R", fields)
    assert b.get("triton", "R") is None
    c = counts(b)
    assert c["remote_refused"] == 1 and c.get("remote_hits", 0) == 0, c
    assert b.read_record(b.entry_id("triton", "R"))[0] is None
    assert any("bad record" in m for m in kcache_warnings), kcache_warnings
    # and the good one next to it is taken
    _plant(redis_server, prefix, b, "OK", {"compile_s": 1.5, "summary": {"name": "k"}})
    assert b.get("triton", "OK") is not None


# ------------------------------------------------------------------------------------ 5. bad entries
def test_an_entry_whose_use_raised_is_marked_bad_remotely(redis_server, stores, prefix) -> None:
    a = stores("a", redis_server.url, prefix)
    b = stores("b", redis_server.url, prefix)
    a.put("triton", "BAD", group(1000))
    flushed(a)
    r = redis_server.client()
    ekey = rk.entry_key(prefix, "triton", b.entry_id("triton", "BAD"))
    value = r.get(ekey)
    assert b.get("triton", "BAD") is not None  # served from Redis; its use then raises:
    b.remove([b.entry_id("triton", "BAD")])  # the local quarantine (the integration's part)
    assert b.tiers[0].mark_bad("triton", b.entry_id("triton", "BAD"))  # what quarantine() calls
    flushed(b)
    assert r.get(ekey) is None  # deleted from the tier: the next machine compiles
    assert counts(b)["remote_marked_bad"] == 1
    r.set(ekey, value)  # planted again, the same bytes: this process never takes it again
    assert b.get("triton", "BAD") is None and counts(b)["remote_refused"] == 1
    a.replace("triton", "BAD", group(1200))  # a new, different entry is taken
    flushed(a)
    assert b.get("triton", "BAD") is not None


def test_mark_bad_leaves_a_newer_value_alone(redis_server, stores, prefix) -> None:
    a = stores("a", redis_server.url, prefix)
    b = stores("b", redis_server.url, prefix)
    a.put("triton", "X", group(1000))
    flushed(a)
    assert b.get("triton", "X") is not None
    a.replace("triton", "X", group(900))  # meanwhile another machine wrote a new one
    flushed(a)
    b.tiers[0].mark_bad("triton", b.entry_id("triton", "X"))
    flushed(b)
    assert redis_server.client().get(rk.entry_key(prefix, "triton", b.entry_id("triton", "X"))) is not None
    assert counts(b).get("remote_marked_bad", 0) == 0


# ------------------------------------------------------------------------------------ 6. kept so
SO_AND_PICKLE = textwrap.dedent(
    """
    import json, os, sys
    from kcache import config
    from kcache.store import Store
    env = {"KCACHE_REMOTE": sys.argv[2], "KCACHE_REMOTE_PREFIX": sys.argv[3]}
    if sys.argv[4]:
        env["KCACHE_SECRET"] = sys.argv[4]
    s = Store.open(sys.argv[1])
    s.attach_remote(config.load(env))
    print(json.dumps({k: s.get(k, "P") is not None for k in ("triton-aux", "inductor-fx")}))
    """
)


@pytest.mark.parametrize("secret", [None, SECRET], ids=["no-secret", "secret"])
def test_planted_host_code_and_pickles_are_never_taken(redis_server, tmp_path, prefix, secret) -> None:
    """Kept so: a launcher .so and a pickle planted (unsigned, or signed with another secret) are
    never taken, so never loaded."""
    r = redis_server.client()
    for kind, files in (
        ("triton-aux", {"launcher.so": b"\x7fELF" + os.urandom(2000)}),
        ("inductor-fx", {"entry.pkl": b"\x80\x05" + os.urandom(300)}),
    ):
        from kcache.store.records import entry_id

        rec = Record(kind, "P", entry_id(kind, "P"), [file_info(n, b) for n, b in files.items()])
        value = rt.pack_entry(rec.encode(), files, b"another-secret" if secret else None)
        r.set(rk.entry_key(prefix, rec.kind, rec.id), value)
    p = subprocess.run(
        [PYTHON, "-c", SO_AND_PICKLE, str(tmp_path / "s"), redis_server.url, prefix, secret or ""],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"triton-aux": False, "inductor-fx": False}


# ------------------------------------------------------------------------------------ 7. Triton
@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "no-secret"])
def test_planted_locks_never_stall_real_compiles(redis_server, tmp_path, prefix, secret) -> None:
    """The attack as it was found: a machine compiles and publishes two kernels; an attacker
    deletes the entries and writes a lock for each, with no expiry (and, without a secret,
    well-formed locks with faked heartbeats on top). A fresh machine compiles both in about the
    time of a compile, not a lease per kernel (here 20 s each)."""
    pytest.importorskip("triton")
    from kernels.harness import clean_env, run_kernels

    extra = {"KCACHE_SECRET": secret} if secret else {}

    def env(machine: str) -> dict[str, str]:
        (tmp_path / machine).mkdir()
        return clean_env(
            tmp_path / machine,
            kcache_dir=tmp_path / machine / "store",
            KCACHE_REMOTE=redis_server.url,
            KCACHE_REMOTE_PREFIX=prefix,
            KCACHE_REMOTE_LOCK_LEASE="20s",
            **extra,
        )

    a = run_kernels(env("a"), tmp_path / "a" / "r.json", specs="add,row_sum")
    r = redis_server.client()
    entries = [rk.parse_entry_key(prefix, k) for k in r.scan_iter(rk.entry_pattern(prefix))]
    idents = [ident for _kind, ident in entries]
    assert len(idents) >= 2
    for kind, ident in entries:
        r.delete(rk.entry_key(prefix, kind, ident))
        r.set(rk.lock_key(prefix, ident), "compiling-forever")
    if secret:
        b = run_kernels(env("b"), tmp_path / "b" / "r.json", specs="add,row_sum")
    else:
        with FakeHeartbeats(redis_server, prefix, idents):
            b = run_kernels(env("b"), tmp_path / "b" / "r.json", specs="add,row_sum")
    assert [x["error"] for x in b["results"]] == [None, None]
    assert [x["cache_hit"] for x in b["results"]] == [False, False]  # compiled
    assert [x["cubin_sha256"] for x in b["results"]] == [x["cubin_sha256"] for x in a["results"]]
    assert b["t_compile_all"] < a["t_compile_all"] + 15, (a["t_compile_all"], b["t_compile_all"])
    c = b["process"].get("triton", {})
    assert c.get("remote_wait_s", 0) <= rl.FRUITLESS_BUDGET_S + 0.5, c
    if secret:
        assert c.get("remote_ignored", 0) == 2 and c.get("remote_wait_s", 0) < 0.5, c


# ------------------------------------------------------------------------------------ 8. chaos
def test_the_chaos_tools_hostile_phase(tmp_path, redis_server) -> None:
    """tools/chaos.py's ``hostile`` phase, CI-sized: real compiles on two machines under faked
    heartbeats, with and without the secret (the full run, every
    attack, is in docs/reliability.md). The tool starts redis-servers of its own; ``redis_server``
    is asked for its rule alone: without a server this skips, or fails where one is required."""
    pytest.importorskip("triton")
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "tools" / "chaos_redis.py"
    spec = importlib.util.spec_from_file_location("kcache_chaos_redis", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.phase_hostile(
        tmp_path, 7, lambda m: None, attacks=("none", "fake-heartbeats"), workers=2, kernels=2
    )
    assert r["failures"] == [], r["failures"]
    assert (r["crashes"], r["wrong_bytes"], r["stalls"]) == (0, 0, 0)
    assert len(r["rounds"]) == 4 and all(x["acts"] > 0 for x in r["rounds"] if x["attack"] != "none")
