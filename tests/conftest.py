"""Shared fixtures: small and generic (a fresh store, captured kcache warnings, a clean env)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fresh_process import table_of

from kcache import log as _log
from kcache.store import Store

# The suite runs strict (kcache/boundary.py): a bug that an edge would swallow in production
# (one warning, a compile without kcache) raises here and fails its test. Children get it
# through the environments the tests build (clean_env keeps it); a test of fail-open behaviour
# itself sets KCACHE_STRICT=0.
os.environ["KCACHE_STRICT"] = "1"


# Every test process's table of descriptors holds 256, as a process started by a shell does (it
# keeps 255 open). A process started otherwise holds 64, and kcache gives its first hits private
# links until its flush thread has grown the table (tests/test_hit_path.py tests that): tests
# that look at a first hit's held folder would then pass or fail by how pytest was started.
table_of(256)


def _same_sources(a: Path, b: Path) -> bool:
    """Whether two kcache packages hold the same Python sources (a real install of this
    checkout, as tools/gpu_setup.sh makes, is this checkout's code)."""

    def sources(root: Path) -> dict[str, bytes]:
        return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*.py")}

    return sources(a) == sources(b)


def pytest_configure(config: pytest.Config) -> None:
    """The tests' children import kcache as an installed program does (many drop PYTHONPATH to
    test the install's own hook): that kcache must be this checkout's, or every child would test
    other code and pass or fail for it. Checked once, before any test (not in xdist's workers)."""
    if hasattr(config, "workerinput"):
        return
    import subprocess
    import sys
    import tempfile

    here = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("KCACHE")}
    code = "import os, kcache; print(os.path.dirname(os.path.dirname(os.path.realpath(kcache.__file__))))"
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=tempfile.gettempdir(),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    found = p.stdout.strip() if p.returncode == 0 else None
    if found is None or not (Path(found) == here or _same_sources(Path(found) / "kcache", here / "kcache")):
        where = "is not installed" if found is None else "is installed from another checkout"
        pytest.exit(
            f"kcache {where} for {sys.executable}: the tests' child processes would not run this "
            f"checkout's code; install it first: {sys.executable} -m pip install -e '.[test,redis]'",
            returncode=4,
        )


#: Test files that keep a worker busy for a minute or more (cold torch.compile children, the
#: README's fresh install), longest first: collected before the rest, so that with xdist's
#: ``--dist loadfile --no-loadscope-reorder`` (.ci/run) they start first and the run does not
#: end with one worker on one of them and the others idle. (xdist's own order, most tests
#: first, put these few-test files last: the README's test alone ran the last 1.6 minutes.)
#: The others follow in their usual order; the order of tests within a file never changes.
SLOW_FIRST = (
    "tests/test_examples.py",
    "tests/test_inductor.py",
    "tests/test_prewarm_triton.py",
    "tests/test_inductor_served.py",
    "tests/test_inductor_transparency.py",
    "tests/reliability/test_hostile_redis.py",
    "tests/test_inductor_torchkey.py",
    "tests/test_boundary.py",
    "tests/test_inductor_pch.py",
    "tests/reliability/test_hostile_inputs.py",
    "tests/test_inductor_restarts.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # (stable)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """A path where no store exists yet (Store.open creates it 0700)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path):
    """A fresh writable Store under tmp_path, closed at the end of the test."""
    s = Store.open(store_dir, max_size=1 << 30)
    yield s
    s.close()


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Any]:
    """Stores with a shared tier (:class:`tier_stores.Stores`: one per "machine", made by name),
    all closed after the test."""
    from tier_stores import Stores

    s = Stores(tmp_path)
    yield s
    s.close()


@pytest.fixture
def s3_answering(monkeypatch):  # noqa: ANN001, ANN201
    """An S3 endpoint on 127.0.0.1 whose answers the test writes (:mod:`answering_s3`)."""
    from answering_s3 import serving

    yield from serving(monkeypatch)


