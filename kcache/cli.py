"""The ``kcache`` command line (also ``python -m kcache``). Thin: the work is in
:mod:`kcache.maintenance`; this module parses arguments and formats results.

Exit status: 0 done (``verify``: the store is sound), 1 a runtime failure (the store cannot be
used; ``verify``: problems remain; ``inspect PREFIX``: nothing matches), 2 bad arguments or a bad
setting. Errors are one line on stderr, never a traceback; ``--json`` output goes to stdout only.

Subcommands live in :data:`COMMANDS`, name -> ``(add_arguments, run)``: ``add_arguments(parser)``
adds the command's own options (``--dir`` and ``--json`` are added for every command), and
``run(args) -> int`` does it and returns the exit status. ``run`` raises :class:`UsageError`
for a bad value (exit 2) and :class:`CommandError` (or ``StoreError``) for a failure (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from . import config as _config
from .prewarm import cli as _prewarm_cli

if TYPE_CHECKING:
    from .store.api import Admin

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """Bad arguments or a bad setting: one line on stderr, exit 2."""


class CommandError(Exception):
    """The command could not be done: one line on stderr, exit 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own: usage + message, here one line
        raise UsageError(message)


# ---------------------------------------------------------------------------------- helpers
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


def fmt_rate(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.1f}%"


def fmt_value(v: Any, width: int = 60) -> str:
    from .maintenance.inspect import printable

    text = "(absent)" if v is None else printable(str(v).replace("\n", "\\n"))
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns aligned to their widest cell; column numbers in ``right`` are right-aligned.
    Control characters in a cell are shown escaped (a key or summary may come from elsewhere)."""
    from .maintenance.inspect import printable

    cells = [[printable(h) for h in headers]] + [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def open_for(args: argparse.Namespace, *, write: bool = False) -> Admin:
    """The store of ``--dir`` (or the settings): read-only unless ``write``; never created."""
    from .maintenance import open_store

    return open_store(load_settings(args), write=write)


def _kind(text: str) -> str:
    from .kinds import KNOWN

    if text not in KNOWN:
        raise argparse.ArgumentTypeError(f"unknown kind {text!r}; the kinds are: {', '.join(sorted(KNOWN))}")
    return text


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 0 or n > 10**9:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1000000000, got {text!r}")
    return n


def _age(text: str) -> float:
    try:
        return _config.parse_age(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _prefix(text: str) -> str:
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


# ---------------------------------------------------------------------------------- stats
def _stats_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zero", action="store_true", help="reset the counters (hits, misses, ...) first")


def _stats_run(args: argparse.Namespace) -> int:
    """entries and bytes by kind, hits, misses, hit rate, compile time saved"""
    from .maintenance import close_store, stats, zero_counters
    from .maintenance.bound import bound_of

    settings = load_settings(args)
    store = open_for(args, write=args.zero)
    try:
        if args.zero:
            zero_counters(store)
        data = stats(store)
    finally:
        close_store(store)
    data["bound"] = bound_of(settings)
    data["max_size"] = data["bound"]["store"]  # the bound the store's writers use
    if args.zero:
        data["zeroed"] = True
    if wants_json(args):
        print_json(data)
        return 0
    from .config import format_size

    b = data["bound"]
    used = f"{format_size(data['bytes'])} of {format_size(b['store'])}"
    used += f" ({100 * data['bytes'] / b['store']:.1f}%), bound from {b['store_source']}"
    rows = [["store", data["dir"]], ["size", used]]
    if b["env"] is not None and b["env"] != b["store"]:
        rows.append(
            ["", f"this shell's KCACHE_MAX_SIZE={format_size(b['env'])} wins for processes started here"]
        )
    print(
        table(
            ["", ""],
            [
                *rows,
                ["entries", data["entries"]],
                ["hits", data["hits"]],
                ["misses", data["misses"]],
                ["hit rate", fmt_rate(data["hit_rate"])],
                ["saved", f"{fmt_seconds(data['saved_s'])} of compiling"],
                ["puts", data["puts"]],
                ["evictions", data["evictions"]],
                ["errors", data["errors"]],
                ["quarantined", data["quarantined"]],
            ],
        ).split("\n", 1)[1]
    )
    if data["by_kind"]:
        print()
        rows = [
            [
                k,
                v["entries"],
                format_size(v["bytes"]),
                v["hits"],
                v["misses"],
                fmt_rate(v["hit_rate"]),
                fmt_seconds(v["saved_s"]),
            ]
            for k, v in data["by_kind"].items()
        ]
        print(
            table(["kind", "entries", "size", "hits", "misses", "hit rate", "saved"], rows, right=range(1, 7))
        )
    if data.get("remote"):
        _print_remote_counts(data)
    if args.zero:
        print("\ncounters zeroed")
    return 0


def _print_remote_counts(data: dict[str, Any]) -> None:
    """The shared tier's rows of ``kcache stats`` (its hits are part of the hits above)."""
    from .config import format_size

    r = data["remote"]
    print("\nshared tier (Redis): its hits are among the hits above")
    print(
        table(
            ["", ""],
            [
                ["hits", r["hits"]],
                ["misses", r["misses"]],
                ["hit rate", fmt_rate(r["hit_rate"])],
                ["puts", r["puts"]],
                ["bytes in", format_size(r["bytes_in"])],
                ["bytes out", format_size(r["bytes_out"])],
                ["errors", r["errors"]],
                ["refused", r["refused"]],
                ["dropped", r["dropped"]],
                ["too large", r["too_large"]],
                [
                    "waited",
                    f"{r['waited']} entries, {r['wait_s']:.3f} s ({r['fruitless_s']:.3f} s for nothing)",
                ],
                ["locks ignored", r["ignored"]],
                ["marked bad", r["marked_bad"]],
                ["time", f"{r['s']:.3f} s in Redis calls"],
            ],
        ).split("\n", 1)[1]
    )
    rows = [
        [
            k,
            v["remote"]["hits"],
            v["remote"]["misses"],
            v["remote"]["puts"],
            format_size(v["remote"]["bytes_in"]),
            format_size(v["remote"]["bytes_out"]),
            v["remote"]["errors"],
            v["remote"]["refused"],
        ]
        for k, v in data["by_kind"].items()
        if "remote" in v
    ]
    print()
    print(
        table(["kind", "hits", "misses", "puts", "in", "out", "errors", "refused"], rows, right=range(1, 8))
    )


