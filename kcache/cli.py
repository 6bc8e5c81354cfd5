"""The ``kcache`` command line (also ``python -m kcache``). Thin: the work is in
:mod:`kcache.maintenance`; this module parses arguments and formats results.

Exit status: 0 done (``verify``: the store is sound), 1 a runtime failure (the store cannot be
used; ``verify``: problems remain; ``inspect PREFIX``: nothing matches), 2 bad arguments or a bad
setting. Errors are one line on stderr, never a traceback; ``--json`` output goes to stdout only.

Subcommands live in :data:`COMMANDS`, name -> ``(add_arguments, run)``, the one registry:
``add_arguments(parser)`` adds the command's own options (``--dir`` and ``--json`` are added
for every command), and ``run(args) -> int`` does it and returns the exit status. ``run``
raises :class:`UsageError` for a bad value (exit 2) and :class:`CommandError` (or
``StoreError``) for a failure (exit 1). The commands themselves are in :mod:`kcache.commands`,
one module per group.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import NoReturn

from .commands import bundles, config, entries, explain, stats
from .commands.base import CommandError, UsageError
from .commands.base import print_error as _fail
from .prewarm import cli as _prewarm_cli

__all__ = ["COMMANDS", "CommandError", "UsageError", "build_parser", "main"]

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own: usage + message, here one line
        raise UsageError(message)


#: Subcommands: name -> (add_arguments, run). The help line is the first line of run's docstring.
#: add_arguments(parser) adds the command's options (--dir and --json come for free); run(args)
#: returns the exit status (see kcache.commands.base for what commands share). Keep every command
#: module cheap to import (no torch/triton at import time): every command pays for it.
COMMANDS: dict[str, tuple[AddArguments, Run]] = {
    "stats": (stats.stats_args, stats.stats_run),
    "inspect": (entries.inspect_args, entries.inspect_run),
    "clear": (entries.clear_args, entries.clear_run),
    "verify": (entries.verify_args, entries.verify_run),
    "explain": (explain.explain_args, explain.explain_run),
    "config": (config.config_args, config.config_run),
    "prewarm": (_prewarm_cli.add_arguments, _prewarm_cli.run),
    "export": (bundles.export_args, bundles.export_run),
    "import": (bundles.import_args, bundles.import_run),
    "remote": (config.remote_args, config.remote_run),
    "dir": (stats.dir_args, stats.dir_run),
    "trim": (stats.trim_args, stats.trim_run),
    "fingerprint": (explain.fingerprint_args, explain.fingerprint_run),
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
        doc = " ".join((run.__doc__ or "").split()).rstrip(".")  # the description adds its own
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


#: The names ccache and pip-cache users type by habit, where the command does the same thing
#: (`kcache --help` lists them next to the command). pip's `purge` is `kcache clear --all`: no
#: alias, since `clear` without a selector refuses on purpose.
ALIASES = {"trim": ["cleanup"], "inspect": ["list"], "clear": ["remove"], "stats": ["info"]}

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (never raises, never prints a traceback)."""
    from .maintenance import MaintenanceError
    from .store import StoreError
    from .userfile import UserFileError

    # Paths that are not valid UTF-8 (a KCACHE_DIR of raw bytes) are printed escaped, not a crash.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # a stream that is no text file (replaced)
            pass
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        if not args.command:
            raise UsageError(f"a command is needed: {', '.join(COMMANDS)} (see kcache --help)")
        _add, run = COMMANDS[args.command]
        return int(run(args) or 0)
    except (UsageError, UserFileError) as e:  # a file a user named that is no file to read: theirs to fix
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
        except (OSError, ValueError, AttributeError):  # no /dev/null, no stdout descriptor: exit
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
    except Exception as e:  # broad: the command line's last resort: one line, exit 1, never a traceback
        _fail(f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
