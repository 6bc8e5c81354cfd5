"""Reading what a child process wrote to a pseudo-terminal (progress bars draw only on one)."""

from __future__ import annotations

import os


def drain(master: int) -> bytes:
    """Everything written to the terminal whose master side is ``master``, until the last writer
    closes it (Linux reports that as ``EIO`` on the master, hence the OSError)."""
    got = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got
