"""What the shared tier holds, node by node: the walk behind ``kcache remote``.

For a single server, the server; for a cluster, every node the cluster knows (``CLUSTER NODES``
from one that answers: masters, replicas, and nodes marked failed), each asked on its own
(``PING``, ``INFO``): address, role, reachable, memory, and on masters kcache's entries, found
by ``SCAN ... MATCH <prefix>e:*`` (:mod:`.redis_keys`) with their sizes (``STRLEN``, pipelined)
and kinds (from their names). No key is read whole and nothing is written.

Bounded: each call by ``timeout_s``; the scan by ``limit`` keys in all and ``budget_s`` seconds,
taking a page of each master in turn, so that a partial walk (``complete: false``) still samples
every node. Counts are of what was seen: a partial walk's are lower bounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from . import redis_cluster, redis_io
from . import redis_keys as rk
from .bounded import bounded

PAGE = 1000  # keys a SCAN call asks for, and the STRLENs of one pipeline
#: INFO fields reported per node (server, memory, stats, clients, replication sections).
INFO_FIELDS = (
    "redis_version",
    "valkey_version",
    "redis_mode",
    "uptime_in_seconds",
    "connected_clients",
    "used_memory",
    "maxmemory",
    "maxmemory_policy",
    "evicted_keys",
    "expired_keys",
    "keyspace_hits",
    "keyspace_misses",
    "rejected_connections",
)


def _told() -> tuple[type[BaseException], ...]:
    """What asking one node may raise, told in the report (``error``), never raised: a failure of
    the node, the network or the bound (:func:`.redis_io.failures`), and a reply of the wrong
    shape from a server that is not what it says (redis-py's reply callbacks assume the shape:
    INFO's ``parse_info`` calls ``splitlines`` on an integer reply, SCAN's unpacks two items,
    CLUSTER NODES' splits each line into eight fields)."""
    return (*redis_io.failures(), ValueError, TypeError, AttributeError, IndexError, KeyError)


def survey(
    cfg: Any, *, limit: int = 10_000, budget_s: float = 10.0, timeout_s: float = 2.0
) -> dict[str, Any]:
    """The nodes and what kcache holds on them (see the module). ``cfg``: the
    :class:`~.redis.RedisBackend` (its ``url``, ``password``, ``prefix``, ``cluster``). ``limit``: the most entry keys looked at in all (0: no
    limit). Raises ImportError without redis; any other failure is in the result (``error``,
    ``reachable``)."""
    if cfg.cluster:
        return _cluster(cfg, limit, budget_s, timeout_s)
    return _server(cfg, limit, budget_s, timeout_s)


def _server(cfg: Any, limit: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
    r = redis_io.connect(cfg.url, cfg.password, timeout_s)
    kw = r.connection_pool.connection_kwargs
    address = kw.get("path") or f"{kw.get('host', '?')}:{kw.get('port', '?')}"
    out: dict[str, Any] = {"mode": "server", "reachable": False}
    try:
        node = _node(r, address, timeout_s)
        node["role"] = "master"
        out["nodes"] = [node]
        if not node["reachable"]:
            out["error"] = node.pop("error", "no answer")
            return out
        out.update(reachable=True, ping_ms=node.get("ping_ms"), server=node.get("server", {}))
        out.update(_scan(cfg, [(node, r)], limit, budget_s, timeout_s))
    finally:
        _close(r)
    return out


def _cluster(cfg: Any, limit: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
    cc = redis_cluster.connect(cfg.url, cfg.password, timeout_s)
    out: dict[str, Any] = {"mode": "cluster", "reachable": False}
    clients: list[Any] = []
    try:
        try:
            with bounded(timeout_s):
                rc = cc.cluster
                known = [(n.host, int(n.port)) for n in rc.get_nodes()]
        except _told() as e:
            out["error"] = redis_io_error(e)
            return out
        table: list[dict[str, Any]] = []
        info: dict[str, Any] = {}
        for host, port in known:  # the first node that answers says what the cluster is
            r = _node_client(cfg, host, port, timeout_s)
            clients.append(r)
            try:
                with bounded(timeout_s):
                    text = r.execute_command("CLUSTER", "NODES")
                    info = _cluster_info(r.execute_command("CLUSTER", "INFO"))
                table = _parse_nodes(text)
                break
            except _told():  # the next node is asked
                continue
        if not table:
            out["error"] = "no node answers CLUSTER NODES"
            return out
        out["cluster"] = info
        nodes, masters = [], []
        for row in table:
            host, _, port = row["address"].rpartition(":")
            r = _node_client(cfg, host.strip("[]"), int(port), timeout_s)
            clients.append(r)
            node = _node(r, row["address"], timeout_s)
            node.update(role=row["role"], flags=row["flags"])
            if row["role"] == "master":
                node["slots"] = row["slots"]
                if node["reachable"] and row["slots"]:
                    masters.append((node, r))
            elif row.get("master"):
                node["master"] = row["master"]
            nodes.append(node)
        out["nodes"] = nodes
        pings = sorted(n["ping_ms"] for n in nodes if n.get("ping_ms") is not None)
        out["reachable"] = bool(pings)
        if pings:
            out["ping_ms"] = pings[len(pings) // 2]
        out.update(_scan(cfg, masters, limit, budget_s, timeout_s))
        lost = [
            n["address"] for n in nodes if n["role"] == "master" and n.get("slots") and not n["reachable"]
        ]
        if lost:  # their slots' entries were not seen (until a replica takes them over)
            out["complete"] = False
            out.setdefault("scan_error", f"not answering, their entries not counted: {', '.join(lost)}")
    finally:
        for r in clients:
            _close(r)
        _close(cc)
    return out


def _node_client(cfg: Any, host: str, port: int, timeout_s: float) -> Any:
    """A client of one node of a cluster, with the options (user, password, TLS) of its URL."""
    return redis_io.connect(redis_cluster.node_url(cfg.url, host, port), cfg.password, timeout_s)


def _node(r: Any, address: str, timeout_s: float) -> dict[str, Any]:
    node: dict[str, Any] = {"address": address, "reachable": False}
    try:
        with bounded(timeout_s):
            t0 = time.perf_counter()
            r.ping()
            node["ping_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    except _told() as e:
        node["error"] = redis_io_error(e)
        return node
    node["reachable"] = True
    try:
        with bounded(timeout_s):
            info = r.info()
        node["server"] = {k: info[k] for k in INFO_FIELDS if k in info}
    except _told() as e:  # INFO may be denied by an ACL
        node["server"] = {"error": redis_io_error(e)}
    return node


def _scan(
    cfg: Any, masters: list[tuple[dict[str, Any], Any]], limit: int, budget_s: float, timeout_s: float
) -> dict[str, Any]:
    """Entries by ``SCAN`` on each master, a page of each in turn (see the module)."""
    pattern = rk.entry_pattern(cfg.prefix)
    cursors = {id(r): 0 for _node, r in masters}
    by_kind: dict[str, dict[str, int]] = {}
    checked = 0
    deadline = time.monotonic() + budget_s
    for node, _r in masters:
        node.update(entries=0, bytes=0)
    pending = list(masters)
    error = None
    cut = False  # a page was cut short by the limit, or the time ran out
    while pending:
        share = -(-(limit - checked) // len(pending)) if limit else 0  # this round's keys per node
        for node, r in list(pending):
            if (limit and checked >= limit) or time.monotonic() > deadline:
                cut, pending = True, []
                break
            try:
                with bounded(timeout_s):
                    cursor, keys = r.scan(cursors[id(r)], match=pattern, count=PAGE)
                    if share and len(keys) > min(share, limit - checked):
                        keys, cut = keys[: min(share, limit - checked)], True
                    p = r.pipeline(transaction=False)
                    for k in keys:
                        p.strlen(k)
                    sizes = p.execute(raise_on_error=False) if keys else []
            except _told() as e:
                node["error"] = redis_io_error(e)
                error = error or f"{node['address']}: {node['error']}"
                pending.remove((node, r))
                continue
            checked += len(keys)
            for k, n in zip(keys, sizes):
                parsed = rk.parse_entry_key(cfg.prefix, k)
                if parsed is None or not isinstance(n, int) or n <= 0:
                    continue  # not an entry, gone meanwhile, or moved to another node
                kk = by_kind.setdefault(parsed[0], {"entries": 0, "bytes": 0})
                kk["entries"] += 1
                kk["bytes"] += n
                node["entries"] += 1
                node["bytes"] += n
            cursors[id(r)] = int(cursor)
            if not cursors[id(r)]:
                pending.remove((node, r))
    complete = not cut and error is None and all(not c for c in cursors.values())
    out: dict[str, Any] = {
        "entries": sum(v["entries"] for v in by_kind.values()),
        "bytes": sum(v["bytes"] for v in by_kind.values()),
        "checked": checked,
        "complete": complete,
        "by_kind": dict(sorted(by_kind.items())),
    }
    if error:
        out["scan_error"] = error
    return out


def _parse_nodes(text: Any) -> list[dict[str, Any]]:
    """``CLUSTER NODES``: one row per node (address, role, flags, master's address, slots)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    rows, by_id = [], {}
    for line in str(text).splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        node_id, addr, flags, master = parts[0], parts[1], parts[2].split(","), parts[3]
        address = addr.split(",", 1)[0].split("@", 1)[0]
        if not address or address.startswith(":"):
            continue  # a node that knows no address of its own (a handshake)
        slots = 0
        for s in parts[8:]:
            if s.startswith("["):
                continue  # a slot being migrated or imported
            lo, _, hi = s.partition("-")
            if lo.isdecimal():  # (not isdigit: int() refuses a superscript digit)
                slots += (int(hi) if hi.isdecimal() else int(lo)) - int(lo) + 1
        role = "master" if "master" in flags else "replica" if "slave" in flags else "node"
        row: dict[str, Any] = {"address": address, "role": role, "flags": [f for f in flags if f != "myself"]}
        row.update(slots=slots, _master_id=master)
        rows.append(row)
        by_id[node_id] = address
    for row in rows:
        mid = row.pop("_master_id")
        if row["role"] == "replica" and mid in by_id:
            row["master"] = by_id[mid]
    return sorted(rows, key=lambda r: (r.get("master", r["address"]), r["role"] != "master", r["address"]))


def _cluster_info(text: Any) -> dict[str, Any]:
    items: Iterable[tuple[Any, Any]]
    if isinstance(text, dict):
        items = text.items()
    else:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        items = (ln.partition(":")[::2] for ln in str(text).splitlines())
    keep = {
        "cluster_state",
        "cluster_slots_assigned",
        "cluster_slots_ok",
        "cluster_known_nodes",
        "cluster_size",
    }
    out: dict[str, Any] = {}
    for k, v in items:
        k = str(k).strip()
        if k in keep:
            v = str(v).strip()
            out[k.removeprefix("cluster_")] = int(v) if v.isdecimal() else v
    return out


def redis_io_error(e: BaseException) -> str:
    from ...config import redact

    return redact(f"{type(e).__name__}: {e}")


def _close(r: Any) -> None:
    try:
        r.close()
    except redis_io.failures():  # closing a client that never connected, or whose node is gone
        pass
