"""``KCACHE_RECORD=FILE``: a running program appends the Triton kernels it compiles to a spec.

Each kernel the program's JIT prepares (compiled, or loaded from a cache: both go through
``JITFunction._do_compile``) becomes one ``[[triton]]`` entry: the import path of the kernel (the
autotuner or heuristics object when the kernel is wrapped, with the wrapper's own arguments), the
arguments (tensors by dtype, shape, strides when not contiguous and alignment when not 16 bytes;
scalars by value; constexprs), the compile options, the grid when it can be written down, and
Triton's cache-invalidating environment. Never tensor contents, never a file path.

How: Triton's ``knobs.runtime.jit_cache_hook`` (called before each compile, inside the JIT's
``run``, whose bound arguments it reads from the stack) and ``jit_post_compile_hook`` (called
after it succeeded). Both are single slots: kcache chains whatever the program set, before or
after kcache (the ``knobs.runtime`` object gets a subclass whose two properties call the
program's hooks after kcache's, and return what they return). The post-compile hook also fires
on cache hits; entries are deduplicated (per process and in the file).

Concurrent processes append under a lock (``flock`` on FILE itself); each entry is a complete
TOML table (written by tomli_w: :func:`entry_toml`) written in one append, so the file is a valid
spec after every append. A kernel that cannot be imported by name in another process (defined in
``__main__``, inside a function, or in a module loaded from a path) is written as a comment saying
so, and so is one with a string that TOML cannot hold (a lone surrogate: :func:`toml_ready`);
every other string reads back exactly.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType, ModuleType
from typing import Any

from .._imports import forget, when_imported
from ..log import logger, warn_once
from .env import WORKER_ENV, current_invalidating_env

HEADER = (
    "# kcache prewarm spec, appended to by programs run with KCACHE_RECORD=<this file>.\n"
    "# Replay: kcache prewarm <this file> [--target cuda:90]. Tensor contents are never recorded.\n"
    "version = 1\n"
)
_EXCLUDED_OPTIONS = {"debug", "instrumentation_mode", "fpsan_homomorphic_casts"}
_SURROGATE = re.compile("[\ud800-\udfff]")


class Unrecordable(Exception):
    pass


# ------------------------------------------------------------------------------ TOML writing
# tomli_w writes the TOML (values, keys, string escapes); what is here is what it does not do for
# the recorder: values are made plain first (tomli_w writes str(v): an Enum mixed with int, a
# float subclass or IntEnum on Python 3.10 would not read back), a lone surrogate is refused with
# its reason (tomli_w writes it, and the file could not be UTF-8), non-printable characters are
# escaped (tomli_w escapes only ASCII control characters), and comments (tomli_w writes none).
# Every value written reads back equal with tomllib (tests/test_prewarm_spec.py checks it on
# generated text, keys and nested values).


def toml_ready(v: Any) -> Any:
    """``v`` with plain types only, as TOML holds it: booleans, integers, floats, strings, lists
    (from lists and tuples) and dicts with string keys (from mappings). An int or float subclass
    (IntEnum, numpy's float64) becomes its value, a str subclass a str. Raises TypeError for
    anything else, ValueError for a string TOML cannot hold (a lone surrogate, U+D800-U+DFFF, e.g.
    an undecodable byte of a file name or an environment variable under ``surrogateescape``: not a
    Unicode scalar value, so no TOML string holds it, and writing another would change it)."""
    if isinstance(v, bool):
        return v  # bool cannot be subclassed
    if isinstance(v, int):
        return int.__int__(v)  # the value itself, whatever a subclass's __int__ or __str__ says
    if isinstance(v, float):
        return float.__float__(v)
    if isinstance(v, str):
        bad = _SURROGATE.search(v)
        if bad is not None:
            raise ValueError(f"{_surrogate_text(bad.group())}, which TOML cannot hold")
        return str.__str__(v)
    if isinstance(v, (list, tuple)):
        return [toml_ready(x) for x in v]
    if isinstance(v, Mapping):
        out: dict[str, Any] = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"cannot write a {type(k).__name__} key to TOML")
            out[toml_ready(k)] = toml_ready(x)
        return out
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def toml_text(table: Mapping[str, Any]) -> str:
    """``table`` as a TOML document (tomli_w) that tomllib reads back equal, printable but for its
    line ends. Raises as :func:`toml_ready`."""
    import tomli_w  # only when a spec is written, not in every process that imports triton

    return _visible(tomli_w.dumps(toml_ready(table)))


def toml_comment(text: str) -> str:
    """``text`` as comment lines (``# ...``). A comment may hold no control character but tab and
    no lone surrogate (the file is UTF-8): every non-printable character is written as an escape
    (``\\u000b``), which is only text in a comment."""
    lines = text.split("\n")  # only "\n" ends a line: "\r", "\x0b"... are escaped like the rest
    return "\n".join("# " + _visible(line) for line in lines)


def _visible(text: str) -> str:
    """Every non-printable character but "\\n" of ``text`` as a ``\\uXXXX`` escape. In tomli_w's
    output (no multi-line strings) such a character can only be inside a basic string, where the
    escape stands for the same character, and "\\n" only ends a line (inside a string it is
    ``\\n``); in a comment the escape is text."""
    if text.replace("\n", "").isprintable():
        return text  # the common case: nothing to escape
    return "".join(c if c.isprintable() or c == "\n" else _escape(c) for c in text)


def _surrogate_text(ch: str) -> str:
    return f"a string with a lone surrogate (U+{ord(ch):04X}: an undecodable byte?)"


def _escape(ch: str) -> str:
    o = ord(ch)
    return f"\\u{o:04X}" if o <= 0xFFFF else f"\\U{o:08X}"


def entry_toml(entry: Mapping[str, Any], comment: str | None = None) -> str:
    """One ``[[triton]]`` table: kernel, grid, then the tables options, env and args (tensors as
    their own tables, ``[triton.args.x_ptr]``). Raises as :func:`toml_ready`."""
    if not isinstance(entry["kernel"], str):
        raise TypeError(f"the kernel is a {type(entry['kernel']).__name__}, not a module:name")
    table: dict[str, Any] = {"kernel": entry["kernel"]}
    table.update((k, entry[k]) for k in ("grid", "options", "env") if entry.get(k))
    table["args"] = entry["args"]
    # tomli_w heads the table "[triton]" (its first key, kernel, is a string); in the file the
    # entry is one more element of the array of tables: "[[triton]]", and the sub-tables after it
    # ([triton.args] ...) belong to that element.
    body = toml_text({"triton": table})
    head = "[triton]\n"
    if not body.startswith(head):
        raise ValueError(f"tomli_w began the entry with {body[:40]!r}, not {head!r}")
    text = "[[triton]]\n" + body[len(head) :]
    return (toml_comment(comment) + "\n" + text) if comment else text


# ------------------------------------------------------------------------------ values
def spec_value(v: Any) -> Any:
    """A runtime argument -> its spec value (a TOML-ready Python object). Raises Unrecordable."""
    if v is None:
        return {"none": True}
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        bad = _SURROGATE.search(v)
        if bad is not None:
            raise Unrecordable(_surrogate_text(bad.group()))
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if hasattr(v, "data_ptr") and hasattr(v, "dtype") and hasattr(v, "shape") and hasattr(v, "stride"):
        from .values import dtype_name

        name = dtype_name(str(v.dtype))
        if name is None:
            raise Unrecordable(f"a tensor of dtype {v.dtype}")
        out: dict[str, Any] = {"tensor": name, "shape": [int(s) for s in v.shape]}
        try:
            contiguous = bool(v.is_contiguous())
        except Exception:  # broad: a tensor-like of the program's (any subclass)
            contiguous = True
        if not contiguous:
            out["strides"] = [int(s) for s in v.stride()]
        try:
            ptr = int(v.data_ptr())
        except Exception:  # broad: as above
            ptr = 0
        if ptr % 16:
            out["alignment"] = ptr & -ptr
        return out
    cls = type(v)
    mod = getattr(cls, "__module__", "")
    if mod.startswith("triton.language") and cls.__name__ == "constexpr":
        return spec_value(v.value)
    if mod.startswith("triton.language") and hasattr(v, "name") and cls.__name__.endswith("dtype"):
        return {"triton_dtype": str(v.name)}
    if isinstance(v, (list, tuple)):
        return [spec_value(x) for x in v]
    raise Unrecordable(f"a {cls.__name__}")


# ------------------------------------------------------------------------------ names
_name_memo: dict[int, tuple[Any, str | None, str | None]] = {}


def import_name(obj: Any, fn: Any) -> tuple[str | None, str | None]:
    """(``module:name`` by which another process can import ``obj``, or None; why not)."""
    hit = _name_memo.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1], hit[2]
    modname = getattr(fn, "__module__", None) or ""
    ref, why = None, None
    mod = sys.modules.get(modname)
    if modname == "__main__" or mod is None:
        why = f"{getattr(fn, '__name__', '?')} is defined in the main script (__main__), which another process cannot import"
    elif "<locals>" in getattr(fn, "__qualname__", ""):
        why = f"{fn.__qualname__} is defined inside a function"
    else:
        name = getattr(fn, "__name__", None)
        if name and getattr(mod, name, None) is obj:
            ref = f"{modname}:{name}"
        else:
            for k, v in list(vars(mod).items()):
                if v is obj:
                    ref = f"{modname}:{k}"
                    break
        if ref is None:
            why = f"{getattr(fn, '__name__', '?')} is not a module-level name of {modname}"
        elif not _importable(modname, mod):
            why = f"module {modname} was not imported from sys.path (loaded from a file path?)"
            ref = None
    _name_memo[id(obj)] = (obj, ref, why)
    return ref, why


def _importable(modname: str, mod: ModuleType) -> bool:
    spec = getattr(mod, "__spec__", None)
    if spec is None:
        return False
    top = modname.split(".")[0]
    if top in sys.builtin_module_names:
        return True
    try:
        found = importlib.machinery.PathFinder.find_spec(top, sys.path)
    except Exception:  # broad: finders run any code
        found = None
    if found is None:
        return False
    if "." not in modname and spec.origin and found.origin:
        return os.path.realpath(spec.origin) == os.path.realpath(found.origin)
    return True


# ------------------------------------------------------------------------------ the recorder
class Recorder:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, str], tuple[str, dict[str, Any] | None, str | None]] = {}
        self._written: set[str] = set()
        self.recorded = 0
        self.skipped = 0

    # called by the chained hooks
    def capture(self, kw: Mapping[str, Any]) -> None:
        info = kw.get("fn")
        jit = getattr(info, "jit_function", None)
        if jit is None:
            return
        entry, why = self._build(jit, kw)
        if entry is None and why is None:
            return
        rid = _record_id(entry if entry is not None else {"skip": why, "fn": getattr(jit, "__name__", "")})
        with self._lock:
            self._pending[(id(jit), str(kw.get("key")))] = (rid, entry, why)

    def commit(self, kw: Mapping[str, Any]) -> None:
        info = kw.get("fn")
        jit = getattr(info, "jit_function", None)
        with self._lock:
            got = self._pending.pop((id(jit), str(kw.get("key"))), None)
            if got is None or got[0] in self._written:
                return
            self._written.add(got[0])
        rid, entry, why = got
        try:
            self._append(rid, entry, why)
        except Exception as e:  # broad: recording must never fail the program's compile
            warn_once("record-write", f"KCACHE_RECORD: cannot append to {self.path}: {e}")

    def _build(self, jit: Any, kw: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        import inspect

        f: FrameType | None = sys._getframe(1)
        run = None
        while f is not None:
            loc = f.f_locals
            if f.f_code.co_name == "run" and loc.get("self") is jit and "bound_args" in loc:
                run = f
                break
            f = f.f_back
        if run is None:
            return None, None  # preload() or an unknown path: nothing to record
        from triton.runtime.jit import JITFunction, KernelInterface

        from .kernels import kernel_chain

        outer, outer_frame = None, None
        f = run.f_back
        while f is not None:
            s = f.f_locals.get("self") if f.f_code.co_name in ("run", "warmup") else None
            if (
                s is not None
                and isinstance(s, KernelInterface)
                and not isinstance(s, JITFunction)
                and any(c is jit for c in kernel_chain(s))
            ):
                outer, outer_frame = s, f
            f = f.f_back
        params = list(inspect.signature(jit.fn).parameters)
        warmup = bool(kw.get("is_manual_warmup"))
        obj = outer if outer is not None else jit
        ref, why = import_name(obj, jit.fn)
        if ref is None:
            return None, why
        if outer is not None and outer_frame is not None:
            loc = outer_frame.f_locals
            names = getattr(outer, "arg_names", params)
            given = dict(zip(names, loc.get("args", ())))
            given.update(loc.get("kwargs", {}) or {})
            grid = given.pop("grid", loc.get("grid"))
            given.pop("warmup", None)
            if isinstance(getattr(outer, "values", None), dict):  # heuristics add these
                for k in outer.values:
                    given.pop(k, None)
            excluded: set[str] = set()
        else:
            loc = run.f_locals
            given = dict(loc["bound_args"])
            given.update({k: v for k, v in (loc.get("kwargs") or {}).items() if k not in given})
            grid = loc.get("grid")
            excluded = _EXCLUDED_OPTIONS
        args: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for k, v in given.items():
            if k in excluded:
                continue
            try:
                val = spec_value(v)
            except Unrecordable as e:
                return None, f"{ref}: argument {k} is {e}, which a spec cannot describe"
            if k in params:
                args[k] = val
            elif v is not None:
                options[k] = val
        entry: dict[str, Any] = {"kernel": ref, "args": args}
        if options:
            entry["options"] = options
        if not warmup:
            g = _grid_value(grid, given if outer is None else None)
            if g is None and callable(grid) and outer is not None:
                g = fit_grid(grid, given, outer)  # an autotuner's lambda: per config
            if g is not None:
                entry["grid"] = g
        env = _env_now()
        if env:
            entry["env"] = env
        try:  # written at commit, checked now: the reason goes in the file instead of the entry
            entry_toml(entry)
        except (TypeError, ValueError) as e:
            return None, f"{ref}: cannot be written to a spec: {e}"
        return entry, None

    def _append(self, rid: str, entry: dict[str, Any] | None, why: str | None) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        if entry is not None:
            text = entry_toml(entry, comment=f"kcache record-id {rid} ({stamp}, pid {os.getpid()})")
        else:
            text = toml_comment(f"kcache record-id {rid}: not recorded: {why}") + "\n"
        fd = _open_record_file(self.path)
        try:
            # One flock on the file itself (processes of one job record into one file). No
            # separate lock file: a name beside it is one more place a link could be planted.
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                chunks.append(b)
            existing = b"".join(chunks).decode("utf-8", "replace")
            if f"record-id {rid}" in existing:
                return
            out = ""
            if not existing.strip():
                out = HEADER
            elif not existing.endswith("\n"):
                out = "\n"
            data = (out + "\n" + text).encode("utf-8")
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if entry is not None:
            self.recorded += 1
        else:
            self.skipped += 1
            warn_once(f"record-skip:{why}", f"KCACHE_RECORD: not recorded: {why}")


def _grid_value(grid: Any, bound: Mapping[str, Any] | None) -> Any:
    if grid is None:
        return None
    if isinstance(grid, (tuple, list)):
        return [int(g) for g in grid] if all(isinstance(g, int) for g in grid) else None
    if callable(grid):
        qn = getattr(grid, "__qualname__", "")
        mod = getattr(grid, "__module__", "")
        if qn and "<" not in qn and mod and mod != "__main__" and "." not in qn:
            if getattr(sys.modules.get(mod), qn, None) is grid:
                return f"{mod}:{qn}"
        if bound is not None:  # a plain kernel: the grid is fixed by its bound arguments
            try:
                g = grid(bound)
                if all(isinstance(x, int) for x in g):
                    return [int(x) for x in g]
            except Exception:  # broad: the program's grid function (any code)
                return None
    return None


def fit_grid(grid: Any, given: Mapping[str, Any], tuner: Any) -> list[Any] | None:
    """An autotuned kernel's grid is a function of the config (``lambda META: (cdiv(M,
    META["BLOCK_M"]), ...)``): find, per dimension, a constant or an expression over the integer
    arguments and the configs' constexprs (``cdiv(A, C)``, ``cdiv(A, C) * cdiv(A2, C2)``, ``A``)
    that gives the grid's value for EVERY config. None if no such expression fits."""
    from .expr import FUNCS

    configs = list(getattr(tuner, "configs", None) or [])
    if not configs:
        return None
    ints = {k: v for k, v in given.items() if isinstance(v, int) and not isinstance(v, bool)}
    metas = []
    for cfg in configs:
        try:
            metas.append({**given, **cfg.all_kwargs()})
        except Exception:  # broad: the program's configs (any code)
            return None
    try:
        values = [tuple(int(x) for x in grid(m)) for m in metas]
    except Exception:  # broad: the program's grid function (any code)
        return None
    ndim = max(len(v) for v in values)
    if ndim > 3 or any(len(v) != ndim for v in values):
        return None
    ckeys = sorted(
        {k for m, cfg in zip(metas, configs) for k, v in cfg.kwargs.items() if isinstance(v, int) and v > 0}
    )
    cdiv = FUNCS["cdiv"]
    singles: list[tuple[str, Callable[..., Any]]]
    singles = [(f"cdiv({a}, {c})", lambda m, a=a, c=c: cdiv(m[a], m[c])) for a in ints for c in ckeys]
    singles += [(a, lambda m, a=a: m[a]) for a in ints]
    out: list[Any] = []
    for d in range(ndim):
        want = [v[d] for v in values]
        if len(set(want)) == 1:
            out.append(want[0])
            continue
        found = None
        for text, f in singles:
            if all(f(m) == w for m, w in zip(metas, want)):
                found = text
                break
        if found is None:
            for i, (t1, f1) in enumerate(singles):
                for t2, f2 in singles[i:]:
                    if all(f1(m) * f2(m) == w for m, w in zip(metas, want)):
                        found = f"{t1} * {t2}"
                        break
                if found:
                    break
        if found is None:
            return None
        out.append("=" + found)
    return out


