"""Stores attached to a shared tier, for the tests of the tier (tests/test_remote.py, the cluster
tests, the hostile-server tests): one copy of what each of them used to write."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kcache import config
from kcache.store import Store

# A store's deadline for each call to the tier, unless a test names its own. The tests of what is
# shared (an entry put by one store and got by another) use a long one: a loaded 2-core CI box
# once took more than the product's 100 ms for a lookup on a Redis Cluster, and that test was
# about hash slots, not speed. The tests of a slow, stopped or hostile server are about the
# deadline itself and pass DEADLINE, the product's default, by name.
SHARING_TIMEOUT = "5s"
DEADLINE = f"{config.DEFAULT_REMOTE_TIMEOUT_MS:g}ms"


def remote_settings(url: str, prefix: str, **env: str) -> config.Settings:
    s = config.load({"KCACHE_REMOTE": url, "KCACHE_REMOTE_PREFIX": prefix, **env})
    assert s.problems == [] and s.remote_problems == [], (s.problems, s.remote_problems)
    return s


class Stores:
    """Stores under one tmp folder, each attached to the shared tier (closed at the end), with
    SHARING_TIMEOUT for a deadline unless ``KCACHE_REMOTE_TIMEOUT`` is given."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.open = tmp, []

    def __call__(self, name: str, url: str, prefix: str, *, readonly: bool = False, **env: str) -> Store:
        s = remote_settings(url, prefix, **{"KCACHE_REMOTE_TIMEOUT": SHARING_TIMEOUT, **env})
        root = self.tmp / name
        if readonly:
            Store.open(root).close()  # a store must exist to be opened read-only
        st = Store.open(root, readonly=readonly, key_tag=s.key_tag)
        assert st.attach_remote(s)
        self.open.append(st)
        return st

    def close(self) -> None:
        for s in self.open:
            close_store(s)


def close_store(store: Store, timeout: float = 30.0) -> None:
    """``store.close()``, and its shared tier's writer and lock threads ended (close() tells them
    to): what the tier opened is closed by then, and no thread connects again after (the
    ``no_descriptors_left`` fixture counts what is left). Idempotent."""
    tiers: list[Any] = list(store.tiers)
    threads = [t for tier in tiers for t in (_writer_thread(tier), _keeper_thread(tier)) if t]
    store.close()
    for t in threads:
        t.join(timeout)


def _writer_thread(tier: Any) -> Any:
    return getattr(getattr(tier, "writer", None), "thread", None)


def _keeper_thread(tier: Any) -> Any:
    keeper = getattr(tier, "keeper", None)
    return getattr(keeper, "_thread", None)


def descriptors() -> dict[int, str]:
    """This process's open descriptors: number -> what it is (``socket:[inode]``, a path)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own, closed by now
            pass
    return out


def counts(store: Store, kind: str = "triton") -> dict[str, float]:
    return store.counts.process_totals().get(kind, {})


def flushed(store: Store, timeout: float = 10.0) -> None:
    """The tier's queued writes are all sent (within ``timeout`` seconds)."""
    assert store.tiers and store.tiers[0].flush(timeout)
