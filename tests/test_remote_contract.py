"""One contract for every backend of the shared tier: the same test functions, run over Redis, a
Redis Cluster, S3 (moto's server) and a user's own backend class (``KCACHE_REMOTE=module:Class``:
a folder-backed backend written here, as a user would write one, without leases). Real servers
each (tests/conftest.py starts them); stores at different paths stand for machines.

What every backend must give, through the one machinery (kcache/store/tiers/shared.py): an entry
put by one machine is served to another, checked; a miss is a miss; what is over the bound stays
local and is never read; with a secret, an unsigned value planted in the backend is refused;
mark-bad deletes the value served and nothing newer; a forked child writes its own; a backend
that does not answer costs a process at most the budget; single flight across machines where
the backend makes leases; ``kcache remote`` reports what it holds.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tier_stores import DEADLINE, Stores, counts, flushed

from kcache import config
from kcache.store import Store
from kcache.store.records import Record, file_info
from kcache.store.tiers import backend_for, entry, shared
from kcache.store.tiers.backend import Op
from kcache.store.tiers.bounded import bounded

SECRET = "contract-secret"
BACKENDS = ["redis", "redis-cluster", "s3", "user-class"]

USER_BACKEND = '''
"""A user's backend (docs/remote.md, "Your own backend"): entries as files of a shared folder
(KC_FOLDER), no leases. Written against the documented interface only."""
import os

from kcache.store.tiers.backend import Backend, Outcome, TooLarge, Unavailable


class FolderBackend(Backend):
    name = "folder"

    def open(self):
        self.root = os.environ["KC_FOLDER"]
        if not os.path.isdir(self.root):
            raise Unavailable("no folder")

    def _path(self, kind, ident):
        return os.path.join(self.root, f"{self.cfg.prefix}{kind}-{ident}")

    def size(self, kind, ident):
        try:
            return os.stat(self._path(kind, ident)).st_size
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise Unavailable(str(e)) from e

    def read(self, kind, ident, size, limit):
        try:
            with open(self._path(kind, ident), "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise TooLarge(len(data))
        return data, str(hash(data))

    def write(self, ops):
        out: list[Outcome] = []
        for op in ops:
            path = self._path(op.kind, op.ident)
            if op.op == "put":
                tmp = path + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(op.value)
                os.replace(tmp, path)
                out.append(True)
            elif op.op == "delete":
                try:
                    with open(path, "rb") as f:
                        same = op.version is None or str(hash(f.read())) == op.version
                    if same:
                        os.unlink(path)
                    out.append(same)
                except FileNotFoundError:
                    out.append(False)
            else:
                out.append(True)
        return out

    def survey(self, *, limit, budget_s, timeout_s):
        names = [n for n in os.listdir(self.root) if n.startswith(self.cfg.prefix)]
        return {"reachable": True, "entries": len(names), "complete": True}
'''


class Target:
    """A backend to run the contract against: its URL, the environment it needs, and a URL of
    the same kind where nothing answers."""

    def __init__(self, name: str, url: str, down_url: str, env: dict[str, str] | None = None) -> None:
        self.name, self.url, self.down_url, self.env = name, url, down_url, env or {}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=BACKENDS)
def target(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Target]:
    name = request.param
    if name == "redis":
        srv = request.getfixturevalue("redis_server")
        t = Target(name, srv.url, f"redis://127.0.0.1:{_closed_port()}/0")
    elif name == "redis-cluster":
        srv = request.getfixturevalue("redis_cluster")
        t = Target(name, srv.url, f"redis+cluster://127.0.0.1:{_closed_port()}")
    elif name == "s3":
        srv = request.getfixturevalue("s3")
        t = Target(name, f"s3://{srv.bucket()}/c", "s3://kc-nowhere/c", dict(srv.env))
    else:
        (tmp_path / "kc_user_backend.py").write_text(textwrap.dedent(USER_BACKEND))
        monkeypatch.syspath_prepend(str(tmp_path))
        (tmp_path / "shared-folder").mkdir()
        t = Target(name, "kc_user_backend:FolderBackend", "kc_user_backend:FolderBackend")
        t.env = {"KC_FOLDER": str(tmp_path / "shared-folder")}
    for k, v in t.env.items():
        monkeypatch.setenv(k, v)
    yield t


@pytest.fixture
def prefix() -> str:
    return f"k{uuid.uuid4().hex[:8]}:"


def group(n: int = 3000) -> dict[str, bytes]:
    return {"k.json": b'{"name": "k"}', "k.cubin": os.urandom(n), "k.ptx": b"// ptx\n" * 20}


def plant(
    t: Target, prefix: str, store: Store, key: str, files: dict[str, bytes], secret: bytes | None
) -> None:
    """Write a value into the backend as someone else would, through the backend's own write."""
    backend = backend_for(config.load({"KCACHE_REMOTE": t.url, "KCACHE_REMOTE_PREFIX": prefix}))
    assert backend is not None
    backend.open()
    rec = Record("triton", key, store.entry_id("triton", key), [file_info(n, v) for n, v in files.items()])
    try:
        with bounded(10.0):
            out = backend.write(
                [Op("put", "triton", rec.id, value=entry.pack_entry(rec.encode(), files, secret))]
            )
    finally:
        backend.close()
    assert out == [True], out


