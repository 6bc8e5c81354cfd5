"""Adopt an existing Triton cache folder (``~/.triton/cache``, or any ``TRITON_CACHE_DIR``).

``kcache import --triton-cache DIR`` runs :func:`import_triton_cache`. Triton's layout is one
folder per cache key (base32 of its sha256), holding the kernel's files and a
``__grp__<name>.json`` that lists them by ABSOLUTE path. Those paths go stale when the folder has
moved or was copied; the importer resolves each member by its base name inside the same key
folder, and imports a kernel only when every member is there (a partial group would be a torn
entry).

What goes where, under the store keys kcache's manager uses (``<key>/<file>``):

- kernel groups: one ``triton`` entry each (all members, verified as any entry);
- ``*.so`` launchers and utility modules: ``triton-aux`` entries. They are host code that Triton
  loads with dlopen; the importer takes them only from a folder that this user owns and nobody
  else can write (as the store itself), otherwise it skips them and Triton rebuilds them locally;
- ``*.autotune.json``: autotune timings are valid only on the GPU model that measured them, and
  Triton's cache does not record which one that was. kcache serves them only to the model named
  in their key; the importer skips them unless the caller vouches for the model
  (``autotune_gpu``: the exact name kcache reports for that GPU, or ``"this"`` for the current
  machine's GPU 0). Importing them under an "unknown" model would store entries never served.

The store key is Triton's own key, which covers the Triton build (version and a hash of its
sources and libtriton), so kernels built by another Triton or Python are stored but never looked
up by this one; their records carry the Triton version read from the kernel's metadata, and
``kcache clear --stale`` removes them.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store import fs
from ..store.records import valid_name
from ..userfile import UserFileError, parse_json, read_bytes
from .kinds import KIND_AUTOTUNE, KIND_AUX, KIND_GROUP, kind_of, store_key

if TYPE_CHECKING:
    from ..store import Store

_KEY_RE = re.compile(r"[A-Z2-7]{52}")  # base32 of a sha256, unpadded: Triton's _base32
_GRP = "__grp__"
#: Bounds on what is read from the folder (a ``__grp__`` file linked to /dev/zero, a huge file).
MAX_JSON = 16 << 20
MAX_FILE = 1 << 30
#: The most one kernel (all the files of its group) may take: the store holds an entry's bytes
#: in memory while it writes it, so a group of several sparse 1 GiB files is skipped, unread.
MAX_GROUP = 1 << 30


def _read(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit``: a FIFO, a device or a link is refused (OSError),
    never read or waited on (kcache's one checked open, :mod:`kcache.userfile`)."""
    try:
        return read_bytes(path, limit=limit, what="a Triton cache file", follow=False)
    except UserFileError as e:
        raise OSError(str(e)) from None


def _json(path: Path) -> Any:
    """A JSON file of the folder, its nesting bounded before it is parsed (``ValueError``)."""
    return parse_json(_read(path, MAX_JSON), str(path), "a Triton cache file")


def _host_code(root: Path, key: str, name: str, limit: int) -> tuple[bytes | None, str | None]:
    """(the launcher's bytes, None) if ``root/key/name`` may be imported as host code, else
    (None, why not).

    Host code is taken only from a folder that nobody else can change: the cache folder and every
    folder above it pass the store's own rules (:func:`~kcache.store.safety.insecure_parent`), the
    cache and key folders are opened once (no link) and checked through their descriptors, and
    the file is read through the key folder's descriptor and judged by what was opened (regular,
    this user's, not writable by others, an ELF object). The bytes checked are the bytes stored:
    nothing is read again by path (a file swapped in after a check by name would be taken)."""
    from ..store.safety import insecure_parent

    why = insecure_parent(str(root / "x"))
    if why:
        return None, f"another user can change {root} ({why})"
    owners = fs.trusted_owners(False)
    try:
        rfd = fs.open_dir(str(root), str(root), owners)
        try:
            kfd = fs.open_dir_at(rfd, key, f"{root}/{key}", owners)
        finally:
            os.close(rfd)
        try:
            fd = os.open(name, fs.O_READ, dir_fd=kfd)
        finally:
            os.close(kfd)
        try:
            st = os.fstat(fd)
            fs.check_stat(st, name, owners, want_dir=False)
            if st.st_size > limit:
                return None, f"larger than {limit} bytes"
            head = os.read(fd, 4)  # what it is, before reading it all (a sparse 1 GiB "launcher")
            if head != b"\x7fELF":
                return None, "not an ELF shared object"
            data = head + fs.read_exact(fd, st.st_size - len(head))
        finally:
            os.close(fd)
    except (OSError, fs.UnsafePath) as e:
        return None, str(e)
    if len(data) != st.st_size:
        return None, "changed while read"
    return data, None


