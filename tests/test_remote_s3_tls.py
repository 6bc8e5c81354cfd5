"""Where the S3 backend sends its requests, and over what: the address of a bucket whose name has a
dot (path-style, as botocore's), TLS verified against the CA bundle the AWS configuration names
(``AWS_CA_BUNDLE``, the profile's ``ca_bundle``), and the proxy botocore would use
(``HTTPS_PROXY``/``HTTP_PROXY``, ``NO_PROXY``).

Real servers: moto's S3 server over HTTPS with a certificate signed by a CA made here (the
``cryptography`` package, which moto needs anyway), moto's plain-HTTP server of the session, and an
HTTP proxy of this file on 127.0.0.1 (``CONNECT`` tunnels and absolute-form requests relayed byte
for byte; it notes what each connection asked for).

Before: ``s3://my.bucket`` went to ``my.bucket.s3.REGION.amazonaws.com`` (no certificate of S3's
covers it: the tier never worked); ``AWS_CA_BUNDLE`` and the profile's ``ca_bundle`` were not read
(a store behind a private CA failed every call); proxies were not used (where the only way out is
the proxy, every call failed).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import PROXY_VARIABLES, S3Server
from tier_stores import Stores, counts, flushed

from kcache import config
from kcache.store.tiers import backend_for
from kcache.store.tiers.s3_http import object_path

pytestmark = pytest.mark.usefixtures("stores_closed")
pytest.importorskip("botocore")


def make_ca_and_certificate(folder: Path) -> tuple[Path, Path, Path]:
    """(a certificate for 127.0.0.1, its key, the CA that signed it), as PEM files in ``folder``."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kcache tests CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "server.pem", folder / "server.key", folder / "ca.pem"
    paths[0].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths[2].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return paths


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory):
    """moto's S3 server over HTTPS, its certificate signed by a CA of the tests'."""
    pytest.importorskip("moto.server")
    folder = tmp_path_factory.mktemp("s3-tls")
    server = S3Server(folder, tls=make_ca_and_certificate(folder))
    yield server
    server.stop()


@pytest.fixture
def tls_s3(tls_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The HTTPS server, this process's AWS configuration pointing at it: no CA bundle, no
    proxy (each test sets what it is about)."""
    for k, v in tls_server.env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_SESSION_TOKEN", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(k, raising=False)
    for k in ("REQUESTS_CA_BUNDLE", *PROXY_VARIABLES):
        monkeypatch.delenv(k, raising=False)
    return tls_server


def shared_between_two_stores(stores: Stores, bucket: str, prefix: str) -> tuple[bool, dict[str, float]]:
    """A put from store a, a get from store b: (b hit it, b's counts)."""
    url = f"s3://{bucket}/p"
    a, b = stores(f"a{prefix}", url, prefix), stores(f"b{prefix}", url, prefix)
    files = {"k.json": b'{"name": "k"}', "k.cubin": os.urandom(3000)}
    a.put("triton", "K", files, compile_s=0.5)
    flushed(a)
    hit = b.get("triton", "K")
    return hit is not None and {n: hit.read(n) for n in files} == files, counts(b)


# ------------------------------------------------------------------------------------ addressing
def on_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> None:
    """Amazon's S3 (no endpoint configured), credentials of the tests, and only ``env`` besides:
    nothing of the machine's AWS configuration. (Nothing is asked of AWS: opening the backend
    makes no request.)"""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "kcache-tests")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "kcache-tests-secret-key")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_a_bucket_with_a_dot_is_addressed_path_style_as_botocore_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import botocore.session

    on_aws(monkeypatch, tmp_path, AWS_DEFAULT_REGION="eu-west-1")  # (botocore's client reads no AWS_REGION)
    client = botocore.session.get_session().create_client("s3")
    for bucket, host in (
        ("my.kcache.bucket", "s3.eu-west-1.amazonaws.com"),  # the certificate: *.s3.eu-west-1.amazonaws.com
        ("my-kcache-bucket", "my-kcache-bucket.s3.eu-west-1.amazonaws.com"),
    ):
        backend = backend_for(config.load({"KCACHE_REMOTE": f"s3://{bucket}/p"}))
        assert backend is not None
        backend.open()  # (no request: the endpoint and the credentials)
        try:
            url = backend.endpoint + object_path(bucket, "p/kcache:e/triton/x", backend.path_style)
        finally:
            backend.close()
        assert urlsplit(url).hostname == host, url
        if "." in bucket:  # where botocore's own client sends the same request
            theirs = client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": "p/kcache:e/triton/x"}
            )
            assert url == theirs.split("?")[0]


