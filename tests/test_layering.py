"""The house's layers, read from the code: every import of every module of ``kcache/`` (at module
level, inside functions, under ``TYPE_CHECKING``) is resolved to a file, and the graph must have
no cycle between files and no import that runs up against the declared layers.

The layers, from the top (see docs/design.md, "The layers"):

    cli          the command line
    prewarm      prewarm(spec) and the recorder
    facade       enable()/disable()/stats(); attaching the registered integrations
    users        integrations (triton, nvfuser, inductor) and maintenance/bundles: peers that never
                 import each other (each gets the store's face it needs)
    store        the store: faces, tiers, the composed cache
    ground       settings, logging and redaction, kinds, identity, counters, safe filesystem,
                 patching and the integration record, the fail-open boundary, the registry of
                 integrations (which reads each one's import-free ``declare.py``)

A module may import its own layer and those below it. Within ``users``, each group (one
integration, or maintenance) may import only itself and ``memo`` (the machine-local memos that
integrations share). The test reads source text only (and the registry, for the integrations'
packages and what each declares).
"""

from __future__ import annotations

import ast
import fnmatch
import functools
from pathlib import Path

from kcache import registry

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kcache"

#: (layer, group, patterns relative to the repository root), from the top layer down.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    ("cli", "cli", ("kcache/cli.py", "kcache/commands/*", "kcache/__main__.py")),
    ("prewarm", "prewarm", ("kcache/prewarm/*",)),
    ("facade", "facade", ("kcache/__init__.py", "kcache/integrations.py", "kcache/_autoload.py")),
    ("facade", "facade", ("kcache/descriptors.py",)),  # public re-export of nvfuser's descriptors
    # each registered integration's package (but prewarm, placed above): a group of its own
    *[
        ("users", package.rpartition(".")[2], (package.replace(".", "/") + "/*",))
        for package in registry.REGISTRY.values()
    ],
    ("users", "memo", ("kcache/memo.py",)),
    ("users", "maintenance", ("kcache/maintenance/*", "kcache/bundle.py")),
    ("store", "store", ("kcache/store/*",)),
    (
        "ground",
        "ground",
        (
            "kcache/config.py",
            "kcache/log.py",
            "kcache/redact.py",
            "kcache/remotes.py",
            "kcache/kinds.py",
            "kcache/fingerprint.py",
            "kcache/counters.py",
            "kcache/forksafe.py",
            "kcache/_imports.py",
            "kcache/registry.py",
            "kcache/patch.py",
            "kcache/boundary.py",
            "kcache/userfile.py",  # the one checked open for files a user names
            "kcache/launchenv.py",  # the environment the process was started with
            "kcache/safefs/*",
        ),
    ),
]
ORDER = ["ground", "store", "users", "facade", "prewarm", "cli"]
#: groups every group of ``users`` may import besides itself
SHARED_USERS = {"memo"}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _place(rel: str) -> tuple[str, str] | None:
    for layer, group, patterns in LAYERS:
        for pat in patterns:
            if fnmatch.fnmatch(rel, pat) or (pat.endswith("/*") and rel.startswith(pat[:-1])):
                return layer, group
    return None


def _module_file(dotted: str) -> Path | None:
    """The file of module ``dotted`` inside kcache (a package's ``__init__.py``), or None."""
    parts = dotted.split(".")
    if parts[0] != "kcache":
        return None
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _package_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1])
    return ".".join(parts[:-1])


