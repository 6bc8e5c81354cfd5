"""Whether Triton's autotuner can use a cached autotune result (``<fn>.autotune.json``), checked
before kcache serves it.

Triton's ``Autotuner.check_disk_cache`` (3.4 to 3.9) reads the file Triton gets from the cache
manager and does::

    timings = json.load(f)["configs_timings"]
    timings = {Config(**config): timing for config, timing in timings}
    self.cache[tuning_key] = min(timings, key=timings.get)

then runs the kernel with the best config: ``Config``'s parameters (``kwargs``, ``num_warps``,
``num_stages``, ``num_ctas``, ``maxnreg``, ``pre_hook``, ``ir_override``) become the compile's
options and the call's keyword arguments, and a ``pre_hook`` is called before each launch. So a
file whose configs name another parameter raises TypeError inside the user's kernel call; one
whose ``kwargs`` hold a list raises TypeError (``Config`` is hashed); timings that do not compare
raise; and a ``pre_hook`` (JSON cannot hold a function: any value is an attacker's) would be
called, an ``ir_override`` would make Triton compile the IR file it names in place of the
kernel's. Such a file is not served: it is quarantined and Triton tunes again.

What it cannot see: ``kwargs`` that do not name the kernel's meta-parameters fail at the launch
(the autotuner's own configs are not known to the cache manager).
"""

from __future__ import annotations

import inspect
import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.api import Cache
    from ..store.hit import Hit

MAX_FILE = 1 << 20  # bytes (Triton's own: a few hundred per config)
MAX_CONFIGS = 4096
_params: list[frozenset[str]] = []


def _config_params() -> frozenset[str]:
    """The parameters of this Triton's ``Config`` (remembered)."""
    if not _params:
        from triton import Config

        sig = inspect.signature(Config.__init__)
        _params.append(frozenset(p for p in sig.parameters if p != "self"))
    return _params[0]


def _scalar(v: Any) -> bool:
    t = type(v)
    if v is None or t is bool:
        return True
    if t is str:
        return len(v) <= 1024
    return t in (int, float) and math.isfinite(v) and abs(v) < 1 << 63


def _time(x: Any) -> bool:
    # +inf is Triton's time for a config that failed to run (out of resources, ...): it loses
    return type(x) in (int, float) and (math.isfinite(x) or x == math.inf)


def _timing(t: Any) -> tuple[str, int] | None:
    """The shape of a timing (a number, or a list of n numbers), or None when it is not one."""
    if _time(t):
        return ("n", 0)
    if type(t) is list and 0 < len(t) <= 16 and all(_time(x) for x in t):
        return ("l", len(t))
    return None


def problem(blob: bytes) -> str | None:
    """None when this Triton's autotuner can use the cached result ``blob``; else why not."""
    try:
        return _problem(blob)
    except Exception as e:  # broad: judging hostile bytes with Triton's own code: any error says why not
        return f"{type(e).__name__}: {str(e)[:200]}"


def _problem(blob: bytes) -> str | None:
    if len(blob) > MAX_FILE:
        return f"{len(blob)} bytes"
    d = json.loads(blob.decode("utf-8"))
    if type(d) is not dict or type(d.get("configs_timings")) is not list:
        return "no configs_timings list"
    pairs = d["configs_timings"]
    if not 0 < len(pairs) <= MAX_CONFIGS:
        return f"{len(pairs)} configs"
    params = _config_params()
    shapes = set()
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not dict:
            return "a config is not a [config, timing] pair"
        cfg, timing = pair
        unknown = set(cfg) - params
        if unknown:
            return f"a config names {sorted(unknown)[0][:40]!r}, not a parameter of Config"
        if "kwargs" not in cfg or type(cfg["kwargs"]) is not dict:
            return "a config without kwargs"
        for k, v in cfg["kwargs"].items():
            if not (k.isidentifier() and _scalar(v)):
                return f"a config's kwargs {str(k)[:40]!r} = {str(v)[:40]}"
        for k in ("pre_hook", "ir_override"):
            if cfg.get(k) is not None:
                return f"a config with a {k} (never taken from a cache)"
        for k, low in (("num_warps", 1), ("num_ctas", 1), ("num_stages", 0), ("maxnreg", 1)):
            v = cfg.get(k)
            if v is None and k == "maxnreg":
                continue
            if k in cfg and not (type(v) is int and low <= v < 1 << 16):
                return f"a config's {k} = {str(v)[:40]}"
        shape = _timing(timing)
        if shape is None:
            return "a timing that is not a number or a list of numbers"
        shapes.add(shape)
    if len(shapes) > 1:
        return "timings that do not compare"
    if not any(math.isfinite(t if type(t) is not list else t[0]) for _, t in pairs):
        return "every config failed to run: the winner would be one that failed"
    return None


def servable(store: Cache, filename: str, hit: Hit) -> bool:
    """Whether ``get_file`` may hand the cached autotune result ``hit`` to Triton. One this
    Triton's autotuner cannot use, or whose content was quarantined in this process, is
    quarantined and counted as a miss instead: Triton tunes again. Never raises."""
    from ..store.quarantine import judge

    return judge(store, hit.record, lambda: problem(hit.read(filename)), filename)
