"""``kcache config`` (the settings, where each comes from, settings kept with the store) and
``kcache remote`` (the shared tier)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .base import (
    CommandError,
    UsageError,
    count_arg,
    load_settings,
    print_json,
    table,
    wants_json,
)


def config_args(p: argparse.ArgumentParser) -> None:
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
    from ..store import Store
    from ..store.conf import ConfError, check, write

    values: dict[str, Any] = {}
    try:
        for item in args.set or []:
            name, eq, value = item.partition("=")
            if not eq:
                raise UsageError(f"--set {item!r}: expected NAME=VALUE (e.g. max_size=20GiB)")
            values[name.strip()] = check(name.strip(), value.strip())
        for name in args.unset or []:
            check_name = name.strip()
            from ..store.conf import KEYS

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
    from ..config import format_size

    for k, v in values.items():
        shown = "unset" if v is None else (format_size(v) if k == "max_size" else v)
        print(f"{k}: {shown} (kept in {os.path.join(str(settings.dir), 'kcache.conf')})")
    if settings.sources.get("max_size", "default") != "default" and "max_size" in values:
        print("note: KCACHE_MAX_SIZE in this environment wins over it for processes started here")
    return 0


def config_run(args: argparse.Namespace) -> int:
    """the effective settings, where each came from (the environment, the store's kcache.conf, a
    default), and whether the store folder is usable; --set/--unset keep settings with the store"""
    from ..config import format_size
    from ..maintenance import config_report

    if args.set or args.unset:
        return _config_change(args)
    res = config_report(load_settings(args, strict=False))
    if wants_json(args):
        print_json(res)
        return 0
    # Problems first: a bad value shows the default in its row, and the reason must not be
    # left for the bottom of a long table.
    if res["problems"]:
        print("problems (caching is off until they are fixed):")
        for p in res["problems"]:
            print(f"  {p}")
    if res.get("remote_problems"):
        print("problems with the shared tier (it is off until they are fixed; local caching is on):")
        for p in res["remote_problems"]:
            print(f"  {p}")
    if res["problems"] or res.get("remote_problems"):
        print()
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
    return 0


def remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--limit",
        type=count_arg,
        default=10_000,
        help="look at most N entry keys, a page of each node in turn (default 10000; 0: all)",
    )


def remote_run(args: argparse.Namespace) -> int:
    """the shared tier (KCACHE_REMOTE): whether it answers, each node, and what kcache holds there"""
    from ..config import format_size
    from ..maintenance.remote import remote_report

    settings = load_settings(args, strict=False)
    if settings.remote_problems:
        raise UsageError("bad setting: " + "; ".join(settings.remote_problems))
    if not settings.remote:
        raise UsageError(
            "no shared tier configured: set KCACHE_REMOTE=redis://host:port/db or "
            "KCACHE_REMOTE=s3://bucket/prefix (docs/remote.md)"
        )
    res = remote_report(settings, limit=args.limit)
    if wants_json(args):
        print_json(res)
        return 0 if res["reachable"] and "error" not in res else 1

    def memory(srv: dict[str, Any]) -> str:
        if "used_memory" not in srv:
            return "?"
        mm = int(srv.get("maxmemory") or 0)
        return f"{format_size(int(srv['used_memory']))} of {format_size(mm) if mm else 'no maxmemory'}"

    rows = [["url", res["url"]], ["backend", res.get("backend", "?")]]
    for field in ("endpoint", "region"):  # S3: where the bucket was found
        if res.get(field):
            rows.append([field, res[field]])
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
