"""The shared tier on a Redis Cluster (or a Valkey cluster): ``redis+cluster://`` URLs.

``KCACHE_REMOTE=redis+cluster://[user:password@]host:port[,host:port...]`` (``rediss+cluster://``
with TLS; the URL's query options as for ``redis://``) names the nodes a redis-py
``RedisCluster`` starts from; it asks one of them for the slots (``CLUSTER SLOTS``) and talks to
every master directly from then on, following ``MOVED`` and ``ASK`` redirections.

How it keeps the tier's bounds (:mod:`.redis_io`): every node's connections are bounded ones
(each call ends by its deadline, connects included, whatever a node or link does), and the client
is made on first use inside a bounded call, since making it asks the cluster for its slots.
redis-py's own retries are off (each of its retry paths can sleep, past a deadline: a failed
call is one failure of the node, and redis-py refreshes the slots on the next call), and a
``CLUSTERDOWN`` reply (the second or so of a failover in which a master's slots have no master)
is an error of the call, not redis-py's sleep of 0.25 s and refresh inside it
(:func:`.redis_io.cluster_down`). Each call of the tier names one key; the tier's circuit breaker
is per node, by that key's slot (:mod:`.breaker`), and it groups the writer's and the lock
keeper's batches by node, so a failing master holds up only its own keys.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from . import redis_io
from .backend import Unavailable
from .bounded import aside

SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_PORT = 6379
MAKE_S = 0.5  # making a client (slots, command table), at least: once per process and client
MAKE_BYTES = 4 << 20  # and the bytes it may read
MAKE_RETRIES = 2  # masters that do not answer, passed over while making a client
REFRESH_S = 1.0  # the slots are asked for again at most this often (while a node fails)

T = TypeVar("T")


def is_cluster(url: str) -> bool:
    return url.partition("://")[0].lower() in SCHEMES


def startup(url: str) -> tuple[list[tuple[str, int]], str]:
    """The startup nodes of a cluster URL, and the ``redis://`` (or ``rediss://``) URL of its
    first node (:func:`node_url`): what redis-py's ``parse_url`` reads the connection options
    from. Raises ValueError."""
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    nodes = [_host_port(h) for h in hosts.split(",")] if hosts else []
    if not nodes:
        raise ValueError("a Redis Cluster URL names at least one host:port")
    return nodes, node_url(url, *nodes[0])


def node_url(url: str, host: str, port: int) -> str:
    """The ``redis://`` (or ``rediss://``) URL of one node of the cluster of ``url``: its user
    info, path and query, this node's address."""
    scheme, _, rest = url.partition("://")
    netloc = urlsplit(url).netloc
    info, at, _hosts = netloc.rpartition("@")
    base = "rediss" if scheme.lower().startswith("rediss") else "redis"
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{base}://{info}{at}{address}{rest[len(netloc) :]}"


def _host_port(text: str) -> tuple[str, int]:
    host, port = text, DEFAULT_PORT
    if text.startswith("["):  # [IPv6]:port
        end = text.find("]")
        if end < 0:
            raise ValueError(f"not a host:port: {text[:60]!r}")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"not a host:port: {text[:60]!r}")
            port = int(rest[1:])
    elif ":" in text:
        host, _, p = text.rpartition(":")
        port = int(p)
    if not host or not 0 < port < 65536:
        raise ValueError(f"not a host:port: {text[:60]!r}")
    return host, port


def connect(url: str, password: str | None, timeout_s: float) -> ClusterClient:
    """A :class:`ClusterClient` for ``url`` (no network until its first call). The options of
    :func:`.redis_io.connect`: ``timeout_s`` as connect and read timeouts, bounded sockets, no
    health checks, RESP2, no ``CLIENT SETINFO``. Raises ImportError without redis, ValueError
    for options redis-py refuses."""
    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.connection import parse_url
    from redis.retry import Retry

    nodes, first = startup(url)
    kw = parse_url(first)
    for k in ("host", "port", "path", "retry", "retry_on_timeout", "retry_on_error"):
        kw.pop(k, None)
    if int(kw.pop("db", 0) or 0) != 0:
        raise ValueError("a Redis Cluster has only database 0")
    if password and not kw.get("password"):
        kw["password"] = password
    cls = kw.pop("connection_class", redis.Connection)
    kw.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **redis_io.no_setinfo(cls))
    kw.setdefault("protocol", 2)  # RESP2: no HELLO round trip on connect; any Redis or Valkey
    kw.pop("health_check_interval", None)

    def make() -> Any:
        (host, port), others = nodes[0], nodes[1:]
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        rc = RedisCluster(
            url=f"redis://{netloc}",  # how redis-py 5.x builds node pools from connection_pool_class
            startup_nodes=[ClusterNode(h, p) for h, p in others],
            connection_class=cls,
            connection_pool_class=redis_io.bounded_pool_class(),
            # Making it reads the command table from one master (redis-py's default node): a
            # master that is down (a failover under way) is replaced by another on a retry.
            retry=Retry(NoBackoff(), MAKE_RETRIES),
            require_full_coverage=False,  # serve the slots that have a master
            **kw,
        )
        rc.set_retry(Retry(NoBackoff(), 0))
        if hasattr(rc, "cluster_error_retry_attempts"):  # redis-py 5.x: its retries are counted here
            rc.cluster_error_retry_attempts = 0
        return rc

    _quiet_refresh_errors()
    return ClusterClient(make, timeout_s)


