"""Single flight across machines: the lease a holder keeps alive, and the evidence a waiter needs.

Any backend that can make leases (:attr:`.backend.Backend.leases`: Redis, S3) keeps, for entry
``<id>``, one short ASCII value with an expiry (Redis: the key ``<prefix>l:{<id>}``; S3: the
object ``<prefix>l/<id>``)::

    kcl1 <holder> <seq> <t_ms> <sig>

``holder`` is 32 random hex digits of the process that took it, ``seq`` counts its heartbeats,
``t_ms`` is the holder's wall clock at that heartbeat, and ``sig`` is, with ``KCACHE_SECRET``, an
HMAC-SHA256 over the entry id and the other fields (``-`` without one). The holder creates it
only if there is none (Redis ``SET NX PX``; S3 ``PutObject`` with ``If-None-Match: *``) with an
expiry of :data:`LOCK_TTL_S`, and a :class:`LockKeeper` thread rewrites it every
:data:`HEARTBEAT_S` (``seq`` + 1, the expiry renewed) for at most the lease
(``KCACHE_REMOTE_LOCK_LEASE``); a holder that dies or hangs stops renewing and its lease is gone
:data:`LOCK_TTL_S` later. Renewing and releasing compare the holder first (the backend's compare
and set), so a process only ever renews or deletes its own lease.

A waiter (:class:`Watch`) waits only while the lease gives evidence that someone is at work:

- not waited on at all: a value that is not this format (*foreign*), one with no expiry or an
  expiry longer than :data:`LOCK_TTL_MAX_S`, and with ``KCACHE_SECRET`` a value that is unsigned,
  wrongly signed (*forged*) or whose time is more than :data:`FRESH_S` from this clock (a replay);
- stops when the value has not changed for :data:`STALE_S` (no heartbeat: the holder hangs, or
  someone keeps an old value alive), when the lease goes (then it takes the lease itself), and at
  the lease at the latest;
- a *fruitless* wait (one that ends without the entry) is charged to a budget of the process
  (:class:`FruitlessBudget`, :data:`FRUITLESS_BUDGET_S`); a wait that has not seen signed progress
  (a newer ``seq`` of the same holder, under ``KCACHE_SECRET``) ends when the budget would be
  spent, and once it is spent such leases are not waited on any more. Without a secret anyone
  who can write to the backend can fake heartbeats, so that budget is what bounds what planted
  leases can cost a process; with a secret only a real holder's signed heartbeats extend a wait.

The decisions here take plain values (bytes read, a time to live, clocks): no backend in this
module except the keeper, which is handed a function that renews a batch.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import trust as _trust

FORMAT = b"kcl1"
LOCK_DOMAIN = b"kcache-lock/1\0"
HEARTBEAT_S = 0.5  # a holder rewrites its lock this often
LOCK_TTL_S = 3.0  # each write's expiry: a holder that stops renewing loses its lock this soon
LOCK_TTL_MAX_S = 10.0  # a lock that claims to live longer than this is not kcache's: not waited on
STALE_S = 3.0  # a lock whose value has not changed this long shows no progress: stop waiting
FRESH_S = 30.0  # with a secret: a heartbeat this far from our clock is a replay (or a bad clock)
FRUITLESS_BUDGET_S = 1.5  # per process: seconds of waits that did not end with the entry
VALUE_MAX = 256  # bytes of a lock's value read (anything longer is not a kcache lock)

#: What a lease value that is not a value reads as (a Redis key of another type planted there):
#: never a lease, never replaced.
WRONG_TYPE = b"\0wrong type"

#: Why a wait ended without the entry (or never started). The first group are locks that are not
#: waited on; a takeover is tried for them (the value seen, compared and set by the backend,
#: replaced by ours).
NOT_WAITED = ("foreign", "no-expiry", "long-expiry", "unsigned", "forged", "replayed")
TAKEN_OVER = (*NOT_WAITED, "stale")


def new_holder() -> str:
    return os.urandom(16).hex()


def _sig(secret: bytes, ident: str, holder: str, seq: int, t_ms: int) -> str:
    return _trust.sign(secret, LOCK_DOMAIN, f"{ident} {holder} {seq} {t_ms}".encode()).hex()


def encode_lock(ident: str, holder: str, seq: int, secret: bytes | None, t_ms: int | None = None) -> bytes:
    """The value of ``ident``'s lock for ``holder`` at heartbeat ``seq``."""
    t = int(time.time() * 1000) if t_ms is None else t_ms
    sig = _sig(secret, ident, holder, seq, t) if secret else "-"
    return b"%s %s %d %d %s" % (FORMAT, holder.encode(), seq, t, sig.encode())


