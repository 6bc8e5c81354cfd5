"""The worker processes of a prewarm: items sharded over ``python -m kcache.prewarm.worker``
processes, one environment group at a time, their results read as they come.

Workers are processes: Triton's driver and knobs are per process, the JIT caches the target per
device, and the cache-invalidating environment must be set before Triton is imported. Each gets
its job as a JSON file and reports on a private pipe, one JSON line per event (:mod:`.worker`):
``setup``, ``item`` for each finished item, or ``fatal``. An item a worker never reported (it
died, or could not start) is failed with the reason.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from .env import WORKER_ENV, current_invalidating_env
from .spec import Item, Spec
from .summary import ItemResult, Progress, Summary


def shard(items: list[Item], n: int, gpu: bool) -> list[list[Item]]:
    """``items`` over at most ``n`` workers (none left empty)."""
    shards: list[list[Item]] = [[] for _ in range(n)]
    if gpu and n > 1:
        # Autotune timings taken concurrently on one GPU disturb each other: one worker times them all.
        tuned = [it for it in items if it.entry.what == "autotune"]
        rest = [it for it in items if it.entry.what != "autotune"]
        shards[0].extend(tuned)
        for i, it in enumerate(rest):
            shards[1 + i % (n - 1)].append(it)
        return [s for s in shards if s]
    for i, it in enumerate(items):
        shards[i % n].append(it)
    return [s for s in shards if s]


@dataclass
class _Worker:
    proc: subprocess.Popen
    left: set[int]  # ids of the items it has not reported yet


@dataclass
class Job:
    """What every worker of one prewarm shares."""

    spec: Spec
    arch: int | None
    store_dir: str
    protect_s: float
    paths: list[str]
    tmpdir: str

    def file(self, name: str, items: list[Item]) -> str:
        """The job file of one worker."""
        job = {
            "raw": self.spec.raw,
            "source": self.spec.source,
            "base_dir": self.spec.base_dir,
            "paths": self.paths,
            "items": [it.id for it in items],
            "arch": self.arch,
            "dir": self.store_dir,
            "protect_s": self.protect_s,
        }
        path = os.path.join(self.tmpdir, f"job{name}.json")
        with open(path, "w") as f:
            json.dump(job, f)
        return path

    def environment(self, env_vals: dict[str, str], unset: list[str]) -> dict[str, str]:
        """A worker's environment: this one's, with the group's variables (and Triton's others
        unset), kcache on for the store, its puts protected, KCACHE_RECORD off."""
        from .meta import PROTECT_ENV

        env = dict(os.environ)
        for k in unset:
            env.pop(k, None)
        env.update(env_vals)
        env.pop("KCACHE_RECORD", None)
        env[WORKER_ENV] = "1"
        env["KCACHE"] = "1"
        env["KCACHE_DIR"] = self.store_dir
        env[PROTECT_ENV] = str(self.protect_s)
        pp = [p for p in [*self.paths, self.spec.base_dir or "", os.getcwd(), *sys.path] if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pp))
        return env


def run_workers(
    sp: Spec,
    groups: dict[str, list[Item]],
    arch: int | None,
    jobs: int,
    store_dir: str,
    protect_s: float,
    paths: list[str],
    summary: Summary,
    prog: Progress,
) -> None:
    """Run every item of ``groups`` (items by environment) in workers, ``jobs`` at most, their
    results into ``summary`` as they come."""
    sel = selectors.DefaultSelector()
    job = Job(sp, arch, store_dir, protect_s, paths, tempfile.mkdtemp(prefix="kcache-prewarm-"))
    by_id = {it.id: it for g in groups.values() for it in g}
    workers: list[_Worker] = []
    try:
        _start(job, groups, jobs, summary, sel, workers)
        _collect(sel, workers, by_id, summary, prog)
        for w in workers:
            rc = w.proc.wait()
            _fail(w, by_id, f"worker process exited with code {rc} before finishing it", summary, prog)
    finally:
        sel.close()
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        shutil.rmtree(job.tmpdir, ignore_errors=True)


def _start(
    job: Job,
    groups: dict[str, list[Item]],
    jobs: int,
    summary: Summary,
    sel: selectors.BaseSelector,
    workers: list[_Worker],
) -> None:
    """Start the workers of every environment group (``jobs`` spread over the groups)."""
    current = current_invalidating_env()
    per_group = max(1, jobs // max(len(groups), 1))
    for gi, (gkey, gitems) in enumerate(groups.items()):
        env_vals = json.loads(gkey)
        summary.env[str(gi)] = env_vals
        unset = sorted(k for k in current if k not in env_vals)
        summary.env_unset = sorted(set(summary.env_unset) | set(unset))
        env = job.environment(env_vals, unset)
        for si, items in enumerate(shard(gitems, per_group, job.arch is None)):
            jf = job.file(f"{gi}.{si}", items)
            r, w = os.pipe()
            cmd = [sys.executable, "-m", "kcache.prewarm.worker", jf, str(w)]
            p = subprocess.Popen(
                cmd, env=env, pass_fds=(w,), stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None
            )
            os.close(w)
            reader = os.fdopen(r, "r", encoding="utf-8")
            sel.register(reader, selectors.EVENT_READ, len(workers))
            workers.append(_Worker(p, {it.id for it in items}))


def _collect(
    sel: selectors.BaseSelector,
    workers: list[_Worker],
    by_id: dict[int, Item],
    summary: Summary,
    prog: Progress,
) -> None:
    """Read the workers' events until every pipe is closed."""
    open_readers = len(workers)
    while open_readers:
        for key, _ in sel.select(timeout=1.0):
            line = key.fileobj.readline()  # type: ignore[union-attr]
            if not line:
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                open_readers -= 1
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            _event(msg, workers[key.data], by_id, summary, prog)


def _event(msg: dict[str, Any], w: _Worker, by_id: dict[int, Item], summary: Summary, prog: Progress) -> None:
    if msg.get("event") == "setup":
        summary.build = summary.build or msg.get("build")
        summary.host_code = summary.host_code or msg.get("host_code")
        summary.utils_builds += int(msg.get("utils_builds") or 0)
    elif msg.get("event") == "start":
        it = by_id.get(msg.get("id"))  # type: ignore[arg-type]
        if it is not None:
            prog.start(it.label)
    elif msg.get("event") == "item":
        res = ItemResult(**msg["result"])
        w.left.discard(res.id)
        summary.items.append(res)
        prog.update(res)
    elif msg.get("event") == "fatal":
        _fail(w, by_id, msg.get("error", "worker failed"), summary, prog)


def _fail(w: _Worker, by_id: dict[int, Item], reason: str, summary: Summary, prog: Progress) -> None:
    """Every item ``w`` has not reported: failed, for ``reason``."""
    for iid in sorted(w.left):
        it = by_id[iid]
        res = ItemResult(iid, it.entry.label, it.label, it.entry.kind, "failed", reason)
        summary.items.append(res)
        prog.update(res)
    w.left.clear()


def _has_fileno(f: Any) -> bool:
    try:
        f.fileno()
        return True
    except (AttributeError, OSError, ValueError):  # a replaced sys.stderr: no fileno (a StringIO:
        return False  # io.UnsupportedOperation), or a closed one
