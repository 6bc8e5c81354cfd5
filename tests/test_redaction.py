"""Secrets are never printed: every URL form redis-py takes (and forms it refuses), with '@',
'/', '#', '?', ':' and '%' in the password, any scheme case, and ``KCACHE_REMOTE_PASSWORD``,
walked through every output a user sees, each in a real process: ``kcache config``,
``kcache remote`` (human and ``--json``), and a program's warnings when the server is unreachable.

Before: ``redis://default:Tr0ub4dor@TAIL@host:port/0`` printed ``TAIL`` in ``kcache config`` and
``kcache remote``; ``REDIS://``, ``Redis://``, ``redis+sentinel://`` and a raw '/', '#' or '?' in
the password printed it in every process's warning and in ``kcache config``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kcache import config, redact

PYTHON = sys.executable
LEFT, RIGHT = "Xq7Left", "Zk9Right"  # the two halves of every password below: neither may show
PW = LEFT + RIGHT


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _closed_port()
HOST = f"127.0.0.1:{PORT}"
# (label, KCACHE_REMOTE, KCACHE_REMOTE_PASSWORD)
URLS: list[tuple[str, str, str | None]] = [
    ("@ in the password", f"redis://default:{LEFT}@{RIGHT}@{HOST}/0", None),
    ("upper-case scheme", f"REDIS://default:{PW}@{HOST}/0", None),
    ("mixed-case scheme", f"Redis://default:{PW}@{HOST}/0", None),
    ("TLS", f"rediss://default:{PW}@{HOST}/0", None),
    ("TLS upper-case, ':' in the password", f"REDISS://default:{LEFT}:{RIGHT}@{HOST}/0", None),
    ("sentinel", f"redis+sentinel://default:{PW}@{HOST}/mymaster/0", None),
    ("unix socket with user info", f"unix://default:{PW}@/nonexistent/redis.sock?db=0", None),
    ("'/' in the password", f"redis://default:{LEFT}/{RIGHT}@{HOST}/0", None),
    ("'#' in the password", f"redis://default:{LEFT}#{RIGHT}@{HOST}/0", None),
    ("'?' in the password", f"redis://default:{LEFT}?{RIGHT}@{HOST}/0", None),
    ("percent-encoded '@'", f"redis://default:{LEFT}%40{RIGHT}@{HOST}/0", None),
    ("a raw '%'", f"redis://default:{LEFT}%{RIGHT}@{HOST}/0", None),
    ("no user name", f"redis://:{PW}@{HOST}/0", None),
    ("a password alone", f"redis://{PW}@{HOST}/0", None),
    ("password in the query", f"redis://{HOST}/0?password={PW}", None),
    ("unix socket, password in the query", f"unix:///nonexistent/redis.sock?db=0&password={PW}", None),
    ("a scheme kcache refuses", f"valkey://default:{PW}@{HOST}/0", None),
    ("a bad database", f"redis://default:{LEFT}@{RIGHT}@{HOST}/zero", None),
    ("KCACHE_REMOTE_PASSWORD", f"redis://{HOST}/0", PW),
    ("both", f"redis://default:{LEFT}#{RIGHT}@{HOST}/0", PW + "2"),
]

PROGRAM = """
import kcache
kcache.enable()
s = kcache.active_store()
for i in range(5):  # a lookup each: refused connections open the circuit breaker (one warning)
    s.get("triton", f"key{i}")
