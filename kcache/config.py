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

# Secrets are remembered as the settings are read; kcache.redact masks them (callers know them
# as the settings module's, hence the re-export).
from .redact import _remember_url_secrets, redact, remember_secret
from .redact import redact_url as redact_url

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
_MS_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")
_MS_UNITS = {None: 1.0, "ms": 1.0, "s": 1000.0}
_COUNT_RE = re.compile(r"^\s*([0-9]+)\s*$")
_MAX_NUMBER_TEXT = 40  # characters: a number any longer is garbage, never parsed

#: Every numeric setting: (unit, lowest, highest). A value that does not parse or lies outside
#: is a bad value (see :func:`load`), never an exception; ``kcache config`` shows the range.
RANGES: dict[str, tuple[str, float, float]] = {
    "max_size": ("size", 1, 1 << 60),  # bytes: 1 B to 1 EiB
    "remote_max_entry": ("size", 1, MAX_REMOTE_MAX_ENTRY),
    "remote_timeout": ("ms", 1.0, 60_000.0),  # milliseconds: 1 ms to 60 s
    "remote_lock_lease": ("age", 0.0, 86_400.0),  # seconds: 0 (off) to 1 day
}
MAX_AGE_S = 100 * 365 * 86400.0  # ages on the command line (clear --older-than, --protect)
#: Numeric variables read outside :class:`Settings` (by :func:`env_number`), and their ranges.
ENV_RANGES: dict[str, tuple[str, float, float]] = {
    "KCACHE_PREWARM_PROTECT_S": ("age", 0.0, 365 * 86400.0),  # set by `kcache prewarm` for its workers
    "KCACHE_DEVICE": ("count", 0, 1023),  # the GPU an integration is about (an index)
}


def _scaled(digits: str, unit: float, text: str) -> float:
    """The number ``digits`` times ``unit``; text too long for any range is refused before
    float arithmetic could overflow."""
    if len(text) > _MAX_NUMBER_TEXT or len(digits.partition(".")[0].lstrip("0")) > 20:
        raise ValueError(f"out of range: {text[:_MAX_NUMBER_TEXT]!r}...")
    return float(digits) * unit if "." in digits else int(digits) * unit  # whole numbers exactly


def parse_number(raw: Any, unit: str, low: float, high: float) -> float:
    """``raw`` (a number, or text such as ``20GiB``, ``250ms``, ``2m``) in ``unit`` (``"size"``:
    bytes, ``"ms"``: milliseconds, ``"age"``: seconds, ``"count"``: a whole number), checked
    against ``[low, high]``.
    Raises ValueError, and only that, for anything else (garbage, NaN, overflow, a bool)."""
    if isinstance(raw, bool):
        raise ValueError(f"expected a number, got {raw!r}")
    if isinstance(raw, (int, float)):
        value = raw  # compared exactly below (a huge int too); NaN and inf are out of every range
    else:
        text = str(raw)
        if unit == "size":
            m = _SIZE_RE.match(text)
            if not m or m.group(2).lower() not in _UNITS:
                raise ValueError(f"not a size: {text[:_MAX_NUMBER_TEXT]!r} (examples: 20GiB, 500MB, 10G)")
            value = _scaled(m.group(1), _UNITS[m.group(2).lower()], text)
        elif unit == "ms":
            m = _MS_RE.match(text)
            if not m:
                raise ValueError(
                    f"expected milliseconds (100, 100ms, 0.25s), got {text[:_MAX_NUMBER_TEXT]!r}"
                )
            value = _scaled(m.group(1), _MS_UNITS[m.group(2)], text)
        elif unit == "count":
            m = _COUNT_RE.match(text)
            if not m:
                raise ValueError(f"expected a whole number, got {text[:_MAX_NUMBER_TEXT]!r}")
            value = _scaled(m.group(1), 1, text)
        else:
            m = _AGE_RE.match(text)
            if not m:
                raise ValueError(f"not an age: {text[:_MAX_NUMBER_TEXT]!r} (examples: 7d, 12h, 30m, 45s)")
            value = _scaled(m.group(1), _AGE_UNITS[m.group(2)], text)
    if not low <= value <= high:  # NaN fails this too
        shown = {"size": format_size, "ms": "{:g} ms".format, "age": "{:g} s".format, "count": "{:g}".format}[
            unit
        ]
        raise ValueError(f"out of range: expected {shown(low)} to {shown(high)}")
    return value