@pytest.fixture
def stores_closed(monkeypatch):  # noqa: ANN001, ANN202
    """Every store the test opens (itself, or through the CLI in this process) is closed after
    it: one left open keeps its descriptors for the worker's life (its flush thread holds it), and
    later tests in the worker that count on free descriptor numbers would find fewer. A module
    asks for it with ``pytestmark = pytest.mark.usefixtures("stores_closed")``."""
    opened: list[Store] = []
    real = Store.open.__func__

    def tracked(cls, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        s = real(cls, *args, **kwargs)
        opened.append(s)
        return s

    monkeypatch.setattr(Store, "open", classmethod(tracked))
    yield
    from tier_stores import close_store  # with a shared tier: its sockets too

    for s in opened:
        close_store(s)


@pytest.fixture
def no_descriptors_left(tmp_path: Path):  # noqa: ANN201
    """Fails the test (at teardown, after the other fixtures' teardown) when it leaves open a
    socket, a pipe or a file under its tmp_path that was not open before it: such a descriptor
    stays for the worker's life, and later tests in the worker that count on free descriptor
    numbers would find fewer. Asked for first in ``pytestmark`` (``usefixtures``), so it is set
    up before and torn down after what the test's other fixtures open and close. Only those
    kinds: a file elsewhere may be a library's, opened once for the process. No waiting, no
    timing: what is open after the teardown. Where there is no /proc (not Linux) it checks
    nothing."""
    if not os.path.isdir("/proc/self/fd"):
        yield
        return
    from tier_stores import descriptors

    before = descriptors()
    yield
    import gc

    gc.collect()  # what only a cycle holds is not left open
    mine = ("socket:", "pipe:", str(tmp_path.resolve()) + os.sep)
    left = {fd: t for fd, t in descriptors().items() if before.get(fd) != t and t.startswith(mine)}
    assert not left, f"the test left {len(left)} descriptors open: {left}"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def kcache_warnings():
    """The list of messages kcache logs during the test; warn-once topics are reset around it."""
    logger = logging.getLogger("kcache")
    h = _Capture()
    saved = set(_log._warned)
    _log._warned.clear()
    logger.addHandler(h)
    try:
        yield h.messages
    finally:
        logger.removeHandler(h)
        _log._warned.clear()
        _log._warned.update(saved)


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """os.environ without any KCACHE_* variable (but KCACHE_STRICT), with HOME/XDG_CACHE_HOME inside tmp_path:
    for subprocesses that must not see the developer's own settings or store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env["HOME"] = str(tmp_path / "home")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env.pop("PYTHONPATH", None)
    return env


# ------------------------------------------------------------------------------ torch.compile
class InductorHeaders:
    """Inductor's folder of precompiled C++ headers for the whole test session: the one a process
    that keeps the session's ``TMPDIR`` uses (``<TMPDIR>/torchinductor_<user>/precompiled_headers``),
    made reachable from a ``TMPDIR`` of a child's own by :meth:`link`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def link(self, tmpdir: Path) -> Path:
        """``tmpdir`` (made if missing), whose precompiled-header folder is the session's one."""
        import getpass

        own = tmpdir / f"torchinductor_{getpass.getuser()}"
        own.mkdir(parents=True, exist_ok=True)
        link = own / "precompiled_headers"
        if not link.is_symlink():
            link.symlink_to(self.folder, target_is_directory=True)
        return tmpdir


@pytest.fixture(scope="session")
def inductor_headers() -> InductorHeaders:
    """Inductor builds a precompiled header (7-8 s of g++, a 150 MB file) for its CPU kernels
    under ``$TMPDIR``, named after the header, the compile command and the compiler's version,
    and keeps it for every later process of the machine (torch locks the build: concurrent
    processes, xdist's workers included, build it once). Children that keep the session's
    ``TMPDIR`` share it as they are; a child given a ``TMPDIR`` of its own (its path is in every
    C++ command: what some tests are about) reaches the same folder through :meth:`link`, as a
    shared /tmp would give it. One build per session instead of one per such test module."""
    import getpass
    import tempfile

    folder = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}" / "precompiled_headers"
    folder.mkdir(parents=True, exist_ok=True)
    return InductorHeaders(folder)


