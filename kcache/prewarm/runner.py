"""Running a prewarm: the request checked, the items run in this process or in workers.

A spec expands into items (one argument set of one entry, with the ``sizes`` symbols bound).
Everything is checked first (:func:`kcache.prewarm.kernels.resolve` imports the modules the spec
names): a bad spec changes nothing. Then the items run, here (:class:`Executor`, one environment
and no target) or in worker processes (:mod:`.workers`), each by its kind's executor
(:mod:`.executors`):

- with a GPU: each item runs on generated tensors (Triton kernels launched and autotuned,
  nvFuser fusions executed, callables called), so whatever they compile lands in the store;
- with ``--target cuda:ARCH``: Triton kernels (every config of an autotuned one) are compiled
  through the JIT with a stand-in driver (:mod:`.triton_aot`); the rest is skipped with a reason.

The results are :mod:`.summary`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..boundary import guarded
from ..config import counted
from ..log import logger
from .env import WORKER_ENV, applied_env, current_invalidating_env, env_key, env_set
from .executors import EXECUTORS, KindExecutor
from .kernels import check_env_names, resolve
from .spec import Item, Spec, UsageError, load
from .summary import ItemResult, Progress, Summary
from .workers import run_workers


class StoreUnusable(UsageError):
    """The store cannot be prewarmed into (refused, or read-only). ``kcache.prewarm`` reports it
    in its summary (every item failed, with this reason) unless ``KCACHE_STRICT=1``; ``kcache
    prewarm`` exits 2 with it."""


class Executor:
    """Runs items in this process. Set up once: the store, Triton's manager, the stand-in driver."""

    def __init__(
        self,
        spec: Spec,
        *,
        arch: int | None,
        store_dir: str | None,
        protect_s: float,
    ) -> None:
        self.spec = spec
        self.arch = arch
        self.store_dir = store_dir
        self.protect_s = protect_s
        self.store: Any = None
        self.stand_in: Any = None
        self.build: dict[str, Any] | None = None
        self.host_code: str | None = None
        self.utils_builds = 0
        self._undo: list[Callable[[], None]] = []
        self._executors: dict[str, KindExecutor] = {}
        self._enabled_here = False

    def setup(self) -> None:
        import kcache

        from .meta import protect_puts, record_build

        active = kcache.active_store()
        if active is None or (
            self.store_dir and os.path.abspath(str(active.root)) != os.path.abspath(self.store_dir)
        ):
            if not kcache.enable(dir=self.store_dir):
                raise StoreUnusable(
                    f"the store at {self.store_dir} cannot be used: {_why_not(self.store_dir)}"
                )
            self._enabled_here = True
        self.store = kcache.active_store()
        if self.store.readonly:
            raise StoreUnusable(
                f"the store at {self.store.root} is read-only (KCACHE_READONLY): nothing can be prewarmed into it"
            )
        self._undo.append(protect_puts(self.store, self.protect_s))
        if not any(e.kind == "triton" for e in self.spec.entries) and self.arch is None:
            return
        import triton  # noqa: F401  (installs kcache's manager through the import hook)

        before = self._aux_puts()
        if self.arch is not None:
            from .triton_aot import install_stand_in

            self.stand_in = install_stand_in(self.arch)
            self.host_code = self.stand_in.host_code_note
        self.utils_builds = self._aux_puts() - before
        # The build record is advice; what it cannot read it leaves out, and the store skips what
        # it cannot write: a raise is a bug, reported once (raised when strict).
        with guarded("prewarm-build", "recording the prewarm's Triton build", then="the build is not noted"):
            self.build = record_build(self.store, f"cuda:{self.arch}" if self.arch else None)

    def _aux_puts(self) -> int:
        if self.store is None:
            return 0
        return int(self.store.counts.process_totals().get("triton-aux", {}).get("puts", 0))

    def teardown(self) -> None:
        # Each step expects nothing to fail (a folder removed ignoring errors, an attribute put
        # back, a flush that skips what it cannot write): a bug in one is reported once (raised
        # when strict) and the others run.
        what = "the prewarm's teardown"
        for kx in self._executors.values():
            with guarded("prewarm-teardown", what, then="going on"):
                kx.close()
        while self._undo:
            with guarded("prewarm-teardown", what, then="going on"):
                self._undo.pop()()
        if self.stand_in is not None:
            with guarded("prewarm-teardown", what, then="going on"):
                self.stand_in.uninstall()
        if self.store is not None:
            with guarded("prewarm-teardown", what, then="going on"):
                self.store.flush(force=True)
        if self._enabled_here:
            import kcache

            kcache.disable()

    def run(self, item: Item) -> ItemResult:
        """Prepare ``item`` with its kind's executor; what it compiled, hit and wrote counted."""
        e = item.entry
        r = ItemResult(item.id, e.label, item.label, e.kind, "prepared")
        t0 = time.perf_counter()
        before = self._totals()
        counted = None
        kx = self._executor(e.kind)
        try:
            if self.arch is None:  # generated contents: the same on every run
                import torch

                torch.manual_seed(1234 + item.id)
            if self.arch is not None and kx.needs_gpu is not None:
                r.status = "skipped"
                r.reason = (
                    f"{kx.needs_gpu} compile by running on the GPU: not prepared for cuda:{self.arch} here"
                )
            else:
                counted = kx.run(item, r)
        except Exception as ex:  # broad: an item runs the program's code (its kernels, its model):
            # one item's failure, whatever it is, is that item's result
            r.status = "failed"
            msg = str(ex).strip().splitlines()
            r.reason = f"{type(ex).__name__}: {msg[0][:300] if msg else ''}".rstrip(": ")
            logger.debug("prewarm %s failed", item.label, exc_info=True)
        self._count(r, before, counted)
        if r.status == "prepared" and not (r.compiles or r.launchers or r.autotune or r.other_puts):
            kx.settle(r)
        r.seconds = round(time.perf_counter() - t0, 3)
        return r

    def _executor(self, kind: str) -> KindExecutor:
        if kind not in self._executors:
            self._executors[kind] = EXECUTORS[kind](self.arch, self.stand_in)
        return self._executors[kind]

    def _totals(self) -> dict[str, dict[str, float]]:
        return self.store.counts.process_totals() if self.store is not None else {}

    def _count(
        self, r: ItemResult, before: dict[str, dict[str, float]], counted: tuple[int, int] | None
    ) -> None:
        """What the item wrote and hit, from this process's counters (Triton's compiles and hits
        from its own listener when the executor counted them)."""
        after = self._totals()

        def d(kind: str, name: str) -> int:
            return int(after.get(kind, {}).get(name, 0) - before.get(kind, {}).get(name, 0))

        r.compiles, r.hits = counted if counted is not None else (d("triton", "puts"), d("triton", "hits"))
        r.launchers = d("triton-aux", "puts")
        r.autotune = d("triton-autotune", "puts")
        r.other_puts = sum(
            d(k, "puts") for k in after if k not in ("triton", "triton-aux", "triton-autotune", "triton-meta")
        )
        r.stored = {k: n for k in sorted(after) if (n := d(k, "puts")) > 0}


