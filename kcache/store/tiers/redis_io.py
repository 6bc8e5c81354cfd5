"""redis-py connections whose calls end on time and read a bounded number of bytes, whatever the
server does: the Redis side of :mod:`.bounded`.

redis-py's ``socket_timeout`` bounds each socket read, not a call (``redis/_parsers/socket.py``:
``sock.settimeout(socket_timeout)`` and then ``sock.recv`` in a loop). Every socket a client of
:func:`connect` makes is a :class:`~.bounded.BoundedSocket`, and connecting takes at most what is
left of the call, so that inside :func:`.bounded.bounded` a call ends by its deadline: past it or
over the byte bound, redis-py gets a ``socket.timeout``, drops the connection (no half-read reply
is ever left on a pooled socket) and raises its ``TimeoutError``. A ``CLUSTER SLOTS`` reply is
checked before redis-py builds anything from it (:func:`check_slot_map`). Outside a bound a socket
behaves as redis-py set it (``kcache remote``'s listing).
"""

from __future__ import annotations

import threading
from typing import Any

from .bounded import BoundedSocket, time_left

SLOTS = 16384  # a Redis Cluster's hash slots
#: The most nodes (masters and replicas) a cluster's slot map may name: past it the map is
#: refused, so that the client is never built for thousands of nodes (building one node costs a
#: client and a breaker; a slot map naming 4,000 silent masters made the client impossible to
#: build within its bound, and each lookup pay for trying). Real clusters of a cache are far
#: smaller (Redis documents 1,000 nodes as its upper limit for a whole cluster).
MAX_NODES = 256
_refused = threading.local()  # this thread's last refused slot map: .why


class _BoundedMixin:
    """Put before a redis-py connection class: its sockets are :class:`_BoundedSocket`, and
    connecting takes at most what is left of the call. A ``CLUSTERDOWN`` reply is raised as
    :func:`cluster_down` (see there)."""

    socket_connect_timeout: float | None
    _kcache_asked = ""  # the command just sent, when it is one whose reply is checked

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        super().send_command(*args, **kwargs)  # type: ignore[misc]
        words = [a.decode("ascii", "replace") if isinstance(a, bytes) else str(a) for a in args[:2]]
        self._kcache_asked = " ".join(words).upper()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._kcache_asked = ""  # (a pipeline: no reply of it is a slot map)
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def _connect(self) -> Any:
        configured = self.socket_connect_timeout
        self.socket_connect_timeout = time_left(configured)
        try:
            sock = super()._connect()  # type: ignore[misc]
        finally:
            self.socket_connect_timeout = configured
        return BoundedSocket(sock)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        from redis.exceptions import ClusterDownError

        try:
            reply = super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ClusterDownError as e:
            raise cluster_down()(*e.args) from None
        if self._kcache_asked == "CLUSTER SLOTS":
            self._kcache_asked = ""
            why = slot_map_problem(reply)
            if why is not None:
                _refused.why = why
                raise slot_map_refused()(why)
        return reply


def slot_map_problem(reply: Any) -> str | None:
    """Why a ``CLUSTER SLOTS`` reply is refused (None: it is not): more than :data:`MAX_NODES`
    nodes, or ranges that are not slots or cover more than every slot once (redis-py walks every
    slot of every range: a hostile map of overlapping full ranges would cost minutes of CPU)."""
    if not isinstance(reply, list) or len(reply) > SLOTS:
        return "the cluster's slot map is not one"
    nodes: set[tuple[Any, Any]] = set()
    covered = 0
    for rng in reply:
        if not isinstance(rng, list) or len(rng) < 3:
            return "the cluster's slot map is not one"
        lo, hi = rng[0], rng[1]
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi < SLOTS):
            return "the cluster's slot map names slots that are not slots"
        covered += hi - lo + 1
        for node in rng[2:]:
            if not isinstance(node, list) or len(node) < 2:
                return "the cluster's slot map is not one"
            nodes.add((node[0], node[1]))
        if len(nodes) > MAX_NODES:
            return (
                f"the cluster's slot map names more than {MAX_NODES} nodes, the most kcache "
                "takes (docs/remote.md)"
            )
    if covered > SLOTS:
        return "the cluster's slot map covers slots more than once"
    return None


def take_refusal() -> str | None:
    """Why this thread's last ``CLUSTER SLOTS`` reply was refused (once), or None."""
    why = getattr(_refused, "why", None)
    _refused.why = None
    return why


def slot_map_refused() -> type:
    """The error a refused slot map is raised as (an error reply: redis-py then tries the next
    startup node, and fails to build the client when none gives a map it may use)."""
    out = _made.get("slots")
    if out is None:
        from redis.exceptions import ResponseError

        out = _made["slots"] = type("SlotMapRefused", (ResponseError,), {"unavailable": True})
    return out


