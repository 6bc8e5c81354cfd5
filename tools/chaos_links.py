#!/usr/bin/env python
"""Chaos phase ``links``: links and swaps planted by this user and by another one (issues 16, 17).

    python tools/chaos_links.py [--seed N] [--json FILE] [--dir DIR]    # on its own
    phase_links(base, seed, log)                                        # from tools/chaos.py

Every case plants something, runs what a user runs, and checks two invariants:

- **no victim file changes**: folders of precious files (0600, with the names the store uses,
  two days old, and names a clean-up of stale leftovers would pick) are the targets of every
  link; after the commands their fingerprint (type, mode, owner, size, mtime, sha256) must be
  the same;
- **no planted launcher runs**: a launcher library planted under Triton's key for a module
  (it creates a marker file and returns 666 when loaded) must never be loaded; the module
  Triton loads returns 42.

Cases (each counted in ``cases``; every broken invariant is a line in ``failures``):

internal_folder
    ``entries/``, ``tmp/``, ``trash/``, ``locks/``, ``index/`` or the marker replaced by a link to
    a folder of victims, by this user (private store) or, as root, by uid 65534 (a shared store,
    0777, used with KCACHE_ALLOW_INSECURE=1): every command (``clear`` with every selector,
    ``verify [--fix]``, ``stats [--zero]``, ``inspect``, ``explain``, ``import``, ``export``), in
    a random order, must exit 1 with one line naming the link; a KCACHE=1 compile must go on
    uncached with one warning.
links_inside
    Random links at the names the store creates, removes or writes inside its folders (dead and
    old leftovers in ``tmp/``, ``trash/`` items, ``clock``, ``evict.lock``, kernel locks, the
    index's files, shards, entry folders), then random commands and a library workload (puts,
    hits, eviction of everything, ``clean_tmp``, an index rebuild, ``verify --fix``).
export
    Links planted at ``kcache export``'s file name and temporary names (the old predictable one
    and the one it picks, guessed right) in a sticky world-writable folder.
record
    ``KCACHE_RECORD`` at a planted link, hard link or another user's file.
swap (needs Triton and gcc)
    The store renamed away under an open process and replaced by a valid store holding the
    planted launcher; a shared store (0777 parent) swapped by uid 65534; ``entries/``, a shard or
    an entry's files writable by others and rewritten by uid 65534; a store under a 0777 folder.

Exit status 0 when every invariant held.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NOBODY = 65534
INTERNAL = ("entries", "tmp", "trash", "locks", "index")
REAL_KINDS = ("triton", "triton-autotune")

# ----------------------------------------------------------------------------------- helpers


def _env(base: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env.pop("PYTHONPATH", None)
    env["HOME"] = str(base / "home")
    env["XDG_CACHE_HOME"] = str(base / "xdg")
    env["TRITON_CACHE_DIR"] = str(base / "triton-file-cache")
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _py(
    code: str, env: dict[str, str], stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd="/",
        input=stdin,
    )


def _content(key: str, n: int) -> dict[str, bytes]:
    h = hashlib.sha256(key.encode()).digest()
    return {f"m{i}.bin": hashlib.sha256(h + bytes([i])).digest() * (1 + h[i] % 40) for i in range(n)}


def fill(root: Path, rng: random.Random, n: int, kinds: tuple[str, ...] = ("chaos", "chaos-group")) -> None:
    from kcache.store import Store

    st = Store.open(root, network_fs=False)
    try:
        for i in range(n):
            kind = rng.choice(kinds)
            st.put(kind, f"links/key-{i}", _content(f"{kind}/{i}", 1 + rng.randrange(3)))
    finally:
        st.close()


def make_victims(d: Path) -> Path:
    d.mkdir(mode=0o700, parents=True)
    names = [
        "precious",
        "kcache.sqlite",
        "kcache.sqlite-wal",
        "kcache.sqlite-shm",
        "clock",
        "evict.lock",
        "KCACHE_STORE",
        "scratch.999999999.0123456789abcdef",
        "served.999999999.fedcba9876543210",
        "00" * 20 + ".lock",
    ]
    for i, n in enumerate(names):
        (d / n).write_bytes(f"victim {i}: {n}\n".encode() * 8)
        os.chmod(d / n, 0o600)
    sub = d / ("0123456789abcdef" * 2 + "01234567.999999999.00")
    sub.mkdir(mode=0o700)
    (sub / "inner").write_bytes(b"inner victim\n")
    old = time.time() - 2 * 86400
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (old, old))
    return d


def fingerprint(d: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}

    def one(p: str) -> None:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                extra = hashlib.sha256(f.read()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            extra = os.readlink(p)
        else:
            extra = ""
        out[os.path.relpath(p, d)] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, extra)

    one(str(d))
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            one(os.path.join(dirpath, n))
    return out


def as_user(uid: int, fn: Callable[[], Any]) -> bool:
    """Run ``fn`` in a forked child dropped to ``uid`` for good; True when it succeeded."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def plant(planter: str, fn: Callable[[], Any]) -> None:
    if planter == "self":
        fn()
    elif not as_user(NOBODY, fn):
        raise RuntimeError("the planter (uid 65534) failed")


