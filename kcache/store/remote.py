"""The shared tier: a Redis (or Valkey) server that the stores of many machines share (issue 15).

How it sits beside the local store (:class:`kcache.store.local.Store` calls into this module and
nothing else does):

- A local hit never touches Redis. A local miss asks Redis (one ``GET``); a remote hit is checked
  (see below), committed to the local store through the store's own ``put`` and served from
  there, so the next lookup on this machine is a local hit.
- A local put is also sent to Redis by a background thread (a bounded queue: what does not fit
  is dropped and counted; batches go in one pipeline); the compile never waits for it. At exit
  the queue is flushed for at most :data:`EXIT_FLUSH_S`.
- One Redis key per entry, ``<prefix>e:<entry id>``, holding one msgpack map: the entry's
  record (:meth:`Record.encode`, with every member's size, crc32 and sha256), its members
  ``{name: bytes}`` and, with ``KCACHE_SECRET``, an HMAC-SHA256 over the record. Members are
  checked against the record's sha256 before anything is committed, so the signature over the
  record covers them. Never pickle. ``<prefix>index`` is a sorted set (``"<kind> <id>"`` by put
  time, the newest :data:`INDEX_MAX` kept) for ``kcache remote``.
- Trust: machine-local kinds never go to or come from Redis. Kinds that are host code or
  pickles (``kinds.needs_signature``) go and come only signed; without a secret they stay local.
  With a secret, every entry read must carry a valid signature: unsigned or wrongly signed
  entries are refused and counted (``remote_refused``), and the caller compiles.
- Fail open: connect and read timeouts of ``KCACHE_REMOTE_TIMEOUT`` (100 ms), no retries, and a
  circuit breaker: after :data:`BREAKER_FAILURES` failures in a row the tier is skipped for
  :data:`BREAKER_COOLDOWN_S`, then one call probes it. No error ever reaches the caller.
- Single flight across machines (:meth:`RemoteTier.flight`): ``SET <prefix>l:<id> NX PX lease``
  after the local lock; the others poll for the entry until it appears, the lock goes, or the
  lease runs out. The writer releases the lock right after the entry's ``SET``, in one pipeline.

Counters go to the store's counters under each entry's kind, named ``remote_*`` (see
:data:`COUNTERS`), so ``kcache stats`` shows them. ``redis`` is imported on first use only.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import threading
import time
from typing import Any

import msgpack

from .. import kinds as _kinds
from ..log import logger, warn_once
from .records import CorruptRecord, Record, crc32, validate

FORMAT = 1
SIG_DOMAIN = b"kcache-remote/1\0"
BREAKER_FAILURES = 3  # failures in a row that turn the tier off for a while
BREAKER_COOLDOWN_S = 30.0  # then one call probes it
QUEUE_ITEMS = 1024  # entries waiting for the writer, at most
QUEUE_BYTES = 64 << 20  # and their bytes, at most (or one entry of KCACHE_REMOTE_MAX_ENTRY)
BATCH_ITEMS, BATCH_BYTES = 64, 8 << 20  # one pipeline
EXIT_FLUSH_S = 2.0  # at exit (and close), the writer gets this long to empty its queue
WRITE_TIMEOUT_MIN_S = 1.0  # the writer's socket timeout, at least (a large SET takes a while)
INDEX_MAX = 100_000  # entries kept in the listing index
POLL_MIN_S, POLL_MAX_S = 0.01, 0.1  # a single-flight waiter polls Redis this often
RECORD_MAX = 1 << 20

#: Counter names, per kind (in the store's counters, so ``kcache stats`` shows them).
COUNTERS = (
    "remote_hits",  # entries taken from Redis (committed locally)
    "remote_misses",  # lookups Redis did not have
    "remote_puts",  # entries written to Redis (confirmed)
    "remote_bytes_in",
    "remote_bytes_out",
    "remote_errors",  # calls that failed (timeouts, connection, Redis full, ...)
    "remote_refused",  # entries read but refused: checksum, record, signature
    "remote_dropped",  # entries not written: queue full, tier off, exit bound reached
    "remote_too_large",  # entries over KCACHE_REMOTE_MAX_ENTRY: kept local
    "remote_bypassed",  # lookups skipped while the circuit breaker is open
    "remote_waited",  # single flight: entries another machine compiled while this one waited
    "remote_s",  # seconds spent on Redis calls on the caller's thread (not waits)
    "remote_marked_bad",  # entries dropped from Redis because they failed when used here
)

_UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
_FAIL = object()


class Refused(Exception):
    """A remote entry that is not taken: ``what`` names the reason (for counting, warnings)."""

    def __init__(self, what: str, detail: str = "") -> None:
        super().__init__(f"{what}: {detail}" if detail else what)
        self.what = what


class RemoteConfig:
    """What the tier needs from the settings (a plain class: see :meth:`from_settings`)."""

    __slots__ = ("url", "password", "prefix", "max_entry", "timeout_s", "lease_s", "secret", "key_tag")

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        prefix: str = "kcache:",
        max_entry: int = 8 << 20,
        timeout_s: float = 0.1,
        lease_s: float = 60.0,
        secret: bytes | None = None,
        key_tag: str = "",
    ) -> None:
        self.url, self.password, self.prefix = url, password, prefix
        self.max_entry, self.timeout_s, self.lease_s = max_entry, timeout_s, lease_s
        self.secret, self.key_tag = secret, key_tag

    @classmethod
    def from_settings(cls, s: Any) -> RemoteConfig | None:
        """The tier's configuration, or None when no (usable) shared tier is configured."""
        if not getattr(s, "remote", None) or getattr(s, "remote_problems", None):
            return None
        return cls(
            s.remote,
            password=s.remote_password,
            prefix=s.remote_prefix,
            max_entry=s.remote_max_entry,
            timeout_s=s.remote_timeout / 1000.0,
            lease_s=s.remote_lock_lease,
            secret=s.secret,
            key_tag=s.key_tag,
        )

    @property
    def shown_url(self) -> str:
        from ..config import redact_url

        return redact_url(self.url)

    def entry_key(self, ident: str) -> str:
        return f"{self.prefix}e:{ident}"

    def lock_key(self, ident: str) -> str:
        return f"{self.prefix}l:{ident}"

    @property
    def index_key(self) -> str:
        return f"{self.prefix}index"


