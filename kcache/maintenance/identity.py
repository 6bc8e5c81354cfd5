"""This machine's identity as the keys see it, named part by part: what ``kcache fingerprint
--json`` writes, and the side ``kcache explain --against`` compares another one with.

Each part is one that enters some kind's key (which kinds: :func:`applies`): ``KCACHE_KEY_TAG``
(every kind's), the machine's own (the Python ABI, the GPU's model, architecture and driver, the
device ordinal the process uses), and those each integration declares for its library in its
package (:mod:`kcache.registry`: its builds, toolchain, cache-invalidating variables, and folders
hashed into its keys, as digests, never as paths: a fingerprint file travels between machines
and into tickets). Which of its kinds a part enters each integration declares too.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from .. import registry

FORMAT = "kcache-fingerprint"
VERSION = 1

#: Words for the machine's own parts in explain's table (each integration declares its own).
WHAT = {
    "key_tag": "KCACHE_KEY_TAG",
    "python_abi": "Python ABI",
    "gpu_name": "GPU model",
    "arch": "GPU architecture",
    "device": "device ordinal (CUDA_VISIBLE_DEVICES / KCACHE_DEVICE)",
    "driver": "CUDA driver",
}


def _matches(part: str, names: tuple[str, ...]) -> bool:
    return any(part == n or (n.endswith(".") and part.startswith(n)) for n in names)


def applies(part: str, kind: str) -> bool:
    """Whether ``part`` enters the key of entries of ``kind`` (``KCACHE_KEY_TAG`` enters all)."""
    if part == "key_tag":
        return True
    return any(_matches(part, d.keyed_by.get(kind, ())) for d in registry.declarations())


def describe(part: str) -> str:
    for d in registry.declarations():
        for name, words in d.words.items():
            if part == name:
                return words
            if name.endswith(".") and part.startswith(name):
                return f"{words} {part[len(name) :]}"
    return WHAT.get(part, part)


def this_machine(key_tag: str, *, with_digest: bool = True) -> dict[str, Any]:
    """The parts of this process's identity, by name (None: absent here, e.g. no GPU).
    ``with_digest``: the parts that take time too (library digests, a toolchain's version)."""
    from .. import fingerprint

    parts: dict[str, Any] = {
        "key_tag": key_tag,
        "python_abi": fingerprint.current("python_abi"),
        "gpu_name": fingerprint.current("gpu_name"),
        "arch": fingerprint.current("arch"),
        "driver": fingerprint.current("driver"),
        "device": os.environ.get("KCACHE_DEVICE") or os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    for d in registry.declarations():
        if d.identity is not None:
            parts.update(registry.resolve(d.identity)(with_digest))
    return parts


def document(key_tag: str) -> dict[str, Any]:
    """What ``kcache fingerprint --json`` writes."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": time.time(),
        "python": sys.version.split()[0],
        "parts": this_machine(key_tag),
    }


def read_document(data: Any) -> dict[str, Any] | None:
    """The parts of a fingerprint document, or None when ``data`` is not one."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("parts"), dict):
        return None
    return {str(k): v for k, v in data["parts"].items() if v is None or isinstance(v, (str, int, float))}
