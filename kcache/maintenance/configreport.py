"""``kcache config``: the effective settings, where each came from, and whether the store folder
is usable (without opening or creating it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Settings
from ..store.safety import UnsafeStore, check_dir, fs_type, insecure_parent, is_network_fs


def config_report(settings: Settings) -> dict[str, Any]:
    """Each effective setting with where it came from (numeric ones with their ``range``), and
    whether the store dir is usable."""
    from ..config import ENV, RANGES

    values = settings.as_dict()
    rows = [
        {"name": name, "env": var, "value": values.get(name), "source": settings.sources.get(name, "default")}
        for name, var in ENV.items()
    ]
    rows += _backend_rows(settings)
    _backend_default(settings, rows)
    _where_from(settings, rows)
    _bad_values(settings, rows)
    for row in rows:
        if row["name"] in RANGES:  # what a value may be; outside it, the setting is a problem
            _unit, low, high = RANGES[row["name"]]
            row["range"] = [low, high]
    root = Path(settings.dir).absolute()
    store: dict[str, Any] = {"dir": str(root), "exists": root.exists()}
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    store["fs_type"] = fs_type(probe)
    store["network_fs"] = is_network_fs(probe)
    if root.is_dir():
        from ..store.opening import MARKER

        store["is_store"] = (root / MARKER).is_file()
        try:
            check_dir(root, readonly=settings.readonly, allow_insecure=settings.allow_insecure)
            why = insecure_parent(str(root))
            if why and not settings.allow_insecure:
                raise UnsafeStore(f"another user can replace the store ({why})")
            store["safe"], store["safety"] = (
                True,
                "ok" if not why else f"used anyway: {why} (no host code from it)",
            )
        except (UnsafeStore, OSError) as e:
            store["safe"], store["safety"] = False, str(e)
    elif root.exists():
        store["is_store"], store["safe"], store["safety"] = False, False, f"{root} is not a directory"
    else:
        store["is_store"], store["safe"] = False, None
        store["safety"] = "does not exist yet (created 0700 on first write)"
    if store["network_fs"]:
        store["index"] = "node-local (SQLite locking is unsafe on network filesystems)"
    else:
        store["index"] = str(root / "index" / "kcache.sqlite")
    return {
        "settings": rows,
        "problems": list(settings.problems),
        "remote_problems": list(getattr(settings, "remote_problems", [])),
        "shared_tier": _shared_tier(settings),
        "store": store,
    }


def _where_from(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Sources that "default" would hide: the folder from ``XDG_CACHE_HOME``, and the bound kept
    in the store's ``kcache.conf`` (which the environment overrides, as the row then says)."""
    import os

    from ..config import format_size
    from ..store.conf import NAME, read_path

    kept = read_path(settings.dir)
    for row in rows:
        if row["name"] == "dir" and row["source"] == "default":
            row["source"] = "env XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "default (~/.cache)"
        if row["name"] == "max_size" and "max_size" in kept:
            if row["source"] == "default":
                row["value"], row["source"] = kept["max_size"], f"store {NAME}"
            else:
                row["source"] += f" (over the store's {NAME}: {format_size(kept['max_size'])})"


def _backend_default(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """The deadline the tier uses when ``KCACHE_REMOTE_TIMEOUT`` is not set: its backend's own
    where it has one (``s3://``: 500 ms; the row showed the tier's 100 ms, which S3 never used)."""
    from .. import remotes

    own = remotes.default_timeout_s(settings)
    for row in rows:
        if row["name"] == "remote_timeout" and own:
            scheme = remotes.scheme_of(str(getattr(settings, "remote", ""))) or "the backend"
            row["value"], row["source"] = own * 1000.0, f"default for {scheme}://"


def _bad_values(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """A variable set to a bad value: its row shows the value that applies instead, and says so
    (before, ``KCACHE_MAX_SIZE=12XB`` showed "10.0 GiB ... default" with the reason only at the
    bottom of the output)."""
    bad = [*settings.problems, *getattr(settings, "remote_problems", [])]
    for row in rows:
        if any(p.startswith(f"{row['env']}=") for p in bad):
            row["source"] = f"{row['source']}: {row['env']} is bad, ignored (see problems)"
            row["bad"] = True


def _backend_rows(settings: Settings) -> list[dict[str, Any]]:
    """The settings of the backend ``KCACHE_REMOTE`` names (``KCACHE_REMOTE_PASSWORD`` for Redis),
    secrets as ``set``."""
    from .. import remotes

    remote = getattr(settings, "remote", None)
    backend = remotes.for_url(remote) if remote and "://" in remote else None
    values = settings.backend_values()
    return [
        {
            "name": f"remote_{st.name}",
            "env": st.env,
            "value": values.get(f"remote_{st.name}"),
            "source": settings.remote_option_sources.get(st.name, "default"),
        }
        for st in getattr(backend, "settings", ())
    ]


def _shared_tier(settings: Settings) -> dict[str, Any] | None:
    """Whether what the shared tier hands out is authenticated (None: no shared tier)."""
    if not getattr(settings, "remote", None):
        return None
    from ..store.tiers.entry import trust_line

    return {"authenticated": bool(settings.secret), "trust": trust_line(settings.secret)}
