"""Error *answers* of the shared tier (review finding M1, m-b): a server that answers every request
with an error (S3's 403 ``AccessDenied`` to a wrong policy, a 301 to a bucket of another region, a
400 ``ExpiredToken``, a proxy's long HTML error page; Redis's ``NOPERM`` to a user without rights)
costs a process no more than one that fails: the time of such calls is charged to the whole
tier's budget, a streak of them with no success turns the tier off with one warning that names the
answer, an answer never closes an open breaker, and an error page's length is never taken for an
entry's size.

Against real servers: a small S3-speaking ``http.server`` (tests/answering_s3.py) on 127.0.0.1 (it answers as
each test says and counts the requests it served), and a real redis-server with an ACL user that
may run no command. No timing assertion: requests served, budget spent, warnings.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from answering_s3 import AWS_SECRET, aws_env, error
from tier_stores import counts, flushed

from kcache.store import Store
from kcache.store.tiers import shared

PYTHON = sys.executable
pytestmark = pytest.mark.usefixtures("no_descriptors_left", "stores_closed")
URL = "s3://bucket/p"


def tier_of(store: Store) -> Any:
    return store.tiers[0]


# ------------------------------------------------------------------------------------ the budget
def test_an_error_answered_slowly_is_charged_to_the_budget(s3_answering, stores, kcache_warnings) -> None:
    """403 after 0.4 s to every request (the review's slow403.py): before, 20 lookups cost 20
    requests and 8.8 s, and the budget stayed at 0.0. Now each answer's time is charged (at least
    the server's 0.4 s), so the 5 s budget of a 1 s deadline is spent within 13 calls."""
    srv = s3_answering(lambda m, p, h: error(403, "AccessDenied"), delay=0.4)
    a = stores("a", URL, "kcache:", KCACHE_REMOTE_TIMEOUT="1s")
    for i in range(30):
        assert a.get("triton", f"K{i}") is None
    tier = tier_of(a)
    assert tier.budget.trips == 1 and tier.budget.charged >= tier.budget.limit_s, tier.describe()
    assert srv.requests <= 13, srv.requests  # ceil(5 s / 0.4 s): every call took the server's 0.4 s
    assert counts(a)["remote_bypassed"] == 30 - srv.requests, counts(a)
    budget = [m for m in kcache_warnings if "have cost this process" in m]
    assert len(budget) == 1 and "403 AccessDenied" in budget[0], kcache_warnings


# ------------------------------------------------------------------------------------ the streak
def test_every_request_answered_with_an_error_turns_the_tier_off_with_one_warning(
    s3_answering, stores, kcache_warnings
) -> None:
    """A fast 403 to everything (a policy that refuses, a proxy): each lookup used to cost a round
    trip forever, with nothing but an info line. Now 20 in a row with no success turn the tier
    off for the cool-down, with one warning that says what S3 answered, and never a secret."""
    srv = s3_answering(lambda m, p, h: error(403, "AccessDenied"))
    a = stores("a", URL, "kcache:", KCACHE_REMOTE_TIMEOUT="2s")  # a budget of 10 s: not the subject
    for i in range(50):
        assert a.get("triton", f"K{i}") is None
    tier = tier_of(a)
    assert srv.requests == shared.ANSWERS_IN_A_ROW, srv.requests
    assert tier.answers.trips == 1 and tier.budget.trips == 0, tier.describe()
    assert tier.describe()["answers"]["open"], tier.describe()
    assert counts(a)["remote_bypassed"] == 50 - shared.ANSWERS_IN_A_ROW, counts(a)
    said = [m for m in kcache_warnings if "in a row with an error" in m]
    assert len(said) == 1, kcache_warnings
    assert "S3 answered 403 AccessDenied" in said[0] and "credentials?" in said[0], said
    assert AWS_SECRET not in " ".join(kcache_warnings)


def test_a_success_between_error_answers_keeps_the_tier_on(s3_answering, stores, kcache_warnings) -> None:
    """Answers about some keys (a policy that refuses a part of the bucket, a planted object) are
    not the tier's failure: one success in every 20 requests keeps it asked."""
    every = shared.ANSWERS_IN_A_ROW
    srv = s3_answering(lambda m, p, h: None if srv.requests % every == 0 else error(403, "AccessDenied"))
    a = stores("a", URL, "kcache:")
    for i in range(3 * every):
        assert a.get("triton", f"K{i}") is None
    assert srv.requests == 3 * every, srv.requests
    assert tier_of(a).answers.trips == 0 and not any("in a row" in m for m in kcache_warnings)


def test_an_error_answer_never_closes_an_open_breaker(s3_answering, stores) -> None:
    """A breaker opened by failures (503s) is probed after its cool-down; a probe answered with an
    error is no sign of health: before, it closed the breaker (``breaker.ok()``)."""
    answers = {"now": error(503, "SlowDown")}
    s3_answering(lambda m, p, h: answers["now"])
    a = stores("a", URL, "kcache:")
    for i in range(shared.BREAKER_FAILURES):
        assert a.get("triton", f"K{i}") is None
    breaker = tier_of(a).breakers.get()
    assert breaker.is_open
    answers["now"] = error(403, "AccessDenied")
    breaker.open_until = 0.0  # its cool-down is over (not waited for: 30 s)
    assert a.get("triton", "P") is None  # the probe, answered 403
    assert breaker.is_open and breaker.allow()  # still open; the next call probes again


# ------------------------------------------------------------------------------------ not a key
@pytest.mark.parametrize(
    "answer, said",
    [
        (
            error(301, "PermanentRedirect", **{"x-amz-bucket-region": "eu-west-1"}),
            "S3 answered 301 PermanentRedirect: the bucket is in eu-west-1, not us-east-1",
        ),
        (error(400, "ExpiredToken"), "S3 answered 400 ExpiredToken"),
        (error(403, "InvalidAccessKeyId"), "S3 answered 403 InvalidAccessKeyId"),
        (error(404, "NoSuchBucket"), "S3 answered 404 NoSuchBucket"),
        (
            (400, {}, b"<Error><Code>AuthorizationHeaderMalformed</Code><Region>ap-south-1</Region></Error>"),
            "the bucket is in ap-south-1, not us-east-1 (set AWS_REGION=ap-south-1)",
        ),
    ],
)
def test_answers_about_access_not_a_key_are_failures(
    s3_answering, stores, kcache_warnings, answer, said
) -> None:
    """A redirect (the bucket is in another region), expired or unknown credentials, no such
    bucket: every request would get the same, so each is a failed call: the breaker opens after
    3, with one warning that says where the bucket is. Before, each was an answer about one key
    (NoSuchBucket: a miss), and every lookup paid a request, silently."""
    srv = s3_answering(lambda m, p, h: answer)
    a = stores("a", URL, "kcache:")
    for i in range(10):
        assert a.get("triton", f"K{i}") is None
    assert srv.requests == shared.BREAKER_FAILURES, srv.requests
    down = [m for m in kcache_warnings if "fails (Unavailable" in m]
    assert len(down) == 1 and said in down[0], kcache_warnings


# ------------------------------------------------------------------------------------ long pages
@pytest.mark.parametrize("status", [404, 403])
def test_an_error_page_is_not_an_entry_size(s3_answering, stores, kcache_warnings, status) -> None:
    """A 404 or 403 with a 20 KB HTML body (over the 16 KiB read of an error's body): its length
    was taken for the entry's size, and each lookup cost a second request and said "not reading
    a triton entry of 20013 bytes ... (over KCACHE_REMOTE_MAX_ENTRY)"."""
    page = (status, {"Content-Type": "text/html"}, b"<html>" + b"x" * 20_000 + b"</html>")
    srv = s3_answering(lambda m, p, h: page)
    a = stores("a", URL, "kcache:", KCACHE_REMOTE_TIMEOUT="2s")
    for i in range(10):
        assert a.get("triton", f"K{i}") is None
    c = counts(a)
    assert srv.requests == 10 and c.get("remote_too_large", 0) == 0, (srv.requests, c)
    assert not any("KCACHE_REMOTE_MAX_ENTRY" in m for m in kcache_warnings), kcache_warnings
    if status == 404:
        assert c["remote_misses"] == 10, c
    else:
        assert c["remote_refused"] == 10, c


LONG_PAGE = b"<html>" + b"x" * 20_000 + b"</html>"


@pytest.mark.parametrize("put_status", [403, 200])
def test_a_long_answer_to_a_write_or_a_lease_is_not_a_backend_bug(
    s3_answering, stores, kcache_warnings, put_status
) -> None:
    """A long body to a ``PUT`` (a proxy's 403 page; a 200 with 100 KB no PutObject sends) raised
    the HTTP layer's TooLong, which no caller expected: "the shared tier's backend raised TooLong"
    (raised into the program under KCACHE_STRICT=1: single_flight raised), "kcache's shared tier
    writer failed (TooLong ...)". Now a failed call or an error answer, counted."""
    page = LONG_PAGE * (5 if put_status == 200 else 1)  # over the 64 KiB a PUT's answer may be
    srv = s3_answering(lambda m, p, h: (put_status, {}, page) if m == "PUT" else None)
    a = stores("a", URL, "kcache:", KCACHE_REMOTE_TIMEOUT="2s")
    with a.single_flight("triton", "K") as hit:  # a lease: PUT If-None-Match
        assert hit is None
        a.put("triton", "K", {"k.cubin": b"x" * 100})
    flushed(a)
    assert srv.by_method.get("PUT", 0) >= 2, srv.by_method  # the lease, the entry
    assert counts(a).get("remote_errors", 0) >= 1, counts(a)
    bug = ("backend raised", "writer failed")
    assert not any(b in m for m in kcache_warnings for b in bug), kcache_warnings


@pytest.mark.parametrize("status, body", [(403, LONG_PAGE), (200, b"<ListBucketResult>" + b" " * (5 << 20))])
def test_kcache_remote_reports_a_long_answer_without_a_traceback(
    s3_answering, clean_env, status, body
) -> None:
    """A listing answered with a long error page, or a success longer than the 4 MiB a page may
    be: an error in the report (exit 1), not "kcache: error: TooLong"."""
    srv = s3_answering(lambda m, p, h: (status, {}, body))
    env = dict(clean_env, KCACHE_REMOTE=URL, **aws_env(srv))
    p = subprocess.run(
        [PYTHON, "-m", "kcache", "remote"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "Traceback" not in p.stderr and "error: TooLong" not in p.stderr, p.stderr
    said = "S3 answered 403" if status == 403 else "S3 answered 200 with 5242898 bytes"
    assert p.returncode == 1 and said in p.stdout, p.stdout + p.stderr


# ------------------------------------------------------------------------------------ Redis
def test_redis_error_replies_are_charged_and_turn_the_tier_off(
    redis_private, stores, kcache_warnings
) -> None:
    """A Redis user that may run no command (an ACL mistake): every lookup is answered ``NOPERM``
    (redis-py's ResponseError). Before: a round trip per lookup forever, no budget spent, no
    warning. Now: its time is charged, 20 in a row turn the tier off, one warning names it."""
    server = redis_private()
    server.client().execute_command("ACL", "SETUSER", "kc-none", "on", ">kc-none-pw", "~*", "-@all")
    url = f"redis://kc-none:kc-none-pw@127.0.0.1:{server.port}/0"
    a = stores("a", url, "kcache:", KCACHE_REMOTE_TIMEOUT="2s")
    for i in range(50):
        assert a.get("triton", f"K{i}") is None
    tier = tier_of(a)
    stats = server.client().info("commandstats").get("cmdstat_strlen", {})
    assert stats.get("rejected_calls") == shared.ANSWERS_IN_A_ROW, stats
    assert tier.answers.trips == 1 and tier.budget.charged > 0, tier.describe()
    said = [m for m in kcache_warnings if "in a row with an error" in m]
    assert len(said) == 1 and "no permissions to run" in said[0] and "kc-none-pw" not in said[0], (
        kcache_warnings
    )
