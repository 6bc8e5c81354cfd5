"""The shared tier: one machinery over a thin backend (Redis, a Redis Cluster, S3, a user's class).

A tier behind the local store (:mod:`kcache.store.cache` asks it after a local miss and hands it
what the local store commits; it never calls back into the cache). What is here, once, for every
backend (:mod:`.backend` says what a backend does):

- **Reading.** A local miss asks the backend for the entry's size, and only if it is within
  ``KCACHE_REMOTE_MAX_ENTRY`` (plus :data:`~.entry.VALUE_OVERHEAD`) for its bytes, never more
  than that bound. What comes back is checked (:func:`.entry.unpack_entry`: format, signature,
  record, every member's checksum) and returned; the composed cache commits it locally.
- **Writing.** A local put is queued for a background thread (:mod:`.writer`: bounded, batched,
  dropped and counted when full; the compile never waits), flushed at exit within a bound.
- **Trust.** Machine-local kinds never go or come; host code and pickles only signed; with
  ``KCACHE_SECRET`` nothing unsigned is acted on: entries (here) and leases (:mod:`.lease`).
- **Bounds.** Every call has a deadline for the whole call and a byte bound (:mod:`.bounded`);
  a breaker per node (:mod:`.breaker`) and a budget per tier: the wall time this process's
  threads spent on calls that failed, past :data:`BUDGET_CALLS` call deadlines (0.5 s) within
  :data:`BREAKER_COOLDOWN_S`, turns the whole tier off for that cool-down, however many nodes a
  cluster names. Calls answered with an error count their time too, and :data:`ANSWERS_IN_A_ROW`
  of them with no success between (credentials, a policy, the region: every request refused)
  turn the tier off the same way, with one warning that names the answer.
- **Failures** are the backend's typed exceptions (:class:`~.backend.Unavailable`, ...),
  counted here (``remote_*``, one warning per cause): a miss, a dropped write, never an error
  of the caller.
- **Mark bad**: an entry whose use raised is deleted from the backend if it still holds the
  value this process was served, and never taken again by this process.
- **Forks**: a child gets its own queue, threads and connections; the parent's are its own.
- **Single flight across machines** (:mod:`.flight`), for backends that make leases.

Counters go to the store's counters under each entry's kind, named ``remote_*`` (see
:data:`COUNTERS`), so ``kcache stats`` shows them.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from ...boundary import failed as report_bug
from ...boundary import strict
from ...counters import Counters
from ...log import logger, warn_once
from ..api import Tier
from ..records import Record
from . import flight as _flight
from . import lease as rl
from .backend import Answered, Backend, Full, TierConfig, TooLarge, Unavailable
from .bounded import bounded
from .breaker import Breaker, Breakers, Budget, Streak
from .core import FAIL, Failed
from .entry import Refused, eligible, unpack_entry
from .writer import Writer

T = TypeVar("T")

BREAKER_FAILURES = 3  # failures within BREAKER_WINDOW_S that turn a node off for a while
BREAKER_WINDOW_S = 10.0
BREAKER_COOLDOWN_S = 30.0  # then one call probes it; the whole tier's cool-down too
NODE_COOLDOWN_S = 1.0  # a cluster's node: its first cool-down (a failover takes 1 to 3 s); doubles
BUDGET_CALLS = 5  # deadlines' worth of failed calls per cool-down, in all, before the whole tier is
# skipped (0.5 s at the default KCACHE_REMOTE_TIMEOUT of 100 ms)
ANSWERS_IN_A_ROW = 20  # error answers with no success between them that turn the whole tier off
TRANSFER_S_PER_MIB = 1 / 32  # a value's read or write may take this much longer per MiB (32 MiB/s)
SMALL_REPLY = 64 << 10  # the most a call that reads no value may read
BAD_REMEMBERED = 4096  # (entry, value version) pairs this process refuses after mark_bad
SERVED_REMEMBERED = 4096  # versions of values taken from the tier, kept for mark_bad

#: Counter names, per kind (in the store's counters, so ``kcache stats`` shows them).
COUNTERS = (
    "remote_hits",  # entries taken from the tier (committed locally)
    "remote_misses",  # lookups the tier did not have
    "remote_puts",  # entries written to the tier (confirmed)
    "remote_bytes_in",
    "remote_bytes_out",
    "remote_errors",  # calls that failed (timeouts, deadlines, connection, full, ...)
    "remote_refused",  # entries read but refused: checksum, record, signature, marked bad
    "remote_dropped",  # entries not written: queue full, tier off, exit bound reached
    "remote_too_large",  # entries over KCACHE_REMOTE_MAX_ENTRY: kept local, or never read
    "remote_bypassed",  # lookups skipped while a breaker or the budget keeps the tier off
    "remote_waited",  # single flight: entries another machine compiled while this one waited
    "remote_ignored",  # single flight: leases not waited on (foreign, no expiry, forged, ...)
    "remote_wait_s",  # single flight: seconds waited on other machines' leases
    "remote_fruitless_s",  # of which charged as fruitless (see lease.FruitlessBudget)
    "remote_marked_bad",  # entries whose use raised, deleted from the tier
    "remote_s",  # seconds spent on calls to the tier on the caller's thread (not waits)
)


class Recent:
    """A bounded map of recent keys, oldest dropped first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._d: collections.OrderedDict[Hashable, str | bool] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, k: Hashable, v: str | bool = True) -> None:
        with self._lock:
            self._d[k] = v
            self._d.move_to_end(k)
            while len(self._d) > self.limit:
                self._d.popitem(last=False)

    def get(self, k: Hashable) -> str | bool | None:
        with self._lock:
            return self._d.get(k)


