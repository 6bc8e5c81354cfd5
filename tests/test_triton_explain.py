"""``kcache explain --against OTHER``: why this machine misses what another store, bundle or
fingerprint has. Pairs of real stores, filled by real Triton compiles in fresh processes under
different settings: another ``KCACHE_KEY_TAG``, another ``TRITON_*`` variable in the key, another
Triton (the other virtual environment CI makes: ``.venv-ci`` / ``.venv-ci-newest``; here any
``.venv*`` beside the checkout with another Triton, or ``KCACHE_TEST_OTHER_PYTHON``).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")
import triton  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

KERNEL = textwrap.dedent(
    """
    import sys
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource


    @triton.jit
    def scale_add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0 + tl.load(y + offs, mask=m), mask=m)


    sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    for block in (64, 128):
        triton.compile(ASTSource(fn=scale_add, signature=sig, constexprs={"BLOCK": block}),
                       target=GPUTarget("cuda", 90, 32))
    import kcache
    kcache.active_store().flush(force=True)
    """
)


def _env(tmp: Path, store: Path | None, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"), PYTHONWARNINGS="ignore")
    env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
    env.pop("PYTHONPATH", None)
    if store is not None:
        env.update(KCACHE="1", KCACHE_DIR=str(store))
    env.update(extra)
    return env


def _compile(tmp: Path, store: Path, python: str = PY, **extra: str) -> None:
    script = tmp / "kern.py"
    script.write_text(KERNEL)
    p = subprocess.run([python, str(script)], capture_output=True, text=True, env=_env(tmp, store, **extra),
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]


def _kc(tmp: Path, *args: str, store: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    env = _env(tmp, None, **extra)
    if store is not None:
        env["KCACHE_DIR"] = str(store)
    return subprocess.run([PY, "-m", "kcache", *args], capture_output=True, text=True, env=env, timeout=120)


def _against(tmp: Path, here: Path, other: Path, **extra: str) -> dict[str, Any]:
    r = _kc(tmp, "explain", "--against", str(other), "--json", store=here, **extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _causes(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["part"]: c for c in res["causes"]}


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """This machine's store: the kernels compiled with no tag and no variable."""
    tmp = tmp_path_factory.mktemp("here")
    _compile(tmp, tmp / "store")
    return tmp, tmp / "store"


def test_another_key_tag_is_named_for_a_store_and_a_bundle(here: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, store = here
    other = tmp_path / "tagged"
    _compile(tmp_path, other, KCACHE_KEY_TAG="team-a")
    res = _against(tmp, store, other)
    assert res["lacking"] >= 2 and res["present"] == 0, res
    top = res["causes"][0]
    assert top["part"] == "key_tag" and top["entries"] == res["lacking"], res["causes"]
    assert top["here"] == "(empty)" and "KCACHE_KEY_TAG" in top["what"]
    assert "scale_add" in top["examples"]
    # what differs is the tag alone: Triton's key is the same, so no other part is named
    assert set(_causes(res)) == {"key_tag"}, res["causes"]
    bundle = tmp_path / "tagged.kcb"
    r = _kc(tmp_path, "export", str(bundle), store=other, KCACHE_KEY_TAG="team-a")
    assert r.returncode == 0, r.stderr
    res = _against(tmp, store, bundle)
    assert res["causes"][0]["part"] == "key_tag" and res["causes"][0]["there"] == ["team-a"], res
    # the table, for a person: the cause, its count, both values
    r = _kc(tmp, "explain", "--against", str(other), store=store)
    assert r.returncode == 0 and "KCACHE_KEY_TAG" in r.stdout and "(empty)" in r.stdout, r.stdout


def test_a_triton_variable_in_the_key_is_named(here: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, store = here
    other = tmp_path / "nofusion"
    _compile(tmp_path, other, TRITON_DEFAULT_FP_FUSION="0")
    res = _against(tmp, store, other)
    c = _causes(res)
    assert "env.TRITON_DEFAULT_FP_FUSION" in c, res["causes"]
    top = res["causes"][0]
    off = ("0", "false")  # as Triton reports the variable (3.6: "false")
    assert (
        top["part"] == "env.TRITON_DEFAULT_FP_FUSION" and top["there"][0] in off and top["here"] == "(unset)"
    )
    assert top["entries"] == res["lacking"] >= 2
    # the other way round: the variable set here, the other store made without it
    res = _against(tmp_path, other, store, TRITON_DEFAULT_FP_FUSION="0")
    top = res["causes"][0]
    assert (
        top["part"] == "env.TRITON_DEFAULT_FP_FUSION" and top["there"] == ["(unset)"] and top["here"] in off
    )


def test_a_fingerprint_from_the_other_machine_names_what_differs(
    here: tuple[Path, Path], tmp_path: Path
) -> None:
    tmp, store = here
    fp = tmp_path / "other.json"
    r = _kc(tmp_path, "fingerprint", "--json", "--output", str(fp), KCACHE_KEY_TAG="team-b",
            TRITON_DEFAULT_FP_FUSION="0")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(fp.read_text())
    assert doc["format"] == "kcache-fingerprint" and doc["parts"]["triton_version"] == triton.__version__
    assert str(tmp_path) not in fp.read_text(), "paths travel as digests only"
    # a miss here, so that the causes are counted against something
    _compile(tmp, store, KCACHE_KEY_TAG="here-now")
    res = _against(tmp, store, fp)
    c = _causes(res)
    assert {"key_tag", "env.TRITON_DEFAULT_FP_FUSION"} <= set(c), res["causes"]
    assert "triton_version" not in c and "python_abi" not in c
    assert c["key_tag"]["there"] == ["team-b"] and c["key_tag"]["entries"] >= 1
    assert c["env.TRITON_DEFAULT_FP_FUSION"]["entries"] >= 1


def _other_triton_python() -> str | None:
    """A Python beside this checkout (or named by KCACHE_TEST_OTHER_PYTHON) with another Triton."""
    cands = [os.environ.get("KCACHE_TEST_OTHER_PYTHON") or ""]
    cands += sorted(glob.glob(str(REPO / ".venv*" / "bin" / "python")))
    for c in cands:
        if not c or not os.path.exists(c) or os.path.abspath(c) == os.path.abspath(PY):
            continue
        p = subprocess.run([c, "-c", "import triton, kcache; print(triton.__version__)"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        if p.returncode == 0 and p.stdout.strip() and p.stdout.strip() != triton.__version__:
            return c
    return None


def test_another_triton_is_named(here: tuple[Path, Path], tmp_path: Path) -> None:
    other_py = _other_triton_python()
    if other_py is None:
        if os.environ.get("KCACHE_TEST_REQUIRE_OTHER_TRITON") == "1":
            pytest.fail("KCACHE_TEST_REQUIRE_OTHER_TRITON=1 and no virtual environment with another Triton")
        pytest.skip("no virtual environment with another Triton here (.ci/run's second phase has one)")
    tmp, store = here
    other = tmp_path / "other-triton"
    _compile(tmp_path, other, python=other_py)
    res = _against(tmp, store, other)
    top = res["causes"][0]
    assert top["part"] == "triton_version" and top["entries"] == res["lacking"] >= 2, res["causes"]
    assert top["here"] == triton.__version__ and top["there"] != [triton.__version__]
    assert "key_tag" not in _causes(res)


def test_bad_other_is_one_line(here: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, store = here
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a bundle")
    r = _kc(tmp, "explain", "--against", str(junk), store=store)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    # a file that is not there is a bad argument (exit 2, as every refused user file: kcache/userfile.py)
    r = _kc(tmp, "explain", "--against", str(tmp_path / "missing"), store=store)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