def _quiet_refresh_errors() -> None:
    """redis-py's cluster client logs a failed topology refresh (one it runs inside a call, with
    what is left of the call's deadline) at ERROR; a program that configured no logging would
    get it on stderr through Python's last-resort handler. A NullHandler on that logger keeps
    it there for programs that did configure logging, and off the others' stderr (the tier
    counts and warns about failures itself)."""
    log = logging.getLogger("redis.cluster")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())


class ClusterClient:
    """A redis-py ``RedisCluster``, made by the first call that needs it (inside that call's
    bound: making it asks the cluster for its slots); a call that fails to make it fails, and
    the next one tries again. What the tier uses: :meth:`pipeline`, :meth:`node_of`,
    :meth:`split`; the rest is the ``RedisCluster``'s."""

    def __init__(self, make: Callable[[], Any], timeout_s: float = 0.0) -> None:
        self._make = make
        self.timeout_s = timeout_s
        self._rc: Any = None
        self._lock = threading.Lock()
        self._refreshed = 0.0  # when refresh() last asked (monotonic)

    @property
    def cluster(self) -> Any:
        rc = self._rc
        if rc is None:
            with self._lock:
                if self._rc is None:
                    # Making it asks one node for the slots and for its command table (COMMAND,
                    # 100-300 KB, which redis-py reads keys of commands from): more than one
                    # call's deadline and bytes, once per process and client.
                    with aside(max(self.timeout_s, MAKE_S), MAKE_BYTES):
                        self._rc = self._build()
                rc = self._rc
        return rc

    def _build(self) -> Any:
        """The client, or the reason its slot map was refused (:func:`.redis_io.slot_map_problem`)
        raised as :class:`~.backend.Unavailable`: redis-py's own error says only that no node
        answered."""
        redis_io.take_refusal()
        try:
            return self._make()
        except redis_io.failures() as e:
            why = redis_io.take_refusal()
            if why is not None:
                raise Unavailable(why) from e
            raise

    @property
    def ready(self) -> bool:
        return self._rc is not None

    def pipeline(self, transaction: bool = False) -> Any:
        return self.cluster.pipeline(transaction=transaction)

    def node_of(self, key: str) -> str:
        """The address of the master of ``key``'s slot as this client knows it now (no network);
        "" before the client is made or when the slot has no master."""
        rc = self._rc
        if rc is None:
            return ""
        try:
            node = rc.get_node_from_key(key)
        except redis_io.failures():  # a slot the topology does not cover (SlotNotCoveredError)
            return ""
        return node.name if node is not None else ""

    def refresh(self) -> bool:
        """Ask the cluster for its slots again, unless that was done less than :data:`REFRESH_S`
        ago (or the client is not made yet): False then. Network: call it inside a bound."""
        now = time.monotonic()
        with self._lock:
            if self._rc is None or now - self._refreshed < REFRESH_S:
                return False
            self._refreshed = now
            rc = self._rc
        rc.nodes_manager.initialize()
        return True

    def split(self, items: Iterable[T], key: Callable[[T], str]) -> list[tuple[str, list[T]]]:
        """``items`` grouped by the master of each one's key (in order of first appearance)."""
        groups: dict[str, list[T]] = {}
        for it in items:
            groups.setdefault(self.node_of(key(it)), []).append(it)
        return list(groups.items())

    def close(self) -> None:
        rc, self._rc = self._rc, None
        if rc is None:
            return
        # (listed before close(), which may forget them)
        nodes = list(getattr(getattr(rc, "nodes_manager", None), "nodes_cache", {}).values())
        try:
            rc.close()
        finally:
            # Every node's pool disconnected: redis-py before 8.2 makes each node's client with a
            # pool its close() leaves open (its sockets went only at a later garbage collection).
            for node in nodes:
                conn = getattr(node, "redis_connection", None)
                if conn is not None:
                    try:
                        conn.connection_pool.disconnect()
                    except redis_io.failures():  # closing goes on whatever a node's pool met
                        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)
