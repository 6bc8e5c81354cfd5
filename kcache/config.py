"""Settings from the environment and from arguments, validated.

Every variable of the contract is read here and nowhere else. A bad value never raises into the
user's program: :func:`load` returns the settings with ``enabled=False`` and the problems listed,
and :func:`kcache.enable` warns once and leaves caching off.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_MAX_SIZE = 10 * 1024**3

# The shared tier (issue 15; docs/remote.md): defaults and bounds of its settings.
DEFAULT_REMOTE_PREFIX = "kcache:"
DEFAULT_REMOTE_MAX_ENTRY = 8 * 1024**2  # larger entries stay local
MAX_REMOTE_MAX_ENTRY = 512 * 1024**2  # Redis's own bound on one value (proto-max-bulk-len)
DEFAULT_REMOTE_TIMEOUT_MS = 100.0  # connect and read timeouts
DEFAULT_REMOTE_LOCK_LEASE_S = 60.0  # cross-machine single flight: a lock's lease (0: off)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``"20GiB"``, ``"500MB"``, ``"10G"`` (binary), ``"123"`` (bytes) -> bytes. Raises ValueError."""
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 20GiB, 500MB, 10G)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def parse_age(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` -> seconds. Raises ValueError."""
    m = _AGE_RE.match(str(text))
    if not m:
        raise ValueError(f"not an age: {text!r} (examples: 7d, 12h, 30m, 45s)")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _flag(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1 or 0, got {text!r}")


def default_dir(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME") or os.path.expanduser("~")) / ".cache"
    return base / "kcache"


class Settings:
    """The effective settings; ``sources`` says where each value came from. (A plain class: the
    .pth hook builds one in every process, and importing dataclasses costs ~9 ms.)"""

    def __init__(
        self,
        enabled: bool = False,
        dir: Path | None = None,
        max_size: int = DEFAULT_MAX_SIZE,
        remote: str | None = None,
        readonly: bool = False,
        key_tag: str = "",
        secret: bytes | None = None,
        log: str = "warning",
        record: str | None = None,
        allow_insecure: bool = False,
        sources: dict[str, str] | None = None,
        problems: list[str] | None = None,
        remote_password: str | None = None,
        remote_prefix: str = DEFAULT_REMOTE_PREFIX,
        remote_max_entry: int = DEFAULT_REMOTE_MAX_ENTRY,
        remote_timeout: float = DEFAULT_REMOTE_TIMEOUT_MS,
        remote_lock_lease: float = DEFAULT_REMOTE_LOCK_LEASE_S,
        remote_problems: list[str] | None = None,
    ) -> None:
        self.enabled = enabled
        self.dir = default_dir(os.environ) if dir is None else dir
        self.max_size = max_size
        self.remote = remote
        self.readonly = readonly
        self.key_tag = key_tag
        self.secret = secret
        self.log = log
        self.record = record
        self.allow_insecure = allow_insecure
        self.sources = {} if sources is None else sources
        self.problems = [] if problems is None else problems
        # The shared tier's settings. A bad one turns the shared tier off (listed in
        # remote_problems), never local caching.
        self.remote_password = remote_password
        self.remote_prefix = remote_prefix
        self.remote_max_entry = remote_max_entry
        self.remote_timeout = remote_timeout  # milliseconds
        self.remote_lock_lease = remote_lock_lease  # seconds; 0: no cross-machine single flight
        self.remote_problems = [] if remote_problems is None else remote_problems

    def __repr__(self) -> str:
        return f"Settings({self.as_dict()!r})"

    def as_dict(self) -> dict[str, Any]:
        """Values safe to print (the secret and the Redis password are shown only as set/unset;
        a password inside the remote URL is masked)."""
        return {
            "enabled": self.enabled,
            "dir": str(self.dir),
            "max_size": self.max_size,
            "remote": redact_url(self.remote) if self.remote else self.remote,
            "readonly": self.readonly,
            "key_tag": self.key_tag,
            "secret": "set" if self.secret else None,
            "log": self.log,
            "record": self.record,
            "allow_insecure": self.allow_insecure,
            "remote_password": "set" if self.remote_password else None,
            "remote_prefix": self.remote_prefix,
            "remote_max_entry": self.remote_max_entry,
            "remote_timeout": self.remote_timeout,
            "remote_lock_lease": self.remote_lock_lease,
        }

    @property
    def remote_usable(self) -> bool:
        """A shared tier is configured and every one of its settings is good."""
        return bool(self.remote) and not self.remote_problems


# name in Settings -> environment variable
ENV = {
    "enabled": "KCACHE",
    "dir": "KCACHE_DIR",
    "max_size": "KCACHE_MAX_SIZE",
    "remote": "KCACHE_REMOTE",
    "readonly": "KCACHE_READONLY",
    "key_tag": "KCACHE_KEY_TAG",
    "secret": "KCACHE_SECRET",
    "log": "KCACHE_LOG",
    "record": "KCACHE_RECORD",
    "allow_insecure": "KCACHE_ALLOW_INSECURE",
    "remote_password": "KCACHE_REMOTE_PASSWORD",
    "remote_prefix": "KCACHE_REMOTE_PREFIX",
    "remote_max_entry": "KCACHE_REMOTE_MAX_ENTRY",
    "remote_timeout": "KCACHE_REMOTE_TIMEOUT",
    "remote_lock_lease": "KCACHE_REMOTE_LOCK_LEASE",
}

#: The shared tier's settings: a bad value turns the shared tier off, not caching.
REMOTE = frozenset(n for n in ENV if n.startswith("remote"))
#: Settings whose values are never printed (a problem with one names the variable only).
_SECRET_NAMES = frozenset({"secret", "remote_password"})
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:/{}-]{1,64}$")
_MS_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (in the user-info part and in a
    ``password=`` query option), for messages and reports."""
    out = re.sub(r"^([a-z]+://)([^@/?#]*?):([^@/?#]*)@", r"\1\2:***@", url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", out)


def _remote_url(raw: Any) -> str | None:
    text = str(raw).strip()
    if not text:
        return None
    if not re.match(r"^(redis|rediss|unix)://", text):
        raise ValueError(
            f"expected redis://host:port/db, rediss://... or unix:///path, got {redact_url(text)!r}"
        )
    from urllib.parse import urlsplit

    try:
        u = urlsplit(text)
        port = u.port  # raises ValueError on a bad port
    except ValueError as e:
        raise ValueError(f"not a Redis URL: {redact_url(text)!r} ({e})") from None
    if u.scheme == "unix":
        if not u.path.startswith("/"):
            raise ValueError(f"unix:// needs an absolute socket path, got {redact_url(text)!r}")
    else:
        if not u.hostname:
            raise ValueError(f"no host in {redact_url(text)!r} (expected redis://host:port/db)")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"bad port in {redact_url(text)!r}")
        db = u.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"the database must be a number, got {db!r}")
    return text


def _milliseconds(raw: Any) -> float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        ms = float(raw)
    else:
        m = _MS_RE.match(str(raw))
        if not m:
            raise ValueError(f"expected milliseconds (100, 100ms, 0.25s), got {raw!r}")
        ms = float(m.group(1)) * (1000.0 if m.group(2) == "s" else 1.0)
    if not 1.0 <= ms <= 60_000.0:
        raise ValueError(f"expected 1 ms to 60 s, got {raw!r}")
    return ms


def _convert(name: str, raw: Any) -> Any:
    if name == "enabled" or name == "readonly" or name == "allow_insecure":
        return raw if isinstance(raw, bool) else _flag(str(raw))
    if name == "dir":
        if not str(raw).strip():
            raise ValueError("empty path")
        p = Path(os.path.expanduser(str(raw))).absolute()
        b = os.fsencode(p)
        if len(b) >= 4096 or any(len(part) > 255 for part in b.split(b"/")):
            raise ValueError("the path is longer than the system allows")
        try:
            if p.exists() and not p.is_dir():
                raise ValueError(f"{p} exists and is not a directory")
        except OSError as e:
            raise ValueError(f"cannot use it: {e.strerror}") from None
        return p
    if name == "max_size":
        return raw if isinstance(raw, int) and raw > 0 else parse_size(str(raw))
    if name == "remote":
        return _remote_url(raw)
    if name == "remote_password":
        return str(raw) or None
    if name == "remote_prefix":
        text = str(raw)
        if not _PREFIX_RE.match(text):
            raise ValueError("expected 1 to 64 letters, digits or _.:/{}- (e.g. kcache: or team-a:kcache:)")
        return text
    if name == "remote_max_entry":
        n = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else parse_size(str(raw))
        if n > MAX_REMOTE_MAX_ENTRY:
            raise ValueError(f"at most {format_size(MAX_REMOTE_MAX_ENTRY)} (Redis's bound on one value)")
        return n
    if name == "remote_timeout":
        return _milliseconds(raw)
    if name == "remote_lock_lease":
        t = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else parse_age(str(raw))
        if not 0.0 <= t <= 86400.0:
            raise ValueError(f"expected 0 (off) to 1d, got {raw!r}")
        return t
    if name == "secret":
        text = raw if isinstance(raw, bytes) else str(raw).encode()
        return text or None
    if name == "log":
        text = str(raw).strip().lower()
        if text not in ("warning", "info", "debug", "error"):
            raise ValueError(f"expected warning, info or debug, got {raw!r}")
        return text
    if name == "record":
        return str(raw) or None
    if name == "key_tag":
        text = str(raw)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("not valid UTF-8 (it salts every key, which is text)") from None
        return text
    return str(raw)


def load(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the settings: defaults, then the environment, then ``overrides`` (non-None) on top.

    Never raises for bad values: each is recorded in ``problems`` and then ``enabled`` is False;
    except the shared tier's (``KCACHE_REMOTE*``): those go to ``remote_problems``, which turn
    the shared tier off and leave local caching on.
    """
    env = os.environ if env is None else env
    s = Settings(dir=default_dir(env))
    s.sources = {name: "default" for name in ENV}
    for name, var in ENV.items():
        if var in env and (env[var] != "" or name in ("key_tag",)):
            try:
                setattr(s, name, _convert(name, env[var]))
                s.sources[name] = f"env {var}"
            except ValueError as e:
                _problem(s, name, f"{var}={_shown(name, env[var])!r}: {e}")
    for name, value in overrides.items():
        if value is None:
            continue
        if name not in ENV:
            raise TypeError(f"unknown setting {name!r}")
        try:
            setattr(s, name, _convert(name, value))
            s.sources[name] = "argument"
        except ValueError as e:
            _problem(s, name, f"{name}={_shown(name, value)!r}: {e}")
    if s.problems:
        s.enabled = False
    return s


def _shown(name: str, value: Any) -> Any:
    """A value as a problem message may show it: secrets never, URLs without their password."""
    if name in _SECRET_NAMES:
        return "(hidden)"
    if name == "remote":
        return redact_url(str(value))
    return value


def _problem(s: Settings, name: str, text: str) -> None:
    (s.remote_problems if name in REMOTE else s.problems).append(text)