# ---------------------------------------------------------------------------------- inspect
def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", type=_kind, help="only entries of this kind")
    p.add_argument(
        "--limit", type=_count, default=50, help="at most N entries or groups (default 50; 0: all)"
    )
    p.add_argument(
        "--sort",
        choices=("used", "size", "hits"),
        default=None,
        help="most recently used first (the default), largest first, or most hit first",
    )
    p.add_argument(
        "--group",
        action="store_true",
        help="one row per kernel, model or graph name: entries, size, kinds, last use, hits (largest first)",
    )
    p.add_argument(
        "--name", metavar="PATTERN", help="only entries whose name matches (add_kernel, 'softmax*')"
    )
    p.add_argument(
        "pattern",
        nargs="?",
        type=_prefix,
        metavar="ID|KEY|NAME",
        help="an entry id or key prefix (the whole record), else a name pattern (the matching entries)",
    )


def _inspect_run(args: argparse.Namespace) -> int:
    """list entries (kind, id, size, created, last used, hits, what they hold); sort, group by name,
    select by name pattern; with an id or key prefix, the whole record"""
    from .config import format_size
    from .maintenance import close_store, find_entries, list_entries
    from .maintenance.inspect import group_entries
    from .maintenance.select import looks_like_id

    name = args.name
    found: list[dict[str, Any]] = []
    records = False
    store = open_for(args)
    try:
        if args.pattern and not args.group and not name:
            # an id or key prefix shows whole records; else the text is a name pattern
            found = find_entries(store, args.pattern, kind=args.kind, limit=args.limit)
            records = bool(found)
            if not found and looks_like_id(args.pattern) and len(args.pattern) >= 8:
                records = True  # an id that is not there: not a name
        if not records:
            name = name or args.pattern
            if args.group:
                found = group_entries(
                    store, kind=args.kind, name=name, sort=args.sort or "size", limit=args.limit
                )
            else:
                found = list_entries(
                    store, kind=args.kind, limit=args.limit, sort=args.sort or "used", name=name
                )
    finally:
        close_store(store)
    missing = bool(args.pattern or args.name) and not found
    if wants_json(args):
        print_json(found)
        return 1 if missing else 0
    if missing:
        what = f"no entry id, key or name matches {(args.name or args.pattern)!r}"
        print(f"kcache: {what}" + (f" among {args.kind} entries" if args.kind else ""), file=sys.stderr)
        return 1
    if records:
        for i, d in enumerate(found):
            if i:
                print()
            _print_record(d, format_size)
        return 0
    if not found:
        print("no entries" + (f" of kind {args.kind}" if args.kind else ""))
        return 0
    if args.group:
        grows = [
            [
                fmt_value(g["name"], 48),
                g["entries"],
                format_size(g["bytes"]),
                ", ".join(f"{k} {n}" if len(g["kinds"]) > 1 else k for k, n in sorted(g["kinds"].items())),
                fmt_time(g["last_used"]),
                g["hits"],
            ]
            for g in found
        ]
        print(table(["name", "entries", "size", "kinds", "last used", "hits"], grows, right=(1, 2, 5)))
        return 0
    rows = []
    for d in found:
        key = d.get("key") or ""
        rows.append(
            [
                d.get("kind") or "?",
                d["id"][:12],
                key if len(key) <= 16 else key[:15] + "…",
                format_size(d["size"]),
                fmt_time(d.get("created")),
                fmt_time(d.get("last_used")),
                d.get("hits") if d.get("hits") is not None else "-",
                ("BAD ROW: " + d["error"]) if d.get("error") else summary_text(d.get("summary") or {}),
            ]
        )
    print(table(["kind", "id", "key", "size", "created", "last used", "hits", "summary"], rows, right=(3, 6)))
    return 0


def _print_record(d: dict[str, Any], format_size: Callable[[float], str]) -> None:
    if d.get("kind") is None:
        print(table(["", ""], [["id", d["id"]], ["status", d.get("status")]]).split("\n", 1)[1])
        return
    rows = [
        ["id", d["id"]],
        ["kind", d["kind"]],
        ["key", d["key"]],
        ["path", d["path"]],
        ["status", d["status"]],
        ["size", f"{format_size(d['size'])} in {len(d['files'])} files"],
        ["created", fmt_time(d["created"])],
        ["last used", fmt_time(d["last_used"])],
        ["hits", d["hits"] if d["hits"] is not None else "- (not in the index)"],
        ["compile time", fmt_seconds(d["compile_s"])],
    ]
    if d.get("protected_until"):  # a prewarmed entry
        rows.append(["protected until", f"{fmt_time(d['protected_until'])} (or its first use)"])
    print(table(["", ""], rows).split("\n", 1)[1])
    for title, mapping in (("summary", d["summary"]), ("key components", d["components"])):
        print(f"{title}:")
        if not mapping:
            print("  (none)")
            continue
        print(
            "\n".join(
                "  " + ln
                for ln in table(["", ""], [[k, fmt_value(v, 100)] for k, v in mapping.items()]).split("\n")[
                    1:
                ]
            )
        )
    print("files:")
    frows = [
        [f["name"], format_size(f["size"]), f"crc32 {f['crc32']:08x}", f"sha256 {f['sha256'][:16]}…"]
        for f in d["files"]
    ]
    print("\n".join("  " + ln for ln in table(["", "", "", ""], frows, right=(1,)).split("\n")[1:]))


