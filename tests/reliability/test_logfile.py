"""``KCACHE_LOGFILE`` at a name that is not a plain file of ours (review M5, m9): every run is a
real interpreter with the setting in its environment, as a job's processes have it.

- a FIFO (with or without a reader), a device, a socket: the program never waits; one warning
  on stderr says why, logging goes on there, and nothing is written into the node;
- in a folder every user can write (/tmp), a name another user made first (a link to a victim's
  file, a hard link to it, a file of their own): nothing is appended to it;
- a file of ours that exists already is made 0600, as a new one is;
- a message carrying hostile text (a newline in a store's path) stays one line in the file.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from .attackers import fingerprint, make_victims, needs_root, plant, private_tmp, shared_folder
from .conftest import base_env, no_traceback, run_py, warning_lines

#: kcache.enable() on a store: the log is configured there (a KCACHE=1 child does it at import)
PROGRAM = "import kcache; print(kcache.enable(dir={store!r}), flush=True)"

# A child that waited on the FIFO would be killed here: the test fails rather than hangs (the
# child itself needs well under a second).
TIMEOUT = 60


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """This module's ``tmp_path``: one the second user can reach (see attackers.private_tmp)."""
    yield from private_tmp()


def open_store(tmp_path: Path, name: str = "open-store") -> Path:
    """A store folder others can write: every process warns (``caching is off``) and runs on."""
    bad = tmp_path / name
    bad.mkdir(mode=0o777)
    bad.chmod(0o777)
    return bad


def run(tmp_path: Path, logfile: Path | str, code: str) -> tuple[int, str, str]:
    env = base_env(tmp_path, KCACHE_LOGFILE=str(logfile))
    r = run_py(code, env, timeout=TIMEOUT)
    no_traceback(r)
    return r.returncode, r.stdout, r.stderr


def run_warning(tmp_path: Path, logfile: Path | str, store: Path) -> tuple[int, str, str]:
    """``store`` is one others can write: kcache refuses it with a warning, a log line."""
    return run(tmp_path, logfile, PROGRAM.format(store=str(store)))


def refusals(stderr: str) -> list[str]:
    return [ln for ln in warning_lines(stderr) if "cannot write the log file" in ln]


@pytest.mark.parametrize("reader", [False, True])
def test_a_fifo_is_never_waited_on_nor_written(tmp_path: Path, reader: bool) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) if reader else None
    try:
        rc, out, err = run(tmp_path, fifo, PROGRAM.format(store=str(tmp_path / "store")))
        assert rc == 0 and out.strip() == "True", err  # caching is on: only the log file is off
        w = refusals(err)
        assert len(w) == 1 and "FIFO" in w[0] and str(fifo) in w[0], err
        if rfd is not None:  # nothing went into the pipe (and no writer is left: end of file)
            assert os.read(rfd, 4096) == b""
    finally:
        if rfd is not None:
            os.close(rfd)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_device_or_socket_is_refused(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(tmp_path / "log.sock"))
        sock.listen(1)
        for node, kind in (("/dev/null", "character device"), (tmp_path / "log.sock", "socket")):
            rc, out, err = run_warning(tmp_path, node, open_store(tmp_path, f"store-{kind[0]}"))
            assert rc == 0 and out.strip() == "False", err  # the program runs on
            w = refusals(err)
            assert len(w) == 1 and kind in w[0], err
            assert [ln for ln in warning_lines(err) if "caching is off" in ln], err  # stderr has it
    finally:
        sock.close()


# ------------------------------------------------------------------------------ a shared folder
@pytest.mark.parametrize("how", ["symlink", "hardlink", "foreign_file"])
def test_a_name_planted_in_a_shared_folder_is_not_written(tmp_path: Path, how: str) -> None:
    """``KCACHE_LOGFILE=/tmp/kcache.log`` where another user made the name first: a link to the
    victim's file, a hard link to it (where fs.protected_hardlinks is off; made here by root), or
    a file of their own (0666: they would read every line appended)."""
    if how != "hardlink":
        needs_root()
    victims = make_victims(tmp_path / "victims")
    victim = victims / "precious"
    shared = shared_folder(tmp_path / "shared", 0o1777)
    log = shared / "kcache.log"
    if how == "symlink":
        plant("nobody", lambda: os.symlink(victim, log))
    elif how == "hardlink":
        os.link(victim, log)
    else:

        def own_file() -> None:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.fchmod(fd, 0o666)
            os.close(fd)

        plant("nobody", own_file)
    before, theirs = fingerprint(victims), log.read_bytes()
    rc, out, err = run_warning(tmp_path, log, open_store(tmp_path))
    assert rc == 0 and out.strip() == "False", err
    assert fingerprint(victims) == before and log.read_bytes() == theirs
    w = refusals(err)
    assert len(w) == 1 and str(log) in w[0], err


def test_our_own_file_in_a_shared_folder_is_written(tmp_path: Path) -> None:
    """Control for the test above: a new name there, then the file it made, is appended to."""
    log = shared_folder(tmp_path / "shared", 0o1777) / "kcache.log"
    for n in (1, 2):
        rc, out, err = run_warning(tmp_path, log, open_store(tmp_path, f"store{n}"))
        assert rc == 0 and not refusals(err), err
        assert len(log.read_text().splitlines()) == n
    assert log.stat().st_mode & 0o777 == 0o600


def test_unwritable_log_file_still_one_warning(tmp_path: Path) -> None:
    """A path that cannot be made (no such folder): one warning naming why, as before."""
    rc, _, err = run_warning(tmp_path, tmp_path / "no" / "such" / "k.log", open_store(tmp_path))
    w = refusals(err)
    assert rc == 0 and len(w) == 1 and os.strerror(errno.ENOENT) in w[0], err


# ------------------------------------------------------------------------------ review m9
def test_an_existing_file_of_ours_is_made_0600(tmp_path: Path) -> None:
    """The docs say the file is made 0600: one that ``touch`` made (0644) is, too."""
    log = tmp_path / "kcache.log"
    log.touch()
    log.chmod(0o644)
    rc, _, err = run_warning(tmp_path, log, open_store(tmp_path))
    assert rc == 0 and not refusals(err), err
    assert log.stat().st_mode & 0o777 == 0o600
    assert "caching is off" in log.read_text()


def test_hostile_text_cannot_forge_a_log_line(tmp_path: Path) -> None:
    """A message carrying a newline (here in a store's name, as a key's component or a file's
    name would) stays one line of the file: the newline is written escaped, and so are the other
    characters that end a line for ``str.splitlines`` and a terminal's escape."""
    forged = "kcache[1]: WARNING: all is well"
    store = open_store(tmp_path, f"store\n{forged}\u2028{forged}\x1b[2K")
    log = tmp_path / "kcache.log"
    rc, _, err = run_warning(tmp_path, log, store)
    assert rc == 0 and not refusals(err), err
    assert forged in err  # stderr shows the message as it is (a terminal, not a file)
    lines = log.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1 and "caching is off" in lines[0], lines
    assert "store\\n" + forged + "\\u2028" + forged + "\\x1b[2K" in lines[0], lines
