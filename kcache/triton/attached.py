"""What the Triton integration was given and found when it attached, read by all its parts (none
of which imports the package, which installs them):

- :data:`cache`: the getter of the active cache that :func:`kcache.triton.INTEGRATION.attach`
  was given (Triton builds cache managers with a key only: they read the cache here);
- :func:`serves_folder`: whether the Triton cache folder in use now is kcache's;
- an installation that had to wait until the manager module was loaded (:func:`finish_pending`);
- :data:`patches`: every attribute of Triton's that kcache replaced, undone at once on uninstall.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..launchenv import folder as folder  # a folder setting as an absolute path
from ..launchenv import fresh_scope_folder, started_with
from ..patch import CacheSlot, Patches

if TYPE_CHECKING:
    from ..store.api import Cache

cache: CacheSlot[Cache] = CacheSlot()
patches = Patches("triton")

_UNSET = object()
_folder_at_install: Any = _UNSET  # Triton's cache folder when kcache installed (None: not known)
_pending: Callable[[], None] | None = None


def set_folder(path: str | None) -> None:
    global _folder_at_install
    _folder_at_install = path


def forget_folder() -> None:
    global _folder_at_install
    _folder_at_install = _UNSET


def serves_folder() -> bool:
    """kcache serves the Triton cache folder in use now (see kcache/triton/__init__.py): the one
    this process was started with, the one Triton had when kcache attached, or Inductor's own
    pick; not one the program chose while running, nor the ``<folder>/triton`` of torch's
    fresh-cache scopes."""
    try:
        from triton import knobs

        current = folder(knobs.cache.dir)
    except (ImportError, AttributeError):  # a Triton whose knobs cannot say: kcache's
        return True
    if current is None:
        return True
    if current == launch_folder():
        scope = fresh_scope_folder()
        # Started inside a fresh-cache scope of the process that started this one (the variable
        # that process keeps while the scope is open names this folder's Inductor folder): the
        # scope's folder, not kcache's (review M7).
        if scope is not None and current == os.path.join(scope, "triton"):
            return False
        # Else named by whoever started the process (TRITON_CACHE_DIR=<Inductor's folder>/triton
        # in a launcher, as tools/gpu_compile_check.py does): the program's setting, not a scope
        # of torch's, though it has the same shape (a served process built cuda_utils with gcc
        # and compiled every kernel Inductor's folder did not hold: issue 33).
        return True
    inductor = folder(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    if inductor is not None:
        if current == os.path.join(inductor, "triton"):
            return False  # torch's fresh_cache(): a new, empty Triton folder
        rest = current[len(inductor) :] if current.startswith(inductor + os.sep) else ""
        if re.fullmatch(r"/triton/[0-9]+", rest.replace(os.sep, "/")):
            return True  # Inductor's own: <TORCHINDUCTOR_CACHE_DIR>/triton/<device>
    return _folder_at_install is _UNSET or current == _folder_at_install


def launch_folder() -> str | None:
    """``TRITON_CACHE_DIR`` as this process was started with it (:mod:`kcache.launchenv`; what
    the program set since, torch's ``fresh_cache()`` among it, is not). None where it was unset
    or cannot be known."""
    return folder(started_with("TRITON_CACHE_DIR"))


def wait_for_manager(finish: Callable[[], None]) -> None:
    """The installation found kcache.triton.manager half-built (it was imported before triton,
    and its own ``import triton`` ran the hook): ``finish`` runs at the manager module's end."""
    global _pending
    _pending = finish


def drop_pending() -> None:
    global _pending
    _pending = None


def finish_pending() -> None:
    global _pending
    finish, _pending = _pending, None
    if finish is not None:
        finish()
