"""Machine-local memos: answers about this machine that are slow to get and kept in the store.

Triton's libtriton digest, the CUDA tools' ``--version``, libcuda's folders, Inductor's vector-ISA
probes and what ``-march=native`` means here: each is an answer about one file or tool on this
machine, kept as a ``triton-meta`` entry keyed by what identifies that file (:func:`identity`)
and by this boot of this machine (:func:`boot_id`). The integrations that keep them share this
module (none imports another).

The rules every memo follows:
- machine-local: the kind is never exported, imported or shared (:mod:`kcache.kinds`), and the
  key names this boot, so an entry that reached the store any other way is never looked up;
- never read from or written to a store that failed its ownership checks (:func:`usable`):
  another user could have planted the answer;
- a remembered answer is checked before use (``valid``) and its making time is credited as
  saved (:func:`recall`), never counted as a hit.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import kinds as _kinds
from .forksafe import module_lock

if TYPE_CHECKING:
    from .store.api import Cache
    from .store.hit import Hit

KIND = _kinds.TRITON_META

_boot: str | None = None


def boot_id() -> str:
    """This boot of this machine: Linux's random per-boot id ("none" where there is none).

    Part of every machine-local memo key: the binary's path, inode, size and times are the same
    in every container of one image, and a bundle made in one could carry a wrong answer under
    exactly the key another looks up (older kcache versions imported such entries; a plausible
    wrong ``ptxas --version`` breaks every compile). Nothing outside this machine knows this id
    (local users can read it: a store they can write is not asked at all, see :func:`usable`),
    and it changes at every boot: one ``--version`` call (and one libtriton hash) per boot."""
    global _boot
    if _boot is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                _boot = f.read(64).strip().decode("ascii", "replace") or "none"
        except OSError:
            _boot = "none"
    return _boot


def identity(path: str) -> str:
    """What identifies the file at ``path``: real path, inode, size, mtime and ctime in ns."""
    st = os.stat(path)
    return f"{os.path.realpath(path)}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}|ctime={st.st_ctime_ns}"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def trusted(cache: Cache) -> bool:
    """Whether machine-local answers may be read from (and written to) ``cache``: not from a
    store that failed its ownership checks (another user could plant them)."""
    return cache.trust_host_code


def usable(cache: Cache | None) -> Cache | None:
    """``cache`` if memos may use it (see :func:`trusted`), else None."""
    return cache if cache is not None and trusted(cache) else None


def credit(cache: Cache, hit: Hit) -> None:
    """A remembered answer was used: the time it took to get when it was made is saved
    ("saved" in ``kcache stats``; memos are not counted as hits, their time is, and their uses
    as ``uses``, so that stats can say what the saved time of a kind with no hits came from)."""
    from . import counters
    from .boundary import guarded

    # A statistic, in memory: nothing is expected to fail. A bug is reported (raised under
    # KCACHE_STRICT=1), and the answer is used all the same.
    with guarded("memo-credit", "kcache's credit of a remembered answer", then="not counted"):
        saved = counters.credit(hit.record.kind, hit.record.compile_s)
        cache.count(hit.record.kind, saved_s=saved, uses=1)


def recall(cache: Cache, key: str, member: str, valid: Callable[[bytes], bool] | None = None) -> bytes | None:
    """The remembered ``member`` of ``key`` if there is one and ``valid`` accepts it (credited as
    saved), else None. Not counted as a hit or a miss."""
    hit = cache.get(KIND, key, count=False)
    if hit is None:
        return None
    value = hit.read(member)
    if valid is not None and not valid(value):
        return None
    credit(cache, hit)
    return value


def keep(
    cache: Cache,
    key: str,
    member: str,
    value: bytes,
    summary: dict[str, Any],
    seconds: float,
    *,
    replace: bool = False,
) -> None:
    """Remember ``value`` as ``member`` of ``key`` (it took ``seconds`` to get). ``replace``: over
    an answer already kept under ``key`` (a memo whose answer is checked against what it came
    from, not keyed by it: a stale one would otherwise stay, entries being first writer wins)."""
    if replace:
        cache.replace(KIND, key, {member: value}, summary=summary, compile_s=seconds)
    else:
        cache.put(KIND, key, {member: value}, summary=summary, compile_s=seconds)


def remember(
    cache: Cache | None,
    key: str,
    member: str,
    compute: Callable[[], bytes],
    *,
    summary: dict[str, Any],
    valid: Callable[[bytes], bool] | None = None,
) -> tuple[bytes, bool]:
    """(the answer, whether it came from the memo): the remembered one if valid, else
    ``compute()``, kept for next time. Without a usable ``cache``, ``compute()`` alone."""
    cache = usable(cache)
    if cache is not None:
        value = recall(cache, key, member, valid)
        if value is not None:
            return value, True
    t0 = time.perf_counter()
    value = compute()
    if cache is not None:
        keep(cache, key, member, value, summary, time.perf_counter() - t0)
    return value, False


# Re-entrant: a library's own code run while its module's open() is replaced (further up on this
# thread: an import that asks for the key again) runs under it too (:func:`open_restored`).
_open_lock = module_lock(__name__, "_open_lock", reentrant=True)  # a forked child gets a free one
# id(module globals) -> (those globals, whether they had their own ``open``, that one, the memo's):
# every module whose ``open`` is replaced now (changed under _open_lock only).
_replaced: dict[int, tuple[dict[str, Any], bool, Any, Any]] = {}


def _put_in(module_globals: dict[str, Any], open_: Callable[..., Any]) -> None:
    had, old = "open" in module_globals, module_globals.get("open")
    _replaced[id(module_globals)] = (module_globals, had, old, open_)
    module_globals["open"] = open_


def _take_out(module_globals: dict[str, Any]) -> Callable[..., Any] | None:
    """The module's own ``open`` back; the replacement taken out (None: there was none)."""
    record = _replaced.pop(id(module_globals), None)
    if record is None:
        return None
    g, had, old, new = record
    if g.get("open") is new:  # (if something else was put there since, it stays)
        if had:
            g["open"] = old
        else:
            g.pop("open", None)
    return new


@contextlib.contextmanager
def open_replaced(module_globals: dict[str, Any], open_: Callable[..., Any]) -> Iterator[None]:
    """A library's own hashing function run with its ``open`` replaced: ``open_`` is the name
    ``open`` in ``module_globals`` (the function's module) for the duration, then the module is
    as it was. How a memo learns (or stands in for) the files a library's key reads, while the
    library's own code computes the key. One at a time (the module's globals are shared): every
    other run of that library's code takes the same lock (:func:`open_restored`), and a child
    forked meanwhile gets the module's own ``open`` back (the fork handler below)."""
    with _open_lock:
        _put_in(module_globals, open_)
        try:
            yield
        finally:
            _take_out(module_globals)


@contextlib.contextmanager
def open_restored(module_globals: dict[str, Any]) -> Iterator[None]:
    """The library's own ``open`` in ``module_globals`` for the duration: where a memo runs the
    library's own code unchanged (its fallback) while a replacement may be in, put there by
    another thread (waited for: the lock) or by this one further up (a re-entered call: taken out
    for the duration, then put back). Without this, that code would read the memo's stand-in."""
    with _open_lock:
        replacement = _take_out(module_globals)
        try:
            yield
        finally:
            if replacement is not None:
                _put_in(module_globals, replacement)


def _restore_in_child() -> None:
    # A fork while a replacement was in (another thread's, mid-key): the child would keep it for
    # good (nothing in the child takes it out), and the library's own code would read the stand-in.
    for g, *_ in list(_replaced.values()):
        _take_out(g)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restore_in_child)