s.put("triton", "key0", {"k.json": b"{}"})
s.close()
"""


def _env(tmp: Path, url: str, password: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"), KCACHE_DIR=str(tmp / "store"))
    env.update(KCACHE_REMOTE=url, KCACHE_LOG="info")  # info: the tier's every failure is logged too
    if password is not None:
        env["KCACHE_REMOTE_PASSWORD"] = password
    return env


def _run_all(cmds: list[tuple[list[str], dict[str, str]]]) -> list[subprocess.CompletedProcess]:
    out: list[subprocess.CompletedProcess] = []
    for i in range(0, len(cmds), 8):  # eight at a time: each is short, the box has 2 cores
        procs = [
            subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c, e in cmds[i : i + 8]
        ]
        for p, (c, _e) in zip(procs, cmds[i : i + 8]):
            so, se = p.communicate(timeout=120)
            out.append(subprocess.CompletedProcess(c, p.returncode, so, se))
    return out


OUTPUTS = {
    "kcache config": ["-m", "kcache", "config"],
    "kcache config --json": ["-m", "kcache", "config", "--json"],
    "kcache remote": ["-m", "kcache", "remote"],
    "kcache remote --json": ["-m", "kcache", "remote", "--json"],
    "a program's warnings": ["-c", PROGRAM],
}


def test_no_output_prints_a_password(tmp_path: Path) -> None:
    cmds, labels = [], []
    for i, (label, url, password) in enumerate(URLS):
        for out, argv in OUTPUTS.items():
            d = tmp_path / f"{i}-{len(cmds)}"
            d.mkdir()
            cmds.append(([PYTHON, *argv], _env(d, url, password)))
            labels.append((label, out))
    for (label, out), p in zip(labels, _run_all(cmds)):
        text = p.stdout + p.stderr
        assert "Traceback" not in text, f"{label}, {out}: {text[-2000:]}"
        for half in (LEFT, RIGHT):
            assert half not in text, f"{label}, {out} printed {half!r}:\n{text}"
        # and each did speak of the shared tier (its URL, masked, or what is wrong with it)
        assert "127.0.0.1" in text or "nonexistent" in text or "KCACHE_REMOTE" in text, (label, out, text)


def test_a_reachable_server_with_an_at_sign_in_its_password(redis_private, tmp_path: Path) -> None:
    server = redis_private("--requirepass", f"{LEFT}@{RIGHT}")
    url = f"redis://default:{LEFT}@{RIGHT}@127.0.0.1:{server.port}/0"
    cmds = [([PYTHON, "-m", "kcache", "remote", *a], _env(tmp_path, url, None)) for a in ([], ["--json"])]
    for p in _run_all(cmds):
        assert p.returncode == 0, p.stdout + p.stderr  # it did log in, with the whole password
        assert LEFT not in p.stdout + p.stderr and RIGHT not in p.stdout + p.stderr
        assert "default:***@127.0.0.1" in p.stdout


@pytest.mark.parametrize("label,url,password", URLS, ids=[u[0] for u in URLS])
def test_redact_masks_every_form_by_its_shape(
    label: str, url: str, password: str | None, monkeypatch
) -> None:
    monkeypatch.setattr(redact, "_SECRETS", set())  # no value remembered: the URL's shape alone
    text = config.redact(f"error: cannot reach {url!r} ({url})")
    assert LEFT not in text and RIGHT not in text, text


def test_remembered_secrets_are_masked_in_any_text(monkeypatch) -> None:
    monkeypatch.setattr(redact, "_SECRETS", set())
    config.load({"KCACHE_REMOTE": f"redis://u:{LEFT} {RIGHT}@h:1/0", "KCACHE_REMOTE_PASSWORD": "pw-" + PW})
    text = config.redact(f"AuthenticationError: {LEFT} {RIGHT} / pw-{PW}")
    assert LEFT not in text and RIGHT not in text, text


# ------------------------------------------------------------------------------------ issue 36
def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "kcache", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_url_without_a_password_is_shown_as_it_is(tmp_path: Path) -> None:
    """Issue 36: ``KCACHE_REMOTE=http://127.0.0.1:43747 kcache remote`` printed
    ``KCACHE_REMOTE='http://127.0.0.1:*** expected redis://host:***/db, ...``: the port, the quote
    and kcache's own examples masked, though none of it is a secret. Only a password is."""
    url = f"http://127.0.0.1:{PORT}"
    env = _env(tmp_path, url, None)
    remote = _cli(env, "remote")
    assert remote.returncode == 2, remote.stderr
    assert f"KCACHE_REMOTE='{url}'" in remote.stderr and f"got '{url}'" in remote.stderr, remote.stderr
    assert "redis://host:port/db" in remote.stderr and "***" not in remote.stderr, remote.stderr
    shown = _cli(env, "config")
    assert shown.returncode == 0 and f"KCACHE_REMOTE='{url}'" in shown.stdout and "***" not in shown.stdout
    problems = json.loads(_cli(env, "config", "--json").stdout)["remote_problems"]
    assert len(problems) == 1 and url in problems[0] and "redis://host:port/db" in problems[0], problems
    # with nothing set, the example says what to set, whole
    bare = _env(tmp_path, url, None)
    del bare["KCACHE_REMOTE"]
    none = _cli(bare, "remote")
    assert none.returncode == 2 and "KCACHE_REMOTE=redis://host:port/db" in none.stderr, none.stderr
    assert "***" not in none.stderr