def env_number(var: str, env: Mapping[str, str] | None = None) -> float | None:
    """The numeric variable ``var`` (one of :data:`ENV_RANGES`), or None when it is unset or
    bad: a bad value (garbage, out of range) warns once, and the caller falls back."""
    raw = (os.environ if env is None else env).get(var)
    if raw is None or not raw.strip():
        return None
    unit, low, high = ENV_RANGES[var]
    try:
        return parse_number(raw, unit, low, high)
    except ValueError as e:
        from .log import warn_once

        warn_once(f"setting:{var}", f"{var}={raw[:_MAX_NUMBER_TEXT]!r} is ignored: {e}")
        return None


def parse_size(text: str) -> int:
    """``"20GiB"``, ``"500MB"``, ``"10G"`` (binary), ``"123"`` (bytes) -> bytes (1 B to 1 EiB).
    Raises ValueError."""
    return int(parse_number(str(text), "size", 1, 1 << 60))


def parse_age(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` -> seconds (at most 100 years). Raises
    ValueError."""
    return parse_number(str(text), "age", 0.0, MAX_AGE_S)


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``1 file``, ``3 files``: a count and its noun, agreed."""
    if n == 1:
        return f"1 {noun}"
    many = plural or (noun[:-1] + "ies" if noun.endswith("y") and noun[-2:-1] not in "aeiou" else noun + "s")
    return f"{n:,} {many}"


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
        remote_prefix: str = DEFAULT_REMOTE_PREFIX,
        remote_max_entry: int = DEFAULT_REMOTE_MAX_ENTRY,
        remote_timeout: float = DEFAULT_REMOTE_TIMEOUT_MS,
        remote_lock_lease: float = DEFAULT_REMOTE_LOCK_LEASE_S,
        remote_problems: list[str] | None = None,
        recache: bool = False,
        logfile: str | None = None,
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
        # remote_problems), never local caching. Its backend's own (KCACHE_REMOTE_PASSWORD for
        # Redis) are in remote_options, by the backend's name for them.
        self.remote_options: dict[str, str] = {}
        self.remote_option_sources: dict[str, str] = {}
        self.remote_prefix = remote_prefix
        self.remote_max_entry = remote_max_entry
        self.remote_timeout = remote_timeout  # milliseconds
        self.remote_lock_lease = remote_lock_lease  # seconds; 0: no cross-machine single flight
        self.remote_problems = [] if remote_problems is None else remote_problems
        self.recache = recache  # compile and overwrite what a lookup would have served
        self.logfile = logfile  # kcache's log lines go to this file too

    def __repr__(self) -> str:
        return f"Settings({self.as_dict()!r})"

    @property
    def remote_password(self) -> str | None:
        """The Redis backend's ``KCACHE_REMOTE_PASSWORD`` (in :attr:`remote_options`)."""
        return self.remote_options.get("password")

    def as_dict(self) -> dict[str, Any]:
        """Values safe to print (the secret and a backend's secret settings are shown only as
        set/unset; a password inside the remote URL is masked)."""
        out = {
            "enabled": self.enabled,
            "dir": str(self.dir),
            "max_size": self.max_size,
            "remote": redact(self.remote) if self.remote else self.remote,
            "readonly": self.readonly,
            "key_tag": self.key_tag,
            "secret": "set" if self.secret else None,
            "log": self.log,
            "record": self.record,
            "allow_insecure": self.allow_insecure,
            "remote_prefix": self.remote_prefix,
            "remote_max_entry": self.remote_max_entry,
            "remote_timeout": self.remote_timeout,
            "remote_lock_lease": self.remote_lock_lease,
            "recache": self.recache,
            "logfile": self.logfile,
        }
        out.update(self.backend_values())
        return out

    def backend_values(self) -> dict[str, Any]:
        """The backend's own settings as ``remote_<name>``, safe to print (secrets: ``set``)."""
        from . import remotes

        backend = remotes.for_url(self.remote) if self.remote and "://" in self.remote else None
        out: dict[str, Any] = {}
        for setting in getattr(backend, "settings", ()):
            value = self.remote_options.get(setting.name)
            out[f"remote_{setting.name}"] = ("set" if value else None) if setting.secret else value
        return out

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
    "remote_prefix": "KCACHE_REMOTE_PREFIX",
    "remote_max_entry": "KCACHE_REMOTE_MAX_ENTRY",
    "remote_timeout": "KCACHE_REMOTE_TIMEOUT",
    "remote_lock_lease": "KCACHE_REMOTE_LOCK_LEASE",
    "recache": "KCACHE_RECACHE",
    "logfile": "KCACHE_LOGFILE",
}

#: The shared tier's settings: a bad value turns the shared tier off, not caching.
REMOTE = frozenset(n for n in ENV if n.startswith("remote"))
#: Settings whose values are never printed (a problem with one names the variable only).
_SECRET_NAMES = frozenset({"secret"})
# No '{' or '}': Redis Cluster hashes only the first {...} of a key, and the shared tier's keys carry
# their entry id in one, so that an entry and its lock live on one node (docs/remote.md).
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")


def _remote_url(raw: Any) -> str | None:
    """``KCACHE_REMOTE``: a URL whose scheme a backend declares, checked by that backend
    (:mod:`kcache.remotes`), or ``package.module:Class`` (a user's backend, imported later)."""
    text = str(raw).strip()
    if not text:
        return None
    _remember_url_secrets(text)
    from . import remotes

    if remotes.is_class_name(text):
        return text
    backend = remotes.for_url(text)
    if backend is None:
        raise ValueError(f"expected {remotes.expected()}; got {redact(text)!r}")
    checked: str = backend.check_url(text)
    return checked


def _remote_options(s: Settings, env: Mapping[str, str]) -> None:
    """The settings of the backend ``s.remote`` names (``KCACHE_REMOTE_PASSWORD`` for Redis, ...),
    into ``s.remote_options``; a user's class reads its own."""
    from . import remotes

    if not s.remote or remotes.is_class_name(s.remote):
        return
    backend = remotes.for_url(s.remote)
    for setting in getattr(backend, "settings", ()):
        raw = env.get(setting.env)
        if raw is None or raw == "":
            continue
        if setting.secret:
            remember_secret(raw)
        s.remote_options[setting.name] = str(raw)
        s.remote_option_sources[setting.name] = f"env {setting.env}"


def _convert(name: str, raw: Any) -> Any:
    if name in ("enabled", "readonly", "allow_insecure", "recache"):
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
    if name in RANGES:
        unit, low, high = RANGES[name]
        value = parse_number(raw, unit, low, high)
        return int(value) if unit == "size" else value
    if name == "remote":
        return _remote_url(raw)
    if name == "remote_prefix":
        text = str(raw)
        if not _PREFIX_RE.match(text):
            raise ValueError("expected 1 to 64 letters, digits or _.:/- (e.g. kcache: or team-a:kcache:)")
        return text
    if name == "secret":
        remember_secret(raw)
        key = raw if isinstance(raw, bytes) else str(raw).encode()
        return key or None
    if name == "log":
        text = str(raw).strip().lower()
        if text not in ("warning", "info", "debug", "error"):
            raise ValueError(f"expected warning, info or debug, got {raw!r}")
        return text
    if name == "record":
        return str(raw) or None
    if name == "logfile":
        return str(_logfile(raw))
    if name == "key_tag":
        text = str(raw)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("not valid UTF-8 (it salts every key, which is text)") from None
        return text
    return str(raw)


def _logfile(raw: Any) -> Path:
    """``KCACHE_LOGFILE``: a file path (made absolute; the file is opened, for appending, by
    :func:`kcache.log.configure`). A folder is a bad value."""
    text = str(raw)
    if not text.strip() or "\0" in text:
        raise ValueError("expected a file path")
    p = Path(os.path.expanduser(text)).absolute()
    if p.is_dir():
        raise ValueError(f"{p} is a directory, not a file")
    return p


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
            except (ValueError, OverflowError, TypeError) as e:  # a bad value is a problem, not a crash
                _problem(s, name, f"{var}={_shown(name, env[var])!r}: {e}")
    for name, value in overrides.items():
        if value is None:
            continue
        if name not in ENV:
            raise TypeError(f"unknown setting {name!r}")
        try:
            setattr(s, name, _convert(name, value))
            s.sources[name] = "argument"
        except (ValueError, OverflowError, TypeError) as e:
            _problem(s, name, f"{name}={_shown(name, value)!r}: {e}")
    if s.remote and not s.remote_problems:
        _remote_options(s, env)
    if s.problems:
        s.enabled = False
    return s


def _shown(name: str, value: Any) -> Any:
    """A value as a problem message may show it: secrets never, URLs without their password."""
    if name in _SECRET_NAMES:
        return "(hidden)"
    if name == "remote":
        return redact(value)
    text = value if isinstance(value, str) else str(value)
    if len(text) > 80:  # 400 digits or a pasted file: the start says enough
        return text[:60] + f"... ({len(text)} characters)"
    return value


def _problem(s: Settings, name: str, text: str) -> None:
    (s.remote_problems if name in REMOTE else s.problems).append(text)
