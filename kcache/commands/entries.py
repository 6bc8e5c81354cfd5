"""``kcache inspect``, ``kcache clear`` and ``kcache verify``: the entries, listed, removed, checked."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import (
    UsageError,
    age_arg,
    count_arg,
    counted,
    fmt_seconds,
    fmt_time,
    fmt_value,
    jobs_arg,
    kind_arg,
    open_for,
    prefix_arg,
    print_error,
    print_json,
    summary_text,
    table,
    wants_json,
)

if TYPE_CHECKING:
    from ..store.api import Admin


def inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", type=kind_arg, help="only entries of this kind")
    p.add_argument(
        "--limit", type=count_arg, default=50, help="at most N entries or groups (default 50; 0: all)"
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
        type=prefix_arg,
        metavar="ID|KEY|NAME",
        help="an entry id or key prefix (the whole record), else a name pattern (the matching entries)",
    )


def inspect_run(args: argparse.Namespace) -> int:
    """list entries (kind, id, size, created, last used, hits, what they hold); sort, group by name,
    select by name pattern; with an id or key prefix, the whole record"""
    from ..config import format_size
    from ..maintenance import close_store, find_entries, list_entries
    from ..maintenance.inspect import group_entries
    from ..maintenance.select import looks_like_id

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
        print_error(_no_match(args.name or args.pattern, args.kind, "id, key"))
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


def _no_match(pattern: str, kind: str | None, ids: str) -> str:
    return f"no entry {ids} or name matches {pattern!r}" + (f" among {kind} entries" if kind else "")


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
        ["size", f"{format_size(d['size'])} in {counted(len(d['files']), 'file')}"],
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


def clear_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", type=kind_arg, help="entries of this kind")
    p.add_argument(
        "--older-than", type=age_arg, metavar="AGE", help="entries not used for AGE (e.g. 7d, 12h, 30m, 45s)"
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
        type=prefix_arg,
        metavar="ID|NAME",
        help="an entry id (prefix), else a name pattern",
    )


def _resolve_ids(store: Admin, wanted: list[str]) -> list[str]:
    """Full ids for each id or unique id prefix (UsageError when one matches none or several)."""
    from ..maintenance.select import ids_with_prefix, looks_like_id

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


def clear_run(args: argparse.Namespace) -> int:
    """remove entries (by kind, age, staleness, name, id, or all); selectors combine"""
    from ..config import format_size
    from ..maintenance import clear, close_store
    from ..maintenance.progress import Progress
    from ..maintenance.select import ids_with_prefix, looks_like_id

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
    # A name or id that matches nothing is most often a typo: a failure, as for `inspect` (a
    # --kind, --older-than or --stale that selects nothing is a store with nothing to remove).
    unmatched = bool(name) and not res["count"]
    if wants_json(args):
        print_json(res)
        return 1 if unmatched else 0
    if unmatched:
        print_error(_no_match(name, args.kind, "id"))
        return 1
    n, size = res["count"], format_size(res["bytes"])
    if args.dry_run:
        print(f"would remove {counted(n, 'entry')}, {size} (dry run: nothing changed)")
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
    msg = f"removed {counted(n, 'entry')}, {size}"
    if res["leftovers"]:
        msg += f"; cleaned {counted(res['leftovers'], 'leftover')} from tmp/ and trash/"
    print(msg)
    if not res["index_updated"]:
        print(
            f"the entries are gone, but the index could not be updated ({res['index_problem']}); "
            "stats may count them until `kcache verify --fix` runs (with some free space)"
        )
    return 0


def verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fix", action="store_true", help="remove bad entries and rows, re-index, rebuild a corrupt index"
    )
    jobs_arg(p)


def verify_run(args: argparse.Namespace) -> int:
    """check every entry against its checksums, and the index against the entries"""
    from ..integrations import entry_checks
    from ..maintenance import close_store, verify
    from ..maintenance.progress import Progress

    store = open_for(args, write=args.fix)
    try:
        total = sum(1 for _ in store.iter_entry_ids())
        with Progress("verify", total, enabled=not wants_json(args)) as prog:
            res = verify(store, fix=args.fix, progress=prog, jobs=args.jobs or None, checks=entry_checks())
    finally:
        close_store(store)
    if wants_json(args):
        print_json(res)
        return 0 if res["ok"] else 1
    n = len(res["problems"])
    print(
        f"checked {counted(res['entries'], 'entry')} in {res['dir']}: "
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