def imports_of(path: Path) -> set[Path]:
    """Every kcache file that ``path`` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = _package_of(path)
    out: set[Path] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                f = _module_file(a.name)
                if f is not None:
                    out.add(f)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = pkg.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                # ``from X import name``: the submodule X.name when there is one, else X itself.
                f = _module_file(f"{base}.{a.name}") if a.name != "*" else None
                if f is None:
                    f = _module_file(base)
                if f is not None:
                    out.add(f)
    out.discard(path)
    return out


def graph() -> dict[Path, set[Path]]:
    return {p: imports_of(p) for p in sorted(PKG.rglob("*.py"))}


def cycles(g: dict[Path, set[Path]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: Path) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(_rel(w))
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return found


def violations(g: dict[Path, set[Path]]) -> list[str]:
    bad = []
    for src, dsts in g.items():
        ps = _place(_rel(src))
        if ps is None:
            bad.append(f"{_rel(src)}: in no layer (add it to LAYERS)")
            continue
        for dst in sorted(dsts):
            pd = _place(_rel(dst))
            if pd is None:
                continue  # reported as its own file
            ls, gs = ps
            ld, gd = pd
            if ORDER.index(ld) > ORDER.index(ls):
                bad.append(f"{_rel(src)} -> {_rel(dst)}: {ls} imports {ld}, a layer above it")
            elif ld == ls == "users" and gd != gs and gd not in SHARED_USERS:
                bad.append(f"{_rel(src)} -> {_rel(dst)}: {gs} imports {gd}, a peer")
    return bad


def test_the_reader_sees_imports_of_every_form(tmp_path: Path) -> None:
    """The parser itself: relative, absolute, submodule and in-function imports all resolve."""
    g = graph()
    local = PKG / "cli.py"
    assert local in g and g[local], "cli.py imports kcache modules"
    everything = set().union(*g.values())
    assert PKG / "config.py" in everything
    assert PKG / "store" / "__init__.py" in everything or any(p.parent == PKG / "store" for p in everything)


def test_no_import_cycle_between_files() -> None:
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_run_down_the_layers() -> None:
    bad = violations(graph())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


#: The most lines a module of kcache/ may have: past it, it holds more than one job (split it by
#: job, each part with a docstring saying what it owns).
MOST_LINES = 600


def too_long(pkg: Path) -> list[str]:
    return [
        f"{p.relative_to(pkg.parent).as_posix()}: {n} lines"
        for p in sorted(pkg.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MOST_LINES
    ]


def test_no_module_over_600_lines() -> None:
    found = too_long(PKG)
    assert not found, f"modules over {MOST_LINES} lines:\n" + "\n".join(found)


def test_the_length_check_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "kcache").mkdir()
    (tmp_path / "kcache" / "long.py").write_text("x = 1\n" * (MOST_LINES + 1))
    (tmp_path / "kcache" / "short.py").write_text("x = 1\n" * MOST_LINES)
    assert too_long(tmp_path / "kcache") == [f"kcache/long.py: {MOST_LINES + 1} lines"]


# ----------------------------------------------------------------------------- integrations
#: Modules outside an integration's package that may name it: the registry (its one line), and
#: the public re-export of nvFuser's descriptors (a name users import, older than the package).
NAMES_IT = {"kcache/registry.py"}
REEXPORTS = {"kcache/descriptors.py": "kcache.nvfuser"}


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module, docstrings left out (they may name what they explain)."""
    st = path.stat()
    return _strings_of(str(path), st.st_mtime_ns, st.st_size)


@functools.cache
def _strings_of(path: str, mtime_ns: int, size: int) -> list[tuple[int, str]]:
    """:func:`_strings`, each file's text parsed once (it was once per integration: 5 s of CPU a
    test); keyed by the file's path, time and size, so a changed or planted file is read anew."""
    tree = ast.parse(Path(path).read_text(), filename=path)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def _own_names(d: registry.Declared) -> set[str]:
    """What only an integration's package may name: its package and code, its kinds (but one
    named as its library is, such as ``triton``: a library's name is everyone's), its components
    and its parts of the machine's identity (a prefix such as ``env.`` is a mechanism, not a name)."""
    names = {d.package, d.integration.partition(":")[0]}
    names |= {k for k in d.kinds if k not in d.triggers}
    names |= set(d.components) | {w for w in d.words if not w.endswith(".")}
    return names


def integration_names_outside() -> list[str]:
    """Every place outside an integration's package (and the packages that declare they build on
    it) that names what it declares: a string, or (but from the command line) an import of its
    package."""
    g = graph()
    found = []
    for d in registry.declarations():
        own = PKG.joinpath(*d.package.split(".")[1:])
        users = {PKG.joinpath(*o.package.split(".")[1:]) for o in registry.declarations() if d.name in o.uses}
        names = _own_names(d)
        for path in sorted(PKG.rglob("*.py")):
            rel = _rel(path)
            if own in path.parents or rel in NAMES_IT or users & set(path.parents):
                continue
            for line, value in _strings(path):
                if any(value == n or value.startswith((n + ".", n + ":")) for n in names):
                    found.append(f"{rel}:{line}: names {value!r} ({d.name}'s)")
            if REEXPORTS.get(rel) == d.package or (_place(rel) or ("",))[0] == "cli":
                continue  # the command line reaches every feature (its commands run them)
            for dst in g[path]:
                if own in dst.parents:
                    found.append(f"{rel}: imports {_rel(dst)} ({d.name}'s)")
    return found


def test_an_integration_is_named_only_in_its_package_and_the_registry() -> None:
    """A new integration is its package (with its declare.py) and one line of the registry:
    nothing else of kcache (the facade, kinds, fingerprint, identity, maintenance, the store, the
    other integrations) names its kinds, components, identity parts or package."""
    found = integration_names_outside()
    assert not found, "integration knowledge outside its package:\n" + "\n".join(found)


def test_the_search_for_integration_names_sees_a_planted_one(tmp_path: Path, monkeypatch) -> None:
    """The check itself: a module of the ground layer that names Triton's version component, or
    imports the torch integration, is found (in a copy of the package: the tree is not touched)."""
    import shutil
    import sys

    shutil.copytree(PKG, tmp_path / "kcache", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "kcache" / "zz_planted.py").write_text(
        'X = "triton_version"\n\n\ndef f() -> None:\n    from kcache.inductor import entries  # noqa\n'
    )
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "ROOT", tmp_path)
    monkeypatch.setattr(here, "PKG", tmp_path / "kcache")
    found = integration_names_outside()
    assert any("zz_planted.py:1: names 'triton_version'" in f for f in found), found
    assert any("zz_planted.py: imports kcache/inductor/entries.py" in f for f in found), found
