#!/usr/bin/env python3
"""Run another project's own test files with and without kcache; print what kcache changes.

    python3 tools/gpu_peer_check.py --suite DIR [--files a.py,b.py] [--modes plain,cold,warm]
                                    [--timeout S] [--out FILE] [--wheels DIR] [--path DIR]
                                    [-- PYTEST ARGS]

``DIR`` holds a copy of the test files (Triton 3.6's ``test_cache.py`` and ``test_autotuner.py``
with their ``conftest.py`` on the GPU machine; PyTorch's cache tests on a CPU box). They are run
from there, never copied into this project. Modes, one pytest process each, in this order:

- ``plain``: ``KCACHE`` unset;
- ``cold``: ``KCACHE=1`` on an empty store;
- ``warm``: ``KCACHE=1`` on the store ``cold`` left.

Each mode gets its own empty ``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` and ``TMPDIR``
(the suites assume nothing else). Outcomes are read from pytest's JUnit XML. Printed: each
mode's counts, then every test whose outcome with kcache (cold or warm) differs from ``plain``,
with the first line of its failure. Written to ``--out`` (default ``$OUT/gpu_peer.json``): the
counts, every test's outcome per mode, the differences, kcache's own counters after each kcache
mode, and the versions. ``--wheels DIR``: wheels installed (``pip --no-index --target``) into a
temporary folder put on ``PYTHONPATH`` first, for what the suite needs and the machine lacks
(``expecttest`` for Triton's; ``numpy``, ``expecttest`` and ``pytest-timeout`` for PyTorch's);
``--path DIR`` puts a folder first on ``PYTHONPATH`` (pytest plugins of the suite, or a checkout
of kcache to test instead of the installed one). Arguments after ``--`` go to pytest
(``-p force_triton_plugin``, ``--timeout=300``).

Exit status 0 when every mode ran its tests, whatever their outcomes (the differences are the
result); 1 when a mode ran none (a module the suite imports is missing, a collection error, a
timeout): then there is nothing to compare, and the first lines of that mode's failure are
printed instead of a verdict; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES = ("plain", "cold", "warm")


def outcomes(junit: Path) -> dict[str, dict[str, str]]:
    """test id -> {"outcome": passed|failed|error|skipped, "message": first line}."""
    out: dict[str, dict[str, str]] = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls = case.get("classname", "")
        name = case.get("name", "")
        file = case.get("file") or cls.split(".")[0] + ".py"
        test_id = f"{file}::{cls.split('.', 1)[1] + '::' if '.' in cls else ''}{name}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                lines = (child.get("message") or child.text or "").strip().splitlines()
                message = lines[0][:300] if lines else ""
                if outcome != "skipped":
                    break
        out[test_id] = {"outcome": outcome, "message": message}
    return out


def counts(results: dict[str, dict[str, str]]) -> dict[str, int]:
    c: dict[str, int] = {}
    for r in results.values():
        c[r["outcome"]] = c.get(r["outcome"], 0) + 1
    return c


def scrub(text: str, work: Path, suite: str = "") -> str:
    """Results are committed: no machine's paths in them (tracebacks name the suite's files and
    the interpreter's own modules too)."""
    import site

    pairs = [(str(work), "<work>"), (str(REPO), "<repo>"), (suite, "<suite>")]
    pairs += [(d, "<site>") for d in (*site.getsitepackages(), site.getusersitepackages())]
    pairs += [(sys.prefix, "<python>"), (sys.base_prefix, "<python>"), (str(Path.home()), "~")]
    pairs = [(path, name) for path, name in pairs if len(path) > 1]  # never "" or "/"
    for path, name in sorted(pairs, key=lambda p: -len(p[0])):
        text = text.replace(path, name)
    # pytest's warnings summary names site-packages relative to the suite: ../../main/.venv/...
    return re.sub(r"(?:\.\./)+[^\s:'\"]*?/site-packages", "<site>", text)


def install_wheels(wheels: Path, work: Path) -> str | None:
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        return None
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), *map(str, found)],
        check=True,
    )  # fmt: skip
    return str(target)


def run_mode(
    mode: str, args: argparse.Namespace, work: Path, store: Path, extra_path: str | None
) -> dict[str, Any]:
    d = work / mode
    for sub in ("triton", "inductor", "tmp"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KCACHE", "TRITON_CACHE", "TORCHINDUCTOR_CACHE", "TRITON_CACHE_AUTOTUNING"))
    }
    env.update(
        TRITON_CACHE_DIR=str(d / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(d / "inductor"),
        TMPDIR=str(d / "tmp"),
        PYTHONDONTWRITEBYTECODE="1",  # the suite's folder may be read-only
    )
    front = [*args.path, *([extra_path] if extra_path else [])]
    if front:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*front, env.get("PYTHONPATH", "")) if p)
    if mode == "cold":
        shutil.rmtree(store, ignore_errors=True)
    if mode != "plain":
        env.update(KCACHE="1", KCACHE_DIR=str(store))
    junit = d / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}",
           *args.files, *args.pytest_args]  # fmt: skip
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=args.suite, env=env, capture_output=True, text=True, timeout=args.timeout)
        tail, rc = (p.stdout + p.stderr)[-4000:], p.returncode
    except subprocess.TimeoutExpired as e:
        tail, rc = f"timed out after {args.timeout} s: {(e.stdout or b'')[-2000:]!r}", None
    res: dict[str, Any] = {"wall_s": round(time.monotonic() - t, 1), "returncode": rc, "tail": tail}
    res["tests"] = outcomes(junit)
    res["counts"] = counts(res["tests"])
    res["ran"] = ran_tests(rc, res["tests"])
    if mode != "plain":
        p = subprocess.run(
            [sys.executable, "-m", "kcache", "stats", "--json"], env=env, capture_output=True, text=True
        )
        try:
            stats = json.loads(p.stdout)
            res["kcache"] = {k: {n: v.get(n) for n in ("entries", "hits", "misses", "puts")} for k, v in stats.get("by_kind", {}).items()}  # fmt: skip
        except ValueError:
            res["kcache"] = {"error": p.stderr[-500:]}
    return res