# ---------------------------------------------------------------------------------- clear
def _clear_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", type=_kind, help="entries of this kind")
    p.add_argument(
        "--older-than", type=_age, metavar="AGE", help="entries not used for AGE (e.g. 7d, 12h, 30m, 45s)"
    )
    p.add_argument(
        "--stale", action="store_true", help="entries made with library versions other than this machine's"
    )
    p.add_argument("--name", metavar="PATTERN", help="entries whose kernel, model or graph name matches")
    p.add_argument(
        "--id", action="append", metavar="ID", help="the entry with this id (or unique id prefix; repeatable)"
    )
    p.add_argument("--all", action="store_true", help="every entry (needed when no other selector is given)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; change nothing")
    p.add_argument(
        "pattern",
        nargs="?",
        type=_prefix,
        metavar="ID|NAME",
        help="an entry id (prefix), else a name pattern",
    )


def _resolve_ids(store: Admin, wanted: list[str]) -> list[str]:
    """Full ids for each id or unique id prefix (UsageError when one matches none or several)."""
    from .maintenance.select import ids_with_prefix, looks_like_id

    out = []
    for w in wanted:
        if not looks_like_id(w):
            raise UsageError(f"--id {w!r}: not an entry id (hex digits)")
        got = ids_with_prefix(store, w)
        if len(got) != 1:
            raise UsageError(
                f"--id {w!r}: "
                + ("no entry has it" if not got else f"{len(got)} entries start with it; give more digits")
            )
        out.extend(got)
    return out


def _clear_run(args: argparse.Namespace) -> int:
    """remove entries (by kind, age, staleness, name, id, or all); selectors combine"""
    from .config import format_size
    from .maintenance import clear, close_store
    from .maintenance.progress import Progress
    from .maintenance.select import ids_with_prefix, looks_like_id

    name, ids = args.name, list(args.id or [])
    if not (
        args.kind or args.older_than is not None or args.stale or args.all or name or ids or args.pattern
    ):
        raise UsageError(
            "nothing selected: pass an id or name, --kind, --older-than, --stale, or --all to remove every entry"
        )
    store = open_for(args, write=not args.dry_run)
    try:
        if args.pattern:  # an id prefix that names entries, else a name pattern
            if looks_like_id(args.pattern) and ids_with_prefix(store, args.pattern):
                ids.append(args.pattern)
            elif name:
                raise UsageError(f"{args.pattern!r} is not an entry id, and --name is given")
            else:
                name = args.pattern
        total = sum(1 for _ in store.iter_entry_ids())
        with Progress("clear", total, enabled=not wants_json(args) and not args.dry_run) as prog:
            res = clear(
                store,
                kind=args.kind,
                older_than=args.older_than,
                stale=args.stale,
                everything=args.all,
                dry_run=args.dry_run,
                name=name,
                ids=_resolve_ids(store, ids) if ids else None,
                progress=prog,
            )
    finally:
        close_store(store)
    if wants_json(args):
        print_json(res)
        return 0
    n, size = res["count"], format_size(res["bytes"])
    if args.dry_run:
        print(f"would remove {n} entr{'y' if n == 1 else 'ies'}, {size} (dry run: nothing changed)")
        if res["entries"]:
            rows = [
                [
                    e["kind"] or "?",
                    e["id"][:12],
                    fmt_value(e.get("name") or "", 40),
                    format_size(e["size"]),
                    fmt_time(e["last_used"]),
                    e["why"],
                ]
                for e in res["entries"]
            ]
            print(table(["kind", "id", "name", "size", "last used", "why"], rows, right=(3,)))
        return 0
    msg = f"removed {n} entr{'y' if n == 1 else 'ies'}, {size}"
    if res["leftovers"]:
        msg += f"; cleaned {res['leftovers']} leftovers from tmp/ and trash/"
    print(msg)
    if not res["index_updated"]:
        print(
            f"the entries are gone, but the index could not be updated ({res['index_problem']}); "
            "stats may count them until `kcache verify --fix` runs (with some free space)"
        )
    return 0


# ---------------------------------------------------------------------------------- verify
def _jobs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--jobs",
        "-j",
        type=_count,
        default=None,
        metavar="N",
        help="read N entries at a time in N threads (default 1; for stores on slow or network disks)",
    )


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fix", action="store_true", help="remove bad entries and rows, re-index, rebuild a corrupt index"
    )
    _jobs_arg(p)


def _verify_run(args: argparse.Namespace) -> int:
    """check every entry against its checksums, and the index against the entries"""
    from .maintenance import close_store, verify
    from .maintenance.progress import Progress

    store = open_for(args, write=args.fix)
    try:
        total = sum(1 for _ in store.iter_entry_ids())
        with Progress("verify", total, enabled=not wants_json(args)) as prog:
            res = verify(store, fix=args.fix, progress=prog, jobs=args.jobs or None)
    finally:
        close_store(store)
    if wants_json(args):
        print_json(res)
        return 0 if res["ok"] else 1
    n = len(res["problems"])
    print(
        f"checked {res['entries']} entries in {res['dir']}: "
        + (f"{n} problem{'s' * (n != 1)}" if n else "ok")
    )
    if n:
        rows = [
            [p["type"], p["id"][:12] if p["id"] else "-", fmt_value(p["detail"], 90)] for p in res["problems"]
        ]
        print(table(["problem", "id", "detail"], rows))
    if args.fix and n:
        left = len(res["remaining"])
        print(f"fixed {len(res['fixed'])}; {left} remain" + ("" if left else ": ok"))
        if left:
            rows = [
                [p["type"], p["id"][:12] if p["id"] else "-", fmt_value(p["detail"], 90)]
                for p in res["remaining"]
            ]
            print(table(["problem", "id", "detail"], rows))
    elif n:
        print("run `kcache verify --fix` to repair")
    if res.get("index_problem"):
        print(f"the index could not be updated ({res['index_problem']}); free some space and run it again")
    return 0 if res["ok"] else 1


