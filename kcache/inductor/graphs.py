"""An AOTAutograd entry and the FX graphs it names: kept, served and dropped together.

An AOTAutograd cache entry does not hold the compiled graphs: it names them by their FX graph
cache keys, and on a hit torch looks each one up in the FX graph cache. If one is missing (the
user turned kcache's FX cache off, ``kcache clear --kind inductor-fx``, an eviction that took the
FX entry and left the AOT one), torch pays for an AOT fetch and an unpickle, misses, compiles
anyway, and under ``strict_autograd_cache`` raises ``FXGraphCacheMiss`` into the program;
``standalone_compile(...).save()`` then finds the AOT artifact recorded twice.

So kcache serves an AOT entry only together with its FX graphs: it reads the keys the entry
names, fetches those FX entries from the store at once (they are handed to torch's FX lookups
that follow, from memory: an eviction in between cannot split them), and when one is missing
the AOT entry is a miss, and is removed (an entry whose graphs are gone is of no use to anyone).
It keeps an AOT entry only when the FX graphs it names are in the store already (torch saves
the FX graphs first).

The keys are read from the entry's bytes without unpickling anything: the envelope is JSON with
a base64 pickle, and :mod:`.pickleops` walks the pickle's opcodes (it builds no object and
imports no pickle module). That is done once, when the entry is kept: the keys are stored beside
it (a second file of the entry, covered by the record's checksums like the first), and a served
process reads that list instead of decoding and walking the entry again at every lookup (on the
H100, a BERT-base AOTAutograd lookup cost 14-16 ms through kcache against 3 ms in Inductor's
folder). Entries kept before that list existed are read the old way. An entry that does not
name its graphs the way torch 2.8-2.13 does (``CompiledForward`` with an ``fx_graph_cache_info``
key string; bundled entries hold their graphs and name none) is served and kept as it is.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import OrderedDict
from typing import Any

from ..forksafe import module_lock
from .pickleops import PickleFormatError, unicode_strings

FX_KEY = re.compile(r"f[a-z2-7]{51}")
#: The classes of an AOTAutograd entry that names FX graphs by key (not bundled ones).
NAMING_CLASSES = frozenset({"CompiledForward", "CompiledBackward"})
MAX_PREFETCHED = 16  # FX entries held for torch's next lookups (a hit needs two: forward, backward)

_lock = module_lock(__name__, "_lock")
_prefetched: OrderedDict[str, Any] = OrderedDict()  # torch's FX remote key -> the store's hit


class Unreadable(ValueError):
    """The entry's bytes are not in the form kcache knows."""


