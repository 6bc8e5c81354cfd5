"""Settings (issue 7, point 2): every variable of the contract parsed; a bad value is listed as a
problem and leaves caching off, and never raises into the user's program."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcache import config
from kcache.config import DEFAULT_MAX_SIZE, default_dir, load, parse_age, parse_size

PYTHON = sys.executable
GiB, MiB = 1024**3, 1024**2


# ------------------------------------------------------------------------------------ sizes, ages
@pytest.mark.parametrize(
    "text, expected",
    [
        ("20GiB", 20 * GiB),
        ("500MB", 500 * 1000**2),
        ("10G", 10 * GiB),
        ("1.5GiB", int(1.5 * GiB)),
        ("123", 123),
        ("4096B", 4096),
        ("64k", 64 * 1024),
        ("64KiB", 64 * 1024),
        ("2kb", 2000),
        ("512m", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("3GB", 3 * 1000**3),
        ("1T", 1024**4),
        ("2TiB", 2 * 1024**4),
        (" 10 GiB ", 10 * GiB),
        ("10gib", 10 * GiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["banana", "", "GiB", "-5GB", "0", "0GiB", "0.1", "10 XB", "1e9", "10GiB!", "ten"]
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7d", 7 * 86400),
        ("12h", 12 * 3600),
        ("30m", 1800),
        ("45s", 45),
        ("45", 45),
        ("2w", 14 * 86400),
        ("1.5h", 5400),
    ],
)
def test_parse_age(text: str, expected: float) -> None:
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["7y", "", "-1d", "d", "1 day", "7dd", "soon"])
def test_parse_age_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_age(text)


def test_format_size() -> None:
    assert config.format_size(0) == "0 B"
    assert config.format_size(1536) == "1.5 KiB"
    assert config.format_size(10 * GiB) == "10.0 GiB"


# --------------------------------------------------------------------------------- the variables
def test_defaults(tmp_path: Path) -> None:
    s = load({"HOME": str(tmp_path)})
    assert s.enabled is False
    assert s.dir == tmp_path / ".cache" / "kcache"
    assert s.max_size == DEFAULT_MAX_SIZE == 10 * GiB
    assert s.remote is None and s.readonly is False and s.key_tag == "" and s.secret is None
    assert s.log == "warning" and s.allow_insecure is False
    assert s.problems == []
    assert set(s.sources.values()) == {"default"}
    assert set(s.sources) == set(config.ENV)


def test_default_dir_follows_xdg(tmp_path: Path) -> None:
    assert (
        default_dir({"XDG_CACHE_HOME": str(tmp_path / "x"), "HOME": "/nowhere"}) == tmp_path / "x" / "kcache"
    )
    assert load({"XDG_CACHE_HOME": str(tmp_path / "x")}).dir == tmp_path / "x" / "kcache"


def test_every_variable_parsed(tmp_path: Path) -> None:
    env = {
        "KCACHE": "1",
        "KCACHE_DIR": str(tmp_path / "store"),
        "KCACHE_MAX_SIZE": "500MB",
        "KCACHE_REMOTE": "redis://cachehost:6379/0",
        "KCACHE_READONLY": "1",
        "KCACHE_KEY_TAG": "v2",
        "KCACHE_SECRET": "s3cret",
        "KCACHE_LOG": "DEBUG",
        "KCACHE_RECORD": str(tmp_path / "spec.toml"),
        "KCACHE_ALLOW_INSECURE": "yes",
        "KCACHE_REMOTE_PASSWORD": "pw",
        "KCACHE_REMOTE_PREFIX": "team:",
        "KCACHE_REMOTE_MAX_ENTRY": "1MiB",
        "KCACHE_REMOTE_TIMEOUT": "50ms",
        "KCACHE_REMOTE_LOCK_LEASE": "30s",
        "KCACHE_RECACHE": "1",
        "KCACHE_LOGFILE": str(tmp_path / "kcache.log"),
    }
    s = load(env)
    assert s.problems == [] and s.remote_problems == []
    assert s.enabled is True
    assert s.dir == tmp_path / "store"
    assert s.max_size == 500 * 1000**2
    assert s.remote == "redis://cachehost:6379/0"
    assert s.readonly is True
    assert s.key_tag == "v2"
    assert s.secret == b"s3cret"
    assert s.log == "debug"
    assert s.record == str(tmp_path / "spec.toml")
    assert s.allow_insecure is True
    assert (s.remote_password, s.remote_prefix, s.remote_max_entry) == ("pw", "team:", 1 << 20)
    assert (s.remote_timeout, s.remote_lock_lease) == (50.0, 30.0)
    assert s.recache is True and s.logfile == str(tmp_path / "kcache.log")
    assert s.sources == {name: f"env {var}" for name, var in config.ENV.items()}
    d = s.as_dict()
    assert d["secret"] == "set" and "s3cret" not in repr(d)
    assert d["dir"] == str(tmp_path / "store") and d["max_size"] == 500 * 1000**2


@pytest.mark.parametrize(
    "value, expected", [("1", True), ("true", True), ("ON", True), ("0", False), ("no", False)]
)
def test_flags(value: str, expected: bool) -> None:
    for var, name in (
        ("KCACHE", "enabled"),
        ("KCACHE_READONLY", "readonly"),
        ("KCACHE_ALLOW_INSECURE", "allow_insecure"),
    ):
        s = load({var: value})
        assert getattr(s, name) is expected and s.problems == []


def test_empty_values_mean_default() -> None:
    s = load({"KCACHE_MAX_SIZE": "", "KCACHE_DIR": "", "KCACHE_REMOTE": "", "KCACHE_LOG": "", "KCACHE": ""})
    assert s.problems == [] and s.max_size == DEFAULT_MAX_SIZE and s.remote is None


def test_key_tag_may_be_set_empty() -> None:
    assert load({"KCACHE_KEY_TAG": ""}).key_tag == ""
    assert load({"KCACHE_KEY_TAG": ""}).sources["key_tag"] == "env KCACHE_KEY_TAG"


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://h:6380/1", "unix:///run/redis.sock"])
def test_remote_urls(url: str) -> None:
    s = load({"KCACHE_REMOTE": url})
    assert s.remote == url and s.problems == []


def test_relative_and_user_dirs_are_made_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load({"KCACHE_DIR": "rel/store"}).dir == tmp_path / "rel" / "store"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load({"KCACHE_DIR": "~/kc"}).dir == tmp_path / "home" / "kc"


# ------------------------------------------------------------------------------------ bad values
def _bad_cases(tmp_path: Path) -> dict[str, str]:
    f = tmp_path / "a-file"
    f.write_text("not a directory")
    return {
        "KCACHE_MAX_SIZE": "banana",
        "KCACHE_DIR": str(f),
        "KCACHE_READONLY": "maybe",
        "KCACHE_LOG": "loud",
        "KCACHE": "sometimes",
        "KCACHE_ALLOW_INSECURE": "please",
    }


@pytest.mark.parametrize(
    "var",
    [
        "KCACHE_MAX_SIZE",
        "KCACHE_DIR",
        "KCACHE_READONLY",
        "KCACHE_LOG",
        "KCACHE_ALLOW_INSECURE",
    ],
)
def test_bad_value_listed_and_caching_off(tmp_path: Path, var: str) -> None:
    bad = _bad_cases(tmp_path)[var]
    s = load({"KCACHE": "1", var: bad})
    assert s.enabled is False
    assert len(s.problems) == 1
    assert var in s.problems[0] and repr(bad) in s.problems[0]
    name = {v: k for k, v in config.ENV.items()}[var]
    assert s.sources[name] == "default", "a bad value is not used"


def test_bad_kcache_flag_itself(tmp_path: Path) -> None:
    s = load({"KCACHE": "sometimes"})
    assert s.enabled is False and len(s.problems) == 1 and "KCACHE=" in s.problems[0]


def test_all_bad_values_listed_together(tmp_path: Path) -> None:
    bad = _bad_cases(tmp_path)
    s = load({**bad, "KCACHE": "1"})
    assert s.enabled is False
    assert len(s.problems) == len(bad) - 1
    for var in bad:
        if var != "KCACHE":
            assert any(p.startswith(var + "=") for p in s.problems), var


def test_bad_value_keeps_the_default(tmp_path: Path) -> None:
    s = load({"KCACHE_MAX_SIZE": "banana", "KCACHE_LOG": "loud"})
    assert s.max_size == DEFAULT_MAX_SIZE and s.log == "warning"
    assert s.sources["max_size"] == "default"


def test_overrides_win_and_are_validated(tmp_path: Path) -> None:
    s = load(
        {"KCACHE_MAX_SIZE": "1GiB", "KCACHE_DIR": str(tmp_path / "env")},
        max_size="2GiB",
        dir=tmp_path / "arg",
    )
    assert s.max_size == 2 * GiB and s.sources["max_size"] == "argument"
    assert s.dir == tmp_path / "arg" and s.sources["dir"] == "argument"
    s = load({}, max_size=12345, readonly=True, key_tag="t")
    assert s.max_size == 12345 and s.readonly is True and s.key_tag == "t"
    s = load({}, max_size="banana")
    assert s.enabled is False and s.problems and "banana" in s.problems[0]
    s = load({}, max_size=None)  # None means "not given"
    assert s.problems == [] and s.max_size == DEFAULT_MAX_SIZE
    with pytest.raises(TypeError):
        load({}, colour="blue")


def test_load_reads_os_environ_by_default(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KCACHE_MAX_SIZE", "3GiB")
    assert load().max_size == 3 * GiB


# --------------------------------------------------------------------------- kcache.enable in a process
ENABLE = textwrap.dedent(
    """
    import sys, kcache
    ok = kcache.enable()
    ok2 = kcache.enable()
    print("enabled", ok, ok2, kcache.is_enabled())
    print("program continues")
    """
)


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "var, value",
    [
        ("KCACHE_MAX_SIZE", "banana"),
        ("KCACHE_LOG", "loud"),
        ("KCACHE_READONLY", "maybe"),
    ],
)
def test_enable_with_bad_env_warns_once_and_returns_false(tmp_path: Path, var: str, value: str) -> None:
    env = _clean_env(tmp_path, KCACHE_DIR=str(tmp_path / "store"), **{var: value})
    r = subprocess.run([PYTHON, "-c", ENABLE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["enabled False False False", "program continues"]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "kcache" in lines[0] and var in lines[0] and "off" in lines[0]
    assert not (tmp_path / "store").exists()


def test_enable_with_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    r = subprocess.run(
        [PYTHON, "-c", ENABLE],
        capture_output=True,
        text=True,
        env=_clean_env(tmp_path, KCACHE_DIR=str(f)),
        timeout=60,
    )
    assert r.returncode == 0 and "enabled False False False" in r.stdout, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "KCACHE_DIR" in r.stderr


def test_enable_with_an_unusable_store_warns_and_returns_false(tmp_path: Path) -> None:
    d = tmp_path / "foreign"
    d.mkdir(mode=0o700)
    (d / "notes.txt").write_text("mine")
    r = subprocess.run(
        [PYTHON, "-c", ENABLE],
        capture_output=True,
        text=True,
        env=_clean_env(tmp_path, KCACHE_DIR=str(d)),
        timeout=60,
    )
    assert r.returncode == 0 and "enabled False False False" in r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a kcache store" in lines[0]
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]


def test_enable_with_good_env(tmp_path: Path) -> None:
    code = (
        "import kcache; ok = kcache.enable(triton=False, nvfuser=False);"
        "print(ok, kcache.is_enabled(), kcache.settings().max_size, kcache.settings().sources['max_size'])"
    )
    env = _clean_env(tmp_path, KCACHE_DIR=str(tmp_path / "store"), KCACHE_MAX_SIZE="500MB")
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", str(500 * 1000**2), "env", "KCACHE_MAX_SIZE"]
    assert (tmp_path / "store" / "KCACHE_STORE").exists()
