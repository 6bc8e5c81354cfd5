"""Hostile inputs (issue 18, points 1, 2, 3 and 6): poisoned machine-local entries, inputs that
block, memory bombs, malformed manifests, an empty folder, paths and settings that are not what
they seem. Real processes, real files; the crafted inputs come from ``tools/chaos_inputs.py``
(its ``phase_inputs`` runs the same cases in the chaos tool).

Children import the kcache of this checkout (``PYTHONPATH``), so that this file can be run
against another commit's worktree (the older code fails these tests; see the docstrings).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNEL = ("add", "fp32", 64, 90)
KERNEL_NAME = "add/fp32/64/90"


def _load_inputs() -> Any:
    spec = importlib.util.spec_from_file_location("chaos_inputs", REPO / "tools" / "chaos_inputs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chaos_inputs", mod)
    spec.loader.exec_module(mod)
    return sys.modules["chaos_inputs"]


ci = _load_inputs()


def _lines(b: bytes) -> list[str]:
    return [ln for ln in b.decode("utf-8", "replace").splitlines() if ln.strip()]


def _no_traceback(r: subprocess.CompletedProcess) -> None:
    assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")[-3000:]


def _refused(r: subprocess.CompletedProcess, names: str | None = None) -> None:
    why = ci.one_line_failure(r, names)
    assert why is None, why


def _many(
    jobs: list[tuple[list[Any], dict[str, Any]]], timeout: float = 60
) -> list[subprocess.CompletedProcess]:
    """Several ``kcache`` commands at once (each its own process): the CLI tests are mostly
    interpreter start-up."""
    with ThreadPoolExecutor(4) as ex:
        return list(ex.map(lambda j: ci.cli(j[0], j[1], timeout=timeout), jobs))


def _compile(
    env: dict[str, Any], specs: tuple = (KERNEL,)
) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    return ci.compile_kernels(list(specs), env)


def _check_compiled(out: dict[str, Any], r: subprocess.CompletedProcess, reference: dict[str, Any]) -> None:
    assert not out["errors"], out["errors"][0]
    assert out["kernels"], r.stderr.decode(errors="replace")[-2000:]
    assert out["kernels"] == {n: reference[n] for n in out["kernels"]}, "not Triton's own kernel"


# ============================================================================= 1. machine-local


def test_poisoned_meta_never_exported_nor_imported(tmp_path: Path, reference_kernels: dict) -> None:
    """Wrong ``ptxas --version`` answers and a wrong libtriton digest for this machine's files,
    under every key format kcache used (v1, v2 and the current one): a store holding them exports
    none of them; hand-made bundles holding them (with an entry of a kind no kcache knows) import
    none of them, signed or not; a compile under KCACHE=1 on the importing store is Triton's own.

    Before efe2a87: exported, imported unsigned, and every compile failed (ptxas fatal:
    Unsupported .version 95.9)."""
    env = ci.child_env(tmp_path)
    secret = "issue-18"
    senv = ci.child_env(tmp_path, KCACHE_SECRET=secret)
    src, dst = tmp_path / "src", tmp_path / "dst"
    planted = ci.poison("plant", src, env)
    assert planted["planted"] == planted["keys"] >= 5
    bundles = {}
    for name, e in (("exported", env), ("exported-signed", senv)):
        b = tmp_path / f"{name}.tgz"
        r = ci.cli(["export", str(b), "--dir", str(src), "--json"], e)
        # nothing else in the store: nothing exported, which is a failure that says why
        err = r.stderr.decode(errors="replace")
        assert r.returncode == 1 and not b.exists(), err
        assert f"{planted['keys']} entries skipped ({planted['keys']} machine-local" in err, err
    r = ci.cli(
        ["export", str(tmp_path / "meta.tar"), "--kind", "triton-meta", "--dir", str(src), "--json"], env
    )
    assert r.returncode == 1 and b"machine-local: never exported" in r.stderr, r.stderr
    # Export refuses them, so the same entries by hand, in kcache's bundle format.
    for name, sec, e in (("handmade", None, env), ("handmade-signed", secret.encode(), senv)):
        b = tmp_path / f"{name}.tar"
        ci.poison("bundle", b, env, secret=sec)
        kinds = [rec.kind for rec in ci.bundle_records(b)]
        assert kinds.count("triton-meta") == planted["keys"] and "triton-meta-v9" in kinds
        bundles[name] = (b, e)
    for name, (b, e) in bundles.items():
        r = ci.cli(["import", str(b), "--dir", str(dst), "--json"], e)
        assert r.returncode == 0, (name, r.stderr)
        rep = json.loads(r.stdout)
        if name.startswith("handmade"):
            assert rep["signed"] == name.endswith("signed"), rep
            assert rep["imported"] + rep["present"] == 1, rep  # the ordinary kernel
            skipped = sorted(s["kind"] for s in rep["skipped"])
            assert skipped == ["triton-meta"] * planted["keys"] + ["triton-meta-v9"], rep["skipped"]
    r = ci.cli(["inspect", "--kind", "triton-meta", "--json", "--dir", str(dst)], env)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout
    out, r = _compile(ci.child_env(tmp_path, KCACHE="1", KCACHE_DIR=str(dst)))
    assert out["enabled"]
    _check_compiled(out, r, reference_kernels)


def test_planted_wrong_answers_never_break_a_compile(tmp_path: Path, reference_kernels: dict) -> None:
    """Wrong answers put straight into the store (as an older kcache's import did), under the key
    formats anyone could compute (v1, v2): one that looks right ("release 99.9"), one without a
    release (efe2a87's plausibility check let "ptxas version: none" through: Cannot find ptxas),
    and garbage; plus a wrong libtriton digest (another Triton build's key). Each compile under
    KCACHE=1 is Triton's own.

    Before efe2a87 every one failed, and at efe2a87 too: v2 keys are computable, the first two
    answers passed its check (ptxas fatal: Unsupported .version 95.9; Cannot find ptxas), and the
    wrong digest gave every kernel another key."""
    env = ci.child_env(tmp_path)
    answers = {
        "release-99.9": ci.WRONG_PTXAS,
        "no-release": ci.IMPLAUSIBLE_PTXAS[0],
        "garbage": ci.IMPLAUSIBLE_PTXAS[1],
    }
    stores = {}
    for name, wrong in answers.items():
        stores[name] = tmp_path / name
        ci.poison("plant", stores[name], env, current=False, wrong=wrong)
    with ThreadPoolExecutor(len(stores)) as ex:
        futs = {
            n: ex.submit(_compile, ci.child_env(tmp_path / f"h-{n}", KCACHE="1", KCACHE_DIR=str(s)))
            for n, s in stores.items()
        }
        results = {n: f.result() for n, f in futs.items()}
    bad = {}
    for name, (out, r) in results.items():
        try:
            assert out["enabled"]
            _check_compiled(out, r, reference_kernels)
        except AssertionError as e:
            bad[name] = str(e)[:600]
    assert not bad, bad


def test_memo_never_read_from_an_untrusted_store(tmp_path: Path, reference_kernels: dict) -> None:
    """A store writable by others, used anyway (KCACHE_ALLOW_INSECURE=1): another user can put
    entries under the exact current keys (the boot id is readable by everyone on the machine).
    Machine-local answers are never taken from such a store; the compile is Triton's own."""
    env = ci.child_env(tmp_path)
    store = tmp_path / "store"
    ci.poison("plant", store, env, current=True)
    os.chmod(store, 0o777)
    out, r = _compile(ci.child_env(tmp_path, KCACHE="1", KCACHE_DIR=str(store), KCACHE_ALLOW_INSECURE="1"))
    assert out["enabled"], r.stderr
    _check_compiled(out, r, reference_kernels)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_poisoned_meta_never_taken_from_the_shared_tier(
    signed: bool, tmp_path: Path, redis_server: Any, reference_kernels: dict
) -> None:
    """The same wrong answers set straight in the shared tier (Redis) under every key format, as
    the remote store packs entries, signed with the job's KCACHE_SECRET or not: a compile under
    KCACHE=1 with KCACHE_REMOTE is Triton's own, the tier is live (the kernel went to it), and
    no machine-local entry went to it."""
    prefix = f"poison{os.getpid()}{int(signed)}:"
    secret = "issue-18" if signed else None
    env = ci.child_env(tmp_path)
    assert (
        ci.poison("redis", f"{redis_server.url}|{prefix}", env, secret=secret.encode() if secret else None)[
            "planted"
        ]
        >= 5
    )
    extra = {"KCACHE_SECRET": secret} if secret else {}
    kenv = ci.child_env(
        tmp_path, KCACHE="1", KCACHE_DIR=str(tmp_path / "store"), KCACHE_REMOTE=redis_server.url,
        KCACHE_REMOTE_PREFIX=prefix, **extra,
    )  # fmt: skip

    # Entries are <prefix>e:<kind>:{<id>} (the id a hash tag, one slot per entry on a cluster);
    # what the compile sent is what is there after it and was not planted.
    def entry_keys() -> set[str]:
        return {k.decode() for k in redis_server.client().scan_iter(match=prefix + "e:*", count=1000)}

    planted = entry_keys()
    out, r = _compile(kenv)
    assert out["enabled"], r.stderr
    _check_compiled(out, r, reference_kernels)
    keys = entry_keys() - planted
    kinds = [k[len(prefix) + 2 :].split(":{", 1)[0] for k in keys]
    assert "triton" in kinds, keys
    assert "triton-meta" not in kinds, keys


# ============================================================================= 2. never blocks


@pytest.mark.parametrize(
    "what", ["dev-zero", "fifo", "fifo-with-writer", "folder", "link-to-dev-zero", "dev-urandom"]
)
def test_import_of_a_non_file_never_blocks(what: str, tmp_path: Path) -> None:
    """``kcache import X`` where X is not a regular file: exit 2 (a bad argument, issue 34: it
    was 1), one line naming X, within the time limit (the test fails, it does not hang, if it
    blocks), no store made. Before efe2a87 /dev/zero and the FIFOs blocked forever (and
    /dev/zero filled memory)."""
    path = {"dev-zero": "/dev/zero", "dev-urandom": "/dev/urandom", "folder": str(tmp_path)}.get(what)
    writer = None
    if what.startswith("fifo"):
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
        if what == "fifo-with-writer":  # a reader's open returns at once; its reads would wait
            writer = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    elif what == "link-to-dev-zero":
        path = str(tmp_path / "bundle.tgz")
        os.symlink("/dev/zero", path)
    try:
        r = ci.cli(["import", path, "--dir", str(tmp_path / "store")], ci.child_env(tmp_path), timeout=20)
    finally:
        if writer is not None:
            os.close(writer)
    why = ci.one_line_failure(r, path, want=2)
    assert why is None, why
    assert not (tmp_path / "store").exists()


def test_triton_cache_import_with_fifos_never_blocks(tmp_path: Path) -> None:
    """``import --triton-cache DIR`` where a ``__grp__*.json``, a group's members, a launcher or
    the folder itself is a FIFO: nothing waits; each bad kernel is skipped with a line naming it,
    the good one is imported. Before efe2a87 the FIFO ``__grp__`` blocked forever."""
    env = ci.child_env(tmp_path)
    tc = tmp_path / "triton-cache"
    ci.triton_group(tc / ci.triton_key(0))
    (tc / ci.triton_key(1)).mkdir()
    os.mkfifo(tc / ci.triton_key(1) / "__grp__k.json")
    g = ci.triton_group(tc / ci.triton_key(2))
    for n in ("k.json", "k.cubin"):
        os.unlink(g / n)
        os.mkfifo(g / n)
    os.mkfifo(tc / ci.triton_key(0) / "launcher.so")
    r = ci.cli(
        ["import", "--triton-cache", str(tc), "--dir", str(tmp_path / "store"), "--json"], env, timeout=20
    )
    _no_traceback(r)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["kernels"] == 1, rep
    why = {Path(s["path"]).parent.name: s["why"] for s in rep["skipped"]}
    assert "not a regular file" in why[ci.triton_key(1)], why
    assert "missing" in why[ci.triton_key(2)], why
    r = ci.cli(
        [
            "import",
            "--triton-cache",
            str(tc / ci.triton_key(1) / "__grp__k.json"),
            "--dir",
            str(tmp_path / "s2"),
        ],
        env,
        timeout=20,
    )
    _refused(r, "__grp__k.json")


# ============================================================================= 3. memory bombs

BOMBS = {
    # name: builder(folder) -> path; every one is refused, exit 1, before its bytes are read
    "sparse-8GiB": lambda d: ci.sparse_bundle(d / "sparse.tar"),
    "gzip-2x1.2GiB": lambda d: ci.gzip_bomb_bundle(d / "gzip-bomb.tgz"),
    "entry-2x700MiB": lambda d: ci.big_entry_bundle(d / "big-entry.tgz"),
    "member-16-times": lambda d: ci.duplicate_member_bundle(d / "dup.tgz")[0],
    "pax-header-8GiB": lambda d: ci.header_bomb_bundle(d / "pax.tar", "pax"),
    "gnu-longname-8GiB": lambda d: ci.header_bomb_bundle(d / "gnulong.tar", "gnulong"),
    "pax-header-gz-1.2GiB": lambda d: ci.header_bomb_bundle(
        d / "pax.tgz", "pax", 1288 * ci.MiB, gz=True, first=False
    ),
    "sparse-map-gz-1GiB": lambda d: ci.header_bomb_bundle(d / "map.tgz", "sparsemap", ci.GiB, gz=True),
}
#: Peak RSS of a refusing child (Python, kcache, msgpack, sqlite3: about 30 MiB here).
RSS_BUNDLE = 128 * ci.MiB


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_bundle_bomb_refused_before_reading(bomb: str, tmp_path: Path) -> None:
    """A bundle that would take gigabytes if read into memory (or write many times its size to
    disk): refused with one line, exit 1, by a child limited to 1.5 GiB of address space whose
    peak RSS stays under 128 MiB and which writes under 8 MiB.

    Before efe2a87: MemoryError (sparse, gzip, entry); at efe2a87 the tar headers (pax, GNU long
    name, sparse map), which tarfile reads whole before kcache sees them, still ended in
    MemoryError ("kcache: error: MemoryError:"), and a repeated member was staged once per copy
    (16 x 4 MiB written for a 68 KB file)."""
    path = BOMBS[bomb](tmp_path)
    r, m = ci.cli_limited(
        ["import", str(path), "--dir", str(tmp_path / "store")], ci.child_env(tmp_path), tmp_path
    )
    _refused(r, str(path))
    assert m["maxrss"] is not None and m["maxrss"] < RSS_BUNDLE, m
    assert m["wchar"] < 8 * ci.MiB, m
    assert not ci.entry_ids_on_disk(tmp_path / "store")


def test_manifest_of_many_records_refused_by_its_count(tmp_path: Path) -> None:
    """A 5 MB .tgz whose manifest (97 MB, under MAX_MANIFEST) holds 400,000 tiny records: refused
    from the array's header (MAX_RECORDS), before any record is decoded; the peak RSS stays near
    twice the manifest (its bytes, then the body's). At efe2a87 every record was decoded and kept
    (about six times the manifest: 1.1 million records, a 41 MB .tgz, ended in MemoryError), then
    400,000 "missing members" lines and exit 0."""
    path = ci.many_records_bundle(tmp_path / "many.tgz", 400_000)  # MAX_RECORDS is 250,000
    with tarfile.open(path) as t:
        manifest = t.next().size  # type: ignore[union-attr]
    r, m = ci.cli_limited(
        ["import", str(path), "--dir", str(tmp_path / "store")], ci.child_env(tmp_path), tmp_path
    )
    _refused(r, str(path))
    assert m["maxrss"] < 2.5 * manifest + 64 * ci.MiB, (m, manifest)


@pytest.mark.parametrize("suffix", [".tar", ".tgz"])
def test_legitimate_bundle_imports_under_the_same_limits(suffix: str, tmp_path: Path) -> None:
    """A bundle of a few MB made by ``kcache export`` imports whole under the same limits, and the
    store verifies."""
    env = ci.child_env(tmp_path)
    entries = ci.legit_entries(24, 160 * 1024)
    ci.write_bundle(tmp_path / "seed.tar", entries)
    assert ci.cli(["import", str(tmp_path / "seed.tar"), "--dir", str(tmp_path / "src")], env).returncode == 0
    b = tmp_path / f"bundle{suffix}"
    r = ci.cli(["export", str(b), "--dir", str(tmp_path / "src"), "--json"], env)
    assert r.returncode == 0 and json.loads(r.stdout)["entries"] == len(entries), r.stderr
    assert b.stat().st_size > 3 * ci.MiB
    r, m = ci.cli_limited(["import", str(b), "--dir", str(tmp_path / "dst"), "--json"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["imported"] == len(entries)
    assert m["maxrss"] < RSS_BUNDLE, m
    assert ci.cli(["verify", "--dir", str(tmp_path / "dst")], env).returncode == 0


def test_triton_cache_bombs_skipped_unread(tmp_path: Path) -> None:
    """A Triton cache folder with a ``__grp__`` file linked to /dev/zero, one that is /dev/zero
    (a device node, root only), one that is a sparse 8 GiB file, a kernel of three sparse 900 MiB
    files and a sparse 900 MiB ``.so``: each skipped with a line, the good kernel imported, the
    peak RSS under 300 MiB in a child limited to 1.5 GiB. Before efe2a87 the /dev/zero link
    ended in MemoryError; at efe2a87 the 3 x 900 MiB kernel did (the store write holds them all),
    and the .so was read whole to check four bytes."""
    tc = tmp_path / "triton-cache"
    ci.triton_group(tc / ci.triton_key(0))
    g = ci.triton_group(tc / ci.triton_key(1))
    os.unlink(g / "__grp__k.json")
    os.symlink("/dev/zero", g / "__grp__k.json")
    g = ci.triton_group(tc / ci.triton_key(2))
    os.truncate(g / "__grp__k.json", 8 * ci.GiB)
    g = ci.triton_group(tc / ci.triton_key(3), files={f"k.{x}": b"" for x in ("json", "cubin", "ptx")})
    for n in ("k.json", "k.cubin", "k.ptx"):
        os.truncate(g / n, 900 * ci.MiB)
    g = tc / ci.triton_key(4)
    g.mkdir(mode=0o700)
    (g / "big.so").touch(mode=0o600)
    os.truncate(g / "big.so", 900 * ci.MiB)
    expected_skips = 4
    if os.geteuid() == 0:
        g = ci.triton_group(tc / ci.triton_key(5))
        os.unlink(g / "__grp__k.json")
        os.mknod(g / "__grp__k.json", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
        expected_skips += 1
    r, m = ci.cli_limited(
        ["import", "--triton-cache", str(tc), "--dir", str(tmp_path / "store"), "--json"],
        ci.child_env(tmp_path),
        tmp_path,
    )
    _no_traceback(r)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["kernels"] == 1, rep
    assert len(rep["skipped"]) == expected_skips, rep["skipped"]
    assert m["maxrss"] < ci.RSS_SMALL, m


# ============================================================================= 6. smaller points

CHANGERS = {
    "clear --all": ["clear", "--all"],
    "clear --kind": ["clear", "--kind", "triton"],
    "verify --fix": ["verify", "--fix"],
    "stats --zero": ["stats", "--zero"],
    "import not-a-bundle": ["import", "{junk}"],
    "import --triton-cache missing": ["import", "--triton-cache", "{missing}"],
}
READERS = {
    "stats": ["stats"],
    "stats --json": ["stats", "--json"],
    "verify": ["verify"],
    "verify --json": ["verify", "--json"],
    "inspect": ["inspect"],
    "inspect PREFIX": ["inspect", "--json", "ab"],
    "explain": ["explain"],
    "clear --dry-run": ["clear", "--all", "--dry-run"],
    "export": ["export", "{out}"],
    "config": ["config", "--json"],
}


@pytest.mark.parametrize("target", ["empty", "missing"])
def test_empty_folder_never_becomes_a_store(target: str, tmp_path: Path) -> None:
    """Commands that change a store refuse an empty folder that is not one (exit 1, one line),
    as they refuse a non-empty one; commands that read may read it as empty (exit 0; ``inspect
    PREFIX`` exit 1: nothing matches; ``export`` exit 1: nothing to export). A missing folder that
    ``--dir`` names is a mistyped path for every command but ``config`` (exit 1, ``no store at``;
    issue 36). Nothing is created either way.

    Before efe2a87 ``clear --all``, ``verify --fix`` and ``stats --zero`` made the folder a
    store; at efe2a87 ``verify`` of an empty or missing folder failed ("'EmptyStore' object has
    no attribute 'index_readonly'")."""
    env = ci.child_env(tmp_path)
    d = tmp_path / "d"
    if target == "empty":
        d.mkdir(mode=0o700)
    subs = {
        "junk": str(tmp_path / "junk.tgz"),
        "missing": str(tmp_path / "no-such-cache"),
        "out": str(tmp_path / "o.tar"),
    }
    (tmp_path / "junk.tgz").write_bytes(b"\x1f\x8b not really")
    jobs = {}
    for name, args in {**CHANGERS, **READERS}.items():
        jobs[name] = ([a.format(**subs) for a in args] + ["--dir", str(d)], env)
    results = dict(zip(jobs, _many(list(jobs.values()))))
    bad = {}
    for name, r in results.items():
        if b"Traceback" in r.stderr:
            bad[name] = r.stderr[-500:]
        elif name in READERS:
            want = 1 if name in ("inspect PREFIX", "export") else 0  # export: nothing to export
            if target == "missing" and name != "config":
                want = 1 if b"no store at" in r.stderr and len(_lines(r.stderr)) == 1 else -1
            if r.returncode != want:
                bad[name] = (r.returncode, r.stdout[-300:], r.stderr[-300:])
        elif target == "empty" and (r.returncode != 1 or len(_lines(r.stderr)) != 1):
            bad[name] = (r.returncode, r.stderr[-300:])
    assert not bad, bad
    if target == "empty":
        assert os.listdir(d) == []
    else:
        assert not d.exists()


@pytest.mark.parametrize("target", ["empty", "missing"])
def test_failed_import_leaves_an_empty_folder_alone(target: str, tmp_path: Path) -> None:
    """A bundle whose manifest is fine but whose member is refused: exit 1, one line, and the
    empty (or missing) folder is left as it was. At efe2a87 (and before) it became a store: the
    store is opened before the members are read (kcache/maintenance/lifecycle.py now removes the store it made
    when the import fails and the store holds no entry)."""
    env = ci.child_env(tmp_path)
    d = tmp_path / "d"
    if target == "empty":
        d.mkdir(mode=0o700)
    rec = ci.make_record("triton", "k", {"k.cubin": b"x"})
    b = ci.write_bundle(
        tmp_path / "b.tar", [], manifest=ci.manifest_bytes([rec]), extra=[("e/../../x", b"x")]
    )
    r = ci.cli(["import", str(b), "--dir", str(d)], env)
    _refused(r, str(b))
    assert (os.listdir(d) == []) if target == "empty" else not d.exists()


LONG_DIRS = {
    "component-300": "/tmp/" + "a" * 300,
    "path-4300": "/tmp/" + "/".join(["b" * 170] * 25),
}
LONG_COMMANDS = [
    ["stats"],
    ["inspect", "--json"],
    ["clear", "--all"],
    ["verify", "--fix"],
    ["stats", "--zero"],
    ["explain"],
    ["config"],
    ["export", "/tmp/never-written.tar"],
    ["import", "/dev/null"],
]


def test_too_long_dir_is_a_bad_argument(tmp_path: Path) -> None:
    """A ``--dir`` longer than the system allows (a 300-byte name, a 4,300-byte path): exit 2 with
    one ``bad argument`` line, for every command; in ``KCACHE_DIR``, one ``bad setting`` line.
    Before efe2a87: OSError [Errno 36] File name too long, exit 1."""
    env = ci.child_env(tmp_path)
    jobs = [([*cmd, "--dir", d], env) for d in LONG_DIRS.values() for cmd in LONG_COMMANDS]
    jobs += [(["stats"], {**env, "KCACHE_DIR": d}) for d in LONG_DIRS.values()]
    bad = []
    for (args, e), r in zip(jobs, _many(jobs)):
        lines = _lines(r.stderr)
        want = "kcache: error: bad setting" if "KCACHE_DIR" in e else "kcache: error: bad argument"
        if r.returncode != 2 or len(lines) != 1 or not lines[0].startswith(want):
            bad.append((args[:2], r.returncode, lines[-2:]))
    assert not bad, bad


@pytest.mark.parametrize("variant", sorted(ci.malformed_manifests()))
def test_malformed_manifest_is_one_line(variant: str, tmp_path: Path) -> None:
    """A manifest malformed in one way (records that are not bytes, a records field that is not a
    list, a record with wrong types inside, a manifest or outer map that is not a map, ...): one
    line naming the bundle, exit 1, no traceback, no store made. Before efe2a87 several gave a
    bare TypeError (``kcache: error: TypeError: ...``) that named nothing."""
    b = ci.write_bundle(tmp_path / f"{variant}.tar", [], manifest=ci.malformed_manifests()[variant])
    r = ci.cli(["import", str(b), "--dir", str(tmp_path / "store")], ci.child_env(tmp_path))
    _refused(r, str(b))
    assert "TypeError" not in r.stderr.decode(errors="replace")
    assert not (tmp_path / "store").exists()


def test_key_tag_not_utf8_refused_once(tmp_path: Path) -> None:
    """``KCACHE_KEY_TAG`` of bytes that are not UTF-8 (os.environb): a process compiling three
    kernels prints exactly one warning, caching is off (no store made) and the kernels compile.
    Before efe2a87: two warnings per kernel, silently off."""
    env = {
        os.fsencode(k): os.fsencode(v)
        for k, v in ci.child_env(tmp_path, KCACHE="1", KCACHE_DIR=str(tmp_path / "store")).items()
    }
    env[b"KCACHE_KEY_TAG"] = b"tag-\xff\xfe"
    out, r = ci.compile_kernels([KERNEL, ("scale", "fp32", 64, 90), ("rowsum", "fp32", 64, 90)], env)
    assert not out["errors"] and len(out["kernels"]) == 3, out["errors"][:1]
    assert out["enabled"] is False
    warnings = [ln for ln in _lines(r.stderr) if ln.startswith("kcache: WARNING")]
    assert len(warnings) == 1 and "KCACHE_KEY_TAG" in warnings[0], warnings
    assert not (tmp_path / "store").exists()


NON_UTF8_COMMANDS = [
    ["stats"],
    ["verify"],
    ["export", "{out}"],
    ["clear", "--all", "--dry-run"],
    ["inspect"],
    ["inspect", "{prefix}"],
    ["config"],
    ["explain"],
]


def test_dir_not_utf8(tmp_path: Path, reference_kernels: dict) -> None:
    """A store whose path is not valid UTF-8 (``KCACHE_DIR`` from os.environb, or ``--dir`` as
    bytes): stats, verify, export, clear --dry-run, inspect, config and explain work, with and
    without --json, also with an ASCII-only stdout; a compile under KCACHE=1 caches there.
    Before efe2a87: UnicodeEncodeError from stats, verify and export."""
    base = os.fsencode(tmp_path)
    store = base + b"/st\xff\xfeore"
    env = {os.fsencode(k): os.fsencode(v) for k, v in ci.child_env(tmp_path).items()}
    ci.write_bundle(tmp_path / "seed.tar", ci.legit_entries(3, 1024))
    r = ci.cli(["import", str(tmp_path / "seed.tar"), "--dir", store], env)
    assert r.returncode == 0, r.stderr
    first = sorted(os.listdir(store + b"/entries"))[0].decode()
    jobs = []
    for i, cmd in enumerate(NON_UTF8_COMMANDS):
        args = [a.format(out=str(tmp_path / f"out{i}.tar"), prefix=first) for a in cmd]
        for js in ([], ["--json"]):
            jobs.append(([*args, *js], {**env, b"KCACHE_DIR": store}))
            jobs.append(([*args, *js, "--dir", store], {**env, b"PYTHONIOENCODING": b"ascii"}))
    bad = []
    for (args, _e), r in zip(jobs, _many(jobs)):
        if r.returncode != 0 or b"Traceback" in r.stderr or b"error" in r.stderr.lower():
            bad.append((args, r.returncode, r.stderr[-300:]))
        elif "--json" in args:
            json.loads(r.stdout)
    assert not bad, bad
    r = ci.cli(["stats", "--json"], {**env, b"KCACHE_DIR": store})
    assert json.loads(r.stdout)["entries"] == 3
    kenv = {**env, b"KCACHE": b"1", b"KCACHE_DIR": store}
    out, r = ci.compile_kernels([KERNEL], kenv)
    assert out["enabled"], r.stderr[-2000:]
    _check_compiled(out, r, reference_kernels)
    r = ci.cli(["inspect", "--kind", "triton", "--json"], kenv)
    assert r.returncode == 0, r.stderr
    assert len([e for e in json.loads(r.stdout) if not e["key"].startswith("legit/")]) == 1, r.stdout
