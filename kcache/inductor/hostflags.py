"""What a host-dependent compiler flag means on this machine (``-march=native`` and the like).

torch builds Inductor's CPU kernels with ``-march=native``: the same command line makes AVX-512
code on one CPU and AVX2 code on another. A key that holds the literal flag would hand a kernel
built on an AVX-512 machine to one without it (a bundle, a shared tier, a store on a shared
folder): SIGILL. So when a command holds such a flag, the key holds what the compiler resolves
it to here: ``<compiler> <flags> -Q --help=target`` (GCC: every target option and its state,
``-march=`` resolved to this CPU's name), else ``<compiler> <flags> -### -x c++ -c /dev/null``
(Clang: the driver's ``-target-cpu`` and ``-target-feature`` list), digested.

Asking costs one compiler run (about 0.1 s), so the answer is remembered like the tool versions
of :mod:`kcache.triton.toolmemo` (see :mod:`kcache.memo`): machine-local (kind ``triton-meta``:
never exported, imported or shared), keyed by this boot, the compiler's identity (path, inode, size, times), the flags and
this CPU's own description (``/proc/cpuinfo``: a virtual machine moved to another host asks
again), and never read from a store that failed its ownership checks. It is also kept in memory
for the life of the process.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from typing import Any

from .. import kinds as _kinds
from .. import memo as _memo
from ..boundary import guarded
from ..forksafe import module_lock
from ..log import logger
from .attached import cache as active_cache

KIND = _kinds.TRITON_META
MEMBER = "target"
#: Flags whose meaning is this host's CPU.
HOST_FLAG = re.compile(r"-m(?:arch|tune|cpu)=native")
TIMEOUT_S = 30.0
#: The fail-open boundary's topic (kcache/boundary.py): CppBuilder.build asks through kcache's
#: wrapper, and a bug of this memo's must not cost the kernel its key.
TOPIC, WHAT = "inductor-host-target", "kcache's memo of what -march=native means here"

_lock = module_lock(__name__, "_lock")
_answers: dict[tuple[str, str], str | None] = {}


def host_flags(cmd: str) -> list[str]:
    """The host-dependent flags of a compiler command line, in order, without repeats."""
    return list(dict.fromkeys(HOST_FLAG.findall(cmd)))


def _cpu_description() -> str:
    """A digest of what this CPU says it is (model and feature flags of the first processor)."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return "unknown"
    first = text.split(b"\n\n", 1)[0]
    keep = [ln for ln in first.splitlines() if ln.split(b":", 1)[0].strip() in (b"model name", b"flags", b"vendor_id", b"cpu family", b"model", b"Features", b"CPU part")]  # fmt: skip
    return hashlib.sha256(b"\n".join(keep)).hexdigest()[:16]


def _ask(compiler: str, flags: list[str]) -> str | None:
    """The compiler's resolved target for ``flags`` here, digested; None when it cannot say."""
    for extra in (["-Q", "--help=target"], ["-###", "-x", "c++", "-c", os.devnull]):
        try:
            r = subprocess.run(
                [compiler, *flags, *extra],
                capture_output=True,
                timeout=TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as e:
            logger.debug("torch.compile: %s cannot resolve %s: %s", compiler, flags, e)
            return None
        text = r.stdout if extra[0] == "-Q" else r.stderr
        if r.returncode == 0 and _plausible(extra[0], text):
            if extra[0] == "-###":  # keep only what names the target, not the temporary paths
                text = b"\n".join(re.findall(rb'"-target-(?:cpu|feature)" "[^"]*"', text))
            return f"{'gcc' if extra[0] == '-Q' else 'clang'}:{hashlib.sha256(text).hexdigest()[:32]}"
    return None


def _plausible(how: str, text: bytes) -> bool:
    if how == "-Q":
        return b"-march=" in text and len(text) < (1 << 20)
    return b'"-target-cpu"' in text


def _identity(path: str) -> str:
    return _memo.identity(path)


def memo_key(compiler_path: str, flags: list[str]) -> str:
    return (
        f"host-target/v1|boot={_memo.boot_id()}|cpu={_cpu_description()}|{_identity(compiler_path)}"
        f"|flags={' '.join(flags)}"
    )


def compiler_of(cmd: str) -> str | None:
    """The first word of a command line (the compiler), as the shell would split it; None when
    there is none. Only the first word is split: a C++ kernel's command is a thousand characters,
    and this is asked for each kernel looked up."""
    head = cmd.lstrip().split(None, 1)
    if not head:
        return None
    if not any(c in head[0] for c in "'\"\\"):
        return head[0]
    try:
        return shlex.split(cmd)[0]
    except (ValueError, IndexError):
        return None


def resolve(cmd: str) -> str | None:
    """What the host-dependent flags of ``cmd`` mean here (a short digest), "" when it has none,
    None when the compiler cannot tell (then nothing may be cached for this command)."""
    flags = host_flags(cmd)
    if not flags:
        return ""
    first = compiler_of(cmd)
    if first is None:
        return None
    compiler = shutil.which(first)
    if compiler is None:
        return None
    try:
        ident = _identity(compiler)
    except OSError:
        return None
    mem = (ident, " ".join(flags))
    with _lock:
        if mem in _answers:
            return _answers[mem]
    answer = _remembered(compiler, flags)
    if answer is None:
        t0 = time.perf_counter()
        answer = _ask(compiler, flags)
        if answer is not None:
            _remember(compiler, flags, answer, time.perf_counter() - t0)
    with _lock:
        _answers[mem] = answer
    return answer


def _memo_store() -> Any:
    return _memo.usable(active_cache())


def _remembered(compiler: str, flags: list[str]) -> str | None:
    store = _memo_store()
    if store is None:
        return None
    answer = None
    with guarded(TOPIC, WHAT):  # not expected: a bug of the memo's, reported (raised when strict)
        try:
            answer = _memo.recall(store, memo_key(compiler, flags), MEMBER, _answer_ok)
        except OSError as e:  # the compiler or the memo's entry changed under us: it is asked
            logger.debug("torch.compile: host target memo not read: %s", e)
    return answer.decode("ascii") if answer is not None else None


def _answer_ok(value: bytes) -> bool:
    return re.fullmatch(rb"(gcc|clang):[0-9a-f]{32}", value) is not None


def _remember(compiler: str, flags: list[str], answer: str, seconds: float) -> None:
    store = _memo_store()
    if store is None:
        return
    with guarded(TOPIC, WHAT):  # not expected (the store skips what it cannot write): a bug, reported
        try:
            _memo.keep(
                store, memo_key(compiler, flags), MEMBER, answer.encode(), {"probe": "host-target"}, seconds
            )
        except OSError as e:  # the compiler changed under us: an answer not kept is asked again
            logger.debug("torch.compile: host target not remembered: %s", e)


def forget_answers() -> None:
    """Drop what this process remembers in memory (tests; kcache.disable())."""
    with _lock:
        _answers.clear()
