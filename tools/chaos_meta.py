"""Poisoned machine-local answers (tools/chaos_inputs.py's case ``poisoned_meta``): ``triton-meta``
entries that answer ``ptxas --version`` and libtriton's digest wrongly for this machine, under
every key format kcache used, planted in a store, a bundle or the shared tier (:func:`poison`); a
real Triton compile under ``KCACHE=1`` must still be Triton's own (:func:`compile_kernels`).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from chaos_inputs_common import (
    HERE,
    IMPLAUSIBLE_PTXAS,
    PYTHON,
    REPO,
    WRONG_PTXAS,
    child_env,
    cli,
    kcache_records,
    text,
)

# ----------------------------------------------------------------------------------- meta poisoning

META_KEYS = r'''
import importlib.util, os, subprocess, sysconfig
def meta_keys(current=True):
    """{key: wrong answer} for this machine's ptxas and libtriton, in every key format kcache
    used (v1 before efe2a87, v2 at efe2a87, and the running code's own with ``current``)."""
    tdir = importlib.util.find_spec("triton").submodule_search_locations[0]
    ptxas = os.path.join(tdir, "backends", "nvidia", "bin", "ptxas")
    ext = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").split(".")[-1]
    lib = os.path.join(tdir, "_C", f"libtriton.{ext}")
    out = {}
    st = os.stat(ptxas)
    ident = f"{os.path.realpath(ptxas)}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}|ctime={st.st_ctime_ns}"
    for s in (None, subprocess.STDOUT):
        out[("tool", f"tool-version|{ident}|stderr={s!r}")] = WRONG_PTXAS
        out[("tool", f"tool-version/v2|{ident}|stderr={s!r}")] = WRONG_PTXAS
    from kcache import fingerprint
    ver = fingerprint.current("triton_version")
    st = os.stat(lib)
    lident = f"{os.path.realpath(lib)}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}|ctime={st.st_ctime_ns}|triton={ver}"
    out[("lib", lident)] = WRONG_DIGEST
    out[("lib", "v2|" + lident)] = WRONG_DIGEST
    if current:
        try:
            from kcache.triton import toolmemo
            for s in (None, subprocess.STDOUT):
                if hasattr(toolmemo, "memo_key"):
                    out[("tool", toolmemo.memo_key(ptxas, s))] = WRONG_PTXAS
        except ImportError:
            pass
        try:
            from kcache.triton import keymemo
            out[("lib", keymemo.file_identity(lib))] = WRONG_DIGEST
        except ImportError:
            pass
    return out
'''

POISON_CHILD = r"""
import json, sys
sys.path.insert(0, {here!r})
import chaos_inputs as ci
exec(ci.META_KEYS, globals())
WRONG_PTXAS, WRONG_DIGEST = {wrong!r}, ci.WRONG_DIGEST
mode, target = {mode!r}, {target!r}
keys = meta_keys(current={current!r})
if mode == "plant":
    from kcache.store import Store
    st = Store.open(target)
    n = 0
    for (what, key), ans in keys.items():
        name = "output" if what == "tool" else "digest"
        n += st.put("triton-meta", key, {{name: ans}}) is not None
    st.close()
    print(json.dumps({{"planted": n, "keys": len(keys)}}))
elif mode == "redis":  # straight into a shared tier, as the remote store packs its entries
    import redis
    from kcache.store.tiers.entry import pack_entry
    from kcache.store.tiers.redis_keys import entry_key
    url, prefix = target.split("|", 1)
    r = redis.Redis.from_url(url)
    n = 0
    for (what, key), ans in keys.items():
        name = "output" if what == "tool" else "digest"
        rec = ci.make_record("triton-meta", key, {{name: ans}})
        r.set(entry_key(prefix, rec.kind, rec.id), pack_entry(rec.encode(), {{name: ans}}, {secret!r}))
        n += 1
    print(json.dumps({{"planted": n}}))
else:
    secret = {secret!r}
    entries = []
    for (what, key), ans in keys.items():
        name = "output" if what == "tool" else "digest"
        entries.append((ci.make_record("triton-meta", key, {{name: ans}}), {{name: ans}}))
    odd = {{"output": WRONG_PTXAS}}
    entries.append((ci.make_record("triton-meta-v9", "a kind no kcache knows", odd), odd))
    ok = {{"k.cubin": b"\x7fELF" + b"k" * 64, "k.json": b"{{}}"}}
    entries.append((ci.make_record("triton", "poison/benign", ok), ok))
    ci.write_bundle(__import__("pathlib").Path(target), entries, secret=secret)
    print(json.dumps({{"entries": len(entries)}}))
"""


def poison(
    mode: str,
    target: Path,
    env: dict[str, str],
    *,
    secret: bytes | None = None,
    current: bool = True,
    wrong: bytes = WRONG_PTXAS,
) -> dict[str, Any]:
    """``mode`` "plant": put wrong ``triton-meta`` answers straight into the store at ``target``;
    "bundle": write a hand-made bundle at ``target`` holding them (plus an entry of a kind no
    kcache knows and one ordinary kernel); "redis": set them in the shared tier ``target``
    (``URL|PREFIX``), signed with ``secret`` if given. Runs in a child with the code under test."""
    code = POISON_CHILD.format(
        here=str(HERE.parent), mode=mode, target=str(target), current=current, secret=secret, wrong=wrong
    )
    r = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"poison {mode} failed: {text(r.stderr)[-3000:]}")
    return json.loads(text(r.stdout).strip().splitlines()[-1])


def bundle_records(path: Path) -> list[Any]:
    """The records of a bundle's manifest (read with tarfile and msgpack, not with kcache)."""
    import msgpack

    with tarfile.open(path, "r:*") as t:
        m = t.next()
        assert m is not None and m.name == "MANIFEST"
        raw = t.extractfile(m).read()  # type: ignore[union-attr]
    body = msgpack.unpackb(msgpack.unpackb(raw, raw=False)["body"], raw=False)
    r = kcache_records()
    return [r.Record.decode(b) for b in body["records"]]


COMPILE_CHILD = r"""
import importlib.util, json, sys, traceback
spec = importlib.util.spec_from_file_location("kcache_chaos", {chaos!r})
chaos = importlib.util.module_from_spec(spec); sys.modules["kcache_chaos"] = chaos
spec.loader.exec_module(chaos)
import triton, kcache
out = {{"enabled": kcache.is_enabled(), "kernels": {{}}, "errors": []}}
for spec in {specs!r}:
    try:
        out["kernels"]["/".join(map(str, spec))] = chaos.kernel_digest(chaos.compile_kernel(tuple(spec)))
    except Exception:
        out["errors"].append(traceback.format_exc(limit=3)[-1500:])
print(json.dumps(out))
"""


def compile_kernels(
    specs: list[tuple], env: dict[str, Any], timeout: float = 300
) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    """Compile chaos kernels (real Triton, for sm_90, no GPU) in a child; their digests."""
    code = COMPILE_CHILD.format(chaos=str(REPO / "tools" / "chaos.py"), specs=[list(s) for s in specs])
    r = subprocess.run(
        [PYTHON, "-c", code], env=env, capture_output=True, timeout=timeout, check=False, cwd="/"
    )
    try:
        out = json.loads(text(r.stdout).strip().splitlines()[-1])
    except (ValueError, IndexError):
        out = {"enabled": None, "kernels": {}, "errors": [f"rc={r.returncode}: {text(r.stderr)[-2000:]}"]}
    return out, r


def case_poisoned_meta(d: Path) -> dict[str, Any]:
    fails: list[str] = []
    env = child_env(d)
    specs = [("add", "fp32", 64, 90), ("scale", "fp16", 128, 90)]
    ref, r = compile_kernels(specs, env)
    if ref["errors"] or len(ref["kernels"]) != len(specs):
        return {"failures": [f"reference compile: {ref['errors'][:1]}"]}
    secret = b"chaos-secret"
    store = d / "store"
    for signed in (False, True):
        b = d / f"poison-{'signed' if signed else 'unsigned'}.tar"
        poison("bundle", b, env, secret=secret if signed else None)
        ienv = child_env(d, KCACHE_SECRET=secret.decode()) if signed else env
        r = cli(["import", str(b), "--dir", str(store), "--json"], ienv)
        if r.returncode != 0:
            fails.append(
                f"import ({'signed' if signed else 'unsigned'}): rc={r.returncode} {text(r.stderr)[-500:]}"
            )
    r = cli(["inspect", "--kind", "triton-meta", "--json", "--dir", str(store)], env)
    if r.returncode != 0 or json.loads(r.stdout or b"[]"):
        fails.append(f"triton-meta entries imported: {text(r.stdout)[:500]}")
    out, r = compile_kernels(specs, child_env(d, KCACHE="1", KCACHE_DIR=str(store)))
    if out["errors"] or out["kernels"] != ref["kernels"] or not out["enabled"]:
        fails.append(f"compile after importing poisoned bundles: {out['errors'][:1] or 'digests differ'}")
    # Wrong answers planted straight in a store (in the formats an older kcache's import wrote).
    for i, wrong in enumerate((WRONG_PTXAS, *IMPLAUSIBLE_PTXAS)):
        s = d / f"planted-{i}"
        poison("plant", s, env, current=False, wrong=wrong)
        out, r = compile_kernels(specs[:1], child_env(d, KCACHE="1", KCACHE_DIR=str(s)))
        if (
            out["errors"]
            or out["kernels"] != {k: v for k, v in ref["kernels"].items() if k in out["kernels"]}
            or not out["kernels"]
        ):
            fails.append(
                f"compile with planted answer {wrong[:40]!r}: {out['errors'][:1] or 'digests differ'}"
            )
    return {"failures": fails}
