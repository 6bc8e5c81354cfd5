"""The S3 backend of the shared tier: Amazon S3, or any S3-compatible object storage (MinIO, Ceph,
R2, GCS's XML API...): ``KCACHE_REMOTE=s3://BUCKET[/PREFIX]``.

Where the bucket is and who asks come from the standard AWS configuration, as for the AWS CLI:
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` (or ``endpoint_url`` in the profile) for another
store than AWS's, ``AWS_REGION``/``AWS_DEFAULT_REGION`` (or the profile's), credentials from the
environment, ``AWS_PROFILE`` and the shared files, SSO, a container's or an instance's role. With
an endpoint URL, requests are path-style (``endpoint/BUCKET/key``: what MinIO and most others
take); without, virtual-hosted (``BUCKET.s3.REGION.amazonaws.com``), except for a bucket whose
name has a dot: path-style at ``s3.REGION.amazonaws.com``, as botocore does (S3's certificate,
``*.s3.REGION.amazonaws.com``, covers one label, never ``my.bucket``). TLS is verified against
``AWS_CA_BUNDLE`` or the profile's ``ca_bundle`` (then ``REQUESTS_CA_BUNDLE``) where one is set,
else the system's certificates; a proxy is used as botocore uses one (:mod:`.s3_http`).

The operations the machinery (:mod:`.shared`) asks for, on objects under
``PREFIX/<KCACHE_REMOTE_PREFIX>``:

- an entry is the object ``e/<kind>/<id>``: its size a ranged ``GET`` of one byte (the
  ``Content-Range`` total), its bytes a ranged ``GET``
  (``Range: bytes=0-<bound-1>``; a ``Content-Range`` total or a length over the bound is refused
  before a byte of the body is read), its version the ``ETag``; a bad entry is deleted with
  ``If-Match: <ETag>`` (a newer one stays);
- writes are one request each (S3 has no pipeline), in the writer's thread, each a call with
  its own deadline (:meth:`S3Backend.split`), as are a lease's renewals;
- a lease is the object ``l/<id>``: created with ``If-None-Match: *`` (S3's conditional write:
  one creator wins, the others get 412), renewed and released only with ``If-Match`` the ETag
  this process wrote, replaced (a holder that died) with ``If-Match`` the ETag seen. S3 has no
  expiry: a lease expires :data:`.lease.LOCK_TTL_S` after its last write, by the server's own
  clock (``Date`` minus ``Last-Modified``, whole seconds: a second more for that), so clocks of
  machines never matter.

Every call is bounded as a whole (:mod:`.s3_http`): no retries (botocore's client makes up to 5 attempts by default,
with backoff), a deadline for the call however the server trickles, a byte bound. Statuses:
404 is a miss, 412 and 409 a lost race, 403 and 400 an answer about one key
(:class:`~.backend.Answered`: the machinery counts them, and turns the tier off when every
request gets one), 5xx (``SlowDown``, ``InternalError``), redirects (the bucket is in another
region: not followed), the answers about this process's access rather than a key
(:data:`NOT_ABOUT_A_KEY`: ``ExpiredToken``, ``InvalidAccessKeyId``, ``NoSuchBucket``...) and
anything that is not a response :class:`~.backend.Unavailable`. An error's status is its answer
whatever its body (a proxy's long HTML page is not read).
"""

from __future__ import annotations

import email.utils
import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from ...redact import _remember_url_secrets
from .backend import GONE, Answered, Backend, LeaseView, Op, Outcome, TierConfig, TooLarge, Unavailable
from .lease import LOCK_TTL_S, VALUE_MAX
from .s3_creds import Credentials
from .s3_http import Http, Response, TooLong, object_path

