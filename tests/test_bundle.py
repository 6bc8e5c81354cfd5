"""Bundles: relocatable, checksummed, signed for host code; hostile bundles refused."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import msgpack
import pytest

from kcache.bundle import BundleError, export_bundle, import_bundle
from kcache.store import Store

pytestmark = pytest.mark.usefixtures("stores_closed")

SECRET = b"s3cret"


# (kind, key) -> members: what _fill puts, and what an import must give back byte for byte.
ENTRIES = {
    ("triton", "k1/add.json"): {"add.cubin": b"\x7fELF" + b"c" * 500, "add.json": b'{"name": "add"}'},
    ("triton-autotune", "k2/mm.autotune.json@NVIDIA H200"): {"mm.autotune.json": b'{"configs_timings": []}'},
    ("triton-aux", "k3/__triton_launcher.so"): {"__triton_launcher.so": b"\x7fELF-launcher"},
}


def _fill(store: Store) -> None:
    for (kind, key), files in ENTRIES.items():
        assert store.put(kind, key, files) is not None


def test_round_trip_relocates_and_keeps_bytes(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    bundle = tmp_path / "b.kcb.tgz"
    rep = export_bundle(a, bundle, secret=SECRET)
    assert rep["entries"] == 3 and rep["signed"]
    a.close()
    shutil.move(str(tmp_path / "a"), str(tmp_path / "gone"))  # the original is not needed
    b = Store.open(tmp_path / "b", max_size=1 << 30)
    rep = import_bundle(b, bundle, secret=SECRET)
    assert rep["imported"] == 3 and not rep["skipped"]
    for (kind, key), files in ENTRIES.items():  # every member of every entry, against what was put
        got = b.get(kind, key)
        assert got is not None and sorted(got.names) == sorted(files), (kind, key)
        for name, data in files.items():
            assert got.read(name) == data and Path(got.paths[name]).read_bytes() == data, (kind, name)
    hit = b.get("triton", "k1/add.json")
    assert hit is not None
    assert os.path.realpath(hit.paths["add.cubin"]).startswith(str(tmp_path / "b") + "/")
    assert Path(b.entry_dir(hit.record.id), "add.cubin").read_bytes() == b"\x7fELF" + b"c" * 500
    again = import_bundle(b, bundle, secret=SECRET)
    assert again["imported"] == 0 and again["present"] == 3


def test_unsigned_bundle_skips_host_code(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    export_bundle(a, tmp_path / "b.kcb")
    b = Store.open(tmp_path / "b", max_size=1 << 30)
    rep = import_bundle(b, tmp_path / "b.kcb")
    assert rep["imported"] == 2
    assert [s["kind"] for s in rep["skipped"]] == ["triton-aux"]
    assert b.get("triton-aux", "k3/__triton_launcher.so") is None
    assert b.get("triton", "k1/add.json") is not None


def test_wrong_secret_refused_and_nothing_imported(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    export_bundle(a, tmp_path / "b.kcb", secret=SECRET)
    b = Store.open(tmp_path / "b", max_size=1 << 30)
    with pytest.raises(BundleError, match="signature"):
        import_bundle(b, tmp_path / "b.kcb", secret=b"other")
    assert list(b.iter_entry_ids()) == []


def _rewrite(src: Path, dst: Path, change) -> None:
    with tarfile.open(src) as t, tarfile.open(dst, "w") as out:
        for m in t:
            data = t.extractfile(m).read()
            m2, data = change(m, data)
            if m2 is not None:
                m2.size = len(data)
                out.addfile(m2, io.BytesIO(data))


def test_tampered_file_is_skipped(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    export_bundle(a, tmp_path / "ok.kcb")

    def flip(m, data):
        if m.name.endswith("add.cubin"):
            data = data[:-1] + b"X"
        return m, data

    _rewrite(tmp_path / "ok.kcb", tmp_path / "bad.kcb", flip)
    b = Store.open(tmp_path / "b", max_size=1 << 30)
    rep = import_bundle(b, tmp_path / "bad.kcb")
    assert b.get("triton", "k1/add.json") is None
    assert any("checksum" in s["why"] for s in rep["skipped"])


@pytest.mark.parametrize("name", ["../evil", "e/../../evil", "/etc/evil", "e/" + "0" * 40 + "/../x"])
def test_escaping_member_refuses_the_bundle(tmp_path: Path, name: str) -> None:
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    export_bundle(a, tmp_path / "ok.kcb")

    def add_evil(m, data):
        return m, data

    _rewrite(tmp_path / "ok.kcb", tmp_path / "evil.kcb", add_evil)
    with tarfile.open(tmp_path / "evil.kcb", "a") as t:
        info = tarfile.TarInfo(name)
        info.size = 4
        t.addfile(info, io.BytesIO(b"evil"))
    b = Store.open(tmp_path / "b", max_size=1 << 30)
    with pytest.raises(BundleError, match="unexpected member"):
        import_bundle(b, tmp_path / "evil.kcb")
    assert list(b.iter_entry_ids()) == []
    assert not (tmp_path / "evil").exists()


def test_symlink_member_refused(tmp_path: Path) -> None:
    """A member of an entry that is a symlink (in place of the real add.cubin, under the name its
    record lists) is refused as such: a member not in its record is refused too, but for that
    reason, so the name here is one the record has and the message is matched."""
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    export_bundle(a, tmp_path / "ok.kcb")

    def to_symlink(m, data):
        if m.name.endswith("/add.cubin"):
            m.type, m.linkname, data = tarfile.SYMTYPE, "/etc/passwd", b""
        return m, data

    _rewrite(tmp_path / "ok.kcb", tmp_path / "link.kcb", to_symlink)
    with tarfile.open(tmp_path / "link.kcb") as t:
        assert [m.name for m in t if m.issym()] != []
    b = Store.open(tmp_path / "b", max_size=1 << 30)
    with pytest.raises(BundleError, match="not a plain file"):
        import_bundle(b, tmp_path / "link.kcb")
    assert list(b.iter_entry_ids()) == []


def test_key_tag_mismatch_refused(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "a", max_size=1 << 30, key_tag="v1")
    _fill(a)
    export_bundle(a, tmp_path / "b.kcb")
    b = Store.open(tmp_path / "b", max_size=1 << 30, key_tag="v2")
    with pytest.raises(BundleError, match="KCACHE_KEY_TAG"):
        import_bundle(b, tmp_path / "b.kcb")


def test_not_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"garbage")
    with tarfile.open(tmp_path / "nomanifest.tar", "w") as t:
        info = tarfile.TarInfo("x")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with tarfile.open(tmp_path / "badschema.tar", "w") as t:
        body = msgpack.packb({"format": "kcache-bundle", "schema": 99, "records": []})
        data = msgpack.packb({"body": body, "hmac": None})
        info = tarfile.TarInfo("MANIFEST")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    b = Store.open(tmp_path / "b", max_size=1 << 30)
    for name in ("junk", "nomanifest.tar", "badschema.tar"):
        with pytest.raises(BundleError):
            import_bundle(b, tmp_path / name)


def test_cli_export_import_round_trip(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    a.close()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KCACHE_SECRET": "s3cret"}
    run = [sys.executable, "-m", "kcache"]
    out = subprocess.run(
        [*run, "export", str(tmp_path / "b.tgz"), "--dir", str(tmp_path / "a"), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["entries"] == 3
    out = subprocess.run(
        [*run, "import", str(tmp_path / "b.tgz"), "--dir", str(tmp_path / "new"), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["imported"] == 3
    bad = subprocess.run(
        [*run, "import", "--dir", str(tmp_path / "new")], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ exit codes and summaries
def _cli(tmp_path: Path, *args: str, **env_extra: str):
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "kcache", *args], capture_output=True, text=True, env=env, timeout=120
    )


def _aux_store(root: Path, n: int) -> None:
    s = Store.open(root, max_size=1 << 30)
    for i in range(n):
        assert s.put("triton-aux", f"k{i}/__triton_launcher.so", {"__triton_launcher.so": b"\x7fELF%d" % i})
    s.close()


def test_signed_bundle_without_the_secret_imports_nothing_and_says_why(tmp_path: Path) -> None:
    """Every entry needs the signature checked: without KCACHE_SECRET none is imported. That is a
    failure (exit 1, one line saying why), not `imported=0` and exit 0."""
    _aux_store(tmp_path / "a", 40)
    assert _cli(tmp_path, "export", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "a"),
                KCACHE_SECRET="s3cret").returncode == 0  # fmt: skip
    r = _cli(tmp_path, "import", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "new"))
    assert r.returncode == 1, (r.stdout, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "nothing imported" in err[0] and "KCACHE_SECRET" in err[0], r.stderr
    assert not (tmp_path / "new").exists()  # a failed import leaves no store behind
    # one summary line for the 40 skipped entries, not one line each
    out = r.stdout.strip().splitlines()
    assert len(out) == 2, r.stdout
    assert out[1].startswith("skipped 40 entries: 40 host code or pickled entry from an unsigned bundle")
    r = _cli(tmp_path, "import", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "new"), "--json")
    assert r.returncode == 1 and json_of(r)["needs_secret"] and "KCACHE_SECRET" in json_of(r)["error"]
    r = _cli(
        tmp_path, "import", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "new"), KCACHE_SECRET="s3cret"
    )
    assert r.returncode == 0 and r.stdout.startswith("imported 40 entries (triton-aux 40)"), r.stdout
    assert "(signature checked)" in r.stdout and r.stderr == ""


def test_partial_import_is_one_summary_line_and_v_lists_each(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    _fill(a)
    a.close()
    assert _cli(tmp_path, "export", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "a")).returncode == 0
    r = _cli(tmp_path, "import", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "new"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = r.stdout.strip().splitlines()
    assert out[0] == f"imported 2 entries (triton 1, triton-autotune 1) from {tmp_path / 'b.kcb'}", out
    assert out[1] == "skipped 1 entry: 1 host code or pickled entry from an unsigned bundle (-v lists them)"
    assert len(out) == 2
    r = _cli(tmp_path, "import", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "new2"), "-v")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(lines) == 3 and "triton-aux" in lines[2], r.stdout
    # again: everything it can take is there already: nothing new, and that is not a failure
    r = _cli(tmp_path, "import", str(tmp_path / "b.kcb"), "--dir", str(tmp_path / "new"))
    assert r.returncode == 0 and "imported 0 entries" in r.stdout and "2 already present" in r.stdout


def test_export_of_nothing_fails_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "none").mkdir(mode=0o700)  # an empty folder (a missing one is an error of its own)
    empty = _cli(tmp_path, "export", str(tmp_path / "e.kcb"), "--dir", str(tmp_path / "none"))
    assert empty.returncode == 1 and "nothing exported" in empty.stderr and "holds no entries" in empty.stderr
    a = Store.open(tmp_path / "a", max_size=1 << 30)
    for i in range(30):  # answers about this machine only: never exported
        assert a.put("triton-meta", f"tool/{i}", {"v": b"x"})
    assert a.put("triton", "k1/add.json", {"add.cubin": b"c"})
    a.close()
    r = _cli(
        tmp_path, "export", str(tmp_path / "m.kcb"), "--dir", str(tmp_path / "a"), "--kind", "triton-meta"
    )
    assert r.returncode == 1 and not (tmp_path / "m.kcb").exists()
    assert (
        "nothing exported: 30 entries of kind triton-meta skipped (30 machine-local: never exported)"
        in r.stderr
    )
    r = _cli(tmp_path, "export", str(tmp_path / "n.kcb"), "--dir", str(tmp_path / "a"), "--kind", "nvfuser")
    assert r.returncode == 1 and "holds no entries of kind nvfuser" in r.stderr
    r = _cli(tmp_path, "export", str(tmp_path / "t.kcb"), "--dir", str(tmp_path / "a"))
    out = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(out) == 2, r.stdout
    assert out[0].startswith("exported 1 entry (triton 1)")
    assert out[1] == "skipped 30 entries: 30 machine-local: never exported (-v lists them)"


def json_of(r):
    import json

    return json.loads(r.stdout)