class SharedTier(Tier):
    """The shared tier of one store in one process, over ``backend``. Never raises into its
    callers for a failure of the backend (the :class:`~kcache.store.api.Tier` face)."""

    def __init__(self, backend: Backend, counts: Counters | None) -> None:
        self.backend = backend
        self.counts: Counters = counts if counts is not None else Counters()
        self.off = False  # for good: the client library is missing, or refuses the settings
        self._reset()

    @property
    def cfg(self) -> TierConfig:
        return self.backend.cfg

    def _reset(self) -> None:
        """Fresh state for this process (at start, and in a forked child: the parent's queue,
        leases, threads and sockets are the parent's)."""
        self._pid = os.getpid()
        self._opened = False
        self._open_lock = threading.Lock()
        self._closing = False
        node_s = NODE_COOLDOWN_S if self._has_nodes() else BREAKER_COOLDOWN_S
        self.breakers = Breakers(BREAKER_FAILURES, BREAKER_WINDOW_S, BREAKER_COOLDOWN_S, node_s)
        # The lease keeper's heartbeats have breakers of their own: a heartbeat that fails (a
        # batch of renewals on a slow link) must not turn lookups off, nor a lookup's failure
        # stop the heartbeats of leases other machines wait on.
        self.keeper_breakers = Breakers(BREAKER_FAILURES, BREAKER_WINDOW_S, BREAKER_COOLDOWN_S, node_s)
        self.budget = Budget(BUDGET_CALLS * self.cfg.timeout_s, BREAKER_COOLDOWN_S, BREAKER_COOLDOWN_S)
        self.answers = Streak(ANSWERS_IN_A_ROW, BREAKER_COOLDOWN_S)
        self.fruitless = rl.FruitlessBudget()
        self.keeper = rl.LockKeeper(self.cfg.secret, self.cfg.lease_s, self._renew, split=self._split_leases)
        self.writer = Writer(self)
        self.served = Recent(SERVED_REMEMBERED)  # entry id -> version of the value taken
        self.bad = Recent(BAD_REMEMBERED)  # (entry id, version) refused from now on

    def _has_nodes(self) -> bool:
        return bool(self.backend.describe().get("mode") == "cluster")

    def _mine(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    # ------------------------------------------------------------------ what it is
    def describe(self) -> dict[str, Any]:
        """What this tier is and how it fares in this process (no network; no secret): the
        backend's own description, the URL (a password masked), and each breaker that has seen a
        failure (a cluster's: by node) and the budget. ``kcache remote`` asks the backend itself
        (:meth:`~.backend.Backend.survey`)."""
        out: dict[str, Any] = {"name": self.backend.name, "mode": "server"}
        out.update(self.backend.describe())
        out.update(
            url=self.cfg.shown_url,
            prefix=self.cfg.prefix,
            signed=bool(self.cfg.secret),
            leases=self.backend.leases,
            off=self.off,
            breakers=self.breakers.states(),
            lease_breakers=self.keeper_breakers.states(),
            budget=self.budget.state(),
            answers=self.answers.state(),
        )
        return out

    # ------------------------------------------------------------------ opening
    def warm_up(self) -> None:
        """Import the client library and make the clients now, at attach, for a store that holds
        nothing (it will ask the tier at once): part of the process's start, not of its first
        compile. On the caller's thread. No network call. Never raises."""
        self.ready()

    def ready(self) -> bool:
        """The backend is open (once per process); False when it cannot be (off for good, one
        warning) or the tier is closing."""
        if self.off or self._closing:  # closed: no call connects again (a lookup racing the exit)
            return False
        if not self._opened:
            with self._open_lock:  # the writer and keeper threads may get here at once
                if not self._opened and not self.off:
                    self._open()
        return self._opened and not self.off

    def _open(self) -> None:
        try:
            self.backend.open()
            self._opened = True
            if self.backend.wants_upkeep():  # (S3's credentials that expire: refreshed by the writer)
                self.writer.start_upkeep()
        except ImportError as e:
            self.off = True
            extra = self.backend.extra
            how = f" (pip install 'kcache[{extra}]')" if extra else ""
            warn_once(
                "remote-no-client",
                f"KCACHE_REMOTE is set but the {self.backend.name or 'backend'}'s client library is "
                f"not installed{how}: {e}; the shared tier is off, local caching goes on",
            )
        except (ValueError, TypeError, OSError, Unavailable) as e:  # settings the client library refuses
            self.off = True
            warn_once(
                "remote-config", f"cannot use KCACHE_REMOTE={self.cfg.shown_url} ({e}); shared tier off"
            )
        except Exception as e:  # broad: what kcache's own backend did not expect is a bug (raised
            # under KCACHE_STRICT=1); the tier is off for good all the same, never local caching. (A
            # client library's refusals are ValueError by then; a user's class: .foreign.)
            self.off = True
            report_bug(
                "remote-open", f"opening the shared tier at {self.cfg.shown_url}", e,
                then="the shared tier is off, local caching goes on",
            )  # fmt: skip

    # ------------------------------------------------------------------ calls
    def transfer_s(self, nbytes: int, floor: float | None = None) -> float:
        """The deadline of a call that moves ``nbytes`` of values."""
        return max(self.cfg.timeout_s, floor or 0.0) + nbytes / (1 << 20) * TRANSFER_S_PER_MIB

    def call(
        self,
        kind: str,
        fn: Callable[[], T],
        *,
        ident: str = "",
        seconds: float | None = None,
        max_bytes: int = SMALL_REPLY,
        timed: bool = True,
        caller: bool = True,
    ) -> T | Failed:
        """``fn()`` (a backend operation on entry ``ident``), ending within ``seconds`` (default:
        the timeout) and reading at most ``max_bytes``; :data:`FAIL` when it fails or is skipped
        (a breaker or the budget; counted, one warning). ``timed``: its time counts as
        ``remote_s`` (not the looks of a single-flight wait, which count as waiting); ``caller``:
        on a program's thread, so its failed time is charged to the budget and its failures to
        the breakers that gate lookups (not the lease keeper's: those have their own)."""
        self._mine()
        if not self.ready():
            return FAIL
        breaker = self.admit(ident, breakers=None if caller else self.keeper_breakers)
        if breaker is None:
            self._count(kind, remote_bypassed=1)
            return FAIL
        t0 = time.perf_counter()
        try:
            with bounded(self.cfg.timeout_s if seconds is None else seconds, max_bytes):
                out = fn()
        except Exception as e:  # broad: any failure of the call is a miss (_call_failed sorts them)
            self._call_failed(kind, e, breaker, self._timed(kind, timed, t0), caller)
            return FAIL
        self._timed(kind, timed, t0)
        self.succeeded(breaker)
        return out

    def _call_failed(self, kind: str, e: Exception, breaker: Breaker, took: float, caller: bool) -> None:
        """Count and tell what :meth:`call`'s ``e`` says of the server (see :meth:`call`)."""
        if self._closing:
            # The store is closing (the program's exit): the call was cut off by the close of its
            # connections (redis-py reads a closed connection's buffer: an AttributeError), or
            # raced it. That is not the server's failure nor a backend's bug: nothing to count,
            # no breaker to tell, no warning at the exit.
            return
        if isinstance(e, Answered):  # an error about one key (a planted key of another type), or every key's
            self._count(kind, remote_refused=1)
            self.answered(e, breaker, took=took if caller else 0.0)
            return
        if not isinstance(e, (Unavailable, Full, OSError)):
            # broad: a backend's bug (a user's class is foreign code): a miss, said once
            if strict():
                raise e
            warn_once(
                f"remote-bug:{type(e).__name__}", f"the shared tier's backend raised {type(e).__name__}: {e}"
            )
        self.failed(kind, e, breaker=breaker, took=took if caller else 0.0, keeper=not caller)

    def _timed(self, kind: str, timed: bool, t0: float) -> float:
        took = time.perf_counter() - t0
        if timed:
            self._count(kind, remote_s=took)
        return took

    def admit(self, ident: str, writer: bool = False, breakers: Breakers | None = None) -> Breaker | None:
        """The breaker (of ``breakers``: default, those that gate lookups and writes) of a call
        about ``ident`` that may go ahead, or None (skip it: the whole tier is over its budget,
        or the node's breaker is open). On a cluster, a call whose
        node's breaker is open first has the backend ask for the slots again (at most once a
        second): a replica that took over a dead master's slots is used at once, not after the
        dead node's cool-down."""
        if not self.budget.allow() or not self.answers.allow():
            return None
        breakers = breakers or self.breakers
        node = self.backend.node_of(ident, writer) if ident else ""
        breaker = breakers.get(node)
        if breaker.allow():
            return breaker
        if not breaker.name:
            return None
        try:
            with bounded(self.cfg.timeout_s):
                if not self.backend.refresh():
                    return None
        except (Unavailable, Answered, Full, OSError) as e:  # no node answers: the breaker stays
            logger.debug("kcache: shared tier: asking where entries live: %s", e)
            return None
        breaker = breakers.get(self.backend.node_of(ident, writer))
        return breaker if breaker.allow() else None

    def succeeded(self, breaker: Breaker) -> None:
        """A call (or a batch of writes) that the backend did: its node answers, and the tier
        does not answer only errors."""
        self.answers.ok()
        breaker.ok()

    def answered(self, e: BaseException, breaker: Breaker | None = None, took: float = 0.0) -> None:
        """A call the backend answered with an error (:class:`~.backend.Answered`): about one key
        (a planted key of another type), or, when every request gets one, about this process's
        access (credentials, a policy, the region). No verdict on the node (its breaker is not
        closed by it); its ``took`` seconds are charged to the budget all the same (a server that
        answers errors slowly costs what one that fails does); :data:`ANSWERS_IN_A_ROW` in a row
        with no success turn the tier off for a cool-down at a time, with one warning."""
        (breaker or self.breakers.get()).answered()
        self._charge(took, e)
        text = str(e)
        if text.startswith(("MOVED ", "ASK ")) or "MovedError" in type(e).__name__:
            warn_once(
                "remote-moved",
                f"the shared tier at {self.cfg.shown_url} is a Redis Cluster node, which has only "
                "some of the keys: name its nodes as KCACHE_REMOTE=redis+cluster://host:port,... "
                "(docs/remote.md)",
            )
        if self.answers.answered():
            warn_once(
                "remote-answers",
                f"the shared tier at {self.cfg.shown_url} answered {self.answers.limit} requests in a "
                f"row with an error ({text[:200]}), none with a success: credentials? permissions "
                f"(a policy, an ACL)? region? Skipping it for {self.answers.cooldown_s:.0f} s at a "
                "time, compiling and caching locally",
            )
        else:
            logger.info("kcache: the shared tier answered an error: %s", e)

    def _charge(self, took: float, e: BaseException) -> None:
        """Charge a call's ``took`` seconds to the budget (one warning when that turns it off)."""
        if self.budget.charge(took):
            warn_once(
                "remote-budget",
                f"calls to the shared tier at {self.cfg.shown_url} that failed have cost this "
                f"process {self.budget.limit_s:.1f} s ({type(e).__name__}: {e}); skipping it for "
                f"{self.budget.cooldown_s:.0f} s at a time, compiling and caching locally",
            )

    def _count(self, kind: str, **deltas: float) -> None:
        if kind:  # the lease keeper's calls belong to no kind
            self.counts.add(kind, **deltas)

    def failed(
        self,
        kind: str,
        e: BaseException,
        n: int = 1,
        breaker: Breaker | None = None,
        took: float = 0.0,
        keeper: bool = False,
    ) -> None:
        """Count a failed call (``n`` errors of ``kind``), tell its node's breaker (``keeper``:
        one of the lease keeper's), charge the budget ``took`` seconds, and warn once per cause."""
        if n:
            self._count(kind, remote_errors=n)
        name = type(e).__name__
        if isinstance(e, Full):
            if breaker is not None:
                breaker.answered()  # the node answers (a probe ends; no verdict)
            warn_once(
                "remote-full",
                f"the shared tier at {self.cfg.shown_url} is full ({e}); new entries stay local "
                "(docs/remote.md: an eviction policy, or a lifecycle rule)",
            )
            return  # reads still work: not a reason to stop asking
        self._charge(took, e)
        if breaker is None:
            breaker = self.breakers.get()
        opened = breaker.fail()
        if opened and keeper:
            warn_once(
                "remote-lease-down",
                f"renewing this process's single-flight leases in the shared tier at "
                f"{self.cfg.shown_url} fails ({name}: {e}); other machines may compile what this "
                f"one compiles; trying again in {breaker.cooldown:.0f} s",
            )
        elif opened and breaker.name:  # a cluster's node
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
        """The entry from the tier, checked (record, members), or None: missing, refused, too
        large (never read), or the call failed."""
        if self.off or not eligible(kind, self.cfg.secret):
            return None
        size = self.call(kind, lambda: self.backend.size(kind, ident), ident=ident)
        if isinstance(size, Failed):
            return None
        if not size:
            self.counts.add(kind, remote_misses=1)
            return None
        return self.read_value(kind, key, ident, size)

    def read_value(
        self, kind: str, key: str, ident: str, size: int
    ) -> tuple[Record, dict[str, bytes]] | None:
        """Read a value the backend says is ``size`` bytes (never more than the bound, whatever
        it holds by then) and check it."""
        limit = self.cfg.value_limit
        if size > limit:
            self._too_large(kind, size)
            return None

        def read() -> tuple[bytes, str] | None | TooLarge:
            try:
                return self.backend.read(kind, ident, size, limit)
            except TooLarge as e:  # it grew past the bound since its size was asked
                return e

        got = self.call(kind, read, ident=ident, seconds=self.transfer_s(size), max_bytes=limit + 4096)
        if isinstance(got, TooLarge):
            self._too_large(kind, got.size)
            return None
        if isinstance(got, Failed) or got is None or not got[0]:
            return None
        return self._check(kind, key, ident, *got)

    def _too_large(self, kind: str, size: int) -> None:
        self.counts.add(kind, remote_too_large=1)
        warn_once(
            "remote-too-large",
            f"not reading a {kind} entry of {size} bytes from the shared tier at "
            f"{self.cfg.shown_url} (over KCACHE_REMOTE_MAX_ENTRY); compiling instead",
        )

    def _check(
        self, kind: str, key: str, ident: str, raw: bytes, version: str
    ) -> tuple[Record, dict[str, bytes]] | None:
        try:
            if self.bad.get((ident, version)):
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
        self.served.put(ident, version)
        self.counts.add(kind, remote_hits=1, remote_bytes_in=len(raw))
        return rec, blobs

    # ------------------------------------------------------------------ bad entries
    def mark_bad(self, kind: str, ident: str) -> bool:
        """An entry whose use raised (:mod:`kcache.store.quarantine` calls this): never take it
        again in this process, and delete it from the tier if the tier still holds the value
        this process was served (or, for an entry this process did not take from the tier,
        whatever it holds: it was published from a store whose copy failed). Queued for the
        writer, ahead of the entry compiled instead; never waits, never raises. True when queued."""
        self._mine()
        version = self.served.get(ident)
        if isinstance(version, str):
            self.bad.put((ident, version))
        if self.off or not eligible(kind, self.cfg.secret) or not self.ready():
            return False
        self.writer.enqueue_delete(kind, ident, version if isinstance(version, str) else None)
        return True

    # ------------------------------------------------------------------ writing
    def publish(self, rec: Record, blobs: dict[str, bytes]) -> None:
        """After a local put: queue the entry for the tier (never waits; dropped and counted when
        the queue is full). A lease held for it is released right after its write."""
        self._mine()
        if self.off or not eligible(rec.kind, self.cfg.secret):
            self.unlock(rec.id)
            return
        if not self.ready():
            return  # opened here, not in the writer: importing there can race the exit
        release = self.keeper.releasing(rec.id)
        if rec.size > self.cfg.max_entry:
            self.counts.add(rec.kind, remote_too_large=1)
            if release:
                self.writer.enqueue_release(rec.kind, rec.id, release)
            return
        self.writer.enqueue_put(rec, blobs, release)

    def unlock(self, ident: str) -> None:
        """Release the lease this process holds for ``ident`` (if any), soon."""
        self._mine()
        release = self.keeper.releasing(ident)
        if release:
            self.writer.enqueue_release("", ident, release)

    def exit_flush_s(self) -> float:
        """How long close (at exit) waits for the writer (see :meth:`.writer.Writer.exit_flush_s`)."""
        return self.writer.exit_flush_s()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the queue is written (at most ``timeout`` s); True when it is."""
        self._mine()
        return self.writer.flush(self.writer.exit_flush_s() if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush within ``timeout`` seconds (:meth:`exit_flush_s`), then stop: what is left is
        dropped and counted; connections closed."""
        if self._pid != os.getpid():
            return  # a forked child's inherited tier: the parent writes its own queue
        self.writer.flush(self.exit_flush_s() if timeout is None else timeout)
        self.keeper.close()
        self._closing = True
        self.writer.close()
        if self._opened:
            self.backend.close()

    # ------------------------------------------------------------------ single flight
    def flight(self, kind: str, key: str, ident: str) -> tuple[Record, dict[str, bytes]] | None:
        """Single flight across machines (see :mod:`.flight`), after this process took the local
        lock and the entry is in neither tier: the entry another machine made meanwhile, or None
        (make it here, holding the lease when it could be taken)."""
        if (
            self.off
            or not self.backend.leases
            or self.cfg.lease_s <= 0
            or not eligible(kind, self.cfg.secret)
        ):
            return None
        self._mine()
        return _flight.fly(self, kind, key, ident)

    def _renew(self, batch: list[tuple[str, bytes, bytes]]) -> list[Any] | None:
        ttl = max(1, int(rl.LOCK_TTL_S * 1000))
        ident = batch[0][0] if batch else ""
        res = self.call("", lambda: self.backend.lease_renew(batch, ttl), ident=ident, caller=False)
        return None if isinstance(res, Failed) else res

    def _split_leases(self, items: list[tuple[str, bytes, bytes]]) -> list[list[tuple[str, bytes, bytes]]]:
        if not items or not self.ready():
            return [items] if items else []
        return self.backend.split(items, lambda it: it[0])
