"""HTTP for the S3 backend: the standard library's ``http.client`` on bounded sockets, requests
signed by botocore (Signature Version 4), and nothing else of botocore's.

Why not botocore's (or boto3's) client: a client's build loads the S3 service model (80-110 ms
on the CI box, with boto3's import 150 ms more; docs/remote.md has the figures), and its calls
cannot be bounded as a whole: urllib3's timeouts bound each socket read, and botocore makes
up to 5 attempts with backoff by default (``legacy`` mode; ``standard``: 3), each a full
timeout. Here every socket is a :class:`~.bounded.BoundedSocket`, so a call ends by the
machinery's deadline however the server trickles, and reads no more than its byte bound; there
is no retry. What botocore does here is what it is for: the standard AWS configuration
(credentials from the environment, profiles, SSO, the container and instance roles; region;
``AWS_ENDPOINT_URL``) and SigV4 signing.

One connection per thread and endpoint (``http.client`` connections are not thread safe), kept
alive between calls, closed after any error (so no half-read response is ever left on one).

TLS is verified against the CA bundle the AWS configuration names (``AWS_CA_BUNDLE``, the
profile's ``ca_bundle``, then ``REQUESTS_CA_BUNDLE``: botocore's order), else the system's
certificates. A proxy is used where botocore would use one, so that a machine set up for the AWS
CLI behind an egress proxy reaches the bucket the same way: ``HTTPS_PROXY`` (``HTTP_PROXY`` for an
``http://`` endpoint), lower case too, skipped for the hosts ``NO_PROXY`` names (Python's
``urllib.request`` reads them, as botocore does). An ``https://`` endpoint goes through a
``CONNECT`` tunnel (TLS end to end with the endpoint), an ``http://`` one sends its requests to
the proxy; credentials in the proxy's URL are sent as ``Proxy-Authorization: Basic``. The proxy
itself is spoken to in plain HTTP: an ``https://`` proxy URL (and botocore's ``proxies_config``)
is refused at open (the tier is off, one warning). Connecting to the proxy and its answer count
against the call's deadline like the rest.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from ...redact import _remember_url_secrets, remember_secret
from .backend import Unavailable
from .bounded import BoundedSocket, time_left

if TYPE_CHECKING:
    from .s3_creds import Credentials

HEADERS_MAX = 64  # response headers read, at most (http.client's own limit is 100)
TUNNEL_ANSWER_MAX = 16 << 10  # a proxy's answer to CONNECT (status line and headers), at most
ERROR_BODY_MAX = 16 << 10  # an error's body (S3's XML: its code) is read up to this, whatever was asked


class Response:
    """A response read within the call's bounds: status, headers (lower-case names), body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class TooLong(Unavailable):
    """A response body longer than the caller may read: ``length`` (from the headers), of a
    response of ``status``. A kind of :class:`~.backend.Unavailable`: only the calls that ask for
    a value's size or bytes take its length (of a success's body: an error's page is no value)."""

    def __init__(self, length: int, headers: dict[str, str], status: int = 200) -> None:
        super().__init__(f"S3 answered {status} with {length} bytes, more than the call reads")
        self.length, self.headers, self.status = length, headers, status


class Proxy:
    """An HTTP proxy (see the module): where it is, and the header its credentials make."""

    __slots__ = ("host", "port", "auth")

    def __init__(self, url: str) -> None:
        # botocore's reading of the variable: a URL without a scheme is http://
        if not url.startswith(("http:", "https:")):
            url = ("http:" if url.startswith("//") else "http://") + url
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(
                "the proxy (HTTPS_PROXY/HTTP_PROXY) must be an http:// URL: kcache speaks plain HTTP "
                "to a proxy (an https:// endpoint is still TLS end to end, through CONNECT)"
            )
        try:
            port = u.port
        except ValueError:
            raise ValueError("the proxy's URL (HTTPS_PROXY/HTTP_PROXY) has a bad port") from None
        self.host, self.port = u.hostname, port or 80
        self.auth = ""
        if u.username is not None and u.password is not None:
            pair = f"{unquote(u.username)}:{unquote(u.password)}".encode()
            self.auth = "Basic " + base64.b64encode(pair).decode("ascii")