def holder_prefix(holder: str) -> bytes:
    """What a lock's value starts with while ``holder`` has it (compared by Lua)."""
    return FORMAT + b" " + holder.encode() + b" "


class LockValue:
    """A parsed lock value (not yet judged)."""

    __slots__ = ("holder", "seq", "t_ms", "sig")

    def __init__(self, holder: str, seq: int, t_ms: int, sig: str) -> None:
        self.holder, self.seq, self.t_ms, self.sig = holder, seq, t_ms, sig

    @classmethod
    def parse(cls, raw: bytes) -> LockValue | None:
        """None for anything that is not exactly this format."""
        if not isinstance(raw, bytes) or len(raw) > VALUE_MAX:
            return None
        parts = raw.split(b" ")
        if len(parts) != 5 or parts[0] != FORMAT:
            return None
        holder, seq, t_ms, sig = (p.decode("ascii", "replace") for p in parts[1:])
        if len(holder) != 32 or any(c not in "0123456789abcdef" for c in holder):
            return None
        if not (seq.isdigit() and t_ms.isdigit() and len(seq) <= 12 and len(t_ms) <= 16):
            return None
        if sig != "-" and (len(sig) != 64 or any(c not in "0123456789abcdef" for c in sig)):
            return None
        return cls(holder, int(seq), int(t_ms), sig)

    def signed_by(self, secret: bytes, ident: str) -> bool:
        body = f"{ident} {self.holder} {self.seq} {self.t_ms}".encode()
        return self.sig != "-" and _trust.verify(secret, LOCK_DOMAIN, body, self.sig)


def judge(
    raw: bytes, pttl_ms: int, ident: str, secret: bytes | None, wall_ms: int
) -> tuple[str | None, LockValue | None]:
    """(why the lock is not waited on, or None; the parsed value). ``pttl_ms`` is the lease's time to live in ms
    (-1: no expiry)."""
    if pttl_ms == -1:
        return "no-expiry", None
    if pttl_ms > LOCK_TTL_MAX_S * 1000:
        return "long-expiry", None
    v = LockValue.parse(raw)
    if v is None:
        return "foreign", None
    if secret:
        if v.sig == "-":
            return "unsigned", v
        if not v.signed_by(secret, ident):
            return "forged", v
        if abs(wall_ms - v.t_ms) > FRESH_S * 1000:
            return "replayed", v
    return None, v


