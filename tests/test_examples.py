"""Every example in the docs runs as written, on a fresh virtual environment made here.

The README's two commands are the whole set-up; each example page adds only what it says to
install. So this test makes a new virtual environment (no system site-packages: nothing of the
environment running the tests leaks in), copies the checkout's tracked files, and runs, in
order and as written:

1. the README's install-and-quickstart command (``pip install -e . && ...``);
2. each shell block (``console``, ``bash``, or plain with ``$`` lines) of
   ``docs/examples/*/README.md``, command by command in
   one shell (``cd`` and ``export`` carry over), checking each command's exit status (non-zero
   where the page shows an error) and that each line of output the page shows is printed
   (numbers, timings and temporary folders aside; ``...`` stands for lines not shown).

pip installs from wheels packed from this environment's own installed files
(:mod:`wheelhouse`; ``PIP_NO_INDEX``, ``PIP_FIND_LINKS``): the documented ``pip install``
commands run unchanged, resolve as they would from an index, and need no network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import wheelhouse

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MARK = "@@kcache-example-rc="
#: Where each page's commands run from (its own text says "from the checkout's root").
PAGES = sorted((REPO / "docs" / "examples").glob("*/README.md"))


def _blocks(text: str) -> list[str]:
    """The shell blocks of a page: ``console`` and ``bash`` ones, and plain ones with ``$`` lines."""
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) in ("console", "bash") or (not m.group(1) and re.search(r"^\$ ", m.group(2), re.M)):
            out.append(m.group(2))
    return out


def _readme_install() -> str:
    """The README's first command block: the install and the quickstart."""
    section = (REPO / "README.md").read_text().split("## Two commands on a fresh machine", 1)[1]
    block = _blocks(section)[0]
    assert "pip install -e ." in block, block
    return block