# ------------------------------------------------------------------------------------ the contract
def test_an_entry_one_machine_puts_is_served_to_another(target: Target, stores: Stores, prefix: str) -> None:
    a = stores("a", target.url, prefix)
    b = stores("b", target.url, prefix)
    files = group()
    assert a.get("triton", "K") is None
    a.put("triton", "K", files, compile_s=0.25)
    flushed(a)
    hit = b.get("triton", "K")
    assert hit is not None and {n: hit.read(n) for n in files} == files
    assert hit.record.compile_s == pytest.approx(0.25)
    assert counts(a)["remote_misses"] == 1 and counts(a)["remote_puts"] == 1
    assert counts(b)["remote_hits"] == 1 and counts(b).get("remote_errors", 0) == 0
    for _ in range(5):
        assert b.get("triton", "K") is not None  # local from now on
    assert counts(b)["remote_hits"] == 1


def test_what_is_over_the_bound_stays_local_and_is_never_read(
    target: Target, stores: Stores, prefix: str
) -> None:
    a = stores("a", target.url, prefix, KCACHE_REMOTE_MAX_ENTRY="8KiB")
    a.put("triton", "big", group(20_000))
    a.put("triton", "small", group(1000))
    flushed(a)
    assert counts(a)["remote_too_large"] == 1 and counts(a)["remote_puts"] == 1
    big = group(200_000)
    plant(target, prefix, a, "planted-big", big, None)
    b = stores("b", target.url, prefix, KCACHE_REMOTE_MAX_ENTRY="8KiB")
    assert b.get("triton", "small") is not None and b.get("triton", "planted-big") is None
    assert counts(b)["remote_too_large"] == 1 and counts(b).get("remote_bytes_in", 0) < 20_000


def test_with_a_secret_unsigned_values_are_refused(target: Target, stores: Stores, prefix: str) -> None:
    b = stores("b", target.url, prefix, KCACHE_SECRET=SECRET)
    plant(target, prefix, b, "U", group(500), None)
    plant(target, prefix, b, "W", group(500), b"another-secret")
    plant(target, prefix, b, "S", group(500), SECRET.encode())
    assert b.get("triton", "U") is None and b.get("triton", "W") is None
    assert counts(b)["remote_refused"] == 2
    assert b.read_record(b.entry_id("triton", "U"))[0] is None
    assert b.get("triton", "S") is not None  # signed with the secret: taken


def test_mark_bad_deletes_the_value_served_and_nothing_newer(
    target: Target, stores: Stores, prefix: str
) -> None:
    a = stores("a", target.url, prefix)
    b = stores("b", target.url, prefix)
    a.put("triton", "X", group(900))
    a.put("triton", "Y", group(900))
    flushed(a)
    assert b.get("triton", "X") is not None and b.get("triton", "Y") is not None
    a.replace("triton", "Y", group(800))  # a newer Y meanwhile
    flushed(a)
    for k in ("X", "Y"):
        b.remove([b.entry_id("triton", k)])
        assert b.tiers[0].mark_bad("triton", b.entry_id("triton", k))
    flushed(b)
    assert counts(b)["remote_marked_bad"] == 1
    c = stores("c", target.url, prefix)
    assert c.get("triton", "X") is None and c.get("triton", "Y") is not None