# ---------------------------------------------------------------------------------- config
def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="keep a setting with the store, for every process that opens it (max_size=20GiB); "
        "the environment still wins",
    )
    p.add_argument("--unset", action="append", metavar="NAME", help="remove a setting kept with the store")


def _config_change(args: argparse.Namespace) -> int:
    """``config --set/--unset``: write the store's kcache.conf (the store is made if missing)."""
    from .store import Store
    from .store.conf import ConfError, check, write

    values: dict[str, Any] = {}
    try:
        for item in args.set or []:
            name, eq, value = item.partition("=")
            if not eq:
                raise UsageError(f"--set {item!r}: expected NAME=VALUE (e.g. max_size=20GiB)")
            values[name.strip()] = check(name.strip(), value.strip())
        for name in args.unset or []:
            check_name = name.strip()
            from .store.conf import KEYS

            if check_name not in KEYS:
                raise ConfError(f"unknown setting {check_name!r}: a store keeps {', '.join(KEYS)}")
            values[check_name] = None
    except ConfError as e:
        raise UsageError(str(e)) from None
    settings = load_settings(args)
    if settings.readonly:
        raise CommandError(f"{settings.dir} is read-only (KCACHE_READONLY=1): its settings cannot be changed")
    Store.from_settings(settings, write=True).close()  # made (0700) if missing, checked as any store
    try:
        text = write(os.fspath(settings.dir), values)
    except OSError as e:
        raise CommandError(f"cannot write the store's settings: {e.strerror or e}") from None
    if wants_json(args):
        print_json({"dir": str(settings.dir), "set": {k: v for k, v in values.items()}, "text": text})
        return 0
    from .config import format_size

    for k, v in values.items():
        shown = "unset" if v is None else (format_size(v) if k == "max_size" else v)
        print(f"{k}: {shown} (kept in {os.path.join(str(settings.dir), 'kcache.conf')})")
    if settings.sources.get("max_size", "default") != "default" and "max_size" in values:
        print("note: KCACHE_MAX_SIZE in this environment wins over it for processes started here")
    return 0


def _config_run(args: argparse.Namespace) -> int:
    """the effective settings, where each came from (the environment, the store's kcache.conf, a
    default), and whether the store folder is usable; --set/--unset keep settings with the store"""
    from .config import format_size
    from .maintenance import config_report

    if args.set or args.unset:
        return _config_change(args)
    res = config_report(load_settings(args, strict=False))
    if wants_json(args):
        print_json(res)
        return 0
    rows = []
    for r in res["settings"]:
        v = r["value"]
        if r["name"] in ("max_size", "remote_max_entry"):
            v = f"{format_size(v)} ({v} bytes)"
        elif r["name"] == "remote_timeout":
            v = f"{v:g} ms"
        elif r["name"] == "remote_lock_lease":
            v = f"{v:g} s" + (" (off)" if not v else "")
        rows.append([r["name"], r["env"], "-" if v is None else v, r["source"]])
    print(table(["setting", "variable", "value", "source"], rows))
    st = res["store"]
    yn = {True: "yes", False: "no", None: "-"}
    print()
    print(
        table(
            ["", ""],
            [
                ["store", st["dir"]],
                ["exists", yn[st["exists"]]],
                ["kcache store", yn[st["is_store"]]],
                ["safety", st["safety"]],
                ["filesystem", f"{st['fs_type'] or '?'} ({'network' if st['network_fs'] else 'local'})"],
                ["index", st["index"]],
            ],
        ).split("\n", 1)[1]
    )
    if res.get("shared_tier"):
        print(f"\n{res['shared_tier']['trust']}")
    if res["problems"]:
        print("\nproblems (caching is off until they are fixed):")
        for p in res["problems"]:
            print(f"  {p}")
    if res.get("remote_problems"):
        print("\nproblems with the shared tier (it is off until they are fixed; local caching is on):")
        for p in res["remote_problems"]:
            print(f"  {p}")
    return 0


# ---------------------------------------------------------------------------------- remote
def _remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--limit",
        type=_count,
        default=10_000,
        help="look at most N entry keys, a page of each node in turn (default 10000; 0: all)",
    )


