"""Shared fixtures: small and generic (a fresh store, captured kcache warnings, a clean env)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kcache import log as _log
from kcache.store import Store


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """A path where no store exists yet (Store.open creates it 0700)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path):
    """A fresh writable Store under tmp_path, closed at the end of the test."""
    s = Store.open(store_dir, max_size=1 << 30)
    yield s
    s.close()


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def kcache_warnings():
    """The list of messages kcache logs during the test; warn-once topics are reset around it."""
    logger = logging.getLogger("kcache")
    h = _Capture()
    saved = set(_log._warned)
    _log._warned.clear()
    logger.addHandler(h)
    try:
        yield h.messages
    finally:
        logger.removeHandler(h)
        _log._warned.clear()
        _log._warned.update(saved)


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """os.environ without any KCACHE_* variable, with HOME/XDG_CACHE_HOME inside tmp_path:
    for subprocesses that must not see the developer's own settings or store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE")}
    env["HOME"] = str(tmp_path / "home")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env.pop("PYTHONPATH", None)
    return env