class FruitlessBudget:
    """Seconds this process may still spend on waits that do not end with the entry."""

    def __init__(self, limit_s: float = FRUITLESS_BUDGET_S) -> None:
        self.limit = limit_s
        self.spent = 0.0
        self._lock = threading.Lock()

    def left(self) -> float:
        return max(0.0, self.limit - self.spent)

    def charge(self, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self.spent += seconds


class Watch:
    """One wait for another holder's lock: fed what each look at the backend saw, it says when to stop.

    ``see`` returns None (keep waiting) or the reason to stop: one of :data:`NOT_WAITED`, or
    ``gone`` (no lock now: try to take it), ``stale``, ``lease``, ``budget``."""

    def __init__(
        self, ident: str, secret: bytes | None, lease_s: float, budget: FruitlessBudget, now: float
    ) -> None:
        self.ident, self.secret, self.lease_s, self.budget = ident, secret, lease_s, budget
        self.start = now
        self._seen: bytes | None = None
        self._changed = now
        self._seqs: dict[str, int] = {}  # holder -> highest signed seq seen
        self.progress = False  # a signed heartbeat advanced during this wait

    def elapsed(self, now: float) -> float:
        return now - self.start

    def see(self, raw: bytes | None, pttl_ms: int, now: float, wall_ms: int) -> str | None:
        if raw is None or pttl_ms == -2:
            return "gone"
        why, v = judge(raw, pttl_ms, self.ident, self.secret, wall_ms)
        if why is not None:
            return why
        assert v is not None
        if raw != self._seen:
            self._seen, self._changed = raw, now
            if self.secret:
                last = self._seqs.get(v.holder)
                if last is not None and v.seq > last:
                    self.progress = True
                if last is None or v.seq > last:
                    self._seqs[v.holder] = v.seq
        elif now - self._changed >= STALE_S:
            return "stale"
        return self.over(now)

    def over(self, now: float) -> str | None:
        """``lease`` or ``budget`` when the wait has had its time, lock or no lock; else None."""
        if now - self.start >= self.lease_s:
            return "lease"
        if not self.progress and self.budget.spent + (now - self.start) >= self.budget.limit:
            return "budget"
        return None

    def time_left(self, now: float) -> float:
        """How long until :meth:`see` would stop on its own (to sleep no longer than that)."""
        t = min(self.lease_s - (now - self.start), STALE_S - (now - self._changed))
        if not self.progress:
            t = min(t, self.budget.limit - self.budget.spent - (now - self.start))
        return max(0.0, t)

    def fruitless(self, now: float) -> float:
        """The seconds to charge if the wait ends now without the entry: none when a holder's
        signed heartbeats advanced (a real holder that failed or died), else all of them."""
        return 0.0 if self.progress else now - self.start


class _Held:
    __slots__ = ("holder", "seq", "taken", "releasing")

    def __init__(self, holder: str, taken: float) -> None:
        self.holder, self.seq, self.taken, self.releasing = holder, 0, taken, False


class LockKeeper:
    """The leases this process holds, renewed by a thread every :data:`HEARTBEAT_S` for at most
    ``lease_s`` each. ``renew(batch)`` rewrites a batch of (ident, holder prefix, new value) with a
    fresh expiry, bounded in time, and returns each one's outcome (True: renewed; anything else:
    lost), or None when the call failed; ``split(items, ident_of)`` groups a batch by node (one
    call per node, so that a failing node holds up only its own leases). Never raises."""

    def __init__(
        self,
        secret: bytes | None,
        lease_s: float,
        renew: Callable[[list[tuple[str, bytes, bytes]]], list[Any] | None],
        split: Callable[[list[tuple[str, bytes, bytes]]], list[list[tuple[str, bytes, bytes]]]] | None = None,
    ) -> None:
        self._secret, self._lease, self._renew_batch = secret, lease_s, renew
        self._split = split or (lambda items: [items] if items else [])
        self._cond = threading.Condition(threading.Lock())
        self._held: dict[str, _Held] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self.renewals = 0  # heartbeats written (for tests and the chaos tool)

    def value(self, ident: str, holder: str, seq: int = 0) -> bytes:
        return encode_lock(ident, holder, seq, self._secret)

    def hold(self, ident: str, holder: str) -> None:
        """``holder`` (this process) has just taken ``ident``'s lock: keep it alive."""
        with self._cond:
            if self._closing:
                return
            self._held[ident] = _Held(holder, time.monotonic())
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kcache-remote-lock", daemon=True)
                self._thread.start()
            self._cond.notify()

    def holder(self, ident: str) -> str | None:
        with self._cond:
            h = self._held.get(ident)
            return h.holder if h is not None else None

    def releasing(self, ident: str) -> bytes | None:
        """The prefix that releases ``ident``'s lock, if held; it stays renewed until
        :meth:`forget` (the release is written by another thread, after the entry)."""
        with self._cond:
            h = self._held.get(ident)
            if h is None or h.releasing:
                return None
            h.releasing = True
            return holder_prefix(h.holder)

    def forget(self, ident: str) -> None:
        with self._cond:
            self._held.pop(ident, None)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._held.clear()
            self._cond.notify_all()

    def _due(self) -> list[tuple[str, bytes, bytes]]:
        """(ident, prefix, new value) of each lock to renew now; drops those past the lease."""
        now = time.monotonic()
        out = []
        for ident, h in list(self._held.items()):
            if now - h.taken >= self._lease:
                del self._held[ident]  # let it expire: the waiters stop at their lease too
                continue
            h.seq += 1
            out.append((ident, holder_prefix(h.holder), self.value(ident, h.holder, h.seq)))
        return out

    def _loop(self) -> None:
        pid = os.getpid()
        while os.getpid() == pid:
            with self._cond:
                if not self._held or self._closing:
                    self._thread = None
                    return
                self._cond.wait(HEARTBEAT_S)
                if self._closing:
                    self._thread = None
                    return
                due = self._due()
            for group in self._split(due):
                self._renew(group)

    def _renew(self, due: list[tuple[str, bytes, bytes]]) -> None:
        res = self._renew_batch(due)
        if res is None:
            return  # the backend does not answer: the leases may expire, and the waiters go on
        self.renewals += len(due)
        with self._cond:
            for (ident, _prefix, _value), ok in zip(due, res):
                h = self._held.get(ident)
                if ok is not True and h is not None and not h.releasing:
                    del self._held[ident]  # lost (expired, or taken over): stop renewing