def _remote_run(args: argparse.Namespace) -> int:
    """the shared tier (KCACHE_REMOTE): whether it answers, each node, and what kcache holds there"""
    from .config import format_size
    from .maintenance.remote import remote_report

    settings = load_settings(args, strict=False)
    if settings.remote_problems:
        raise UsageError("bad setting: " + "; ".join(settings.remote_problems))
    if not settings.remote:
        raise UsageError("no shared tier configured: set KCACHE_REMOTE=redis://host:port/db")
    res = remote_report(settings, limit=args.limit)
    if wants_json(args):
        print_json(res)
        return 0 if res["reachable"] and "error" not in res else 1

    def memory(srv: dict[str, Any]) -> str:
        if "used_memory" not in srv:
            return "?"
        mm = int(srv.get("maxmemory") or 0)
        return f"{format_size(int(srv['used_memory']))} of {format_size(mm) if mm else 'no maxmemory'}"

    rows = [["url", res["url"]]]
    cl = res.get("cluster")
    if cl is not None:
        roles = [n["role"] for n in res.get("nodes", [])]
        rows.append(
            [
                "cluster",
                f"{cl.get('state', '?')}: {roles.count('master')} masters, {roles.count('replica')} replicas",
            ]
        )
    rows += [
        ["prefix", res["prefix"]],
        ["signed", "yes (KCACHE_SECRET)" if res["signed"] else "no (host code and pickles stay local)"],
        ["reachable", "yes" if res["reachable"] else "no"],
    ]
    if res["reachable"]:
        rows.append(["ping", f"{res['ping_ms']:.2f} ms"])
        srv = res.get("server")
        if srv is not None and "error" in srv:
            rows.append(["server", f"INFO refused: {srv['error']}"])
        elif srv is not None:
            version = srv.get("valkey_version") and f"valkey {srv['valkey_version']}"
            rows.append(["server", version or f"redis {srv.get('redis_version', '?')}"])
            rows.append(["memory", memory(srv)])
            rows.append(["policy", srv.get("maxmemory_policy", "?")])
            rows.append(["evicted", srv.get("evicted_keys", "?")])
    if "entries" in res:
        rows.append(["entries", f"{res['entries']} ({format_size(res['bytes'])})"])
        seen = "all" if res["complete"] else f"not all (checked {res['checked']} keys: --limit)"
        rows.append(["seen", seen])
    if res.get("scan_error"):
        rows.append(["scan", res["scan_error"]])
    if "error" in res:
        rows.append(["error", res["error"]])
    print(table(["", ""], rows).split("\n", 1)[1])
    print(f"\n{res['trust']}")
    if cl is not None and res.get("nodes"):
        nrows = []
        for n in res["nodes"]:
            srv = n.get("server", {})
            role = n["role"] + (" (fail)" if "fail" in n.get("flags", ()) else "")
            held = f"{n['entries']} ({format_size(n['bytes'])})" if "entries" in n else ""
            if n["role"] == "replica":
                held = f"of {n.get('master', '?')}"
            nrows.append([n["address"], role, "yes" if n["reachable"] else "no", memory(srv), held])
        print()
        print(table(["node", "role", "reachable", "memory", "entries"], nrows))
    if res.get("by_kind"):
        print()
        krows = [[k, v["entries"], format_size(v["bytes"])] for k, v in res["by_kind"].items()]
        print(table(["kind", "entries", "size"], krows, right=(1, 2)))
    return 0 if res["reachable"] and "error" not in res else 1


# ---------------------------------------------------------------------------------- explain
def _explain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", type=_kind, help="only misses of this kind")
    p.add_argument(
        "--limit",
        type=_count,
        default=10,
        help="at most N misses, most recent first (default 10; 0: all kept)",
    )
    p.add_argument("--nearest", type=_count, default=3, help="stored entries shown per miss (default 3)")
    p.add_argument(
        "--against",
        metavar="OTHER",
        help="why this machine misses what OTHER has: another store's folder, a bundle, or a file "
        "written by `kcache fingerprint --json` on the other machine",
    )


def _explain_against(args: argparse.Namespace) -> int:
    from .maintenance import close_store
    from .maintenance.against import UNEXPLAINED, explain_against

    settings = load_settings(args)
    store = open_for(args)
    try:
        res = explain_against(store, args.against, key_tag=settings.key_tag)
    finally:
        close_store(store)
    if wants_json(args):
        print_json(res)
        return 0
    o = res["other"]
    if o["type"] == "fingerprint":
        print(f"this machine against the fingerprint {o['path']}; {res['misses']} recent misses here")
        head = "misses"
    else:
        print(
            f"{o['path']} ({o['type']}) holds {o['entries']} entries: {res['present']} are here, "
            f"{res['lacking']} are not"
        )
        head = "entries"
    if not res["causes"]:
        print("no part of the key differs" if o["type"] == "fingerprint" else "nothing to explain")
        return 0
    rows = []
    for c in res["causes"]:
        there = ", ".join(str(v) for v in c["there"][:3]) + (" ..." if len(c["there"]) > 3 else "")
        rows.append(
            [
                c["what"] if c["part"] == UNEXPLAINED or c["part"].startswith("env.") else f"{c['what']}",
                c["entries"],
                fmt_value(there, 30),
                fmt_value(c["here"] if c["here"] is not None else "-", 30),
                fmt_value(", ".join(c["examples"]), 40),
            ]
        )
    print(table(["cause", head, "there", "here", "e.g."], rows, right=(1,)))
    if o["type"] != "fingerprint" and len(res["causes"]) > 1:
        print("(an entry can have several causes)")
    return 0


def _explain_run(args: argparse.Namespace) -> int:
    """why lookups missed: the nearest stored entries and the key components that differ; with
    --against OTHER, why this machine misses what another store, bundle or machine has"""
    from .maintenance import close_store, explain

    if args.against:
        return _explain_against(args)
    store = open_for(args)
    try:
        res = explain(store, kind=args.kind, limit=args.limit, nearest=args.nearest)
    finally:
        close_store(store)
    if wants_json(args):
        print_json(res)
        return 0
    if not res:
        print("no misses recorded" + (f" of kind {args.kind}" if args.kind else ""))
        return 0
    for i, m in enumerate(res):
        if i:
            print()
        times = f" (missed {m['count']} times)" if m["count"] > 1 else ""
        print(f"{fmt_time(m['time'])}  {fmt_value(m['kind'], 40)}  key {fmt_value(m['key'], 40)}{times}")
        if m["stored_now"]:
            print("  stored since: the next lookup hits")
        if not m["components"]:
            print("  no key components were recorded with this miss")
        if not m["nearest"]:
            print(f"  no stored entries of kind {fmt_value(m['kind'], 40)}")
        for n in m["nearest"]:
            print(
                f"  nearest {n['id'][:12]} (last used {fmt_time(n['last_used'])}): "
                f"{n['equal']} of {n['total']} components equal"
            )
            for d in n["differ"]:
                print(
                    f"      {fmt_value(d['name'], 50)}: {fmt_value(d['stored'], 50)} -> {fmt_value(d['wanted'], 50)}"
                )
    return 0


