"""The shared tier: a Redis (or Valkey) server that the stores of many machines share.

A tier behind the local store (see :mod:`kcache.store.cache`, which asks it after a local miss
and hands it what the local store commits; it never calls back into the cache; ``kcache remote``
uses :func:`connect`):

- A local hit never touches Redis. A local miss asks Redis for the entry's size (``STRLEN``), and
  only if it is within bounds for its bytes (``GETRANGE``, never more than the bound); a remote
  hit is checked (see below) and returned (:meth:`RemoteTier.fetch_entry`); the composed cache
  commits it to the local store, so the next lookup on this machine is a local hit.
- A local put is also sent to Redis by a background thread (a bounded queue: what does not fit
  is dropped and counted; batches go in one pipeline); the compile never waits for it. At exit
  the queue is flushed for at most :data:`EXIT_FLUSH_S` (or two writes' deadlines, when longer).
- One Redis key per entry, ``<prefix>e:<kind>:{<entry id>}`` (:mod:`.redis_keys`: the layout,
  the same for a single server and a cluster), holding one msgpack map: the entry's
  record (:meth:`Record.encode`, with every member's size, crc32 and sha256), its members
  ``{name: bytes}`` and, with ``KCACHE_SECRET``, an HMAC-SHA256 over the record. Members are
  checked against the record's sha256 before anything is committed, so the signature over the
  record covers them; the record's own fields are validated (:func:`records.validate`).
  Never pickle. No key that every machine writes: ``kcache remote`` lists entries by ``SCAN``.
- A Redis Cluster (``redis+cluster://``, :mod:`.redis_cluster`): the same calls through a
  redis-py ``RedisCluster``; each names one entry's keys (one node), the breaker is per node.
- Trust: machine-local kinds never go to or come from Redis. Kinds that are host code or
  pickles (``kinds.needs_signature``) go and come only signed; without a secret they stay local.
  With a secret, every entry read must carry a valid signature: unsigned or wrongly signed
  entries are refused and counted (``remote_refused``), and the caller compiles. Without a
  secret the tier trusts its writers for data (as Triton's and Inductor's Redis tiers do), but
  nothing it reads can stall the caller or exhaust its memory beyond the bounds below.
- Bounds (each call, however the server or the link behaves; :mod:`.redis_io`): a call ends
  within ``KCACHE_REMOTE_TIMEOUT`` (100 ms), a value's read within that plus
  :data:`TRANSFER_S_PER_MIB` per MiB of its size; no call reads more than it asked for, and a
  value over ``KCACHE_REMOTE_MAX_ENTRY`` (plus :data:`VALUE_OVERHEAD` for its record) is never
  read. No retries, and a circuit breaker (:mod:`.redis_breaker`; per node on a cluster): after
  :data:`BREAKER_FAILURES` failures within :data:`BREAKER_WINDOW_S` the server is skipped for
  :data:`BREAKER_COOLDOWN_S` (a cluster's node: :data:`NODE_COOLDOWN_S`, doubling while it keeps
  failing), then one call probes it. No error ever reaches the caller.
- Single flight across machines (:meth:`RemoteTier.flight`, the lock in :mod:`.redis_lock`): the
  first machine takes ``<prefix>l:{<id>}`` and keeps it alive with heartbeats; the others wait only
  while it shows progress, within the lease and a per-process budget of fruitless waiting.
- An entry whose use raised (:meth:`RemoteTier.mark_bad`) is deleted from Redis if it is still
  the value this process was served, and never taken again by this process.

Counters go to the store's counters under each entry's kind, named ``remote_*`` (see
:data:`COUNTERS`), so ``kcache stats`` shows them. ``redis`` is imported on first use only.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack

from ...log import logger, warn_once
from .. import trust as _trust
from ..records import CorruptRecord, Record, crc32, validate
from . import redis_cluster, redis_io
from . import redis_keys as rk
from . import redis_lock as rl
from .redis_breaker import Breakers

FORMAT = 1
SIG_DOMAIN = b"kcache-remote/1\0"
BREAKER_FAILURES = 3  # failures within BREAKER_WINDOW_S that turn the tier off for a while
BREAKER_WINDOW_S = 10.0
BREAKER_COOLDOWN_S = 30.0  # then one call probes it
NODE_COOLDOWN_S = 1.0  # a cluster's node: its first cool-down (a failover takes 1 to 3 s); doubles
QUEUE_ITEMS = 1024  # entries waiting for the writer, at most
QUEUE_BYTES = 64 << 20  # and their bytes, at most (or one entry of KCACHE_REMOTE_MAX_ENTRY)
BATCH_ITEMS, BATCH_BYTES = 64, 8 << 20  # one pipeline
EXIT_FLUSH_S = 2.0  # at exit (and close), the writer gets this long to empty its queue, at least
WRITE_TIMEOUT_MIN_S = 1.0  # the writer's deadline, at least (plus its bytes' transfer time)
TRANSFER_S_PER_MIB = 1 / 32  # a value's read or write may take this much longer per MiB (32 MiB/s)
POLL_MIN_S, POLL_MAX_S = 0.01, 0.1  # a single-flight waiter looks at Redis this often
RECORD_MAX = 1 << 20
VALUE_OVERHEAD = 64 << 10  # a value may exceed KCACHE_REMOTE_MAX_ENTRY by this (record, framing)
SMALL_REPLY = 64 << 10  # the most a call that reads no value may read
BAD_REMEMBERED = 4096  # (entry, value digest) pairs this process refuses after mark_bad
SERVED_REMEMBERED = 4096  # digests of values taken from Redis, kept for mark_bad

#: Counter names, per kind (in the store's counters, so ``kcache stats`` shows them).
COUNTERS = (
    "remote_hits",  # entries taken from Redis (committed locally)
    "remote_misses",  # lookups Redis did not have
    "remote_puts",  # entries written to Redis (confirmed)
    "remote_bytes_in",
    "remote_bytes_out",
    "remote_errors",  # calls that failed (timeouts, deadlines, connection, Redis full, ...)
    "remote_refused",  # entries read but refused: checksum, record, signature, marked bad
    "remote_dropped",  # entries not written: queue full, tier off, exit bound reached
    "remote_too_large",  # entries over KCACHE_REMOTE_MAX_ENTRY: kept local, or never read
    "remote_bypassed",  # lookups skipped while the circuit breaker is open
    "remote_waited",  # single flight: entries another machine compiled while this one waited
    "remote_ignored",  # single flight: locks not waited on (foreign, no expiry, forged, ...)
    "remote_wait_s",  # single flight: seconds waited on other machines' locks
    "remote_fruitless_s",  # of which charged as fruitless (see redis_lock.FruitlessBudget)
    "remote_marked_bad",  # entries whose use raised, deleted from Redis
    "remote_s",  # seconds spent on Redis calls on the caller's thread (not waits)
)

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
    def from_settings(cls, s: Any, url: str | None = None) -> RemoteConfig | None:
        """The tier's configuration (for ``url``, default the settings' own), or None when no
        (usable) shared tier is configured."""
        if not (url or getattr(s, "remote", None)) or getattr(s, "remote_problems", None):
            return None
        return cls(
            url or s.remote,
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
        from ...config import redact_url

        return redact_url(self.url)

    @property
    def value_limit(self) -> int:
        """The most bytes of one entry's value that are ever read (or written)."""
        return self.max_entry + VALUE_OVERHEAD

    def transfer_s(self, nbytes: int, floor: float | None = None) -> float:
        """The deadline of a call that moves ``nbytes`` of values."""
        return max(self.timeout_s, floor or 0.0) + nbytes / (1 << 20) * TRANSFER_S_PER_MIB

    @property
    def cluster(self) -> bool:
        """A Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
        return redis_cluster.is_cluster(self.url)

    def entry_key(self, kind: str, ident: str) -> str:
        return rk.entry_key(self.prefix, kind, ident)

    def lock_key(self, ident: str) -> str:
        return rk.lock_key(self.prefix, ident)


def make(settings: Any, key_tag: str, counts: Any) -> RemoteTier | None:
    """The tier for ``settings`` (see :func:`kcache.store.tiers.tier_for`), or None."""
    cfg = RemoteConfig.from_settings(settings)
    if cfg is None:
        return None
    cfg.key_tag = key_tag
    return RemoteTier(cfg, counts)


def trust_line(secret: bytes | None) -> str:
    """What ``kcache config`` and ``kcache remote`` say of the shared tier's trust."""
    if secret:
        return "shared tier: authenticated (KCACHE_SECRET): unsigned entries and locks are refused"
    return "shared tier: not authenticated (set KCACHE_SECRET)"


