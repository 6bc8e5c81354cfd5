"""Remember Inductor's CPU vector-ISA probes across processes: most of a CPU warm start.

Before its first C++ kernel in a process, Inductor checks which SIMD instruction sets work here
(``torch._inductor.cpu_vec_isa.valid_vec_isa_list``): for each one the CPU claims, it builds a
tiny shared object with that ISA's flags (kept in Inductor's folder) and starts a new Python
that dlopens it. That is one interpreter start per ISA in every process, warm or cold: 2.0 s of
a 2.6 s warm start of the small encoder on a 2-core box (torch 2.13), and more on torch 2.11,
whose child imports torch.

kcache remembers each child's exit status (machine-local kind ``triton-meta``, like the tool
versions of :mod:`kcache.triton.toolmemo`), keyed by this boot of this machine, the sha256 of
the shared object, the identity of the interpreter and of torch's CPU library, the child's
``LD_LIBRARY_PATH`` and the probe's script: the same bytes, dlopened by the same interpreter
with the same libraries on the same running machine, give the same answer. Like the other
machine-local answers it is never exported, imported or shared, and never read from a store
that failed its ownership checks.

Only the probe is answered: a call to ``subprocess.run`` or ``subprocess.check_call`` made from
``torch._inductor.cpu_vec_isa`` whose arguments are ``[python, "-c", script]`` with ``script``
torch's own probe template around an existing file. Everything else goes to :mod:`subprocess`
untouched, and a probe that timed out or was killed by a signal is not remembered.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import kinds as _kinds
from .. import memo as _memo
from ..boundary import guarded
from ..log import logger
from .attached import cache as active_cache

if TYPE_CHECKING:
    from ..store.api import Cache

KIND = _kinds.TRITON_META
MODULE = "torch._inductor.cpu_vec_isa"
MEMBER = "returncode"
#: The fail-open boundary's topic (kcache/boundary.py): torch's probe runs as without kcache.
TOPIC, WHAT = "inductor-vec-isa", "kcache's memo of Inductor's CPU vector-ISA probes"


def _identity(path: str) -> str:
    try:
        return _memo.identity(path)
    except OSError:
        return "none"


def _probed_library(mod: Any, args: Any) -> str | None:
    """The shared object ``args`` dlopens, when ``args`` is Inductor's ISA probe; else None."""
    template = getattr(getattr(mod, "VecISA", None), "_avx_py_load", None)
    if (
        not isinstance(template, str)
        or template.count("__lib_path__") != 1
        or not isinstance(args, (list, tuple))
        or len(args) != 3
        or args[1] != "-c"
        or not all(isinstance(a, str) for a in args)
    ):
        return None
    head, tail = template.split("__lib_path__")
    script = args[2]
    if len(script) <= len(head) + len(tail) or not script.startswith(head) or not script.endswith(tail):
        return None
    path = script[len(head) : len(script) - len(tail)]
    return path if os.path.isfile(path) else None


def memo_key(lib: str, python: str, env: Any, template: str) -> str:
    torch = sys.modules.get("torch")
    torch_lib = os.path.join(os.path.dirname(getattr(torch, "__file__", "") or ""), "lib", "libtorch_cpu.so")
    ld_path = (env if isinstance(env, dict) else os.environ).get("LD_LIBRARY_PATH", "")
    script = hashlib.sha256(template.encode()).hexdigest()[:16]
    return (
        f"vec-isa-probe/v1|boot={_memo.boot_id()}|so={_memo.sha256_file(lib)}|python={_identity(python)}"
        f"|torch={getattr(torch, '__version__', '?')}|{_identity(torch_lib)}|ld={ld_path}|script={script}"
    )


class _ProbeSubprocess:
    """Stands in for the ``subprocess`` module inside ``torch._inductor.cpu_vec_isa``."""

    def __init__(self, real: Any, mod: Any) -> None:
        self._real, self._mod = real, mod

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def run(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        return self._answer(self._real.run, bool(kwargs.get("check")), args, rest, kwargs)

    def check_call(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        return self._answer(self._real.check_call, True, args, rest, kwargs)

    def _answer(self, call: Any, check: bool, args: Any, rest: tuple, kwargs: dict) -> Any:
        found = None
        with guarded(TOPIC, WHAT):  # the edge (torch's ISA probe): a bug, reported; torch probes
            try:
                found = self._recalled(args, rest, kwargs)
            except OSError as e:  # the library or the memo's entry changed under us: torch probes
                logger.debug("torch.compile: ISA probe memo not read: %s", e)
        if found is None:
            return call(args, *rest, **kwargs)
        store, key, code = found
        if code is not None:
            if code and check:
                raise self._real.CalledProcessError(code, args)
            return code if call is self._real.check_call else self._real.CompletedProcess(args, code)
        t0 = time.perf_counter()
        try:
            result = call(args, *rest, **kwargs)
        except self._real.CalledProcessError as e:
            self._remember(store, key, e.returncode, time.perf_counter() - t0)
            raise
        code = result if isinstance(result, int) else getattr(result, "returncode", None)
        self._remember(store, key, code, time.perf_counter() - t0)
        return result

    def _recalled(self, args: Any, rest: tuple, kwargs: dict) -> tuple[Any, str, int | None] | None:
        """(store, memo key, the remembered exit status or None) for torch's probe with a store
        to remember it in; None for any other call (it goes to :mod:`subprocess` untouched)."""
        lib = None if rest else _probed_library(self._mod, args)
        store = _memo.usable(active_cache()) if lib else None
        if store is None or lib is None:
            return None
        key = memo_key(lib, args[0], kwargs.get("env"), self._mod.VecISA._avx_py_load)
        value = _memo.recall(store, key, MEMBER, _is_code)
        return store, key, int(value) if value is not None else None

    @staticmethod
    def _remember(store: Cache, key: str, code: Any, seconds: float) -> None:
        if not isinstance(code, int) or code < 0:  # killed by a signal: maybe by something passing
            return
        # The store skips what it cannot write: anything raised here is a bug (raised when strict).
        with guarded(TOPIC, WHAT):
            _memo.keep(store, key, MEMBER, str(code).encode(), {"probe": "cpu-vec-isa"}, seconds)


def _is_code(value: bytes) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def on_import(mod: Any) -> None:
    from .attached import patches

    if getattr(mod, "subprocess", None) is subprocess:
        patches.wrap(mod, "subprocess", lambda real: _ProbeSubprocess(real, mod))
