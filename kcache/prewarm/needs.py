"""What a prewarm needs installed besides kcache, checked before anything is compiled.

Every kind of item needs torch: Triton kernels get their tensor arguments as torch tensors
(``device="meta"`` with ``--target``), nvFuser fusions, callables and torch.compile models run on
torch tensors. kcache itself does not depend on torch, so a machine set up with ``pip install
kcache`` alone has none, and a plain ``pip install torch`` there brings a CUDA build (gigabytes of
nvidia wheels) that pins its own Triton, replacing the one installed. PyTorch's CPU builds
(``--index-url https://download.pytorch.org/whl/cpu``) require no Triton at all.
"""

from __future__ import annotations

import importlib.util
from typing import Any

CPU_INDEX = "https://download.pytorch.org/whl/cpu"

#: The Triton that PyPI's (CUDA) torch wheels pin, by torch release: read from each release's
#: metadata (``Requires-Dist: triton==...``).
TORCH_PINS_TRITON = {
    "2.8": "3.4.0",
    "2.9": "3.5.0",
    "2.10": "3.6.0",
    "2.11": "3.6.0",
    "2.12": "3.7.0",
    "2.13": "3.7.1",
    "2.14": "3.8",
}


def torch_for_triton(triton_version: str | None) -> str | None:
    """The newest torch release whose PyPI wheels pin ``triton_version``'s minor release."""
    if not triton_version:
        return None
    minor = ".".join(triton_version.split("+")[0].split(".")[:2])
    found = [t for t, tr in TORCH_PINS_TRITON.items() if ".".join(tr.split(".")[:2]) == minor]
    return max(found, key=lambda v: tuple(int(x) for x in v.split("."))) if found else None


def torch_advice(triton_version: str | None) -> str:
    """How to install torch without replacing ``triton_version`` (one clause, for a message)."""
    keep = f"Triton {triton_version}" if triton_version else "the installed Triton"
    text = f"a CPU build needs no GPU wheels and leaves {keep} as it is: pip install torch --index-url {CPU_INDEX}"
    pin = torch_for_triton(triton_version)
    if pin:
        text += f" (on a GPU machine, torch=={pin}.* is the CUDA build that pins Triton {triton_version})"
    return text


def has_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def missing(spec: Any) -> str | None:
    """One line naming the first entry that cannot be prepared here for want of torch, and how
    to get it; None when nothing is missing."""
    if not spec.entries or has_torch():
        return None
    from ..fingerprint import current

    e = spec.entries[0]
    what = {
        "triton": "its tensor arguments are made as torch tensors",
        "nvfuser": "nvFuser runs on torch tensors",
        "torch": "it is a torch.compile model",
    }.get(e.kind, "it is called with torch tensors")
    others = f" (and {len(spec.entries) - 1} more entries)" if len(spec.entries) > 1 else ""
    return f"{spec.source}: {e.label}{others} needs torch ({what}), which is not installed; " + torch_advice(
        current("triton_version")
    )
