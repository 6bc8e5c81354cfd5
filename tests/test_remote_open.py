"""A shared tier whose backend cannot be opened, or whose backend is a user's class that raises:
the shared tier is off (one warning), local caching goes on, ``Store.get``/``put`` never raise and
the backend's ``open()`` is tried once per process. The suite runs ``KCACHE_STRICT=1``: foreign
code's exceptions (botocore's, a user's class's) are not kcache's bugs and are not raised.

Real configurations: AWS config files and a ``credential_process`` script in tmp_path, read by
botocore; a user's backend class written to tmp_path (entries as files of a folder), imported
by ``KCACHE_REMOTE=module:Class``; ``kcache.enable()`` in a real process.

Before: a missing ``AWS_PROFILE`` (botocore's ``ProfileNotFound``), partial credentials, a failing
``credential_process``, a config file botocore cannot parse or a profile loop escaped the tier's
open: ``kcache.enable()`` turned *all* caching off, and with a store that held entries every
``Store.get``/``put`` raised and opened the backend again; a user's class raising in
``open``/``describe``/``node_of``/``split``/``close`` raised into the program.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tier_stores import close_store

from kcache import config
from kcache.store import Store

PYTHON = sys.executable
pytestmark = pytest.mark.usefixtures("no_descriptors_left", "stores_closed")
pytest.importorskip("botocore")


def files(n: int = 1) -> dict[str, bytes]:
    return {"k.json": b'{"name": "k"}', "k.cubin": b"\x7fELF" + bytes(range(n % 200)) * 10}


def _aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config_text: str = "", **env: str) -> None:
    """Only what the test names: no credentials, profile or endpoint of the machine."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    cfg = tmp_path / "aws-config"
    cfg.write_text(config_text)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never asked: open fails first
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def _failing_process(tmp_path: Path) -> tuple[Path, Path]:
    """A credential_process that counts its runs and fails."""
    runs = tmp_path / "runs"
    script = tmp_path / "credproc.sh"
    script.write_text(f"#!/bin/sh\necho run >> {runs}\necho 'no credentials today' >&2\nexit 1\n")
    script.chmod(0o755)
    return script, runs


CASES = {
    "a profile this machine lacks": ("", {"AWS_PROFILE": "kc-no-such-profile"}, "ProfileNotFound"),
    "partial credentials": ("", {"AWS_ACCESS_KEY_ID": "AKIAKCACHETEST"}, "PartialCredentialsError"),
    "a config file botocore cannot parse": ("[default\nregion = x\n", {}, "ConfigParseError"),
    "a profile loop": (
        "[profile a]\nsource_profile = b\nrole_arn = arn:aws:iam::123456789012:role/x\n"
        "[profile b]\nsource_profile = a\nrole_arn = arn:aws:iam::123456789012:role/y\n",
        {"AWS_PROFILE": "a"},
        "InfiniteLoopConfigError",
    ),
    "a credential_process that fails": ("PROCESS", {}, "CredentialRetrievalError"),
}


@pytest.mark.parametrize("holds_entries", [False, True], ids=["empty store", "store with entries"])
@pytest.mark.parametrize("case", list(CASES))
def test_an_aws_configuration_botocore_refuses_turns_only_the_tier_off(
    case: str,
    holds_entries: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kcache_warnings: list[str],
) -> None:
    text, env, error = CASES[case]
    script, runs = _failing_process(tmp_path)
    if text == "PROCESS":
        text = f"[default]\nregion = us-east-1\ncredential_process = {script}\n"
    _aws_env(monkeypatch, tmp_path, text, **env)
    root = tmp_path / "store"
    if holds_entries:  # no warm-up at attach: the backend is opened at the first lookup
        pre = Store.open(root)
        pre.put("triton", "local", files())
        pre.close()
    s = config.load({"KCACHE_REMOTE": "s3://kc-bucket/p"})
    st = Store.open(root)
    try:
        assert st.attach_remote(s)
        for i in range(4):
            assert st.get("triton", f"K{i}") is None
            assert st.put("triton", f"K{i}", files(i)) is not None  # local caching goes on
            assert st.get("triton", f"K{i}") is not None
        tier = st.tiers[0]
        assert tier.off  # for good: not opened again
    finally:
        close_store(st)
    said = [m for m in kcache_warnings if "shared tier off" in m]
    assert len(said) == 1 and error in said[0], kcache_warnings
    if case == "a credential_process that fails":
        assert runs.read_text().count("run") == 1  # open was tried once, not at every lookup


ENABLE = """
import kcache
print("enabled", kcache.enable())
s = kcache.active_store()
s.put("triton", "K", {"k.json": b"{}"})
print("hit", s.get("triton", "K") is not None)
s.close()
"""


