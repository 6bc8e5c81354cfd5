"""Clocks and disks (tools/chaos_inputs.py's cases ``clock_skew`` and ``full_disk``): a process
whose clock runs an hour ahead (:func:`skewed_env`) evicting while another uses entries, and a
store on a tmpfs filled to the last byte and inode (:func:`fill_to_the_last_byte`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaos_inputs_common import (
    PYTHON,
    SKEW_S,
    child_env,
    cli,
    text,
)

# ----------------------------------------------------------------------------------- clock skew

SKEW_SITE = """
# A clock that runs CHAOS_SKEW_S seconds ahead (tests of kcache's eviction grace period).
import os as _os, time as _t
_off = float(_os.environ.get("CHAOS_SKEW_S", "0") or 0)
if _off:
    _real_time, _real_time_ns = _t.time, _t.time_ns
    _t.time = lambda: _real_time() + _off
    _t.time_ns = lambda: _real_time_ns() + int(_off * 1e9)
"""


def skewed_env(env: dict[str, str], folder: Path, seconds: float = SKEW_S) -> dict[str, str]:
    """``env`` for a child whose time.time() and time.time_ns() run ``seconds`` ahead (a
    sitecustomize in ``folder``, first on PYTHONPATH); the kernel's clock is untouched."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SKEW_SITE)
    return {
        **env,
        "PYTHONPATH": f"{folder}{os.pathsep}{env.get('PYTHONPATH', '')}",
        "CHAOS_SKEW_S": str(seconds),
    }


def content(key: str, size: int = 8192) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(f"{key}/{i}".encode()).digest()
        i += 1
    return bytes(out[:size])


STORE_CHILD = r"""
import json, os, sys, time
from kcache.store import Store
root, mode, arg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def content(key, size=8192):
    import hashlib
    out = bytearray(); i = 0
    while len(out) < size:
        out += hashlib.sha256(f"{key}/{i}".encode()).digest(); i += 1
    return bytes(out[:size])
res = {"clock": time.time(), "errors": []}
if mode == "fill":
    st = Store.open(root)
    res["ids"] = {}
    for key in arg["keys"]:
        h = st.put("chaos", key, {"m.bin": content(key)}, protect_s=arg.get("protect", {}).get(key, 0))
        res["ids"][key] = h.record.id
    st.close()
elif mode == "use":  # hit the keys until the time is up (or the file ``stop`` exists); every
    # miss and error noted
    st = Store.open(root)
    res.update(hits=0, misses=[], wrong=0)
    end = time.monotonic() + arg["seconds"]
    stop = arg.get("stop")
    while time.monotonic() < end and not (stop and os.path.exists(stop)):
        for key in arg["keys"]:
            try:
                h = st.get("chaos", key)
            except Exception as e:
                res["errors"].append(repr(e)); continue
            if h is None:
                res["misses"].append(key)
            elif h.read("m.bin") != content(key) or open(h.paths["m.bin"], "rb").read() != content(key):
                res["wrong"] += 1
            else:
                res["hits"] += 1
        time.sleep(0.02)
    st.close()
elif mode == "evict":  # evict under a tiny bound (or the entries down to a target), over and over
    st = Store.open(root, max_size=arg["max_size"])
    res["evicted"] = 0
    end = time.monotonic() + arg["seconds"]
    while time.monotonic() < end:
        try:
            n, _ = st.evict(arg.get("target"))
            res["evicted"] += n
        except Exception as e:
            res["errors"].append(repr(e))
        time.sleep(0.05)
    st.close()
elif mode == "aggressor":  # evict under a tiny bound and remove everything, over and over
    # until ``seconds`` are up or, sooner, the file ``stop`` exists (the processes it works
    # against are done: every pass after them would spend CPU on an empty store)
    stop, did = arg.get("stop"), arg.get("did")
    try:
        st = Store.open(root, max_size=arg["max_size"])
        res.update(evicted=0, removed=0, rounds=0)
        end = time.monotonic() + arg["seconds"]
        while time.monotonic() < end and not (stop and os.path.exists(stop)):
            try:
                n, _ = st.evict()
                res["evicted"] += n
                if res["rounds"] % arg["remove_every"] == 0:
                    res["removed"] += st.remove(sorted(st.iter_entry_ids()))
            except Exception as e:
                res["errors"].append(repr(e))
            if did and res["evicted"] + res["removed"]:  # (those it works against may stop now)
                open(did, "a").close()
                did = None
            res["rounds"] += 1
            time.sleep(0.05)
        st.close()
    finally:
        if did:  # ended (or failed) before it removed anything: nobody is to wait for it
            open(did, "a").close()
print(json.dumps(res))
"""


