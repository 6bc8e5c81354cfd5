"""A prewarm worker process: ``python -m kcache.prewarm.worker JOB.json FD``.

Started by :mod:`.runner` with the spec's environment already applied (before Triton is
imported, as it must be). Reports on file descriptor FD, one JSON object per line: ``setup``,
then ``item`` for each finished item, or ``fatal`` if it cannot start.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m kcache.prewarm.worker JOB.json FD", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        job: dict[str, Any] = json.load(f)
    out = os.fdopen(int(argv[1]), "w", buffering=1, encoding="utf-8")

    def send(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    ex = None
    try:
        from .kernels import add_sys_path, resolve
        from .runner import Executor
        from .spec import parse

        add_sys_path(job.get("paths") or [])
        sp = parse(job["raw"], job["source"])
        sp.base_dir = job.get("base_dir")
        items = {it.id: it for it in sp.items()}
        arch = job.get("arch")
        import kcache

        # Before the kernels' modules (and Triton) are imported: Triton's import hook installs the
        # manager, and autotuners decide at decoration whether their results are cached.
        kcache.enable(dir=job["dir"])
        resolve(sp, extra_paths=job.get("paths") or [])
        ex = Executor(sp, arch=arch, store_dir=job["dir"], protect_s=float(job["protect_s"]))
        ex.setup()
        send(
            {"event": "setup", "build": ex.build, "host_code": ex.host_code, "utils_builds": ex.utils_builds}
        )
        for iid in job["items"]:
            send({"event": "start", "id": iid})  # the parent's progress names it while it runs
            r = ex.run(items[iid])
            send({"event": "item", "result": r.as_dict()})
    except Exception as e:  # broad: a worker's last resort: its parent gets the error, not a traceback
        send({"event": "fatal", "error": f"{type(e).__name__}: {str(e).strip()[:500]}"})
        return 1
    finally:
        if ex is not None:
            ex.teardown()
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
