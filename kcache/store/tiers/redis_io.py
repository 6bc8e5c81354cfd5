"""Calls to Redis that end on time and read a bounded number of bytes, whatever the server does.

redis-py's ``socket_timeout`` bounds each socket read, not a call: a server (or a link) that sends
one byte every 90 ms keeps a 100 ms timeout from ever firing while a 32 MiB reply takes minutes
(``redis/_parsers/socket.py``: ``sock.settimeout(socket_timeout)`` and then ``sock.recv`` in a
loop). Here every socket a client of :func:`connect` makes is wrapped so that, inside
:func:`bounded`, each operation on it gets only the time left until the call's deadline, and the
bytes it receives are counted against the call's byte bound:

    with bounded(0.1, max_bytes=64 << 10):
        r.strlen(key)

Past the deadline or over the bound, the next socket operation raises ``socket.timeout``, which
redis-py reports as its ``TimeoutError`` after dropping the connection (so no half-read reply is
ever left on a pooled socket); connecting counts too (the connect timeout is cut to what is left).
Outside :func:`bounded` a socket behaves as redis-py set it (``kcache remote``'s listing). Not
bounded: resolving the host name (the system resolver has its own timeouts).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

_local = threading.local()  # this thread's call: .until (monotonic deadline) and .left (bytes)


class CallBound(socket.timeout):
    """A call passed its deadline or its byte bound (a ``socket.timeout``, so that redis-py drops
    the connection and raises its TimeoutError)."""


@contextlib.contextmanager
def bounded(seconds: float, max_bytes: int | None = None) -> Iterator[None]:
    """Every Redis call of this thread inside the block ends within ``seconds`` in all (connect,
    send, every read) and reads at most ``max_bytes`` bytes (None: any number)."""
    saved = (getattr(_local, "until", None), getattr(_local, "left", None))
    _local.until = time.monotonic() + max(0.0, seconds)
    _local.left = max_bytes
    try:
        yield
    finally:
        _local.until, _local.left = saved


@contextlib.contextmanager
def aside(seconds: float, max_bytes: int | None = None) -> Iterator[None]:
    """Like :func:`bounded`, inside a bounded call, for work that is not the call's own (making a
    cluster client, once per process): its time and bytes are bounded by these, and neither
    counts against the call's (whose deadline moves later by the time spent here)."""
    saved = (getattr(_local, "until", None), getattr(_local, "left", None))
    t0 = time.monotonic()
    _local.until = t0 + max(0.0, seconds)
    _local.left = max_bytes
    try:
        yield
    finally:
        until, left = saved
        _local.until = None if until is None else until + (time.monotonic() - t0)
        _local.left = left


def _time_left(base: float | None) -> float | None:
    """The timeout for the next socket operation: ``base`` (redis-py's own), cut to what is left
    of the call; raises :class:`CallBound` when nothing is."""
    until = getattr(_local, "until", None)
    if until is None:
        return base
    left = until - time.monotonic()
    if left <= 0:
        raise CallBound("kcache: the call to Redis passed its deadline")
    return left if base is None or base > left else base


class _BoundedSocket:
    """A connected socket (plain, Unix or TLS) whose blocking operations honour :func:`bounded`.
    Everything else is the wrapped socket's."""

    __slots__ = ("_sock", "_base")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._base = sock.gettimeout()

    def settimeout(self, value: float | None) -> None:  # redis-py's per-read value; armed per op
        self._base = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._base

    def _arm(self) -> None:
        t = _time_left(self._base)
        if self._sock.gettimeout() != t:
            self._sock.settimeout(t)

    def _count(self, n: int) -> None:
        left = getattr(_local, "left", None)
        if left is None:
            return
        left -= n
        _local.left = left
        if left < 0:
            raise CallBound("kcache: the reply from Redis is larger than this call may read")

    def recv(self, bufsize: int, *flags: int) -> bytes:
        self._arm()
        data = self._sock.recv(bufsize, *flags)
        self._count(len(data))
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, *flags: int) -> int:
        self._arm()
        n = self._sock.recv_into(buffer, nbytes, *flags)
        self._count(n)
        return n

    def sendall(self, data: Any, *flags: int) -> None:
        self._arm()  # since Python 3.5 a timeout bounds the whole sendall
        self._sock.sendall(data, *flags)

    def send(self, data: Any, *flags: int) -> int:
        self._arm()
        return self._sock.send(data, *flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _BoundedMixin:
    """Put before a redis-py connection class: its sockets are :class:`_BoundedSocket`, and
    connecting takes at most what is left of the call. A ``CLUSTERDOWN`` reply is raised as
    :func:`cluster_down` (see there)."""

    socket_connect_timeout: float | None

    def _connect(self) -> Any:
        configured = self.socket_connect_timeout
        self.socket_connect_timeout = _time_left(configured)
        try:
            sock = super()._connect()  # type: ignore[misc]
        finally:
            self.socket_connect_timeout = configured
        return _BoundedSocket(sock)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        from redis.exceptions import ClusterDownError

        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ClusterDownError as e:
            raise cluster_down()(*e.args) from None


_classes: dict[type, type] = {}


def bounded_class(cls: type) -> type:
    """``cls`` (a redis-py connection class) whose sockets honour :func:`bounded`."""
    out = _classes.get(cls)
    if out is None:
        out = _classes[cls] = type(f"Bounded{cls.__name__}", (_BoundedMixin, cls), {})
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
