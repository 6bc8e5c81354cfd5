"""The legacy ``nvfuser`` frontend (0.2.35 and older): its FusionCache serialization, kept by kcache.

The legacy frontend can write its whole cache (fusion definitions, schedules and compiled kernels)
to one flatbuffer, ``FusionCache.get().serialize(path)``, and read it back into an empty cache,
``deserialize(path)``. Its own automatic serialization
(``nvfuser.enable_automatic_serialization()``) keeps one file per device and CUDA version in
``$TMPDIR/nvfuser_kernel_db/``, shared by every process and every nvFuser version.

kcache instead keeps it as one ``nvfuser-legacy`` entry per fingerprint and device: at import it
creates the FusionCache without nvFuser's default workspace and loads the stored one, at exit (and
on :func:`kcache.nvfuser.flush`) it serializes the cache and replaces the entry when it changed.
Two processes that exit at the same time: the last one's cache wins (each holds everything it
loaded plus what it added; nothing is torn, the replacement is under the store's lock).

The KernelDb side (:mod:`kcache.nvfuser.kerneldb`) works for the legacy module as for
``nvfuser_direct``. Not tested against a real legacy nvFuser (none runs on torch 2.11).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from types import ModuleType
from typing import Any

from ..log import logger, warn_once
from .declare import NVFUSER_LEGACY as KIND

MEMBER = "fusion_cache.fb"
MAX_FUSIONS = 16384  # the binding's default for FusionCache.get


def _device() -> int | None:
    """The device the legacy frontend associates its cache with (``LOCAL_RANK``, as it does)."""
    v = os.environ.get("LOCAL_RANK")
    return int(v) if v is not None and v.strip().isdigit() else None


class LegacyFusionCache:
    """Loads the stored FusionCache into a fresh legacy nvFuser process and stores it back."""

    def __init__(self, module: ModuleType, session: Any) -> None:
        self.module = module
        self.session = session
        self.device = _device()
        self.loaded_digest: str | None = None
        self.saved_digest: str | None = None

    @property
    def key(self) -> str:
        return f"{self.session.fp.hash}/device={self.device}"

    @classmethod
    def install(cls, module: ModuleType, session: Any) -> LegacyFusionCache | None:
        fc = getattr(module, "FusionCache", None)
        if fc is None or not hasattr(fc, "serialize") or not hasattr(fc, "deserialize"):
            return None
        self = cls(module, session)
        try:
            self.load()
        except Exception as e:  # broad: nvFuser's C++ raises what it meets; the cache starts empty
            warn_once("nvfuser-legacy-load", f"nvfuser: could not load the stored fusion cache: {e}")
        return self

    def _cache(self, load_default: bool = False) -> Any:
        return self.module.FusionCache.get(
            max_fusions=MAX_FUSIONS, selected_device=self.device, load_from_default_workspace=load_default
        )

    def load(self) -> bool:
        """Create the FusionCache (without nvFuser's shared /tmp workspace) and, when the store
        holds one for this fingerprint and device, deserialize it. True when loaded."""
        cache = self._cache(load_default=False)
        if cache.num_fusions() != 0:
            return False  # deserialize needs an empty cache
        store = self.session.store
        hit = store.get(KIND, self.key, components=lambda: dict(self.session.fp.components))
        if hit is None:
            return False
        try:
            cache.deserialize(hit.paths[MEMBER])
        except Exception as e:  # broad: nvFuser's C++ raises what it meets
            # nvFuser checks the device and CUDA version itself; a mismatch leaves a half-read
            # cache, which reset() empties.
            logger.info("nvfuser: stored fusion cache not loaded: %s", e)
            with contextlib.suppress(Exception):  # broad: nvFuser's C++ again, on a cache it half-read
                self.module.FusionCache.reset()
            return False
        self.loaded_digest = hit.record.files[0].sha256 if hit.record.files else None
        return True

    def save(self) -> bool:
        """Serialize the FusionCache and store it if it differs from what was loaded or saved."""
        store = self.session.store
        if store is None or store.readonly or self.session.pid != os.getpid():
            return False
        cache = self._cache(load_default=False)
        if cache.num_fusions() == 0:
            return False
        path = os.path.join(self.session.root, f"fusion_cache.{os.getpid()}.fb")
        try:
            cache.serialize(path)
            with open(path, "rb") as f:
                blob = f.read()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        digest = hashlib.sha256(blob).hexdigest()
        if not blob or digest in (self.loaded_digest, self.saved_digest):
            return False
        lk = store.lock(KIND, self.key, timeout=20.0)
        try:
            store.forget(KIND, self.key)
            hit = store.put(
                KIND,
                self.key,
                {MEMBER: blob},
                components=dict(self.session.fp.components),
                summary={
                    "fusions": cache.num_fusions(),
                    "device": self.device,
                    "arch": self.session.fp.components.get("arch"),
                    "nvfuser": self.session.fp.components.get("nvfuser_build"),
                },
            )
        finally:
            if lk is not None:
                lk.release()
        if hit is not None:
            self.saved_digest = digest
        return hit is not None