def _why_not(store_dir: str | None) -> str:
    """Why kcache.enable() refused (it warns; the one-line error should say it too)."""
    from .. import config
    from ..store import Store, StoreError

    s = config.load(dir=store_dir)
    if s.problems:
        return "; ".join(s.problems)
    try:
        Store.open(s.dir, max_size=s.max_size, readonly=s.readonly, allow_insecure=s.allow_insecure).close()
    except StoreError as e:
        return str(e)
    except OSError as e:  # a folder the store could not even look at
        return f"{type(e).__name__}: {e}"
    return "see the warning above"


# ------------------------------------------------------------------------------ the driver
def _planned(items: Sequence[Item], arch: int | None) -> list[ItemResult]:
    out = []
    for it in items:
        why = None
        if arch is not None and EXECUTORS[it.entry.kind].needs_gpu is not None:
            why = f"skipped: {it.entry.kind} entries run their model: they need the GPU"
        elif it.entry.what == "autotune":
            n = len(getattr(_tuner_of(it.entry.obj), "configs", []) or [])
            why = counted(n, "config") + (" (timings need the GPU)" if arch is not None else "")
        out.append(ItemResult(it.id, it.entry.label, it.label, it.entry.kind, "planned", why))
    return out


def _tuner_of(obj: Any) -> Any:
    from .kernels import kernel_chain

    for c in kernel_chain(obj):
        if type(c).__name__ == "Autotuner":
            return c
    return None


