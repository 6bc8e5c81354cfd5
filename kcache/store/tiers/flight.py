"""Single flight across machines, for any backend that makes leases (:mod:`.lease` says what a
lease holds and when it is waited on).

After a local miss, with this machine's lock held and the entry in no tier, the process takes the
entry's lease if it is free (and compiles, its lease kept alive by the keeper's heartbeats); or
waits, looking at the backend its ``poll_s`` apart (10 to 100 ms for Redis), while the holder's
lease shows progress (:class:`.lease.Watch`), for the entry to appear. A lease that is not waited
on (foreign, no expiry, forged, stale) is replaced by this process's own (compared and set by the
backend), so that other machines wait on this compile instead of each compiling too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ...log import warn_once
from . import lease as rl
from .backend import LeaseView

if TYPE_CHECKING:
    from ..records import Record
    from .core import Core

#: How a warning names a lease that is not waited on.
WHY = {
    "foreign": "that is not kcache's",
    "no-expiry": "with no expiry",
    "long-expiry": "with an expiry longer than any kcache lock's",
    "unsigned": "without a signature (KCACHE_SECRET is set)",
    "forged": "whose signature does not match KCACHE_SECRET",
    "replayed": f"signed more than {rl.FRESH_S:.0f} s from this clock's time (replayed, or a clock off)",
}


def _take(tier: Core, kind: str, ident: str, holder: str, timed: bool = True) -> LeaseView | None:
    """Take the lease if free (then it is ours: kept alive), and what is there now."""
    value = tier.keeper.value(ident, holder)
    ttl = max(1, int(rl.LOCK_TTL_S * 1000))
    res = tier.call(kind, lambda: tier.backend.lease_take(kind, ident, value, ttl), ident=ident, timed=timed)
    if not isinstance(res, LeaseView):
        return None
    if res.taken:
        tier.keeper.hold(ident, holder)
    return res


def _look(tier: Core, kind: str, ident: str) -> LeaseView | None:
    res = tier.call(kind, lambda: tier.backend.lease_look(kind, ident), ident=ident, timed=False)
    return res if isinstance(res, LeaseView) else None


def fly(tier: Core, kind: str, key: str, ident: str) -> tuple[Record, dict[str, bytes]] | None:
    """The entry (record, members) another machine compiled, or None (compile here)."""
    holder = rl.new_holder()
    got = _take(tier, kind, ident, holder)
    if got is None:
        return None
    if got.entry_size:  # it landed between our lookup and the lease
        entry = tier.read_value(kind, key, ident, got.entry_size)
        if entry is not None:
            tier.unlock(ident)
            return entry
    if got.taken:
        return None  # ours: compile here
    watch = rl.Watch(ident, tier.cfg.secret, tier.cfg.lease_s, tier.fruitless, time.monotonic())
    raw, ttl = got.value, got.ttl_ms
    delay, longest = tier.backend.poll_s
    why: str | None
    while True:
        now = time.monotonic()
        why = watch.see(raw, ttl, now, int(time.time() * 1000))
        if why == "gone":  # the holder let go, or its lease expired: take it, or wait on the next
            why = watch.over(now)  # the lease and the budget bound a wait, lease or no lease
            if why is not None:
                break
            got = _take(tier, kind, ident, holder, timed=False)
            if got is None:
                why = "error"
                break
            raw, ttl = got.value, got.ttl_ms
            if got.entry_size:
                entry = tier.read_value(kind, key, ident, got.entry_size)
                if entry is not None:
                    tier.unlock(ident)
                    _waited(tier, kind, watch, entry=True)
                    return entry
            if got.taken:
                why = "taken"
                break
            if raw is None:  # free, and not ours: the backend refuses the write (full, a replica)
                why = "refused"
                break
            continue  # someone else took it: judge that lease
        if why is not None:
            break
        time.sleep(max(0.0, min(delay, watch.time_left(time.monotonic()))))
        delay = min(delay * 1.5, longest)
        got = _look(tier, kind, ident)
        if got is None:
            why = "error"
            break
        raw, ttl = got.value, got.ttl_ms
        if got.entry_size:
            entry = tier.read_value(kind, key, ident, got.entry_size)
            if entry is not None:
                _waited(tier, kind, watch, entry=True)
                return entry
            why = "refused"
            break
    _waited(tier, kind, watch, entry=False, why=why)
    if why in rl.TAKEN_OVER and raw is not None:
        _take_over(tier, kind, ident, holder, raw)
    return None


def _waited(tier: Core, kind: str, watch: rl.Watch, *, entry: bool, why: str | None = None) -> None:
    """Count a wait that ended (with the entry, or why not), and charge a fruitless one."""
    now = time.monotonic()
    waited = watch.elapsed(now)
    if entry:
        tier.counts.add(kind, remote_waited=1, remote_wait_s=waited)
        return
    fruitless = watch.fruitless(now)
    tier.fruitless.charge(fruitless)
    tier.counts.add(kind, remote_wait_s=waited, remote_fruitless_s=fruitless)
    if why in rl.NOT_WAITED:
        tier.counts.add(kind, remote_ignored=1)
        warn_once(
            f"remote-lock-{why}",
            f"not waiting on a single-flight lock {WHY[why]} in the shared tier at "
            f"{tier.cfg.shown_url}; compiling here",
        )
    elif why == "lease":
        warn_once(
            "remote-lock-lease",
            f"waited {tier.cfg.lease_s:.0f} s (KCACHE_REMOTE_LOCK_LEASE) for another machine "
            "compiling the same kernel; compiling here",
        )
    elif why == "budget" and tier.fruitless.left() <= 0:
        warn_once(
            "remote-lock-budget",
            f"waits on other machines' locks that brought nothing have cost this process "
            f"{tier.fruitless.spent:.1f} s; not waiting on unproven locks any more "
            "(set KCACHE_SECRET to follow signed heartbeats)",
        )


def _take_over(tier: Core, kind: str, ident: str, holder: str, seen: bytes) -> None:
    """Replace a lease that was not waited on (still exactly ``seen``) by ours."""
    if seen == rl.WRONG_TYPE:
        return
    value = tier.keeper.value(ident, holder)
    ttl = max(1, int(rl.LOCK_TTL_S * 1000))
    res = tier.call(kind, lambda: tier.backend.lease_replace(ident, seen, value, ttl), ident=ident)
    if res is True:
        tier.keeper.hold(ident, holder)
