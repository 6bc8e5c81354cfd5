"""``python -m kcache.prewarm SPEC ...``: the same as ``kcache prewarm SPEC ...``."""

import sys

from .cli import main

sys.exit(main())
