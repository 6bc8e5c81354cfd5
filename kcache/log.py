"""kcache's logger: one ``kcache`` logger on stderr, level from ``KCACHE_LOG``, and warn-once."""

from __future__ import annotations

import logging
import os
import sys

from .forksafe import module_lock

logger = logging.getLogger("kcache")
_warned: set[str] = set()
_lock = module_lock(__name__, "_lock")
_configured = False

LEVELS = {"warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG, "error": logging.ERROR}


class _Redact(logging.Filter):
    """Every message of kcache's logger goes out through :func:`kcache.redact.redact`: a URL's
    password or a secret value never reaches a log, whatever text (an exception's) carries it."""

    def filter(self, record: logging.LogRecord) -> bool:
        from .redact import redact

        try:
            record.msg, record.args = redact(record.getMessage()), None
        except Exception:  # never lose the message for it: drop it instead of printing it raw
            record.msg, record.args = "(a message that could not be redacted)", None
        return True


logger.addFilter(_Redact())


def configure(level: str | None = None) -> None:
    """Attach a stderr handler once; ``level`` is a name from :data:`LEVELS`."""
    global _configured
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kcache: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        _configured = True
    name = (level or os.environ.get("KCACHE_LOG") or "warning").strip().lower()
    logger.setLevel(LEVELS.get(name, logging.WARNING))


def warn_once(topic: str, message: str) -> None:
    """Log ``message`` at warning level the first time ``topic`` is seen in this process."""
    with _lock:
        if topic in _warned:
            return
        _warned.add(topic)
    if not _configured:
        configure()
    logger.warning(message)
