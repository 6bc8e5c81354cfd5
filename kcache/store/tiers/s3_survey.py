"""What the S3 backend holds: the walk behind ``kcache remote`` for ``s3://`` (``ListObjectsV2``
under the entries' prefix: keys, sizes and, from the keys, kinds; no object is read and nothing
is written). Bounded: each call by ``timeout_s``, at most ``limit`` keys and ``budget_s`` seconds."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from typing import Any, Protocol

from .backend import Answered, Unavailable
from .bounded import bounded
from .s3_http import Response

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
LIST_PAGE = 1000  # keys a ListObjectsV2 call asks for


class Bucket(Protocol):
    """What the walk needs of the S3 backend (:class:`.s3.S3Backend`)."""

    bucket: str
    root: str
    endpoint: str
    region: str

    @property
    def entries_prefix(self) -> str: ...

    def open(self) -> None: ...

    def list_page(self, token: str | None, max_keys: int) -> Response: ...


def survey(b: Bucket, *, limit: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
    """The bucket and what kcache holds there (see the module); failures are in the result."""
    out: dict[str, Any] = {"mode": "bucket", "reachable": False}
    if b.endpoint == "":  # (kcache remote opens it first; open it for any other caller)
        try:
            b.open()
        except (ValueError, TypeError) as e:
            out["error"] = str(e)
            return out
    out.update(bucket=b.bucket, root=b.root, endpoint=b.endpoint, region=b.region)
    by_kind: dict[str, dict[str, int]] = {}
    checked, token, complete = 0, None, False
    deadline = time.monotonic() + budget_s
    try:
        while True:
            t0 = time.perf_counter()
            with bounded(timeout_s, 8 << 20):
                page = min(LIST_PAGE, limit - checked) if limit else LIST_PAGE
                r = b.list_page(token, page)
            if "ping_ms" not in out:
                out["ping_ms"] = round((time.perf_counter() - t0) * 1000, 3)
            if r.status >= 300:
                raise Answered(f"S3 answered {r.status} to a listing")
            out["reachable"] = True
            root = ET.fromstring(r.body)
            for item in root.iter(f"{_NS}Contents"):
                key = item.findtext(f"{_NS}Key") or ""
                size = int(item.findtext(f"{_NS}Size") or 0)
                kind, _, ident = key[len(b.entries_prefix) :].partition("/")
                checked += 1
                if not kind or not ident or "/" in ident:
                    continue
                kk = by_kind.setdefault(kind, {"entries": 0, "bytes": 0})
                kk["entries"] += 1
                kk["bytes"] += size
            token = root.findtext(f"{_NS}NextContinuationToken")
            if (root.findtext(f"{_NS}IsTruncated") or "").lower() != "true" or not token:
                complete = True
                break
            if (limit and checked >= limit) or time.monotonic() > deadline:
                break
    except (Unavailable, Answered, ET.ParseError, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out.update(
        entries=sum(v["entries"] for v in by_kind.values()),
        bytes=sum(v["bytes"] for v in by_kind.values()),
        checked=checked,
        complete=complete,
        by_kind=dict(sorted(by_kind.items())),
    )
    return out