def _gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except (ImportError, OSError):  # no torch, or one whose libraries cannot be loaded (OSError)
        return False


def prewarm(
    spec: Any,
    *,
    target: str | None = None,
    jobs: int = 1,
    dry_run: bool = False,
    dir: str | None = None,
    progress: Any = None,
    protect_s: float | None = None,
    paths: Sequence[str] | None = None,
    in_process: bool | None = None,
) -> Summary:
    """Prepare what ``spec`` (a path, TOML text, a mapping or a parsed spec) lists; see
    :func:`run`. A store that cannot be used (refused, read-only) never raises into the program:
    one warning, and a summary whose every item failed, saying why (``exit_code`` 1), as when
    its workers find it so; with ``KCACHE_STRICT=1`` it raises :class:`StoreUnusable`."""
    return run(
        spec, target=target, jobs=jobs, dry_run=dry_run, dir=dir, progress=progress, protect_s=protect_s,
        paths=paths, in_process=in_process, fail_open=True,
    )  # fmt: skip


def run(
    spec: Any,
    *,
    target: str | None = None,
    jobs: int = 1,
    dry_run: bool = False,
    dir: str | None = None,
    progress: Any = None,
    protect_s: float | None = None,
    paths: Sequence[str] | None = None,
    in_process: bool | None = None,
    fail_open: bool = False,
) -> Summary:
    """Prepare what ``spec`` (a path, TOML text, a mapping or a parsed spec) lists.

    ``target`` (``"cuda:90"``...) compiles for that GPU on a machine without it, in a child
    process; otherwise entries run on this machine's GPU. ``jobs`` > 1 spreads the work over that
    many processes. ``dry_run`` checks the spec and lists the work without doing it. ``dir`` is
    the store (default: the ``KCACHE_DIR`` setting). ``progress``: None (a bar on a terminal),
    False, True, or a callable receiving each finished item's result. Entries written are
    protected from eviction until first used, ``protect_s`` seconds at most (default 7 days).
    ``paths``: folders to import the spec's modules from (besides the spec's and the current one).
    ``in_process``: None decides (a target, jobs > 1, an environment that differs from a Triton
    already imported, or another store: workers); True lets this process be the one worker when
    it can (the command line); False forces workers.

    Raises :class:`~kcache.prewarm.spec.SpecError` (one line naming the entry and field) for a bad
    spec, before anything is compiled or written. Failures of single items are in the summary."""
    from .meta import DEFAULT_PROTECT_S

    t0 = time.perf_counter()
    sp = load(spec)
    arch, target = _check_request(sp, target, jobs)
    items = sp.items()
    protect = DEFAULT_PROTECT_S if protect_s is None else max(0.0, float(protect_s))
    groups: dict[str, list[Item]] = {}
    for it in items:
        groups.setdefault(env_key(it.env), []).append(it)
    # In-process with one environment: apply it before the modules (and Triton) are imported.
    inline = len(groups) == 1 and jobs == 1 and not dry_run
    if in_process is False or (in_process is None and arch is not None):
        inline = False
    env0 = json.loads(next(iter(groups))) if groups else {}
    if inline and "triton" in sys.modules and env0 != current_invalidating_env():
        inline = False
    with contextlib.ExitStack() as stack:
        unset = stack.enter_context(applied_env(env0)) if inline else []
        resolve(sp, extra_paths=list(paths or ()))
        check_env_names(sp)
        store_dir = _store_dir(dir)
        if dry_run:
            planned = _planned(items, arch)
            return Summary(sp.source, target, "dry-run", store_dir, planned, jobs=jobs,
                           seconds=time.perf_counter() - t0, protect_s=protect)  # fmt: skip
        summary = Summary(sp.source, target, _mode(items, arch), store_dir, jobs=jobs, protect_s=protect)
        prog = Progress(len(items), progress)
        try:
            if inline and _other_store_enabled(store_dir):
                inline = False
            if inline:
                summary.env = {"0": env0}
                summary.env_unset = unset
                # KCACHE_RECORD is for programs: a prewarm does not record itself
                stack.enter_context(env_set(WORKER_ENV, "1"))
                try:
                    _run_inline(sp, items, arch, store_dir, protect, summary, prog)
                except StoreUnusable as e:
                    from ..boundary import strict

                    if not fail_open or strict():
                        raise
                    _unusable(e, items, summary, prog)
            else:
                run_workers(sp, groups, arch, jobs, store_dir, protect, list(paths or ()), summary, prog)
        finally:
            prog.close()
    summary.items.sort(key=lambda r: r.id)
    summary.seconds = time.perf_counter() - t0
    return summary