def _commands(block: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines the page shows for it) of a console block; a bash block is one
    command per line, with no output shown."""
    out: list[tuple[str, list[str]]] = []
    lines = block.splitlines()
    if not any(ln.startswith("$ ") for ln in lines):
        return [(ln, []) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    for ln in lines:
        if ln.startswith("$ "):
            out.append((ln[2:], []))
        elif out:
            out[-1][1].append(ln)
    return out


def _norm(line: str, tmp: str) -> str:
    line = line.replace(tmp, "/tmp")
    line = re.sub(r"/tmp/tmp\.[A-Za-z0-9]+", "/tmp/TMP", line)
    line = re.sub(r"\d+(\.\d+)*", "N", line)
    return " ".join(line.split())


def _shown_in(expected: list[str], got: str, tmp: str) -> list[str]:
    """The lines the page shows that the command did not print (normalised)."""
    have = [_norm(g, tmp) for g in got.splitlines()]
    missing = []
    for e in expected:
        if not e.strip() or e.strip() == "...":
            continue
        ne = _norm(e, tmp)
        if ne.endswith("..."):
            ok = any(h.startswith(ne[:-3].rstrip()) for h in have)
        else:
            ok = ne in have
        if not ok:
            missing.append(e)
    return missing


def _run_block(cmds: list[tuple[str, list[str]]], cwd: Path, env: dict[str, str], where: str) -> str:
    script = "\n".join(f'{c}\necho "{MARK}$?"' for c, _ in cmds) + "\n"
    p = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)  # fmt: skip
    parts = re.split(rf"^{re.escape(MARK)}(\d+)$", p.stdout, flags=re.M)
    outputs, codes = parts[0::2], [int(x) for x in parts[1::2]]
    assert len(codes) == len(cmds), f"{where}: the block stopped early\n{p.stdout[-4000:]}"
    tmp = env["TMPDIR"]
    for (cmd, expected), out, rc in zip(cmds, outputs, codes):
        wants_error = any("error:" in e for e in expected)
        assert (rc != 0) == wants_error, f"{where}: `{cmd}` exited {rc}\n{out[-4000:]}"
        missing = _shown_in(expected, out, tmp)
        assert not missing, f"{where}: `{cmd}` did not print what the page shows: {missing}\n{out[-4000:]}"
    return p.stdout


def _make_venv(venv: Path) -> None:
    """``python -m venv`` as the README has it: pip (and, before Python 3.12, setuptools) from the
    wheels bundled with ensurepip, installed by that pip, as ensurepip installs them, less its
    byte-compiling of every module of both (4 s of CPU; ensurepip ignores PIP_* variables): the
    modules a page's pip imports are compiled as they are imported. Where this Python has no
    bundled wheels (a distribution's own build), ``python -m venv`` itself."""
    import ensurepip

    bundled = Path(ensurepip.__file__).parent / "_bundled"
    wheels = sorted(bundled.glob("*.whl"))
    pip_whl = next((w for w in wheels if w.name.startswith("pip-")), None)
    if pip_whl is None:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        return
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    names = [w.name.split("-", 1)[0] for w in wheels]
    subprocess.run([str(venv / "bin" / "python"), str(pip_whl / "pip"), "install", "-q", "--no-cache-dir",
                    "--no-index", "--no-compile", "--find-links", str(bundled), *names],
                   check=True, timeout=300, env=env)  # fmt: skip


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A copy of the checkout, a new virtual environment, wheels, and the environment to run in."""
    base = tmp_path_factory.mktemp("examples")
    checkout = base / "kcache"
    try:
        files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True,
                               timeout=60).stdout.decode().split("\0")  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pytest.fail("the examples test copies the checkout's tracked files: it needs git and a clone")
    for rel in filter(None, files):
        src, dst = REPO / rel, checkout / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    roots = ["setuptools", "triton", "msgpack", "xxhash", "tomli_w", "torch"]
    if sys.version_info < (3, 11):
        roots.append("tomli")
    wheels = base / "wheels"
    wheelhouse.build(roots, wheels)
    venv = base / "venv"
    _make_venv(venv)
    (base / "tmp").mkdir()
    (base / "home").mkdir()
    keep = ("LANG", "LC_ALL", "CC", "CXX")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin",
        VIRTUAL_ENV=str(venv),
        HOME=str(base / "home"),
        XDG_CACHE_HOME=str(base / "home" / ".cache"),
        TMPDIR=str(base / "tmp"),
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheels),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        # No byte-compiling of what pip installs (torch and Triton: 2,400 modules, 10-15 s of CPU
        # in a test that imports a few hundred of them). pip reads the variable as the value of
        # its `compile` option, so "0" is what turns compiling off (as `--no-compile` does).
        PIP_NO_COMPILE="0",
        PYTHONWARNINGS="ignore",
        OMP_NUM_THREADS="1",
    )
    return {"checkout": checkout, "env": env, "venv": venv}


def test_readme_install_then_every_example_page(fresh: dict[str, object]) -> None:
    checkout, env = fresh["checkout"], fresh["env"]
    assert isinstance(checkout, Path) and isinstance(env, dict)
    out = _run_block(_commands(_readme_install()), checkout, env, "README.md")
    assert "compiled and stored" in out and "hit (from kcache)" in out, out[-3000:]
    probe = subprocess.run([str(Path(env["VIRTUAL_ENV"]) / "bin" / "python"), "-c", "import torch"],
                           env=env, capture_output=True, timeout=120)  # fmt: skip
    assert probe.returncode != 0, "the README's install must not need torch: it has none"
    assert PAGES, "no example pages"
    outputs = {}
    for page in PAGES:
        rel = page.relative_to(REPO)
        blocks = _blocks(page.read_text())
        assert blocks, f"{rel}: no commands"
        outputs[rel.parent.name] = "".join(
            _run_block(_commands(b), checkout, env, f"{rel} block {i}") for i, b in enumerate(blocks)
        )
    # the torch.compile page run a second time, as written: a new store and a new serving folder
    # (issue 33: a prewarm whose Inductor folder was warm stored nothing; it compiles in a folder
    # of its own now, so the second run must store and serve as the first did)
    page = REPO / "docs" / "examples" / "torch_compile" / "README.md"
    again = "".join(
        _run_block(_commands(b), checkout, env, f"torch_compile again, block {i}")
        for i, b in enumerate(_blocks(page.read_text()))
    )
    for out in (outputs["torch_compile"], again):
        assert re.search(r"into the store: .*\d+ inductor-fx", out), out[-3000:]
        assert '"fxgraph_cache_hit": 2' in out and '"fxgraph_cache_miss"' not in out, out[-3000:]
    # beyond the page's own words: the second prewarm built nothing at all
    runs = re.findall(r"\((\d+) kernel compiles?, (\d+) launcher builds?(, (\d+) driver utilit(?:y|ies) built)?",
                      outputs["prewarm"])  # fmt: skip
    assert len(runs) == 2 and runs[1][:2] == ("0", "0") and runs[1][2] == "", runs
    # the torch.compile page: both items prepared on the CPU, both shapes served from the store
    assert "2 items: 2 prepared, 0 already cached, 0 failed" in outputs["torch_compile"], outputs[
        "torch_compile"
    ]
    assert '"fxgraph_cache": {"fxgraph_cache_hit": 2}}' in outputs["torch_compile"], outputs["torch_compile"]
    assert '"fxgraph_cache_miss"' not in outputs["torch_compile"]
    assert "TinyEncoder.forward" in outputs["torch_compile"]