def connect(cfg: RemoteConfig, timeout_s: float | None = None) -> Any:
    """A redis-py client for ``cfg``: its timeouts (they win over any in the URL's query), no
    health checks, no HELLO or CLIENT SETINFO round trips, and one retry, at once, only of a command
    that met a dead connection (a pooled socket from before a server restart); never of a
    timeout (redis-py's default is 10 retries with backoff). Raises ImportError without redis."""
    import redis
    from redis.backoff import NoBackoff
    from redis.connection import parse_url
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    t = cfg.timeout_s if timeout_s is None else timeout_s
    kw = parse_url(cfg.url)
    if cfg.password and not kw.get("password"):
        kw["password"] = cfg.password
    kw.update(
        socket_timeout=t,
        socket_connect_timeout=t,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        retry_on_error=[],
        health_check_interval=0,
        driver_info=None,
    )
    kw.setdefault("protocol", 2)  # RESP2: no HELLO round trip on connect; any Redis or Valkey
    kw.pop("retry_on_timeout", None)
    return redis.Redis(connection_pool=redis.ConnectionPool(**kw))


def eligible(kind: str, secret: bytes | None) -> bool:
    """Whether entries of ``kind`` may go to and come from the shared tier."""
    k = _kinds.get(kind)
    if k.machine_local:
        return False
    return not (k.needs_signature and not secret)


def sign(secret: bytes, record: bytes) -> bytes:
    return hmac.new(secret, SIG_DOMAIN + record, hashlib.sha256).digest()


def pack_entry(record: bytes, members: dict[str, bytes], secret: bytes | None) -> bytes:
    """The value stored under an entry's key."""
    return msgpack.packb(
        {"f": FORMAT, "r": record, "m": members, "s": sign(secret, record) if secret else None},
        use_bin_type=True,
    )