def store_child(
    root: Path, mode: str, arg: dict[str, Any], env: dict[str, str], timeout: float = 300
) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-c", STORE_CHILD, str(root), mode, json.dumps(arg)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
    )  # fmt: skip


def finish(p: subprocess.Popen, timeout: float = 300) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0 or b"Traceback" in err:
        return {"errors": [f"rc={p.returncode}: {text(err)[-2000:]}"]}
    res = json.loads(text(out).strip().splitlines()[-1])
    res["stderr"] = text(err)
    return res


def age_entries(root: Path, ids: Iterable[str], seconds: float, env: dict[str, str]) -> None:
    """Make entries look unused for ``seconds``: their record files' mtimes go back, and the index
    is rebuilt from those (``kcache verify --fix`` after removing the index)."""
    t = time.time() - seconds
    for ident in ids:
        os.utime(root / "entries" / ident[:2] / ident / "__kcache__.rec", (t, t))
    for p in (root / "index").iterdir():
        p.unlink()
    r = cli(["verify", "--fix", "--dir", str(root)], env)
    if r.returncode != 0:
        raise RuntimeError(f"verify --fix: {text(r.stdout)[-1000:]} {text(r.stderr)[-1000:]}")


def entry_bytes(root: Path, ident: str) -> int:
    """What an entry counts for against the size bound: its bytes on disk, as du counts them (its
    folder's blocks, its record's and its members')."""
    d = root / "entries" / ident[:2] / ident
    return sum(os.lstat(p).st_blocks * 512 for p in [d, *d.iterdir()])


def entry_ids_on_disk(root: Path) -> set[str]:
    out: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for shard in os.listdir(root / "entries"):
            out.update(os.listdir(root / "entries" / shard))
    return out


# ----------------------------------------------------------------------------------- full disk


def fill_to_the_last_byte(path: Path) -> int:
    """Grow the file ``path`` until its filesystem refuses even one more byte. Returns its size."""
    with open(path, "ab", buffering=0) as f:
        for chunk in (256 * 1024, 4096, 1):
            block = bytes(chunk)
            while True:
                try:
                    if f.write(block) != chunk:
                        break
                except OSError:
                    break
        return os.fstat(f.fileno()).st_size


def fill_inodes(folder: Path, leave: int = 0) -> int:
    """Create empty files in ``folder`` until its filesystem has no inode left, then remove
    ``leave`` of them (that many inodes stay free). Returns how many files remain."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        try:
            os.close(os.open(folder / f"f{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except OSError:
            break
        n += 1
    for i in range(min(leave, n)):
        os.unlink(folder / f"f{n - 1 - i}")
    return n - min(leave, n)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


FILL_CHILD = r"""
import json, os, sys
from kcache.store import Store
root, size = sys.argv[1], int(sys.argv[2])
st = Store.open(root)
kinds = ("triton", "nvfuser")
n = {k: 0 for k in kinds}
i = refused = 0
while refused < 3 and i < 2000:
    kind = kinds[i % 2]
    h = st.put(kind, f"fill/{i}", {"k.bin": os.urandom(size)})
    if h is None:
        refused += 1
    else:
        n[kind] += 1
    i += 1
