"""Cross-process locks: one ``flock`` on a file in the store's ``locks/`` folder.

An flock belongs to an open file, so the kernel drops it when its holder dies: a crashed
compiler blocks others only until it is gone, a hung one only for the waiter's timeout. Lock
files are opened relative to the pinned ``locks/`` folder with ``O_NOFOLLOW`` (a planted link is
refused, never truncated or followed) and are never deleted (deleting a lock file someone waits
on would let two holders in).
"""

from __future__ import annotations

import fcntl
import os
import time

from .fs import O_CLOEXEC, O_NOFOLLOW

POLL_MIN_S, POLL_MAX_S = 0.001, 0.01


class Lock:
    """An exclusive lock on ``name`` in the folder ``dir_fd``; not reentrant, not thread-bound."""

    def __init__(self, dir_fd: int, name: str) -> None:
        self._dir_fd, self.name = dir_fd, name
        self._fd: int | None = None
        self._pid = 0

    @property
    def held(self) -> bool:
        return self._fd is not None and self._pid == os.getpid()

    def try_acquire(self) -> bool:
        """Take the lock if it is free now. Raises OSError when the lock file cannot be opened."""
        if self._fd is not None:
            return self.held
        fd = os.open(self.name, os.O_RDWR | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600, dir_fd=self._dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:  # re-raised: it only cleans up on the way
            os.close(fd)
            raise
        self._fd, self._pid = fd, os.getpid()
        return True

    def acquire(self, timeout: float, poll: object = None) -> bool:
        """Wait up to ``timeout`` seconds for the lock; ``poll()`` (if given) is called between
        tries and ends the wait when it returns something true. True when the lock is held."""
        deadline = time.monotonic() + timeout
        delay = POLL_MIN_S
        while True:
            if self.try_acquire():
                return True
            if poll is not None and poll():  # type: ignore[operator]
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

    def release(self) -> None:
        """Let go (a forked child never releases its parent's lock: they share the open file)."""
        fd, self._fd = self._fd, None
        if fd is None or self._pid != os.getpid():
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # broad: a finaliser must not raise (it runs at any point, even at exit)
            pass