def test_a_password_is_still_masked_where_the_url_is_shown_whole(tmp_path: Path) -> None:
    """The same outputs, a URL with a password, a port, a query: only the password goes."""
    url = f"redis://kc:{PW}@127.0.0.1:{PORT}/3?socket_keepalive=true"
    env = _env(tmp_path, url, None)
    for out in (_cli(env, "config").stdout, _cli(env, "remote").stdout, _cli(env, "config", "--json").stdout):
        assert f"redis://kc:***@127.0.0.1:{PORT}/3?socket_keepalive=true" in out, out
        assert LEFT not in out and RIGHT not in out
    typed = f"redis://127.0.0.1:{PORT},h2:{PW}/0"  # a password typed where a port goes: masked
    problems = json.loads(_cli(_env(tmp_path, typed, None), "config", "--json").stdout)["remote_problems"]
    assert problems and all(LEFT not in p and RIGHT not in p for p in problems), problems


# ------------------------------------------------------------------------------------ S3 (review M4)
AWS_TOKEN, AWS_KEY, ENDPOINT_PW = "Kc7TokenOfTheSession", "Kc7KeyOfTheSecret", "Kc7PasswordOfTheEndpoint"


def test_no_output_prints_an_aws_secret(tmp_path: Path) -> None:
    """An ``AWS_SESSION_TOKEN`` with a trailing newline (read from a file, pasted) makes every S3
    request fail as it is built: http.client's ``putheader`` puts the value into its ValueError's
    text, which was the tier's warning, the log file's line and ``kcache remote``'s error. A
    password in ``AWS_ENDPOINT_URL`` was printed by ``kcache remote`` (text and ``--json``). Each
    output, in a real process: none shows the token, the secret key or the password."""
    pytest.importorskip("botocore")
    cmds = []
    for out, argv in OUTPUTS.items():
        if "config" in out:
            continue
        d = tmp_path / out.replace(" ", "_").replace("'", "")
        d.mkdir()
        env = {k: v for k, v in _env(d, "s3://kc-bucket/p", None).items() if not k.startswith("AWS_")}
        (d / "aws-config").write_text("")
        env.update(
            AWS_ACCESS_KEY_ID="AKIAKCACHETEST", AWS_SECRET_ACCESS_KEY=AWS_KEY,
            AWS_SESSION_TOKEN=AWS_TOKEN + "\n", AWS_ENDPOINT_URL=f"http://kc:{ENDPOINT_PW}@{HOST}",
            AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(d / "aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(d / "none"), AWS_EC2_METADATA_DISABLED="true",
            KCACHE_LOGFILE=str(d / "kcache.log"),
        )  # fmt: skip
        cmds.append(([PYTHON, *argv], env))
    for (_argv, env), p in zip(cmds, _run_all(cmds)):
        log = Path(env["KCACHE_LOGFILE"])
        text = p.stdout + p.stderr + (log.read_text() if log.exists() else "")
        assert "Traceback" not in text, text[-2000:]
        assert "s3://kc-bucket/p" in text, text  # it did speak of the tier
        for secret in (AWS_TOKEN, AWS_KEY, ENDPOINT_PW):
            assert secret not in text, f"{p.args} printed {secret!r}:\n{text}"


def test_aws_secrets_are_remembered_when_the_tier_reads_them(monkeypatch, tmp_path: Path) -> None:
    """The secret key and the session token the S3 backend signs with, and a password in the
    endpoint URL, are masked in any text (an exception's message, quoting them as repr() does),
    not only where kcache leaves them out."""
    pytest.importorskip("botocore")
    from kcache.store.tiers import backend_for

    monkeypatch.setattr(redact, "_SECRETS", set())
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    (tmp_path / "aws-config").write_text("")
    for k, v in dict(
        AWS_ACCESS_KEY_ID="AKIAKCACHETEST", AWS_SECRET_ACCESS_KEY=AWS_KEY, AWS_SESSION_TOKEN=AWS_TOKEN + "\n",
        AWS_ENDPOINT_URL=f"http://kc:{ENDPOINT_PW}@{HOST}", AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=str(tmp_path / "aws-config"), AWS_EC2_METADATA_DISABLED="true",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
    ).items():  # fmt: skip
        monkeypatch.setenv(k, v)
    backend = backend_for(config.load({"KCACHE_REMOTE": "s3://kc-bucket/p"}))
    assert backend is not None
    backend.open()
    backend.close()
    quoted = (
        f"ValueError: Invalid header value {(AWS_TOKEN + chr(10)).encode()!r}; key {AWS_KEY}; {ENDPOINT_PW}"
    )
    text = config.redact(quoted)
    for secret in (AWS_TOKEN, AWS_KEY, ENDPOINT_PW):
        assert secret not in text, text
