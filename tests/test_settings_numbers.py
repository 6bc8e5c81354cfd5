"""Every numeric setting has a range: a value out of it, or one that does not parse, warns once and
falls back (caching off for the local store's settings, the shared tier off for its own, the
variable ignored for the others); it never raises into the program, and ``kcache config`` shows
it. Each case runs in a real process, as users meet it.

Before: ``KCACHE_MAX_SIZE`` or ``KCACHE_REMOTE_MAX_ENTRY`` of 400 digits made ``kcache.enable()``,
``is_enabled()``, ``stats()`` and ``active_store()`` raise OverflowError (``float()`` of the
digits is ``inf``; ``int(inf)`` raises), and ``kcache config`` exited with an error and no value.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcache import config

PYTHON = sys.executable
BAD = {
    "400 digits": "9" * 400,
    "negative": "-1",
    "garbage": "twelve",
    "nan": "nan",
    "exponent": "1e400",
    "huge with a unit": "99999999999999999999999TiB",
    "20 digits": "1" + "0" * 19,
}
# variable -> what a bad value turns off ("local": caching; "remote": the shared tier; "none": only
# the variable itself is ignored)
NUMERIC = {
    "KCACHE_MAX_SIZE": "local",
    "KCACHE_REMOTE_MAX_ENTRY": "remote",
    "KCACHE_REMOTE_TIMEOUT": "remote",
    "KCACHE_REMOTE_LOCK_LEASE": "remote",
    "KCACHE_PREWARM_PROTECT_S": "none",
}

PROGRAM = textwrap.dedent(
    """
    import json, kcache
    out = {"enable": kcache.enable(), "enabled": kcache.is_enabled()}
    out["store"] = kcache.active_store() is not None
    out["stats"] = sorted(kcache.stats())
    tier = (kcache.active_store().tiers or [None])[0] if out["store"] else None
    out["remote"] = tier is not None
    print(json.dumps(out))
    """
)


def _env(tmp: Path, var: str, value: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"), KCACHE_DIR=str(tmp / "store"))
    env["KCACHE_REMOTE"] = "redis://127.0.0.1:9/0"  # never reached: the program does not compile
    env[var] = value
    return env


def _run_all(cmds: list[tuple[list[str], dict[str, str]]]) -> list[subprocess.CompletedProcess]:
    """Run the processes eight at a time (each is short; the box has 2 cores)."""
    out: list[subprocess.CompletedProcess] = []
    for i in range(0, len(cmds), 8):
        procs = [
            subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c, e in cmds[i : i + 8]
        ]
        for p, (c, _e) in zip(procs, cmds[i : i + 8]):
            so, se = p.communicate(timeout=120)
            out.append(subprocess.CompletedProcess(c, p.returncode, so, se))
    return out


@pytest.mark.parametrize("var", sorted(NUMERIC))
def test_a_bad_number_never_raises_into_the_program(tmp_path: Path, var: str) -> None:
    cases = [(name, value) for name, value in BAD.items()]
    cmds = []
    for i, (_name, value) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        cmds.append(([PYTHON, "-c", PROGRAM], _env(tmp_path / str(i), var, value)))
    for (name, _value), p in zip(cases, _run_all(cmds)):
        assert p.returncode == 0 and "Traceback" not in p.stderr, f"{var} {name}: {p.stderr[-2000:]}"
        got = json.loads(p.stdout)
        assert "stats" in got
        if NUMERIC[var] == "local":  # caching off, said once
            assert got["enable"] is False and got["enabled"] is False and not got["store"], (name, got)
        else:  # local caching goes on
            assert got["enabled"] is True and got["store"], (name, got)
        if NUMERIC[var] == "remote":
            assert got["remote"] is False, (name, got)  # the shared tier is off
        assert p.stderr.count(var) == 1, f"{var} {name}: {p.stderr}"  # warned once, named
        assert "9" * 100 not in p.stderr  # and a long value is not printed whole


@pytest.mark.parametrize("var", sorted(set(NUMERIC) - {"KCACHE_PREWARM_PROTECT_S"}))
def test_kcache_config_shows_a_bad_number(tmp_path: Path, var: str) -> None:
    cmds = []
    for i, value in enumerate(BAD.values()):
        (tmp_path / str(i)).mkdir()
        env = _env(tmp_path / str(i), var, value)
        cmds.append(([PYTHON, "-m", "kcache", "config", "--json"], env))
        cmds.append(([PYTHON, "-m", "kcache", "config"], env))
    for name, (pj, ph) in zip(BAD, zip(*[iter(_run_all(cmds))] * 2)):
        assert pj.returncode == 0 and "Traceback" not in pj.stderr, f"{name}: {pj.stderr[-2000:]}"
        rep = json.loads(pj.stdout)
        problems = rep["problems"] + rep["remote_problems"]
        assert len(problems) == 1 and problems[0].startswith(var), problems
        assert ph.returncode == 0 and var in ph.stdout and "Traceback" not in ph.stderr, ph.stderr


@pytest.mark.parametrize("var", ["KCACHE_DEVICE", "KCACHE_PREWARM_PROTECT_S"])
def test_numbers_read_outside_the_settings_fall_back(var: str, kcache_warnings: list[str]) -> None:
    for name, value in BAD.items():
        assert config.env_number(var, {var: value}) is None, name
    assert len(kcache_warnings) == 1 and var in kcache_warnings[0]
    _unit, _low, high = config.ENV_RANGES[var]
    assert config.env_number(var, {var: str(int(high))}) == high
    assert config.env_number(var, {}) is None


def test_every_numeric_setting_has_a_range() -> None:
    numeric = {
        n
        for n, v in vars(config.Settings()).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    assert numeric == set(config.RANGES)
    for name, (_unit, _low, high) in config.RANGES.items():
        assert config.load({config.ENV[name]: str(int(high) + 1)}).sources[name] == "default"
        s = config.load({config.ENV[name]: str(int(high))})
        assert s.sources[name] == f"env {config.ENV[name]}", (name, s.problems, s.remote_problems)
