"""``kcache export`` and ``kcache import``: bundles, and adopting a Triton cache folder."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .base import (
    CommandError,
    UsageError,
    counted,
    fmt_value,
    jobs_arg,
    kind_arg,
    load_settings,
    open_for,
    print_error,
    print_json,
    verbose_arg,
    wants_json,
)


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="the bundle to write (.tgz/.gz: compressed)")
    p.add_argument("--kind", type=kind_arg, action="append", help="only entries of this kind (repeatable)")
    verbose_arg(p, "skipped")
    jobs_arg(p)


def _skipped_lines(res: dict[str, Any], verbose: bool) -> None:
    """One summary line of what was skipped and why; with -v, one line per entry."""
    from ..bundle import count_text, reasons

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


def export_run(args: argparse.Namespace) -> int:
    """write verified entries to a relocatable, checksummed bundle (signed with KCACHE_SECRET)"""
    from ..bundle import BundleError, count_text, export_bundle
    from ..config import format_size
    from ..maintenance import close_store
    from ..maintenance.progress import Progress

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


def import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="?", help="a bundle written by kcache export")
    p.add_argument(
        "--triton-cache", metavar="DIR", help="adopt an existing Triton cache folder (~/.triton/cache)"
    )
    verbose_arg(p, "skipped")


def import_run(args: argparse.Namespace) -> int:
    """import a bundle, or adopt a Triton cache folder (--triton-cache DIR)"""
    from ..bundle import BundleError, import_bundle, open_bundle

    if bool(args.file) == bool(args.triton_cache):
        raise UsageError("give either a bundle FILE or --triton-cache DIR")
    settings = load_settings(args)
    if settings.readonly:
        raise CommandError(f"{settings.dir} is read-only (KCACHE_READONLY=1): nothing may be imported")
    from ..maintenance.lifecycle import fresh_folder, undo_new_store
    from ..maintenance.progress import Progress
    from ..store import Store

    bundle = None
    fresh = fresh_folder(os.fspath(settings.dir))
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
                from ..triton.importer import import_triton_cache

                res = import_triton_cache(store, args.triton_cache)
            else:
                assert bundle is not None
                size = sum(r.size for r in bundle.records.values())
                with Progress("import", size, enabled=not wants_json(args), unit="bytes") as prog:
                    res = import_bundle(store, bundle, progress=prog)
                res["trust"] = _trust_of(bundle, res)
                res["secret_set"] = settings.secret is not None
                res["never_served"] = _never_served(bundle, res)
        finally:
            store.close()
    except (BundleError, OSError) as e:
        if fresh:
            undo_new_store(os.fspath(settings.dir), fresh)
        raise CommandError(str(e)) from None
    finally:
        if bundle is not None:
            bundle.close()
    problem = _import_problem(res, args)
    if problem and fresh:  # nothing imported: a folder that held no store is left as it was
        undo_new_store(os.fspath(settings.dir), fresh)
    if wants_json(args):
        res["error"] = problem
        print_json(res)
    elif args.triton_cache:
        print(
            f"adopted from {res['source']}: {counted(res['kernels'], 'kernel')} ({res['kernels_present']} "
            f"already present), {counted(res['aux'], 'launcher')}, {counted(res['autotune'], 'autotune result')}"
            + (
                f"; {counted(res['other_triton'], 'kernel')} of another Triton left out"
                if res["other_triton"]
                else ""
            )
        )
        _skipped_lines(res, args.verbose)
    else:
        from ..bundle import count_text

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
        if not problem:  # a failed import's one line says why already
            _trust_lines(res)
    if problem:
        print_error(problem)
        return 1
    return 0


def _trust_of(bundle: Any, res: dict[str, Any]) -> str:
    """How far the bundle's contents are authenticated: ``checked`` (its signature matched
    KCACHE_SECRET), ``unchecked`` (signed, but no secret here to check it with), ``unsigned``."""
    if res.get("signed"):
        return "checked"
    return "unchecked" if getattr(bundle, "unchecked_signature", False) else "unsigned"


def _never_served(bundle: Any, res: dict[str, Any]) -> dict[str, Any]:
    """The entries now in the store (imported or present) that this machine can never look up:
    built by other library versions (a Triton 3.6 bundle in a Triton 3.9 store), with what
    differs: ``{"entries": N, "differ": [{"name", "bundle", "here", "entries"}]}``."""
    from .. import fingerprint
    from ..kinds import machine_local
    from ..maintenance.clear import stale_reasons, version_components
    from ..store.records import CorruptRecord

    skipped = {s.get("id") for s in res.get("skipped") or []}
    names = version_components()
    by: dict[tuple[str, str, str], int] = {}
    n = 0
    for ident, d in bundle.records.items():
        if ident in skipped or d.invalid or machine_local(d.kind):
            continue
        try:
            comps = d.record().components
        except CorruptRecord:  # a record that does not decode was skipped by the import
            continue
        diffs = stale_reasons(comps, fingerprint.current, names)
        n += bool(diffs)
        for x in diffs:
            k = (x["name"], str(x["stored"]), str(x["current"]))
            by[k] = by.get(k, 0) + 1
    differ = [
        {"name": k[0], "bundle": k[1], "here": k[2], "entries": v}
        for k, v in sorted(by.items(), key=lambda kv: -kv[1])
    ]
    return {"entries": n, "differ": differ}


def _trust_lines(res: dict[str, Any]) -> None:
    """What an import leaves to the user's judgement: an unauthenticated bundle, and entries
    that can never be served on this machine (before, both imported without a word)."""
    trust = res.get("trust")
    if trust == "unchecked":
        print(
            "the bundle is signed, but KCACHE_SECRET is not set here: its signature was not checked "
            "(what was imported is unauthenticated; host code and torch pickles were skipped)"
        )
    elif trust == "unsigned" and res.get("secret_set"):
        print(
            "the bundle is not signed, though KCACHE_SECRET is set here: nothing in it is authenticated "
            "(host code and torch pickles were skipped; re-export it with the secret to sign it)"
        )
    never = res.get("never_served") or {}
    if never.get("entries"):
        parts = ", ".join(f"{d['name']} {d['bundle']} (here {d['here']})" for d in never["differ"][:3])
        print(
            f"{counted(never['entries'], 'entry')} of it can never be served on this machine: built with {parts}; "
            f"`kcache explain --against {res['file']}` says more, `kcache clear --stale` removes them"
        )


def _import_problem(res: dict[str, Any], args: argparse.Namespace) -> str | None:
    """Why an import brought nothing of what it was asked to, or None (see bundle.import_problem)."""
    if not args.triton_cache:
        from ..bundle import import_problem

        return import_problem(res)
    if res["kernels"] or res["kernels_present"] or res["aux"] or res["autotune"]:
        return None
    from ..bundle import reasons

    why = reasons(res["skipped"]) if res["skipped"] else "it holds no kernel of a Triton cache"
    if res["other_triton"]:
        n = res["other_triton"]
        why += f"; {counted(n, 'kernel')} {'was' if n == 1 else 'were'} built by another Triton than this one"
    return f"nothing adopted from {res['source']}: {why}"
