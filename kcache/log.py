"""kcache's logger: one ``kcache`` logger on stderr (and, with ``KCACHE_LOGFILE``, in that file
too), level from ``KCACHE_LOG``, and warn-once."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

from .forksafe import module_lock

logger = logging.getLogger("kcache")
_warned: set[str] = set()
_lock = module_lock(__name__, "_lock")
_configured = False
_file: list[Any] = []  # [path, handler] of KCACHE_LOGFILE's handler, once attached

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

#: The characters the log file writes escaped (``\n``, ``\x1b``, ``\u2028``): C0 and C1
#: controls, DEL, and Unicode's line and paragraph separators (``str.splitlines`` breaks at
#: them too).
_ESCAPES = {
    c: chr(c).encode("unicode_escape").decode("ascii")
    for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
}


class _EscapedMessage(logging.Formatter):
    """stderr's formatter: the message's control characters escaped (a terminal escape in a
    hostile key component or file name would rewrite the user's screen, a newline would forge a
    line of kcache's); a traceback (debug level) keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return super().formatMessage(record).translate(_ESCAPES)


class _OneLine(logging.Formatter):
    """The log file's formatter: one record, one line. Messages carry text from hostile inputs
    (a key's components, a file's or a store's name): a newline in it would forge a line of
    another process, a terminal escape would rewrite what ``tail`` shows."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).translate(_ESCAPES)


def configure(level: str | None = None) -> None:
    """Attach a stderr handler once; ``level`` is a name from :data:`LEVELS`."""
    global _configured
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_EscapedMessage("kcache: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        _configured = True
    name = (level or os.environ.get("KCACHE_LOG") or "warning").strip().lower()
    logger.setLevel(LEVELS.get(name, logging.WARNING))
    _log_file(os.environ.get("KCACHE_LOGFILE") or None)


def _log_file(path: str | None) -> None:
    """Write kcache's log lines to ``path`` too (ccache's ``CCACHE_LOGFILE``): appended, one line
    each with the time and the process id (many processes share one file), the file made 0600.
    Only a regular file is written (:func:`kcache.userfile.open_append`): a FIFO at the name
    would stall the program at its first log line, a device is not ours to write; in a folder
    every user can write (/tmp), only a file of this user's, not through a link. A file that
    cannot be opened or is refused warns once on stderr; logging goes on there."""
    if _file and _file[0] == path:
        return
    if _file:
        logger.removeHandler(_file[1])
        _file[1].close()
        _file.clear()
    if not path or os.path.isdir(path):  # a folder is a bad setting: kcache.config says so, once
        return
    from .userfile import UserFileError, open_append

    try:
        fd = open_append(os.path.expanduser(path), what="the log file (KCACHE_LOGFILE)")
        with contextlib.suppress(OSError):
            # A file of ours made by something else (touch: 0644): as private as one made here,
            # for what it holds (key components, paths). Another user's file is theirs to set.
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and st.st_mode & 0o777 != 0o600:
                os.fchmod(fd, 0o600)
        stream = os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="backslashreplace")
    except (OSError, ValueError) as e:  # UserFileError is a ValueError
        _file[:] = [path, logging.NullHandler()]  # tried: not again in this process
        with _lock:
            _warned.add("logfile")
        why = e.reason if isinstance(e, UserFileError) else getattr(e, "strerror", None) or e
        logger.warning("cannot write the log file KCACHE_LOGFILE=%s (%s): logging to stderr only", path, why)
        return
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_OneLine("%(asctime)s kcache[%(process)d]: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    _file[:] = [path, handler]


def warn_once(topic: str, message: str) -> None:
    """Log ``message`` at warning level the first time ``topic`` is seen in this process."""
    with _lock:
        if topic in _warned:
            return
        _warned.add(topic)
    if not _configured:
        configure()
    logger.warning(message)