# ---------------------------------------------------------------------------------- bundles
def _verbose_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help=f"list every {what} entry and why")


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="the bundle to write (.tgz/.gz: compressed)")
    p.add_argument("--kind", type=_kind, action="append", help="only entries of this kind (repeatable)")
    _verbose_arg(p, "skipped")
    _jobs_arg(p)


def _skipped_lines(res: dict[str, Any], verbose: bool) -> None:
    """One summary line of what was skipped and why; with -v, one line per entry."""
    from .bundle import count_text, reasons

    skipped = res.get("skipped") or []
    if not skipped:
        return
    print(f"skipped {count_text(len(skipped))}: {reasons(skipped)}" + ("" if verbose else " (-v lists them)"))
    if verbose:
        for s in skipped:
            what = s.get("id") or s.get("path") or "?"
            print(
                f"  {fmt_value(str(what), 40)}  {fmt_value(s.get('kind') or '', 40)}  {fmt_value(s.get('why'), 200)}"
            )


def _export_run(args: argparse.Namespace) -> int:
    """write verified entries to a relocatable, checksummed bundle (signed with KCACHE_SECRET)"""
    from .bundle import BundleError, count_text, export_bundle
    from .config import format_size
    from .maintenance import close_store
    from .maintenance.progress import Progress

    settings = load_settings(args)
    store = open_for(args)
    try:
        total = sum(1 for _ in store.iter_entry_ids())
        with Progress("export: read", total, enabled=not wants_json(args)) as prog:
            res = export_bundle(
                store,
                args.file,
                kinds=args.kind,
                secret=settings.secret,
                progress=prog,
                jobs=args.jobs or None,
            )
    except (BundleError, OSError) as e:
        raise CommandError(str(e)) from None
    finally:
        close_store(store)
    if wants_json(args):
        print_json(res)
        return 0
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(res["by_kind"].items()))
    print(
        f"exported {count_text(res['entries'])} ({kinds}), {format_size(res['bytes'])}, to {res['file']}"
        f"{' (signed)' if res['signed'] else ''}"
    )
    _skipped_lines(res, args.verbose)
    return 0


def _import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="?", help="a bundle written by kcache export")
    p.add_argument(
        "--triton-cache", metavar="DIR", help="adopt an existing Triton cache folder (~/.triton/cache)"
    )
    _verbose_arg(p, "skipped")


def _fresh_folder(path: str) -> str | None:
    """Whether ``path`` holds no store yet ("missing", "empty"; else None): an import makes one,
    and a failed import must not leave it behind (see :func:`_undo_new_store`)."""
    try:
        if not os.path.lexists(path):
            return "missing"
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            return "empty"
    except OSError:
        pass
    return None


def _undo_new_store(path: str, fresh: str) -> None:
    """A failed import leaves a missing or empty folder as it found it: the store it made is
    removed, unless it holds an entry (another process started using it meanwhile)."""
    import shutil

    from .store.opening import MARKER, SUBDIRS

    try:
        entries = os.path.join(path, "entries")
        if any(os.listdir(os.path.join(entries, s)) for s in os.listdir(entries)):
            return
        for sub in SUBDIRS:
            shutil.rmtree(os.path.join(path, sub), ignore_errors=True)
        os.unlink(os.path.join(path, MARKER))
        if fresh == "missing":
            os.rmdir(path)
    except OSError:
        pass


def _import_run(args: argparse.Namespace) -> int:
    """import a bundle, or adopt a Triton cache folder (--triton-cache DIR)"""
    from .bundle import BundleError, import_bundle, open_bundle

    if bool(args.file) == bool(args.triton_cache):
        raise UsageError("give either a bundle FILE or --triton-cache DIR")
    settings = load_settings(args)
    if settings.readonly:
        raise CommandError(f"{settings.dir} is read-only (KCACHE_READONLY=1): nothing may be imported")
    from .maintenance.progress import Progress
    from .store import Store

    bundle = None
    fresh = _fresh_folder(os.fspath(settings.dir))
    try:
        if args.file:
            # The bundle is checked (a regular file, a kcache bundle, signature, key tag) before the
            # store is opened: a failed import never turns a folder into a store.
            bundle = open_bundle(args.file, secret=settings.secret, key_tag=settings.key_tag)
        elif not os.path.isdir(args.triton_cache):
            raise CommandError(f"{args.triton_cache} is not a folder")
        # Importing into a store that does not exist yet creates it (0700), as enabling kcache would.
        store = Store.from_settings(settings, write=True)
        try:
            if args.triton_cache:
                from .triton.importer import import_triton_cache

                res = import_triton_cache(store, args.triton_cache)
            else:
                assert bundle is not None
                size = sum(r.size for r in bundle.records.values())
                with Progress("import", size, enabled=not wants_json(args), unit="bytes") as prog:
                    res = import_bundle(store, bundle, progress=prog)
        finally:
            store.close()
    except (BundleError, OSError) as e:
        if fresh:
            _undo_new_store(os.fspath(settings.dir), fresh)
        raise CommandError(str(e)) from None
    finally:
        if bundle is not None:
            bundle.close()
    problem = _import_problem(res, args)
    if problem and fresh:  # nothing imported: a folder that held no store is left as it was
        _undo_new_store(os.fspath(settings.dir), fresh)
    if wants_json(args):
        res["error"] = problem
        print_json(res)
    elif args.triton_cache:
        print(
            f"adopted from {res['source']}: {res['kernels']} kernels ({res['kernels_present']} already "
            f"present), {res['aux']} launchers, {res['autotune']} autotune results"
            + (f"; {res['other_triton']} kernels of another Triton left out" if res["other_triton"] else "")
        )
        _skipped_lines(res, args.verbose)
    else:
        from .bundle import count_text

        kinds = ", ".join(f"{k} {n}" for k, n in sorted(res["by_kind"].items()))
        print(
            f"imported {count_text(res['imported'])}{f' ({kinds})' if kinds else ''} from {res['file']}"
            + (" (signature checked)" if res["signed"] else "")
            + (f"; {res['present']} already present" if res["present"] else "")
        )
        _skipped_lines(res, args.verbose)
        if res.get("needs_secret") and not problem:
            print(
                "the bundle is signed: set KCACHE_SECRET to the secret it was signed with to import the rest"
            )
    if problem:
        _fail(problem)
        return 1
    return 0