def failures() -> tuple[type[BaseException], ...]:
    """What a call to a Redis server or cluster raises for a failure of the server, the network or
    the call's bound: redis-py's errors (a cluster's ``RedisClusterException`` is not a
    ``RedisError``) and the socket's (``OSError``: the bound's ``CallBound`` too). Raises
    ImportError without redis."""
    from redis.exceptions import RedisClusterException, RedisError

    return (RedisError, RedisClusterException, OSError)


_classes: dict[type, type] = {}


def bounded_class(cls: type) -> type:
    """``cls`` (a redis-py connection class) whose sockets honour :func:`bounded`."""
    out = _classes.get(cls)
    if out is None:
        from redis.connection import UnixDomainSocketConnection

        # A Unix socket's connection has no host and port, and redis-py (8.2) names them when a
        # connect raises socket.timeout, as the bound does when the call's deadline passed before
        # its connect (a loaded box): an AttributeError, not its TimeoutError. None for both.
        unix = {"host": None, "port": None} if issubclass(cls, UnixDomainSocketConnection) else {}
        out = _classes[cls] = type(f"Bounded{cls.__name__}", (_BoundedMixin, cls), unix)
    return out


_made: dict[str, type] = {}


def cluster_down() -> type:
    """The error a ``CLUSTERDOWN`` reply (a cluster without a master for some slots: the
    seconds of a failover) is raised as on kcache's connections. redis-py's cluster client
    answers its own ``ClusterDownError`` by sleeping 0.25 s and asking the cluster for its
    slots again, inside the call and past its deadline; this one is a plain error reply to it,
    raised to the caller at once (and counted by the tier as a failed call: ``unavailable``)."""
    out = _made.get("down")
    if out is None:
        from redis.exceptions import ResponseError

        out = _made["down"] = type("ClusterDownReply", (ResponseError,), {"unavailable": True})
    return out


def bounded_pool_class() -> type:
    """A redis-py connection pool whose connections are :func:`bounded_class` of the class it is
    given (how a cluster client's pools, one per node, are made bounded: redis-py 5.x builds
    them from the class of a URL, not from the one passed)."""
    out = _made.get("pool")
    if out is None:
        import redis

        def __init__(self: Any, connection_class: type = redis.Connection, **kw: Any) -> None:
            redis.ConnectionPool.__init__(self, connection_class=bounded_class(connection_class), **kw)

        out = _made["pool"] = type("BoundedConnectionPool", (redis.ConnectionPool,), {"__init__": __init__})
    return out


def connect(url: str, password: str | None, timeout_s: float) -> Any:
    """A redis-py client for ``url``: ``timeout_s`` as its connect and per-read timeouts (they win
    over any in the URL's query), sockets bounded by :func:`bounded`, no health checks, no HELLO
    or CLIENT SETINFO round trips, and one retry, at once, only of a command that met a dead
    connection (a pooled socket from before a server restart); never of a timeout (redis-py's
    default is 10 retries with backoff). Raises ImportError without redis."""
    import redis
    from redis.backoff import NoBackoff
    from redis.connection import parse_url
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    kw = parse_url(url)
    if password and not kw.get("password"):
        kw["password"] = password
    kw.update(
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        retry_on_error=[],
        health_check_interval=0,
    )
    cls = kw.get("connection_class", redis.Connection)
    kw.update(no_setinfo(cls))
    kw.setdefault("protocol", 2)  # RESP2: no HELLO round trip on connect; any Redis or Valkey
    kw.pop("retry_on_timeout", None)
    kw["connection_class"] = bounded_class(cls)
    client = redis.Redis(connection_pool=redis.ConnectionPool(**kw))
    # The pool is this client's alone: its close() disconnects it (redis-py closes a pool it was
    # handed only when told to; else every socket stayed open for the life of the process).
    client.auto_close_connection_pool = True
    return client


def no_setinfo(cls: type) -> dict[str, Any]:
    """The keyword that turns off the CLIENT SETINFO round trips on connect, in this redis-py:
    ``driver_info=None`` (8.x) or ``lib_name=None`` (5.x to 7.x, deprecated in 8)."""
    import inspect

    params: set[str] = set()
    for c in cls.__mro__:
        init = c.__dict__.get("__init__")
        if init is not None:
            params |= set(inspect.signature(init).parameters)
    if "driver_info" in params:
        return {"driver_info": None}
    if "lib_name" in params:
        return {"lib_name": None, "lib_version": None}
    return {}
