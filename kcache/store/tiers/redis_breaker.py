"""Circuit breakers of the shared tier: after a few failed calls, stop asking for a while.

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