@contextlib.contextmanager
def traversable(path: Path) -> Iterator[None]:
    """Let another user traverse (not read, not write) the folders above ``path`` meanwhile."""
    opened = []
    p = path
    while p != p.parent:
        mode = stat.S_IMODE(p.stat().st_mode)
        if not mode & stat.S_IXOTH:
            opened.append((p, mode))
            os.chmod(p, mode | stat.S_IXOTH)
        p = p.parent
    try:
        yield
    finally:
        for p, mode in opened:
            with contextlib.suppress(OSError):
                os.chmod(p, mode)


CLI_BATCH = """
import contextlib, io, json, sys
import kcache.cli, kcache.log
out = []
for args in json.loads(sys.argv[1]):
    kcache.log._warned.clear()
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = kcache.cli.main(args)
    out.append({"args": args, "rc": rc, "stderr": e.getvalue()[-2000:]})
print(json.dumps(out))
"""


def run_cli(commands: list[list[str]], env: dict[str, str]) -> tuple[list[dict[str, Any]] | None, str]:
    p = subprocess.run(
        [sys.executable, "-c", CLI_BATCH, json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd="/",
    )
    if p.returncode != 0 or "Traceback" in p.stderr:
        return None, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def every_command(store: Path, bundle: Path, triton_cache: Path, export_to: Path) -> list[list[str]]:
    d = ["--dir", str(store)]
    return [
        ["stats", *d],
        ["stats", "--zero", *d],
        ["inspect", *d],
        ["inspect", "ab", *d],
        ["explain", *d],
        ["verify", *d],
        ["verify", "--fix", *d],
        ["clear", "--kind", "triton", *d],
        ["clear", "--kind", "triton-aux", "--dry-run", *d],
        ["clear", "--older-than", "1s", *d],
        ["clear", "--older-than", "0s", "--kind", "triton-autotune", *d],
        ["clear", "--stale", *d],
        ["clear", "--all", "--dry-run", *d],
        ["clear", "--all", *d],
        ["clear", "--all", "--kind", "triton", "--older-than", "0s", "--stale", *d],
        ["import", str(bundle), *d],
        ["import", "--triton-cache", str(triton_cache), *d],
        ["export", str(export_to), *d],
    ]


COMPILE_CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("kcache_chaos", {chaos!r})
chaos = importlib.util.module_from_spec(spec); sys.modules["kcache_chaos"] = chaos
spec.loader.exec_module(chaos)
import triton, kcache
k = chaos.compile_kernel(chaos.kernel_specs(1)[0])
st = kcache.active_store()
if st is not None:
    {after}
print(json.dumps({{"enabled": kcache.is_enabled(), "digest": chaos.kernel_digest(k)}}))
"""


def _triton_ok() -> bool:
    try:
        import triton  # noqa: F401
        from triton.runtime import build

        return hasattr(build, "compile_module_from_src")
    except Exception:
        return False


def _warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("kcache: WARNING")]


# ----------------------------------------------------------------------------------- cases


class Phase:
    def __init__(self, base: Path, seed: int, log: Callable[[str], None]) -> None:
        self.base, self.rng, self.log = base, random.Random(seed), log
        self.cases: Counter = Counter()
        self.failures: list[str] = []
        self.n = 0
        self.root_user = os.geteuid() == 0
        self.planters = ("self", "nobody") if self.root_user else ("self",)
        self.triton = _triton_ok()
        self._bundle: Path | None = None

    def fail(self, case: str, msg: str) -> None:
        self.failures.append(f"{case}: {msg}"[:4000])

    def fresh(self, name: str) -> Path:
        self.n += 1
        d = self.base / f"{self.n:03d}-{name}"
        d.mkdir(parents=True)
        return d

    def bundle(self) -> Path:
        if self._bundle is None:
            from kcache.bundle import export_bundle
            from kcache.store import Store

            d = self.fresh("bundle")
            fill(d / "store", self.rng, 4, REAL_KINDS)
            st = Store.open(d / "store", network_fs=False)
            try:
                export_bundle(st, d / "in.kcb")
            finally:
                st.close()
            self._bundle = d / "in.kcb"
        return self._bundle

    def store_for(self, d: Path, planter: str) -> tuple[Path, dict[str, str]]:
        root = d / "shared" / "store"
        root.parent.mkdir()
        fill(root, self.rng, 3 + self.rng.randrange(6))
        extra: dict[str, str] = {}
        if planter == "nobody":
            subs = ["", *INTERNAL, *(f"entries/{s}" for s in os.listdir(root / "entries"))]
            for sub in subs:
                os.chmod(root / sub, 0o777)
            extra["KCACHE_ALLOW_INSECURE"] = "1"
        return root, extra

    def commands(self, d: Path, root: Path) -> list[list[str]]:
        tc = d / "triton-cache"
        tc.mkdir(mode=0o700, exist_ok=True)
        (d / "out").mkdir(exist_ok=True)
        cmds = every_command(root, self.bundle(), tc, d / "out" / "x.kcb")
        self.rng.shuffle(cmds)
        return cmds

    # -- issue 16 --------------------------------------------------------------------------
    def internal_folder(self, sub: str, planter: str) -> None:
        case = f"internal_folder[{sub},{planter}]"
        d = self.fresh("internal")
        root, extra = self.store_for(d, planter)
        victims = make_victims(d / "victims")
        before = fingerprint(victims)

        def relink() -> None:
            os.rename(root / sub, root / f".{sub}.moved")
            os.symlink(victims, root / sub)

        plant(planter, relink)
        env = _env(d, **extra)
        results, err = run_cli(self.commands(d, root), env)
        self.cases["internal_folder"] += 1
        if results is None:
            self.fail(case, f"the command line crashed: {err}")
        else:
            self.cases["commands"] += len(results)
            want = "symbolic link" if sub == "KCACHE_STORE" else f"{root}/{sub} is a link or not a folder"
            for r in results:
                lines = r["stderr"].strip().splitlines()
                if r["rc"] != 1 or len(lines) != 1 or want not in lines[0]:
                    self.fail(case, f"{r['args'][:3]}: rc={r['rc']} {r['stderr']!r}")
            if os.listdir(d / "out"):
                self.fail(case, "export wrote a file from a refused store")
        if self.triton:
            p = _py(
                COMPILE_CHILD.format(chaos=str(HERE.parent / "chaos.py"), after="pass"),
                _env(d, KCACHE="1", KCACHE_DIR=str(root), **extra),
            )
            w = _warnings(p.stderr)
            if p.returncode != 0 or "Traceback" in p.stderr:
                self.fail(case, f"compile crashed: {p.stderr[-2000:]}")
            elif json.loads(p.stdout.strip().splitlines()[-1])["enabled"] or len(w) != 1:
                self.fail(case, f"compile: expected caching off and one warning, got {w}")
            self.cases["compiles"] += 1
        if fingerprint(victims) != before:
            self.fail(case, "a victim file changed")

    def links_inside(self, planter: str) -> None:
        case = f"links_inside[{planter}]"
        d = self.fresh("inside")
        root, extra = self.store_for(d, planter)
        victims = make_victims(d / "victims")
        before = fingerprint(victims)
        rng = self.rng
        files = [p for p in victims.iterdir() if p.is_file()]
        shards = sorted(os.listdir(root / "entries"))
        cands: list[tuple[str, Path]] = [
            (f"tmp/scratch.{rng.choice([999999999, 1, os.getpid()])}.{rng.getrandbits(64):016x}", victims),
            (f"tmp/served.{rng.randrange(2, 10**6)}.{rng.getrandbits(64):016x}", victims),
            ("tmp/" + rng.choice(["old", "x", "stray"]), rng.choice(files)),
            (f"trash/{rng.getrandbits(160):040x}.{rng.randrange(10**6)}.00", victims),
            ("trash/" + rng.choice(["a", "b"]), rng.choice(files)),
            ("locks/evict.lock", rng.choice(files)),
            ("locks/clock", rng.choice(files)),
            (f"locks/{rng.getrandbits(160):040x}.lock", rng.choice(files)),
            ("index/kcache.sqlite-" + rng.choice(["wal", "shm"]), rng.choice(files)),
            (f"entries/{rng.getrandbits(8):02x}", victims),
        ]
        for s in shards:
            cands.append((f"entries/{s}/{s}{rng.getrandbits(152):038x}", victims))
        chosen = rng.sample(cands, k=max(3, len(cands) // 2))
        old = time.time() - 3 * 86400

        def do() -> None:
            for rel, target in chosen:
                p = root / rel
                if os.path.lexists(p):
                    os.rename(p, str(p) + ".moved")
                os.symlink(target, p)
                os.utime(p, (old, old), follow_symlinks=False)

        plant(planter, do)
        self.cases["links_inside"] += 1
        self.cases["links_planted"] += len(chosen)
        env = _env(d, **extra)
        results, err = run_cli(self.commands(d, root), env)
        if results is None:
            self.fail(case, f"the command line crashed: {err}")
        else:
            self.cases["commands"] += len(results)
            for r in results:
                if r["rc"] not in (0, 1):
                    self.fail(case, f"{r['args'][:3]}: rc={r['rc']} {r['stderr']!r}")
        plant(planter, do)
        code = f"""
import kcache, kcache.store.tunables as local
local.GRACE_S = 0.0
kcache.enable(dir={str(root)!r}, max_size=1, triton=False, nvfuser=False)
st = kcache.active_store()
for i in range(8):
    st.put("chaos", f"n{{i}}", {{"a.bin": bytes([i]) * 100}})
    st.get("chaos", f"links/key-{{i}}")
st.evict(0); st.clean_tmp(0); st.rebuild_index(); st.close()
from kcache import config, maintenance
s = config.load(env={{"KCACHE_ALLOW_INSECURE": {extra.get("KCACHE_ALLOW_INSECURE", "0")!r}}}, dir={str(root)!r})
w = maintenance.open_store(s, write=True); maintenance.verify(w, fix=True); maintenance.close_store(w)
print("done")
"""
        p = _py(code, env)
        if p.returncode != 0 or "Traceback" in p.stderr or "done" not in p.stdout:
            self.fail(case, f"library workload: {p.stderr[-2000:]}")
        if fingerprint(victims) != before:
            self.fail(case, f"a victim file changed (planted: {[c[0] for c in chosen]})")

    def export(self, planter: str, where: str) -> None:
        case = f"export[{planter},{where}]"
        d = self.fresh("export")
        root = d / "store"
        fill(root, self.rng, 3, REAL_KINDS)
        victims = make_victims(d / "victims")
        victim = victims / "precious"
        before = fingerprint(victims)
        shared = d / "shared"
        shared.mkdir()
        owner = NOBODY if planter == "nobody" else 0
        os.chown(shared, owner, owner)
        os.chmod(shared, 0o1777)
        names = {"final": ["b.kcb"], "temporary": [".b.kcb.tmp", ".b.kcb.guessed.tmp"]}
        names["both"] = names["final"] + names["temporary"]
        plant(planter, lambda: [os.symlink(victim, shared / n) for n in names[where]])
        code = f"""
import sys
import kcache.store.fs as fs
real, calls = fs.unique_name, []
def guess(prefix):
    calls.append(prefix)
    return prefix + ".guessed" if len(calls) == 1 else real(prefix)
fs.unique_name = guess
import kcache.cli
sys.exit(kcache.cli.main(["export", {str(shared / "b.kcb")!r}, "--dir", {str(root)!r}]))
"""
        p = _py(code, _env(d))
        self.cases["export"] += 1
        if "Traceback" in p.stderr:
            self.fail(case, p.stderr[-2000:])
        elif p.returncode == 0:
            if os.path.islink(shared / "b.kcb") or not os.path.isfile(shared / "b.kcb"):
                self.fail(case, "exported, but not as a new file")
        elif p.returncode != 1 or len(p.stderr.strip().splitlines()) != 1:
            self.fail(case, f"rc={p.returncode} {p.stderr!r}")
        if fingerprint(victims) != before:
            self.fail(case, "the victim's file changed")

    def record(self, how: str) -> None:
        case = f"record[{how}]"
        from kcache.prewarm.record import Recorder

        d = self.fresh("record")
        victims = make_victims(d / "victims")
        before = fingerprint(victims)
        shared = d / "shared"
        shared.mkdir()
        os.chmod(shared, 0o1777)
        spec = shared / "spec.toml"
        if how == "symlink":
            plant(self.planters[-1], lambda: os.symlink(victims / "precious", spec))
        elif how == "hardlink":
            os.link(victims / "precious", spec)
        else:
            plant(self.planters[-1], lambda: spec.write_text("# theirs\n"))
        theirs = spec.read_bytes()
        rec = Recorder(str(spec))
        rec._pending[(id(None), "None")] = ("0" * 16, {"kernel": "m:f", "args": {"n": 1}}, None)
        rec.commit({})
        self.cases["record"] += 1
        if rec.recorded or fingerprint(victims) != before or spec.read_bytes() != theirs:
            self.fail(case, "appended to a planted name")

    # -- issue 17 --------------------------------------------------------------------------
    def swaps(self) -> None:
        if not self.triton or not shutil.which("gcc"):
            self.cases["swap_skipped_no_triton_or_gcc"] += 1
            return
        d = self.fresh("swap")
        probe = _Probe(d)
        # (1) in-process: this user's valid store with the planted launcher swapped in.
        store = d / "store"
        planted = d / "planted"
        probe.plant(_env(d, KCACHE="1", KCACHE_DIR=str(planted)))
        out, err = probe.load(_env(d, KCACHE="1", KCACHE_DIR=str(store)), swap=(store, planted, None))
        self._check_probe("swap[in-process]", probe, out, err, want_file=True)
        if self.root_user:
            # (1) by another user, through a folder it can write, in three timings.
            for when in ("writable_at_open", "allow_insecure", "writable_after_open"):
                dd = self.fresh("swap-nobody")
                shared = dd / "shared"
                shared.mkdir()
                os.chmod(shared, 0o755)
                st = shared / "store"
                from kcache.store import Store

                Store.open(st, network_fs=False).close()
                theirs = shared / "theirs"
                probe.plant(_env(dd, KCACHE="1", KCACHE_DIR=str(theirs)))
                _chown(theirs, NOBODY)
                extra = {"KCACHE_ALLOW_INSECURE": "1"} if when == "allow_insecure" else {}
                if when != "writable_after_open":
                    os.chmod(shared, 0o777)
                with traversable(dd):
                    out, err = probe.load(
                        _env(dd, KCACHE="1", KCACHE_DIR=str(st), **extra),
                        swap=(st, theirs, NOBODY),
                        before_swap=(lambda s=shared: os.chmod(s, 0o777))
                        if when == "writable_after_open"
                        else None,
                    )
                self._check_probe(f"swap[{when}]", probe, out, err, want_file=when == "writable_after_open")
            # (2) a subfolder others can write, rewritten by another user.
            for how in ("entries", "shard", "files"):
                self._subfolder(probe, how)

    def _subfolder(self, probe: _Probe, how: str) -> None:
        d = self.fresh(f"subfolder-{how}")
        store = d / "store"
        env = _env(d, KCACHE="1", KCACHE_DIR=str(store))
        out, err = probe.load(env)
        ids = [n for s in os.listdir(store / "entries") for n in os.listdir(store / "entries" / s)]
        if out is None or out.get("f") != 42 or len(ids) != 1:
            self.fail(f"subfolder[{how}]", f"setup: {out} {err[-1000:]}")
            return
        ident = ids[0]
        shard = store / "entries" / ident[:2]
        theirs = d / "theirs"
        probe.plant(_env(d, KCACHE="1", KCACHE_DIR=str(theirs)))
        _chown(theirs, NOBODY)
        evil_entry = theirs / "entries" / ident[:2] / ident
        for p in (theirs, theirs / "entries", evil_entry.parent, evil_entry):
            os.chmod(p, 0o755)
        os.chmod(store, 0o755)
        if how == "entries":
            os.chmod(store / "entries", 0o777)

            def attack() -> None:
                os.rename(shard, store / "entries" / "old")
                shutil.copytree(evil_entry.parent, shard)

        elif how == "shard":
            os.chmod(store / "entries", 0o755)
            os.chmod(shard, 0o777)

            def attack() -> None:
                os.rename(shard / ident, shard / "old")
                shutil.copytree(evil_entry, shard / ident)

        else:
            for p in (store / "entries", shard, shard / ident):
                os.chmod(p, 0o755)
            for f in (shard / ident).iterdir():
                os.chmod(f, 0o666)

            def attack() -> None:
                for f in evil_entry.iterdir():
                    with open(shard / ident / f.name, "r+b") as dst:
                        dst.write(f.read_bytes())
                        dst.truncate()

        with traversable(d):
            if not as_user(NOBODY, attack):
                self.fail(f"subfolder[{how}]", "the attack itself failed")
                return
        out, err = probe.load(env)
        self._check_probe(f"subfolder[{how}]", probe, out, err, want_file=False, want_warning=True)

    def _check_probe(
        self,
        case: str,
        probe: _Probe,
        out: dict | None,
        err: str,
        *,
        want_file: bool,
        want_warning: bool = False,
    ) -> None:
        self.cases["swap"] += 1
        if out is None:
            self.fail(case, f"the child failed: {err[-2000:]}")
        elif out.get("f") != 42:
            self.fail(case, f"f() = {out.get('f')}: the planted launcher was loaded")
        elif want_file and not str(out.get("file", "")).startswith("/proc/self/fd/"):
            self.fail(case, f"the launcher was loaded from {out.get('file')}, not through the pinned store")
        if probe.marker.exists():
            self.fail(case, "the planted launcher's code ran (marker file)")
            probe.marker.unlink()
        if want_warning and not _warnings(err):
            self.fail(case, "refused without a warning")


def _chown(root: Path, uid: int) -> None:
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), uid, uid)


PROBE_SRC = r"""
#include <Python.h>
static PyObject* f(PyObject* self, PyObject* args) { return PyLong_FromLong(%(value)d); }
static PyMethodDef M[] = {{"f", f, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "kc_probe", NULL, -1, M};
PyMODINIT_FUNC PyInit_kc_probe(void) {
    %(init)s
    return PyModule_Create(&D);
}
"""

LOAD = """
import json, sys
import triton
from triton.runtime import build
import kcache
out = {{"enabled": kcache.is_enabled()}}
if {wait!r}:
    kcache.active_store()
    print("READY", flush=True)
    sys.stdin.readline()
mod = build.compile_module_from_src({src!r}, "kc_probe")
out["f"] = mod.f(); out["file"] = mod.__file__
print(json.dumps(out))
"""

# Triton's own code for the good source, its C compiler step answering with the evil library and
# its loading step left out: the library lands under the key Triton itself uses, in any version.
PLANT = """
import triton
from triton.runtime import build
build._build = lambda *a, **k: {evil!r}
build._load_module_from_path = lambda name, path: None
build.compile_module_from_src({src!r}, "kc_probe")
"""


class _Probe:
    """Triton's launcher path with a module of our own: the good source (f() == 42) and a
    library planted under its key (f() == 666, creates ``marker`` when loaded)."""

    def __init__(self, d: Path) -> None:
        self.marker = d / "PWNED"
        self.good = PROBE_SRC % {"value": 42, "init": ""}
        c = d / "evil.c"
        c.write_text(
            PROBE_SRC % {"value": 666, "init": f'FILE* m = fopen("{self.marker}", "w"); if (m) fclose(m);'}
        )
        self.evil = d / "evil.so"
        inc = sysconfig.get_paths()["include"]
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O0", f"-I{inc}", str(c), "-o", str(self.evil)],
            check=True,
            capture_output=True,
        )
        os.chmod(self.evil, 0o644)

    def plant(self, env: dict[str, str]) -> None:
        p = _py(PLANT.format(src=self.good, evil=str(self.evil)), env)
        if p.returncode != 0:
            raise RuntimeError(f"planting failed: {p.stderr[-2000:]}")

    def load(
        self,
        env: dict[str, str],
        swap: tuple[Path, Path, int | None] | None = None,
        before_swap: Callable[[], None] | None = None,
    ) -> tuple[dict | None, str]:
        """Load the module in a child; with ``swap`` (store, replacement, as uid), the child
        opens its store first and the folders are swapped before it builds."""
        code = LOAD.format(src=self.good, wait=swap is not None)
        if swap is None:
            p = _py(code, env)
            out = (
                json.loads(p.stdout.strip().splitlines()[-1])
                if p.returncode == 0 and p.stdout.strip()
                else None
            )
            return out, p.stderr
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
        )
        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                proc.kill()
                return None, proc.communicate()[1]
            if before_swap is not None:
                before_swap()
            store, repl, uid = swap

            def do() -> None:
                os.rename(store, str(store) + ".old")
                os.rename(repl, store)

            if uid is None:
                do()
            elif not as_user(uid, do):
                proc.kill()
                return None, "the swap failed"
            out_s, err = proc.communicate("go\n", timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if proc.returncode != 0 or not out_s.strip():
            return None, err
        return json.loads(out_s.strip().splitlines()[-1]), err


# ----------------------------------------------------------------------------------- the phase


def phase_links(base: Path, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every case above, once per planter (this user; uid 65534 as well when run as root), in
    an order and with names drawn from ``seed``. Returns {"cases", "failures", ...}."""
    t0 = time.perf_counter()
    base.mkdir(parents=True, exist_ok=True)
    ph = Phase(base, seed, log)
    with traversable(base) if ph.root_user else contextlib.nullcontext():
        jobs: list[tuple[str, Callable[[], None]]] = []
        for planter in ph.planters:
            for sub in (*INTERNAL, "KCACHE_STORE"):
                jobs.append(
                    (f"internal_folder[{sub},{planter}]", lambda s=sub, p=planter: ph.internal_folder(s, p))
                )
            for _ in range(2):
                jobs.append((f"links_inside[{planter}]", lambda p=planter: ph.links_inside(p)))
            for where in ("final", "temporary", "both"):
                jobs.append((f"export[{planter},{where}]", lambda p=planter, w=where: ph.export(p, w)))
        for how in ("symlink", "hardlink", "foreign_file"):
            if how == "hardlink" or ph.root_user:
                jobs.append((f"record[{how}]", lambda h=how: ph.record(h)))
        jobs.append(("swaps", ph.swaps))
        ph.rng.shuffle(jobs)
        for name, job in jobs:
            try:
                job()
            except Exception:
                ph.fail(name, traceback.format_exc(limit=6))
    res = {
        "cases": dict(ph.cases),
        "planters": list(ph.planters),
        "seconds": round(time.perf_counter() - t0, 1),
        "failures": ph.failures,
    }
    log(f"links: {json.dumps({k: v for k, v in res.items() if k != 'failures'})}")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--dir", help="work directory (default: a fresh temporary one, removed after)")
    ap.add_argument("--json", help="write the report here")
    a = ap.parse_args(argv)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kcache-chaos-links-"))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        res = phase_links(base / "links", a.seed, log)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "failures"}, indent=2))
    for f in res["failures"][:20]:
        print(f"FAIL links: {f}", file=sys.stderr)
    return 0 if not res["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
