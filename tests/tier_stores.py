"""Stores attached to a shared tier, for the tests of the tier (tests/test_remote.py, the cluster
tests, the hostile-server tests): one copy of what each of them used to write."""

from __future__ import annotations

from pathlib import Path

from kcache import config
from kcache.store import Store


def remote_settings(url: str, prefix: str, **env: str) -> config.Settings:
    s = config.load({"KCACHE_REMOTE": url, "KCACHE_REMOTE_PREFIX": prefix, **env})
    assert s.problems == [] and s.remote_problems == [], (s.problems, s.remote_problems)
    return s


class Stores:
    """Stores under one tmp folder, each attached to the shared tier (closed at the end)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.open = tmp, []

    def __call__(self, name: str, url: str, prefix: str, *, readonly: bool = False, **env: str) -> Store:
        s = remote_settings(url, prefix, **env)
        root = self.tmp / name
        if readonly:
            Store.open(root).close()  # a store must exist to be opened read-only
        st = Store.open(root, readonly=readonly, key_tag=s.key_tag)
        assert st.attach_remote(s)
        self.open.append(st)
        return st

    def close(self) -> None:
        for s in self.open:
            s.close()


def counts(store: Store, kind: str = "triton") -> dict[str, float]:
    return store.counts.process_totals().get(kind, {})


def flushed(store: Store, timeout: float = 10.0) -> None:
    """The tier's queued writes are all sent (within ``timeout`` seconds)."""
    assert store.tiers and store.tiers[0].flush(timeout)