def pickle_of(data: bytes) -> bytes:
    """The pickle inside torch's remote-cache envelope (JSON around base64: ``{"data": ...}``).
    :class:`Unreadable` when the bytes are not that."""
    try:
        envelope = json.loads(data)
        return base64.b64decode(envelope["data"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise Unreadable(f"not torch's envelope: {e}") from None


def fx_keys(data: bytes) -> list[str]:
    """The FX graph cache keys an AOTAutograd entry (Inductor's remote-cache bytes) names, in
    order, without repeats; [] for an entry that names none (bundled). :class:`Unreadable` when
    the bytes are not JSON around a base64 pickle."""
    payload = pickle_of(data)
    try:
        strings = unicode_strings(payload)
    except PickleFormatError as e:  # a truncated or foreign pickle: say so, never guess
        raise Unreadable(f"not a pickle kcache can read: {e}") from None
    if not NAMING_CLASSES.intersection(strings):
        return []
    return list(dict.fromkeys(s for s in strings if FX_KEY.fullmatch(s)))


MAX_NAMED = 64  # FX graphs one AOTAutograd entry names (a forward and a backward; room to spare)
#: How this kcache reads the FX keys out of an entry (:data:`NAMING_CLASSES`, :data:`FX_KEY`,
#: :mod:`.pickleops`). A kept list records it, and a list kept by another reading is not
#: trusted: the entry is walked again. Bump it whenever :func:`fx_keys` would answer otherwise
#: (a torch that names its graphs another way), so no list written by an older kcache, on this
#: machine or through a shared tier, stands in for what this one would read.
READING = 1


def encode_keys(keys: list[str]) -> bytes:
    """The FX keys an AOTAutograd entry names, as kept beside it (:data:`.entries.KEYS`)."""
    return json.dumps({"reading": READING, "keys": keys}, separators=(",", ":")).encode()


def decode_keys(raw: bytes) -> list[str] | None:
    """The list :func:`encode_keys` wrote; None when another reading wrote it (walk the entry).
    :class:`Unreadable` unless it holds a JSON list of at most :data:`MAX_NAMED` distinct FX
    keys, what :func:`fx_keys` can return: a file changed by someone else, whatever its size or
    nesting, is a miss, not an error."""
    if len(raw) > MAX_NAMED * 64:
        raise Unreadable(f"a list of FX keys of {len(raw)} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        raise Unreadable(f"not a list of FX keys: {e}") from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if (
        not isinstance(keys, list)
        or len(keys) > MAX_NAMED
        or not all(isinstance(k, str) and FX_KEY.fullmatch(k) for k in keys)
        or len(set(keys)) != len(keys)  # (strings only, by now: hashable)
    ):
        raise Unreadable("not a list of FX keys")
    reading = doc.get("reading")
    return keys if type(reading) is int and reading == READING else None


def kept_list_problem(value: bytes, kept: bytes) -> str | None:
    """``kcache verify``: why an AOTAutograd entry's kept list cannot stand for its pickle (it
    is not one, or it names other graphs than the entry does), or None."""
    try:
        keys = decode_keys(kept)
    except Unreadable as e:
        return f"its list of FX graphs is unreadable ({e})"
    if keys is None:
        return None  # kept by another reading: lookups walk the entry itself
    try:
        named = fx_keys(value)
    except Unreadable as e:
        return f"it has a list of FX graphs but no entry kcache can read ({e})"
    return None if named == keys else "its list of FX graphs is not the one its pickle names"


def hold(fx_remote_key: str, data: Any) -> None:
    """Keep an FX entry fetched with its AOT entry (the store's hit) for torch's FX lookup that
    follows."""
    with _lock:
        _prefetched[fx_remote_key] = data
        _prefetched.move_to_end(fx_remote_key)
        while len(_prefetched) > MAX_PREFETCHED:
            _prefetched.popitem(last=False)


def take(fx_remote_key: str) -> Any:
    """The FX entry held for this lookup (once), or None."""
    with _lock:
        return _prefetched.pop(fx_remote_key, None)


def clear() -> None:
    with _lock:
        _prefetched.clear()


def uninstall() -> None:
    """kcache.disable(): nothing is held for torch's lookups any more (graphs patches nothing)."""
    clear()


def fx_remote_key(fx_key: str) -> str:
    """torch's remote-cache key for an FX graph cache key (``pt2:fx-graph-v1::<key>:c1``, or the
    form seen in this process's own FX lookups)."""
    head, tail = _FX_KEY_FORM
    return f"{head}{fx_key}{tail}"


_FX_KEY_FORM = ["pt2:fx-graph-v1::", ":c1"]
_REMOTE_FX_KEY = re.compile(r"(.*::)(f[a-z2-7]{51})(:c[0-9]+)")
_learned: list[bool] = []


def learn(remote_key: str) -> None:
    """Take the form of torch's FX remote keys from one seen in this process."""
    m = _REMOTE_FX_KEY.fullmatch(remote_key)
    if m is not None:
        _FX_KEY_FORM[:] = [m.group(1), m.group(3)]
        if not _learned:
            _learned.append(True)


def form_known() -> bool:
    """The form of torch's FX remote keys is known: seen in this process's own FX lookups, or
    read from torch's FX remote cache object (else it is torch 2.8-2.13's, assumed)."""
    if not _learned:
        _learn_from_torch()
    return bool(_learned)


def _learn_from_torch() -> None:
    import sys

    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None:
        return
    from .torchcall import TorchRaised
    from .torchcall import own as torchs

    try:
        fmt = getattr(torchs(codecache.FxGraphCache.get_remote_cache), "_key_fmt", None)
    except (TorchRaised, AttributeError):  # torch's remote-cache factory (it varies between
        return  # versions and configs), or a torch without it
    if isinstance(fmt, str) and fmt.count("{key}") == 1 and "{" not in fmt.replace("{key}", ""):
        head, tail = fmt.split("{key}")
        _FX_KEY_FORM[:] = [head, tail]
        _learned.append(True)