def proxy_for(endpoint: str) -> Proxy | None:
    """The proxy botocore would send requests to ``endpoint`` through (``HTTPS_PROXY`` or
    ``HTTP_PROXY`` by its scheme, none for a host in ``NO_PROXY``), or None."""
    import urllib.request

    u = urlsplit(endpoint)
    if urllib.request.proxy_bypass(u.netloc):  # (botocore asks with the netloc too)
        return None
    url = urllib.request.getproxies().get(u.scheme)
    if not url:
        return None
    _remember_url_secrets(url)  # its password is never shown
    proxy = Proxy(url)
    if proxy.auth:
        remember_secret(proxy.auth)
    return proxy


class _Connection(http.client.HTTPConnection):
    """An HTTP(S) connection whose socket is bounded; TLS when ``context`` is given; through
    ``proxy`` when one is given (a CONNECT tunnel for TLS)."""

    def __init__(
        self, host: str, port: int, timeout: float, context: ssl.SSLContext | None, proxy: Proxy | None = None
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._context, self._proxy = context, proxy

    def connect(self) -> None:
        via = self._proxy
        sock = socket.create_connection(
            (via.host, via.port) if via else (self.host, self.port), time_left(self.timeout)
        )
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if via is not None and self._context is not None:
                _tunnel(BoundedSocket(sock), self.host, self.port, via.auth)
            if self._context is not None:
                sock.settimeout(time_left(self.timeout))  # the handshake too
                sock = self._context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:  # re-raised: it only cleans up on the way
            sock.close()
            raise
        self.sock = BoundedSocket(sock)


def _tunnel(sock: BoundedSocket, host: str, port: int, auth: str) -> None:
    """Ask the proxy on ``sock`` for a tunnel to ``host:port`` (``CONNECT``), its answer read
    within the call's bounds. Anything but a 2xx, or an answer that does not end, is an OSError
    (the call fails: :class:`~.backend.Unavailable`)."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if auth:
        lines.append(f"Proxy-Authorization: {auth}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        # byte-wise past the first line's worth: nothing of the endpoint's TLS may be read here
        chunk = sock.recv(1 if answer else 12)
        if not chunk:
            raise ConnectionError("the proxy closed the connection before it answered CONNECT")
        answer += chunk
        if len(answer) > TUNNEL_ANSWER_MAX:
            raise ConnectionError("the proxy's answer to CONNECT does not end")
    status = answer.split(b"\r\n", 1)[0].split(b" ")
    if len(status) < 2 or not status[0].startswith(b"HTTP/") or not status[1].startswith(b"2"):
        shown = b" ".join(status[:2]).decode("latin-1", "replace")[:40]
        raise ConnectionError(f"the proxy refused the tunnel to the S3 endpoint: {shown}")


class Http:
    """Signed requests to one S3 endpoint (see the module), with ``creds``'s snapshot
    (:class:`.s3_creds.Credentials`, made by :meth:`.s3.S3Backend.open`)."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        creds: Credentials,
        timeout_s: float,
        verify: bool = True,
        ca_bundle: str | None = None,
    ) -> None:
        u = urlsplit(endpoint)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an S3 endpoint: {endpoint!r}")
        self.scheme, self.host = u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        default = (u.scheme == "https" and self.port == 443) or (u.scheme == "http" and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.netloc = host if default else f"{host}:{self.port}"
        self.base = f"{self.scheme}://{self.netloc}"
        self.region, self.creds, self.timeout_s = region, creds, timeout_s
        self._context = _tls_context(ca_bundle) if u.scheme == "https" else None
        self.proxy = proxy_for(endpoint)
        if self._context is not None and not verify:
            self._context.check_hostname = False
            self._context.verify_mode = ssl.CERT_NONE
        self._local = threading.local()
        self._all: list[_Connection] = []
        self._lock = threading.Lock()

    def _conn(self) -> _Connection:
        c: _Connection | None = getattr(self._local, "conn", None)
        if c is None:
            c = _Connection(self.host, self.port, self.timeout_s, self._context, self.proxy)
            self._local.conn = c
            with self._lock:
                self._all.append(c)
        return c

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        self._local.conn = None
        if c is not None:
            c.close()
            with self._lock:
                if c in self._all:
                    self._all.remove(c)

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()

    def sign(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes
    ) -> dict[str, str]:
        """The headers of the request, signed (SigV4) with the credentials' snapshot: never
        refreshed here (:mod:`.s3_creds`; expired: :class:`~.backend.Unavailable`)."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        frozen = self.creds.current()
        url = self.base + path + (f"?{query}" if query else "")
        req = AWSRequest(method=method, url=url, data=body, headers={"Host": self.netloc, **headers})
        S3SigV4Auth(frozen, "s3", self.region).add_auth(req)
        return {k: str(v) for k, v in req.headers.items()}

    def request(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        max_body: int = 64 << 10,
    ) -> Response:
        """One request, its response read whole (at most ``max_body`` bytes of a success's body,
        :data:`ERROR_BODY_MAX` of an error's: a longer one raises :class:`TooLong` before any of
        it is read). Raises :class:`~.backend.Unavailable`
        for anything that is not a response (a timeout, the bound, a connection, a response
        that is not HTTP, a body shorter than its length)."""
        signed = self.sign(method, path, query, dict(headers or {}), body)
        target = path + (f"?{query}" if query else "")
        if self.proxy is not None and self._context is None:  # plain HTTP through a proxy: the
            target = self.base + target  # whole URL on the request line (the proxy's to follow)
            if self.proxy.auth:
                signed["Proxy-Authorization"] = self.proxy.auth
        c = self._conn()
        try:
            c.timeout = self.timeout_s
            c.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for k, v in signed.items():
                c.putheader(k, v)
            if body or method in ("PUT", "POST"):
                c.putheader("Content-Length", str(len(body)))
            c.endheaders(body if body else None)
            r = c.getresponse()
            hdrs = {k.lower(): v for k, v in list(r.getheaders())[:HEADERS_MAX]}
            if method == "HEAD" or r.status in (204, 304):
                data = b""
                r.read()
            else:
                length = r.length
                bound = max_body if 200 <= r.status < 300 else ERROR_BODY_MAX
                if length is None or length > bound:
                    self._drop()  # its body is not read: the connection cannot be used again
                    if length is not None:
                        raise TooLong(length, hdrs, r.status)
                    raise Unavailable("an S3 response without a length")
                data = r.read(length)
                if len(data) != length:
                    raise http.client.IncompleteRead(data, length - len(data))
            if r.will_close:
                self._drop()
            return Response(r.status, hdrs, data)
        except ValueError as e:
            # Its text is never shown: http.client's putheader() puts the header's value into it
            # ("Invalid header value b'<a session token with a newline>'": review finding M4).
            self._drop()
            raise Unavailable(f"{type(e).__name__} (a request that cannot be sent: a header or path)") from e
        except (OSError, http.client.HTTPException) as e:
            self._drop()
            raise Unavailable(f"{type(e).__name__}: {e}") from e


def _tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """The system's certificates, or only those of ``ca_bundle`` (a file of PEM certificates, as
    botocore takes it) where the AWS configuration names one."""
    if not ca_bundle:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ValueError) as e:  # (its text may hold the path: not shown)
        raise ValueError(
            f"the CA bundle (AWS_CA_BUNDLE, the profile's ca_bundle or REQUESTS_CA_BUNDLE) cannot be "
            f"loaded: {type(e).__name__}"
        ) from None


def object_path(bucket: str, key: str, path_style: bool) -> str:
    """The request path of ``key`` (quoted as SigV4 signs it for S3: as sent)."""
    quoted = quote(key, safe="/~")
    return f"/{bucket}/{quoted}" if path_style else f"/{quoted}"
