"""The environment this process was started with, and torch's fresh-cache scopes it was started in.

Linux keeps the environment a process was started with in ``/proc/self/environ``; ``os.environ``
has what the program set since (torch's ``fresh_cache()`` among it). A ``TRITON_CACHE_DIR``
given at launch is the program's setting (``kcache/triton/attached.py``), even in the shape of a
fresh scope's folder, ``<TORCHINDUCTOR_CACHE_DIR>/triton``: a launcher gives its processes that
shape (``tools/gpu_compile_check.py``).

A process started *inside* a ``fresh_cache()`` scope inherits the scope's folders in the same
shape, and the scope asks for a cold compile: nothing from kcache's store. The two cannot be told
apart by the folders, so the process that has the scope says so: while a scope is open, kcache
(``kcache/inductor/policy.py``) keeps :data:`FRESH_SCOPE` = the scope's Inductor folder in
``os.environ``, and a process started with that variable naming its own
``TORCHINDUCTOR_CACHE_DIR`` is in the scope (:func:`fresh_scope_folder`). A launcher that gives
a folder of its own names another folder, or drops ``KCACHE_*`` (the benchmark does).
"""

from __future__ import annotations

import os

#: Set by kcache while torch's ``fresh_cache()`` scope is open: the scope's Inductor folder.
FRESH_SCOPE = "KCACHE_FRESH_SCOPE"
_NAMES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", FRESH_SCOPE)

_started: list[dict[str, str]] = []


def folder(path: object) -> str | None:
    """A folder setting as an absolute path (None where unset or empty)."""
    if not isinstance(path, str) or not path:
        return None
    return os.path.abspath(os.path.expanduser(path))


def started_with(name: str) -> str | None:
    """The value of ``name`` (one of ``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` and
    :data:`FRESH_SCOPE`) in the environment this process was started with: None where it was
    unset or cannot be known (not Linux)."""
    if not _started:
        found: dict[str, str] = {}
        try:
            with open("/proc/self/environ", "rb") as f:
                for item in f.read().split(b"\0"):
                    key, _, value = item.partition(b"=")
                    if os.fsdecode(key) in _NAMES:
                        found[os.fsdecode(key)] = os.fsdecode(value)
        except OSError:  # not Linux: nothing is known of the launch
            found = {}
        _started.append(found)
    return _started[0].get(name)


def fresh_scope_folder() -> str | None:
    """The Inductor folder this process was started in, where that is the folder of a fresh-cache
    scope open in the process that started it (see the module's text); else None."""
    inductor = folder(started_with("TORCHINDUCTOR_CACHE_DIR"))
    if inductor is not None and inductor == folder(started_with(FRESH_SCOPE)):
        return inductor
    return None