def botocore_request_url(region: str, bucket: str, key: str, **flags: str) -> str | None:
    """The URL botocore's own S3 client sends a HEAD of ``key`` to (caught before it is sent),
    with ``AWS_USE_*`` flags; None where botocore refuses to resolve an endpoint."""
    import botocore.session
    from botocore.exceptions import EndpointResolutionError

    class Caught(Exception):
        pass

    session = botocore.session.get_session()
    for k, v in flags.items():
        session.set_config_variable(k, v == "true")
    client = session.create_client("s3", region_name=region)
    seen: list[str] = []

    def catch(request: object, **_: object) -> None:
        seen.append(request.url)  # type: ignore[attr-defined]
        raise Caught

    client.meta.events.register("before-send", catch)
    try:
        client.head_object(Bucket=bucket, Key=key)
    except Caught:
        return seen[0]
    except EndpointResolutionError:
        return None
    raise AssertionError("botocore sent the request")


@pytest.mark.parametrize(
    "region", ["eu-west-1", "us-east-1", "cn-north-1", "us-gov-west-1", "us-iso-east-1", "eusc-de-east-1"]
)
@pytest.mark.parametrize("fips", ["false", "true"])
@pytest.mark.parametrize("dualstack", ["false", "true"])
def test_every_partition_fips_and_dual_stack_are_addressed_as_botocore_does(
    region: str, fips: str, dualstack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """China's, GovCloud's, the isolated and the sovereign partitions are not ``amazonaws.com``;
    ``AWS_USE_FIPS_ENDPOINT`` and ``AWS_USE_DUALSTACK_ENDPOINT`` change the host (before: every
    region went to ``s3.REGION.amazonaws.com`` and both settings were ignored). Where botocore
    refuses (FIPS in China), the tier is refused too: a ValueError at opening, one warning."""
    on_aws(
        monkeypatch,
        tmp_path,
        AWS_REGION=region,
        AWS_USE_FIPS_ENDPOINT=fips,
        AWS_USE_DUALSTACK_ENDPOINT=dualstack,
    )
    key = "p/kcache:e/triton/x"
    for bucket in ("kcache-bucket", "my.kcache.bucket"):
        theirs = botocore_request_url(
            region, bucket, key, use_fips_endpoint=fips, use_dualstack_endpoint=dualstack
        )
        backend = backend_for(config.load({"KCACHE_REMOTE": f"s3://{bucket}/p"}))
        assert backend is not None
        if theirs is None:
            with pytest.raises(ValueError, match="FIPS"):
                backend.open()
            continue
        backend.open()  # (no request: the endpoint and the credentials)
        try:
            ours = backend.endpoint + object_path(bucket, key, backend.path_style)
        finally:
            backend.close()
        if region == "us-east-1" and fips == dualstack == "false":  # botocore's legacy global host
            theirs = theirs.replace("s3.amazonaws.com", "s3.us-east-1.amazonaws.com")
        assert ours == theirs


def test_a_region_that_is_no_host_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The region goes into the host: one that would change the host is a setting's error."""
    for region in ("evil.example/x", "eu-west-1.evil.example", "eu west"):
        on_aws(monkeypatch, tmp_path, AWS_REGION=region)
        backend = backend_for(config.load({"KCACHE_REMOTE": "s3://kcache-bucket/p"}))
        assert backend is not None
        with pytest.raises(ValueError, match="region"):
            backend.open()


def test_aws_region_is_the_region_before_aws_default_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the AWS CLI takes them (botocore reads only AWS_DEFAULT_REGION): the docs, and the
    warning about a bucket in another region, say "set AWS_REGION"."""
    on_aws(monkeypatch, tmp_path, AWS_REGION="ap-south-1", AWS_DEFAULT_REGION="us-east-2")
    backend = backend_for(config.load({"KCACHE_REMOTE": "s3://kcache-bucket/p"}))
    assert backend is not None
    backend.open()
    backend.close()
    assert backend.region == "ap-south-1"
    assert backend.endpoint == "https://kcache-bucket.s3.ap-south-1.amazonaws.com"


# ------------------------------------------------------------------------------------ TLS
def test_tls_is_verified_against_the_ca_bundle_the_aws_configuration_names(
    tls_s3: S3Server, stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = tls_s3.bucket()
    assert tls_s3.endpoint.startswith("https://")
    # the server's CA is no system CA: without a bundle, every call fails (no entry crosses)
    crossed, c = shared_between_two_stores(stores, bucket, "none:")
    assert not crossed and c.get("remote_errors", 0) >= 1 and not c.get("remote_hits"), c
    # AWS_CA_BUNDLE names it
    monkeypatch.setenv("AWS_CA_BUNDLE", tls_s3.ca)
    crossed, c = shared_between_two_stores(stores, bucket, "env:")
    assert crossed and c.get("remote_errors", 0) == 0, c
    # the profile's ca_bundle (botocore's setting), no variable
    monkeypatch.delenv("AWS_CA_BUNDLE")
    profile = tmp_path / "aws-config"
    profile.write_text(f"[default]\nca_bundle = {tls_s3.ca}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(profile))
    crossed, c = shared_between_two_stores(stores, bucket, "profile:")
    assert crossed and c.get("remote_errors", 0) == 0, c


def test_a_ca_bundle_that_cannot_be_loaded_turns_the_tier_off_with_a_warning(
    tls_s3: S3Server,
    stores: Stores,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kcache_warnings: list[str],
) -> None:
    monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "no-such-bundle.pem"))
    store = stores("a", f"s3://{tls_s3.bucket()}/p", "k:")
    assert store.get("triton", "K") is None  # a local miss; the tier is off, nothing raised
    assert any("CA bundle" in w and "shared tier off" in w for w in kcache_warnings), kcache_warnings
    assert not any("no-such-bundle" in w for w in kcache_warnings)  # (no path shown)


# ------------------------------------------------------------------------------------ proxies
class Proxy:
    """An HTTP proxy on 127.0.0.1: ``CONNECT`` tunnels and absolute-form requests, relayed byte for
    byte to where they name. ``seen``: each connection's first request line and its
    ``Proxy-Authorization``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _keep(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.append(s)

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._listener.accept()
            except OSError:
                return
            self._keep(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                byte = c.recv(1)
                if not byte:
                    return
                head += byte
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            auth = next(
                (
                    ln.split(":", 1)[1].strip()
                    for ln in lines
                    if ln.lower().startswith("proxy-authorization:")
                ),
                "",
            )
            self.seen.append((f"{method} {target}", auth))
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
            else:
                u = urlsplit(target)
                host, port = u.hostname or "", str(u.port)
            up = socket.create_connection((host, int(port)), 10)
            up.settimeout(None)
            self._keep(up)
            if method == "CONNECT":
                c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up.sendall(head)
            threading.Thread(target=self._pump, args=(up, c), daemon=True).start()
            self._pump(c, up)
        except OSError:
            pass

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._socks:
                s.close()


@pytest.fixture
def proxy():
    p = Proxy()
    yield p
    p.close()


def test_an_https_endpoint_is_reached_through_the_proxy_botocore_would_use(
    tls_s3: S3Server, stores: Stores, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    bucket = tls_s3.bucket()  # (the tests' own client: no proxy yet)
    monkeypatch.setenv("AWS_CA_BUNDLE", tls_s3.ca)
    user, password = "fleet", "pass@word"
    monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", f"http://{user}:pass%40word@"))
    crossed, c = shared_between_two_stores(stores, bucket, "proxied:")
    assert crossed and c.get("remote_errors", 0) == 0, c
    target = f"CONNECT 127.0.0.1:{urlsplit(tls_s3.endpoint).port}"
    basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    assert proxy.seen and all(s == (target, basic) for s in proxy.seen), proxy.seen
    # NO_PROXY names the host: straight to it
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    before = len(proxy.seen)
    crossed, c = shared_between_two_stores(stores, bucket, "direct:")
    assert crossed and c.get("remote_errors", 0) == 0, c
    assert len(proxy.seen) == before


def test_an_http_endpoint_sends_its_requests_to_the_proxy(
    s3, stores: Stores, proxy: Proxy, monkeypatch
) -> None:  # noqa: ANN001
    bucket = s3.bucket()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    crossed, c = shared_between_two_stores(stores, bucket, "proxied:")
    assert crossed and c.get("remote_errors", 0) == 0, c
    assert proxy.seen, "no request went through the proxy"
    for line, auth in proxy.seen:  # the whole URL on the request line: the proxy's to follow
        assert line.split(" ")[1].startswith(f"{s3.endpoint}/{bucket}/p/"), line
        assert auth == ""


def test_an_https_proxy_url_is_refused_with_a_warning(
    tls_s3: S3Server, stores: Stores, monkeypatch: pytest.MonkeyPatch, kcache_warnings: list[str]
) -> None:
    bucket = tls_s3.bucket()
    monkeypatch.setenv("AWS_CA_BUNDLE", tls_s3.ca)
    monkeypatch.setenv("HTTPS_PROXY", "https://127.0.0.1:9")
    store = stores("a", f"s3://{bucket}/p", "k:")
    assert store.get("triton", "K") is None
    assert any("http:// URL" in w and "shared tier off" in w for w in kcache_warnings), kcache_warnings