T = TypeVar("T")
ENTRY, LEASE = "e/", "l/"
#: ``Date`` and ``Last-Modified`` are whole seconds: a lease's age may read up to a second more
#: than it is, so it lives this much longer here (a holder's heartbeat, every 0.5 s, is never
#: taken for an expired lease on a loaded machine).
CLOCK_STEP_S = 1.0
_BUCKET_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789.-")
#: S3's error codes that are about this process's access or the bucket, not one key: every
#: request would get the same, so each is a failed call (the breaker, the budget, a warning
#: that names it), not an answer about a key.
NOT_ABOUT_A_KEY = frozenset(
    {
        "PermanentRedirect",  # 301: the bucket is in another region
        "TemporaryRedirect",  # 307
        "AuthorizationHeaderMalformed",  # 400: signed for another region
        "ExpiredToken",  # 400: AWS_SESSION_TOKEN expired
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidAccessKeyId",  # 403
        "SignatureDoesNotMatch",
        "RequestTimeTooSkewed",  # this machine's clock
        "AccountProblem",
        "AllAccessDisabled",
        "NoSuchBucket",  # 404: not a miss
    }
)


class S3Backend(Backend):
    """S3-compatible object storage (see the module)."""

    name = "s3"
    schemes = ("s3",)
    url_forms = "s3://bucket/prefix (endpoint, region and credentials: the standard AWS configuration)"
    extra = "s3"
    leases = True
    #: An object store answers in tens of milliseconds, a p99 in hundreds (and a first request
    #: opens a TLS connection): 100 ms, Redis's deadline, would fail good calls. Five of these
    #: are the budget (2.5 s of failed calls per 30 s, at most, for a bucket that hangs).
    default_timeout_s = 0.5
    #: A look is two requests (the lease, the entry's size), each 10-30 ms to S3's first byte and
    #: billed: a waiter looking every 10 ms (Redis's pace) would keep one in flight at all times,
    #: and every machine waiting adds its requests to the compiling machine's.
    poll_s = (0.03, 0.2)

    def __init__(self, cfg: TierConfig) -> None:
        super().__init__(cfg)
        u = urlsplit(cfg.url)
        self.bucket = u.netloc
        path = u.path.strip("/")
        self.root = (path + "/" if path else "") + cfg.prefix
        self._http: Http | None = None
        self._creds: Credentials | None = None
        self.endpoint = ""
        self.region = ""
        self.path_style = True
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}  # ident -> ETag of the lease this process last wrote
        self._seen: dict[str, tuple[bytes, str]] = {}  # ident -> (value, ETag) of a lease last read

    # ------------------------------------------------------------------ settings
    @classmethod
    def check_url(cls, url: str) -> str:
        u = urlsplit(url)
        bucket = u.netloc
        if "@" in bucket or ":" in bucket:
            raise ValueError(
                "s3:// takes no user, password or port: credentials and the endpoint come from the "
                "AWS configuration (AWS_ENDPOINT_URL, AWS_PROFILE, a role)"
            )
        if not 3 <= len(bucket) <= 63 or not set(bucket) <= _BUCKET_CHARS or not bucket[0].isalnum():
            raise ValueError(f"not an S3 bucket name: {bucket[:70]!r} (expected s3://bucket/prefix)")
        if u.query or u.fragment:
            raise ValueError("s3:// takes no query or fragment (expected s3://bucket/prefix)")
        path = u.path.strip("/")
        if len(path) > 256 or any(not (c.isalnum() or c in "_.:/-") for c in path):
            raise ValueError(f"the prefix may hold letters, digits and _.:/- only, got {path[:70]!r}")
        return url

    # ------------------------------------------------------------------ life
    def open(self) -> None:
        """botocore's session: the region, the endpoint and the credentials (botocore's chain
        resolved now, on the program's thread, as part of its start: an instance role asks the
        metadata service, with botocore's own timeouts, capped here at 1 s and one attempt unless
        configured; a ``credential_process`` runs once). Credentials that expire are refreshed
        only in the background (:mod:`.s3_creds`, :meth:`upkeep`), never by a call. What the AWS
        configuration refuses (a profile this machine lacks, partial credentials, a
        ``credential_process`` that fails, ...) is a ``ValueError``: the tier is off, one warning."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._open()
        except (BotoCoreError, ClientError) as e:  # (every botocore exception is one of the two)
            raise ValueError(f"the AWS configuration: {type(e).__name__}: {e}") from e

    def _open(self) -> None:
        import botocore.session
        from botocore.configprovider import ConfiguredEndpointProvider

        session = botocore.session.get_session()
        for var, value in (("metadata_service_timeout", 1), ("metadata_service_num_attempts", 1)):
            if session.get_config_variable(var) in (None, 1, "1"):
                session.set_config_variable(var, value)
        # AWS_REGION first, as the AWS CLI and the other SDKs take it (botocore reads only
        # AWS_DEFAULT_REGION and the profile's; the docs, and the warning about a bucket in another
        # region, name AWS_REGION)
        self.region = os.environ.get("AWS_REGION") or session.get_config_variable("region") or "us-east-1"
        endpoint = None
        scoped = session.get_scoped_config()  # the profile's settings
        if not _flag(session.get_config_variable("ignore_configured_endpoint_urls")):
            endpoint = ConfiguredEndpointProvider(
                full_config=session.full_config, scoped_config=scoped, client_name="s3"
            ).provide()
        s3_section = scoped.get("s3")
        s3_section = s3_section if isinstance(s3_section, dict) else {}
        self.endpoint, self.path_style = endpoint_for(
            self.bucket,
            self.region,
            endpoint,
            fips=_flag(session.get_config_variable("use_fips_endpoint")),
            dualstack=_flag(session.get_config_variable("use_dualstack_endpoint"))
            or _flag(s3_section.get("use_dualstack_endpoint")),
            suffix=None if endpoint else dns_suffix(session.get_data("partitions"), self.region),
        )
        _remember_url_secrets(self.endpoint)  # (a password in AWS_ENDPOINT_URL: never shown)
        # botocore's order: the AWS setting (AWS_CA_BUNDLE, the profile's ca_bundle), then
        # requests' variable, then the default certificates (botocore's: certifi's; here: the system's)
        ca_bundle = session.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE") or None
        found = session.get_credentials()
        if found is None:
            raise ValueError("no AWS credentials (the environment, AWS_PROFILE, or a role)")
        self._creds = Credentials(found)
        self._http = Http(self.endpoint, self.region, self._creds, self.cfg.timeout_s, ca_bundle=ca_bundle)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def wants_upkeep(self) -> bool:
        return self._creds is not None and self._creds.refreshable

    def upkeep(self) -> float | None:
        """The credentials refreshed ahead of their expiry (:mod:`.s3_creds`)."""
        return self._creds.refresh() if self._creds is not None else None

    def _req(
        self, method: str, key: str, *, headers: dict[str, str] | None = None, body: bytes = b"",
        max_body: int = 64 << 10, query: str = "", bucket_level: bool = False,
    ) -> Response:  # fmt: skip
        if self._http is None:
            raise Unavailable("not open")
        if bucket_level:
            path = f"/{self.bucket}/" if self.path_style else "/"
        else:
            path = object_path(self.bucket, key, self.path_style)
        try:
            r = self._http.request(method, path, query=query, headers=headers, body=body, max_body=max_body)
        except TooLong as e:
            if 200 <= e.status < 300:
                raise  # a success's body over what was asked: size() and read() take its length
            # An error's body over 16 KiB (a proxy's HTML page): its status is the answer, and its
            # length no entry's size (it was once taken for one: "not reading an entry of 20013
            # bytes", and two requests a lookup).
            r = Response(e.status, e.headers, b"")
        if r.status >= 500:
            raise Unavailable(f"S3 answered {r.status} {_code(r)}".strip())
        if r.status >= 300 and r.status != 304:
            code = _code(r)
            if 300 <= r.status < 400 or code in NOT_ABOUT_A_KEY:
                raise Unavailable(self._not_a_key(r, code))
        return r

    def _not_a_key(self, r: Response, code: str) -> str:
        """What an answer that is about this process's access, not one key, says (a warning's
        text: the status, S3's code, where the bucket is; never a credential)."""
        text = f"S3 answered {r.status} {code}".strip()
        where = _word(r.headers.get("x-amz-bucket-region", "")) or _tag(r, "Region")
        if where and where != self.region:
            text += f": the bucket is in {where}, not {self.region} (set AWS_REGION={where})"
        elif 300 <= r.status < 400:
            text += ": a redirect, not followed (the endpoint or the region?)"
        return text

    @property
    def entries_prefix(self) -> str:
        return self.root + ENTRY

    def _key(self, kind: str, ident: str) -> str:
        return f"{self.root}{ENTRY}{kind}/{ident}"

    def _lease_key(self, ident: str) -> str:
        return f"{self.root}{LEASE}{ident}"

    def split(self, items: Sequence[T], ident: Callable[[T], str], writer: bool = False) -> list[list[T]]:
        """One item a call: S3 has no pipeline, so a batch is one request per item in sequence,
        and under one call's deadline a few at a far store's latency passed it (12 lease renewals
        at 60 ms: every heartbeat failed, the leases expired, and the breaker turned lookups off).
        Each write and each renewal gets its own deadline."""
        return [[it] for it in items]

    # ------------------------------------------------------------------ entries
    def size(self, kind: str, ident: str) -> int:
        """A ranged ``GET`` of its first byte: the size is the ``Content-Range`` total (one byte
        read; ``HEAD`` would do too, but needs the same permission and some servers answer it
        without a reason when refused)."""
        try:
            r = self._req("GET", self._key(kind, ident), headers={"Range": "bytes=0-0"}, max_body=1)
        except TooLong as e:  # a server that ignores Range: its length, and not a byte of it read
            return e.length  # (of a success: _req answers an error's long page by its status)
        if r.status in (404, 416):  # (416: an empty object, ``bytes */0``: nothing to take)
            return 0
        _ok(r)
        total = _total(r)
        return total if total is not None else 0

    def read(self, kind: str, ident: str, size: int, limit: int) -> tuple[bytes, str] | None:
        try:
            r = self._req(
                "GET", self._key(kind, ident), headers={"Range": f"bytes=0-{limit - 1}"}, max_body=limit
            )
        except TooLong as e:
            raise TooLarge(e.length) from None
        if r.status in (404, 416):
            return None
        _ok(r)
        total = _total(r)
        if total is not None and total > limit:
            raise TooLarge(total)  # (its body, at most the bound, was read: never more)
        return r.body, r.headers.get("etag", "")

    def write(self, ops: Sequence[Op]) -> list[Outcome]:
        out: list[Outcome] = []
        for i, op in enumerate(ops):
            try:
                if op.op == "put":
                    assert op.value is not None
                    out.append(_outcome(self._req("PUT", self._key(op.kind, op.ident), body=op.value)))
                elif op.op == "delete":
                    cond = {"If-Match": op.version} if op.version else {}
                    r = self._req("DELETE", self._key(op.kind, op.ident), headers=cond)
                    out.append(
                        True if r.status in (200, 204) else False if r.status in (404, 412) else _answer(r)
                    )
                else:
                    out.append(True)
                if op.release:
                    self._release(op.ident, op.release)
            except Unavailable as e:
                if i == 0:
                    raise  # the first call failed: the store does not answer (not one key)
                out += [e] * (len(ops) - i)  # the rest are not tried: the link is failing
                break
        return out

    # ------------------------------------------------------------------ leases
    def _read_lease(self, ident: str) -> tuple[bytes | None, int]:
        """(value, time to live in ms) of ``ident``'s lease, by the server's clock."""
        try:
            r = self._req(
                "GET",
                self._lease_key(ident),
                headers={"Range": f"bytes=0-{VALUE_MAX}"},
                max_body=VALUE_MAX + 1,
            )
        except TooLong:
            return b"\0too long", int(LOCK_TTL_S * 1000)  # not a lease: a foreign value
        if r.status in (404, 416):
            return None, GONE
        _ok(r)
        age = _age_s(r)
        etag = r.headers.get("etag", "")
        with self._lock:
            self._seen[ident] = (r.body, etag)
        life = LOCK_TTL_S + CLOCK_STEP_S
        ttl = int((life - age) * 1000) if age is not None else int(LOCK_TTL_S * 1000)
        return (r.body or None), ttl

    def lease_take(self, kind: str, ident: str, value: bytes, ttl_ms: int) -> LeaseView:
        r = self._req("PUT", self._lease_key(ident), headers={"If-None-Match": "*"}, body=value)
        taken = r.status == 200
        if taken:
            with self._lock:
                self._held[ident] = r.headers.get("etag", "")
        elif r.status not in (409, 412):
            _answer_raise(r)
        raw, ttl = (value, ttl_ms) if taken else self._read_lease(ident)
        if not taken and raw is not None and ttl <= 0:  # expired (its holder died): take it over
            taken = self.lease_replace(ident, raw, value, ttl_ms)
            raw, ttl = (value, ttl_ms) if taken else self._read_lease(ident)
        return LeaseView(taken, raw, ttl if raw is not None else GONE, self.size(kind, ident))

    def lease_look(self, kind: str, ident: str) -> LeaseView:
        """The lease, and the entry's size: the entry is what a waiter waits for, and it lands
        before its lease is released (a look of the lease alone saved a request, and cost every
        waiter the lease's expiry whenever a heartbeat crossed the release; measured)."""
        raw, ttl = self._read_lease(ident)
        if raw is not None and ttl <= 0:
            raw, ttl = None, GONE  # expired: as good as gone (the next take replaces it)
        return LeaseView(False, raw, ttl, self.size(kind, ident))

    def lease_renew(self, items: Sequence[tuple[str, bytes, bytes]], ttl_ms: int) -> list[Outcome]:
        out: list[Outcome] = []
        for ident, _prefix, value in items:
            with self._lock:
                etag = self._held.get(ident)
            if not etag:
                out.append(False)
                continue
            r = self._req("PUT", self._lease_key(ident), headers={"If-Match": etag}, body=value)
            if r.status == 200:
                with self._lock:
                    self._held[ident] = r.headers.get("etag", "")
                out.append(True)
            else:
                out.append(False)  # taken over, or gone
        return out

    def lease_replace(self, ident: str, seen: bytes, value: bytes, ttl_ms: int) -> bool:
        with self._lock:
            last = self._seen.get(ident)
        if last is None or last[0] != seen or not last[1]:
            return False
        r = self._req("PUT", self._lease_key(ident), headers={"If-Match": last[1]}, body=value)
        if r.status != 200:
            return False
        with self._lock:
            self._held[ident] = r.headers.get("etag", "")
        return True

    def _release(self, ident: str, prefix: bytes) -> None:
        """Delete this process's lease (``If-Match`` the ETag it last wrote). A heartbeat may
        have rewritten it meanwhile (the keeper renews until the release is written): then the
        lease is read again and deleted if it is still this holder's."""
        with self._lock:
            etag = self._held.pop(ident, None)
        if not etag:
            return
        r = self._req("DELETE", self._lease_key(ident), headers={"If-Match": etag})
        if r.status != 412:
            return
        raw, _ttl = self._read_lease(ident)
        with self._lock:
            seen = self._seen.get(ident)
            self._held.pop(ident, None)
        if raw is not None and raw.startswith(prefix) and seen is not None and seen[1]:
            self._req("DELETE", self._lease_key(ident), headers={"If-Match": seen[1]})

    # ------------------------------------------------------------------ reports
    def describe(self) -> dict[str, Any]:
        return {"backend": "s3", "mode": "bucket", "bucket": self.bucket, "root": self.root}

    def survey(self, *, limit: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
        from .s3_survey import survey

        if self._creds is not None and self._creds.refreshable:
            self._creds.fetch()  # (a command's thread: no program waits; nothing refreshes them here)
        return survey(self, limit=limit, budget_s=budget_s, timeout_s=timeout_s)

    def list_page(self, token: str | None, max_keys: int) -> Response:
        """One ``ListObjectsV2`` page of the entries (``kcache remote``)."""
        q = [("list-type", "2"), ("max-keys", str(max_keys)), ("prefix", self.entries_prefix)]
        if token:
            q.append(("continuation-token", token))
        query = "&".join(f"{k}={quote(v, safe='-_.~')}" for k, v in sorted(q))
        return self._req("GET", "", query=query, bucket_level=True, max_body=4 << 20)


#: A region's name is one host label (botocore's ``validate_region_name`` checks the same): it goes into the host.
_REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?")


def endpoint_for(
    bucket: str,
    region: str,
    configured: str | None,
    *,
    fips: bool = False,
    dualstack: bool = False,
    suffix: str | None = "amazonaws.com",
) -> tuple[str, bool]:
    """(the endpoint URL requests go to, whether they are path-style): the configured endpoint
    (``AWS_ENDPOINT_URL``...), path-style; else AWS's for ``region`` in its partition's domain
    (``suffix``: ``amazonaws.com``, ``amazonaws.com.cn``, ...), FIPS (``s3-fips``) and dual-stack
    (``s3.dualstack``) as configured (``AWS_USE_FIPS_ENDPOINT``, ``AWS_USE_DUALSTACK_ENDPOINT``):
    the hosts botocore's S3 client uses. Virtual-hosted, but path-style for a bucket whose name
    has a dot (the host ``my.bucket.s3.REGION.amazonaws.com`` matches no certificate S3 has:
    botocore, too, goes path-style for such a bucket). One difference: in us-east-1 botocore
    still uses the legacy global host ``s3.amazonaws.com``; this uses the region's own, which
    S3 serves the same. S3 has no FIPS endpoints in China: a ``ValueError``, as botocore raises."""
    if configured:
        return str(configured), True
    if not _REGION.fullmatch(region):  # it goes into the host name: botocore refuses these too
        raise ValueError(f"the AWS region {region!r} is no region name (letters, digits and '-')")
    suffix = suffix or "amazonaws.com"
    if fips and suffix.endswith(".cn"):
        raise ValueError(f"S3 has no FIPS endpoint in {region} (AWS_USE_FIPS_ENDPOINT is set)")
    host = ("s3-fips" if fips else "s3") + (".dualstack" if dualstack else "") + f".{region}.{suffix}"
    if "." in bucket:
        return f"https://{host}", True
    return f"https://{bucket}.{host}", False


def dns_suffix(partitions: object, region: str) -> str:
    """The domain of ``region``'s partition in botocore's partition data (``amazonaws.com`` for
    AWS's own regions and for one it does not know, as botocore resolves them)."""
    found = "amazonaws.com"
    parts = partitions.get("partitions") if isinstance(partitions, dict) else None
    for part in parts if isinstance(parts, list) else ():
        try:
            outputs, pattern = part["outputs"], part["regionRegex"]
            if region in part.get("regions", {}) or re.match(pattern, region):
                return str(outputs["dnsSuffix"])
            if part["id"] == "aws":
                found = str(outputs["dnsSuffix"])
        except (KeyError, TypeError, re.error):  # a partition of another shape: not ours to read
            continue
    return found


def _flag(v: object) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on") if v is not None else False


def _code(r: Response) -> str:
    return _tag(r, "Code")


def _tag(r: Response, name: str) -> str:
    """The text of S3's error XML element ``name`` (``Code``, ``Region``), if a plain word."""
    body = r.body[:2000].decode("utf-8", "replace")
    start, end = body.find(f"<{name}>"), body.find(f"</{name}>")
    return _word(body[start + len(name) + 2 : end]) if 0 <= start < end else ""


def _word(text: str) -> str:
    """``text`` if it is one short word of S3's (a code, a region): what a server sends is shown
    in warnings only as that."""
    text = text.strip()
    return text if 0 < len(text) <= 64 and all(c.isalnum() or c in "-_." for c in text) else ""


def _ok(r: Response) -> None:
    if r.status >= 300:
        _answer_raise(r)


def _answer(r: Response) -> Answered:
    return Answered(f"S3 answered {r.status} {_code(r)}".strip())


def _answer_raise(r: Response) -> None:
    raise _answer(r)


def _outcome(r: Response) -> Outcome:
    return True if r.status == 200 else _answer(r)


def _total(r: Response) -> int | None:
    """The object's size from ``Content-Range: bytes a-b/TOTAL`` (a 206), or the body's (a 200)."""
    cr = r.headers.get("content-range")
    if r.status == 206 and cr:
        total = cr.rpartition("/")[2].strip()
        if not total.isdigit():
            raise Unavailable(f"an S3 Content-Range that is not one: {cr[:60]!r}")
        return int(total)
    return len(r.body)


def _age_s(r: Response) -> float | None:
    """Seconds since the object was last written, by the server's clock (its ``Date`` and the
    object's ``Last-Modified``; None when either is missing)."""
    try:
        now = email.utils.parsedate_to_datetime(r.headers["date"])
        then = email.utils.parsedate_to_datetime(r.headers["last-modified"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return max(0.0, (now - then).total_seconds())
