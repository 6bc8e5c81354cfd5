"""The store's faces (kcache/store/api.py) are what their implementations offer: every method a
face declares exists on the object that is handed out for it, and accepts the face's arguments
by the same names. A face that grows without its implementation (or an implementation that
drops a method callers rely on) fails here, not in a user's process."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from kcache.store import Store, api
from kcache.store.tiers.backend import TierConfig
from kcache.store.tiers.redis import RedisBackend
from kcache.store.tiers.shared import SharedTier


def _declared(face: type) -> dict[str, Any]:
    """The members a Protocol declares itself (methods, properties, annotated attributes)."""
    out: dict[str, Any] = {}
    for klass in face.__mro__:
        if klass in (object,) or klass.__name__ in ("Protocol", "Generic"):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                out.setdefault(name, value)
        for name in getattr(klass, "__annotations__", {}):
            if not name.startswith("_"):
                out.setdefault(name, None)
    return out


def missing_or_unlike(obj: Any, face: type) -> list[str]:
    problems = []
    for name, declared in _declared(face).items():
        if not hasattr(obj, name):
            problems.append(f"{name}: missing")
            continue
        if not inspect.isfunction(declared):
            continue  # an attribute or a property: present is what counts
        got = getattr(obj, name)
        want = inspect.signature(declared)
        have = inspect.signature(got)
        params = {p.name: p for p in have.parameters.values()}
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for p in list(want.parameters.values())[1:]:  # not self
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.name not in params and not takes_kwargs:
                problems.append(f"{name}: does not take {p.name!r}")
    return problems


def test_the_store_offers_the_cache_and_admin_faces(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    try:
        assert missing_or_unlike(s, api.Cache) == []
        assert missing_or_unlike(s, api.Admin) == []
    finally:
        s.close()


def test_the_redis_tier_offers_the_tier_face() -> None:
    tier = SharedTier(RedisBackend(TierConfig("redis://127.0.0.1:1/0")), counts=None)
    assert missing_or_unlike(tier, api.Tier) == []


def test_the_check_itself_sees_a_missing_method() -> None:
    class Half:
        def get(self, kind: str) -> None: ...

    problems = missing_or_unlike(Half(), api.Cache)
    assert "put: missing" in problems and any(p.startswith("get: does not take") for p in problems)


@pytest.mark.parametrize("face", [api.Cache, api.Admin, api.Tier])
def test_faces_are_small(face: type) -> None:
    """A face that grows past a dozen or two names is the one-object-is-every-interface problem
    again: split it instead."""
    assert len(_declared(face)) <= 25, sorted(_declared(face))
