"""Circuit breakers of the shared tier, and its budget: after a few failed calls, stop asking.

A breaker is per node: after :attr:`Breaker.failures` failed calls the node is skipped for a
while. The :class:`Budget` is per tier: the wall time this process's threads spent in calls that
failed, on any node, within a window; past its limit the whole tier is skipped for the cool-down.
Without it, each node of a cluster paid its own breaker's failures: a slot map naming 300 silent
masters cost 150 lookups 15.5 s (issue 34). With it, a process spends at most the budget (plus
the one call each thread had under way) per cool-down, however many nodes there are.

The :class:`Streak` is per tier too: error answers in a row (a server that refuses every request
answers fast, and no breaker sees a failure), past its limit the whole tier is skipped as well.

A single server has one breaker. A cluster has one per node (by address): a master that fails
turns off only the keys of its slots, and once a replica has taken over them (a failover: 1 to
3 s with ``cluster-node-timeout 1000``) they map to another node, whose breaker is closed. A
node's breaker opens for a short while at first and for twice as long after each probe that
fails, up to the single server's cool-down: a failover costs a few skipped lookups, a node that
is gone for good one probe per half minute.
"""

from __future__ import annotations

import collections
import threading
import time

from ...log import logger

NODES_KEPT = 1024  # breakers of a cluster kept (a topology can name any number of addresses)


class Breaker:
    """Closed (calls go through) until ``failures`` failures within ``window_s`` (successes
    between them do not reset the count: a link that answers small calls but cuts every large
    one must not be asked forever); then open for ``cooldown_s``; then one call at a time probes
    it (success closes it; a failed probe opens it for twice as long, at most ``max_cooldown_s``)."""

    def __init__(
        self,
        failures: int,
        window_s: float,
        cooldown_s: float,
        max_cooldown_s: float | None = None,
        name: str = "",
    ) -> None:
        self.failures, self.window_s, self.name = failures, window_s, name
        self.first_cooldown = cooldown_s
        self.max_cooldown = max(cooldown_s, max_cooldown_s or cooldown_s)
        self.cooldown = cooldown_s
        self._lock = threading.Lock()
        self._recent: collections.deque[float] = collections.deque()  # times of recent failures
        self.open_until = 0.0
        self._open = False
        self._probing = False
        self.trips = 0

    @property
    def is_open(self) -> bool:
        return self._open

    def allow(self) -> bool:
        with self._lock:
            if not self._open:
                return True
            now = time.monotonic()
            if now < self.open_until or self._probing:
                return False
            self._probing = True  # one probe; the others keep skipping until it answers
            return True

    def ok(self) -> None:
        with self._lock:
            if self._open:
                logger.info("kcache: the shared tier answers again%s", f" ({self.name})" if self.name else "")
                self._recent.clear()
            self._open = self._probing = False
            self.cooldown = self.first_cooldown

    def answered(self) -> None:
        """The call got an error answer (about one key, or every request: :class:`Streak`): no
        verdict on the node. Not :meth:`ok`, which would close an open breaker for a server that
        answers only errors; a probe ends, and the next call probes again."""
        with self._lock:
            self._probing = False

    def fail(self) -> bool:
        """Count a failure; True when this one opened the breaker."""
        with self._lock:
            now = time.monotonic()
            probe = self._probing
            self._probing = False
            self._recent.append(now)
            while self._recent and now - self._recent[0] > self.window_s:
                self._recent.popleft()
            if self._open or len(self._recent) >= self.failures:
                opened = not self._open
                if probe:
                    self.cooldown = min(self.cooldown * 2, self.max_cooldown)
                self._open = True
                self.open_until = now + self.cooldown
                self.trips += opened
                return opened
            return False


