"""Calls into torch's own functions from kcache's code that torch calls (issue 35).

The torch.compile integration runs inside torch: its wrappers call torch's own functions (a config
read, the autotune cache's lookup, a compile, the compile pool's warm-up, a package's install, the
remote-cache factory...). What those raise is torch's, not kcache's: the caller decides what it
means (usually: leave things as torch left them; torch meets the same error again in its own
path). What kcache's own code around such a call raises is a bug, for the fail-open boundary
(:mod:`kcache.boundary`: one warning, or raised under ``KCACHE_STRICT=1``).

:func:`own` keeps the two apart, in one place: it runs one of torch's functions and turns what
that raises into :class:`TorchRaised` (raised from it), which callers catch by name, so that no
caller has to catch everything around the rest of its code. A bug of kcache's that torch's
function met while it called back into kcache (an edge re-raised it under ``KCACHE_STRICT=1``:
:func:`kcache.boundary.raised_strict`) goes through as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..boundary import raised_strict

T = TypeVar("T")


class TorchRaised(Exception):
    """One of torch's own functions raised (what it raised is ``__cause__``)."""


def own(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a function of torch's: what it raises comes out as
    :class:`TorchRaised`, but for a bug of kcache's that an edge re-raised under strict."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # broad: torch's own function: anything it raises is torch's own
        if raised_strict(e):  # a bug of kcache's, met where torch called back into it
            raise
        raise TorchRaised(f"{type(e).__name__}: {e}") from e
