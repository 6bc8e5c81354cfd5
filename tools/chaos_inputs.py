#!/usr/bin/env python
"""Hostile inputs against kcache (issue 18): bundles, Triton cache folders, settings, clocks, a
full disk, files a user names. The builders here are shared with
``tests/reliability/test_hostile_inputs.py``, ``tests/reliability/test_clock_and_disk.py`` and
``tests/reliability/test_hostile_files.py``; :func:`phase_inputs` runs every case once (the
chaos tool's ``inputs`` phase):

    python tools/chaos_inputs.py [--dir DIR] [--seed N]

Every case runs kcache in a fresh child process (``PYTHONPATH`` = this checkout), with a time
limit (a case that blocks fails, it does not hang the run) and, for the memory bombs, an address
space limit (``RLIMIT_AS`` 1.5 GiB): reading a bomb into memory ends in MemoryError, which fails
the case, and the child's peak RSS and bytes written are measured.

Cases (each a ``"name": {...}`` in the result; ``failures`` lists what went wrong), one module each
beside this file by what they attack; what they share is chaos_inputs_common.py:

poisoned meta (chaos_meta.py)
    A bundle whose ``triton-meta`` entries answer ``ptxas --version`` wrongly for this machine's
    ptxas (and give a wrong libtriton digest), under every key format kcache ever used, signed
    and unsigned; ``kcache export`` of a store holding such entries; the same answers planted
    straight in a store. A real Triton compile under ``KCACHE=1`` must work and be Triton's own.
never blocks (chaos_bundles.py)
    ``kcache import`` of ``/dev/zero``, a FIFO, a folder; ``--triton-cache`` with a FIFO or a
    device where ``__grp__*.json`` or a member is expected.
memory bombs (chaos_bundles.py)
    A 3 KB sparse tar claiming 8 GiB, a gzip bomb (2 x 1.2 GiB), tar headers (pax, GNU long
    name, sparse map) claiming gigabytes, a member repeated, an entry of 2 x 700 MiB, a
    ``__grp__`` file linked to /dev/zero, sparse files of 900 MiB in a Triton cache folder.
malformed manifests (chaos_bundles.py)
    Drawn at random (``seed``): records that are not bytes, a records field that is not a list,
    records with wrong types inside, manifests that are not maps.
clock skew (chaos_clock_disk.py)
    A process whose clock runs an hour ahead evicts under a tiny bound while another uses
    entries: what was used within the grace period stays.
full disk (chaos_clock_disk.py)
    ``kcache clear --kind`` and ``clear --all`` on a tmpfs filled to the last byte (root only).
user files (chaos_userfiles.py)
    (issue 34) ``explain --against``, ``import`` and ``prewarm`` against a FIFO, a link to one,
    ``/dev/stdin`` on a silent pipe, a 1 GiB sparse file that starts like the real thing and a
    document nested 100,000 deep: refused at once (exit 2, one line), under 1.5 GiB.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
PYTHON = sys.executable
if str(HERE.parent) not in sys.path:  # the families beside this file (loaded by path from the tests)
    sys.path.insert(0, str(HERE.parent))

# The cases, one module each by what they attack; what they share is chaos_inputs_common.py. Every
# builder stays importable from here: the reliability tests and the cases' child processes use
# them as ``chaos_inputs.NAME``.
from chaos_bundles import (  # noqa: E402
    TarStream,
    big_entry_bundle,
    case_malformed,
    case_memory_bombs,
    case_never_blocks,
    duplicate_member_bundle,
    gzip_bomb_bundle,
    header_bomb_bundle,
    legit_entries,
    malformed_manifests,
    many_records_bundle,
    sparse_bundle,
    tar_header,
    write_bundle,
)
from chaos_clock_disk import (  # noqa: E402
    FILL_CHILD,
    SKEW_SITE,
    STORE_CHILD,
    age_entries,
    case_clock_skew,
    case_full_disk,
    content,
    entry_bytes,
    entry_ids_on_disk,
    fill_inodes,
    fill_store,
    fill_to_the_last_byte,
    finish,
    free_bytes,
    mount_tmpfs,
    skewed_env,
    store_child,
    umount,
)
from chaos_inputs_common import (  # noqa: E402
    AS_LIMIT,
    IMPLAUSIBLE_PTXAS,
    LIMITED_CLI,
    RSS_SMALL,
    SKEW_S,
    TRITON_KEY,
    WRONG_DIGEST,
    WRONG_PTXAS,
    GiB,
    MiB,
    child_env,
    cli,
    cli_limited,
    declared_record,
    error_lines,
    kcache_records,
    make_record,
    manifest_bytes,
    one_line_failure,
    text,
    triton_group,
    triton_key,
)
from chaos_meta import (  # noqa: E402
    COMPILE_CHILD,
    META_KEYS,
    POISON_CHILD,
    bundle_records,
    case_poisoned_meta,
    compile_kernels,
    poison,
)
from chaos_userfiles import (  # noqa: E402
    DEEP,
    SPEC_HEAD,
    USER_FILE_ATTACKS,
    USER_FILE_COMMANDS,
    USER_FILE_CONTENT_BOUNDED,
    case_user_files,
    close_pipe,
    deep_bundle,
    deep_fingerprint,
    deep_spec,
    fingerprint_head,
    user_file,
    user_file_case,
)

__all__ = [
    "AS_LIMIT",
    "COMPILE_CHILD",
    "DEEP",
    "FILL_CHILD",
    "GiB",
    "IMPLAUSIBLE_PTXAS",
    "LIMITED_CLI",
    "META_KEYS",
    "MiB",
    "POISON_CHILD",
    "RSS_SMALL",
    "SKEW_S",
    "SKEW_SITE",
    "SPEC_HEAD",
    "STORE_CHILD",
    "TRITON_KEY",
    "TarStream",
    "USER_FILE_ATTACKS",
    "USER_FILE_COMMANDS",
    "USER_FILE_CONTENT_BOUNDED",
    "WRONG_DIGEST",
    "WRONG_PTXAS",
    "age_entries",
    "big_entry_bundle",
    "bundle_records",
    "case_clock_skew",
    "case_full_disk",
    "case_malformed",
    "case_memory_bombs",
    "case_never_blocks",
    "case_poisoned_meta",
    "case_user_files",
    "child_env",
    "cli",
    "cli_limited",
    "close_pipe",
    "compile_kernels",
    "content",
    "declared_record",
    "deep_bundle",
    "deep_fingerprint",
    "deep_spec",
    "duplicate_member_bundle",
    "entry_bytes",
    "entry_ids_on_disk",
    "error_lines",
    "fill_inodes",
    "fill_store",
    "fill_to_the_last_byte",
    "fingerprint_head",
    "finish",
    "free_bytes",
    "gzip_bomb_bundle",
    "header_bomb_bundle",
    "kcache_records",
    "legit_entries",
    "make_record",
    "malformed_manifests",
    "manifest_bytes",
    "many_records_bundle",
    "mount_tmpfs",
    "one_line_failure",
    "phase_inputs",
    "poison",
    "skewed_env",
    "sparse_bundle",
    "store_child",
    "tar_header",
    "text",
    "triton_group",
    "triton_key",
    "umount",
    "user_file",
    "user_file_case",
    "write_bundle",
]

# ----------------------------------------------------------------------------------- the phase


def phase_inputs(base: Path, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every hostile-input case once; ``failures`` says what did not hold."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    failures: list[str] = []
    cases: dict[str, Any] = {}
    t0 = time.perf_counter()

    def case(name: str, fn: Callable[[Path], dict[str, Any]]) -> None:
        d = base / name
        d.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        try:
            res = fn(d)
        except subprocess.TimeoutExpired as e:
            res = {"failures": [f"blocked: {e.cmd!r:.200} did not end in {e.timeout} s"]}
        except Exception as e:  # the case itself broke: a failure, with what it was
            res = {"failures": [f"{type(e).__name__}: {e}"]}
        res["seconds"] = round(time.perf_counter() - t, 2)
        failures.extend(f"{name}: {f}" for f in res.get("failures", []))
        cases[name] = res
        log(f"inputs {name}: {len(res.get('failures', []))} failures, {res['seconds']} s")

    case("never_blocks", case_never_blocks)
    case("memory_bombs", case_memory_bombs)
    case("malformed_manifests", lambda d: case_malformed(d, rng))
    case("poisoned_meta", case_poisoned_meta)
    case("clock_skew", case_clock_skew)
    case("full_disk", case_full_disk)
    case("user_files", case_user_files)
    return {"cases": cases, "seconds": round(time.perf_counter() - t0, 1), "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kcache against hostile inputs (issue 18)")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kcache-inputs-"))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        res = phase_inputs(base, a.seed, log)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "cases"}, indent=2, default=str))
    return 0 if not res["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