def _unusable(e: StoreUnusable, items: Sequence[Item], summary: Summary, prog: Progress) -> None:
    """The fallback of :func:`prewarm` for a store it cannot use: every item failed, saying why
    (what its workers report for such a store), and one warning (``kcache.enable`` gave it for a
    refused store; a read-only one is said here)."""
    from ..log import warn_once

    warn_once("store", f"prewarm: nothing prepared: {e}")
    for it in items:
        r = ItemResult(it.id, it.entry.label, it.label, it.entry.kind, "failed", f"UsageError: {e}")
        summary.items.append(r)
        prog.update(r)


def _check_request(sp: Spec, target: str | None, jobs: Any) -> tuple[int | None, str | None]:
    """(the target's arch or None, the target as written back); raises UsageError for what
    cannot be served here: no torch, a bad target, a bad number of jobs. Before any module of the
    spec is imported or anything compiled (``--dry-run`` too)."""
    from .needs import missing
    from .triton_aot import parse_target

    lacking = missing(sp)
    if lacking:
        raise UsageError(lacking)
    arch = None
    if target:
        try:
            arch = parse_target(target)
        except ValueError as e:
            raise UsageError(f"--target: {e}") from None
        from .targets import target_problem

        why = target_problem(arch)  # cuda:999 went on to kilobytes of PTX and a crash per kernel
        if why:
            raise UsageError(why)
        target = f"cuda:{arch}"
    if not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"--jobs: must be a positive integer, got {jobs!r}")
    return arch, target


def _store_dir(dir: str | None) -> str:
    if dir is None:
        from .. import config

        dir = str(config.load().dir)
    return os.path.abspath(os.path.expanduser(str(dir)))


def _mode(items: Sequence[Item], arch: int | None) -> str:
    """target, cpu (torch.compile on the CPU only, no GPU here) or gpu; UsageError when the items
    need a GPU this machine does not have."""
    if arch is not None:
        return "target"
    cpu_only = all(it.entry.kind == "torch" and it.entry.device == "cpu" for it in items)
    if not cpu_only and not _gpu_available():
        raise UsageError(
            "no GPU here: use --target cuda:ARCH (e.g. cuda:90) to compile for a GPU this machine does not have"
        )
    return "cpu" if cpu_only and not _gpu_available() else "gpu"


def _other_store_enabled(store_dir: str) -> bool:
    """kcache is on in this process, with another store: the items run in workers."""
    import kcache

    active = kcache.active_store()
    return active is not None and os.path.abspath(str(active.root)) != store_dir


def _run_inline(
    sp: Spec,
    items: Sequence[Item],
    arch: int | None,
    store_dir: str,
    protect: float,
    summary: Summary,
    prog: Progress,
) -> None:
    """Every item in this process (its environment applied already)."""
    ex = Executor(sp, arch=arch, store_dir=store_dir, protect_s=protect)
    try:
        ex.setup()
        summary.build, summary.host_code, summary.utils_builds = ex.build, ex.host_code, ex.utils_builds
        for it in items:
            prog.start(it.label)
            r = ex.run(it)
            summary.items.append(r)
            prog.update(r)
    finally:
        ex.teardown()
