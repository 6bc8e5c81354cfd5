"""Calls that end on time and read a bounded number of bytes, whatever the server or link does.

A client library's socket timeout bounds each socket read, not a call: a server (or a link) that
sends one byte every 90 ms keeps a 100 ms timeout from ever firing while a 32 MiB reply takes
minutes (redis-py: ``sock.settimeout(socket_timeout)`` and then ``sock.recv`` in a loop; the same
holds for ``http.client``). Every socket a backend of the shared tier opens is wrapped in a
:class:`BoundedSocket`, so that, inside :func:`bounded`, each operation on it gets only the time
left until the call's deadline, and the bytes it receives are counted against the call's byte
bound::

    with bounded(0.1, max_bytes=64 << 10):
        backend.size(kind, ident)

Past the deadline or over the bound, the next socket operation raises :class:`CallBound` (a
``socket.timeout``: client libraries then drop the connection, so no half-read reply is ever left
on a pooled socket); connecting counts too (:func:`time_left` is the connect timeout to use). The
machinery of the tier (:mod:`.shared`) sets the bound of every call; backends wrap their sockets.
Outside :func:`bounded` a socket behaves as its library set it. Not bounded: resolving a host name
(the system resolver has its own timeouts).
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

_local = threading.local()  # this thread's call: .until (monotonic deadline) and .left (bytes)


class CallBound(socket.timeout):
    """A call passed its deadline or its byte bound (a ``socket.timeout``, so that a client
    library drops the connection: redis-py raises its TimeoutError)."""


@contextlib.contextmanager
def bounded(seconds: float, max_bytes: int | None = None) -> Iterator[None]:
    """Every call of this thread to the shared tier inside the block ends within ``seconds`` in all (connect,
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


def time_left(base: float | None) -> float | None:
    """The timeout for the next socket operation: ``base`` (the library's own), cut to what is left
    of the call; raises :class:`CallBound` when nothing is."""
    until = getattr(_local, "until", None)
    if until is None:
        return base
    left = until - time.monotonic()
    if left <= 0:
        raise CallBound("kcache: the call to the shared tier passed its deadline")
    return left if base is None or base > left else base


class BoundedSocket:
    """A connected socket (plain, Unix or TLS) whose blocking operations honour :func:`bounded`.
    Everything else is the wrapped socket's."""

    __slots__ = ("_sock", "_base", "_readers", "_closing")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._base = sock.gettimeout()
        self._readers = 0  # files of makefile() still open: close() waits for them, as a socket's
        self._closing = False

    def settimeout(self, value: float | None) -> None:  # the library's per-read value; armed per op
        self._base = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._base

    def _arm(self) -> None:
        t = time_left(self._base)
        if self._sock.gettimeout() != t:
            self._sock.settimeout(t)

    def _count(self, n: int) -> None:
        left = getattr(_local, "left", None)
        if left is None:
            return
        left -= n
        _local.left = left
        if left < 0:
            raise CallBound("kcache: the reply is larger than this call may read")

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

    def makefile(self, mode: str = "rb", buffering: int | None = None, **_kw: Any) -> io.BufferedReader:
        """A reader whose reads go through :meth:`recv_into`, so bounded (``http.client`` reads a
        response through ``sock.makefile("rb")``; the plain socket's would not be bounded)."""
        if "w" in mode:
            raise ValueError("a bounded socket's file is for reading")
        self._readers += 1
        return io.BufferedReader(_Reader(self), buffering or io.DEFAULT_BUFFER_SIZE)

    def close(self) -> None:
        """Close the socket, once every file :meth:`makefile` made is closed (``http.client``
        closes a connection it hands to a response that will read to the end: the socket must
        live until the response is read, as a plain socket's does)."""
        self._closing = True
        if self._readers <= 0:
            self._sock.close()

    def _reader_closed(self) -> None:
        self._readers -= 1
        if self._closing and self._readers <= 0:
            self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Reader(io.RawIOBase):
    def __init__(self, sock: BoundedSocket) -> None:
        super().__init__()
        self._s = sock

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._s.recv_into(b)

    def close(self) -> None:
        if not self.closed:
            self._s._reader_closed()
        super().close()