def connect(cfg: RemoteConfig, timeout_s: float | None = None) -> Any:
    """A redis-py client for ``cfg`` whose calls honour :func:`redis_io.bounded` (see
    :func:`redis_io.connect`; a cluster's: :func:`redis_cluster.connect`). Raises ImportError
    without redis."""
    t = cfg.timeout_s if timeout_s is None else timeout_s
    if cfg.cluster:
        return redis_cluster.connect(cfg.url, cfg.password, t)
    return redis_io.connect(cfg.url, cfg.password, t)


def eligible(kind: str, secret: bytes | None) -> bool:
    """Whether entries of ``kind`` may go to and come from the shared tier: with a secret every
    entry is signed, without one only what may cross unsigned goes (:mod:`..trust`)."""
    return _trust.may_cross(kind, signed=bool(secret))


def sign(secret: bytes, record: bytes) -> bytes:
    return _trust.sign(secret, SIG_DOMAIN, record)


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
    required), the record (its own crc32; kind, key and id are the ones asked for; every field
    within bounds), the member set, and each member's size, crc32 and sha256. Raises
    :class:`Refused`."""
    if len(raw) > max_entry + VALUE_OVERHEAD:
        raise Refused("too large", f"{len(raw)} bytes")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_str_len=1 << 16, max_map_len=4096)
    except Exception as e:  # broad: msgpack raises more than its documented errors on hostile bytes
        raise Refused("malformed", f"does not decode ({type(e).__name__})") from None
    if not isinstance(d, dict) or d.get("f") != FORMAT:
        raise Refused("malformed", "not a kcache entry of this format")
    rec_bytes, members, sig = d.get("r"), d.get("m"), d.get("s")
    if not isinstance(rec_bytes, bytes) or len(rec_bytes) > RECORD_MAX or not isinstance(members, dict):
        raise Refused("malformed", "no record or members")
    if secret:
        if sig is None:
            raise Refused("unsigned", "KCACHE_SECRET is set and the entry carries no signature")
        if not isinstance(sig, bytes) or not _trust.verify(secret, SIG_DOMAIN, rec_bytes, sig):
            raise Refused("bad signature", "the signature does not match KCACHE_SECRET")
    elif _trust.refusal(kind, signed=False) == _trust.UNSIGNED:
        raise Refused("unsigned", "host code and pickles are taken only when signed")
    try:
        rec = Record.decode(rec_bytes)
    except CorruptRecord as e:
        raise Refused("corrupt", f"record: {e}") from None
    if rec.id != ident or rec.kind != kind or rec.key != key:
        raise Refused("corrupt", "the record is not the one asked for")
    try:
        validate(rec)  # numbers in range, bounded printable text: before any of it is used
    except CorruptRecord as e:
        raise Refused("bad record", str(e)) from None
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


def _error_reply(e: BaseException) -> bool:
    """An error Redis answered (WRONGTYPE on a key someone else set, ...), as opposed to a call
    that failed: it says nothing about the server's health."""
    if getattr(e, "unavailable", False):  # CLUSTERDOWN (redis_io.cluster_down): the node fails
        return False
    names = {c.__name__ for c in type(e).__mro__}
    return "ResponseError" in names and "OutOfMemoryError" not in names and "maxmemory" not in str(e)


