"""Every kind of entry kcache stores, in one place, with the trust rules that go with it.

A kind names what an entry holds; the store itself treats every kind alike (records and bytes).
What differs is where an entry may come from:

- ``host_code``: bytes that end up executed on the CPU (Triton's launcher ``.so`` files, loaded
  with dlopen). Served only from the local store, which passed its ownership checks; from a
  bundle or a shared tier only when signed with ``KCACHE_SECRET``; otherwise rebuilt locally.
- ``pickled``: opaque bytes that the owning library unpickles (Inductor's cache entries). kcache
  never loads them itself; like host code, they cross machines only when signed.
- ``machine_local``: answers about this machine's own files (``ptxas --version``, the digest of
  libtriton), which steer Triton's key and toolchain: never exported, never imported, never taken
  from or given to a shared tier. A wrong one would break or poison every compile.

Integrations name their kinds here (and nowhere else), so that the command line can refuse a
misspelt ``--kind`` and bundles and the shared tier apply the rules above.
"""

from __future__ import annotations

import re

#: An entry id: the first 40 hex digits of a sha256 (see :func:`kcache.store.records.entry_id`).
ENTRY_ID_RE = re.compile(r"[0-9a-f]{40}")


class Kind:
    """A kind of entry and its trust rules (a plain class: this module loads at start-up)."""

    __slots__ = ("name", "what", "host_code", "pickled", "machine_local")

    def __init__(
        self,
        name: str,
        what: str,
        *,
        host_code: bool = False,
        pickled: bool = False,
        machine_local: bool = False,
    ) -> None:
        self.name, self.what = name, what
        self.host_code, self.pickled, self.machine_local = host_code, pickled, machine_local

    @property
    def needs_signature(self) -> bool:
        """True when entries of this kind are taken from a bundle or shared tier only if signed."""
        return self.host_code or self.pickled

    def __repr__(self) -> str:
        return f"Kind({self.name!r})"


TRITON = "triton"
TRITON_AUTOTUNE = "triton-autotune"
TRITON_AUX = "triton-aux"
TRITON_META = "triton-meta"
NVFUSER = "nvfuser"
NVFUSER_MANIFEST = "nvfuser-manifest"
NVFUSER_LEGACY = "nvfuser-legacy"
INDUCTOR_FX = "inductor-fx"
INDUCTOR_AOT = "inductor-aot"
INDUCTOR_AUTOTUNE = "inductor-autotune"
INDUCTOR_PGO = "inductor-pgo"
INDUCTOR_PRECOMPILE = "inductor-precompile"
INDUCTOR_CPP = "inductor-cpp"
INDUCTOR_OTHER = "inductor-other"

#: Counter-only names (no entries): the nvFuser fusion cache's in-process hits and misses.
NVFUSER_FUSION = "nvfuser-fusion"

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(TRITON, "a compiled Triton kernel: its group of files (IR, binary, metadata)"),
        Kind(TRITON_AUTOTUNE, "Triton autotune timings and best config, for one GPU model"),
        Kind(TRITON_AUX, "a Triton launcher or utility shared object (host code)", host_code=True),
        Kind(
            TRITON_META,
            "remembered tool versions, libtriton digest and CPU ISA probes (this machine only)",
            machine_local=True,
        ),
        Kind(NVFUSER, "a compiled nvFuser kernel (CUDA source and cubin)"),
        Kind(NVFUSER_MANIFEST, "the list of nvFuser kernels of one toolchain fingerprint"),
        Kind(NVFUSER_LEGACY, "a serialized legacy nvFuser FusionCache"),
        Kind(INDUCTOR_FX, "an Inductor FX graph cache entry (torch pickle)", pickled=True),
        Kind(INDUCTOR_AOT, "an AOTAutograd cache entry (torch pickle)", pickled=True),
        Kind(INDUCTOR_AUTOTUNE, "Inductor autotune results and max-autotune choices"),
        Kind(INDUCTOR_PGO, "Dynamo's profile of dynamic dimensions (automatic dynamic)", pickled=True),
        Kind(INDUCTOR_PRECOMPILE, "a Dynamo caching-precompile artifact (torch pickle)", pickled=True),
        Kind(INDUCTOR_CPP, "an Inductor CPU kernel: a C++ shared object (host code)", host_code=True),
        Kind(INDUCTOR_OTHER, "another torch.compile cache artifact (torch pickle)", pickled=True),
    )
}

#: Names that ``--kind`` accepts: the kinds of entries and the counter-only names.
KNOWN = frozenset(KINDS) | {NVFUSER_FUSION}


def get(name: str) -> Kind:
    """The kind named ``name``; an unknown name (a newer kcache's kind) gets the strictest rules."""
    k = KINDS.get(name)
    if k is None:
        return Kind(
            name, "a kind this kcache does not know", host_code=True, pickled=True, machine_local=True
        )
    return k


def needs_signature(name: str) -> bool:
    return get(name).needs_signature


def machine_local(name: str) -> bool:
    return get(name).machine_local


def valid_id(ident: object) -> bool:
    """True for an entry id as the store makes them: ids from an index row, a bundle or a
    directory listing are checked before they become paths."""
    return isinstance(ident, str) and ENTRY_ID_RE.fullmatch(ident) is not None
