"""A fork while another thread holds one of kcache's module-level locks: the child goes on.

``os.fork()`` copies only the forking thread; a lock another thread held stays held in the child,
whose next use of it waits for ever (a DataLoader worker or a compile pool forked mid-lookup
would hang in kcache). Each lock below is held by a second thread across a real fork; the child
must take it within seconds and, for the logger's, warn. A static check keeps new module-level
locks on the same footing.
"""

from __future__ import annotations

import ast
import importlib
import os
import signal
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (module, global): every module-level lock of kcache's that a forked child may take.
MODULE_LOCKS = [
    ("kcache.log", "_lock"),
    ("kcache.fingerprint", "_lock"),
    ("kcache.counters", "_budget_lock"),
    ("kcache.store.quarantine", "_lock"),
    ("kcache.triton.groupcheck", "_lock"),
    ("kcache.triton.manager", "_scratch_lock"),
    ("kcache.inductor.graphs", "_lock"),
    ("kcache.inductor.workers", "_lock"),
    ("kcache.inductor.policy", "_lock"),
    ("kcache.inductor.hostflags", "_lock"),
    ("kcache.inductor.pch", "_lock"),
    ("kcache.inductor.restarts", "_lock"),
    ("kcache.memo", "_open_lock"),
    ("kcache.nvfuser.kerneldb.hooks", "_lock"),
    ("kcache.prewarm.stub_libcuda", "_lock"),
    ("kcache.triton.warmup", "_gate"),
    ("kcache.store.leases", "reporting"),
]
#: ... and those renewed by their module's own handler, tested the same way
OWN_LOCKS = [("kcache", "_lock"), ("kcache.store.forks", "_SERIAL")]
#: Module-level locks renewed by their module's own fork handler (with more state beside them).
OWN_HANDLERS = {
    ("kcache/store/forks.py", "_SERIAL"),
    ("kcache/__init__.py", "_lock"),  # the facade: nothing more imported at start-up
}


def _fork_while_held(module: str, name: str, in_child) -> int:
    """Hold ``module.name`` in a second thread, fork, run ``in_child`` in the child (which must
    return within 20 s); the child's exit status."""
    mod = importlib.import_module(module)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with getattr(mod, name):
            held.set()
            release.wait(60)

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 3
            try:
                signal.alarm(20)  # a hang ends the child, as a failure
                code = 0 if in_child(mod) else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join(10)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize(
    ("module", "name"), MODULE_LOCKS + OWN_LOCKS, ids=[f"{m}.{n}" for m, n in MODULE_LOCKS + OWN_LOCKS]
)
def test_a_child_forked_while_the_lock_is_held_can_take_it(module: str, name: str) -> None:
    def take(mod) -> bool:
        lock = getattr(mod, name)
        if not lock.acquire(timeout=5):
            return False
        lock.release()
        return True

    assert _fork_while_held(module, name, take) == 0


def test_a_child_forked_while_another_thread_warns_can_warn() -> None:
    def warn(mod) -> bool:
        mod.warn_once("forksafe-test", "a warning from a forked child")
        return True

    assert _fork_while_held("kcache.log", "_lock", warn) == 0


def _module_level_locks(path: Path) -> list[str]:
    """Names assigned ``threading.Lock()`` / ``threading.RLock()`` at a module's top level."""
    tree = ast.parse(path.read_text())
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Attribute) and f.attr in ("Lock", "RLock"):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out += [t.id for t in targets if isinstance(t, ast.Name)]
    return out


def test_every_module_level_lock_is_renewed_in_a_forked_child() -> None:
    """A module-level lock is made by ``forksafe.module_lock`` (or renewed by its module's own
    fork handler, listed above), and the ones made so are all tested above."""
    plain = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in sorted((ROOT / "kcache").rglob("*.py"))
        for n in _module_level_locks(p)
        if (str(p.relative_to(ROOT)), n) not in OWN_HANDLERS
    ]
    assert not plain, f"module-level locks a forked child may find held (use forksafe.module_lock): {plain}"
    for module, _name in MODULE_LOCKS:
        importlib.import_module(module)
    from kcache import forksafe

    made = {(m, n) for m, n, _f in forksafe._LOCKS}
    assert made <= set(MODULE_LOCKS), f"not tested above: {sorted(made - set(MODULE_LOCKS))}"
