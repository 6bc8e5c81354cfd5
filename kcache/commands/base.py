"""What every command shares: its two errors, the settings with ``--dir`` on top, the store of
``--dir``, argument types, and the formatting of tables, times and sizes.

A command's ``run(args)`` raises :class:`UsageError` for a bad value (exit 2) and
:class:`CommandError` (or ``StoreError``) for a failure (exit 1); :func:`kcache.cli.main` turns
them into one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import config as _config

if TYPE_CHECKING:
    from ..store.api import Admin


class UsageError(Exception):
    """Bad arguments or a bad setting: one line on stderr, exit 2."""


class CommandError(Exception):
    """The command could not be done: one line on stderr, exit 1."""


def load_settings(args: argparse.Namespace, *, strict: bool = True) -> _config.Settings:
    """The effective settings with ``--dir`` on top. A bad ``--dir`` is a UsageError; with
    ``strict``, so is a bad environment value (one that ``--dir`` overrides does not count)."""
    s = _config.load(dir=getattr(args, "dir", None))
    overridden = [_config.ENV[n] + "=" for n, src in s.sources.items() if src == "argument"]
    s.problems = [p for p in s.problems if not p.startswith(tuple(overridden))]
    from_args = [p for p in s.problems if not p.startswith("KCACHE")]
    if from_args:  # a bad --dir is a bad argument, for every command
        raise UsageError("bad argument: " + "; ".join(from_args).replace("dir=", "--dir ", 1))
    if strict and s.problems:
        raise UsageError("bad setting: " + "; ".join(s.problems))
    return s


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def fmt_time(t: float | None) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


counted = _config.counted  # "1 entry", "2 entries": the one helper, for the commands too


def fmt_rate(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.1f}%"


def fmt_value(v: Any, width: int = 60) -> str:
    from ..maintenance.inspect import printable

    text = "(absent)" if v is None else printable(str(v).replace("\n", "\\n"))
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns aligned to their widest cell; column numbers in ``right`` are right-aligned.
    Control characters in a cell are shown escaped (a key or summary may come from elsewhere)."""
    from ..maintenance.inspect import printable

    cells = [[printable(h) for h in headers]] + [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def open_for(args: argparse.Namespace, *, write: bool = False, missing_ok: bool = False) -> Admin:
    """The store of ``--dir`` (or the settings): read-only unless ``write``; never created.

    A folder that ``--dir`` or ``KCACHE_DIR`` names and that does not exist is a failure
    (CommandError): it is most often a mistyped path, and reading it as an empty store (exit 0,
    "0 entries", "removed 0 entries") hid that. The default folder not existing yet is a
    machine where nothing was cached yet: it still reads as an empty store; so does any missing
    folder with ``missing_ok`` (``explain --against``: a new node's empty store is the question)."""
    from ..maintenance import open_store

    settings = load_settings(args)
    if not missing_ok:
        check_named_store(settings)
    return open_store(settings, write=write)


def check_named_store(settings: _config.Settings) -> None:
    """CommandError when the settings' store folder was named (``--dir``, ``KCACHE_DIR``) and
    does not exist (see :func:`open_for`)."""
    import os

    source = settings.sources.get("dir", "default")
    if source not in ("argument", "env KCACHE_DIR"):
        return
    try:
        if os.path.lexists(settings.dir):
            return
    except (OSError, ValueError):
        return  # open_store says what is wrong with it
    named = "--dir" if source == "argument" else "KCACHE_DIR"
    raise CommandError(
        f"no store at {settings.dir} ({named}): the folder does not exist; check the path "
        "(a store is made there by the first program that caches with KCACHE=1, or by `kcache import`)"
    )


def kind_arg(text: str) -> str:
    from ..kinds import KNOWN

    if text not in KNOWN:
        raise argparse.ArgumentTypeError(f"unknown kind {text!r}; the kinds are: {', '.join(sorted(KNOWN))}")
    return text


def count_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 0 or n > 10**9:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1000000000, got {text!r}")
    return n


def age_arg(text: str) -> float:
    try:
        return _config.parse_age(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def prefix_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("empty key prefix")
    return text


def summary_text(summary: dict[str, Any], width: int = 60) -> str:
    """A short line from a record's summary: name, target/arch, then library versions."""
    parts: list[str] = []
    for k in ("name", "kernel", "file"):
        if summary.get(k):
            parts.append(str(summary[k]))
            break
    for k in ("target", "arch", "gpu_name"):
        if summary.get(k):
            parts.append(str(summary[k]))
    for k, v in summary.items():
        if k.endswith("_version") and v:
            parts.append(f"{k[: -len('_version')]} {v}")
    return fmt_value(" ".join(parts), width) if parts else ""


def jobs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--jobs",
        "-j",
        type=count_arg,
        default=None,
        metavar="N",
        help="read N entries at a time in N threads (default 1; for stores on slow or network disks)",
    )


def verbose_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help=f"list every {what} entry and why")


def print_error(message: str) -> None:
    """``kcache: error: MESSAGE`` on stderr, one line, any secret in it redacted."""
    from ..config import redact

    text = " ".join(redact(message).split())  # an exception's text may carry a URL's password
    sys.stderr.write(f"kcache: error: {text}\n")
    sys.stderr.flush()