def _import_problem(res: dict[str, Any], args: argparse.Namespace) -> str | None:
    """Why an import brought nothing of what it was asked to, or None (see bundle.import_problem)."""
    if not args.triton_cache:
        from .bundle import import_problem

        return import_problem(res)
    if res["kernels"] or res["kernels_present"] or res["aux"] or res["autotune"]:
        return None
    from .bundle import reasons

    why = reasons(res["skipped"]) if res["skipped"] else "it holds no kernel of a Triton cache"
    if res["other_triton"]:
        why += f"; {res['other_triton']} kernels were built by another Triton than this one"
    return f"nothing adopted from {res['source']}: {why}"


# ---------------------------------------------------------------------------------- dir
def _dir_args(p: argparse.ArgumentParser) -> None:
    pass


def _dir_run(args: argparse.Namespace) -> int:
    """print the store's folder (like `pip cache dir`), whether or not it exists yet"""
    settings = load_settings(args, strict=False)
    src = settings.sources.get("dir", "default")
    if wants_json(args):
        print_json({"dir": str(settings.dir), "source": src, "exists": os.path.isdir(settings.dir)})
    else:
        print(settings.dir)
    return 0


# ---------------------------------------------------------------------------------- trim
def _trim_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--to",
        metavar="SIZE",
        help="trim to SIZE (e.g. 5GiB) instead of 90%% of the bound, as eviction does",
    )


def _trim_run(args: argparse.Namespace) -> int:
    """remove least recently used entries now until the store is within its bound (ccache -c)"""
    from .config import format_size, parse_size
    from .maintenance import EmptyStore, close_store
    from .maintenance.bound import bound_of
    from .store import tunables

    target = None
    if args.to is not None:
        try:
            target = parse_size(args.to)
        except ValueError as e:
            raise UsageError(f"--to: {e}") from None
    settings = load_settings(args)
    b = bound_of(settings)
    store = open_for(args, write=True)
    if isinstance(store, EmptyStore):  # a missing folder: nothing to trim, and nothing is made
        close_store(store)
        if wants_json(args):
            print_json({"dir": str(settings.dir), "removed": 0, "freed": 0, "bytes": 0})
        else:
            print(f"no store at {settings.dir}: nothing to trim")
        return 0
    try:
        bound = store.max_size
        want = int(bound * 0.9) if target is None else target
        before = store.index().total_bytes()
        removed, freed = store.evict(want)
        after = store.index().total_bytes()
    finally:
        close_store(store)
    res = {
        "dir": str(settings.dir),
        "bound": bound,
        "bound_source": b["env_source"] if b["env"] is not None else b["store_source"],
        "target": want,
        "before": before,
        "removed": removed,
        "freed": freed,
        "bytes": after,
        "kept_recent": after > want,
    }
    if wants_json(args):
        print_json(res)
        return 0
    print(
        f"removed {removed} entr{'y' if removed == 1 else 'ies'} ({format_size(freed)}); the store holds "
        f"{format_size(after)}, bound {format_size(bound)} ({res['bound_source']})"
    )
    if after > want:
        print(
            f"still over {format_size(want)}: entries used in the last {tunables.GRACE_S:.0f} s, and prewarmed "
            "entries not used yet, are kept (or another process is evicting now)"
        )
    return 0


# ---------------------------------------------------------------------------------- fingerprint
def _fingerprint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", metavar="FILE", help="write the JSON document to FILE (implies --json)")


def _fingerprint_run(args: argparse.Namespace) -> int:
    """this machine's identity as the keys see it (builds, GPU, KCACHE_KEY_TAG, Triton's variables);
    --json writes it for `kcache explain --against` on another machine"""
    from .maintenance.identity import describe, document

    settings = load_settings(args)
    doc = document(settings.key_tag)
    if args.output:
        from .maintenance.against import write_fingerprint

        try:
            write_fingerprint(args.output, doc)
        except OSError as e:
            raise CommandError(f"cannot write {args.output}: {e.strerror or e}") from None
        if not wants_json(args):
            print(f"wrote {args.output}")
        return 0
    if wants_json(args):
        print_json(doc)
        return 0
    rows = [[k, describe(k), "-" if v is None else fmt_value(v, 50)] for k, v in doc["parts"].items()]
    print(table(["part", "what", "value"], rows))
    return 0