def ran_tests(returncode: int | None, tests: dict[str, dict[str, str]]) -> bool:
    """Whether a mode's pytest ran the suite: it ended by itself with 0 (all passed) or 1 (some
    failed), and ran at least one test that was not an error. An interrupted collection (exit 2,
    with an "error" case per file that failed to import), no tests (5) or a timeout compare
    nothing: read as outcomes, they would show "no difference" between two runs that tested
    nothing."""
    return returncode in (0, 1) and any(r["outcome"] != "error" for r in tests.values())


def differences(result: dict[str, Any]) -> list[dict[str, Any]]:
    plain = result["modes"].get("plain", {}).get("tests", {})
    out = []
    for mode in ("cold", "warm"):
        if mode not in result["modes"]:  # not run (--modes): nothing to compare
            continue
        tests = result["modes"][mode]["tests"]
        for test_id in sorted(set(plain) | set(tests)):
            a = plain.get(test_id, {}).get("outcome", "absent")
            b = tests.get(test_id, {}).get("outcome", "absent")
            if a != b:
                out.append({"mode": mode, "test": test_id, "plain": a, "kcache": b,
                            "message": tests.get(test_id, {}).get("message", "")})  # fmt: skip
    return out


def kcache_hooked() -> bool:
    """Whether ``KCACHE=1`` loads kcache at ``import triton`` in a child, as the suite's processes
    get it: through the installed hook, not this checkout's path (a run on a machine where kcache
    is not installed would otherwise compare plain against plain and find no difference)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["KCACHE"] = "1"
    code = "import sys, triton; print('kcache' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=tempfile.gettempdir(),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    return p.returncode == 0 and p.stdout.strip().endswith("True")


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for mod in ("triton", "torch", "kcache"):
        try:
            out[mod] = str(__import__(mod).__version__)
        except Exception as e:  # noqa: BLE001 - a missing one is reported, not fatal
            out[mod] = f"absent ({type(e).__name__})"
    return out


def main() -> int:
    argv = sys.argv[1:]
    pytest_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True, help="folder holding the test files (and their conftest.py)")
    ap.add_argument("--files", default="", help="comma-separated test files (default: every test_*.py there)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, in order: plain, cold, warm")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per mode")
    ap.add_argument("--out", default=None, help="JSON results (default $OUT/gpu_peer.json)")
    ap.add_argument(
        "--wheels", default=None, help="wheels to put on PYTHONPATH for the suite (e.g. expecttest)"
    )
    ap.add_argument(
        "--path", action="append", default=[], help="a folder put first on PYTHONPATH (repeatable)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args(argv)
    args.pytest_args = pytest_args
    suite = Path(args.suite).resolve()
    if not suite.is_dir():
        ap.error(f"--suite {args.suite}: not a folder")
    args.suite = str(suite)
    args.path = [str(Path(p).resolve()) for p in args.path]  # pytest runs in the suite's folder
    args.files = [f for f in args.files.split(",") if f] or sorted(p.name for p in suite.glob("test_*.py"))
    missing = [f for f in args.files if not (suite / f).is_file()]
    if missing or not args.files:
        ap.error(f"no such test files in {suite}: {', '.join(missing) or '(none found)'}")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: choose from {', '.join(MODES)}")
    out_path = (
        Path(args.out)
        if args.out
        else (Path(os.environ["OUT"]) / "gpu_peer.json" if os.environ.get("OUT") else None)
    )
    if not kcache_hooked():
        print(
            "gpu_peer_check: KCACHE=1 does not load kcache in a child here (is it installed? "
            "bash tools/gpu_setup.sh): the kcache modes would run without it",
            file=sys.stderr,
        )
        return 2
    work = Path(tempfile.mkdtemp(prefix="kcache-peer-"))
    result: dict[str, Any] = {"suite": suite.name, "files": args.files, "pytest_args": pytest_args,
                              "versions": versions(), "modes": {}}  # fmt: skip
    try:
        extra = install_wheels(Path(args.wheels), work) if args.wheels else None
        for mode in modes:
            res = run_mode(mode, args, work, work / "store", extra)
            result["modes"][mode] = res
            print(f"{mode:6s} {res['wall_s']:7.1f} s  {res['counts']}", flush=True)
            result["differences"] = differences(result)
            if out_path is not None:
                out_path.parent.mkdir(parents=True, exist_ok=True)
                out_path.write_text(scrub(json.dumps(result, indent=1), work, args.suite))
            if not res["ran"]:
                why = [
                    ln
                    for ln in scrub(res["tail"], work, args.suite).splitlines()
                    if ln.startswith(("E ", "ERROR"))
                ]
                print(
                    f"gpu_peer_check: the {mode} run tested nothing (pytest exit {res['returncode']}); "
                    "no comparison. First lines of its failure:",
                    file=sys.stderr,
                )
                for line in (why or scrub(res["tail"], work, args.suite).splitlines()[-5:])[:6]:
                    print(f"  {line[:200]}", file=sys.stderr)
                return 1
        for d in result["differences"]:
            print(f"  {d['mode']:5s} {d['plain']:>7s} -> {d['kcache']:7s} {d['test']}  {d['message'][:120]}")
        if not result["differences"]:
            print("  no test's outcome differs with kcache")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
