"""Files a user names: one checked open for everything kcache reads from a path it was given.

``kcache explain --against FILE``, ``kcache import FILE``, ``kcache prewarm SPEC`` (and
``kcache.prewarm(path)``), a fingerprint file, the store's ``kcache.conf``: each is a path that a
person, a script or another user chose, and each could be a FIFO (the open or the read waits for
a writer for ever), a link to one, ``/dev/stdin`` on a pipe, ``/dev/zero`` (read until memory
runs out), a folder, or a sparse file of a gigabyte that starts like the real thing. So every
such file goes through :func:`open_checked`:

- regular files only: the path is ``stat``-ed first, so that a device or FIFO is refused without
  even being opened (opening some devices does something), then opened with ``O_NONBLOCK`` (an
  open never waits for a FIFO's writer) and judged again by ``fstat`` of what was opened: the
  decision is the descriptor's, whatever the name leads to by then (no check-then-open race);
- a file kcache appends to (``KCACHE_LOGFILE``, ``KCACHE_RECORD``) is opened the same way
  (:func:`open_append`): a FIFO there would stall the program at its first log line; in a folder
  every user can write (/tmp) only a file of this user's, with one name and not through a link;
- the size is bounded before anything is read (``fstat``'s size; the read stops one byte past
  the bound, for a file that grows meanwhile);
- nesting is bounded before parsing: JSON and TOML by a scan of their brackets outside strings
  and comments (:func:`check_nesting`; Python's parsers recurse, and a program that raised its
  recursion limit would overflow the C stack), and the parsed value again, without recursion
  (:func:`check_depth`: TOML's dotted keys nest without brackets; msgpack, whose C unpacker has a
  fixed stack of 1,024 levels and so never recurses, is checked that way only).

A refusal is a :class:`UserFileError`: one line naming the file and why; the command line exits
2 with it (a bad argument), as it does for any other bad value a user gave.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from itertools import accumulate
from typing import Any

#: How deep a value read from a user's file may nest (a fingerprint is 2 deep, a prewarm spec 5,
#: a bundle's manifest 3): far above what kcache writes, far below what a parser recurses into.
MAX_DEPTH = 64

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UserFileError(ValueError):
    """A file a user named cannot be read (or written) as what it should be (not a regular file,
    too large, nested too deep): the message is one line naming it. The command line exits 2.
    ``errno``: the open's error number when it failed (``ENOENT``: there is no such file), else
    None; ``reason``: the why alone."""

    def __init__(self, message: str, errno: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        #: the why alone, without the name (for a message that names the file its own way)
        self.reason = reason or message


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a link"),
        (stat.S_ISFIFO, "a FIFO (a pipe)"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _judge(path: str, st: os.stat_result, limit: int | None, what: str, verb: str = "read as") -> None:
    if not stat.S_ISREG(st.st_mode):
        why = f"{_kind(st.st_mode)}, not a regular file"
        raise UserFileError(f"{path} is {why}; not {verb} {what}", reason=f"it is {why}")
    if limit is not None and st.st_size > limit:
        why = f"larger than {limit} bytes ({st.st_size})"
        raise UserFileError(f"{path} is {why}; not {verb} {what}", reason=f"it is {why}")


def _open(
    name: str,
    flags: int,
    *,
    limit: int | None,
    what: str,
    verb: str,
    dir_fd: int | None = None,
    follow: bool = True,
    mode: int = 0o600,
) -> int:
    """The one checked open: ``name`` opened with ``flags`` if it is a regular file of at most
    ``limit`` bytes (see :func:`open_checked`); with ``O_CREAT`` a missing file is made, ``mode``."""
    flags |= _O_CLOEXEC | _O_NONBLOCK | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        # A device or FIFO is refused before it is opened; the fstat below decides all the same.
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
        else:
            _judge(name, st, limit, what, verb)
        # O_NONBLOCK: a FIFO put at the name since is not waited on (opened for reading it
        # opens at once; for writing, without a reader, it fails with ENXIO): fstat refuses it.
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == getattr(os, "ELOOP", None) and not follow:
            raise UserFileError(f"{name} is a link; not {verb} {what}", e.errno, "it is a link") from None
        why = e.strerror or str(e)
        raise UserFileError(f"{name}: {why}; not {verb} {what}", e.errno, why) from None
    except UserFileError:
        raise
    except ValueError as e:  # a NUL in the name
        raise UserFileError(f"{name!r}: {e}; not {verb} {what}", reason=str(e)) from None
    try:
        _judge(name, os.fstat(fd), limit, what, verb)
        os.set_blocking(fd, True)  # O_NONBLOCK only guarded the open: a regular file reads as usual
    except BaseException:  # re-raised: it only cleans up on the way
        os.close(fd)
        raise
    return fd


def open_checked(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    what: str = "input",
    dir_fd: int | None = None,
    follow: bool = True,
) -> int:
    """The descriptor of ``path`` opened for reading (blocking reads), if it is a regular file of
    at most ``limit`` bytes; else :class:`UserFileError` (also for a file that cannot be opened:
    missing, no permission). ``what`` names what the file should be, for the message.
    ``dir_fd``: ``path`` is relative to that folder; ``follow`` False: a link is refused (a file
    inside a store), not followed (a link the user named is theirs to name)."""
    return _open(
        os.fspath(path), os.O_RDONLY, limit=limit, what=what, verb="read as", dir_fd=dir_fd, follow=follow
    )


def others_can_write(folder: str) -> bool:
    """Whether every user may make names in ``folder`` (writable by others, sticky like /tmp or
    not): a name there may have been made first by someone else."""
    try:
        return bool(os.stat(folder).st_mode & stat.S_IWOTH)
    except (OSError, ValueError):
        return False


def open_append(
    path: str | os.PathLike[str],
    *,
    what: str,
    read: bool = False,
    limit: int | None = None,
    private: bool | None = None,
    mode: int = 0o600,
) -> int:
    """The descriptor of ``path`` opened for appending (``read``: for reading too), made with
    ``mode`` when missing, if it is a regular file of at most ``limit`` bytes; else
    :class:`UserFileError`. As :func:`open_checked`: a device is refused before it is opened,
    and a FIFO is never waited on (``O_NONBLOCK``: without a reader the open fails, with one
    the ``fstat`` refuses it), so that a file named by a setting (``KCACHE_LOGFILE``,
    ``KCACHE_RECORD``) never stalls the program that appends to it.

    ``private``: only a file of this user's with one name, never reached through a link: in a
    folder others can write, anyone may have made the name first (a link to a victim's file, a
    hard link to it where ``fs.protected_hardlinks`` is off, a file of their own to read what is
    appended). None (the default): so when :func:`others_can_write` the file's folder."""
    name = os.fspath(path)
    if private is None:
        private = others_can_write(os.path.dirname(os.path.abspath(name)))
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_APPEND | os.O_CREAT
    verb = "written as"
    fd = _open(name, flags, limit=limit, what=what, verb=verb, follow=not private, mode=mode)
    try:
        st = os.fstat(fd)
        if private and st.st_uid != os.geteuid():
            why = f"it belongs to uid {st.st_uid}, not to this user"
            raise UserFileError(f"{name}: {why}; not {verb} {what}", reason=why)
        if private and st.st_nlink != 1:
            # A hard link to one of this user's files passes the owner check: appending to it
            # would write into that file. A file kcache appends to has one name (issue 16).
            why = f"it has {st.st_nlink} names (a hard link to another file?)"
            raise UserFileError(f"{name}: {why}; not {verb} {what}", reason=why)
    except BaseException:  # re-raised: it only cleans up on the way
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int, name: str, what: str) -> bytes:
    """At most ``limit`` bytes of the open file ``fd`` (closed here): one byte more means it grew
    past the bound while read, and is refused."""
    try:
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    except OSError as e:
        raise UserFileError(f"{name}: {e.strerror or e}; not read as {what}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise UserFileError(f"{name} grew past the {limit} bytes read for {what}; not read")
    return data


def read_bytes(path: str | os.PathLike[str], *, limit: int, what: str = "input", **kw: Any) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_checked`), at most ``limit``."""
    fd = open_checked(path, limit=limit, what=what, **kw)
    return read_fd(fd, limit, os.fspath(path), what)


def read_text(path: str | os.PathLike[str], *, limit: int, what: str = "input", **kw: Any) -> str:
    """:func:`read_bytes` as UTF-8 text (anything else is refused)."""
    data = read_bytes(path, limit=limit, what=what, **kw)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(
            f"{os.fspath(path)}: not UTF-8 text ({e.reason} at byte {e.start}); not read as {what}"
        ) from None


# ---------------------------------------------------------------------------------- nesting
# What does not count: strings (and TOML's comments), removed before the brackets are counted.
# One alternation, matched left to right, so that a quote inside a comment or a ``#`` inside a
# string is taken for what it is.
#
# Linear, whatever the text (review M6): a string that is never closed matches to the end (of
# the document; in TOML, of its line: a basic string cannot span lines), so that each start
# succeeds once. Were it to fail instead, the scan would start again at every quote inside it,
# and ``"\"\"\"...`` (each quote escaped) cost the square of its length: 32 KB took seconds, a
# 1 MiB fingerprint an hour. Skipping the rest is sound: the parser stops with an error at that
# unclosed string, before any bracket it hides. The loops are unrolled (``[^"\\]*`` runs, one
# escape between them), so that no character can be matched two ways.
_JSON_SKIP = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_TOML_SKIP = re.compile(
    rb'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\''  # multi-line strings (a start fails only with no close after it: a few)
    rb'|"[^"\\\n]*(?:\\.[^"\\\n]*)*(?:"|\\?(?:\n|\Z))'  # a basic string, closed or not
    rb"|'[^'\n]*'"  # a literal string (no escapes: an unclosed one fails at its line's end, once)
    rb"|#[^\n]*"  # a comment
)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def nesting(data: bytes | str, syntax: str) -> int:
    """How deep the brackets of a JSON or TOML document nest, strings and comments aside."""
    b = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    b = _NOT_BRACKET.sub(b"", (_JSON_SKIP if syntax == "json" else _TOML_SKIP).sub(b"", b))
    return max(accumulate(map(_STEP.__getitem__, b)), default=0)


def check_nesting(data: bytes | str, syntax: str, name: str, what: str, limit: int = MAX_DEPTH) -> None:
    """Refuse a JSON or TOML document whose brackets nest deeper than ``limit``, before it is
    parsed."""
    if nesting(data, syntax) > limit:
        raise UserFileError(f"{name}: nested deeper than {limit} levels; not read as {what}")


def depth_over(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (dicts, lists and tuples of anything) nests deeper than ``limit``: walked
    with a stack of its own, never by recursion, and stopped at the first level past it."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items: Any = v.values()
        elif isinstance(v, (list, tuple)):
            items = v
        else:
            continue
        if d >= limit:
            return True
        stack.extend((x, d + 1) for x in items)
    return False


def check_depth(value: Any, name: str, what: str, limit: int = MAX_DEPTH) -> None:
    """Refuse a parsed value that nests deeper than ``limit``."""
    if depth_over(value, limit):
        raise UserFileError(f"{name}: nested deeper than {limit} levels; not read as {what}")


def parse_json(data: bytes | str, name: str, what: str, **loads: Any) -> Any:
    """``json.loads(data)``, its nesting bounded before and after. A document that is not JSON
    raises ``ValueError`` (the caller says what it should have been)."""
    import json

    check_nesting(data, "json", name, what)
    try:
        value = json.loads(data, **loads)
    except RecursionError:  # past the scan (it cannot be, but a parser must never end a command)
        raise UserFileError(f"{name}: nested too deep; not read as {what}") from None
    check_depth(value, name, what)
    return value


def parse_toml(text: str, name: str, what: str, error: Callable[[str], Exception]) -> dict[str, Any]:
    """``tomllib.loads(text)``, its nesting bounded before and after; malformed TOML raises
    ``error(message)``."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found]
    check_nesting(text, "toml", name, what)
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{name}: malformed TOML: {e}") from None
    except RecursionError:
        raise UserFileError(f"{name}: nested too deep; not read as {what}") from None
    check_depth(value, name, what)
    return value
