"""What one Triton version does that another does not, met by kcache's cache manager (found by
reading Triton 3.4-3.9's sources, session 25; each test fails on the code before):

- Triton 3.6's ``knobs.runtime.add_stages_inspection_hook`` rewrites a compile's stages, but
  3.6's ``compile`` leaves it out of the kernel's key (3.7 added it). A kernel compiled under the
  hook was stored and served to a process without it (and the reverse). kcache steps aside to
  Triton's own cache for such a compile, which does as Triton does without kcache.
- When a stored launcher or ``cuda_utils`` module fails to load, Triton (``runtime/build.py``,
  every version) builds it again, puts it, and loads the path the put returns. The store kept
  the first bytes under that key, so Triton was handed the same module again and the
  ``ImportError`` reached the program. A put now returns what Triton put.
- Under ``KCACHE_RECORD``, Triton's ``knobs.runtime.scope()`` and ``reset()`` put nothing back
  (every version).
- The group check did not ask for ``warp_size`` (read by 3.9's loader) nor, on 3.5, for
  ``profile_scratch_*`` (read by 3.5's launcher; kcache asked from 3.6): a crafted or damaged
  entry without them was served and failed at its first launch.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

from kernels.harness import MIN_META, PYTHON, clean_env  # noqa: E402

HOOKED = textwrap.dedent(
    """
    import sys, triton, triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs) + tl.load(y + offs))

    if sys.argv[1] == "hook":
        def hook(*args):
            if not args:  # Triton 3.7+ asks the hook for its part of the key
                return ("-marker", "marker")
            backend, stages, options, language, capability = args
            ptx = stages["ptx"]
            stages["ptx"] = lambda src, md: ptx(src, md) + "\\n// STAGES-HOOK-MARKER\\n"
        knobs.runtime.add_stages_inspection_hook = hook
    sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    k = triton.compile(ASTSource(add, sig, constexprs={(4,): 128}), target=GPUTarget("cuda", 90, 32))
    print("MARKED" if "STAGES-HOOK-MARKER" in k.asm["ptx"] else "PLAIN")
    """
)


def compile_once(tmp: Path, store: Path, how: str) -> str:
    env = clean_env(tmp / how, kcache_dir=store)
    script = tmp / "hooked.py"  # a file: @triton.jit reads the kernel's source
    script.write_text(HOOKED)
    p = subprocess.run([PYTHON, str(script), how], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


def test_a_kernel_compiled_under_a_stages_hook_is_never_served_without_it(tmp_path: Path) -> None:
    from triton import knobs

    if not hasattr(knobs.runtime, "add_stages_inspection_hook"):
        pytest.skip("this Triton has no stages hook (3.4, 3.5)")
    store = tmp_path / "store"
    assert compile_once(tmp_path, store, "hook") == "MARKED"
    assert compile_once(tmp_path, store, "plain") == "PLAIN"  # before, on Triton 3.6: MARKED
    assert compile_once(tmp_path, store, "hook") == "MARKED"


BUILD = textwrap.dedent(
    """
    import json, os, sys
    import kcache
    assert kcache.enable(dir=os.environ["PROBE_STORE"], nvfuser=False, torch=False)
    from triton.runtime.cache import get_cache_manager
    name = "cuda_utils" + __import__("sysconfig").get_config_var("EXT_SUFFIX")
    m = get_cache_manager("ab" * 32)
    old = m.get_file(name)
    old_bytes = open(old, "rb").read() if old else None
    # what build.py does after the stored module failed to load: build it again and put it
    path = m.put(sys.argv[1].encode() * 64, name, binary=True)
    got = open(path, "rb").read()
    again = get_cache_manager("ab" * 32).get_file(name)
    print(json.dumps({"old": old_bytes is not None and old_bytes[:2].decode(),
                      "put_returned": got[:2].decode(),
                      "served_next": again is not None and open(again, "rb").read()[:2].decode()}))
    """
)


def test_a_rebuilt_host_module_is_what_the_put_returns(tmp_path: Path) -> None:
    import json

    env = clean_env(tmp_path, PROBE_STORE=str(tmp_path / "store"))
    outs = []
    for content in ("AA", "BB"):  # the first put stores AA; the second stands for a rebuild
        p = subprocess.run(
            [PYTHON, "-c", BUILD, content], env=env, capture_output=True, text=True, timeout=240
        )
        assert p.returncode == 0, p.stderr[-3000:]
        outs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert outs[0] == {"old": False, "put_returned": "AA", "served_next": "AA"}, outs
    # before: the put returned AA (the module that failed to load), and the store kept serving it
    assert outs[1] == {"old": "AA", "put_returned": "BB", "served_next": "BB"}, outs


KNOBS = textwrap.dedent(
    """
    import json, os, triton
    from triton import knobs
    names = sorted(knobs.runtime.knob_descriptors)
    with knobs.runtime.scope():
        knobs.runtime.override_arch = "sm80"
    print(json.dumps({"names": names, "env": os.environ.get("TRITON_OVERRIDE_ARCH"),
                      "knob": knobs.runtime.override_arch}))
    """
)


def test_recording_leaves_tritons_knob_scopes_working(tmp_path: Path) -> None:
    """KCACHE_RECORD routes Triton's JIT hooks through a subclass of ``knobs.runtime``'s class;
    Triton's knobs find their settings in ``type(self).__dict__``, so the subclass hid them all:
    ``scope()`` and ``reset()`` put nothing back, and an architecture set inside a scope
    (TRITON_OVERRIDE_ARCH) stayed for every later compile. Every Triton 3.4-3.9."""
    import json

    got = {}
    for how, extra in (("plain", {}), ("recording", {"KCACHE_RECORD": str(tmp_path / "spec.toml")})):
        env = clean_env(tmp_path / how, kcache_dir=tmp_path / "store", **extra)
        p = subprocess.run([PYTHON, "-c", KNOBS], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        got[how] = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["plain"]["env"] is None and got["plain"]["knob"] is None, got
    assert got["recording"] == got["plain"], got  # before: no names, and sm80 left set


# What Triton's own code reads of a served group's metadata without a default (an AttributeError
# at the kernel's first launch when absent): (file under triton/, what it reads, the field).
READS = (
    ("compiler/compiler.py", "self.metadata.warp_size", "warp_size"),  # the loader, from 3.9
    ("backends/nvidia/driver.py", "metadata.profile_scratch_size", "profile_scratch_size"),  # from 3.5
    ("backends/nvidia/driver.py", "metadata.profile_scratch_align", "profile_scratch_align"),
)


@pytest.mark.parametrize(("where", "read", "field"), READS, ids=[r[2] for r in READS])
def test_a_group_without_a_field_this_triton_reads_is_not_served(where: str, read: str, field: str) -> None:
    """The group check asks for every field the installed Triton's loader and launcher read:
    before, ``warp_size`` on 3.9 and ``profile_scratch_*`` on 3.5 were not asked for, so a crafted
    or damaged entry without them was served and failed at the first launch."""
    import json

    import triton

    from kcache.triton import groupcheck

    source = (Path(triton.__file__).parent / where).read_text()
    meta = dict(MIN_META)
    members = {"k.json": json.dumps(meta).encode(), "k.cubin": b"\x7fELF"}
    assert groupcheck.problem("k.json", members) is None  # the whole group: served
    del meta[field]
    members["k.json"] = json.dumps(meta).encode()
    why = groupcheck.problem("k.json", members)
    if read in source:
        assert why is not None and field in why, (triton.__version__, why)
    else:  # this Triton does not read it: a group without it loads
        assert why is None, (triton.__version__, why)
