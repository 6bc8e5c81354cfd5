"""Progress of a long maintenance command (verify, export, import, clear, trim) on a terminal.

One line on stderr, redrawn at most ten times a second, erased when the command ends, so that
what the command prints afterwards stands alone. Nothing at all when stderr is not a terminal
(a script, a pipe, CI), with ``--json``, or for small jobs: shown only for a job of at least
:data:`MIN_TOTAL` items, or one that has run for :data:`SHOW_AFTER_S` already.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

#: A job of this many items shows progress from its start.
MIN_TOTAL = 1000
#: A smaller (or uncounted) job shows progress once it has run this long.
SHOW_AFTER_S = 1.0
_EVERY_S = 0.1


def on_terminal(stream: Any = None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):  # a closed or foreign stream
        return False


class Progress:
    """``with Progress("verify", total) as p: ... p(1)``: a callable that counts ``n`` more done.

    ``unit="bytes"`` shows sizes. ``enabled=False`` (``--json``) and a stream that is not a
    terminal draw nothing; counting still works (:attr:`done`)."""

    def __init__(
        self,
        what: str,
        total: int | None = None,
        *,
        enabled: bool = True,
        unit: str = "entries",
        stream: TextIO | None = None,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled and on_terminal(self.stream)
        self.done = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self._width = 0

    def __enter__(self) -> Progress:
        if self.enabled and self.total is not None and self.total >= MIN_TOTAL:
            self._draw()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < _EVERY_S:
            return
        big = self.total is not None and self.total >= MIN_TOTAL
        if big or now - self._t0 >= SHOW_AFTER_S:
            self._draw(now)

    def _amount(self, n: float) -> str:
        if self.unit == "bytes":
            from ..config import format_size

            return format_size(n)
        return f"{int(n):,}"

    def _draw(self, now: float | None = None) -> None:
        self._last = time.monotonic() if now is None else now
        text = f"{self.what}: {self._amount(self.done)}"
        if self.total:
            pct = min(100.0, 100.0 * self.done / self.total)
            text += f" of {self._amount(self.total)}" + ("" if self.unit == "bytes" else f" {self.unit}")
            text += f" ({pct:.0f}%)"
        elif self.unit != "bytes":
            text += f" {self.unit}"
        elapsed = self._last - self._t0
        if self.total and self.done and elapsed > 2:
            left = elapsed * (self.total - self.done) / self.done
            text += f", about {left:.0f} s left"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream or a broken pipe: progress stops
            self.enabled = False

    def close(self) -> None:
        """Erase the line (the command's own output follows on a clean line)."""
        if self.enabled and self._width:
            try:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
            except (OSError, ValueError):  # as above
                pass
        self._width = 0
        self.enabled = False
