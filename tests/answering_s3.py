"""A small S3-speaking HTTP server of the tests, on 127.0.0.1: it answers every request as a test
says (an error, a long page, a slow success) and counts the requests it served. A real server
that lies or refuses, not a mock: kcache's S3 backend speaks HTTP to it as to any store
(tests/test_remote_answers.py, tests/test_remote_s3_leases.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import PROXY_VARIABLES

AWS_SECRET = "answers-secret-key-XYZ"

#: How the server answers one request (its method, path and headers): (status, headers, body), or
#: None for a 404 without a body. It may sleep (a far store's latency).
Answer = Callable[[str, str, Any], "tuple[int, dict[str, str], bytes] | None"]


def error(status: int, code: str, pad: int = 0, **headers: str) -> tuple[int, dict[str, str], bytes]:
    body = f"<Error><Code>{code}</Code><Message>no</Message></Error>".encode()
    return status, headers, body + b" " * pad


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up on a long page it would not read: what the tests make


class AnsweringS3:
    """An HTTP server on 127.0.0.1 that answers every request as ``answer(method, path, headers)`` says,
    after ``delay`` seconds; ``requests`` counts them (by method in ``by_method``)."""

    def __init__(self, answer: Answer, delay: float = 0.0) -> None:
        self.answer, self.delay = answer, delay
        self.requests = 0
        self.by_method: dict[str, int] = {}
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                with outer._lock:
                    outer.requests += 1
                    outer.by_method[self.command] = outer.by_method.get(self.command, 0) + 1
                if outer.delay:
                    time.sleep(outer.delay)
                got = outer.answer(self.command, self.path, self.headers)
                status, headers, body = got if got is not None else (404, {}, b"")
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client does not read a long error page: it hangs up
                    self.close_connection = True

            do_GET = do_PUT = do_DELETE = do_HEAD = _any  # noqa: N815

        self.httpd = _Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = False  # server_close() joins them: their sockets are closed
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serving(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., AnsweringS3]]:
    """What a test module's ``s3_answering`` fixture yields from: ``make(answer, delay=0.0)``
    starts a server and points this process's AWS configuration at it; all closed at the end."""
    servers: list[AnsweringS3] = []

    def make(answer: Answer, delay: float = 0.0) -> AnsweringS3:
        srv = AnsweringS3(answer, delay)
        servers.append(srv)
        for k, v in aws_env(srv).items():
            monkeypatch.setenv(k, v)
        for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_SESSION_TOKEN", *PROXY_VARIABLES):
            monkeypatch.delenv(k, raising=False)
        return srv

    yield make
    for srv in servers:
        srv.close()


def aws_env(srv: AnsweringS3) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": srv.endpoint,
        "AWS_ACCESS_KEY_ID": "AKIAANSWERS",
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