def _too_large(files: dict[str, Path], bound: int) -> str | None:
    """Why the files are too large to import together (sizes from lstat, nothing read), or None."""
    total = 0
    for p in files.values():
        try:
            total += os.lstat(p).st_size
        except OSError as e:
            return str(e)
    if total > bound:
        return f"too large: {total} bytes (at most {bound} per kernel)"
    return None


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _resolve_group(key_dir: Path, grp_file: Path) -> tuple[dict[str, Path] | None, str | None]:
    """The group's members as {name: path inside key_dir}, or (None, why not)."""
    try:
        data = _json(grp_file)
        children = data["child_paths"]
        if not isinstance(children, dict) or not children:
            raise ValueError("no child_paths")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"unreadable group file ({e})"
    files: dict[str, Path] = {}
    for child, old_path in children.items():
        if not isinstance(child, str) or not valid_name(child):
            return None, f"invalid member name {child!r}"
        candidates = [child]
        if isinstance(old_path, str) and os.path.basename(old_path) not in candidates:
            candidates.insert(0, os.path.basename(old_path))
        found = next((key_dir / c for c in candidates if valid_name(c) and _regular(key_dir / c)), None)
        if found is None:
            return None, f"incomplete: member {child} is missing"
        files[child] = found
    return files, None


def _metadata(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        meta = _json(path)
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


def _components(name: str, meta: dict[str, Any]) -> dict[str, Any]:
    comps: dict[str, Any] = {"kernel": name.split(".")[0], "source": "triton-cache-import"}
    if meta.get("triton_version"):
        comps["triton_version"] = str(meta["triton_version"])
    target = meta.get("target")
    if isinstance(target, dict):
        comps["target"] = f"{target.get('backend')}:{target.get('arch')}"
    for k in ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "debug", "arch"):
        v = meta.get(k)
        if isinstance(v, (int, float, str, bool)):
            comps[f"option.{k}"] = v
    return comps


def _this_gpu() -> str | None:
    from ..fingerprint import device_name

    try:
        return device_name(0)
    except (TypeError, ValueError, OSError, AttributeError):  # ctypes' errors: no GPU to tell
        return None