# ------------------------------------------------------------------------------ Redis (issue 15)
# A real redis-server on 127.0.0.1 at a free port (the distribution's package; .ci/run installs
# it). Without one the tests that need it skip, unless KCACHE_TEST_REQUIRE_REDIS=1 (set by
# .ci/run): then they fail. No mock of Redis anywhere.
class RedisServer:
    """A redis-server process of the tests: ``url``, ``client()``, ``stop()``, ``start()``
    (again on the same port: a restart), ``pause(ms)`` (CLIENT PAUSE ALL)."""

    def __init__(self, workdir: Path, extra: tuple[str, ...] = ()) -> None:
        self.workdir, self.extra = workdir, extra
        self.port = 0
        self.proc = None
        self.socket = str(workdir / "redis.sock")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def start(self) -> RedisServer:
        import shutil
        import socket
        import subprocess
        import time

        exe = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
        )
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        last = ""
        for _attempt in range(5):
            port = self.port
            # a cluster node's bus port is its port + 10000: redis-server refuses a port past 55535
            highest = 55535 if "--cluster-enabled" in self.extra else 65535
            while not port or port > highest:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
            cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            cmd += ["--dir", str(self.workdir), "--unixsocket", self.socket, "--unixsocketperm", "700"]
            cmd += ["--daemonize", "no", "--logfile", str(self.workdir / "redis.log"), *self.extra]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                        c.sendall(b"PING\r\n")
                        if c.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                            self.port = port
                            return self
                except OSError:
                    time.sleep(0.02)
            self.proc.kill()
            self.proc.wait()
            last = (
                (self.workdir / "redis.log").read_text()[-500:]
                if (self.workdir / "redis.log").exists()
                else ""
            )
            if self.port:  # a restart on the same port: try again, the old socket may linger
                time.sleep(0.2)
        raise RuntimeError(f"redis-server did not start: {last}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self, **kw):
        import redis

        if self.password:
            kw.setdefault("password", self.password)
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10, **kw)

    def pause(self, ms: int) -> None:
        self.client().execute_command("CLIENT", "PAUSE", str(int(ms)), "ALL")

    @property
    def password(self) -> str | None:
        return self.extra[self.extra.index("--requirepass") + 1] if "--requirepass" in self.extra else None


