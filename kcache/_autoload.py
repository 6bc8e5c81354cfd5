"""Imported by the ``kcache.pth`` hook when ``KCACHE`` is set: turn kcache on in this process.

It must cost milliseconds: it imports neither torch nor triton (integrations attach when the
program imports them) and it never raises: a bad setting warns once and leaves caching off.
"""

try:
    import kcache as _kcache

    _kcache._enable_from_env()
except Exception as _e:  # the user's program must start whatever happens here
    import sys as _sys

    print(f"kcache: warning: not enabled: {_e}", file=_sys.stderr)
