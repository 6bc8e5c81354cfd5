"""The store's faces (kcache/store/api.py) are what their implementations offer: every method a
face declares exists on the object that is handed out for it, and accepts the face's arguments
by the same names. A face that grows without its implementation (or an implementation that
drops a method callers rely on) fails here, not in a user's process."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from kcache.store import Store, api
from kcache.store.tiers.backend import TierConfig
from kcache.store.tiers.redis import RedisBackend
from kcache.store.tiers.shared import SharedTier


def _declared(face: type) -> dict[str, Any]:
    """The members a Protocol declares itself (methods, properties, annotated attributes)."""
    out: dict[str, Any] = {}
    for klass in face.__mro__:
        if klass in (object,) or klass.__name__ in ("Protocol", "Generic"):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                out.setdefault(name, value)
        for name in getattr(klass, "__annotations__", {}):
            if not name.startswith("_"):
                out.setdefault(name, None)
    return out


def missing_or_unlike(obj: Any, face: type) -> list[str]:
    problems = []
    for name, declared in _declared(face).items():
        if not hasattr(obj, name):
            problems.append(f"{name}: missing")
            continue
        if not inspect.isfunction(declared):
            continue  # an attribute or a property: present is what counts
        got = getattr(obj, name)
        want = inspect.signature(declared)
        have = inspect.signature(got)
        params = {p.name: p for p in have.parameters.values()}
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for p in list(want.parameters.values())[1:]:  # not self
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.name not in params and not takes_kwargs:
                problems.append(f"{name}: does not take {p.name!r}")
    return problems


def test_the_store_offers_the_cache_and_admin_faces(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    try:
        assert missing_or_unlike(s, api.Cache) == []
        assert missing_or_unlike(s, api.Admin) == []
    finally:
        s.close()


def test_the_redis_tier_offers_the_tier_face() -> None:
    tier = SharedTier(RedisBackend(TierConfig("redis://127.0.0.1:1/0")), counts=None)
    assert missing_or_unlike(tier, api.Tier) == []


def test_the_check_itself_sees_a_missing_method() -> None:
    class Half:
        def get(self, kind: str) -> None: ...

    problems = missing_or_unlike(Half(), api.Cache)
    assert "put: missing" in problems and any(p.startswith("get: does not take") for p in problems)


@pytest.mark.parametrize("face", [api.Cache, api.Admin, api.Tier])
def test_faces_are_small(face: type) -> None:
    """A face that grows past a dozen or two names is the one-object-is-every-interface problem
    again: split it instead."""
    assert len(_declared(face)) <= 25, sorted(_declared(face))


# ------------------------------------------------------------------ the faces hold the integrations
ROOT = Path(__file__).resolve().parents[1]
#: The integrations' code, typed against the Cache face (prewarm's runner opens a store of its own:
#: it sits above them, as an application does).
INTEGRATION_CODE = [
    *sorted((ROOT / "kcache" / "triton").rglob("*.py")),
    *sorted((ROOT / "kcache" / "nvfuser").rglob("*.py")),
    *sorted((ROOT / "kcache" / "inductor").rglob("*.py")),
    ROOT / "kcache" / "memo.py",
    ROOT / "kcache" / "prewarm" / "integration.py",
]
#: Modules of the store an integration may import: its faces and the plain values they hand out,
#: and the store's helpers for files it writes outside the store (not the store itself).
STORE_PARTS_ALLOWED = {"api", "hit", "records", "fs", "safety", "quarantine"}
#: ``kcache import-triton``'s work, handed a writable store by the command (it reads the bound).
CONCRETE_ALLOWED = {"kcache/triton/importer.py"}


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def concrete_store_imports(files: list[Path]) -> list[str]:
    """Imports of the store itself (``kcache.store``'s ``Store``, its cache or disk tier) in
    ``files``: an integration reaches the store only through the face it is handed."""
    import ast

    found = []
    for path in files:
        rel = _rel(path)
        if rel in CONCRETE_ALLOWED:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module and not node.level:
                continue
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                parts = mod.split(".")
                if node.level and parts[0] == "store" or parts[:2] == ["kcache", "store"]:
                    sub = parts[1:] if parts[0] == "store" else parts[2:]
                    names = [a.name for a in node.names]
                    if not sub and any(n not in ("api", *STORE_PARTS_ALLOWED) for n in names):
                        found.append(f"{rel}:{node.lineno}: from {mod} import {', '.join(names)}")
                    elif sub and sub[0] not in STORE_PARTS_ALLOWED:
                        found.append(f"{rel}:{node.lineno}: from {mod} import ...")
    return found


def untyped_store_parameters(files: list[Path]) -> list[str]:
    """Parameters and attributes that hold the cache (named ``store`` or ``cache``) typed ``Any``
    (or not at all) in ``files``: what the type checker cannot hold to the face."""
    import ast

    found = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                    if a.arg in ("store", "cache") and (
                        a.annotation is None or "Any" in ast.unparse(a.annotation)
                    ):
                        found.append(f"{_rel(path)}:{node.lineno}: {node.name}({a.arg}: ...)")
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, (ast.Name, ast.Attribute)):
                name = node.target.id if isinstance(node.target, ast.Name) else node.target.attr
                if name in ("store", "_store", "cache") and "Any" in ast.unparse(node.annotation):
                    found.append(f"{_rel(path)}:{node.lineno}: {name}: {ast.unparse(node.annotation)}")
    return found


def test_integrations_reach_the_store_only_through_the_cache_face() -> None:
    assert concrete_store_imports(INTEGRATION_CODE) == []
    assert untyped_store_parameters(INTEGRATION_CODE) == []


def test_each_integration_keeps_its_cache_in_a_slot_typed_with_the_face() -> None:
    import ast

    slots = []
    for path in INTEGRATION_CODE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and "CacheSlot()" in ast.unparse(node.value):
                slots.append(f"{_rel(path)}:{node.lineno}: untyped slot")
            elif isinstance(node, ast.AnnAssign) and "CacheSlot" in ast.unparse(node.annotation):
                slots.append(ast.unparse(node.annotation))
    assert slots and set(slots) == {"CacheSlot[Cache]"}, slots


def test_the_checks_see_a_concrete_store_and_an_untyped_one(tmp_path: Path) -> None:
    bad = tmp_path / "kcache" / "triton" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "from __future__ import annotations\n"
        "from typing import Any\n"
        "from ..store import Store\n"
        "from ..store.cache import TieredCache\n"
        "def f(store: Any) -> None: ...\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(concrete_store_imports([bad])) == 2
        assert len(untyped_store_parameters([bad])) == 1
    finally:
        ROOT = saved


mypy_api = pytest.importorskip("mypy.api", reason="the type checker is in the test extra")


def test_the_type_checker_refuses_an_integration_calling_a_verb_outside_its_face(tmp_path: Path) -> None:
    """What holds callers to the faces: an integration that calls the store's index (an Admin
    verb) through its slot fails the type check, as .ci/run runs it over kcache/."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from kcache.triton.attached import cache\n"
        "store = cache()\n"
        "if store is not None:\n"
        "    store.get('triton', 'k')\n"  # the face: fine
        "    store.index()\n"  # an Admin verb: refused
    )
    out, err, status = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--follow-imports=silent",
            str(probe),
        ]
    )
    assert status == 1, out + err
    lines = [ln for ln in out.splitlines() if "error:" in ln]
    assert len(lines) == 1 and '"Cache" has no attribute "index"' in lines[0], out


