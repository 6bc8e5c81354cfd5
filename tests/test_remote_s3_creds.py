"""S3 credentials that expire (a ``credential_process``, as STS, SSO and the instance and container
roles behave in botocore: ``RefreshableCredentials``) are refreshed in the background, never on
the thread of a lookup: a lookup signs with the snapshot it has, and one that finds it expired is a
miss at once, never a wait (review finding M2).

Real pieces: moto's S3 server (tests/conftest.py), an AWS config file in tmp_path naming a
``credential_process`` script, which botocore runs. The script's first run (botocore's chain, at
the tier's open) answers at once; every later run (a refresh) writes that it started, then blocks
until the test creates a file: a lookup that ran it could not return before that file exists.
No timing assertion: what ran, and what returned while the refresh was still blocked.

Before: the first lookup ran the refresh on the program's thread (botocore refreshes inside
``get_frozen_credentials()`` from 15 minutes before expiry) and waited for it whole, far past
the call's deadline.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from tier_stores import close_store, counts

from kcache import config
from kcache.store import Store

pytestmark = pytest.mark.usefixtures("no_descriptors_left", "stores_closed")

SCRIPT = """#!{python}
import datetime, json, os, sys, time
here = {here!r}
runs = os.path.join(here, "runs")
with open(runs, "a") as f:
    f.write("start\\n")
with open(runs) as f:
    n = f.read().count("start")
if n > 1:  # a refresh: wait for the test's word (at most 20 s, then fail)
    for _ in range(200):
        if os.path.exists(os.path.join(here, "go")):
            break
        time.sleep(0.1)
    else:
        with open(runs, "a") as f:
            f.write("gave up\\n")
        sys.exit(1)
life = {first_life} if n == 1 else 3600
exp = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=life)
print(json.dumps({{"Version": 1, "AccessKeyId": "kcache-tests", "SecretAccessKey": "kc-secret-%d" % n,
                  "SessionToken": "kc-token-%d" % n, "Expiration": exp.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
with open(runs, "a") as f:
    f.write("end\\n")
"""


def _process_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_life: int) -> Path:
    """The AWS configuration: credentials from a credential_process whose first answer lives
    ``first_life`` seconds (negative: expired already). Returns its folder."""
    here = tmp_path / "creds"
    here.mkdir()
    script = here / "credproc.py"
    script.write_text(SCRIPT.format(python=sys.executable, here=str(here), first_life=first_life))
    script.chmod(0o755)
    cfg = here / "aws-config"
    cfg.write_text(f"[default]\nregion = us-east-1\ncredential_process = {script}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    return here


def _runs(here: Path) -> list[str]:
    p = here / "runs"
    return p.read_text().split() if p.exists() else []


def _until(what: str, check, seconds: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.05)


def _store(tmp_path: Path, url: str, name: str = "a") -> Store:
    s = config.load({"KCACHE_REMOTE": url, "KCACHE_REMOTE_TIMEOUT": "5s"})
    st = Store.open(tmp_path / name)
    assert st.attach_remote(s)  # an empty store: the tier is opened now (botocore's chain: run 1)
    return st


def _fresh(tier) -> bool:  # noqa: ANN001
    try:
        tier.backend._creds.current()
        return True
    except Exception:
        return False


def test_lookups_sign_with_the_snapshot_while_the_refresh_runs_in_the_background(
    s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials that expire in 5 minutes: due for botocore's refresh (its advisory window is
    15 minutes), still good. The tier's writer thread refreshes them; lookups meanwhile sign with
    the snapshot and reach the bucket (misses, no errors) while the refresh is blocked. (And
    credentials that never expire, the environment's, start no thread at open.)"""
    bucket = s3.bucket()
    static = _store(tmp_path, f"s3://{bucket}/p", "static")
    try:
        assert static.tiers[0]._opened and static.tiers[0].writer.thread is None
        assert static.get("triton", "K") is None and counts(static)["remote_misses"] == 1
    finally:
        close_store(static)
    here = _process_credentials(tmp_path, monkeypatch, first_life=300)
    st = _store(tmp_path, f"s3://{bucket}/p")
    try:
        assert _runs(here) == ["start", "end"]  # botocore's chain, at open
        tier = st.tiers[0]
        assert tier.writer.thread is not None and tier.writer.thread.is_alive()  # the refresher
        for i in range(5):
            assert st.get("triton", f"K{i}") is None
        assert counts(st)["remote_misses"] == 5 and counts(st).get("remote_errors", 0) == 0, counts(st)
        _until("the background refresh to start", lambda: _runs(here).count("start") == 2)
        for i in range(5, 10):
            assert st.get("triton", f"K{i}") is None
        # every lookup returned while the refresh was blocked on our word: none of them ran it
        assert _runs(here) == ["start", "end", "start"], _runs(here)
        assert counts(st)["remote_misses"] == 10 and counts(st).get("remote_errors", 0) == 0, counts(st)
        st.put("triton", "P", {"k.json": b"{}"})
    finally:
        (here / "go").touch()
    try:
        _until("the refresh to end", lambda: _runs(here).count("end") == 2)
        assert tier.flush(30.0) and counts(st)["remote_puts"] == 1, counts(st)
        b = _store(tmp_path, f"s3://{bucket}/p", "b")
        try:
            assert b.get("triton", "P") is not None
        finally:
            close_store(b)
    finally:
        close_store(st)
    assert "gave up" not in _runs(here)


def test_expired_credentials_are_a_miss_at_once_until_the_background_brings_new_ones(
    s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials expired already when botocore's chain found them (botocore would refresh them
    in its mandatory window, every thread waiting): a lookup is Unavailable at once (counted, a
    miss), the refresh runs in the background, and lookups use its credentials once it is done.
    ``kcache remote``, a command (no program waits, no background), fetches them itself."""
    from kcache.maintenance.remote import remote_report

    here = _process_credentials(tmp_path, monkeypatch, first_life=-60)
    url = f"s3://{s3.bucket()}/p"
    st = _store(tmp_path, url)
    try:
        tier = st.tiers[0]
        for i in range(2):  # (fewer than the breaker's 3 failures: the tier stays on)
            assert st.get("triton", f"K{i}") is None
        assert counts(st)["remote_errors"] == 2 and counts(st).get("remote_misses", 0) == 0, counts(st)
        assert _runs(here).count("end") == 1 and "gave up" not in _runs(here), _runs(here)
    finally:
        (here / "go").touch()
    try:
        _until("the new credentials", lambda: _fresh(tier))
        assert _runs(here).count("end") == 2
        assert st.get("triton", "K9") is None
        assert counts(st)["remote_misses"] == 1 and counts(st)["remote_errors"] == 2, counts(st)
    finally:
        close_store(st)
    (here / "runs").write_text("")  # the command's own: its chain gets expired ones again
    rep = remote_report(config.load({"KCACHE_REMOTE": url}))
    assert rep["reachable"] and "error" not in rep, rep
    assert _runs(here) == ["start", "end", "start", "end"]
