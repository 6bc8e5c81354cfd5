"""What a backend of the shared tier is: the handful of operations it must do, and nothing else.

The shared tier is one machinery (:mod:`.shared`: the entry format and its signing, the write-
behind queue, breakers, the whole-tier budget, trust, counts, mark-bad, forks, single flight)
over a thin :class:`Backend`: a Redis server or cluster (:mod:`.redis`), S3-compatible object
storage (:mod:`.s3`), or a user's own class (``KCACHE_REMOTE=package.module:Class``). A backend
stores opaque values (the machinery packs and checks them: :mod:`.entry`) under an entry's
``(kind, id)``, and, where it can, leases (a conditional create with an expiry) for single
flight across machines.

**One rule for failures.** Every operation runs inside the machinery's bound (:mod:`.bounded`:
a deadline for the whole call and a byte bound, set before the call; a backend wraps its
sockets in :class:`~.bounded.BoundedSocket` or bounds its calls itself) and raises only:

- :class:`Unavailable`: the call failed (timeout, connection, a 5xx, the bound): counted as an
  error, charged to the node's breaker and to the tier's budget; the lookup is a miss;
- :class:`Answered`: the server answered an error about this one key (a key of another type
  planted where an entry is): a refusal, not a sign of the server's health either way (no
  breaker opens or closes for it); its time is charged to the budget all the same, and a
  streak of them with no success (every request refused: credentials, a policy) turns the
  tier off like a breaker;
- :class:`Full`: the server refuses writes for lack of room (reads go on; no breaker);
- :class:`TooLarge` from :meth:`Backend.read`: the value grew past the bound since its size was
  asked (nothing past the bound was read).

Anything else a backend raises is a bug: under ``KCACHE_STRICT=1`` it propagates; otherwise the
machinery treats it as :class:`Unavailable` and warns once (a user's class is foreign code).

**What is optional.** A backend without leases (``leases = False``, the default) works: the
machinery does no single flight across machines for it. ``node_of``/``refresh`` (a cluster's
nodes, for per-node breakers), ``describe`` and ``survey`` (for ``kcache remote``), and
``wants_upkeep``/``upkeep`` (work in the background: S3's credentials) have defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

#: Lease time-to-live values: none (the lease is gone), or one with no expiry.
GONE, NO_EXPIRY = -2, -1


class Unavailable(Exception):
    """A call to the backend failed: the machinery counts it as an error and a miss."""


class Answered(Exception):
    """The backend answered an error about one key (not about its own health)."""


class Full(Exception):
    """The backend refuses writes for lack of room."""


class TooLarge(Exception):
    """A value is larger than the bound it may be read within: ``size`` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


class Setting:
    """A setting of one backend, read from the environment (``kcache config`` lists it): ``name``
    (``Settings.remote_options[name]``), ``env``, and whether it is ``secret`` (never shown:
    ``set`` in reports, and its value is masked in every text)."""

    __slots__ = ("name", "env", "secret", "help")

    def __init__(self, name: str, env: str, *, secret: bool = False, help: str = "") -> None:
        self.name, self.env, self.secret, self.help = name, env, secret, help


class TierConfig:
    """What the machinery and its backend need from the settings (a plain class)."""

    __slots__ = ("url", "prefix", "max_entry", "timeout_s", "lease_s", "secret", "key_tag", "options")

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "kcache:",
        max_entry: int = 8 << 20,
        timeout_s: float = 0.1,
        lease_s: float = 60.0,
        secret: bytes | None = None,
        key_tag: str = "",
        options: Mapping[str, str] | None = None,
    ) -> None:
        self.url, self.prefix = url, prefix
        self.max_entry, self.timeout_s, self.lease_s = max_entry, timeout_s, lease_s
        self.secret, self.key_tag = secret, key_tag
        self.options: dict[str, str] = dict(options or {})

    @classmethod
    def from_settings(cls, s: Any, url: str | None = None) -> TierConfig | None:
        """The configuration for ``url`` (default: the settings' own), or None when no usable
        shared tier is configured. ``s``: :class:`kcache.config.Settings`."""
        if not (url or getattr(s, "remote", None)) or getattr(s, "remote_problems", None):
            return None
        return cls(
            url or s.remote,
            prefix=s.remote_prefix,
            max_entry=s.remote_max_entry,
            timeout_s=s.remote_timeout / 1000.0,
            lease_s=s.remote_lock_lease,
            secret=s.secret,
            key_tag=s.key_tag,
            options=getattr(s, "remote_options", None) or {},
        )

    @property
    def shown_url(self) -> str:
        from ...redact import redact

        return redact(self.url)

    @property
    def value_limit(self) -> int:
        """The most bytes of one entry's value that are ever read (or written)."""
        from .entry import VALUE_OVERHEAD

        return self.max_entry + VALUE_OVERHEAD


