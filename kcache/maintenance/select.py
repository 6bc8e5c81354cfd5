"""What ``inspect`` and ``clear`` select entries by, besides kind and age: a name (the kernel,
the model or the graph an entry holds) or an entry id.

An entry's name is what its record's summary calls it (``name``: a Triton kernel, a compiled
graph's function; ``kernel``; ``file``: a launcher or a C++ kernel), else the ``kernel``
component of its key. A pattern with ``*``, ``?`` or ``[`` is a glob over the whole name
(``add_*``); plain text matches names that contain it (``softmax`` matches ``softmax_kernel``),
case-sensitively, as ``pip cache list`` matches wheel names.
"""

from __future__ import annotations

import fnmatch
import re

from ..store import Record
from ..store.api import Admin

_HEX = re.compile(r"^[0-9a-f]{1,40}$")


def entry_name(rec: Record | None) -> str:
    """What the entry holds, in a word ("" when its record does not say)."""
    if rec is None:
        return ""
    for k in ("name", "kernel", "file"):
        v = rec.summary.get(k)
        if v:
            return str(v)
    v = rec.components.get("kernel")
    return str(v) if v else ""


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def name_matches(name: str, pattern: str) -> bool:
    if not name:
        return False
    return fnmatch.fnmatchcase(name, pattern) if is_glob(pattern) else pattern in name


def looks_like_id(text: str) -> bool:
    """A prefix of an entry id (hex digits)."""
    return bool(_HEX.match(text.lower()))


def ids_with_prefix(store: Admin, prefix: str) -> list[str]:
    """The ids of the entries on disk that start with ``prefix`` (sorted)."""
    p = prefix.lower()
    return sorted(i for i in store.iter_entry_ids() if i.startswith(p))


def group_key(rec: Record | None, kind: str | None) -> str:
    """The group an entry is counted under in ``inspect --group``: its name, else its kind."""
    name = entry_name(rec)
    return name if name else f"({kind or '?'}, unnamed)"
