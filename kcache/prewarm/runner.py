"""Running a prewarm: items, processes, progress and the summary.

A spec expands into items (one argument set of one entry, with the ``sizes`` symbols bound).
Everything is checked first (:func:`kcache.prewarm.spec.resolve` imports the modules the spec
names): a bad spec changes nothing. Then the items run, in this process or in workers:

- with a GPU: each item runs on generated tensors (Triton kernels launched and autotuned,
  nvFuser fusions executed, callables called), so whatever they compile lands in the store;
- with ``--target cuda:ARCH``: Triton kernels (every config of an autotuned one) are compiled
  through the JIT with a stand-in driver (:mod:`.triton_aot`); the rest is skipped with a reason.

Workers are processes (``python -m kcache.prewarm.worker``): Triton's driver and knobs are per
process, the JIT caches the target per device, and the cache-invalidating environment must be
set before Triton is imported. They report each finished item as a JSON line on a private pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..log import logger
from .env import EXTRA_ENV, KNOWN_ENV, WORKER_ENV, current_invalidating_env, env_vars_function
from .spec import Item, Spec, SpecError, UsageError, load, resolve

STATUSES = ("prepared", "cached", "failed", "skipped", "planned")


# ------------------------------------------------------------------------------ results
@dataclass
class ItemResult:
    id: int
    entry: str
    label: str
    kind: str
    status: str  # prepared | cached | failed | skipped | planned
    reason: str | None = None
    compiles: int = 0  # Triton kernels compiled (not found in the store)
    hits: int = 0  # Triton kernels found in the store
    launchers: int = 0  # host launchers built (triton-aux entries written)
    autotune: int = 0  # autotune results written (on a GPU)
    configs: int = 0  # autotune configs compiled
    other_puts: int = 0  # other entries written (nvfuser, ...)
    notes: list[str] = field(default_factory=list)  # what could not be prepared here, and why
    info: list[str] = field(default_factory=list)  # remarks that are not shortcomings
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Summary:
    """What a prewarm did. ``exit_code``: 0 when nothing failed, 1 otherwise."""

    spec: str
    target: str | None
    mode: str  # gpu | target | cpu (torch.compile on the CPU only) | dry-run
    store: str | None
    items: list[ItemResult] = field(default_factory=list)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # per env group: applied
    env_unset: list[str] = field(default_factory=list)
    build: dict[str, Any] | None = None
    host_code: str | None = None  # why launchers could not be built here
    utils_builds: int = 0  # Triton's own host modules (cuda_utils) built at start-up
    jobs: int = 1
    protect_s: float = 0.0
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(1 for i in self.items if i.status == status)

    @property
    def prepared(self) -> int:
        return self.count("prepared")

    @property
    def cached(self) -> int:
        return self.count("cached")

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def skipped(self) -> int:
        return self.count("skipped")

    @property
    def ok(self) -> bool:
        return self.failed == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def totals(self) -> dict[str, Any]:
        return {
            "items": len(self.items),
            **{s: self.count(s) for s in STATUSES},
            "kernel_compiles": sum(i.compiles for i in self.items),
            "kernel_hits": sum(i.hits for i in self.items),
            "launcher_builds": sum(i.launchers for i in self.items),
            "utils_builds": self.utils_builds,
            "autotune_results": sum(i.autotune for i in self.items),
            "configs_compiled": sum(i.configs for i in self.items),
        }

    def not_prepared(self) -> list[str]:
        """What could not be prepared here, one line per entry and reason (autotune timings...)."""
        seen: dict[str, None] = {}
        for i in self.items:
            for n in i.notes:
                seen.setdefault(f"{i.entry}: {n}", None)
            if i.status == "skipped" and i.reason:
                seen.setdefault(f"{i.entry}: {i.reason}", None)
        if self.host_code and self.mode == "target":
            seen.setdefault(f"launchers: {self.host_code}", None)
        return list(seen)

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "target": self.target,
            "mode": self.mode,
            "store": self.store,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "totals": self.totals(),
            "seconds": round(self.seconds, 3),
            "jobs": self.jobs,
            "protect_s": self.protect_s,
            "env": self.env,
            "env_unset": self.env_unset,
            "build": self.build,
            "host_code": self.host_code,
            "not_prepared": self.not_prepared(),
            "items": [i.as_dict() for i in self.items],
        }

    def format(self) -> str:
        t = self.totals()
        where = f" for {self.target}" if self.target else ""
        lines = [f"kcache prewarm {self.spec}{where}" + (f" -> {self.store}" if self.store else "")]
        if self.mode == "dry-run":
            lines.append(f"  dry run: {len(self.items)} items would be prepared")
            for i in self.items:
                lines.append(f"    {i.label}" + (f"  [{i.reason}]" if i.reason else ""))
            return "\n".join(lines)
        lines.append(
            f"  {t['items']} items: {t['prepared']} prepared, {t['cached']} already cached, "
            f"{t['failed']} failed, {t['skipped']} skipped  ({t['kernel_compiles']} kernel compiles, "
            f"{t['launcher_builds']} launcher builds"
            + (f", {t['utils_builds']} driver utilities built" if t["utils_builds"] else "")
            + (f", {t['autotune_results']} autotune results" if t["autotune_results"] else "")
            + f"; {self.seconds:.1f} s)"
        )
        failed = [i for i in self.items if i.status == "failed"]
        if failed:
            lines.append("  failed:")
            lines += [f"    {i.label}: {i.reason}" for i in failed]
        np_ = self.not_prepared()
        if np_:
            lines.append("  not prepared here:")
            lines += [f"    {n}" for n in np_]
        if self.env_unset:
            lines.append(f"  unset while prewarming (not in the spec's env): {', '.join(self.env_unset)}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------ progress
class Progress:
    """A one-line bar on stderr when it is a terminal (or when forced); a callable gets results."""

    def __init__(self, total: int, setting: Any) -> None:
        self.total = total
        self.done = 0
        self.counts = dict.fromkeys(STATUSES, 0)
        self.callback: Callable[[ItemResult], None] | None = setting if callable(setting) else None
        if setting is None:
            self.bar = bool(getattr(sys.stderr, "isatty", lambda: False)())
        else:
            self.bar = setting is True
        self._width = 0

    def update(self, r: ItemResult) -> None:
        self.done += 1
        self.counts[r.status] = self.counts.get(r.status, 0) + 1
        if self.callback is not None:
            with contextlib.suppress(Exception):
                self.callback(r)
        if self.bar:
            n = 24
            filled = int(n * self.done / max(self.total, 1))
            text = (
                f"\r[{'#' * filled}{'.' * (n - filled)}] {self.done}/{self.total} "
                f"ok {self.counts['prepared'] + self.counts['cached']} failed {self.counts['failed']}  "
                f"{r.label[:60]}"
            )
            pad = max(0, self._width - len(text))
            self._width = len(text)
            sys.stderr.write(text + " " * pad)
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar and self.done:
            sys.stderr.write("\n")
            sys.stderr.flush()


# ------------------------------------------------------------------------------ environment
def check_env_names(spec: Spec) -> None:
    """Every variable of an env table must be one Triton counts as cache-invalidating (probed)."""
    groups = [(f"{spec.source}: env", spec.env)] + [
        (f"{spec.source}: {e.label} env", e.env) for e in spec.entries if e.env is not None
    ]
    names = {k for _, env in groups if env for k in env}
    if not names:
        return
    get_cache_invalidating_env_vars = env_vars_function()
    if get_cache_invalidating_env_vars is None:
        return  # no Triton: nothing to check against
    saved = {k: os.environ.get(k) for k in names}
    bad: set[str] = set()
    try:
        for k in names - set(EXTRA_ENV):
            os.environ[k] = "1"
            if k not in get_cache_invalidating_env_vars():
                bad.add(k)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for where, env in groups:
        for k in env or {}:
            if k in bad:
                raise SpecError(
                    f"{where}.{k}: not one of Triton's cache-invalidating variables (env lists only "
                    "those; set other variables in the environment of the prewarm)"
                )


@contextlib.contextmanager
def applied_env(env: Mapping[str, str]) -> Iterator[list[str]]:
    """Set ``env`` and unset Triton's other cache-invalidating variables; restore afterwards.
    The spec's values are set before Triton is imported here (it reads some at import)."""
    saved = dict(os.environ)
    try:
        unset = [k for k in KNOWN_ENV if k in os.environ and k not in env]
        for k in unset:
            os.environ.pop(k, None)
        os.environ.update(env)
        more = [k for k in current_invalidating_env() if k not in env]
        for k in more:
            os.environ.pop(k, None)
        yield sorted(set(unset) | set(more))
    finally:
        for k in [k for k in os.environ if k not in saved]:
            os.environ.pop(k, None)
        for k, v in saved.items():
            if os.environ.get(k) != v:
                os.environ[k] = v