class _Digests:
    """A bounded set (or map) of recent keys, oldest dropped first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._d: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, k: Any, v: Any = True) -> None:
        with self._lock:
            self._d[k] = v
            self._d.move_to_end(k)
            while len(self._d) > self.limit:
                self._d.popitem(last=False)

    def get(self, k: Any) -> Any:
        with self._lock:
            return self._d.get(k)


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
        self._clients_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._queued_bytes = 0
        self._busy = False
        self._thread: threading.Thread | None = None
        self._closing = False
        # A cluster's nodes: short cool-downs, doubling (a failover turns a master's slots off
        # for seconds); the cluster as a whole (its client cannot be made) and a single server:
        # the long one.
        node_s = NODE_COOLDOWN_S if self.cfg.cluster else BREAKER_COOLDOWN_S
        self._breakers = Breakers(BREAKER_FAILURES, BREAKER_WINDOW_S, BREAKER_COOLDOWN_S, node_s)
        self.budget = rl.FruitlessBudget()
        self.keeper = rl.LockKeeper(
            self.cfg.lock_key,
            self.cfg.secret,
            self.cfg.lease_s,
            lambda fn, route: self._call("", fn, route=route),
            _FAIL,
            split=self._split,
        )
        self._served = _Digests(SERVED_REMEMBERED)  # entry id -> digest of the value taken
        self._bad = _Digests(BAD_REMEMBERED)  # (entry id, digest) refused from now on

    def _mine(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def describe(self) -> dict[str, Any]:
        """What this tier is and how it fares in this process (no network; no secret): its URL
        (password masked), a server or a cluster, and each breaker that has seen a failure (a
        cluster's: by node). ``kcache remote`` asks the nodes themselves
        (:func:`.redis_survey.survey`)."""
        return {
            "name": "redis",
            "url": self.cfg.shown_url,
            "mode": "cluster" if self.cfg.cluster else "server",
            "prefix": self.cfg.prefix,
            "signed": bool(self.cfg.secret),
            "off": self.off,
            "breakers": self._breakers.states(),
        }

    # ------------------------------------------------------------------ calls
    def warm_up(self) -> None:
        """Import redis and make the clients now, at attach, for a store that holds nothing (it
        will ask the tier at once): part of the process's start, not of its first compile. On
        the caller's thread: a thread importing while the program forks could leave the child
        an import lock no one will release. No network call. Never raises."""
        try:
            self._clients()
        except Exception as e:  # broad: redis-py raises its own and OS errors; a warm-up never raises
            logger.debug("shared tier warm-up: %s", e)

    def _clients(self) -> tuple[Any, Any] | None:
        if self.off or self._closing:  # closed: no call connects again (a lookup racing the exit)
            return None
        if self._clients_ is None:
            with self._clients_lock:  # the writer and lock threads may get here at once
                if self._clients_ is None and not self.off:
                    self._make_clients()
        return self._clients_

    def _make_clients(self) -> None:
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
        except Exception as e:  # a URL option redis-py refuses
            self.off = True
            warn_once(
                "remote-config", f"cannot use KCACHE_REMOTE={self.cfg.shown_url} ({e}); shared tier off"
            )

    def _call(
        self,
        kind: str,
        fn: Callable[[Any], Any],
        seconds: float | None = None,
        max_bytes: int = SMALL_REPLY,
        timed: bool = True,
        route: str = "",
    ) -> Any:
        """``fn(client)`` on the caller's thread, ending within ``seconds`` (default: the
        timeout) and reading at most ``max_bytes``; :data:`_FAIL` when it fails or the breaker
        is open (counted; one warning). ``route``: a key the call touches (a cluster's breaker
        is the one of that key's node; every key of one call is in one slot). An error reply (a
        key of the wrong type) fails the call without counting against the server. ``timed``:
        its time counts as ``remote_s`` (not the looks of a single-flight wait, which count as
        waiting)."""
        self._mine()
        clients = self._clients()
        if clients is None:
            return _FAIL
        breaker = self._admit(clients[0], route)
        if breaker is None:
            self._count(kind, remote_bypassed=1)
            return _FAIL
        t0 = time.perf_counter()
        try:
            with redis_io.bounded(self.cfg.timeout_s if seconds is None else seconds, max_bytes):
                out = fn(clients[0])
        except Exception as e:  # broad: the server, redis-py or the bound: a miss, classified here
            if timed:
                self._count(kind, remote_s=time.perf_counter() - t0)
            if _error_reply(e):
                self._count(kind, remote_refused=1)
                self._answered_error(e)
                breaker.ok()
                return _FAIL
            self._failed(kind, e, breaker=breaker)
            return _FAIL
        if timed:
            self._count(kind, remote_s=time.perf_counter() - t0)
        breaker.ok()
        return out

    def _breaker(self, r: Any, route: str) -> Any:
        """The breaker of the node that holds ``route`` (a single server: its one breaker)."""
        node = r.node_of(route) if route and isinstance(r, redis_cluster.ClusterClient) else ""
        return self._breakers.get(node)

    def _admit(self, r: Any, route: str) -> Any:
        """The breaker of a call that may go ahead, or None (skip it). On a cluster, a call whose
        node's breaker is open first has the client ask for the slots again (at most once a
        second): a replica that took over a dead master's slots is used at once, not after the
        dead node's cool-down (its client would not learn of it while it sends nothing there)."""
        breaker = self._breaker(r, route)
        if breaker.allow():
            return breaker
        if not (route and isinstance(r, redis_cluster.ClusterClient) and breaker.name):
            return None
        try:
            with redis_io.bounded(self.cfg.timeout_s):
                if not r.refresh():
                    return None
        except Exception as e:  # no node answers: the breaker stays as it is
            logger.debug("kcache: shared tier: asking the cluster for its slots: %s", e)
            return None
        breaker = self._breaker(r, route)
        return breaker if breaker.allow() else None

    def _split(
        self, items: list[Any], key: Callable[[Any], str], writer: bool = False
    ) -> list[tuple[str, list[Any]]]:
        """``items`` grouped by the node of each one's key as the callers' (or the ``writer``'s)
        client knows it, each group with a key of it to route its call by (one group on a single
        server, and on a cluster not yet asked for its slots)."""
        clients = self._clients()
        r = None if clients is None else clients[1 if writer else 0]
        if not items or not isinstance(r, redis_cluster.ClusterClient):
            return [(key(items[0]), items)] if items else []
        return [(key(group[0]), group) for _node, group in r.split(items, key)]

    def _answered_error(self, e: BaseException) -> None:
        moved = {"MovedError", "AskError"} & {c.__name__ for c in type(e).__mro__}
        if moved or str(e).startswith(("MOVED ", "ASK ")):  # (redis-py 5.x: a plain ResponseError)
            warn_once(
                "remote-moved",
                f"the shared tier at {self.cfg.shown_url} is a Redis Cluster node, which has only "
                "some of the keys: name its nodes as KCACHE_REMOTE=redis+cluster://host:port,... "
                "(docs/remote.md)",
            )
        else:
            logger.info("kcache: the shared tier answered an error: %s", e)

    def _count(self, kind: str, **deltas: float) -> None:
        if kind:  # the lock keeper's calls belong to no kind
            self.counts.add(kind, **deltas)

    def _failed(self, kind: str, e: BaseException, n: int = 1, breaker: Any = None) -> None:
        if n:
            self._count(kind, remote_errors=n)
        name = type(e).__name__
        if "OutOfMemory" in name or "maxmemory" in str(e):
            warn_once(
                "remote-full",
                f"the shared tier at {self.cfg.shown_url} is full ({e}); new entries stay local "
                "(set a maxmemory-policy such as allkeys-lru: docs/remote.md)",
            )
            return  # reads still work: not a reason to stop asking
        if breaker is None:
            breaker = self._breakers.get()
        opened = breaker.fail()
        if opened and breaker.name:  # a cluster's node
            warn_once(
                "remote-down",
                f"a node of the shared tier at {self.cfg.shown_url} fails ({breaker.name}: {name}: "
                f"{e}); its keys are compiled and cached locally, trying it again in "
                f"{breaker.cooldown:.0f} s or less",
            )
        elif opened:
            warn_once(
                "remote-down",
                f"the shared tier at {self.cfg.shown_url} fails ({name}: {e}); compiling and caching "
                f"locally, trying it again every {breaker.max_cooldown:.0f} s",
            )
        else:
            logger.info("kcache: shared tier call failed: %s: %s", name, e)

    # ------------------------------------------------------------------ reading
    def fetch_entry(self, kind: str, key: str, ident: str) -> tuple[Record, dict[str, bytes]] | None:
        """The entry from Redis, checked (record, members), or None: missing, refused, too
        large (never read), or the call failed."""
        if self.off or not eligible(kind, self.cfg.secret):
            return None
        ekey = self.cfg.entry_key(kind, ident)
        size = self._call(kind, lambda r: r.strlen(ekey), route=ekey)
        if size is _FAIL:
            return None
        if not size:
            self.counts.add(kind, remote_misses=1)
            return None
        return self._read_value(kind, key, ident, int(size))

    def _read_value(
        self, kind: str, key: str, ident: str, size: int
    ) -> tuple[Record, dict[str, bytes]] | None:
        """Read a value Redis says is ``size`` bytes (no more than the bound, whatever it holds
        by then) and check it."""
        limit = self.cfg.value_limit
        if size > limit:
            self.counts.add(kind, remote_too_large=1)
            warn_once(
                "remote-too-large",
                f"not reading a {kind} entry of {size} bytes from the shared tier at "
                f"{self.cfg.shown_url} (over KCACHE_REMOTE_MAX_ENTRY); compiling instead",
            )
            return None
        ekey = self.cfg.entry_key(kind, ident)
        raw = self._call(
            kind,
            lambda r: r.getrange(ekey, 0, limit - 1),
            seconds=self.cfg.transfer_s(size),
            max_bytes=limit + 4096,
            route=ekey,
        )
        if raw is _FAIL or not raw:
            return None
        return self._check(kind, key, ident, raw)

    def _check(self, kind: str, key: str, ident: str, raw: bytes) -> tuple[Record, dict[str, bytes]] | None:
        digest = hashlib.sha1(raw).hexdigest()  # what Redis's Lua can compute too (mark_bad)
        try:
            if self._bad.get((ident, digest)):
                raise Refused("marked bad", "its use raised in this process before")
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
        self._served.put(ident, digest)
        self.counts.add(kind, remote_hits=1, remote_bytes_in=len(raw))
        return rec, blobs

    # ------------------------------------------------------------------ bad entries
    def mark_bad(self, kind: str, ident: str) -> bool:
        """An entry whose use raised (:mod:`kcache.store.quarantine` calls this): never take it
        again in this process, and delete it from Redis if Redis still holds the value this
        process was served (or, for an entry this process did not take from Redis, whatever it
        holds: it was published from a store whose copy failed). Queued for the writer, ahead of
        the entry compiled instead; never waits, never raises. True when queued."""
        self._mine()
        digest = self._served.get(ident)
        if digest is not None:
            self._bad.put((ident, digest))
        if self.off or not eligible(kind, self.cfg.secret):
            return False
        if self._clients_ is None and self._clients() is None:
            return False
        self._enqueue(("bad", kind, ident, None, digest), 0)
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
        prefix = self.keeper.releasing(rec.id)
        if rec.size > self.cfg.max_entry:
            self.counts.add(rec.kind, remote_too_large=1)
            if prefix:
                self._enqueue(("unlock", rec.kind, rec.id, prefix), 0)
            return
        self._enqueue(("put", rec.kind, rec.id, prefix, rec, blobs), rec.size)

    def unlock(self, ident: str) -> None:
        """Release the single-flight lock this process holds for ``ident`` (if any), soon."""
        self._mine()
        prefix = self.keeper.releasing(ident)
        if prefix:
            self._enqueue(("unlock", "", ident, prefix), 0)

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
            batch: list[Any] = []
            size = 0
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
                for it in batch:
                    if it[0] in ("put", "unlock") and it[3]:
                        self.keeper.forget(it[2])
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        clients = self._clients()
        if clients is None:
            return
        # One pipeline per node (a single server: one): a failing node holds up only its own.
        for route, group in self._split(batch, lambda it: self.cfg.lock_key(it[2]), writer=True):
            self._write_group(clients[1], route, group)

    def _write_group(self, r: Any, route: str, batch: list[tuple[Any, ...]]) -> None:
        puts = [it for it in batch if it[0] == "put"]
        breaker = self._admit(r, route)
        if breaker is None:
            for it in puts:
                self.counts.add(it[1], remote_dropped=1)
            return  # locks: they expire on their own
        cmds: list[tuple[Any, ...]] = []  # one pipeline's commands
        plan: list[tuple[str, tuple[Any, ...], int]] = []  # what each command's reply belongs to
        nbytes = 0
        for it in batch:
            op, kind, ident = it[0], it[1], it[2]
            if op == "bad":
                digest = it[4]
                ekey = self.cfg.entry_key(kind, ident)
                if digest is not None:  # only the value this process was served
                    cmds.append(("EVAL", _DELETE_IF_SAME, 1, ekey, digest))
                else:
                    cmds.append(("DEL", ekey))
                plan.append(("bad", it, 0))
                continue
            prefix = it[3]
            if op == "put":
                rec, blobs = it[4], it[5]
                value = pack_entry(rec.encode(), blobs, self.cfg.secret)
                if len(value) > self.cfg.value_limit:  # nobody would read it
                    self.counts.add(kind, remote_too_large=1)
                else:
                    nbytes += len(value)
                    cmds.append(("SET", self.cfg.entry_key(kind, ident), value))
                    plan.append(("set", it, len(value)))
            if prefix:
                cmds.append(("EVAL", rl.UNLOCK_LUA, 1, self.cfg.lock_key(ident), prefix))
                plan.append(("unlock", it, 0))
        if not plan:
            return
        try:
            with redis_io.bounded(self.cfg.transfer_s(nbytes, WRITE_TIMEOUT_MIN_S), SMALL_REPLY):
                pipe = r.pipeline(transaction=False)  # (a cluster's client is made here, bounded)
                for args in cmds:  # (a cluster's pipeline has no eval(): the commands themselves)
                    pipe.execute_command(*args)
                replies = pipe.execute(raise_on_error=False)
        except Exception as e:  # broad: the server, redis-py or the bound: each put fails, classified here
            if puts:
                for it in puts[1:]:  # an error per entry, one failure for the breaker
                    self.counts.add(it[1], remote_errors=1)
                self._failed(puts[0][1], e, breaker=breaker)
            else:
                self._failed("", e, n=0, breaker=breaker)  # only lock releases: their expiry ends them
            return
        failure: BaseException | None = None
        for (what, it, n), reply in zip(plan, replies):
            if isinstance(reply, BaseException):
                if not _error_reply(reply):
                    failure = reply
                if what == "set":
                    self.counts.add(it[1], remote_errors=1)
                continue
            if what == "set":
                self.counts.add(it[1], remote_puts=1, remote_bytes_out=n)
            elif what == "bad" and reply:
                self.counts.add(it[1], remote_marked_bad=1)
        if failure is not None:
            self._failed("", failure, n=0, breaker=breaker)  # counted per entry above
        else:
            breaker.ok()

    def exit_flush_s(self) -> float:
        """How long close (at exit) waits for the writer: :data:`EXIT_FLUSH_S`, or room for two
        writes by their own deadline where ``KCACHE_REMOTE_TIMEOUT`` makes one longer than a
        second (a write begun just before exit, then the last one; else a slow link set with a
        longer deadline drops what was compiled last)."""
        return max(EXIT_FLUSH_S, 2 * self.cfg.transfer_s(0, WRITE_TIMEOUT_MIN_S))

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

    def close(self, timeout: float | None = None) -> None:
        """Flush within ``timeout`` seconds (:meth:`exit_flush_s`), then stop: what is left is
        dropped and counted."""
        if self._pid != os.getpid():
            return  # a forked child's inherited tier: the parent writes its own queue
        self.flush(self.exit_flush_s() if timeout is None else timeout)
        self.keeper.close()
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
                if not isinstance(c, redis_cluster.ClusterClient):
                    # (its own close does this: redis-py 5.0.0 disconnects no pool on close())
                    c.connection_pool.disconnect()
            except Exception:  # broad: closing goes on whatever a client met
                pass

    # ------------------------------------------------------------------ single flight
    def flight(self, kind: str, key: str, ident: str) -> tuple[Record, dict[str, bytes]] | None:
        """Single flight across machines, after this process took the local lock and the entry
        is in neither tier. Returns the entry, checked (another machine compiled it meanwhile;
        the composed cache commits it locally), or None:
        compile here, holding the remote lock when it could be taken (kept alive by heartbeats;
        released when the entry is written to Redis, or by :meth:`unlock`, or when this process
        stops renewing it).

        Waits only while the holder's lock shows progress (:class:`redis_lock.Watch`): never
        on a lock that is not kcache's, has no expiry or (with a secret) is not signed; at most
        the lease; and within this process's budget of fruitless waiting."""
        if self.off or self.cfg.lease_s <= 0 or not eligible(kind, self.cfg.secret):
            return None
        got = self._flight(kind, key, ident)
        return got if isinstance(got, tuple) else None

    def _take(self, kind: str, ident: str, holder: str, timed: bool = True) -> Any:
        """SET the lock NX (ours if free), then what is there now: (taken, lock value, its PTTL,
        the entry's size)."""
        lkey, ekey = self.cfg.lock_key(ident), self.cfg.entry_key(kind, ident)
        value = self.keeper.value(ident, holder)
        ttl = max(1, int(rl.LOCK_TTL_S * 1000))

        def take(r: Any) -> Any:
            p = r.pipeline(transaction=False)
            p.set(lkey, value, nx=True, px=ttl)
            p.getrange(lkey, 0, rl.VALUE_MAX)
            p.pttl(lkey)
            p.strlen(ekey)
            return p.execute(raise_on_error=False)

        res = self._call(kind, take, timed=timed, route=lkey)
        if res is _FAIL:
            return _FAIL
        got, raw, pttl, size = res
        got = got is True
        if got:
            self.keeper.hold(ident, holder)
        return got, _value(raw), _int(pttl, -2), _int(size, 0)

    def _look(self, kind: str, ident: str) -> Any:
        """(lock value, its PTTL, the entry's size) now."""
        lkey, ekey = self.cfg.lock_key(ident), self.cfg.entry_key(kind, ident)

        def look(r: Any) -> Any:
            p = r.pipeline(transaction=False)
            p.getrange(lkey, 0, rl.VALUE_MAX)
            p.pttl(lkey)
            p.strlen(ekey)
            return p.execute(raise_on_error=False)

        res = self._call(kind, look, timed=False, route=lkey)
        if res is _FAIL:
            return _FAIL
        raw, pttl, size = res
        return _value(raw), _int(pttl, -2), _int(size, 0)

    def _flight(self, kind: str, key: str, ident: str) -> Any:
        """The entry (record, members) another machine compiled, or None (compile here)."""
        holder = rl.new_holder()
        res = self._take(kind, ident, holder)
        if res is _FAIL:
            return None
        got, raw, pttl, size = res
        if size:  # it landed between our lookup and the lock
            entry = self._read_value(kind, key, ident, size)
            if entry is not None:
                self.unlock(ident)
                return entry
        if got:
            return None  # ours: compile here
        watch = rl.Watch(ident, self.cfg.secret, self.cfg.lease_s, self.budget, time.monotonic())
        delay = POLL_MIN_S
        while True:
            now = time.monotonic()
            why = watch.see(raw, pttl, now, int(time.time() * 1000))
            if why == "gone":  # the holder let go, or its lock expired: take it, or wait on the next
                why = watch.over(now)  # the lease and the budget bound a wait, lock or no lock
                if why is not None:
                    break
                res = self._take(kind, ident, holder, timed=False)
                if res is _FAIL:
                    why = "error"
                    break
                got, raw, pttl, size = res
                if size:
                    entry = self._read_value(kind, key, ident, size)
                    if entry is not None:
                        self.unlock(ident)
                        self._waited(kind, watch, entry=True)
                        return entry
                if got:
                    why = "taken"
                    break
                if raw is None:  # free, and not ours: Redis refuses the write (full, a replica)
                    why = "refused"
                    break
                continue  # someone else took it: judge that lock
            if why is not None:
                break
            time.sleep(max(0.0, min(delay, watch.time_left(time.monotonic()))))
            delay = min(delay * 1.5, POLL_MAX_S)
            res = self._look(kind, ident)
            if res is _FAIL:
                why = "error"
                break
            raw, pttl, size = res
            if size:
                entry = self._read_value(kind, key, ident, size)
                if entry is not None:
                    self._waited(kind, watch, entry=True)
                    return entry
                why = "refused"
                break
        self._waited(kind, watch, entry=False, why=why)
        if why in rl.TAKEN_OVER and raw is not None:
            self._take_over(kind, ident, holder, raw)
        return None

    def _waited(self, kind: str, watch: rl.Watch, *, entry: bool, why: str | None = None) -> None:
        """Count a wait that ended (with the entry, or why not), and charge a fruitless one."""
        now = time.monotonic()
        waited = watch.elapsed(now)
        if entry:
            self.counts.add(kind, remote_waited=1, remote_wait_s=waited)
            return
        fruitless = watch.fruitless(now)
        self.budget.charge(fruitless)
        self.counts.add(kind, remote_wait_s=waited, remote_fruitless_s=fruitless)
        if why in rl.NOT_WAITED:
            self.counts.add(kind, remote_ignored=1)
            warn_once(
                f"remote-lock-{why}",
                f"not waiting on a single-flight lock {_WHY[why]} in the shared tier at "
                f"{self.cfg.shown_url}; compiling here",
            )
        elif why == "lease":
            warn_once(
                "remote-lock-lease",
                f"waited {self.cfg.lease_s:.0f} s (KCACHE_REMOTE_LOCK_LEASE) for another machine "
                "compiling the same kernel; compiling here",
            )
        elif why == "budget" and self.budget.left() <= 0:
            warn_once(
                "remote-lock-budget",
                f"waits on other machines' locks that brought nothing have cost this process "
                f"{self.budget.spent:.1f} s; not waiting on unproven locks any more "
                "(set KCACHE_SECRET to follow signed heartbeats)",
            )

    def _take_over(self, kind: str, ident: str, holder: str, seen: bytes) -> None:
        """Replace a lock that was not waited on (still exactly ``seen``) by ours, so that other
        machines wait on this compile instead of each compiling too."""
        if seen == _WRONG_TYPE:
            return
        value = self.keeper.value(ident, holder)
        ttl = str(int(rl.LOCK_TTL_S * 1000))
        lkey = self.cfg.lock_key(ident)
        res = self._call(kind, lambda r: r.eval(rl.TAKEOVER_LUA, 1, lkey, seen, value, ttl), route=lkey)
        if res is not _FAIL and _int(res, 0) == 1:
            self.keeper.hold(ident, holder)


#: Delete an entry if its value is still the one this process was served (sha1 hex ARGV[1]).
_DELETE_IF_SAME = (
    "local v = redis.call('get', KEYS[1]) "
    "if v and redis.sha1hex(v) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


#: How a warning names a lock that is not waited on.
_WHY = {
    "foreign": "that is not kcache's",
    "no-expiry": "with no expiry",
    "long-expiry": "with an expiry longer than any kcache lock's",
    "unsigned": "without a signature (KCACHE_SECRET is set)",
    "forged": "whose signature does not match KCACHE_SECRET",
    "replayed": f"signed more than {rl.FRESH_S:.0f} s from this clock's time (replayed, or a clock off)",
}
_WRONG_TYPE = b"\0wrong type"  # what a lock key of another type reads as (never a lock)


def _value(raw: Any) -> bytes | None:
    """A lock value as read (None: no lock; an error reply reads as a value no lock has)."""
    if raw is None or raw == b"":
        return None
    if isinstance(raw, BaseException):
        return _WRONG_TYPE
    return raw if isinstance(raw, bytes) else None


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default