def unpack_entry(
    raw: bytes, *, kind: str, key: str, ident: str, secret: bytes | None, max_entry: int
) -> tuple[Record, dict[str, bytes]]:
    """The record and members of a remote value, checked: format, signature (with ``secret``:
    required), the record (its own crc32; kind, key and id are the ones asked for), the member
    set, and each member's size, crc32 and sha256. Raises :class:`Refused`."""
    if len(raw) > max_entry + RECORD_MAX + 4096:
        raise Refused("too large", f"{len(raw)} bytes")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_str_len=1 << 16, max_map_len=4096)
    except Exception as e:
        raise Refused("malformed", f"does not decode ({type(e).__name__})") from None
    if not isinstance(d, dict) or d.get("f") != FORMAT:
        raise Refused("malformed", "not a kcache entry of this format")
    rec_bytes, members, sig = d.get("r"), d.get("m"), d.get("s")
    if not isinstance(rec_bytes, bytes) or len(rec_bytes) > RECORD_MAX or not isinstance(members, dict):
        raise Refused("malformed", "no record or members")
    if secret:
        if sig is None:
            raise Refused("unsigned", "KCACHE_SECRET is set and the entry carries no signature")
        if not isinstance(sig, bytes) or not hmac.compare_digest(sig, sign(secret, rec_bytes)):
            raise Refused("bad signature", "the signature does not match KCACHE_SECRET")
    elif _kinds.needs_signature(kind):
        raise Refused("unsigned", "host code and pickles are taken only when signed")
    try:
        rec = Record.decode(rec_bytes)
        validate(rec)  # numbers in range, bounded printable text: before any of it is used
    except CorruptRecord as e:
        raise Refused("corrupt", f"record: {e}") from None
    if rec.id != ident or rec.kind != kind or rec.key != key:
        raise Refused("corrupt", "the record is not the one asked for")
    if set(members) != {f.name for f in rec.files}:
        raise Refused("corrupt", "members differ from the record")
    out: dict[str, bytes] = {}
    for f in rec.files:
        b = members[f.name]
        if not isinstance(b, bytes) or len(b) != f.size:
            raise Refused("corrupt", f"member {f.name}: size")
        if crc32(b) != f.crc32 or hashlib.sha256(b).hexdigest() != f.sha256:
            raise Refused("corrupt", f"member {f.name}: checksum mismatch")
        out[f.name] = b
    return rec, out


