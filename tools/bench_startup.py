"""What ``KCACHE=1`` costs a Python process that never compiles anything (issue 19, point 1).

    python tools/bench_startup.py [--pairs 20] [--json]

Runs ``python -c pass`` in fresh processes, in pairs (KCACHE unset, then set, alternating which
goes first), with bytecode cached as an installed package has it; reports the median of each,
the median of the paired differences, and the modules the hook adds. The interpreter is this
one (``sys.executable``): run it with the environment kcache is installed in. Each process's CPU
time (user + system, from the kernel's accounting of children) is reported beside its wall
time: on a shared, loaded machine the wall figure mostly measures the wait for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(env: dict[str, str], code: str = "pass") -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process running ``code``."""
    c, t = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - t, _children_cpu() - c


def modules(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, json; print(json.dumps(sorted(sys.modules)))"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kcache-startup-")
    off = {
        k: v for k, v in os.environ.items() if not k.startswith("KCACHE") and k != "PYTHONDONTWRITEBYTECODE"
    }
    off.update(
        PYTHONPYCACHEPREFIX=os.path.join(tmp, "pyc"), HOME=tmp, XDG_CACHE_HOME=os.path.join(tmp, "xdg")
    )
    on = {**off, "KCACHE": "1", "KCACHE_DIR": os.path.join(tmp, "store")}
    for e in (off, on, off, on):  # bytecode written, caches warm
        run(e)
    t_off, t_on, diff, c_off, c_on, cdiff = [], [], [], [], [], []
    for i in range(a.pairs):
        if i % 2:
            y, x = run(on), run(off)
        else:
            x, y = run(off), run(on)
        t_off.append(x[0])
        t_on.append(y[0])
        diff.append(y[0] - x[0])
        c_off.append(x[1])
        c_on.append(y[1])
        cdiff.append(y[1] - x[1])
    m_off, m_on = modules(off), modules(on)
    res = {
        "python": sys.version.split()[0],
        "pairs": a.pairs,
        "unset_ms_median": round(1e3 * statistics.median(t_off), 2),
        "set_ms_median": round(1e3 * statistics.median(t_on), 2),
        "added_ms_median_of_pairs": round(1e3 * statistics.median(diff), 2),
        "cpu_unset_ms_median": round(1e3 * statistics.median(c_off), 2),
        "cpu_set_ms_median": round(1e3 * statistics.median(c_on), 2),
        "cpu_added_ms_median_of_pairs": round(1e3 * statistics.median(cdiff), 2),
        "modules_unset": len(m_off),
        "modules_set": len(m_on),
        "modules_added": sorted(set(m_on) - set(m_off)),
        "store_created": os.path.exists(on["KCACHE_DIR"]),
    }
    print(json.dumps(res, indent=None if not a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
