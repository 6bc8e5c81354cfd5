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
