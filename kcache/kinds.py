"""Every kind of entry kcache stores, in one place, with the trust rules that go with it.

A kind names what an entry holds; the store itself treats every kind alike (records and bytes).
What differs is where an entry may come from:

- ``host_code``: bytes that end up executed on the CPU (Triton's launcher ``.so`` files, loaded
  with dlopen). Served only from the local store, which passed its ownership checks; from a
  bundle or a shared tier only when signed with ``KCACHE_SECRET``; otherwise rebuilt locally.
- ``pickled``: opaque bytes that the owning library unpickles (Inductor's cache entries). kcache
  never loads them itself; like host code, they cross machines only when signed.
- ``signed_only``: small data that steers what a library compiles, with nothing to check it
  against (Dynamo's float restarts: a wrong one specialises a float torch would have kept
  symbolic). Crosses machines only when signed, as the entries it goes with do.
- ``machine_local``: answers about this machine's own files (``ptxas --version``, the digest of
  libtriton), which steer Triton's key and toolchain: never exported, never imported, never taken
  from or given to a shared tier. A wrong one would break or poison every compile.

Integrations declare their kinds in their own package (``declare.py``, read through
:mod:`kcache.registry`) and this module gathers them, so that the command line can refuse a
misspelt ``--kind`` and bundles and the shared tier apply the rules above.
"""

from __future__ import annotations

import re

from . import registry

#: An entry id: the first 40 hex digits of a sha256 (see :func:`kcache.store.records.entry_id`).
ENTRY_ID_RE = re.compile(r"[0-9a-f]{40}")


class Kind:
    """A kind of entry and its trust rules (a plain class: this module loads at start-up)."""

    __slots__ = ("name", "what", "host_code", "pickled", "signed_only", "machine_local", "inner")

    def __init__(
        self,
        name: str,
        what: str,
        *,
        host_code: bool = False,
        pickled: bool = False,
        signed_only: bool = False,
        machine_local: bool = False,
        inner: bool = False,
    ) -> None:
        self.name, self.what = name, what
        self.host_code, self.pickled, self.machine_local = host_code, pickled, machine_local
        self.signed_only = signed_only
        # made inside another entry's compile (a graph's kernels): its saved time is credited once
        self.inner = inner

    @property
    def needs_signature(self) -> bool:
        """True when entries of this kind are taken from a bundle or shared tier only if signed."""
        return self.host_code or self.pickled or self.signed_only

    def __repr__(self) -> str:
        return f"Kind({self.name!r})"


#: The machine-local memos of every integration (``kcache.memo``: tool versions, the libtriton
#: digest, Inductor's CPU vector-ISA probes). Its name is historical: stores have entries of it.
TRITON_META = "triton-meta"

_CORE = (
    Kind(
        TRITON_META,
        "remembered tool versions, libtriton digest and CPU ISA probes (this machine only)",
        machine_local=True,
        inner=True,
    ),
)


def _declared() -> tuple[dict[str, Kind], frozenset[str]]:
    """The kinds every registered integration declares (:mod:`kcache.registry`), and the
    counter-only names among them."""
    kinds = {k.name: k for k in _CORE}
    counters = set()
    for d in registry.declarations():
        for name, (what, traits) in d.kinds.items():
            if "counter_only" in traits:
                counters.add(name)
                continue
            kinds[name] = Kind(name, what, **{t: True for t in traits})
    return kinds, frozenset(counters)


KINDS, COUNTER_ONLY = _declared()

#: Names that ``--kind`` accepts: the kinds of entries and the counter-only names.
KNOWN = frozenset(KINDS) | COUNTER_ONLY


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
