"""Files a user names (tools/chaos_inputs.py's case ``user_files``, issue 34): ``explain
--against``, ``import`` and ``prewarm`` against a FIFO, a link to one, ``/dev/stdin`` on a silent
pipe, a 1 GiB sparse file that starts like the real thing and a document nested 100,000 deep:
refused at once (exit 2, one line), under 1.5 GiB (:func:`user_file_case`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

from chaos_bundles import (
    tar_header,
    write_bundle,
)
from chaos_inputs_common import (
    RSS_SMALL,
    GiB,
    child_env,
    cli_limited,
    manifest_bytes,
    one_line_failure,
)

# ----------------------------------------------------------------------------------- files a user names
# (issue 34) Every command that reads a file a user names, against each attack on that name.
#: The commands, each with the kind of file it reads there (``{path}``: the attack's path,
#: ``{store}``: a store of the case's own).
USER_FILE_COMMANDS: dict[str, tuple[str, list[str]]] = {
    "explain --against": ("fingerprint", ["explain", "--against", "{path}", "--dir", "{store}"]),
    "import": ("bundle", ["import", "{path}", "--dir", "{store}"]),
    "prewarm": ("spec", ["prewarm", "{path}", "--target", "cuda:90", "--dir", "{store}"]),
}
#: The attacks on a name: a FIFO (nobody writes), a link to one, ``/dev/stdin`` on a pipe whose
#: writer stays open and silent, a 1 GiB sparse file that starts like the real thing (read
#: whole, it takes a gigabyte), and a document nested 100,000 deep (Python's parsers recurse).
USER_FILE_ATTACKS = ("fifo", "fifo-link", "stdin-pipe", "sparse-1GiB", "deep")
#: Bundles are large by nature: a sparse one is bounded by its manifest's limits (exit 1, as any
#: bundle whose content is refused; test_hostile_inputs.py's bombs), not by the file's size.
USER_FILE_CONTENT_BOUNDED = {("import", "sparse-1GiB")}
DEEP = 100_000


def fingerprint_head() -> bytes:
    """The start of a fingerprint file as ``kcache fingerprint --json`` writes it."""
    return b'{\n "format": "kcache-fingerprint",\n "parts": {\n  "key_tag": "",\n  "triton_version": "'


def deep_fingerprint(depth: int = DEEP) -> bytes:
    return b'{"format": "kcache-fingerprint", "parts": {"x": ' + b"[" * depth + b"]" * depth + b"}}"


SPEC_HEAD = b'version = 1\n\n[[triton]]\nkernel = "kernels:add_kernel"\nsizes = [{ N = 1024 }]\n# '


def deep_spec(depth: int = DEEP) -> bytes:
    return (
        b'version = 1\n\n[[triton]]\nkernel = "kernels:add_kernel"\nsizes = '
        + b"[" * depth
        + b"]" * depth
        + b"\n"
    )


def deep_bundle(path: Path, depth: int = 1000) -> Path:
    """A bundle whose manifest nests ``depth`` deep (msgpack's C unpacker takes up to 1,024; what
    is done with the value after, ``str()`` of its key tag, recursed)."""
    nested: Any = []
    for _ in range(depth):
        nested = [nested]
    body = {"format": "kcache-bundle", "schema": 1, "created": 0.0, "key_tag": nested, "records": []}
    return write_bundle(path, [], manifest=manifest_bytes([], body=body))


def user_file(d: Path, attack: str, fmt: str) -> tuple[str, int | None]:
    """The path of ``attack`` for a file of ``fmt`` (fingerprint, bundle, spec) under ``d``, and
    for ``stdin-pipe`` the read end of a pipe to give the child as its standard input (the test
    keeps the write end open, silent, and closes both after)."""
    d.mkdir(parents=True, exist_ok=True)
    name = {"fingerprint": "other.json", "bundle": "other.kcb", "spec": "spec.toml"}[fmt]
    if attack == "fifo":
        os.mkfifo(d / name)
        return str(d / name), None
    if attack == "fifo-link":
        os.mkfifo(d / "the-fifo")
        os.symlink(d / "the-fifo", d / name)
        return str(d / name), None
    if attack == "stdin-pipe":
        r, w = os.pipe()
        _PIPES[r] = w
        return "/dev/stdin", r
    if attack == "sparse-1GiB":
        head = {"fingerprint": fingerprint_head(), "spec": SPEC_HEAD, "bundle": tar_header("MANIFEST", GiB)}[
            fmt
        ]
        with open(d / name, "wb") as f:
            f.write(head)
            f.truncate(GiB)
        return str(d / name), None
    if attack == "deep":
        if fmt == "bundle":
            return str(deep_bundle(d / name)), None
        (d / name).write_bytes(deep_fingerprint() if fmt == "fingerprint" else deep_spec())
        return str(d / name), None
    raise ValueError(attack)


_PIPES: dict[int, int] = {}


def close_pipe(r: int | None) -> None:
    """Close a pipe :func:`user_file` made (both ends)."""
    if r is None:
        return
    for fd in (r, _PIPES.pop(r, None)):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def user_file_case(
    d: Path, command: str, attack: str, env: dict[str, str], timeout: float = 30
) -> str | None:
    """Run ``command`` against ``attack``, in a child with its address space limited (1.5 GiB) and
    a time limit; None when it was refused as it should be (within the time, exit 2 with one
    line naming the file: a bad argument; 1 for a bundle bounded by its content), else what
    went wrong."""
    fmt, args = USER_FILE_COMMANDS[command]
    path, stdin = user_file(d, attack, fmt)
    argv = [a.format(path=path, store=str(d / "store")) for a in args]
    try:
        r, m = cli_limited(
            argv,
            env,
            d / "measure",
            timeout=timeout,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"blocked: still running after {timeout:.0f} s"
    finally:
        close_pipe(stdin)
    want = 1 if (command, attack) in USER_FILE_CONTENT_BOUNDED else 2
    why = one_line_failure(r, path, want=want)
    if why is None and m.get("maxrss") and m["maxrss"] > RSS_SMALL:
        why = f"peak RSS {m['maxrss'] >> 20} MiB"
    if why is None and (d / "store").exists() and command == "import":
        why = "a refused import made the store"
    return why


def case_user_files(d: Path) -> dict[str, Any]:
    """Every command that reads a file a user names against every attack on that name (issue
    34): refused at once, exit 2, one line (see :func:`user_file_case`)."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = [(c, a) for c in USER_FILE_COMMANDS for a in USER_FILE_ATTACKS]

    def one(pair: tuple[str, str]) -> str | None:
        c, a = pair
        sub = d / f"{c.replace(' ', '_')}-{a}"
        return user_file_case(sub, c, a, child_env(sub))

    with ThreadPoolExecutor(4) as ex:
        whys = list(ex.map(one, pairs))
    fails = [f"{c} {a}: {why}" for (c, a), why in zip(pairs, whys) if why]
    return {"cases": len(pairs), "failures": fails}
