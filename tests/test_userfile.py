"""kcache/userfile.py, the one checked open for files a user names (issue 34): its rules one by
one, in this process (the commands that use it are tested end to end in
tests/reliability/test_hostile_files.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcache.userfile import (
    MAX_DEPTH,
    UserFileError,
    check_nesting,
    depth_over,
    nesting,
    open_checked,
    parse_json,
    parse_toml,
    read_bytes,
    read_text,
)


@pytest.fixture
def deadline() -> Iterator[None]:
    """A test that would block fails after 10 s instead of hanging."""

    def boom(*_a: object) -> None:
        raise TimeoutError("blocked")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_only_regular_files_are_opened(tmp_path: Path, deadline: None) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    for path, kind in (
        (fifo, "FIFO"),
        (tmp_path / "link", "FIFO"),
        (tmp_path, "folder"),
        ("/dev/null", "device"),
    ):
        with pytest.raises(UserFileError, match=kind):
            open_checked(path, what="a test file")
    r, w = os.pipe()  # /dev/stdin on a pipe is a FIFO too: refused, not waited on
    saved = os.dup(0)
    try:
        os.dup2(r, 0)
        with pytest.raises(UserFileError, match="FIFO"):
            open_checked("/dev/stdin")
    finally:
        os.dup2(saved, 0)
        for fd in (r, w, saved):
            os.close(fd)


def test_missing_and_links_inside_a_folder(tmp_path: Path) -> None:
    with pytest.raises(UserFileError) as e:
        open_checked(tmp_path / "nothing")
    assert e.value.errno == 2
    (tmp_path / "f").write_text("x")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    dfd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(UserFileError, match="link"):
            open_checked("l", dir_fd=dfd, follow=False)
        os.close(open_checked("f", dir_fd=dfd, follow=False))
    finally:
        os.close(dfd)
    os.close(open_checked(tmp_path / "l"))  # a link the user named is theirs to name


def test_size_is_bounded_before_reading(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.write(b'{"format": ')
        f.truncate(1 << 30)
    with pytest.raises(UserFileError, match="larger than 1024"):
        read_bytes(sparse, limit=1024)
    (tmp_path / "ok").write_bytes(b"x" * 1024)
    assert read_bytes(tmp_path / "ok", limit=1024) == b"x" * 1024
    (tmp_path / "latin").write_bytes(b"\xff\xfe")
    with pytest.raises(UserFileError, match="UTF-8"):
        read_text(tmp_path / "latin", limit=10)


def test_nesting_counts_brackets_outside_strings_and_comments() -> None:
    assert nesting(b'{"a": [1, [2, {"b": 3}]]}', "json") == 4
    assert nesting(b'{"a": "[[[[[[", "b": "\\"[[["}', "json") == 1
    toml = 'a = "[[[["  # [[[[[[\nb = \'[[[\'\nc = """\n[[[[\n"""\nd = [[1], [2]]\n[[t]]\n'
    assert nesting(toml, "toml") == 2
    check_nesting("[" * MAX_DEPTH + "]" * MAX_DEPTH, "json", "f", "x")
    with pytest.raises(UserFileError, match="nested deeper"):
        check_nesting("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "json", "f", "x")


def test_parsed_values_are_bounded_too() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert depth_over(deep) and not depth_over([[1], {"a": [2]}])
    with pytest.raises(UserFileError):
        parse_json("[" * 100_000 + "]" * 100_000, "f", "x")
    # TOML's dotted keys nest without a bracket: the parsed value is checked as well
    with pytest.raises(UserFileError, match="nested deeper"):
        parse_toml(".".join(["k"] * 200) + " = 1\n", "spec.toml", "a spec", ValueError)
    assert parse_toml("a.b = 1\n", "spec.toml", "a spec", ValueError) == {"a": {"b": 1}}
    with pytest.raises(ValueError, match="malformed TOML"):
        parse_toml("a = [\n", "spec.toml", "a spec", ValueError)
