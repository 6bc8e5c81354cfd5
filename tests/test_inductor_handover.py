"""The hand-over of a kept FX graph (kcache/inductor/handover.py) on each shape of torch's
``FxGraphCache.iterate_over_candidates``: torch 2.8-2.10 yield ``(graph, content)``, torch 2.11
and later ``(graph, content, found_locally)``. Session 23's hand-over unpacked three and, on
torch 2.10, failed every served compile (``BackendCompilerFailed: ValueError: not enough values
to unpack``, seen with tests/test_inductor_served.py in a torch 2.10 environment).

CI's torch is 2.13, so the wrapper is handed a module shaped as each torch's ``codecache``: a
``GuardedCache`` whose candidates come from the key's local folder, read as torch reads it
(``sorted(os.listdir)``, each file's bytes; the bytes stand for the graph: nothing is unpickled
here), and an ``FxGraphCache`` naming that folder. The store is a real one holding the graph.
"""

from __future__ import annotations

import base64
import json
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kcache
from kcache import inductor
from kcache.inductor import handover
from kcache.inductor.declare import INDUCTOR_FX
from kcache.inductor.graphs import fx_remote_key

KEY = "f" + "a" * 51  # the form of torch's FX key (``f`` and 51 base32 digits)
PICKLE = b"\x80\x05the kept graph's pickle."


def codecache_like(tmp: Path, found_locally: bool) -> types.ModuleType:
    """A module as torch's ``codecache``: 2.8-2.10's candidates (``found_locally`` False) or
    2.11's (True: a third item, whether the candidate came from the local folder)."""

    class GuardedCache:
        @classmethod
        def _get_tmp_dir_for_key(cls, _key: str) -> str:
            raise NotImplementedError

        @classmethod
        def iterate_over_candidates(
            cls, local: bool, remote_cache: Any, key: str
        ) -> Iterator[tuple[Any, ...]]:
            if local:
                subdir = cls._get_tmp_dir_for_key(key)
                if os.path.exists(subdir):
                    for path in sorted(os.listdir(subdir)):
                        with open(os.path.join(subdir, path), "rb") as f:
                            content = f.read()
                        yield (content, content, True) if found_locally else (content, content)
            if remote_cache:
                raise AssertionError("kcache's store is not asked through the envelope here")

    class FxGraphCache(GuardedCache):
        @classmethod
        def _get_tmp_dir_for_key(cls, key: str) -> str:
            return str(tmp / "inductor" / "fxgraph" / key[1:3] / key)

    mod = types.ModuleType("codecache_like")
    mod.FxGraphCache = FxGraphCache  # type: ignore[attr-defined]
    return mod


class Backend:
    kcache_kind = INDUCTOR_FX  # kcache's backend of torch's FX remote cache


class RemoteCache:
    backend = Backend()


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[Path]:
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False, torch=False)
    envelope = {"data": base64.b64encode(PICKLE).decode(), "time_taken_ms": 5}
    inductor.put(INDUCTOR_FX, fx_remote_key(KEY), json.dumps(envelope).encode())
    yield tmp_path
    kcache.disable()


@pytest.mark.parametrize("found_locally", [False, True], ids=["torch 2.8-2.10", "torch 2.11+"])
def test_a_kept_graph_comes_in_the_shape_torch_reads(kept: Path, found_locally: bool) -> None:
    mod = codecache_like(kept, found_locally)
    handover.on_import(mod)
    got = list(mod.FxGraphCache.iterate_over_candidates(True, RemoteCache(), KEY))
    # the graph from kcache's store, read by torch's own code from the stage, counted as remote
    assert got == ([(PICKLE, PICKLE, False)] if found_locally else [(PICKLE, PICKLE)])
    # torch's find_guarded_entry unpacks each candidate so (2.10: two; 2.11: three)
    for candidate in mod.FxGraphCache.iterate_over_candidates(True, RemoteCache(), KEY):
        graph, content, *rest = candidate
        assert len(rest) == (1 if found_locally else 0)


def test_inductors_own_folder_comes_first_as_it_is(kept: Path) -> None:
    mod = codecache_like(kept, found_locally=False)
    own = Path(mod.FxGraphCache._get_tmp_dir_for_key(KEY))
    own.mkdir(parents=True)
    (own / "entry").write_bytes(b"Inductor's own")
    handover.on_import(mod)
    got = list(mod.FxGraphCache.iterate_over_candidates(True, RemoteCache(), KEY))
    assert got == [(b"Inductor's own", b"Inductor's own"), (PICKLE, PICKLE)]
