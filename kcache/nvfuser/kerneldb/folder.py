"""nvFuser's KernelDb folder format: ``db.csv`` and the ``.cu``/``.cubin`` pair each row names.

nvFuser (``csrc/kernel_db/kernel_db.cpp``) writes ``db.csv`` with the header below and one row per
kernel, and reads the whole folder once per process. Everything here reads defensively: the
folder is written by another program (or a crashed process), so a row that does not parse, a file
that is missing, escapes the folder or is not a regular file, or a binary that does not hold the
kernel's signature is skipped, never fatal. Files are read without following links and without
moving their access time (which tells kcache whether nvFuser read a seeded file).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass

DB_DIR = "nvfuser_kernel_db"
DB_FILE = "db.csv"
HEADER = "kernel_signature,compile_args,kernel_code_file,cubin_file"
MAX_FILE = 256 << 20  # a member larger than this is not a kernel nvFuser wrote

# nvFuser's own row pattern (kernel_db.cpp), minus '/' in file names: a row must stay inside the
# folder. ASCII classes, as std::regex's \w.
_ROW_RE = re.compile(r"([\w-]+),([\w \+\-\=]+),([\w-]+\.cu),([\w-]+\.cubin)", re.ASCII)
_O_NOATIME = getattr(os, "O_NOATIME", 0)
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Kernel:
    """One KernelDb kernel: nvFuser's lowered name, its NVRTC arguments, its source and binary."""

    signature: str
    compile_args: str
    code: bytes
    cubin: bytes

    @property
    def content_hash(self) -> str:
        """Hash of (signature, compile arguments, source): what identifies the kernel.

        The source is part of it: the signature alone (e.g. ``nvfuser_pointwise_f0_c1_r0_g0``,
        mangled) is the same for the first kernel of every fusion definition. The cubin is not:
        KernelDb looks kernels up by source and arguments, and the same kernel compiled twice is
        one kernel."""
        h = hashlib.sha256(b"kcache-nvfuser-kernel/1\0")
        h.update(self.signature.encode())
        h.update(b"\0")
        h.update(self.compile_args.encode())
        h.update(b"\0")
        h.update(self.code)
        return h.hexdigest()[:40]

    def problem(self) -> str | None:
        """Why nvFuser could not use this kernel as it stands, or None."""
        if not _ROW_RE.fullmatch(f"{self.signature},{self.compile_args},a.cu,a.cubin"):
            return "signature or arguments that nvFuser's db.csv cannot hold"
        if not self.code or not self.cubin:
            return "empty source or binary"
        if self.signature.encode() not in self.cubin:
            return "the binary does not contain the kernel's signature"
        return None


@dataclass(frozen=True)
class DbRow:
    """One well-formed ``db.csv`` row: the kernel's name, its NVRTC arguments and its two files."""

    signature: str
    compile_args: str
    code_file: str
    cubin_file: str


def _read_file(path: str, limit: int = MAX_FILE) -> bytes | None:
    """A regular file's bytes without following links or touching its access time; None if not."""
    flags = _O_READ | _O_NOATIME
    try:
        try:
            fd = os.open(path, flags)
        except PermissionError:  # O_NOATIME needs ownership
            fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_rows(db_dir: str | os.PathLike) -> tuple[list[DbRow], int]:
    """The complete, well-formed rows of ``db_dir/db.csv`` and the number of bad lines.

    A wrong header makes every line bad (nvFuser wipes such a folder). A last line without its
    newline is a row being written: neither returned nor counted as bad."""
    data = _read_file(os.path.join(os.fspath(db_dir), DB_FILE))
    if not data:
        return [], 0
    lines = data.decode("ascii", "replace").split("\n")
    complete = lines[:-1]  # the piece after the last newline is unfinished (or empty)
    if not complete:
        return [], 0
    if complete[0] != HEADER:
        return [], len(complete)
    rows, bad = [], 0
    for line in complete[1:]:
        m = _ROW_RE.fullmatch(line)
        if m is None:
            bad += line != ""
            continue
        rows.append(DbRow(*m.groups()))
    return rows, bad


def load_kernel(db_dir: str | os.PathLike, row: DbRow) -> Kernel | None:
    """The kernel a row names, read from its files; None if a file is missing or they disagree."""
    d = os.fspath(db_dir)
    code = _read_file(os.path.join(d, row.code_file))
    cubin = _read_file(os.path.join(d, row.cubin_file))
    if code is None or cubin is None:
        return None
    k = Kernel(row.signature, row.compile_args, code, cubin)
    return None if k.problem() else k
