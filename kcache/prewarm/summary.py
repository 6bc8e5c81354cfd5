"""What a prewarm did: each item's result, the summary of them all, and the progress bar."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import counted

STATUSES = ("prepared", "cached", "failed", "skipped", "planned")


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
    stored: dict[str, int] = field(default_factory=dict)  # entries written into the store, by kind
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
            "stored": self.stored(),
        }

    def stored(self) -> dict[str, int]:
        """Entries this prewarm wrote into the store, by kind."""
        out: dict[str, int] = {}
        for i in self.items:
            for kind, n in i.stored.items():
                out[kind] = out.get(kind, 0) + n
        return dict(sorted(out.items()))

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
            lines.append(f"  dry run: {counted(len(self.items), 'item')} would be prepared")
            for i in self.items:
                lines.append(f"    {i.label}" + (f"  [{i.reason}]" if i.reason else ""))
            return "\n".join(lines)
        lines.append(
            f"  {counted(t['items'], 'item')}: {t['prepared']} prepared, {t['cached']} already cached, "
            f"{t['failed']} failed, {t['skipped']} skipped  ({counted(t['kernel_compiles'], 'kernel compile')}, "
            f"{counted(t['launcher_builds'], 'launcher build')}"
            + (
                f", {counted(t['utils_builds'], 'driver utility', 'driver utilities')} built"
                if t["utils_builds"]
                else ""
            )
            + (f", {counted(t['autotune_results'], 'autotune result')}" if t["autotune_results"] else "")
            + f"; {self.seconds:.1f} s)"
        )
        stored = t["stored"]
        lines.append(
            "  into the store: " + ", ".join(f"{n} {kind}" for kind, n in stored.items())
            if stored
            else "  into the store: nothing new (the store held all of it)"
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


class Progress:
    """A one-line bar on stderr when it is a terminal (or when forced); a callable gets results.

    The bar is drawn at once and names the item being prepared with its seconds so far, redrawn
    every second (a 22 s torch.compile item showed nothing for 15 s: the bar came with the first
    result); it is erased at the end, so that the summary stands alone (docs/usage.md)."""

    TICK_S = 1.0

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
        self._current: tuple[str, float] | None = None  # (label, started) of the item under way
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.bar and total:
            self._draw()
            # Items take seconds to minutes each (a torch.compile): the seconds go on counting.
            self._ticker = threading.Thread(target=self._tick, name="kcache-prewarm-progress", daemon=True)
            self._ticker.start()

    def start(self, label: str) -> None:
        """An item is being prepared now (shown until its result comes)."""
        self._current = (label, time.monotonic())
        if self.bar:
            self._draw()

    def update(self, r: ItemResult) -> None:
        self.done += 1
        self.counts[r.status] = self.counts.get(r.status, 0) + 1
        self._current = None
        if self.callback is not None:
            with contextlib.suppress(Exception):  # broad: the caller's callback; its errors are its own
                self.callback(r)
        if self.bar:
            self._draw(r.label)

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            if self._current is not None:
                self._draw()

    def _draw(self, last: str | None = None) -> None:
        n = 24
        filled = int(n * self.done / max(self.total, 1))
        text = (
            f"[{'#' * filled}{'.' * (n - filled)}] {self.done}/{self.total} "
            f"ok {self.counts['prepared'] + self.counts['cached']} failed {self.counts['failed']}  "
        )
        cur = self._current
        if cur is not None:
            text += f"{cur[0][:60]} ({time.monotonic() - cur[1]:.0f} s)"
        elif last is not None:
            text += last[:60]
        elif not self.done:
            text += "starting"
        with self._lock:
            if self._stop.is_set():
                return
            pad = max(0, self._width - len(text))
            self._width = len(text)
            with contextlib.suppress(OSError, ValueError):  # a closed stream: the bar stops
                sys.stderr.write("\r" + text + " " * pad)
                sys.stderr.flush()

    def close(self) -> None:
        """Stop the bar and erase its line."""
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join(timeout=2.0)
        with self._lock:
            self._stop.set()
            if self.bar and self._width:
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write("\r" + " " * self._width + "\r")
                    sys.stderr.flush()
            self._width = 0