def test_the_verbs_the_cache_face_gained_do_what_it_says(tmp_path: Path) -> None:
    """has, keys, lock, quarantine, closed: what Inductor and nvFuser use instead of Admin verbs."""
    s = Store.open(tmp_path / "store")
    try:
        for i in range(3):
            assert s.put("nvfuser", f"fp1/k{i}", {"kernel.cu": b"x" * (i + 1)}) is not None
        assert s.put("nvfuser", "fp2/k0", {"kernel.cu": b"y"}) is not None
        assert s.has("nvfuser", "fp1/k0") and not s.has("nvfuser", "fp1/absent")
        s.flush(force=True)  # the catalogue lists what its flush wrote
        assert sorted(s.keys("nvfuser", "fp1/")) == ["fp1/k0", "fp1/k1", "fp1/k2"]
        assert s.keys("triton") == []
        held = s.lock("nvfuser-manifest", "fp1", timeout=1.0)
        assert held is not None
        held.release()
        hit = s.get("nvfuser", "fp1/k1")
        assert hit is not None
        s.quarantine(hit.record, "the library could not use it")
        assert s.get("nvfuser", "fp1/k1") is None and not s.has("nvfuser", "fp1/k1")
        s.forget("nvfuser", "fp1/k2")
        assert not s.has("nvfuser", "fp1/k2")
        assert not s.closed
    finally:
        s.close()
    assert s.closed
