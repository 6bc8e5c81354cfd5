"""``kcache stats``, ``kcache trim`` and ``kcache dir``: the store's size, counters and bound."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .base import (
    UsageError,
    counted,
    fmt_rate,
    fmt_seconds,
    load_settings,
    open_for,
    print_json,
    table,
    wants_json,
)


def stats_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zero", action="store_true", help="reset the counters (hits, misses, ...) first")


def stats_run(args: argparse.Namespace) -> int:
    """entries and bytes by kind, hits, misses, hit rate, compile time saved"""
    from ..maintenance import close_store, stats, zero_counters
    from ..maintenance.bound import bound_of

    settings = load_settings(args)
    store = open_for(args, write=args.zero)
    try:
        if args.zero:
            zero_counters(store)
        data = stats(store)
        # The folder as du (and a disk quota) counts it, which the bound is on; "held": what
        # live processes hold beside the store's entries (a missing store: nothing).
        disk = getattr(store, "disk", None)  # (the local tier; a missing store has none)
        data["disk"] = disk.footprint() if disk is not None else None
    finally:
        close_store(store)
    data["bound"] = bound_of(settings)
    data["max_size"] = data["bound"]["store"]  # the bound the store's writers use
    if args.zero:
        data["zeroed"] = True
    if wants_json(args):
        print_json(data)
        return 0
    from ..config import format_size

    b = data["bound"]
    used = f"{format_size(data['bytes'])} of {format_size(b['store'])}"
    used += f" ({100 * data['bytes'] / b['store']:.1f}%), bound from {b['store_source']}"
    where = data["dir"] if os.path.isdir(data["dir"]) else f"{data['dir']} (nothing cached here yet)"
    rows = [["store", where], ["size", used]]
    d = data["disk"]
    if d is not None:
        rows.append(
            [
                "on disk",
                f"{format_size(d['total'])} of {format_size(b['store'])} ({100 * d['total'] / b['store']:.1f}%): "
                f"entries {format_size(d['entries'])}, index {format_size(d['index'])}, "
                f"held by live processes {format_size(d['held'])}",
            ]
        )
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
                *([["recached", data["recached"]]] if data["recached"] else []),
                ["updated", _when(data["updated_at"])],
                ["zeroed", _when(data["zeroed_at"])],
            ],
        ).split("\n", 1)[1]
    )
    if data["by_kind"]:
        print()
        from ..kinds import machine_local

        rows = [
            [
                k,
                v["entries"],
                format_size(v["bytes"]),
                *(("-", "-", "-") if machine_local(k) else (v["hits"], v["misses"], fmt_rate(v["hit_rate"]))),
                fmt_seconds(v["saved_s"]),
            ]
            for k, v in data["by_kind"].items()
        ]
        print(
            table(["kind", "entries", "size", "hits", "misses", "hit rate", "saved"], rows, right=range(1, 7))
        )
        for line in _notes(data["by_kind"]):
            print(line)
    if data.get("remote"):
        _print_remote_counts(data)
    if args.zero:
        print("\ncounters zeroed")
    return 0


def _notes(by_kind: dict[str, dict[str, Any]]) -> list[str]:
    """What the table alone leaves open: a kind with saved time and no hits, a kind with hits
    and no saved time (issue 36: "saved" and hit counts that did not add up)."""
    out = []
    from ..kinds import machine_local

    for k, v in by_kind.items():
        if machine_local(k) and (v.get("uses") or v["saved_s"]):
            out.append(
                f"{k}: answers about this machine kept for the next process (libtriton's digest, "
                f"ptxas --version, CPU probes): used {counted(v.get('uses', 0), 'time')}, not counted as hits; "
                "the time they saved is counted in saved"
            )
        elif v["hits"] and v.get("covered_s"):
            out.append(
                f"{k}: {fmt_seconds(v['covered_s'])} more saved by its hits is counted once, with the "
                "torch.compile graphs served with them"
            )
    return ["", *out] if out else []


def _when(t: float | None) -> str:
    """A counter time to the second, as ccache's "Stats updated" (``never`` when there is none)."""
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "never"


def _print_remote_counts(data: dict[str, Any]) -> None:
    """The shared tier's rows of ``kcache stats`` (its hits are part of the hits above)."""
    from ..config import format_size

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


def trim_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--to",
        metavar="SIZE",
        help="trim the entries to SIZE on disk (e.g. 5GiB) instead of the folder to 90%% of the bound, "
        "as eviction does",
    )


def trim_run(args: argparse.Namespace) -> int:
    """remove least recently used entries now until the store is within its bound (ccache -c)"""
    from ..config import format_size, parse_size
    from ..maintenance import EmptyStore, close_store
    from ..maintenance.bound import bound_of
    from ..store import tunables

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
        # No --to: the whole folder down to 90% of the bound, as eviction does (the bound counts
        # its blocks, the index and what live processes hold); --to: the entries' blocks.
        removed, freed = store.evict(target)
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


def dir_args(p: argparse.ArgumentParser) -> None:
    pass


def dir_run(args: argparse.Namespace) -> int:
    """print the store's folder (like `pip cache dir`), whether or not it exists yet"""
    settings = load_settings(args, strict=False)
    src = settings.sources.get("dir", "default")
    if wants_json(args):
        print_json({"dir": str(settings.dir), "source": src, "exists": os.path.isdir(settings.dir)})
    else:
        print(settings.dir)
    return 0