# ---------------------------------------------------------------------------------- registry
#: Subcommands: name -> (add_arguments, run). The help line is the first line of run's docstring.
COMMANDS: dict[str, tuple[AddArguments, Run]] = {
    "stats": (_stats_args, _stats_run),
    "inspect": (_inspect_args, _inspect_run),
    "clear": (_clear_args, _clear_run),
    "verify": (_verify_args, _verify_run),
    "explain": (_explain_args, _explain_run),
    "config": (_config_args, _config_run),
    "prewarm": (_prewarm_cli.add_arguments, _prewarm_cli.run),
    "export": (_export_args, _export_run),
    "import": (_import_args, _import_run),
    "remote": (_remote_args, _remote_run),
    "dir": (_dir_args, _dir_run),
    "trim": (_trim_args, _trim_run),
    "fingerprint": (_fingerprint_args, _fingerprint_run),
    # ---- Other modules register their subcommands here, one line each, e.g.
    #   "prewarm": (prewarm.add_arguments, prewarm.run),   (from . import prewarm, at the top)
    #   "import": (bundle.add_import_arguments, bundle.run_import),
    #   "export": (bundle.add_export_arguments, bundle.run_export),
    # add_arguments(parser) adds the command's options (--dir and --json come for free);
    # run(args) -> exit status; use load_settings(args) / open_for(args), print_json for --json,
    # and raise UsageError (exit 2) or CommandError (exit 1) with a one-line message.
    # Keep the module cheap to import (no torch/triton at import time): every command pays it.
}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    common = _Parser(add_help=False)
    common.add_argument(
        "--dir", default=argparse.SUPPRESS, metavar="DIR", help="the store (default: KCACHE_DIR)"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output on stdout"
    )
    parser = _Parser(
        prog="kcache",
        description=textwrap.fill(
            "kcache: a persistent on-disk compile cache for GPU kernels (Triton, Triton's autotuner, "
            "nvFuser, torch.compile). Turn it on for every Python process with KCACHE=1; these commands "
            "look after the store. Every command takes --dir DIR and --json.",
            100,
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"kcache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (add_arguments, run) in COMMANDS.items():
        doc = " ".join((run.__doc__ or "").split())
        examples = EXAMPLES.get(name)
        p = sub.add_parser(
            name,
            help=doc,
            description=textwrap.fill(doc[:1].upper() + doc[1:] + ".", 100) if doc else None,
            epilog=("examples:\n" + "\n".join(f"  {e}" for e in examples)) if examples else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            aliases=ALIASES.get(name, []),
            parents=[common],
            allow_abbrev=False,
        )
        p.set_defaults(command=name)
        add_arguments(p)
    return parser


#: Short names a ccache user reaches for.
ALIASES = {"trim": ["cleanup"]}

EPILOG = """\
the environment (read by every process; `kcache config` shows each setting and where it came from):
  KCACHE=1                 cache in every Python process, no code change
  KCACHE_DIR=DIR           the store (default: $XDG_CACHE_HOME/kcache, else ~/.cache/kcache)
  KCACHE_MAX_SIZE=20GiB    the size bound (default: the store's own, `kcache config --set max_size=...`)
  KCACHE_REMOTE=redis://.. a shared tier; KCACHE_SECRET signs what crosses machines

exit status: 0 done, 1 failed (one line on stderr says why), 2 bad arguments or settings.
see docs/usage.md for the whole of it."""

#: Examples shown by `kcache COMMAND --help`.
EXAMPLES: dict[str, list[str]] = {
    "stats": ["kcache stats", "kcache stats --json", "kcache stats --zero"],
    "inspect": [
        "kcache inspect                      # the 50 most recently used entries",
        "kcache inspect --group --sort size  # what takes the room, by kernel or model",
        "kcache inspect add_kernel           # the entries of a kernel (a glob: 'matmul_*')",
        "kcache inspect 3fa9c1               # the whole record of an entry, by id prefix",
    ],
    "clear": [
        "kcache clear --older-than 30d",
        "kcache clear --name 'softmax*' --dry-run",
        "kcache clear 3fa9c1d2e4             # one entry, by id",
        "kcache clear --stale                # built by other library versions",
        "kcache clear --all",
    ],
    "verify": ["kcache verify", "kcache verify --fix"],
    "explain": [
        "kcache explain                      # the latest misses and what differs",
        "kcache explain --against /mnt/other-node/kcache",
        "kcache explain --against their.kcb",
        "kcache fingerprint -o b.json        # on the other machine, then:",
        "kcache explain --against b.json",
    ],
    "config": ["kcache config", "kcache config --set max_size=20GiB", "kcache config --unset max_size"],
    "prewarm": [
        "kcache prewarm spec.toml --target cuda:90   # on a machine without that GPU",
        "kcache prewarm spec.toml --dry-run",
    ],
    "export": ["kcache export kernels.kcb.tgz", "KCACHE_SECRET=... kcache export --kind triton all.kcb"],
    "import": ["kcache import kernels.kcb.tgz -v", "kcache import --triton-cache ~/.triton/cache"],
    "remote": ["kcache remote", "kcache remote --json"],
    "dir": ["kcache dir", 'du -sh "$(kcache dir)"'],
    "trim": ["kcache trim", "kcache trim --to 5GiB"],
    "fingerprint": ["kcache fingerprint", "kcache fingerprint -o this-machine.json"],
}


def _fail(message: str) -> None:
    from .config import redact

    text = " ".join(redact(message).split())  # an exception's text may carry a URL's password
    sys.stderr.write(f"kcache: error: {text}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (never raises, never prints a traceback)."""
    from .maintenance import MaintenanceError
    from .store import StoreError

    # Paths that are not valid UTF-8 (a KCACHE_DIR of raw bytes) are printed escaped, not a crash.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except Exception:
            pass
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        if not args.command:
            raise UsageError(f"a command is needed: {', '.join(COMMANDS)} (see kcache --help)")
        _add, run = COMMANDS[args.command]
        return int(run(args) or 0)
    except UsageError as e:
        _fail(str(e))
        return 2
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except BrokenPipeError:  # `kcache inspect | head`
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except Exception:
            pass
        return 1
    except (CommandError, StoreError, MaintenanceError) as e:
        _fail(str(e))
        return 1
    except sqlite3.DatabaseError as e:
        from .store.index import is_corrupt_db

        if is_corrupt_db(e):
            _fail(f"the store's index is unreadable ({e}); `kcache verify --fix` rebuilds it")
        else:
            _fail(f"the store's index cannot be used now ({e})")
        return 1
    except Exception as e:
        _fail(f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
