"""The S3 backend's lease heartbeats at a far store's latency (review finding m-a).

S3 has no pipeline: renewing a process's leases is one ``PutObject`` (``If-Match``) per lease.
They were one call under one deadline (0.5 s), so 12 leases at 60 ms each passed it: every
heartbeat failed, the leases expired (other machines took over: duplicate compiles), and the
failures opened the breaker that gates lookups. Now each renewal is its own call (and each
write), and the keeper's failures have breakers of their own.

Against a small S3-speaking server of the tests (tests/answering_s3.py) that answers each
``PUT`` after 60 ms, as a store across a WAN would; no timing assertion: heartbeats counted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from answering_s3 import error
from tier_stores import counts

from kcache.store import Store
from kcache.store.tiers import shared

pytestmark = pytest.mark.usefixtures("no_descriptors_left", "stores_closed")
URL = "s3://bucket/p"
LEASES = 12


class FarBucket:
    """What the server holds: lease objects, written with the conditions S3 checks
    (``If-None-Match: *``, ``If-Match``), each ``PUT`` answered after ``put_s``; renewals (a
    ``PUT`` with ``If-Match``) answered ``renew_status`` (503: the store fails them)."""

    def __init__(self, put_s: float = 0.06, renew_status: int = 200) -> None:
        self.put_s, self.renew_status = put_s, renew_status
        self.objects: dict[str, int] = {}  # path -> its version
        self.renewals = 0
        self.lookups = 0
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, headers: Any) -> tuple[int, dict[str, str], bytes] | None:
        if method == "GET":
            if "e/triton/" in path:
                with self._lock:
                    self.lookups += 1
            return None  # no entry; a lease is not read back here
        if method != "PUT":
            return 200, {}, b""
        time.sleep(self.put_s)
        with self._lock:
            version = self.objects.get(path)
            if headers.get("If-None-Match") == "*" and version is not None:
                return error(412, "PreconditionFailed")
            if headers.get("If-Match"):
                self.renewals += 1
                if self.renew_status != 200:
                    return error(self.renew_status, "SlowDown")
                if headers["If-Match"] != f'"v{version}"':
                    return error(412, "PreconditionFailed")
            self.objects[path] = (version or 0) + 1
            return 200, {"ETag": f'"v{self.objects[path]}"'}, b""


def hold_leases(store: Store, n: int) -> contextlib.ExitStack:
    """``n`` single flights of this store, each holding its entry's lease (kept by the keeper)."""
    stack = contextlib.ExitStack()
    for i in range(n):
        flight = stack.enter_context(store.single_flight("triton", f"K{i}"))
        assert flight is None
    return stack


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_dozen_leases_at_a_far_stores_latency_are_all_renewed(
    s3_answering, stores, kcache_warnings
) -> None:
    """12 renewals at 60 ms each: 0.72 s, past one call's 0.5 s, so before, every heartbeat failed
    (renewals written: 0) and after 3 the breaker turned lookups off for 30 s."""
    bucket = FarBucket()
    s3_answering(bucket)
    a = stores("a", URL, "kcache:", KCACHE_REMOTE_TIMEOUT="500ms")
    tier = a.tiers[0]
    with hold_leases(a, LEASES):
        assert len(bucket.objects) == LEASES
        assert wait_for(lambda: tier.keeper.renewals >= 3 * LEASES), (tier.keeper.renewals, tier.describe())
        lost = [i for i in range(LEASES) if tier.keeper.holder(a.entry_id("triton", f"K{i}")) is None]
        assert lost == [], lost
    assert tier.describe()["breakers"] == {} and tier.describe()["lease_breakers"] == {}, tier.describe()
    assert not any("fails" in m for m in kcache_warnings), kcache_warnings


def test_heartbeats_that_fail_do_not_turn_lookups_off(s3_answering, stores, kcache_warnings) -> None:
    """A store that refuses every renewal (503) while it answers lookups: the keeper's breaker
    opens, the lookups' stays closed and lookups go on. Before, 3 failed heartbeats opened the
    breaker that gates lookups: every lookup skipped for 30 s."""
    bucket = FarBucket(put_s=0.0, renew_status=503)
    s3_answering(bucket)
    a = stores("a", URL, "kcache:", KCACHE_REMOTE_TIMEOUT="500ms")
    tier = a.tiers[0]
    with hold_leases(a, 1):
        assert wait_for(lambda: bucket.renewals >= shared.BREAKER_FAILURES), bucket.renewals
        d = tier.describe
        assert wait_for(lambda: bool(d()["breakers"] or d().get("lease_breakers"))), d()  # one opened
        before = bucket.lookups
        for i in range(5):
            assert a.get("triton", f"L{i}") is None
        assert bucket.lookups == before + 5, (before, bucket.lookups)
        assert counts(a).get("remote_bypassed", 0) == 0, counts(a)
        assert tier.describe()["breakers"] == {}, tier.describe()
    said = [m for m in kcache_warnings if "fails" in m]
    assert len(said) == 1 and "renewing this process's single-flight leases" in said[0], said
