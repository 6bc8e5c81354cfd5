"""kcache.patch.Patches: the one way kcache replaces another library's attributes and lets go."""

from __future__ import annotations

from typing import Any

from kcache.patch import MARKER, Patches, is_ours, original


class Lib:
    @staticmethod
    def clear() -> str:
        return "static"

    @classmethod
    def make(cls) -> str:
        return f"class {cls.__name__}"

    def run(self) -> str:
        return "method"


def test_raw_wrap_keeps_a_classs_staticmethod_and_classmethod_and_puts_the_same_objects_back() -> None:
    raw_clear, raw_make = Lib.__dict__["clear"], Lib.__dict__["make"]
    p = Patches("test")
    own_clear = Lib.clear
    p.wrap(Lib, "clear", lambda raw: staticmethod(lambda: "ours " + own_clear()), raw=True)
    p.wrap(Lib, "make", lambda raw: classmethod(lambda cls: "ours " + raw.__func__(cls)), raw=True)
    assert Lib.clear() == Lib().clear() == "ours static"
    assert Lib.make() == Lib().make() == "ours class Lib"
    assert is_ours(Lib.clear) and is_ours(Lib.make) and original(Lib.clear) is own_clear
    # a second wrap finds kcache's in place: nothing wrapped twice
    p.wrap(Lib, "clear", lambda raw: staticmethod(lambda: "twice"), raw=True)
    assert Lib.clear() == "ours static" and len(p) == 2
    p.undo()
    assert Lib.__dict__["clear"] is raw_clear and Lib.__dict__["make"] is raw_make
    assert Lib().clear() == "static" and not is_ours(Lib.clear) and not hasattr(raw_clear, MARKER)


def test_raw_wrap_of_an_inherited_attribute_deletes_it_on_undo() -> None:
    obj = Lib()
    seen: list[Any] = []
    p = Patches("test")
    p.wrap(obj, "run", lambda bound: seen.append(bound) or (lambda: "ours " + bound()), raw=True)
    assert obj.run() == "ours method" and seen[0]() == "method" and "run" in vars(obj)
    p.undo()
    assert "run" not in vars(obj) and obj.run() == "method"


def test_undo_leaves_a_later_wrapper_of_someone_else() -> None:
    class Owner:
        @staticmethod
        def f() -> int:
            return 1

    p = Patches("test")
    p.wrap(Owner, "f", lambda raw: staticmethod(lambda: 2), raw=True)
    ours = Owner.__dict__["f"]
    later = staticmethod(lambda: ours.__func__() + 1)
    Owner.f = later
    p.undo()
    assert Owner.__dict__["f"] is later and Owner.f() == 3


def test_adopt_counts_in_a_module_that_took_the_replacement_by_name() -> None:
    import types

    home, taker = types.ModuleType("home"), types.ModuleType("taker")

    def own() -> str:
        return "own"

    home.f = own
    p = Patches("test")
    ours = p.wrap(home, "f", lambda orig: lambda: "ours " + orig())
    taker.f = home.f  # ``from home import f`` after kcache wrapped it
    p.adopt(taker, "f", own)
    p.adopt(taker, "f", own)  # once only
    p.adopt(home, "f", own)  # held already
    assert taker.f is ours and len(p) == 2
    p.undo()
    assert home.f is own and taker.f is own
