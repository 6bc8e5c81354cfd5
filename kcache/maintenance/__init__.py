"""Maintenance over a store: stats, inspect, clear, verify, explain and config, as plain data.

The command line (:mod:`kcache.cli`) only parses arguments and formats what these functions
return; tests and other tools can call them directly. One module per command; what several
share is in :mod:`.common` (errors, records as data) and :mod:`.lifecycle` (opening and closing
stores, making and unmaking one for an import). Every function takes the store's
:class:`~kcache.store.api.Admin` face.

Reading never writes: :func:`open_store` without ``write`` opens the store read-only (its index
through a connection that cannot write, checkpoint or create files). A missing store folder
reads as an empty store (:class:`~.empty.EmptyStore`) and is never created; neither is an empty
folder turned into a store by a command that only changes or reads one.
"""

from __future__ import annotations

from .clear import clear, stale_reasons, version_components
from .common import MaintenanceError, entry_dict, jsonable
from .configreport import config_report
from .empty import EmptyStore
from .explain import explain
from .inspect import find_entries, list_entries
from .lifecycle import WRITE_TIMEOUT_S, close_store, open_store
from .stats import stats, zero_counters
from .verify import verify

__all__ = [
    "WRITE_TIMEOUT_S",
    "EmptyStore",
    "MaintenanceError",
    "clear",
    "close_store",
    "config_report",
    "entry_dict",
    "explain",
    "find_entries",
    "jsonable",
    "list_entries",
    "open_store",
    "stale_reasons",
    "stats",
    "verify",
    "version_components",
    "zero_counters",
]