st.close()
print(json.dumps(n))
"""


def fill_store(root: Path, env: dict[str, str], size: int = 48 * 1024) -> dict[str, int]:
    """Put entries of ``triton`` and ``nvfuser`` kinds until the store's filesystem is full."""
    r = subprocess.run(
        [PYTHON, "-c", FILL_CHILD, str(root), str(size)], env=env, capture_output=True, timeout=300
    )
    if r.returncode != 0:
        raise RuntimeError(text(r.stderr)[-2000:])
    return json.loads(text(r.stdout).strip().splitlines()[-1])


def case_clock_skew(d: Path) -> dict[str, Any]:
    env = child_env(d)
    root = d / "store"
    old = [f"old/{i}" for i in range(12)]
    hot = [f"hot/{i}" for i in range(8)]
    res = finish(store_child(root, "fill", {"keys": old + hot}, env))
    if res.get("errors"):
        return {"failures": res["errors"]}
    ids = res["ids"]
    age_entries(root, [ids[k] for k in old], 1000, env)
    user = store_child(root, "use", {"keys": hot, "seconds": 4}, env)
    time.sleep(0.5)
    ev = finish(store_child(root, "evict", {"max_size": 1024, "seconds": 2}, skewed_env(env, d / "skew")))
    used = finish(user)
    fails = list(ev.get("errors", [])) + list(used.get("errors", []))
    on_disk = entry_ids_on_disk(root)
    lost = [k for k in hot if ids[k] not in on_disk]
    if lost or used.get("misses"):
        fails.append(f"entries in use evicted by a process an hour ahead: {lost or used.get('misses')[:5]}")
    if not ev.get("evicted"):
        fails.append("the skewed process evicted nothing (not even entries unused for 1000 s)")
    return {"evicted": ev.get("evicted"), "hot_kept": len(hot) - len(lost), "failures": fails}


def case_full_disk(d: Path) -> dict[str, Any]:
    mnt = d / "mnt"
    if not mount_tmpfs(mnt, "4m"):
        return {"skipped": "mounting a tmpfs needs root", "failures": []}
    fails: list[str] = []
    try:
        env = child_env(d)
        root = mnt / "store"
        n = fill_store(root, env)
        fill_to_the_last_byte(mnt / "filler")
        if free_bytes(mnt) != 0:
            fails.append(f"not full: {free_bytes(mnt)} bytes free")
        r = cli(["clear", "--kind", "triton", "--dir", str(root)], env)
        out = text(r.stdout).splitlines()
        if r.returncode != 0 or not out or not out[0].startswith(f"removed {n['triton']} entr"):
            fails.append(
                f"clear --kind triton on a full disk: rc={r.returncode} {out} {text(r.stderr)[-300:]}"
            )
        if free_bytes(mnt) == 0:
            fails.append("clear --kind freed nothing")
        fill_to_the_last_byte(mnt / "filler")
        r = cli(["clear", "--all", "--dir", str(root), "--json"], env)
        try:
            rep = json.loads(r.stdout)
        except ValueError:
            rep = {}
        if r.returncode != 0 or rep.get("count") != n["nvfuser"]:
            fails.append(f"clear --all on a full disk: rc={r.returncode} {rep or text(r.stderr)[-300:]}")
        if entry_ids_on_disk(root):
            fails.append(f"entries left: {len(entry_ids_on_disk(root))}")
        os.unlink(mnt / "filler")
        r = cli(["verify", "--fix", "--dir", str(root)], env)
        r2 = cli(["verify", "--dir", str(root)], env)
        if r2.returncode != 0:
            fails.append(f"verify after clear: {text(r2.stdout)[-500:]} (fix: {text(r.stdout)[-300:]})")
        return {"entries": n, "failures": fails}
    finally:
        umount(mnt)