def import_triton_cache(
    store: Store,
    directory: str | os.PathLike[str],
    *,
    autotune_gpu: str | None = None,
) -> dict[str, Any]:
    """Import the Triton cache folder ``directory`` into ``store`` (a writable :class:`Store`).

    Returns a report: counts (``kernels``, ``kernels_present``, ``aux``, ``autotune``,
    ``other_triton``: kernels built by another Triton than this one, ``ignored_files``) and
    ``skipped``: ``[{"path", "why"}]``. Raises ``OSError`` if the folder cannot be read."""
    root = Path(directory).expanduser().absolute()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    if autotune_gpu == "this":
        autotune_gpu = _this_gpu()
        if not autotune_gpu:
            raise OSError("no GPU found here to vouch for autotune results (autotune_gpu='this')")
    try:
        import triton

        this_triton: str | None = triton.__version__
    except (ImportError, AttributeError):  # no Triton here (or one without a version)
        this_triton = None
    report: dict[str, Any] = {
        "source": str(root),
        "kernels": 0,
        "kernels_present": 0,
        "aux": 0,
        "autotune": 0,
        "other_triton": 0,
        "ignored_files": 0,
        "skipped": [],
    }
    skipped: list[dict[str, str]] = report["skipped"]

    def skip(path: Path, why: str) -> None:
        skipped.append({"path": str(path), "why": why})

    bound = min(MAX_GROUP, store.max_size)

    def put(
        kind: str,
        skey: str,
        files: dict[str, Path],
        comps: dict[str, Any],
        summary: dict[str, Any],
        blobs: dict[str, bytes] | None = None,
    ) -> bool | None:
        """True when stored, False when already there, None when skipped (said in the report).
        ``blobs``: bytes already read and checked (host code), stored as they are."""
        if store.get(kind, skey, count=False) is not None:
            return False
        where = next(iter(files.values()))
        why = _too_large(files, bound)
        if why is not None:
            skip(where, why)
            return None
        # Bytes, not paths: the store would hard-link a path, sharing the inode (and its mode)
        # with a file in a folder kcache does not control.
        try:
            if blobs is None:
                blobs = {n: _read(p, min(MAX_FILE, bound)) for n, p in files.items()}
        except OSError as e:  # changed since it was listed (now a FIFO, a link, larger): skipped
            skip(where, str(e))
            return None
        hit = store.put(kind, skey, blobs, components=comps, summary=summary)
        if hit is None:
            raise OSError(f"could not write to the store at {store.root}")
        return True

    for key_dir in sorted(root.iterdir()):
        if not _KEY_RE.fullmatch(key_dir.name) or not key_dir.is_dir() or key_dir.is_symlink():
            if not key_dir.name.startswith("."):
                skip(key_dir, "not a Triton cache key folder")
            continue
        key = key_dir.name
        try:
            names = sorted(p.name for p in key_dir.iterdir())
        except OSError as e:
            skip(key_dir, str(e))
            continue
        used: set[str] = set()
        for grp in (n for n in names if n.startswith(_GRP) and n.endswith(".json")):
            used.add(grp)
            name = grp[len(_GRP) :]
            files, why = _resolve_group(key_dir, key_dir / grp)
            if files is None:
                skip(key_dir / grp, why or "unusable group")
                continue
            if name not in files:
                skip(key_dir / grp, f"the group has no {name} (Triton's metadata file)")
                continue
            used.update(p.name for p in files.values())
            meta = _metadata(files.get(name))
            comps = _components(name, meta)
            summary = {"file": name, "name": meta.get("name"), "imported_from": str(key_dir)}
            if comps.get("target"):
                summary["target"] = comps["target"]
            if comps.get("triton_version"):
                summary["triton_version"] = comps["triton_version"]
            if this_triton and comps.get("triton_version") not in (None, this_triton):
                report["other_triton"] += 1
            done = put(KIND_GROUP, store_key(key, name), files, comps, summary)
            if done:
                report["kernels"] += 1
            elif done is False:
                report["kernels_present"] += 1
        for n in names:
            if n in used:
                continue
            path = key_dir / n
            kind = kind_of(n)
            if kind is None or not _regular(path) or not valid_name(n):
                report["ignored_files"] += 1
                continue
            if kind == KIND_AUX:
                so, why = _host_code(root, key, n, min(MAX_FILE, bound))
                if so is None:
                    skip(path, f"host code not trusted ({why}); Triton rebuilds it when needed")
                    continue
                comps = {"kernel": n.split(".")[0], "source": "triton-cache-import"}
                if put(KIND_AUX, store_key(key, n), {n: path}, comps, {"file": n}, blobs={n: so}):
                    report["aux"] += 1
            elif kind == KIND_AUTOTUNE:
                if not autotune_gpu:
                    skip(
                        path,
                        "autotune timings from an unknown GPU model: never served, so not imported "
                        "(vouch for the model with autotune_gpu)",
                    )
                    continue
                try:
                    data = _json(path)
                    if not isinstance(data, dict) or "configs_timings" not in data:
                        raise ValueError("no configs_timings")
                except (OSError, ValueError) as e:
                    skip(path, f"unreadable autotune file ({e})")
                    continue
                comps = {"kernel": n.split(".")[0], "gpu_name": autotune_gpu, "source": "triton-cache-import"}
                summary = {"file": n, "gpu_name": autotune_gpu}
                if put(KIND_AUTOTUNE, store_key(key, n, autotune_gpu), {n: path}, comps, summary):
                    report["autotune"] += 1
    return report