class LeaseView:
    """What a look at an entry's lease saw: whether this call ``taken`` it, its ``value`` (None:
    no lease), its time to live in ms (:data:`GONE`, :data:`NO_EXPIRY`, or > 0) and the size of
    the entry itself (0: absent), all from one round trip where the backend can."""

    __slots__ = ("taken", "value", "ttl_ms", "entry_size")

    def __init__(self, taken: bool, value: bytes | None, ttl_ms: int, entry_size: int) -> None:
        self.taken, self.value, self.ttl_ms, self.entry_size = taken, value, ttl_ms, entry_size


class Op:
    """One write of a batch (:meth:`Backend.write`): ``put`` a value (then release ``release``,
    this process's lease prefix, if given), ``release`` a lease, or ``delete`` an entry (only if
    its version is still ``version``, when given)."""

    __slots__ = ("op", "kind", "ident", "value", "release", "version")

    def __init__(
        self,
        op: str,
        kind: str,
        ident: str,
        *,
        value: bytes | None = None,
        release: bytes | None = None,
        version: str | None = None,
    ) -> None:
        self.op, self.kind, self.ident = op, kind, ident
        self.value, self.release, self.version = value, release, version


#: An operation's outcome in a batch: True (done), False (not done: a delete whose value had
#: changed), or the error that one operation met (Unavailable, Answered, Full).
Outcome = bool | BaseException


