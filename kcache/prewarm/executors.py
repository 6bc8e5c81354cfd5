"""How each kind of spec entry is prepared: one executor per kind, in :data:`EXECUTORS`.

An executor runs one item (an argument set of an entry) in this process, where the store and
Triton's manager are set up (:class:`kcache.prewarm.runner.Executor`): whatever the item compiles
lands in the store. A new kind of entry is one executor here, one :class:`~.spec.EntryKind` and
one resolver (:data:`kcache.prewarm.kernels.RESOLVERS`).
"""

from __future__ import annotations

from typing import Any

from .spec import Item
from .summary import ItemResult


class KindExecutor:
    """Prepares the items of one kind of entry. ``arch``: the target (``--target cuda:ARCH``)
    when compiling for a GPU that is not here, else None; ``stand_in``: the stand-in driver then."""

    #: What entries of this kind are, in words; None when they compile for a target without its
    #: GPU (otherwise they are skipped with ``--target``, saying why).
    needs_gpu: str | None = "callables"
    #: Whether an item that wrote nothing was already cached (else it stays "prepared").
    cached_when_nothing_written = False

    def __init__(self, arch: int | None, stand_in: Any) -> None:
        self.arch, self.stand_in = arch, stand_in
        self._made: dict[int, Any] = {}  # per entry: the object made once (model, fusion cache)

    def run(self, item: Item, r: ItemResult) -> tuple[int, int] | None:
        """Prepare ``item``, noting in ``r``; (kernels compiled, kernels hit) when counted here,
        else None (the store's counters say)."""
        raise NotImplementedError

    def settle(self, r: ItemResult) -> None:
        """After a run that wrote nothing: say why (called only when the status is prepared)."""
        if self.cached_when_nothing_written:
            r.status = "cached"

    def close(self) -> None:
        """After the last item of this process (the prewarm's teardown)."""

    def made(self, index: int, make: Any) -> Any:
        if index not in self._made:
            self._made[index] = make()
        return self._made[index]


class TritonExecutor(KindExecutor):
    """A Triton kernel: launched on the GPU with generated tensors (autotuned when it has a grid),
    or, for a target, compiled through the JIT with the stand-in driver (every config)."""

    needs_gpu = None
    cached_when_nothing_written = True

    def run(self, item: Item, r: ItemResult) -> tuple[int, int] | None:
        from .triton_aot import count_compiles

        with count_compiles() as cc:
            self._compile(item, r)
        return cc.compiled, cc.hits

    def _compile(self, item: Item, r: ItemResult) -> None:
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

    def settle(self, r: ItemResult) -> None:
        r.status = "cached"
        if not r.hits:
            r.info.append("same specialisation as an earlier argument set")


class NvfuserExecutor(KindExecutor):
    """An nvFuser fusion (a FusionCache, or a function that builds one): executed on the GPU."""

    needs_gpu = "nvFuser fusions"

    def run(self, item: Item, r: ItemResult) -> None:
        import torch

        from ..nvfuser import FusionCache
        from .triton_aot import make_value

        e = item.entry
        fc = e.obj if isinstance(e.obj, FusionCache) else self.made(e.index, lambda: FusionCache(e.obj))
        values = [make_value(v, "cuda", torch=torch) for v in item.args]
        fc(*values)
        torch.cuda.synchronize()
        return None


class TorchExecutor(KindExecutor):
    """A torch.compile model: compiled once, then called with the inputs of each sizes binding
    (and backward, if asked): Inductor's graphs, kernels, autotune results and the dynamic-shape
    profile land in the store through kcache's torch.compile integration."""

    needs_gpu = "torch.compile models"
    cached_when_nothing_written = True  # every graph and kernel came from the store

    def __init__(self, arch: int | None, stand_in: Any) -> None:
        super().__init__(arch, stand_in)
        self._folder: str | None = None
        self._was: str | None = None

    def run(self, item: Item, r: ItemResult) -> None:
        import torch

        self._own_inductor_folder()
        e = item.entry
        device = e.device

        def compiled() -> Any:
            model = e.obj()
            if isinstance(model, torch.nn.Module):
                model = model.to(device)
            return torch.compile(model, **e.compile)

        fn = self.made(e.index, compiled)
        args, kwargs = _call_arguments(e.inputs_obj(**item.symbols, device=device))
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
        return None

    def _own_inductor_folder(self) -> None:
        """Inductor's folder, empty and this prewarm's own, before the first compile.

        Inductor looks each graph and kernel up in its own folder before it asks kcache: with
        the user's folder warm (the same machine prewarmed or served before), every lookup hit
        there, nothing reached the store, and a serving process with another folder (a new
        node, container or ``TORCHINDUCTOR_CACHE_DIR``) was cold. In an empty folder, whatever
        the store lacks is compiled and kept, and what it holds is found there ("already
        cached"). Not a fresh-cache scope of torch's (no ``clear_caches``): kcache serves it."""
        if self._folder is not None:
            return
        import os
        import tempfile

        self._was = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        self._folder = tempfile.mkdtemp(prefix="kcache-prewarm-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = self._folder

    def close(self) -> None:
        if self._folder is None:
            return
        import os
        import shutil

        if self._was is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = self._was
        shutil.rmtree(self._folder, ignore_errors=True)
        self._folder = None


class CallableExecutor(KindExecutor):
    """Anything that compiles when called (or a factory that makes it): called on the GPU."""

    def run(self, item: Item, r: ItemResult) -> None:
        import torch

        from .triton_aot import make_value

        e = item.entry
        fn = self.made(e.index, e.obj) if e.is_factory else e.obj
        values = [make_value(v, "cuda", torch=torch) for v in item.args]
        kwargs = {k: make_value(v, "cuda", torch=torch) for k, v in item.kwargs.items()}
        fn(*values, **kwargs)
        torch.cuda.synchronize()
        return None


#: The executor of each kind of entry (the kinds of :data:`kcache.prewarm.spec.ENTRY_KINDS`).
EXECUTORS: dict[str, type[KindExecutor]] = {
    "triton": TritonExecutor,
    "nvfuser": NvfuserExecutor,
    "torch": TorchExecutor,
    "callable": CallableExecutor,
}


def _call_arguments(got: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What a [[torch]] entry's inputs function returned, as (args, kwargs): ``(args, kwargs)``,
    a dict of keyword arguments, a tuple or list of arguments, or one argument."""
    if (
        isinstance(got, tuple)
        and len(got) == 2
        and isinstance(got[1], dict)
        and isinstance(got[0], (tuple, list))
    ):
        return tuple(got[0]), dict(got[1])
    if isinstance(got, dict):
        return (), got
    return (tuple(got) if isinstance(got, (tuple, list)) else (got,)), {}


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