def test_enable_keeps_local_caching_when_the_aws_profile_is_missing(tmp_path: Path) -> None:
    """The reviewer's case: AWS_PROFILE inherited from a developer's shell into a container."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "AWS_"))}
    (tmp_path / "aws-config").write_text("")
    env.update(
        KCACHE_STRICT="1", KCACHE_DIR=str(tmp_path / "store"), KCACHE_REMOTE="s3://kc-bucket/p",
        AWS_PROFILE="kc-no-such-profile", AWS_CONFIG_FILE=str(tmp_path / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true",
        HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
    )  # fmt: skip
    p = subprocess.run([PYTHON, "-c", ENABLE], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["enabled", "True", "hit", "True"], (p.stdout, p.stderr)
    assert p.stderr.count("WARNING") == 1 and "ProfileNotFound" in p.stderr, p.stderr


# ------------------------------------------------------------------------------------ a user's class
USER_BACKEND = '''
"""A user's backend: entries as files of a folder (KC_FOLDER); KC_RAISE names a method that
raises (foreign code's failure)."""
import os

from kcache.store.tiers.backend import Backend, TooLarge


class Boom(Exception):
    pass


class FolderBackend(Backend):
    name = "folder"

    def _maybe(self, method):
        if os.environ.get("KC_RAISE") == method:
            raise Boom(f"kc-boom in {method}")

    def open(self):
        self._maybe("open")
        self.root = os.environ["KC_FOLDER"]

    def close(self):
        self._maybe("close")

    def describe(self):
        self._maybe("describe")
        return {"backend": "folder", "mode": "server"}

    def node_of(self, ident, writer=False):
        self._maybe("node_of")
        return ""

    def split(self, items, ident, writer=False):
        self._maybe("split")
        return [list(items)] if items else []

    def _path(self, kind, ident):
        return os.path.join(self.root, f"{kind}-{ident}")

    def size(self, kind, ident):
        self._maybe("size")
        try:
            return os.stat(self._path(kind, ident)).st_size
        except FileNotFoundError:
            return 0

    def read(self, kind, ident, size, limit):
        with open(self._path(kind, ident), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise TooLarge(len(data))
        return data, str(len(data))

    def write(self, ops):
        for op in ops:
            if op.op == "put":
                with open(self._path(op.kind, op.ident), "wb") as f:
                    f.write(op.value)
        return [True] * len(ops)
'''


@pytest.mark.parametrize("method", ["open", "describe", "node_of", "split", "size", "close"])
def test_a_user_class_that_raises_is_foreign_code_never_raised_into_the_program(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kcache_warnings: list[str]
) -> None:
    (tmp_path / "kc_raising_backend.py").write_text(textwrap.dedent(USER_BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "shared-folder"
    folder.mkdir()
    monkeypatch.setenv("KC_FOLDER", str(folder))
    monkeypatch.setenv("KC_RAISE", method)
    s = config.load({"KCACHE_REMOTE": "kc_raising_backend:FolderBackend", "KCACHE_REMOTE_TIMEOUT": "5s"})
    a = Store.open(tmp_path / "a")
    try:
        assert a.attach_remote(s)
        assert a.get("triton", "K") is None
        assert a.put("triton", "K", files()) is not None
        assert a.get("triton", "K") is not None
        flushed = a.tiers[0].flush(30.0)
        written = sorted(os.listdir(folder))
        assert a.tiers[0].describe()["name"] == "folder"
    finally:
        close_store(a)  # close() raising is the case "close"
    said = [m for m in kcache_warnings if "kc-boom" in m]
    assert said, kcache_warnings
    if method == "open":
        assert a.tiers[0].off and written == [] and "shared tier off" in said[0], said
    else:  # the tier works around the method that raised
        assert flushed and len(written) == 1, (flushed, written)


def test_a_user_class_s_own_settings_of_the_contract_are_the_ones_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every class attribute the machinery reads of a backend (Backend's ClassVars) is the user's
    # class's, through the wrapper that sorts its failures: poll_s was once left out of its list
    (tmp_path / "kc_paced_backend.py").write_text(
        textwrap.dedent(USER_BACKEND)
        + "\n\nclass PacedBackend(FolderBackend):\n    poll_s = (0.5, 2.0)\n    default_timeout_s = 3.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "shared-folder"
    folder.mkdir()
    monkeypatch.setenv("KC_FOLDER", str(folder))
    monkeypatch.delenv("KC_RAISE", raising=False)
    s = config.load({"KCACHE_REMOTE": "kc_paced_backend:PacedBackend"})
    a = Store.open(tmp_path / "a")
    try:
        assert a.attach_remote(s)
        backend = a.tiers[0].backend
        assert backend.poll_s == (0.5, 2.0), backend.poll_s
        assert backend.default_timeout_s == 3.0
        assert backend.name == "folder"
    finally:
        close_store(a)
