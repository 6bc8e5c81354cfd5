"""The Redis backend of the shared tier: a Redis (or Valkey) server, or a Redis Cluster.

``KCACHE_REMOTE=redis://[user:password@]host:port/db`` (``rediss://`` with TLS,
``unix:///path?db=0``), or ``redis+cluster://host:port[,host:port...]`` (:mod:`.redis_cluster`).
The machinery (:mod:`.shared`) does everything but these operations:

- an entry is one key, ``<prefix>e:<kind>:{<id>}`` (:mod:`.redis_keys`): its size is ``STRLEN``,
  its bytes ``GETRANGE 0 limit-1`` (never more than the bound, whatever was written meanwhile),
  its version the SHA-1 of its value (what Redis's Lua can compute: a delete of a bad entry
  compares it in Lua, so that a newer value written meanwhile stays);
- writes go in one pipeline per node (``SET``; the lease's release, a Lua compare of the holder,
  right after its entry);
- a lease is the key ``<prefix>l:{<id>}`` (``SET NX PX``; renewed and replaced by Lua compare and
  set; looked at with ``GETRANGE`` of at most 257 bytes, ``PTTL`` and the entry's ``STRLEN`` in
  one pipeline).

Every call's sockets are bounded by the call's deadline and byte bound (:mod:`.redis_io`); redis-
py's own retries are off. redis-py's errors become the tier's: an error reply about one key is
:class:`~.backend.Answered`, an out-of-memory reply :class:`~.backend.Full`, anything else
(timeouts, connections, ``CLUSTERDOWN``, the bound) :class:`~.backend.Unavailable`.
``redis`` is imported by :meth:`RedisBackend.open`, never at import.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qs, urlsplit

from ...redact import redact
from . import redis_cluster, redis_io
from . import redis_keys as rk
from .backend import (
    GONE,
    Answered,
    Backend,
    Full,
    LeaseView,
    Op,
    Outcome,
    Setting,
    TierConfig,
    Unavailable,
)
from .lease import VALUE_MAX, WRONG_TYPE

T = TypeVar("T")

#: Delete the lease if it is still the caller's (its value starts with ARGV[1]).
UNLOCK_LUA = (
    "if redis.call('getrange', KEYS[1], 0, string.len(ARGV[1]) - 1) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) end return 0"
)
#: Rewrite the lease (ARGV[2], expiry ARGV[3] ms) if it is still the caller's (prefix ARGV[1]).
RENEW_LUA = (
    "if redis.call('getrange', KEYS[1], 0, string.len(ARGV[1]) - 1) == ARGV[1] then "
    "redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
)
#: Replace a lease that is not waited on, if it still holds exactly the value seen (ARGV[1]).
TAKEOVER_LUA = (
    "if redis.call('strlen', KEYS[1]) == string.len(ARGV[1]) and redis.call('get', KEYS[1]) == ARGV[1] "
    "then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
)
#: Delete an entry if its value is still the one this process was served (sha1 hex ARGV[1]).
DELETE_IF_SAME_LUA = (
    "local v = redis.call('get', KEYS[1]) "
    "if v and redis.sha1hex(v) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)
WRITER_TIMEOUT_S = 1.0  # the writer's client: its sockets' own timeout, at least (calls are bounded)

_CLUSTER_URL_RE = re.compile(r"(?i)^rediss?\+cluster://")
_CLUSTER_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]{1,5}))?$")


class RedisBackend(Backend):
    """A Redis server or a Redis Cluster (see the module)."""

    name = "redis"
    schemes = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
    url_forms = (
        "redis://host:port/db, rediss://host:port/db, unix:///path/redis.sock or "
        "redis+cluster://host:port[,host:port...]"
    )
    extra = "redis"
    settings = (
        Setting(
            "password",
            "KCACHE_REMOTE_PASSWORD",
            secret=True,
            help="the Redis password, when the URL has none (keeps it out of ps and logs)",
        ),
    )
    leases = True

    def __init__(self, cfg: TierConfig) -> None:
        super().__init__(cfg)
        self.cluster = redis_cluster.is_cluster(cfg.url)
        self._clients: tuple[Any, Any] | None = None  # (the callers' client, the writer's)
        self._errors: tuple[type[BaseException], ...] = (OSError,)

    # ------------------------------------------------------------------ settings
    @classmethod
    def check_url(cls, url: str) -> str:
        if _CLUSTER_URL_RE.match(url):
            return _check_cluster_url(url)
        try:
            u = urlsplit(url)
            port = u.port  # raises ValueError on a bad port (its text may hold part of a password)
        except ValueError:
            raise ValueError(f"not a Redis URL (a bad port or host): {redact(url)!r}") from None
        if u.scheme.lower() == "unix":
            if not u.path.startswith("/"):
                raise ValueError(f"unix:// needs an absolute socket path, got {redact(url)!r}")
            return url
        if not u.hostname:
            raise ValueError(f"no host in {redact(url)!r} (expected redis://host:port/db)")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"bad port in {redact(url)!r}")
        db = u.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"the database must be a number, got {redact(db)[:40]!r}")
        return url

    @property
    def url(self) -> str:
        return self.cfg.url

    @property
    def password(self) -> str | None:
        return self.cfg.options.get("password") or None

    @property
    def prefix(self) -> str:
        return self.cfg.prefix

    # ------------------------------------------------------------------ life
    def open(self) -> None:
        self._errors = redis_io.failures()
        self._clients = (
            self.connect(self.cfg.timeout_s),
            self.connect(max(self.cfg.timeout_s, WRITER_TIMEOUT_S)),
        )

    def connect(self, timeout_s: float) -> Any:
        """A redis-py client whose calls honour the tier's bounds (a cluster's:
        :func:`.redis_cluster.connect`). Raises ImportError without redis."""
        if self.cluster:
            return redis_cluster.connect(self.cfg.url, self.password, timeout_s)
        return redis_io.connect(self.cfg.url, self.password, timeout_s)

    def close(self) -> None:
        for c in self._clients or ():
            try:
                c.close()
                if not isinstance(c, redis_cluster.ClusterClient):
                    # (its own close does this: redis-py 5.0.0 disconnects no pool on close())
                    c.connection_pool.disconnect()
            except self._errors:  # closing goes on (a server gone, a client that never connected)
                pass

    def _client(self, writer: bool = False) -> Any:
        if self._clients is None:
            raise Unavailable("not open")
        return self._clients[1 if writer else 0]

    def _run(self, fn: Callable[[Any], T], writer: bool = False) -> T:
        """``fn(client)``, redis-py's errors raised as the tier's (see the module)."""
        try:
            return fn(self._client(writer))
        except self._errors as e:
            _raise(e)

    # ------------------------------------------------------------------ nodes
    def node_of(self, ident: str, writer: bool = False) -> str:
        r = self._clients[1 if writer else 0] if self._clients else None
        if isinstance(r, redis_cluster.ClusterClient):
            return r.node_of(rk.lock_key(self.cfg.prefix, ident))  # an entry and its lease: one slot
        return ""

    def refresh(self) -> bool:
        r = self._clients[0] if self._clients else None
        if not isinstance(r, redis_cluster.ClusterClient):
            return False
        return self._run(lambda _r: r.refresh())

    # ------------------------------------------------------------------ entries
    def size(self, kind: str, ident: str) -> int:
        ekey = rk.entry_key(self.cfg.prefix, kind, ident)
        return _int(self._run(lambda r: r.strlen(ekey)), 0)

    def read(self, kind: str, ident: str, size: int, limit: int) -> tuple[bytes, str] | None:
        ekey = rk.entry_key(self.cfg.prefix, kind, ident)
        raw = self._run(lambda r: r.getrange(ekey, 0, limit - 1))
        if not isinstance(raw, bytes) or not raw:
            return None
        return raw, hashlib.sha1(raw).hexdigest()

    def write(self, ops: Sequence[Op]) -> list[Outcome]:
        cmds: list[tuple[Any, ...]] = []
        owner: list[int] = []  # the op each command's reply belongs to (-1: a release, not counted)
        for i, op in enumerate(ops):
            ekey = rk.entry_key(self.cfg.prefix, op.kind, op.ident)
            if op.op == "put":
                cmds.append(("SET", ekey, op.value))
                owner.append(i)
            elif op.op == "delete":
                if op.version is not None:  # only the value this process was served
                    cmds.append(("EVAL", DELETE_IF_SAME_LUA, 1, ekey, op.version))
                else:
                    cmds.append(("DEL", ekey))
                owner.append(i)
            if op.release:
                cmds.append(("EVAL", UNLOCK_LUA, 1, rk.lock_key(self.cfg.prefix, op.ident), op.release))
                owner.append(i if op.op == "release" else -1)

        def send(r: Any) -> list[Any]:
            pipe = r.pipeline(transaction=False)  # (a cluster's client is made here, bounded)
            for args in cmds:  # (a cluster's pipeline has no eval(): the commands themselves)
                pipe.execute_command(*args)
            out: list[Any] = pipe.execute(raise_on_error=False)
            return out

        replies = self._run(send, writer=True)
        outcomes: list[Outcome] = [False] * len(ops)
        for i, reply in zip(owner, replies):
            if i < 0:
                continue
            if isinstance(reply, BaseException):
                outcomes[i] = _error(reply)
            elif ops[i].op == "put":
                outcomes[i] = True
            else:
                outcomes[i] = bool(_int(reply, 0))
        return outcomes

    # ------------------------------------------------------------------ leases
    def lease_take(self, kind: str, ident: str, value: bytes, ttl_ms: int) -> LeaseView:
        lkey, ekey = rk.lock_key(self.cfg.prefix, ident), rk.entry_key(self.cfg.prefix, kind, ident)

        def take(r: Any) -> list[Any]:
            p = r.pipeline(transaction=False)
            p.set(lkey, value, nx=True, px=ttl_ms)
            p.getrange(lkey, 0, VALUE_MAX)
            p.pttl(lkey)
            p.strlen(ekey)
            out: list[Any] = p.execute(raise_on_error=False)
            return out

        got, raw, pttl, size = self._run(take)  # (a SET refused, full or a replica: not taken)
        return LeaseView(got is True, _value(raw), _int(pttl, GONE), _int(size, 0))

    def lease_look(self, kind: str, ident: str) -> LeaseView:
        lkey, ekey = rk.lock_key(self.cfg.prefix, ident), rk.entry_key(self.cfg.prefix, kind, ident)

        def look(r: Any) -> list[Any]:
            p = r.pipeline(transaction=False)
            p.getrange(lkey, 0, VALUE_MAX)
            p.pttl(lkey)
            p.strlen(ekey)
            out: list[Any] = p.execute(raise_on_error=False)
            return out

        raw, pttl, size = self._run(look)
        return LeaseView(False, _value(raw), _int(pttl, GONE), _int(size, 0))

    def lease_renew(self, items: Sequence[tuple[str, bytes, bytes]], ttl_ms: int) -> list[Outcome]:
        def renew(r: Any) -> list[Any]:
            p = r.pipeline(transaction=False)
            for ident, prefix, value in items:  # a cluster's pipeline runs no p.eval(): the command
                lkey = rk.lock_key(self.cfg.prefix, ident)
                p.execute_command("EVAL", RENEW_LUA, 1, lkey, prefix, value, str(ttl_ms))
            out: list[Any] = p.execute(raise_on_error=False)
            return out

        return [r if isinstance(r, BaseException) else _int(r, 0) == 1 for r in self._run(renew)]

    def lease_replace(self, ident: str, seen: bytes, value: bytes, ttl_ms: int) -> bool:
        lkey = rk.lock_key(self.cfg.prefix, ident)
        res = self._run(lambda r: r.eval(TAKEOVER_LUA, 1, lkey, seen, value, str(ttl_ms)))
        return _int(res, 0) == 1

    # ------------------------------------------------------------------ reports
    def describe(self) -> dict[str, Any]:
        return {"backend": "redis", "mode": "cluster" if self.cluster else "server"}

    def survey(self, *, limit: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
        from .redis_survey import survey

        return survey(self, limit=limit, budget_s=budget_s, timeout_s=timeout_s)


def _check_cluster_url(text: str) -> str:
    """A Redis Cluster (or Valkey cluster) URL: ``redis+cluster://[user:password@]host:port[,...]``,
    ``rediss+cluster://`` with TLS; the hosts are where the client starts, it finds the others."""
    try:
        u = urlsplit(text)
        query = parse_qs(u.query)
    except ValueError:
        raise ValueError(f"not a Redis Cluster URL: {redact(text)!r}") from None
    hosts = u.netloc.rpartition("@")[2]
    if not hosts:
        raise ValueError(f"no host in {redact(text)!r} (expected redis+cluster://host:port,host:port)")
    for h in hosts.split(","):
        m = _CLUSTER_HOST_RE.match(h)
        if m is None or (m.group(2) is not None and not 0 < int(m.group(2)) < 65536):
            raise ValueError(f"not a host:port in {redact(text)!r}: {redact('x://' + h)[4:][:60]!r}")
    if u.path.strip("/") not in ("", "0") or query.get("db", ["0"]) != ["0"]:
        raise ValueError(f"a Redis Cluster has only database 0, got {redact(text)!r}")
    return text


def _error(e: BaseException) -> Unavailable | Answered | Full:
    """redis-py's error (raised, or a pipeline's reply) as the tier's (see the module)."""
    names = {c.__name__ for c in type(e).__mro__}
    if getattr(e, "unavailable", False):  # CLUSTERDOWN (redis_io.cluster_down): the node fails
        return Unavailable(f"{type(e).__name__}: {e}")
    if "OutOfMemoryError" in names or "maxmemory" in str(e):
        return Full(str(e))
    if {"MovedError", "AskError"} & names and not str(e).startswith(("MOVED ", "ASK ")):
        return Answered(f"MOVED {e}")  # (redis-py 8: the reply's word is gone from the text)
    if "ResponseError" in names:
        return Answered(str(e))
    return Unavailable(f"{type(e).__name__}: {e}")


def _raise(e: BaseException) -> NoReturn:
    raise _error(e) from e


def _value(raw: object) -> bytes | None:
    """A lease value as read (None: no lease; an error reply reads as a value no lease has)."""
    if raw is None or raw == b"":
        return None
    if isinstance(raw, BaseException):
        return WRONG_TYPE
    return raw if isinstance(raw, bytes) else None


def _int(v: object, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default