class _Breaker:
    """Closed (calls go through) until :data:`BREAKER_FAILURES` failures in a row; then open for
    :data:`BREAKER_COOLDOWN_S`; then one call at a time probes it (success closes it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failures = 0
        self.open_until = 0.0
        self._probing = False
        self.trips = 0

    def allow(self) -> bool:
        with self._lock:
            if self.failures < BREAKER_FAILURES:
                return True
            now = time.monotonic()
            if now < self.open_until or self._probing:
                return False
            self._probing = True  # one probe; the others keep skipping until it answers
            return True

    def ok(self) -> None:
        with self._lock:
            if self.failures >= BREAKER_FAILURES:
                logger.info("kcache: the shared tier answers again")
            self.failures, self._probing = 0, False

    def fail(self) -> bool:
        """Count a failure; True when this one opened the breaker."""
        with self._lock:
            self.failures += 1
            self._probing = False
            if self.failures >= BREAKER_FAILURES:
                self.open_until = time.monotonic() + BREAKER_COOLDOWN_S
                self.trips += 1
                return self.failures == BREAKER_FAILURES
            return False

    @property
    def is_open(self) -> bool:
        return self.failures >= BREAKER_FAILURES


class RemoteTier:
    """The shared tier of one store in one process. Never raises into its callers."""

    def __init__(self, cfg: RemoteConfig, counts: Any) -> None:
        self.cfg = cfg
        self.counts = counts
        self.off = False  # for good: redis is not installed
        self._reset()

    def _reset(self) -> None:
        """Fresh state for this process (at start, and in a forked child: the parent's queue,
        locks, thread and sockets are the parent's)."""
        self._pid = os.getpid()
        self._clients_: tuple[Any, Any] | None = None  # (the callers' client, the writer's)
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._queued_bytes = 0
        self._busy = False
        self._thread: threading.Thread | None = None
        self._closing = False
        self._held: dict[str, str] = {}  # entry id -> token of a single-flight lock we hold
        self._breaker = _Breaker()

    def _mine(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    # ------------------------------------------------------------------ calls
    def _clients(self) -> tuple[Any, Any] | None:
        if self.off:
            return None
        if self._clients_ is None:
            try:
                self._clients_ = (
                    connect(self.cfg),
                    connect(self.cfg, max(self.cfg.timeout_s, WRITE_TIMEOUT_MIN_S)),
                )
            except ImportError:
                self.off = True
                warn_once(
                    "remote-no-redis",
                    "KCACHE_REMOTE is set but the redis package is not installed "
                    "(pip install 'kcache[redis]'); the shared tier is off, local caching goes on",
                )
                return None
            except Exception as e:  # a URL option redis-py refuses
                self.off = True
                warn_once(
                    "remote-config", f"cannot use KCACHE_REMOTE={self.cfg.shown_url} ({e}); shared tier off"
                )
                return None
        return self._clients_

    def _call(self, kind: str, fn: Any) -> Any:
        """``fn(client)`` on the caller's thread, bounded by the timeouts; :data:`_FAIL` when it
        fails or the breaker is open (counted; one warning)."""
        self._mine()
        if not self._breaker.allow():
            self.counts.add(kind, remote_bypassed=1)
            return _FAIL
        clients = self._clients()
        if clients is None:
            return _FAIL
        t0 = time.perf_counter()
        try:
            out = fn(clients[0])
        except Exception as e:
            self.counts.add(kind, remote_s=time.perf_counter() - t0)
            self._failed(kind, e)
            return _FAIL
        self.counts.add(kind, remote_s=time.perf_counter() - t0)
        self._breaker.ok()
        return out

    def _failed(self, kind: str, e: BaseException, n: int = 1) -> None:
        if n:
            self.counts.add(kind, remote_errors=n)
        name = type(e).__name__
        if "OutOfMemory" in name or "maxmemory" in str(e):
            warn_once(
                "remote-full",
                f"the shared tier at {self.cfg.shown_url} is full ({e}); new entries stay local "
                "(set a maxmemory-policy such as allkeys-lru: docs/remote.md)",
            )
            return  # reads still work: not a reason to stop asking
        opened = self._breaker.fail()
        if opened:
            warn_once(
                "remote-down",
                f"the shared tier at {self.cfg.shown_url} fails ({name}: {e}); compiling and caching "
                f"locally, trying it again every {BREAKER_COOLDOWN_S:.0f} s",
            )
        else:
            logger.info("kcache: shared tier call failed: %s: %s", name, e)

    # ------------------------------------------------------------------ reading
    def fetch(self, store: Any, kind: str, key: str, ident: str) -> Any:
        """On a local miss: the entry from Redis, checked and committed to ``store``, as a
        :class:`~kcache.store.local.Hit`; None when Redis lacks it, refuses, or fails."""
        if self.off or not eligible(kind, self.cfg.secret):
            return None
        raw = self._call(kind, lambda r: r.get(self.cfg.entry_key(ident)))
        if raw is _FAIL:
            return None
        if raw is None:
            self.counts.add(kind, remote_misses=1)
            return None
        return self._accept(store, kind, key, ident, raw)

    def _accept(self, store: Any, kind: str, key: str, ident: str, raw: bytes) -> Any:
        try:
            rec, blobs = unpack_entry(
                raw, kind=kind, key=key, ident=ident, secret=self.cfg.secret, max_entry=self.cfg.max_entry
            )
        except Refused as e:
            self.counts.add(kind, remote_refused=1)
            warn_once(
                f"remote-refused:{e.what}",
                f"refused a {kind} entry {ident[:12]} from the shared tier at {self.cfg.shown_url} "
                f"({e}); compiling instead",
            )
            return None
        self.counts.add(kind, remote_hits=1, remote_bytes_in=len(raw))
        hit = store.put(
            kind,
            key,
            blobs,
            components=rec.components,
            summary=rec.summary,
            compile_s=rec.compile_s,
            _origin="remote",
        )
        if hit is None:  # a read-only or full store: served from memory (files: private copies)
            from .local import Hit

            hit = Hit(rec, blobs, store, time.time())
        return hit

    def mark_bad(self, kind: str, ident: str) -> bool:
        """An entry that failed when used here (see :mod:`kcache.store.quarantine`): drop it
        from the shared tier, so that no other machine is served it. One call on the caller's
        thread, bounded like any other (a rare path: a quarantine). True when dropped."""
        if self.off or not eligible(kind, self.cfg.secret):
            return False

        def drop(r: Any) -> Any:
            p = r.pipeline(transaction=False)
            p.delete(self.cfg.entry_key(ident))
            p.zrem(self.cfg.index_key, f"{kind} {ident}")
            return p.execute()

        res = self._call(kind, drop)
        if res is _FAIL:
            return False
        self.counts.add(kind, remote_marked_bad=1)
        return True

    # ------------------------------------------------------------------ writing
    def publish(self, rec: Record, blobs: dict[str, bytes]) -> None:
        """After a local put: queue the entry for Redis (never waits; dropped and counted when
        the queue is full). A single-flight lock held for it is released right after its SET."""
        self._mine()
        if self.off or not eligible(rec.kind, self.cfg.secret):
            self.unlock(rec.id)
            return
        if self._clients_ is None and self._clients() is None:
            return  # made here, not in the writer: importing redis there can race the exit
        token = self._held.pop(rec.id, None)
        if rec.size > self.cfg.max_entry:
            self.counts.add(rec.kind, remote_too_large=1)
            if token:
                self._enqueue(("unlock", rec.kind, rec.id, token), 0)
            return
        self._enqueue(("put", rec.kind, rec.id, token, rec, blobs), rec.size)

    def unlock(self, ident: str) -> None:
        """Release the single-flight lock this process holds for ``ident`` (if any), soon."""
        self._mine()
        token = self._held.pop(ident, None)
        if token:
            self._enqueue(("unlock", "", ident, token), 0)

    def _enqueue(self, item: tuple[Any, ...], size: int) -> None:
        with self._cond:
            if self._closing:
                if item[0] == "put":
                    self.counts.add(item[1], remote_dropped=1)
                return
            bound = max(QUEUE_BYTES, self.cfg.max_entry)
            if item[0] == "put" and (len(self._queue) >= QUEUE_ITEMS or self._queued_bytes + size > bound):
                self.counts.add(item[1], remote_dropped=1)
                if item[3]:  # still release its lock
                    item = ("unlock", item[1], item[2], item[3])
                    size = 0
                else:
                    return
            self._queue.append(item)
            self._queued_bytes += size
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kcache-remote", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _take_batch(self) -> list[tuple[Any, ...]] | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            batch, size = [], 0
            while self._queue and len(batch) < BATCH_ITEMS and (not batch or size < BATCH_BYTES):
                item = self._queue.popleft()
                n = item[4].size if item[0] == "put" else 0
                self._queued_bytes -= n
                size += n
                batch.append(item)
            self._busy = True
            return batch

    def _run(self) -> None:
        pid = os.getpid()
        while os.getpid() == pid:
            batch = self._take_batch()
            if batch is None:
                return
            try:
                self._write(batch)
            except Exception as e:  # never let the thread die loudly
                logger.info("kcache: shared tier writer: %s", e)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        puts = [it for it in batch if it[0] == "put"]
        if not self._breaker.allow():
            for it in puts:
                self.counts.add(it[1], remote_dropped=1)
            return  # locks: their lease ends them
        clients = self._clients()
        if clients is None:
            return
        r = clients[1]
        pipe = r.pipeline(transaction=False)
        plan: list[tuple[str, tuple[Any, ...], int]] = []  # what each command's reply belongs to
        now = time.time()
        for it in batch:
            if it[0] == "put":
                _op, kind, ident, token, rec, blobs = it
                value = pack_entry(rec.encode(), blobs, self.cfg.secret)
                pipe.set(self.cfg.entry_key(ident), value)
                plan.append(("set", it, len(value)))
                pipe.zadd(self.cfg.index_key, {f"{kind} {ident}": now})
                plan.append(("index", it, 0))
            else:
                _op, kind, ident, token = it
            if token:
                pipe.eval(_UNLOCK, 1, self.cfg.lock_key(ident), token)
                plan.append(("unlock", it, 0))
        if puts:
            pipe.zremrangebyrank(self.cfg.index_key, 0, -INDEX_MAX - 1)
            plan.append(("trim", batch[0], 0))
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception as e:
            if puts:
                for it in puts[1:]:
                    self.counts.add(it[1], remote_errors=1)
                self._failed(puts[0][1], e)  # one failure for the breaker; an error per entry
            else:
                self._failed("", e, n=0)  # only lock releases: their lease ends them
            return
        failure: BaseException | None = None
        for (what, it, n), reply in zip(plan, replies):
            if isinstance(reply, BaseException):
                failure = reply
                if what == "set":
                    self.counts.add(it[1], remote_errors=1)
                continue
            if what == "set":
                self.counts.add(it[1], remote_puts=1, remote_bytes_out=n)
        if failure is not None:
            self._failed("", failure, n=0)  # counted per entry above
        else:
            self._breaker.ok()

    def flush(self, timeout: float = EXIT_FLUSH_S) -> bool:
        """Wait until the queue is written (at most ``timeout`` s); True when it is."""
        self._mine()
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return not (self._queue or self._busy)
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = EXIT_FLUSH_S) -> None:
        """Flush within ``timeout`` seconds, then stop: what is left is dropped and counted."""
        if self._pid != os.getpid():
            return  # a forked child's inherited tier: the parent writes its own queue
        self.flush(timeout)
        with self._cond:
            self._closing = True
            for it in self._queue:
                if it[0] == "put":
                    self.counts.add(it[1], remote_dropped=1)
            self._queue.clear()
            self._queued_bytes = 0
            self._cond.notify_all()
        for c in self._clients_ or ():
            try:
                c.close()
            except Exception:
                pass

    # ------------------------------------------------------------------ single flight
    def flight(self, store: Any, kind: str, key: str, ident: str) -> Any:
        """Single flight across machines, after this process took the local lock and the entry
        is in neither tier. Returns the entry (another machine compiled it meanwhile) or None:
        compile here, holding the remote lock when it could be taken (released when the entry
        is written to Redis, or by :meth:`unlock`, or by its lease ending).

        Waits at most the lease: for the entry to appear, or the holder's lock to go (a holder
        that failed or died: then compile here, without the lock)."""
        lease = self.cfg.lease_s
        if self.off or lease <= 0 or not eligible(kind, self.cfg.secret):
            return None
        token = os.urandom(16).hex()
        ekey, lkey = self.cfg.entry_key(ident), self.cfg.lock_key(ident)

        def first(r: Any) -> Any:
            p = r.pipeline(transaction=False)
            p.set(lkey, token, nx=True, px=max(1, int(lease * 1000)))
            p.get(ekey)
            return p.execute()

        res = self._call(kind, first)
        if res is _FAIL:
            return None
        got, raw = res
        if got:
            self._held[ident] = token
        if raw is not None:  # it landed between our lookup and the lock
            hit = self._accept(store, kind, key, ident, raw)
            if hit is not None:
                self.unlock(ident)
            return hit
        if got:
            return None  # ours: compile here
        deadline = time.monotonic() + lease
        delay = POLL_MIN_S

        def poll(r: Any) -> Any:
            p = r.pipeline(transaction=False)
            p.get(ekey)
            p.exists(lkey)
            return p.execute()

        while time.monotonic() < deadline:
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, POLL_MAX_S)
            res = self._call(kind, poll)
            if res is _FAIL:
                return None
            raw, locked = res
            if raw is not None:
                hit = self._accept(store, kind, key, ident, raw)
                if hit is not None:
                    self.counts.add(kind, remote_waited=1)
                return hit
            if not locked:
                return None  # the holder let go without an entry (failed, too large) or died
        warn_once(
            "remote-lock-lease",
            f"waited {lease:.0f} s (KCACHE_REMOTE_LOCK_LEASE) for another machine compiling the same "
            "kernel; compiling here",
        )
        return None