class Breakers:
    """The breakers of one tier, by node name: "" for a single server, and for a cluster whose
    client could not be made (no node answers: ``cooldown_s``); a cluster's nodes open for
    ``node_cooldown_s`` first, doubling up to ``cooldown_s``."""

    def __init__(self, failures: int, window_s: float, cooldown_s: float, node_cooldown_s: float) -> None:
        self._args = (failures, window_s, cooldown_s, node_cooldown_s)
        self._lock = threading.Lock()
        self._by_name: collections.OrderedDict[str, Breaker] = collections.OrderedDict()

    def get(self, name: str = "") -> Breaker:
        with self._lock:
            b = self._by_name.get(name)
            if b is None:
                failures, window_s, cooldown_s, node_s = self._args
                first = node_s if name else cooldown_s
                b = self._by_name[name] = Breaker(failures, window_s, first, cooldown_s, name=name)
                while len(self._by_name) > NODES_KEPT:
                    self._by_name.popitem(last=False)
            return b

    def states(self) -> dict[str, dict[str, float | int | bool]]:
        """Each breaker that has opened: {name ("" a single server): {open, trips, cooldown_s}}."""
        with self._lock:
            seen = [b for b in self._by_name.values() if b.trips]
        return {b.name: {"open": b.is_open, "trips": b.trips, "cooldown_s": b.cooldown} for b in seen}


class Budget:
    """Seconds of failed calls this process may spend on the tier within ``window_s``: past
    ``limit_s`` the whole tier is skipped for ``cooldown_s`` (then the window starts afresh).
    Fast failures (a refused connection: a dead master) cost next to nothing and never trip it;
    calls that hang until their deadline do."""

    def __init__(self, limit_s: float, window_s: float, cooldown_s: float) -> None:
        self.limit_s, self.window_s, self.cooldown_s = limit_s, window_s, cooldown_s
        self._lock = threading.Lock()
        self._spent: collections.deque[tuple[float, float]] = collections.deque()  # (when, seconds)
        self.open_until = 0.0
        self.trips = 0
        self.charged = 0.0  # in all, for reports

    def allow(self) -> bool:
        """Whether calls may go to the tier now."""
        if not self.open_until:
            return True
        with self._lock:
            if time.monotonic() < self.open_until:
                return False
            self.open_until = 0.0
            self._spent.clear()
            return True

    def spent(self) -> float:
        """Seconds of failed calls within the window, now."""
        with self._lock:
            self._expire(time.monotonic())
            return sum(s for _t, s in self._spent)

    def _expire(self, now: float) -> None:
        while self._spent and now - self._spent[0][0] > self.window_s:
            self._spent.popleft()

    def charge(self, seconds: float) -> bool:
        """Add a failed call's ``seconds``; True when this closed the tier."""
        if seconds <= 0:
            return False
        with self._lock:
            now = time.monotonic()
            self.charged += seconds
            self._expire(now)
            self._spent.append((now, seconds))
            if self.open_until or sum(s for _t, s in self._spent) < self.limit_s:
                return False
            self.open_until = now + self.cooldown_s
            self.trips += 1
            return True

    def state(self) -> dict[str, float | int | bool]:
        return {
            "open": bool(self.open_until) and time.monotonic() < self.open_until,
            "trips": self.trips,
            "spent_s": round(self.charged, 3),
            "limit_s": self.limit_s,
        }


class Streak:
    """Error answers in a row across the tier, with no success between them: after ``limit`` the
    whole tier is skipped for ``cooldown_s``; then calls go again, and the next error answer
    before any success skips it again. A server that answers every request with an error (expired
    or wrong credentials, a policy that refuses, a proxy's error page) answers fast: the budget,
    which counts time, would let it be asked forever, and no breaker would ever open."""

    def __init__(self, limit: int, cooldown_s: float) -> None:
        self.limit, self.cooldown_s = limit, cooldown_s
        self._lock = threading.Lock()
        self.count = 0  # error answers since the last success
        self.open_until = 0.0
        self.trips = 0

    def allow(self) -> bool:
        """Whether calls may go to the tier now."""
        return not self.open_until or time.monotonic() >= self.open_until

    def ok(self) -> None:
        """A call that succeeded: the streak ends."""
        if self.count or self.open_until:  # (unlocked look: a success is the common case)
            with self._lock:
                self.count, self.open_until = 0, 0.0

    def answered(self) -> bool:
        """Count an error answer; True when this one turned the tier off."""
        with self._lock:
            self.count += 1
            now = time.monotonic()
            if self.count < self.limit or now < self.open_until:
                return False
            self.open_until = now + self.cooldown_s
            self.trips += 1
            return True

    def state(self) -> dict[str, float | int | bool]:
        return {
            "open": bool(self.open_until) and time.monotonic() < self.open_until,
            "trips": self.trips,
            "in_a_row": self.count,
        }
