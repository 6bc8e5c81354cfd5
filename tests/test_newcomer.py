"""What a first-time user trips on (issue 36): mistyped inputs that succeeded silently, output
that did not add up, settings and commands that ccache, sccache and pip-cache users reach for.

Real processes (``python -m kcache``) on real stores under tmp_path, filled through the store's
own put/get; each test names the behaviour a newcomer met and fails when it comes back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kcache import fingerprint
from kcache.store import Store


def kc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kcache", *args], env=env, capture_output=True, text=True, timeout=120
    )


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The command failed with ``code`` and one ``kcache: error:`` line (no traceback)."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kcache: error: "), r.stderr
    return lines[0]


def fill(root: Path, n: int = 2) -> list[str]:
    """A store with ``n`` Triton entries named kern0.. (one hit on the first); their ids."""
    s = Store.open(root)
    ids = []
    for i in range(n):
        comps = {"kernel": f"kern{i}", "triton_version": fingerprint.current("triton_version")}
        hit = s.put(
            "triton",
            f"KEY{i}",
            {"k.cubin": bytes([i]) * 100, "k.json": b"{}"},
            components=comps,
            summary={"name": f"kern{i}", "target": "cuda:90"},
            compile_s=0.5,
        )
        assert hit is not None
        ids.append(hit.record.id)
    assert s.get("triton", "KEY0") is not None
    s.close()
    return ids


# ------------------------------------------------------------------ point 3: mistyped inputs
@pytest.mark.parametrize(
    "argv",
    [["stats"], ["stats", "--json"], ["inspect"], ["verify"], ["clear", "--all"], ["explain"], ["trim"]],
)
def test_a_named_folder_that_does_not_exist_is_an_error_not_an_empty_store(argv, tmp_path, clean_env):
    # `kcache stats --dir /no/such/dir` printed an empty store and exited 0; `clear --all` and
    # `verify` on it reported success. A folder that --dir or KCACHE_DIR names and that does not
    # exist is most often a typo: one line that says so, exit 1, and nothing is created.
    missing = tmp_path / "no" / "such" / "dir"
    r = kc(clean_env, *argv, "--dir", str(missing))
    assert "no store at" in one_line_error(r) and "--dir" in r.stderr
    r = kc(dict(clean_env, KCACHE_DIR=str(missing)), *argv)
    assert "no store at" in one_line_error(r) and "KCACHE_DIR" in r.stderr
    assert not (tmp_path / "no").exists()


def test_explain_against_reads_a_missing_store_as_a_new_node(tmp_path, clean_env):
    # `explain --against OTHER` from a node where nothing was cached yet is the question it
    # answers (why would this node miss what the other has): a missing store is empty there.
    other = tmp_path / "other"
    fill(other)
    r = kc(clean_env, "explain", "--against", str(other), "--json", "--dir", str(tmp_path / "new-node"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["lacking"] == 2 and not (tmp_path / "new-node").exists()


def test_the_default_folder_not_made_yet_still_reads_as_an_empty_store(tmp_path, clean_env):
    # A fresh machine's `kcache stats` (nothing cached yet, the default folder) is no mistake.
    r = kc(clean_env, "stats")
    assert r.returncode == 0, r.stderr
    assert "nothing cached here yet" in r.stdout
    assert kc(clean_env, "verify").returncode == 0
    assert not (tmp_path / "xdg" / "kcache").exists()


def test_clear_of_a_name_that_matches_nothing_fails_as_inspect_does(tmp_path, clean_env):
    # `kcache clear no_such_name` printed "removed 0 entries" and exited 0, where `inspect
    # no_such_name` said nothing matched and exited 1.
    root = tmp_path / "store"
    fill(root)
    for argv in (["clear", "no_such_name"], ["clear", "--name", "no_such_*"], ["inspect", "no_such_name"]):
        line = one_line_error(kc(clean_env, *argv, "--dir", str(root)))
        assert "matches 'no_such" in line, line
    r = kc(clean_env, "clear", "no_such_name", "--dry-run", "--json", "--dir", str(root))
    assert r.returncode == 1 and json.loads(r.stdout)["count"] == 0
    # a name that matches removes, exit 0; a --kind with nothing of it is no mistake
    r = kc(clean_env, "clear", "kern1", "--dir", str(root))
    assert r.returncode == 0 and "removed 1 entry" in r.stdout, r.stderr
    assert kc(clean_env, "clear", "--kind", "nvfuser", "--dir", str(root)).returncode == 0


def test_config_says_at_the_top_that_a_bad_value_is_ignored(tmp_path, clean_env):
    # `KCACHE_MAX_SIZE=12XB kcache config` showed max_size "10.0 GiB ... default" and named the
    # problem only at the bottom.
    r = kc(dict(clean_env, KCACHE_MAX_SIZE="12XB"), "config", "--dir", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("problems") and "KCACHE_MAX_SIZE='12XB'" in lines[1], r.stdout
    row = next(ln for ln in lines if ln.startswith("max_size "))
    assert "KCACHE_MAX_SIZE is bad, ignored" in row, row
    data = json.loads(kc(dict(clean_env, KCACHE_MAX_SIZE="12XB"), "config", "--json").stdout)
    row = next(r for r in data["settings"] if r["name"] == "max_size")
    assert row["bad"] is True and "ignored" in row["source"]


# ------------------------------------------------------------------ point 5: numbers that add up
def test_a_prewarm_finding_an_entry_is_not_a_hit_in_stats_nor_in_the_entry(tmp_path, clean_env):
    # A repeated prewarm added 7 hits to `kcache stats` while `inspect` showed 0 hits on every
    # entry: a prewarm's lookups are checks of what the store holds, not uses. Its own summary
    # still counts them (this process's totals).
    root = tmp_path / "store"
    fill(root)
    s = Store.open(root)
    undo = s.protect(3600.0)  # what `kcache prewarm` does in its processes
    assert s.get("triton", "KEY1") is not None and s.get("triton", "NOKEY") is None
    undo()
    assert s.counts.process_totals()["triton"]["hits"] == 1
    s.close()
    data = json.loads(kc(clean_env, "stats", "--json", "--dir", str(root)).stdout)
    assert data["by_kind"]["triton"]["hits"] == 1  # fill()'s own hit of KEY0, nothing more
    assert data["by_kind"]["triton"]["misses"] == 0
    assert data["by_kind"]["triton"]["saved_s"] == 0.5
    rows = json.loads(kc(clean_env, "inspect", "--json", "--dir", str(root)).stdout)
    assert sum(r["hits"] for r in rows) == data["hits"] == 1


def test_stats_says_what_saved_time_without_hits_and_hits_without_saved_time_are(tmp_path, clean_env):
    # After the quickstart `triton-meta` showed 0 hits and 0.5 s saved; after a served model
    # `inductor-cpp` showed 6 hits and 0.0 s saved. The table now shows no hit columns for
    # machine-local answers, and a line under it says what each number is.
    from kcache import counters, memo

    root = tmp_path / "store"
    s = Store.open(root)
    memo.keep(s, "probe-key", "answer", b"42", {"file": "libtriton.so"}, 0.75)
    assert memo.recall(s, "probe-key", "answer") == b"42"
    s.put("inductor-cpp", "CPPKEY", {"k.so": b"\x7fELF"}, compile_s=2.0)
    counters.graph_lookup(10.0)  # a served graph whose recorded time covers its kernels
    try:
        assert s.get("inductor-cpp", "CPPKEY") is not None
    finally:
        counters.graph_lookup(None)
    s.close()
    data = json.loads(kc(clean_env, "stats", "--json", "--dir", str(root)).stdout)
    meta, cpp = data["by_kind"]["triton-meta"], data["by_kind"]["inductor-cpp"]
    assert meta["uses"] == 1 and meta["hits"] == 0 and meta["saved_s"] == 0.75
    assert cpp["hits"] == 1 and cpp["saved_s"] == 0.0 and cpp["covered_s"] == 2.0
    out = kc(clean_env, "stats", "--dir", str(root)).stdout
    row = next(ln for ln in out.splitlines() if ln.startswith("triton-meta "))
    assert row.split()[4:7] == ["-", "-", "-"], row  # kind, entries, size (2 words), hits, misses, rate
    assert "triton-meta: answers about this machine" in out and "used 1 time," in out, out
    assert "not counted as hits; the time they saved is counted in saved\n" in out, out  # (a whole sentence)
    assert "inductor-cpp: 2.0 s more saved by its hits is counted once, with the torch.compile graphs" in out


# ------------------------------------------------------------------ what ccache and pip users reach for
def test_stats_say_when_the_counters_were_updated_and_zeroed(tmp_path, clean_env):
    import time

    root = tmp_path / "store"
    t0 = time.time()
    fill(root)
    data = json.loads(kc(clean_env, "stats", "--json", "--dir", str(root)).stdout)
    assert data["zeroed_at"] is None and t0 - 5 <= data["updated_at"] <= time.time() + 5
    out = kc(clean_env, "stats", "--dir", str(root)).stdout
    assert "zeroed       never" in out and "updated      2" in out, out
    r = kc(clean_env, "stats", "--zero", "--json", "--dir", str(root))
    assert r.returncode == 0, r.stderr
    data = json.loads(kc(clean_env, "stats", "--json", "--dir", str(root)).stdout)
    assert t0 - 5 <= data["zeroed_at"] <= time.time() + 5 and data["hits"] == 0


def test_pip_cache_names_are_aliases_that_help_shows(tmp_path, clean_env):
    root = tmp_path / "store"
    fill(root)
    top = kc(clean_env, "--help").stdout
    for shown in ("stats (info)", "inspect (list)", "clear (remove)", "trim (cleanup)"):
        assert shown in top, top
    listed = kc(clean_env, "list", "kern", "--json", "--dir", str(root))
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 2
    assert json.loads(kc(clean_env, "info", "--json", "--dir", str(root)).stdout)["entries"] == 2
    r = kc(clean_env, "remove", "kern0", "--dir", str(root))
    assert r.returncode == 0 and "removed 1 entry," in r.stdout, r.stderr


# ------------------------------------------------------------------ point 10: small output, docs
def test_clear_older_than_names_what_goes_and_says_its_age_in_a_unit_that_reads(tmp_path, clean_env):
    # `clear --older-than` left the name empty (`name: null`) and said "unused for 0.0d" for 26
    # minutes; "1 files" in inspect.
    root = tmp_path / "store"
    ids = fill(root, n=1)
    old = time_ago = 26 * 60
    rec = root / "entries" / ids[0][:2] / ids[0]
    for p in [rec, *rec.rglob("*")]:
        os.utime(p, (p.stat().st_atime - time_ago, p.stat().st_mtime - time_ago))
    import sqlite3

    with sqlite3.connect(root / "index" / "kcache.sqlite") as db:
        db.execute("UPDATE entries SET last_used = last_used - ?, created = created - ?", (old, old))
    r = kc(clean_env, "clear", "--older-than", "10m", "--dry-run", "--json", "--dir", str(root))
    (e,) = json.loads(r.stdout)["entries"]
    assert e["name"] == "kern0" and e["why"] == "unused for 26m", e
    text = kc(clean_env, "clear", "--older-than", "10m", "--dry-run", "--dir", str(root)).stdout
    assert "would remove 1 entry," in text and "kern0" in text, text
    full = kc(clean_env, "inspect", ids[0][:12], "--dir", str(root)).stdout
    assert " in 2 files" in full
    one = Store.open(tmp_path / "one")
    one.put("triton", "ONE", {"k.cubin": b"x"})
    one.close()
    full = kc(clean_env, "inspect", "--dir", str(tmp_path / "one"), "--json").stdout
    out = kc(clean_env, "inspect", json.loads(full)[0]["id"][:12], "--dir", str(tmp_path / "one")).stdout
    assert " in 1 file\n" in out, out


def test_prewarm_help_and_errors_speak_as_every_other_command(tmp_path, clean_env):
    # prewarm's help ended "not here.."; its errors began `kcache prewarm: error:`.
    r = kc(clean_env, "prewarm", "--help")
    assert r.returncode == 0 and ".." not in r.stdout.replace("...", ""), r.stdout
    r = kc(clean_env, "prewarm", str(tmp_path / "no-such-spec.toml"), "--dir", str(tmp_path / "s"))
    line = one_line_error(r, 2)
    assert "prewarm: error" not in line
    r = kc(clean_env, "prewarm", "--jobs")
    one_line_error(r, 2)


def test_every_kind_and_every_stats_field_is_documented() -> None:
    # `quarantined` (stats) and `inductor-other` (kinds) were documented nowhere.
    from kcache.kinds import KNOWN

    repo = Path(__file__).resolve().parents[1]
    usage = (repo / "docs" / "usage.md").read_text()
    missing = [k for k in sorted(KNOWN) if f"`{k}`" not in usage]
    assert not missing, f"kinds not in docs/usage.md: {missing}"
    from kcache import config
    from kcache.maintenance import EmptyStore, stats

    data = stats(EmptyStore(config.load(env={}, dir="/nonexistent-kcache-docs")))
    data["by_kind"] = {}
    section = usage.split("### `kcache stats", 1)[1].split("\n### ", 1)[0]
    fields = [f for f in data if f'"{f}"' not in section]
    assert not fields, f"stats --json fields not in docs/usage.md's stats section: {fields}"
    for f in ("quarantined", "covered_s", "uses", "updated_at", "zeroed_at"):
        assert f in section, f


# ------------------------------------------------------------------ KCACHE_RECACHE, KCACHE_LOGFILE
QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "examples" / "quickstart.py"


def test_recache_compiles_again_and_overwrites_what_a_lookup_would_serve(tmp_path, clean_env):
    # ccache's CCACHE_RECACHE: the store's lookups miss whatever it holds, and what is compiled
    # again replaces the stored entry. Real Triton compiles, through the quickstart.
    root = tmp_path / "store"
    env = dict(clean_env, KCACHE="1", KCACHE_DIR=str(root))
    first = subprocess.run(
        [sys.executable, str(QUICKSTART)], env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0 and "hit (from kcache)" in first.stdout, first.stdout + first.stderr
    before = json.loads(kc(clean_env, "inspect", "--kind", "triton", "--json", "--dir", str(root)).stdout)
    r = subprocess.run(
        [sys.executable, str(QUICKSTART)],
        env=dict(env, KCACHE_RECACHE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("compiled and stored") == 2 and "hit (from kcache)" not in r.stdout, r.stdout
    after = json.loads(kc(clean_env, "inspect", "--kind", "triton", "--json", "--dir", str(root)).stdout)
    assert [e["id"] for e in after] == [e["id"] for e in before]  # the same kernel, one entry
    assert after[0]["created"] > before[0]["created"]  # made again: the stored one was replaced
    data = json.loads(kc(clean_env, "stats", "--json", "--dir", str(root)).stdout)
    assert data["by_kind"]["triton"]["recached"] == 2 and data["recached"] == 2
    assert "recached     2" in kc(clean_env, "stats", "--dir", str(root)).stdout
    # and without it, the new entry is what a lookup is served
    s = Store.open(root)
    try:
        hit = s.get("triton", after[0]["key"], files=True)
        assert (
            hit is not None and hit.record.id == after[0]["id"] and hit.record.created == after[0]["created"]
        )
    finally:
        s.close()


def test_recache_in_the_store_serves_no_integration_and_replaces_on_put(tmp_path):
    from kcache import config

    root = tmp_path / "store"
    fill(root, n=1)
    s = Store.from_settings(config.load(env={"KCACHE_RECACHE": "1"}, dir=str(root)), drain_global=True)
    try:
        assert s.recache
        assert s.get("triton", "KEY0") is None  # what every integration's lookup goes through
        flight = s.single_flight("triton", "KEY0")
        assert flight.hit is None and not flight.held
        hit = s.put("triton", "KEY0", {"k.cubin": b"new"}, compile_s=0.25)
        assert hit is not None and hit.read("k.cubin") == b"new"
    finally:
        s.close()
    s = Store.open(root)
    try:
        got = s.get("triton", "KEY0")
        assert got is not None and got.read("k.cubin") == b"new" and got.record.compile_s == 0.25
    finally:
        s.close()
    # a maintenance command's store never recaches (an import must not overwrite what is there)
    m = Store.from_settings(config.load(env={"KCACHE_RECACHE": "1"}, dir=str(root)), write=False)
    try:
        assert not m.recache and m.get("triton", "KEY0") is not None
    finally:
        m.close()


PROGRAM = "import kcache; print(kcache.is_enabled())"  # KCACHE=1: the hook, then the store opened


def test_logfile_gets_kcache_log_lines_of_every_process(tmp_path, clean_env):
    # ccache's CCACHE_LOGFILE: kcache's log lines also go to a file, with the time and the pid
    # (two processes append to it).
    bad = tmp_path / "open-store"
    bad.mkdir(mode=0o777)
    bad.chmod(0o777)  # a store others can write: every process warns and runs without it
    log = tmp_path / "logs" / "kcache.log"
    log.parent.mkdir()
    env = dict(clean_env, KCACHE="1", KCACHE_DIR=str(bad), KCACHE_LOGFILE=str(log))
    for _ in range(2):
        r = subprocess.run(
            [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
        assert "caching is off" in r.stderr  # stderr still has it
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all("kcache[" in ln and "WARNING: caching is off" in ln for ln in lines), lines
    assert len({ln.split("kcache[", 1)[1].split("]", 1)[0] for ln in lines}) == 2  # two processes
    assert log.stat().st_mode & 0o777 == 0o600
    # a log file that cannot be written: one warning, and the program goes on
    env["KCACHE_LOGFILE"] = str(tmp_path / "no" / "such" / "folder" / "k.log")
    r = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr.count("cannot write the log file") == 1, r.stderr


def test_config_shows_recache_and_logfile(tmp_path, clean_env):
    env = dict(clean_env, KCACHE_RECACHE="1", KCACHE_LOGFILE=str(tmp_path / "k.log"))
    data = json.loads(kc(env, "config", "--json").stdout)
    rows = {r["env"]: r for r in data["settings"]}
    assert (
        rows["KCACHE_RECACHE"]["value"] is True and rows["KCACHE_RECACHE"]["source"] == "env KCACHE_RECACHE"
    )
    assert rows["KCACHE_LOGFILE"]["value"] == str(tmp_path / "k.log")
    text = kc(env, "config").stdout
    assert "KCACHE_RECACHE" in text and "KCACHE_LOGFILE" in text
    bad = kc(dict(clean_env, KCACHE_RECACHE="maybe"), "config")
    assert "KCACHE_RECACHE='maybe'" in bad.stdout.splitlines()[1]


# ------------------------------------------------------------------ point 4: a target Triton cannot build
def test_prewarm_refuses_a_target_this_triton_cannot_compile_before_any_work(tmp_path, clean_env):
    # `prewarm --target cuda:999` passed the checks and --dry-run; the real run printed ~14 KB
    # of PTX and aborted. Now one line, exit 2, before anything is imported, compiled or made.
    spec = Path(__file__).resolve().parents[1] / "docs" / "examples" / "prewarm" / "spec.toml"
    store = tmp_path / "store"
    for extra in (["--dry-run"], []):
        r = kc(clean_env, "prewarm", str(spec), "--target", "cuda:999", "--dir", str(store), *extra)
        line = one_line_error(r, 2)
        assert "cuda:999" in line and "cannot compile for sm_999" in line and "cuda:90" in line, line
        assert r.stdout == "" and not store.exists()
    from kcache.prewarm.targets import target_problem

    assert target_problem(90) is None and target_problem(80) is None


# point 7 (prewarm's progress): tests/test_prewarm_triton.py::test_progress_bar_on_a_terminal_never_with_json


# ------------------------------------------------------------------ point 6: bundles and trust
def _bundle_of(tmp_path: Path, env: dict[str, str], triton_version: str | None = None) -> Path:
    root = tmp_path / "src"
    s = Store.open(root)
    for i in range(2):
        comps = {"kernel": f"k{i}", "triton_version": triton_version or fingerprint.current("triton_version")}
        s.put("triton", f"B{i}", {"k.cubin": bytes([i]) * 50}, components=comps, summary={"name": f"k{i}"})
    s.close()
    out = tmp_path / "b.kcb"
    r = kc(env, "export", str(out), "--dir", str(root))
    assert r.returncode == 0, r.stderr
    return out


def test_import_says_when_a_bundle_is_not_authenticated(tmp_path, clean_env):
    # An unsigned bundle imported quietly with KCACHE_SECRET set; a signed bundle imported
    # without the secret did not say its signature went unchecked.
    secret = dict(clean_env, KCACHE_SECRET="team-secret")
    unsigned = _bundle_of(tmp_path / "u", clean_env)
    r = kc(secret, "import", str(unsigned), "--dir", str(tmp_path / "a"))
    assert r.returncode == 0 and "the bundle is not signed, though KCACHE_SECRET is set" in r.stdout, r.stdout
    data = json.loads(kc(secret, "import", str(unsigned), "--json", "--dir", str(tmp_path / "a2")).stdout)
    assert data["trust"] == "unsigned"
    signed = _bundle_of(tmp_path / "s", secret)
    r = kc(clean_env, "import", str(signed), "--dir", str(tmp_path / "b"))
    assert r.returncode == 0 and "its signature was not checked" in r.stdout, r.stdout
    data = json.loads(kc(clean_env, "import", str(signed), "--json", "--dir", str(tmp_path / "b2")).stdout)
    assert data["trust"] == "unchecked"
    r = kc(secret, "import", str(signed), "--dir", str(tmp_path / "c"))
    assert r.returncode == 0 and "(signature checked)" in r.stdout and "authenticated" not in r.stdout, (
        r.stdout
    )
    # a plain unsigned import with no secret anywhere: nothing to warn about
    r = kc(clean_env, "import", str(unsigned), "--dir", str(tmp_path / "d"))
    assert r.returncode == 0 and "signed" not in r.stdout and "never" not in r.stdout, r.stdout


def test_import_says_what_can_never_be_served_here(tmp_path, clean_env):
    # A Triton 3.6 bundle imported into a 3.9 store with no word that it can never hit.
    old = _bundle_of(tmp_path, clean_env, triton_version="3.0.0")
    here = fingerprint.current("triton_version")
    r = kc(clean_env, "import", str(old), "--dir", str(tmp_path / "store"))
    assert r.returncode == 0, r.stderr
    assert (
        f"2 entries of it can never be served on this machine: built with triton_version 3.0.0 (here {here})"
        in r.stdout
    )
    data = json.loads(kc(clean_env, "import", str(old), "--json", "--dir", str(tmp_path / "store2")).stdout)
    assert data["never_served"] == {
        "entries": 2,
        "differ": [{"name": "triton_version", "bundle": "3.0.0", "here": here, "entries": 2}],
    }


# ------------------------------------------------------------------ point 8: Triton's variables
def test_explain_says_that_a_triton_variable_changes_every_key(tmp_path, clean_env):
    # Triton 3.9 warns that TRITON_DEFAULT_FP_FUSION is unset; setting it, even to its default,
    # changes every kernel's key: the store seems empty. explain names the variable and says so.
    root = tmp_path / "store"
    s = Store.open(root)
    base = {"kernel": "add", "triton_version": fingerprint.current("triton_version")}
    assert s.put("triton", "UNSET", {"k.cubin": b"x"}, components=base) is not None
    wanted = dict(base, **{"env.TRITON_DEFAULT_FP_FUSION": "true"})
    assert s.get("triton", "SETKEY", components=wanted) is None
    s.close()
    out = kc(clean_env, "explain", "--dir", str(root)).stdout
    assert "env.TRITON_DEFAULT_FP_FUSION: (absent) -> true" in out, out
    assert "TRITON_DEFAULT_FP_FUSION: Triton puts this variable in every kernel's key" in out, out


# ------------------------------------------------------------------ points 2 and 9: where a newcomer reads
def test_the_redis_extra_is_named_where_the_shared_tier_is_set_up() -> None:
    # Following docs/remote.md after the README's install only turned the shared tier off with a
    # warning: the redis extra was named in none of the three places a newcomer reads.
    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    usage = (repo / "docs" / "usage.md").read_text()
    quick = (repo / "docs" / "remote.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for where, text in (("README.md", readme), ("docs/usage.md", usage), ("remote.md's quick start", quick)):
        assert 'pip install -e ".[redis]"' in text, where
    # and the README says what a newcomer needs before its two commands and what .ci/run costs
    section = readme.split("## Two commands on a fresh machine", 1)[1].split("\n## ", 1)[0]
    for words in (
        "python3 -m venv",
        ".venv-ci-newest",
        "about 3 GB",
        "apt-get",
        "minutes",
        "triton-meta",
        "Extras",
    ):
        assert words in section, words
