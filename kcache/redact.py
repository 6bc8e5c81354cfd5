"""Secrets never printed: one routine, :func:`redact`, for every text that may hold a URL or a
secret (warnings, through a filter on kcache's logger; ``kcache config`` and ``kcache remote``, with
or without ``--json``; exception texts), and the secret values this process was given.

Its own module, below both :mod:`kcache.config` (which remembers the secrets it reads) and
:mod:`kcache.log` (whose filter redacts every message): it imports neither.
"""

from __future__ import annotations

import re
from typing import Any

# It does not parse URLs the way a valid one would be parsed: it masks whatever a URL library could
# take for a password, in any form redis-py accepts and in ones it refuses.
_SECRETS: set[str] = set()  # secret values this process was given (see remember_secret)
MIN_SECRET = 4  # shorter values are not masked wherever they appear (a password "a"...)
# A URL anywhere in a text: any scheme, in any case (REDIS://, Redis://, redis+sentinel://, ...),
# up to the next whitespace: a password may hold quotes, '@', '/', '#', '?' and '%'.
_URL_RE = re.compile(r"(?i)([a-z][a-z0-9+.-]*://)(\S*)")
_QUERY_SECRET_RE = re.compile(r"(?i)([?&;][^=&#\s]*(?:pass|secret|token|auth|cred)[^=&#\s]*=)[^&#\s]*")
_SAFE_USER_RE = re.compile(r"^[A-Za-z0-9._~-]{0,64}$")
_BAD_PORT_RE = re.compile(r"^((?:\[[^\]/?#]*\])?[^/?#:\[]*):(?![0-9]*(?:[/?#]|$))[^/?#]*")


def _redact_one(m: re.Match[str]) -> str:
    scheme, rest = m.group(1), m.group(2)
    at = rest.rfind("@")  # urllib and redis-py split the user info at the LAST '@'
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        rest = (f"{user}:***" if colon and _SAFE_USER_RE.match(user) else "***") + rest[at:]
    else:  # no user info; a "port" that is not a number may be a password without its '@'
        rest = _mask_bad_ports(rest)
    return scheme + _QUERY_SECRET_RE.sub(r"\1***", rest)


def _mask_bad_ports(rest: str) -> str:
    """The authority's first ``host:port`` whose port is not a number, masked with all that
    follows it up to the path (a cluster URL lists ``host:port,host:port``; a password typed
    where a port goes may hold ',' too)."""
    cut = len(rest)
    for sep in "/?#":
        i = rest.find(sep)
        if 0 <= i < cut:
            cut = i
    hosts = rest[:cut].split(",")
    for i, h in enumerate(hosts):
        m = _BAD_PORT_RE.match(h)
        if m:
            return ",".join([*hosts[:i], m.group(1) + ":***"]) + rest[cut:]
    return rest


def redact(text: Any) -> str:
    """``text`` with every password a URL in it may hold (its user info, a ``password=`` or other
    credential query option) and every secret value this process was given
    (:func:`remember_secret`) replaced by ``***``."""
    out = str(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in out:
            out = out.replace(secret, "***")
    return _URL_RE.sub(_redact_one, out)


redact_url = redact  # the earlier name, for a URL alone


def remember_secret(value: Any) -> None:
    """A secret value (a password, ``KCACHE_SECRET``): :func:`redact` masks it wherever it appears,
    also in texts kcache did not write (an exception's message)."""
    from urllib.parse import unquote

    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
    for v in {text, unquote(text)}:
        if len(v) >= MIN_SECRET:
            _SECRETS.add(v)


def _remember_url_secrets(url: str) -> None:
    """The password of a URL (all its user info after the first ':', up to the last '@')."""
    rest = url.strip().partition("://")[2] or url  # the whole of it: a password may hold spaces
    info = rest[: rest.rfind("@")] if "@" in rest else ""
    if info:
        user, colon, password = info.partition(":")
        remember_secret(password if colon else user)
