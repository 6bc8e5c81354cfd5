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
# take for a password, in any form redis-py accepts and in ones it refuses; and nothing else (a
# host, a port, a path, kcache's own "redis://host:port/db" in a message, the quotes around a
# value are never masked: issue 36).
_SECRETS: set[str] = set()  # secret values this process was given (see remember_secret)
MIN_SECRET = 4  # shorter values are not masked wherever they appear (a password "a"...)
# A URL anywhere in a text: any scheme, in any case (REDIS://, Redis://, redis+sentinel://, ...),
# up to the next whitespace: a password may hold quotes, '@', '/', '#', '?' and '%'.
_URL_RE = re.compile(r"(?i)([a-z][a-z0-9+.-]*://)(\S*)")
#: A query option that is a credential: password=, secret=, token=, auth=, credentials=,
#: X-Amz-Signature=, X-Amz-Credential=, X-Amz-Security-Token= (a presigned URL's), ...
_QUERY_SECRET_RE = re.compile(
    r"(?i)([?&;][^=&#\s]*(?:pass|secret|token|auth|cred|signature)[^=&#\s]*=)[^&#\s'\"]*"
)
_SAFE_USER_RE = re.compile(r"^[A-Za-z0-9._~-]{0,64}$")
_PORT_RE = re.compile(r"^(?:\[[^\]]*\]|[^:\[\]]*)(?::([^/?#]*))?$")


def _redact_one(m: re.Match[str]) -> str:
    scheme, rest = m.group(1), m.group(2)
    at = rest.rfind("@")  # urllib and redis-py split the user info at the LAST '@'
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        rest = (f"{user}:***" if colon and _SAFE_USER_RE.match(user) else "***") + rest[at:]
    return scheme + _QUERY_SECRET_RE.sub(r"\1***", rest)


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
    # also as a text may show it: stripped (a value read from a file, with its newline), and
    # escaped as repr() writes it (an exception's message quoting it: b'tok\n')
    for v in {text, unquote(text), text.strip(), repr(text)[1:-1]}:
        if len(v) >= MIN_SECRET:
            _SECRETS.add(v)


def redact_all(data: Any) -> Any:
    """``data`` (a report: dicts, lists, strings, numbers) with every string in it, keys too,
    passed through :func:`redact` (``kcache remote``'s, as text or ``--json``)."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {redact_all(k): redact_all(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_all(v) for v in data]
    return data


def _remember_url_secrets(url: str) -> None:
    """The password of a URL (all its user info after the first ':', up to the last '@'); and,
    in a URL without user info, a "port" that is not a number with what follows it in the host
    list (``redis://host:Pw-typed-where-the-port-goes``: a password missing its '@', which any
    text showing the URL then masks; the URL is refused as a setting)."""
    rest = url.strip().partition("://")[2] or url  # the whole of it: a password may hold spaces
    info = rest[: rest.rfind("@")] if "@" in rest else ""
    if info:
        user, colon, password = info.partition(":")
        remember_secret(password if colon else user)
        return
    if "://" not in url:
        return  # not a URL (package.module:Class): no host list, no port
    cut = len(rest)
    for sep in "/?#":
        i = rest.find(sep)
        if 0 <= i < cut:
            cut = i
    hosts = rest[:cut]
    start = 0
    for h in hosts.split(","):
        m = _PORT_RE.match(h)
        port = m.group(1) if m else None
        if port is not None and not port.isdigit():
            remember_secret(port)
            remember_secret(hosts[start + len(h) - len(port) :])
            return
        start += len(h) + 1
