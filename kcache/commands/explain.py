"""``kcache explain`` (why lookups missed, here or against another machine) and ``kcache
fingerprint`` (this machine's identity as the keys see it)."""

from __future__ import annotations

import argparse

from .base import (
    CommandError,
    count_arg,
    counted,
    fmt_time,
    fmt_value,
    kind_arg,
    load_settings,
    open_for,
    print_json,
    table,
    wants_json,
)


def explain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", type=kind_arg, help="only misses of this kind")
    p.add_argument(
        "--limit",
        type=count_arg,
        default=10,
        help="at most N misses, most recent first (default 10; 0: all kept)",
    )
    p.add_argument("--nearest", type=count_arg, default=3, help="stored entries shown per miss (default 3)")
    p.add_argument(
        "--against",
        metavar="OTHER",
        help="why this machine misses what OTHER has: another store's folder, a bundle, or a file "
        "written by `kcache fingerprint --json` on the other machine",
    )


def _explain_against(args: argparse.Namespace) -> int:
    from ..maintenance import close_store
    from ..maintenance.against import UNEXPLAINED, explain_against

    settings = load_settings(args)
    store = open_for(args, missing_ok=True)  # a new node, nothing cached yet: what would it miss?
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
            f"{o['path']} ({o['type']}) holds {counted(o['entries'], 'entry')}: {res['present']} are here, "
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


def explain_run(args: argparse.Namespace) -> int:
    """why lookups missed: the nearest stored entries and the key components that differ; with
    --against OTHER, why this machine misses what another store, bundle or machine has"""
    from ..maintenance import close_store, explain

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
        envs = sorted(
            {d["name"][4:] for n in m["nearest"] for d in n["differ"] if d["name"].startswith("env.")}
        )
        if envs:
            print(f"  {_ENV_HINT.format(', '.join(fmt_value(e, 40) for e in envs))}")
    return 0


# Following Triton's own advice (3.9 warns that TRITON_DEFAULT_FP_FUSION is unset) changes every
# kernel's key, even set to the default's value: the store then seems empty (issue 36, point 8).
_ENV_HINT = (
    "{}: Triton puts this variable in every kernel's key, set or not (set to its default value is "
    "another key too): set it alike in every process that shares the store, and in a prewarm spec's [env]"
)


def fingerprint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", metavar="FILE", help="write the JSON document to FILE (implies --json)")


def fingerprint_run(args: argparse.Namespace) -> int:
    """this machine's identity as the keys see it (builds, GPU, KCACHE_KEY_TAG, Triton's variables);
    --json writes it for `kcache explain --against` on another machine"""
    from ..maintenance.identity import describe, document

    settings = load_settings(args)
    doc = document(settings.key_tag)
    if args.output:
        from ..maintenance.against import write_fingerprint

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
