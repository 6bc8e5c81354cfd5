"""torch_key() remembered across processes (issue 33): torch's hash of its own sources.

Each child imports Inductor's codecache, points its ``_TORCH_PATH`` at a small package tree made
here (torch's ``torch_key()`` hashes every module file under it, plus torch's version and two
files of Inductor's), counts the calls of torch's ``build_code_hash`` and prints the key. Against
a child without kcache, which is torch's own answer (one child answers for each state of the tree,
from copies: torch hashes module names relative to the root, not its path): the memo gives the
same key without hashing, and an edited module makes torch hash again and gives torch's new key.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PYTHON = sys.executable
CHILD = """
import json, os
import torch._inductor.codecache as cc
calls = []
own = cc.build_code_hash
def counted(*a, **k):
    calls.append(1)
    return own(*a, **k)
cc.build_code_hash = counted
out = []
for root in os.environ["TK_ROOT"].split(os.pathsep):  # without kcache: a root after another
    cc._TORCH_PATH = root
    if out:
        cc.torch_key.clear()  # torch's cache of the key (a process's first call: as torch makes it)
    calls.clear()
    key = cc.torch_key()
    out.append({"key": key.hex(), "hashed": len(calls)})
print(json.dumps(out))
"""


def child(tmp: Path, root: Path, kcache: bool) -> dict[str, Any]:
    return children(tmp, [root], kcache)[0]


def children(tmp: Path, roots: list[Path], kcache: bool) -> list[dict[str, Any]]:
    """torch_key() at each root, in one process (with kcache: one root, a process's own key)."""
    assert len(roots) == 1 or not kcache
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR"))}
    env.pop("PYTHONPATH", None)
    env.update(
        TK_ROOT=os.pathsep.join(map(str, roots)), HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg")
    )
    if kcache:
        env.update(KCACHE="1", KCACHE_DIR=str(tmp / "store"), KCACHE_STRICT="1")
    r = subprocess.run([PYTHON, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_torch_key_is_hashed_once_and_an_edit_hashes_again(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs torch")
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("A = 1\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "b.py").write_text("B = 1\n")
    (root / "notes").mkdir()  # not a package: torch does not hash it, neither does the key
    (root / "notes" / "c.py").write_text("C = 1\n")
    # the states the tree goes through below, as copies: torch's own answer for each
    edited_tree = tmp_path / "states" / "edited"
    shutil.copytree(root, edited_tree)
    (edited_tree / "sub" / "b.py").write_text("B = 2\n")
    added_tree = tmp_path / "states" / "added"
    shutil.copytree(edited_tree, added_tree)
    (added_tree / "sub" / "d.py").write_text("")
    torch_s, edited, added = children(tmp_path, [root, edited_tree, added_tree], kcache=False)
    assert torch_s["hashed"] > 0
    first = child(tmp_path, root, kcache=True)
    assert first == torch_s, "kcache's first process: torch's own function, torch's own key"
    second = child(tmp_path, root, kcache=True)
    assert second == {"key": torch_s["key"], "hashed": 0}, "from the memo: nothing hashed"
    (root / "notes" / "c.py").write_text("C = 2\n")  # outside torch's walk: the memo holds
    assert child(tmp_path, root, kcache=True)["hashed"] == 0
    (root / "sub" / "b.py").write_text("B = 2\n")  # an edit in place (same size)
    assert edited["key"] != torch_s["key"]
    after = child(tmp_path, root, kcache=True)
    assert after == edited, "the edit changed the memo's key: torch hashed again, its new key"
    (root / "sub" / "d.py").write_text("")  # a module added
    assert child(tmp_path, root, kcache=True) == added and added["key"] != edited["key"]
