"""Settings kept with a store (``kcache.conf`` in its folder), honoured by every process that
opens it: as ccache keeps ``max_size`` in its cache's own ``ccache.conf``.

Only what belongs to the store itself can be kept there (:data:`KEYS`: its size bound). The
environment (``KCACHE_MAX_SIZE``) and arguments still win over it, and ``kcache config`` says
which one did. The format is ccache's: ``name = value`` lines, ``#`` comments.

The file is read through the store's pinned root descriptor, never following a link, and only
if it is a small regular file of the store's owner that nobody else may write (a store another
user could configure is a store whose bound they choose). A file that fails that, or a bad
value, is ignored with one warning: the default applies.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import Any

from ..log import warn_once

NAME = "kcache.conf"
#: The largest settings file read.
MAX_BYTES = 64 << 10
_LINE_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def _size(text: str) -> int:
    from ..config import parse_size

    return parse_size(text)


#: The settings a store keeps: name -> parser (raises ValueError).
KEYS: dict[str, Callable[[str], Any]] = {"max_size": _size}


class ConfError(ValueError):
    """A bad name or value for ``kcache config --set`` (the message says why)."""


def parse(text: str, where: str = NAME) -> tuple[dict[str, Any], list[str]]:
    """(settings, problems) of a settings file's text. Unknown names and bad values are problems
    (the rest is still used)."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _LINE_RE.match(s)
        if not m:
            problems.append(f"{where}:{n}: not `name = value`")
            continue
        name, value = m.group(1), m.group(2)
        if name not in KEYS:
            problems.append(f"{where}:{n}: unknown setting {name!r} (a store keeps: {', '.join(KEYS)})")
            continue
        try:
            out[name] = KEYS[name](value)
        except ValueError as e:
            problems.append(f"{where}:{n}: {name}: {e}")
    return out, problems


def read_at(root_fd: int | None, owners: frozenset[int] | None = None) -> tuple[dict[str, Any], str]:
    """(settings, raw text) of the store whose root folder is ``root_fd``; ({}, "") when it has
    none or the file may not be trusted (one warning)."""
    import errno

    from ..userfile import UserFileError, open_checked, read_fd

    if root_fd is None:
        return {}, ""
    what = f"the store's {NAME}"
    try:
        # kcache's one checked open (a FIFO or a folder there is refused, never waited on), with
        # no link followed: the file belongs to the store, not to wherever a link leads.
        fd = open_checked(NAME, limit=MAX_BYTES, what=what, dir_fd=root_fd, follow=False)
    except UserFileError as e:
        if e.errno == errno.ENOENT:
            return {}, ""
        warn_once("store-conf", f"{e}; its settings are not used")
        return {}, ""
    try:
        st = os.fstat(fd)
        uids = owners if owners is not None else frozenset({os.geteuid()})
        if st.st_uid not in uids or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(fd)
            warn_once(
                "store-conf",
                f"the store's {NAME} is not a file of the store's owner that only they may write; not used",
            )
            return {}, ""
    except OSError as e:
        os.close(fd)
        warn_once("store-conf", f"{what} cannot be read ({e.strerror or e}); its settings are not used")
        return {}, ""
    try:
        text = read_fd(fd, MAX_BYTES, NAME, what).decode("utf-8", "replace")  # closes fd
    except UserFileError as e:
        warn_once("store-conf", f"{e}; its settings are not used")
        return {}, ""
    values, problems = parse(text)
    if problems:
        warn_once("store-conf-bad", f"ignored in the store's settings: {'; '.join(problems[:3])}")
    return values, text


def render(values: dict[str, Any], previous: str = "") -> str:
    """The file's new text: ``previous`` with each setting's line replaced, removed (value None)
    or added; comments and other lines kept."""

    def shown(name: str, v: Any) -> str:
        if name == "max_size":
            return _bytes_text(int(v)) if isinstance(v, int) else str(v)
        return str(v)

    lines, done = [], set()
    for line in previous.splitlines():
        m = _LINE_RE.match(line.strip()) if line.strip() and not line.strip().startswith("#") else None
        if m and m.group(1) in values:
            name = m.group(1)
            done.add(name)
            if values[name] is not None:
                lines.append(f"{name} = {shown(name, values[name])}")
            continue
        lines.append(line)
    if not previous:
        lines.append("# kcache: settings of this store, used by every process that opens it")
        lines.append("# (environment variables such as KCACHE_MAX_SIZE still win); see `kcache config`")
    for name, v in values.items():
        if name not in done and v is not None:
            lines.append(f"{name} = {shown(name, v)}")
    return "\n".join(lines) + "\n"


def _bytes_text(n: int) -> str:
    """A size as the user would write it, exact: 20GiB, 500MiB, or bytes."""
    for unit, mult in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def check(name: str, value: str) -> Any:
    """The parsed value of ``name=value`` for ``kcache config --set``; :class:`ConfError` if bad."""
    if name not in KEYS:
        raise ConfError(f"unknown setting {name!r}: a store keeps {', '.join(KEYS)}")
    try:
        return KEYS[name](value)
    except ValueError as e:
        raise ConfError(f"{name}: {e}") from None


def write(root: str, values: dict[str, Any]) -> str:
    """Set (or, with value None, remove) ``values`` in the store at ``root``: the file is
    rewritten through a unique name in the store's folder, then renamed over the old one.
    Returns the new text. Raises OSError."""
    from . import fs

    rfd = fs.open_dir(root, root, fs.trusted_owners(False))
    try:
        _old, text = read_at(rfd)
        new = render(values, text)
        tmp = fs.unique_name(".kcache.conf")
        fs.write_new_at(rfd, tmp, new.encode(), mode=0o600)
        try:
            os.rename(tmp, NAME, src_dir_fd=rfd, dst_dir_fd=rfd)
        except OSError:
            os.unlink(tmp, dir_fd=rfd)
            raise
        return new
    finally:
        os.close(rfd)


def read_path(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings kept by the store at ``root`` ({} when there is none, or no store)."""
    from . import fs

    try:
        rfd = fs.open_dir(os.fspath(root), os.fspath(root), None)
    except (OSError, fs.UnsafePath):
        return {}
    try:
        return read_at(rfd, fs.trusted_owners(True))[0]
    finally:
        os.close(rfd)