def _env_now() -> dict[str, str]:
    try:
        return dict(sorted(current_invalidating_env().items()))
    except Exception:  # broad: importing Triton runs its code (a broken install raises anything)
        return {}


def _record_id(entry: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ chaining
def chain_hooks(recorder: Recorder) -> Callable[[], None]:
    """Route ``knobs.runtime.jit_cache_hook``/``jit_post_compile_hook`` through ``recorder``,
    keeping (and calling) whatever the program set, now or later. Returns an undo function."""
    from triton import knobs

    rt = knobs.runtime
    base = type(rt)
    if getattr(base, "_kcache_chained", False):
        base._kcache_recorder = recorder
        return lambda: setattr(base, "_kcache_recorder", None)

    def make(slot: str, before: bool) -> property:
        user_slot = f"_kcache_user_{slot}"

        def get(self: Any) -> Any:
            user = self.__dict__.get(user_slot)
            rec = type(self)._kcache_recorder

            if rec is None:
                return user

            def hook(**kw: Any) -> Any:
                try:
                    (rec.capture if before else rec.commit)(kw)
                except Exception as e:  # the edge (Triton calls it): recording never breaks the program
                    from ..boundary import failed

                    failed("record-hook", "KCACHE_RECORD's recording of a kernel", e, then="not recorded")
                return user(**kw) if user is not None else None

            return hook

        def set_(self: Any, value: Any) -> None:
            self.__dict__[user_slot] = value

        return property(get, set_)

    chained = type(
        base.__name__,
        (base,),
        {
            "_kcache_chained": True,
            "_kcache_recorder": recorder,
            "jit_cache_hook": make("jit_cache_hook", True),
            "jit_post_compile_hook": make("jit_post_compile_hook", False),
        },
    )
    for slot in ("jit_cache_hook", "jit_post_compile_hook"):
        rt.__dict__[f"_kcache_user_{slot}"] = rt.__dict__.pop(slot, None)
    rt.__class__ = chained

    def undo() -> None:
        chained._kcache_recorder = None  # type: ignore[attr-defined]

    return undo


# ------------------------------------------------------------------------------ attach
def attach(record_path: str | None) -> Callable[[], None]:
    """Called by :func:`kcache.enable`: when triton is imported, check the store's prewarm build,
    and with ``record_path`` (``KCACHE_RECORD``) start recording. In a child of a prewarm, protect
    this process's puts. Returns a function that undoes it all. Imports nothing heavy."""
    from .. import active_store
    from .meta import check_store_build, protect_from_env

    undo: list[Callable[[], None]] = []
    with_protect = protect_from_env(active_store())
    if with_protect is not None:
        undo.append(with_protect)

    def on_triton(mod: ModuleType) -> None:
        try:
            check_store_build(active_store())
        except Exception as e:  # broad: an advisory check at Triton's import
            logger.debug("prewarm build check: %s", e)
        if record_path and not os.environ.get(WORKER_ENV):
            rec = Recorder(record_path)
            undo.append(chain_hooks(rec))

    when_imported("triton", on_triton)

    def detach() -> None:
        forget("triton", on_triton)
        while undo:
            try:
                undo.pop()()
            except Exception:  # broad: undoing goes on whatever one part met
                pass

    return detach


MAX_RECORD_BYTES = 64 << 20  # a KCACHE_RECORD file: a spec of thousands of kernels is a few MiB


def _open_record_file(path: str) -> int:
    """Open the ``KCACHE_RECORD`` file for appending: created 0600 if absent; never through a
    link (a link planted at the name is refused, not followed), and only a regular file of this
    user's (in a shared folder such as /tmp, another user may have made the name first)."""
    import stat

    fd = os.open(
        path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600
    )
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise OSError(f"{path} belongs to uid {st.st_uid}, not to this user")
        if st.st_size > MAX_RECORD_BYTES:  # it is read whole to find the entries it holds
            raise OSError(f"{path} is larger than {MAX_RECORD_BYTES} bytes; not recording into it")
        if st.st_nlink != 1:
            # A hard link to one of this user's files (another user can plant one in a shared
            # folder where fs.protected_hardlinks is off) passes the owner check: appending to
            # it would write into that file. A spec file has one name (issue 16).
            raise OSError(f"{path} has {st.st_nlink} names (a hard link to another file?); not writing it")
        os.set_blocking(fd, True)
    except BaseException:  # re-raised: it only cleans up on the way
        os.close(fd)
        raise
    return fd
