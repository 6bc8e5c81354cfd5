"""The empty store (a missing or empty folder, as maintenance commands read it) is a whole
implementation of the store's Admin face, checked against the face itself: a method added to
``Admin`` that ``EmptyStore`` lacks, or one whose parameters differ, fails here (it failed at
run time before, once: ``kcache verify`` of a missing folder, "no attribute 'index_readonly'")."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Protocol

from kcache import config
from kcache.maintenance import EmptyStore, clear, close_store, open_store, stats, verify
from kcache.maintenance.inspect import find_entries, list_entries
from kcache.store.api import Admin

_NOT_MEMBERS = {"__init__", "__class_getitem__", "__init_subclass__", "__subclasshook__"}


def face_members(face: type) -> dict[str, Any]:
    """Every name a Protocol declares (its own and its bases'): attribute -> None, method or
    property -> the function (a property's getter)."""
    out: dict[str, Any] = {}
    for cls in reversed(face.__mro__):
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        for name in getattr(cls, "__annotations__", {}):
            out.setdefault(name, None)
        for name, v in vars(cls).items():
            if name.startswith("_") or name in _NOT_MEMBERS:
                continue
            if isinstance(v, property):
                out[name] = v.fget
            elif callable(v):
                out[name] = v
    return out


def _params(fn: Any) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def conformance_problems(face: type, obj: object) -> list[str]:
    """What ``obj`` lacks of ``face``: missing names, and methods that do not accept a call the
    face allows (a parameter missing, of another kind, or required where the face has a default)."""
    problems = []
    for name, declared in face_members(face).items():
        if not hasattr(obj, name):
            problems.append(f"{name}: missing")
            continue
        if declared is None:
            continue  # an attribute: present is all it takes
        if isinstance(inspect.getattr_static(face, name), property):
            if callable(getattr(obj, name)):
                problems.append(f"{name}: a method, the face has a property")
            continue
        impl = getattr(obj, name)
        if not callable(impl):
            problems.append(f"{name}: not callable")
            continue
        mine = {p.name: p for p in _params(impl)}
        wanted = _params(declared)
        for p in wanted:
            q = mine.pop(p.name, None)
            if q is None:
                problems.append(f"{name}: no parameter {p.name!r}")
            elif q.kind != p.kind:
                problems.append(
                    f"{name}: parameter {p.name!r} is {q.kind.description}, not {p.kind.description}"
                )
            elif p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
                problems.append(f"{name}: parameter {p.name!r} has no default")
        for q in mine.values():
            if q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
                problems.append(f"{name}: parameter {q.name!r} is required, the face has none")
    return problems


def _empty(tmp_path: Path) -> EmptyStore:
    return EmptyStore(config.load(env={}, dir=str(tmp_path / "none")))


def test_the_empty_store_implements_every_name_of_the_admin_face(tmp_path: Path) -> None:
    assert conformance_problems(Admin, _empty(tmp_path)) == []


def test_the_check_fails_when_the_face_grows_and_the_empty_store_does_not(tmp_path: Path) -> None:
    """The check itself: a name added to the face, a parameter added to one of its methods, a
    default dropped from the implementation, each one is reported."""

    class Grown(Admin, Protocol):
        def verify_all(self) -> bool: ...

        def remove(self, ids: list[str], *, index: bool = True, why: str = "") -> int: ...

    class Strict(EmptyStore):
        def clean_tmp(self, min_age: float) -> int:  # type: ignore[override]
            return 0

    assert sorted(conformance_problems(Grown, _empty(tmp_path))) == [
        "remove: no parameter 'why'",
        "verify_all: missing",
    ]
    assert conformance_problems(Admin, Strict(config.load(env={}, dir=str(tmp_path)))) == [
        "clean_tmp: parameter 'min_age' has no default"
    ]


def test_a_missing_folder_opens_as_the_empty_store_and_every_command_reads_it_as_empty(
    tmp_path: Path,
) -> None:
    root = tmp_path / "none"
    s = config.load(env={}, dir=str(root))
    for write in (False, True):
        store = open_store(s, write=write)
        assert isinstance(store, EmptyStore)
        try:
            assert stats(store)["entries"] == 0
            assert verify(store)["ok"]
            assert clear(store, everything=True)["count"] == 0
            assert list_entries(store) == [] and find_entries(store, "ab") == []
            assert store.evict(0) == (0, 0) and store.remove(["0" * 40]) == 0
        finally:
            close_store(store)
    assert not root.exists()


def test_an_empty_folder_reads_as_the_empty_store(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    store = open_store(config.load(env={}, dir=str(tmp_path / "empty")))
    assert isinstance(store, EmptyStore)
    close_store(store)
    assert list((tmp_path / "empty").iterdir()) == []
