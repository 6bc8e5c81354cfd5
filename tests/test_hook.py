"""The ``.pth`` hook (issue 7, point 5): ``KCACHE=1`` turns kcache on in every Python process with
no code change, imports neither torch nor triton, and a bad setting never stops the program.

Every test runs a fresh interpreter of this environment whose program never imports kcache: what
it finds in ``sys.modules`` was put there by the hook alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent(
    """
    import sys
    print("kcache" in sys.modules, "torch" in sys.modules, "triton" in sys.modules)
    k = sys.modules.get("kcache")
    print(k.is_enabled() if k else None)
    print("program ran")
    """
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    e.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    e.pop("PYTHONPATH", None)
    return e


def run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, *args, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_pth_is_installed_in_site_packages() -> None:
    pth = Path(sysconfig.get_paths()["purelib"]) / "kcache.pth"
    assert pth.is_file(), "the editable install ships kcache.pth"
    assert pth.read_text() == (REPO / "kcache" / "_hook.pth").read_text()
    lines = pth.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import "), (
        "site.py executes only lines starting with import"
    )


def test_kcache_on(tmp_path: Path, env: dict[str, str]) -> None:
    store = tmp_path / "store"
    r = run(PROBE, {**env, "KCACHE": "1", "KCACHE_DIR": str(store)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True False False", "True", "program ran"], r.stderr
    assert (store / "KCACHE_STORE").is_file()
    assert r.stderr == "", "a good configuration is silent"


@pytest.mark.parametrize("value", [None, "0", ""], ids=["unset", "zero", "empty"])
def test_kcache_off(tmp_path: Path, env: dict[str, str], value: str | None) -> None:
    e = {**env, "KCACHE_DIR": str(tmp_path / "store")}
    if value is not None:
        e["KCACHE"] = value
    r = run(PROBE, e)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["False False False", "None", "program ran"]
    assert r.stderr == ""
    assert not (tmp_path / "store").exists()


def test_bad_setting_still_runs_with_one_warning(tmp_path: Path, env: dict[str, str]) -> None:
    r = run(PROBE, {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store"), "KCACHE_MAX_SIZE": "banana"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:] == ["False", "program ran"]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "KCACHE_MAX_SIZE" in lines[0] and "banana" in lines[0]
    assert r.stdout.splitlines()[0] == "True False False"
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    "var, value", [("KCACHE_LOG", "loud"), ("KCACHE", "maybe"), ("KCACHE_READONLY", "maybe")]
)
def test_other_bad_settings_still_run(tmp_path: Path, env: dict[str, str], var: str, value: str) -> None:
    e = {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store"), var: value}
    r = run(PROBE, e)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "program ran", r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_unusable_store_still_runs(tmp_path: Path, env: dict[str, str]) -> None:
    f = tmp_path / "a-file"
    f.write_text("x")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    for d in (f, foreign, Path("/proc/kcache-cannot-be-here")):
        r = run(PROBE, {**env, "KCACHE": "1", "KCACHE_DIR": str(d)})
        assert r.returncode == 0 and r.stdout.splitlines()[1:] == ["False", "program ran"], r.stderr
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_subprocesses_inherit(tmp_path: Path, env: dict[str, str]) -> None:
    code = textwrap.dedent(
        f"""
        import subprocess, sys
        r = subprocess.run([sys.executable, "-c", {PROBE!r}], capture_output=True, text=True)
        print(r.stdout, end="")
        print(r.stderr, end="", file=sys.stderr)
        """
    )
    r = run(code, {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True False False", "True", "program ran"], r.stderr


def test_hook_does_not_leak_names_into_the_program(tmp_path: Path, env: dict[str, str]) -> None:
    code = "import __main__; print(sorted(n for n in vars(__main__) if not n.startswith('__')))"
    r = run(code, {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store")})
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_triton_attaches_when_the_program_imports_it(tmp_path: Path, env: dict[str, str]) -> None:
    pytest.importorskip("triton")
    code = textwrap.dedent(
        """
        import sys
        assert "triton" not in sys.modules
        import triton
        from triton import knobs
        cls = knobs.cache.manager_class  # None: Triton's own FileCacheManager
        k = sys.modules.get("kcache")
        print(cls.__module__.split(".")[0] if cls else "default", k.is_enabled() if k else None)
        """
    )
    r = run(code, {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["kcache", "True"], r.stderr
    # and a process with KCACHE unset keeps Triton's own manager
    r = run(code, env)
    assert r.returncode == 0 and r.stdout.split() == ["default", "None"], r.stderr


def _importtime(env: dict[str, str]) -> dict[str, int]:
    """Self time (µs) of every module imported by ``python -c pass``, from ``-X importtime``."""
    r = run("pass", env, "-X", "importtime")
    out = {}
    for ln in r.stderr.splitlines():
        if ln.startswith("import time:") and "cumulative" not in ln:
            self_us, _cum, name = (p.strip() for p in ln[len("import time:") :].split("|"))
            out[name] = int(self_us)
    return out


def _wall(env: dict[str, str], n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        run("pass", env)
        times.append(time.perf_counter() - t)
    return min(times)


def test_hook_cost_is_reported(tmp_path: Path, env: dict[str, str], capsys) -> None:
    """Measured, printed, never asserted (timing assertions make flaky tests). The targets: under
    1 ms with KCACHE unset and under 20 ms with KCACHE=1 (issue 7, point 5)."""
    # Bytecode cached (in tmp_path) as in an installed package, even where PYTHONDONTWRITEBYTECODE
    # is set: otherwise every start would compile kcache's sources and the figure would mean little.
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    on = {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store")}
    run("pass", on)  # create the store and the bytecode first: the cost of a normal start
    run("pass", env)
    off, set_ = _importtime(env), _importtime(on)
    added = {name: us for name, us in set_.items() if name not in off}
    wall_off, wall_on = _wall(env), _wall(on)
    with capsys.disabled():
        print(
            f"\n[hook cost] KCACHE=1 imports {len(added)} more modules, {sum(added.values()) / 1000:.1f} ms of "
            f"import self time (-X importtime); `python -c pass` best of 3: {wall_off * 1000:.0f} ms unset, "
            f"{wall_on * 1000:.0f} ms set; slowest added: "
            + ", ".join(f"{n} {us / 1000:.1f}" for n, us in sorted(added.items(), key=lambda x: -x[1])[:6])
        )
    assert not {"torch", "triton"} & set(added)


#: What the hook may load in a process that imports neither triton, nor torch, nor nvFuser: the
#: package, the hook, the import-hook module, the attaching of integrations and their registry
#: (which reads each one's declaration from its file: no integration package is imported).
#: Settings, logging, the store and msgpack load when an integration first needs them (issue 19:
#: every Python process of a user who exports KCACHE=1 pays for what is here).
HOOK_MODULES = {"kcache", "kcache._autoload", "kcache._imports", "kcache.integrations", "kcache.registry"}


def test_the_hook_loads_only_its_modules(tmp_path: Path, env: dict[str, str]) -> None:
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    on = {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store")}
    import json

    base = set(json.loads(run(code, env).stdout))
    with_hook = set(json.loads(run(code, on).stdout))
    assert with_hook - base == HOOK_MODULES, sorted(with_hook - base)
    assert not (tmp_path / "store").exists(), "the store is opened at first use, not at start-up"


def test_settings_are_checked_when_an_integration_attaches(tmp_path: Path, env: dict[str, str]) -> None:
    """A bad setting warns once when triton is imported (not in every process that never uses
    kcache), and leaves caching off."""
    on = {**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store"), "KCACHE_MAX_SIZE": "lots"}
    quiet = run("pass", on)
    assert quiet.returncode == 0 and "kcache" not in quiet.stderr
    loud = run("import triton, kcache; print(kcache.is_enabled())", on)
    assert loud.returncode == 0 and loud.stdout.split() == ["False"], loud.stderr
    assert [ln for ln in loud.stderr.splitlines() if ln.startswith("kcache:")] == [
        ln for ln in loud.stderr.splitlines() if "KCACHE_MAX_SIZE" in ln
    ] and "KCACHE_MAX_SIZE" in loud.stderr


def test_disable_never_imports_triton_and_removes_every_hook(tmp_path: Path, env: dict[str, str]) -> None:
    code = textwrap.dedent(
        f"""
        import sys, kcache
        assert kcache.enable(dir={str(tmp_path / "s1")!r})
        kcache.disable()
        print("triton" in sys.modules)
        import triton
        assert kcache.enable(dir={str(tmp_path / "s2")!r})
        from triton import knobs
        from kcache.triton import keymemo, toolmemo
        import triton.knobs as tk
        memo = isinstance(getattr(tk, "subprocess", None), toolmemo._MemoSubprocess)
        installed = (knobs.cache.manager_class.__name__, keymemo.installed(), memo)
        kcache.disable()
        print(*installed, knobs.cache.manager_class, keymemo.installed(),
              isinstance(getattr(tk, "subprocess", None), toolmemo._MemoSubprocess))
        """
    )
    r = run(code, env)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first == "False", "disable() imported Triton"
    manager, memo_mod, tool_memo_on, after_manager, after_mod, tool_memo = second.split()
    assert manager == "KcacheCacheManager" and memo_mod == "True" and tool_memo_on == "True"
    assert after_manager == "None" and after_mod == "False" and tool_memo == "False"


def test_wheel_ships_the_pth(tmp_path: Path) -> None:
    """A regular (non-editable) wheel carries kcache.pth at its root, next to the package."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "kcache", src / "kcache", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(
        [
            PYTHON,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wh"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("no pip in this environment")
    assert r.returncode == 0, r.stderr
    (whl,) = (tmp_path / "wh").glob("kcache-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        assert "kcache.pth" in names
        assert z.read("kcache.pth").decode() == (REPO / "kcache" / "_hook.pth").read_text()
        assert "kcache/_autoload.py" in names
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        assert "kcache.pth," in record, "pip records it, so uninstall removes it"