class Backend:
    """The operations a backend of the shared tier offers the machinery (see the module). A
    subclass sets the class attributes and implements the methods that raise
    ``NotImplementedError`` here; the others have defaults."""

    #: Its name in reports (``kcache remote``, ``kcache config``).
    name: ClassVar[str] = ""
    #: The URL schemes (lower case) it serves: ``KCACHE_REMOTE=<scheme>://...``.
    schemes: ClassVar[tuple[str, ...]] = ()
    #: What a URL of it looks like, for messages.
    url_forms: ClassVar[str] = ""
    #: The pip extra that installs its client library (``pip install 'kcache[<extra>]'``).
    extra: ClassVar[str] = ""
    #: Its own settings (besides the tier's: prefix, max entry, timeout, lease, secret).
    settings: ClassVar[tuple[Setting, ...]] = ()
    #: Whether it can make leases (single flight across machines).
    leases: ClassVar[bool] = False
    #: Its calls' deadline when ``KCACHE_REMOTE_TIMEOUT`` is not set (None: the tier's, 100 ms).
    default_timeout_s: ClassVar[float | None] = None
    #: How far apart a machine waiting on another's compile looks at the lease and the entry:
    #: the first look after the shortest, each next one 1.5x later, up to the longest (seconds).
    #: A look costs a backend one round trip (Redis: a fraction of a millisecond) or more.
    poll_s: ClassVar[tuple[float, float]] = (0.01, 0.1)

    def __init__(self, cfg: TierConfig) -> None:
        self.cfg = cfg

    # ------------------------------------------------------------------ settings
    @classmethod
    def check_url(cls, url: str) -> str:
        """``url`` if this backend can use it; raises ValueError saying what is wrong (the text
        may show the URL: the caller masks a password in it). No network, no client import."""
        return url

    # ------------------------------------------------------------------ life
    def open(self) -> None:
        """Import the client library and make the clients (no network). Raises ImportError when
        the library is missing, ValueError for options it refuses. Called once, on a thread of
        the program (never the writer's: an import racing a fork can leave an import lock held)."""

    def close(self) -> None:
        """Let go of connections (never raises)."""

    def wants_upkeep(self) -> bool:
        """After :meth:`open`: whether :meth:`upkeep` has work (S3: credentials that expire). No
        network. False (the default): no thread is started for it."""
        return False

    def upkeep(self) -> float | None:
        """Work that must not run on a call's thread (S3: refreshing credentials ahead of their
        expiry), run by the tier's writer thread, never a program's: at once after :meth:`open`
        when :meth:`wants_upkeep`, then again after the seconds it returns (None: never again).
        Never raises."""
        return None

    # ------------------------------------------------------------------ nodes
    def node_of(self, ident: str, writer: bool = False) -> str:
        """The node that holds entry ``ident`` (its own breaker), "" for the only one. No network."""
        return ""

    def refresh(self) -> bool:
        """Ask where entries live again (a cluster's slots), at most now and then: True when it
        did. Network, inside a bound. A node whose breaker is open calls this first."""
        return False

    def split(self, items: Sequence[T], ident: Callable[[T], str], writer: bool = False) -> list[list[T]]:
        """``items`` grouped by node (one call of a batch per node, so that a failing node holds
        up only its own). No network."""
        groups: dict[str, list[T]] = {}
        for it in items:
            groups.setdefault(self.node_of(ident(it), writer), []).append(it)
        return list(groups.values())

    # ------------------------------------------------------------------ entries
    def size(self, kind: str, ident: str) -> int:
        """The size in bytes of entry ``ident``'s value, 0 when there is none."""
        raise NotImplementedError

    def read(self, kind: str, ident: str, size: int, limit: int) -> tuple[bytes, str] | None:
        """The value (the backend said it is ``size`` bytes) and its version (a token that
        changes with the value: :meth:`write`'s deletes compare it), or None when it is gone.
        Never reads more than ``limit`` bytes: raises :class:`TooLarge` for a larger value."""
        raise NotImplementedError

    def write(self, ops: Sequence[Op]) -> list[Outcome]:
        """Apply ``ops`` (puts, lease releases, deletes; one node's) in one round trip where the
        backend can; each one's outcome. Raises :class:`Unavailable` when the call as a whole
        failed. Runs on the writer's thread."""
        raise NotImplementedError

    # ------------------------------------------------------------------ leases (leases = True)
    def lease_take(self, kind: str, ident: str, value: bytes, ttl_ms: int) -> LeaseView:
        """Create ``ident``'s lease holding ``value`` for ``ttl_ms`` unless one exists (one that
        has expired counts as none); then what is there."""
        raise NotImplementedError

    def lease_look(self, kind: str, ident: str) -> LeaseView:
        """The lease and the entry's size now (``taken`` False)."""
        raise NotImplementedError

    def lease_renew(self, items: Sequence[tuple[str, bytes, bytes]], ttl_ms: int) -> list[Outcome]:
        """For each (ident, holder prefix, new value): rewrite the lease with a fresh expiry if
        it is still the holder's (its value starts with the prefix). Runs on the keeper's thread."""
        raise NotImplementedError

    def lease_replace(self, ident: str, seen: bytes, value: bytes, ttl_ms: int) -> bool:
        """Replace a lease that still holds exactly ``seen`` by ``value``: True when done."""
        raise NotImplementedError

    # ------------------------------------------------------------------ reports
    def describe(self) -> dict[str, Any]:
        """What it is, without network and without a secret (``kcache remote``, ``kcache config``)."""
        return {"backend": self.name, "mode": "server"}

    def survey(self, *, limit: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
        """``kcache remote``: whether it answers, its nodes, and what kcache holds there (entries
        and bytes ``by_kind``, ``complete``), looking at most ``limit`` keys for at most
        ``budget_s``, each call within ``timeout_s``. Called after :meth:`open` (and
        :meth:`close` after it). Failures are in the result (``reachable``, ``error``), never
        raised."""
        return {"reachable": None, "error": f"the {self.name or 'backend'} backend reports nothing"}