def _redis_or_skip(workdir: Path, extra: tuple[str, ...] = ()) -> RedisServer:
    need = os.environ.get("KCACHE_TEST_REQUIRE_REDIS") == "1"
    try:
        import redis  # noqa: F401  (the client package: the `redis` extra)

        return RedisServer(workdir, extra).start()
    except Exception as e:
        if need:
            pytest.fail(f"KCACHE_TEST_REQUIRE_REDIS=1 and no Redis server: {e}")
        pytest.skip(f"no Redis server for the shared-tier tests: {e}")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """One redis-server for the test session (tests keep apart by key prefix)."""
    server = _redis_or_skip(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_private(tmp_path: Path):
    """A factory of redis-servers of this test alone (to stop, restart, fill up); all stopped
    at the end. ``redis_private(*extra_args)`` -> :class:`RedisServer`."""
    servers: list[RedisServer] = []

    def make(*extra: str) -> RedisServer:
        s = _redis_or_skip(tmp_path / f"redis{len(servers)}", extra)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


# ------------------------------------------------------------------------------ Redis Cluster
# A real Redis Cluster of redis-server processes on free ports of 127.0.0.1, joined with
# `redis-cli --cluster create` (both from the distribution's package). As with the single
# server: without one the tests skip, unless KCACHE_TEST_REQUIRE_REDIS=1 (CI): then they fail.
class RedisCluster:
    """``masters`` masters (and ``replicas`` replicas of each): ``url`` (redis+cluster://...),
    ``nodes`` (RedisServer of each), ``client()``, ``master_ports()``, ``kill(port)``,
    ``wait_ok()``, ``stop()``."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000):
        self.workdir, self.masters, self.replicas = workdir, masters, replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes if n.proc is not None)
        return f"redis+cluster://{hosts}"

    def start(self) -> RedisCluster:
        import shutil
        import subprocess

        cli = shutil.which("redis-cli") or (
            "/usr/bin/redis-cli" if os.path.exists("/usr/bin/redis-cli") else None
        )
        if cli is None:
            raise RuntimeError("redis-cli is not installed (apt-get install -y redis-tools)")
        for i in range(self.masters * (1 + self.replicas)):
            d = self.workdir / f"node{i}"
            extra = (
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--repl-diskless-sync-delay", "0",
            )  # fmt: skip
            self.nodes.append(RedisServer(d, extra).start())
        cmd = [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
        cmd += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {(r.stdout + r.stderr)[-500:]}")
        self.wait_ok()
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok and knows every slot."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            states = []
            for n in self.nodes:
                if n.proc is None:
                    continue
                try:
                    info = n.client().execute_command("CLUSTER", "INFO")
                    if isinstance(info, bytes):
                        info = info.decode()
                    ok = "cluster_state:ok" in str(info) and "cluster_slots_ok:16384" in str(info)
                    repl = n.client().info("replication")
                    # A replica that has not synced cannot take over its master: wait for it too.
                    if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                        ok = ok and not any(
                            m.proc is not None and m.port == int(repl.get("master_port", 0))
                            for m in self.nodes
                        )
                    states.append(ok)
                except Exception:
                    states.append(False)
            if states and all(states) and self._slots_on_live_masters():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up: {states}")
            time.sleep(0.1)

    def _slots_on_live_masters(self) -> bool:
        """Every slot's master is a live node (after a kill: the failover has happened)."""
        live = {n.port for n in self.nodes if n.proc is not None}
        for n in self.nodes:
            if n.proc is None:
                continue
            try:
                for rng in n.client().execute_command("CLUSTER", "SLOTS"):
                    if int(rng[2][1]) not in live:
                        return False
            except Exception:
                return False
        return True

    def client(self):
        from redis.cluster import ClusterNode
        from redis.cluster import RedisCluster as _RC

        live = [ClusterNode("127.0.0.1", n.port) for n in self.nodes if n.proc is not None]
        return _RC(startup_nodes=live, socket_timeout=10)

    def master_ports(self) -> list[int]:
        out = []
        for n in self.nodes:
            if n.proc is None:
                continue
            role = n.client().execute_command("ROLE")
            if role and (role[0] in (b"master", "master")):
                out.append(n.port)
        return out

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (a master failing, not a clean shutdown)."""
        for n in self.nodes:
            if n.port == port and n.proc is not None:
                n.proc.kill()
                n.proc.wait()
                n.proc = None

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def _cluster_or_skip(workdir: Path, **kw) -> RedisCluster:
    need = os.environ.get("KCACHE_TEST_REQUIRE_REDIS") == "1"
    try:
        import redis  # noqa: F401

        return RedisCluster(workdir, **kw).start()
    except Exception as e:
        if need:
            pytest.fail(f"KCACHE_TEST_REQUIRE_REDIS=1 and no Redis Cluster: {e}")
        pytest.skip(f"no Redis Cluster for the shared-tier tests: {e}")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One 3-master Redis Cluster for the test session (tests keep apart by key prefix)."""
    cluster = _cluster_or_skip(tmp_path_factory.mktemp("cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_private(tmp_path: Path):
    """A factory of clusters of this test alone (to kill a master): ``make(masters=3,
    replicas=1)`` -> :class:`RedisCluster`; all stopped at the end."""
    clusters: list[RedisCluster] = []

    def make(**kw) -> RedisCluster:
        c = _cluster_or_skip(tmp_path / f"cluster{len(clusters)}", **kw)
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        c.stop()


# ------------------------------------------------------------------------------------ S3
# The shared tier's S3 backend runs against a real S3-compatible server the session starts:
# moto's server mode (``python -m moto.server``, from the ``test`` extra: MinIO's server is not on
# PyPI), on 127.0.0.1 at a free port, speaking the S3 HTTP API with conditional writes. Without
# moto or botocore the tests that need it skip, unless KCACHE_TEST_REQUIRE_S3=1 (set by .ci/run).
class S3Server:
    """``tls``: (certificate, key, the CA that signed it): HTTPS with that certificate."""

    def __init__(self, workdir: Path, tls: tuple[Path, Path, Path] | None = None) -> None:
        import socket
        import subprocess

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ca = str(tls[2]) if tls else None
        with_tls = ["-c", str(tls[0]), "-k", str(tls[1])] if tls else []
        self.log = open(workdir / "moto.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port), *with_tls],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "kcache-tests",
            "AWS_SECRET_ACCESS_KEY": "kcache-tests-secret-key",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(workdir / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self):  # noqa: ANN201
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            verify=self.ca,
        )

    def bucket(self) -> str:
        """A new bucket of this server."""
        import uuid

        name = f"kc-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """One moto S3 server for the test session (tests keep apart by bucket)."""
    need = os.environ.get("KCACHE_TEST_REQUIRE_S3") == "1"
    try:
        import boto3  # noqa: F401
        import botocore  # noqa: F401
        import moto.server  # noqa: F401

        server = S3Server(tmp_path_factory.mktemp("s3"))
    except Exception as e:
        if need:
            pytest.fail(f"KCACHE_TEST_REQUIRE_S3=1 and no S3 server: {e}")
        pytest.skip(f"no S3 server for the S3 backend's tests (pip install 'kcache[test,s3]'): {e}")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):  # noqa: ANN001, ANN201
    """The session's S3 server, with this process's AWS configuration pointing at it."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_SESSION_TOKEN", *PROXY_VARIABLES):
        monkeypatch.delenv(k, raising=False)
    return s3_server


#: What botocore and kcache's S3 backend take a proxy from: never the machine's, in the S3 tests
#: (the servers are on 127.0.0.1).
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")
