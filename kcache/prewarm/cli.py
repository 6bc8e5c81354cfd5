"""``kcache prewarm SPEC``: the command line of :mod:`kcache.prewarm`.

:func:`add_arguments` and :func:`run` plug into kcache's command registry; :func:`main` is
``python -m kcache.prewarm``. Exit codes: 0 everything prepared (or skipped with a reason),
1 something failed (the summary says what and why), 2 a bad spec or bad arguments (one line,
nothing changed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

HELP = "compile (and on a GPU, autotune) what a spec file lists; with --target, for a GPU not here"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="a prewarm spec (TOML); see docs/prewarm.md")
    parser.add_argument(
        "--target",
        metavar="cuda:ARCH",
        help="compile for this GPU on a machine without it (cuda:80, cuda:90, cuda:100, ...)",
    )
    parser.add_argument("--jobs", "-j", type=int, default=1, metavar="N", help="worker processes (default 1)")
    parser.add_argument(
        "--dry-run", action="store_true", help="check the spec and list the work; compile nothing"
    )
    parser.add_argument(
        "--protect",
        default="7d",
        metavar="AGE",
        help="keep prewarmed entries from eviction until first used, at most this long (default 7d; 0: off)",
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory to import the spec's modules from (repeatable; the spec's folder and the "
        "current directory are always searched)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown only on a terminal)"
    )
    if not any(a.dest == "dir" for a in parser._actions):
        parser.add_argument("--dir", metavar="DIR", help="the store (default: KCACHE_DIR)")
    if not any(a.dest == "json" for a in parser._actions):
        parser.add_argument("--json", action="store_true", help="machine-readable summary on stdout")


def run(args: argparse.Namespace) -> int:
    """compile (and on a GPU, autotune) what a spec lists; with --target, for a GPU not here"""
    from ..config import parse_age
    from . import runner
    from .spec import SpecError

    def fail(msg: str) -> int:
        print_error(msg)
        return 2

    try:
        protect = parse_age(args.protect)
    except ValueError as e:
        return fail(f"--protect: {e}")
    as_json = bool(getattr(args, "json", False))
    real_stdout = sys.stdout
    try:
        # The modules a spec names may print: with --json, stdout carries the summary only.
        with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
            summary = runner.run(
                args.spec,
                target=args.target,
                jobs=args.jobs,
                dry_run=args.dry_run,
                dir=getattr(args, "dir", None),
                progress=False if args.no_progress or as_json else None,
                protect_s=protect,
                paths=args.path,
                in_process=True,
            )
    except SpecError as e:
        return fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    if as_json:
        json.dump(summary.as_dict(), real_stdout, indent=1, default=str)
        real_stdout.write("\n")
    else:
        print(summary.format())
    return summary.exit_code


def print_error(message: str) -> None:
    """``kcache: error: MESSAGE``, one line on stderr, as every other command says it (a secret
    in it redacted)."""
    from ..redact import redact

    print("kcache: error: " + " ".join(redact(message).split()), file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2
        print_error(message)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="kcache prewarm", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
