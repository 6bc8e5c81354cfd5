"""``python -m kcache``: the same command line as ``kcache``."""

from .cli import main

raise SystemExit(main())