@contextlib.contextmanager
def _env_set(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _env_key(env: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(env.items())))


# ------------------------------------------------------------------------------ executing
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
        self._factories: dict[int, Any] = {}
        self._fusions: dict[int, Any] = {}
        self._enabled_here = False

    def setup(self) -> None:
        import kcache

        from .meta import protect_puts, record_build

        if not kcache.is_enabled() or (
            self.store_dir
            and os.path.abspath(str(kcache.active_store().root)) != os.path.abspath(self.store_dir)
        ):
            if not kcache.enable(dir=self.store_dir):
                raise UsageError(f"the store at {self.store_dir} cannot be used: {_why_not(self.store_dir)}")
            self._enabled_here = True
        self.store = kcache.active_store()
        if self.store.readonly:
            raise UsageError(
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
        try:
            self.build = record_build(self.store, f"cuda:{self.arch}" if self.arch else None)
        except Exception as e:
            logger.info("prewarm: could not record the build: %s", e)

    def _aux_puts(self) -> int:
        if self.store is None:
            return 0
        return int(self.store.counts.process_totals().get("triton-aux", {}).get("puts", 0))

    def teardown(self) -> None:
        while self._undo:
            with contextlib.suppress(Exception):
                self._undo.pop()()
        if self.stand_in is not None:
            with contextlib.suppress(Exception):
                self.stand_in.uninstall()
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.flush(force=True)
        if self._enabled_here:
            import kcache

            kcache.disable()

    def run(self, item: Item) -> ItemResult:
        e = item.entry
        r = ItemResult(item.id, e.label, item.label, e.kind, "prepared")
        t0 = time.perf_counter()
        before = self.store.counts.process_totals() if self.store is not None else {}
        compiled = hits = None
        try:
            if self.arch is None:  # generated contents: the same on every run
                import torch

                torch.manual_seed(1234 + item.id)
            if e.kind == "triton":
                from .triton_aot import count_compiles

                with count_compiles() as cc:
                    self._triton(item, r)
                compiled, hits = cc.compiled, cc.hits
            elif self.arch is not None:
                r.status = "skipped"
                what = {"nvfuser": "nvFuser fusions", "torch": "torch.compile models"}.get(
                    e.kind, "callables"
                )
                r.reason = f"{what} compile by running on the GPU: not prepared for cuda:{self.arch} here"
            elif e.kind == "nvfuser":
                self._nvfuser(item, r)
            elif e.kind == "torch":
                self._torch(item, r)
            else:
                self._callable(item, r)
        except Exception as ex:
            r.status = "failed"
            msg = str(ex).strip().splitlines()
            r.reason = f"{type(ex).__name__}: {msg[0][:300] if msg else ''}".rstrip(": ")
            logger.debug("prewarm %s failed", item.label, exc_info=True)
        after = self.store.counts.process_totals() if self.store is not None else {}

        def d(kind: str, name: str) -> int:
            return int(after.get(kind, {}).get(name, 0) - before.get(kind, {}).get(name, 0))

        r.compiles = compiled if compiled is not None else d("triton", "puts")
        r.hits = hits if hits is not None else d("triton", "hits")
        r.launchers = d("triton-aux", "puts")
        r.autotune = d("triton-autotune", "puts")
        r.other_puts = sum(
            d(k, "puts") for k in after if k not in ("triton", "triton-aux", "triton-autotune", "triton-meta")
        )
        if r.status == "prepared":
            wrote = r.compiles or r.launchers or r.autotune or r.other_puts
            if not wrote and e.kind == "triton":
                r.status = "cached"
                if not r.hits:
                    r.info.append("same specialisation as an earlier argument set")
            elif not wrote and e.kind == "torch":
                r.status = "cached"  # every graph and kernel came from the store (or was compiled already)
        r.seconds = round(time.perf_counter() - t0, 3)
        return r

    def _triton(self, item: Item, r: ItemResult) -> None:
        e = item.entry
        if self.arch is not None:
            from .triton_aot import build_launchers, warm_for_target

            res = warm_for_target(e.obj, item.args, e.options)
            if self.stand_in is not None and self.stand_in.utils_ready:
                why = build_launchers(res.kernels)
                if why:
                    r.notes.append(why)
        else:
            from .triton_aot import run_on_gpu

            res = run_on_gpu(e.obj, item.args, e.options, e.grid, item.symbols)
        r.configs = res.configs
        r.notes.extend(res.notes)

    def _nvfuser(self, item: Item, r: ItemResult) -> None:
        import torch

        from ..nvfuser import FusionCache
        from .triton_aot import make_value

        e = item.entry
        fc = (
            e.obj if isinstance(e.obj, FusionCache) else self._fusions.setdefault(e.index, FusionCache(e.obj))
        )
        values = [make_value(v, "cuda", torch=torch) for v in item.args]
        fc(*values)
        torch.cuda.synchronize()

    def _torch(self, item: Item, r: ItemResult) -> None:
        """torch.compile the entry's model once, then call it with the inputs of this sizes
        binding (and backward, if asked): Inductor's graphs, kernels, autotune results and the
        dynamic-shape profile land in the store through kcache's torch.compile integration."""
        import torch

        e = item.entry
        device = e.device
        if e.index not in self._factories:
            model = e.obj()
            if isinstance(model, torch.nn.Module):
                model = model.to(device)
            self._factories[e.index] = torch.compile(model, **e.compile)
        fn = self._factories[e.index]
        got = e.inputs_obj(**item.symbols, device=device)
        if (
            isinstance(got, tuple)
            and len(got) == 2
            and isinstance(got[1], dict)
            and isinstance(got[0], (tuple, list))
        ):
            args, kwargs = tuple(got[0]), dict(got[1])
        elif isinstance(got, dict):
            args, kwargs = (), got
        else:
            args, kwargs = (got if isinstance(got, (tuple, list)) else (got,)), {}
        if e.backward:
            out = fn(*args, **kwargs)
            loss = sum(o.float().sum() for o in _tensors(out))
            loss.backward()
        else:
            with torch.no_grad():
                fn(*args, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        r.info.append(f"{device}, " + ", ".join(f"{k}={v}" for k, v in item.symbols.items()))

    def _callable(self, item: Item, r: ItemResult) -> None:
        import torch

        from .triton_aot import make_value

        e = item.entry
        if e.is_factory:
            if e.index not in self._factories:
                self._factories[e.index] = e.obj()
            fn = self._factories[e.index]
        else:
            fn = e.obj
        values = [make_value(v, "cuda", torch=torch) for v in item.args]
        kwargs = {k: make_value(v, "cuda", torch=torch) for k, v in item.kwargs.items()}
        fn(*values, **kwargs)
        torch.cuda.synchronize()


def _tensors(out: Any) -> list[Any]:
    """The tensors in a model's output (a tensor, a tuple/list, a dict, or an object with fields)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out] if out.requires_grad else []
    if isinstance(out, dict):
        out = list(out.values())
    elif hasattr(out, "to_tuple"):  # transformers' ModelOutput
        out = list(out.to_tuple())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


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
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "see the warning above"


# ------------------------------------------------------------------------------ the driver
def _planned(items: Sequence[Item], arch: int | None) -> list[ItemResult]:
    out = []
    for it in items:
        why = None
        if arch is not None and it.entry.kind != "triton":
            why = f"skipped: {it.entry.kind} entries run their model: they need the GPU"
        elif it.entry.what == "autotune":
            n = len(getattr(_tuner_of(it.entry.obj), "configs", []) or [])
            why = f"{n} configs" + (" (timings need the GPU)" if arch is not None else "")
        out.append(ItemResult(it.id, it.entry.label, it.label, it.entry.kind, "planned", why))
    return out


def _tuner_of(obj: Any) -> Any:
    from .spec import kernel_chain

    for c in kernel_chain(obj):
        if type(c).__name__ == "Autotuner":
            return c
    return None


def _gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
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
    """See :func:`kcache.prewarm.prewarm`. ``in_process``: None decides (a target, jobs > 1, an
    environment that differs from a Triton already imported, or another store: workers); True
    lets this process be the one worker when it can (the command line); False forces workers."""
    from .meta import DEFAULT_PROTECT_S
    from .needs import missing
    from .triton_aot import parse_target

    t0 = time.perf_counter()
    sp = load(spec)
    lacking = missing(sp)  # before any module is imported or anything compiled; --dry-run too
    if lacking:
        raise UsageError(lacking)
    arch = None
    if target:
        try:
            arch = parse_target(target)
        except ValueError as e:
            raise UsageError(f"--target: {e}") from None
        target = f"cuda:{arch}"
    if not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"--jobs: must be a positive integer, got {jobs!r}")
    items = sp.items()
    protect = DEFAULT_PROTECT_S if protect_s is None else max(0.0, float(protect_s))
    groups: dict[str, list[Item]] = {}
    for it in items:
        groups.setdefault(_env_key(it.env), []).append(it)
    triton_was_imported = "triton" in sys.modules
    # In-process with one environment: apply it before the modules (and Triton) are imported.
    can_inline = len(groups) == 1 and jobs == 1 and not dry_run
    if in_process is False or (in_process is None and arch is not None):
        can_inline = False
    env0 = json.loads(next(iter(groups))) if groups else {}
    if can_inline and triton_was_imported and env0 != current_invalidating_env():
        can_inline = False
    with contextlib.ExitStack() as stack:
        unset = stack.enter_context(applied_env(env0)) if can_inline else []
        resolve(sp, extra_paths=list(paths or ()))
        check_env_names(sp)
        store_dir = dir
        if store_dir is None:
            from .. import config

            store_dir = str(config.load().dir)
        store_dir = os.path.abspath(os.path.expanduser(str(store_dir)))
        if dry_run:
            return Summary(
                sp.source,
                target,
                "dry-run",
                store_dir,
                _planned(items, arch),
                jobs=jobs,
                seconds=time.perf_counter() - t0,
                protect_s=protect,
            )
        cpu_only = all(it.entry.kind == "torch" and it.entry.device == "cpu" for it in items)
        if arch is None and not cpu_only and not _gpu_available():
            raise UsageError(
                "no GPU here: use --target cuda:ARCH (e.g. cuda:90) to compile for a GPU this machine does not have"
            )
        summary = Summary(
            sp.source,
            target,
            "target" if arch is not None else ("cpu" if cpu_only and not _gpu_available() else "gpu"),
            store_dir,
            jobs=jobs,
            protect_s=protect,
        )
        prog = Progress(len(items), progress)
        try:
            if can_inline:
                import kcache

                if kcache.is_enabled() and os.path.abspath(str(kcache.active_store().root)) != store_dir:
                    can_inline = False
            if can_inline:
                summary.env = {"0": env0}
                summary.env_unset = unset
                ex = Executor(sp, arch=arch, store_dir=store_dir, protect_s=protect)
                # KCACHE_RECORD is for programs: a prewarm does not record itself
                stack.enter_context(_env_set(WORKER_ENV, "1"))
                try:
                    ex.setup()
                    summary.build, summary.host_code, summary.utils_builds = (
                        ex.build,
                        ex.host_code,
                        ex.utils_builds,
                    )
                    for it in items:
                        r = ex.run(it)
                        summary.items.append(r)
                        prog.update(r)
                finally:
                    ex.teardown()
            else:
                _run_workers(sp, groups, arch, jobs, store_dir, protect, list(paths or ()), summary, prog)
        finally:
            prog.close()
    summary.items.sort(key=lambda r: r.id)
    summary.seconds = time.perf_counter() - t0
    return summary


# ------------------------------------------------------------------------------ workers
def _shard(items: list[Item], n: int, gpu: bool) -> list[list[Item]]:
    shards: list[list[Item]] = [[] for _ in range(n)]
    if gpu and n > 1:
        # Autotune timings taken concurrently on one GPU disturb each other: one worker times them all.
        tuned = [it for it in items if it.entry.what == "autotune"]
        rest = [it for it in items if it.entry.what != "autotune"]
        shards[0].extend(tuned)
        for i, it in enumerate(rest):
            shards[1 + i % (n - 1)].append(it)
        return [s for s in shards if s]
    for i, it in enumerate(items):
        shards[i % n].append(it)
    return [s for s in shards if s]


def _run_workers(
    sp: Spec,
    groups: dict[str, list[Item]],
    arch: int | None,
    jobs: int,
    store_dir: str,
    protect_s: float,
    paths: list[str],
    summary: Summary,
    prog: Progress,
) -> None:
    from .meta import PROTECT_ENV

    current = current_invalidating_env()
    procs: list[tuple[subprocess.Popen, int, set[int], str]] = []
    sel = selectors.DefaultSelector()
    tmpdir = tempfile.mkdtemp(prefix="kcache-prewarm-")
    by_id = {it.id: it for g in groups.values() for it in g}
    try:
        per_group = max(1, jobs // max(len(groups), 1))
        for gi, (gkey, gitems) in enumerate(groups.items()):
            env_vals = json.loads(gkey)
            summary.env[str(gi)] = env_vals
            unset = sorted(k for k in current if k not in env_vals)
            summary.env_unset = sorted(set(summary.env_unset) | set(unset))
            for si, shard in enumerate(_shard(gitems, per_group, arch is None)):
                job = {
                    "raw": sp.raw,
                    "source": sp.source,
                    "base_dir": sp.base_dir,
                    "paths": paths,
                    "items": [it.id for it in shard],
                    "arch": arch,
                    "dir": store_dir,
                    "protect_s": protect_s,
                }
                jf = os.path.join(tmpdir, f"job{gi}.{si}.json")
                with open(jf, "w") as f:
                    json.dump(job, f)
                r, w = os.pipe()
                env = dict(os.environ)
                for k in unset:
                    env.pop(k, None)
                env.update(env_vals)
                env.pop("KCACHE_RECORD", None)
                env[WORKER_ENV] = "1"
                env["KCACHE"] = "1"
                env["KCACHE_DIR"] = store_dir
                env[PROTECT_ENV] = str(protect_s)
                pp = [p for p in [*paths, sp.base_dir or "", os.getcwd(), *sys.path] if p]
                env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pp))
                cmd = [sys.executable, "-m", "kcache.prewarm.worker", jf, str(w)]
                p = subprocess.Popen(
                    cmd,
                    env=env,
                    pass_fds=(w,),
                    stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None,
                )
                os.close(w)
                reader = os.fdopen(r, "r", encoding="utf-8")
                sel.register(reader, selectors.EVENT_READ, len(procs))
                procs.append((p, r, {it.id for it in shard}, jf))
        open_readers = len(procs)
        while open_readers:
            for key, _ in sel.select(timeout=1.0):
                idx = key.data
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if not line:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
                    open_readers -= 1
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("event") == "setup":
                    summary.build = summary.build or msg.get("build")
                    summary.host_code = summary.host_code or msg.get("host_code")
                    summary.utils_builds += int(msg.get("utils_builds") or 0)
                elif msg.get("event") == "item":
                    res = ItemResult(**msg["result"])
                    procs[idx][2].discard(res.id)
                    summary.items.append(res)
                    prog.update(res)
                elif msg.get("event") == "fatal":
                    reason = msg.get("error", "worker failed")
                    for iid in sorted(procs[idx][2]):
                        it = by_id[iid]
                        res = ItemResult(iid, it.entry.label, it.label, it.entry.kind, "failed", reason)
                        summary.items.append(res)
                        prog.update(res)
                    procs[idx][2].clear()
        for p, _, left, _ in procs:
            rc = p.wait()
            for iid in sorted(left):
                it = by_id[iid]
                res = ItemResult(
                    iid,
                    it.entry.label,
                    it.label,
                    it.entry.kind,
                    "failed",
                    f"worker process exited with code {rc} before finishing it",
                )
                summary.items.append(res)
                prog.update(res)
    finally:
        sel.close()
        for p, *_ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)


def _has_fileno(f: Any) -> bool:
    try:
        f.fileno()
        return True
    except Exception:
        return False