def test_a_forked_child_writes_its_own_entries(target: Target, stores: Stores, prefix: str) -> None:
    a = stores("a", target.url, prefix)
    a.put("triton", "parent", group(100))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            a.put("triton", "child", group(100))
            code = 0 if a.tiers[0].flush(10.0) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    flushed(a)
    b = stores("b", target.url, prefix)
    assert b.get("triton", "child") is not None and b.get("triton", "parent") is not None


def test_a_backend_that_does_not_answer_costs_the_budget(
    target: Target, stores: Stores, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if target.name == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    if target.name == "user-class":
        monkeypatch.setenv("KC_FOLDER", "/nonexistent/kcache-contract")
    a = stores("a", target.down_url, prefix, KCACHE_REMOTE_TIMEOUT=DEADLINE)
    for i in range(20):
        assert a.get("triton", f"K{i}") is None
        with a.single_flight("triton", f"K{i}") as hit:
            assert hit is None
            assert a.put("triton", f"K{i}", group(100)) is not None  # local caching goes on
    c = counts(a)
    assert c.get("remote_s", 0) <= shared.BUDGET_CALLS * 0.1 + 0.5, c
    assert c.get("remote_hits", 0) == 0 and c.get("puts") == 20, c


def test_single_flight_across_machines_where_the_backend_makes_leases(
    target: Target, stores: Stores, prefix: str
) -> None:
    a = stores("a", target.url, prefix, KCACHE_SECRET=SECRET)
    b = stores("b", target.url, prefix, KCACHE_SECRET=SECRET)
    leases = a.tiers[0].describe()["leases"]
    fa = a.single_flight("triton", "K")
    assert fa.hit is None and fa.held
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(hit=b.single_flight("triton", "K").hit))
    t.start()
    time.sleep(0.5)
    assert t.is_alive() is leases  # waits on a's lease; without leases, compiles at once
    files = group(2000)
    a.put("triton", "K", files)
    fa.release()
    t.join(20)
    if leases:
        assert got["hit"] is not None and got["hit"].read("k.cubin") == files["k.cubin"]
        assert counts(b)["remote_waited"] == 1
    else:
        assert got["hit"] is None and counts(b).get("remote_waited", 0) == 0


def test_kcache_remote_reports_what_the_backend_holds(target: Target, stores: Stores, prefix: str) -> None:
    from kcache.maintenance.remote import remote_report

    a = stores("a", target.url, prefix)
    for i in range(3):
        a.put("triton", f"R{i}", group(300))
    flushed(a)
    rep = remote_report(config.load({"KCACHE_REMOTE": target.url, "KCACHE_REMOTE_PREFIX": prefix}))
    assert rep["reachable"] and rep["entries"] == 3, rep


@pytest.mark.parametrize(
    "spec, why",
    [
        ("kc_no_such_module:Backend", "cannot import it"),
        ("json:JSONDecoder", "is not a kcache.store.tiers.backend.Backend subclass"),
    ],
)
def test_a_user_class_that_is_not_a_backend_turns_the_tier_off(
    tmp_path: Path, spec: str, why: str, kcache_warnings: list[str]
) -> None:
    """``KCACHE_REMOTE=module:Class`` is checked for its form when the settings are read, and
    imported when the tier is made: a module that is not there, or a class that is not a
    backend, turns the shared tier off with one warning; local caching goes on."""
    s = config.load({"KCACHE_REMOTE": spec})
    assert s.remote_problems == [] and s.remote == spec
    st = Store.open(tmp_path / "s")
    try:
        assert st.attach_remote(s) is False and st.tiers == []
        assert st.put("triton", "K", group(100)) is not None and st.get("triton", "K") is not None
    finally:
        st.close()
    assert any(why in m for m in kcache_warnings), kcache_warnings
    assert config.load({"KCACHE_REMOTE": "not a:class:name"}).remote_problems
