"""Pointing nvFuser at a folder through its exported ``KernelDb::get`` (``direct`` mode).

nvFuser exports ``nvfuser::KernelDb::get(dir, file, use_temp_dir, disabled, reset)`` (``NVF_API``,
a testing entry point). Called once through ctypes with ``use_temp_dir=false`` and the private
folder, it opens the KernelDb there for the rest of the process, and nothing in the environment
changes: ``TMPDIR`` and ``tempfile.gettempdir()`` stay what they were, for this process and its
children. The libstdc++ ``std::string`` arguments are built by hand (the callee takes them by const
reference and only reads them); the symbol is looked up by its exact mangled name (C++11 ABI), so
another ABI or a build without it raises ``AttributeError`` and the caller falls back to ``tmpdir``
(:meth:`.session.Session.point`).
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Any

from .folder import DB_FILE

GET_SYMBOL = "_ZN7nvfuser8KernelDb3getERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES8_bbb"


class StdString(ctypes.Structure):
    """libstdc++'s std::string (C++11 ABI): data pointer, length, then capacity or local buffer.
    Only read by the callee (taken by const reference), which uses the pointer and length."""

    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t), ("local", ctypes.c_char * 16)]


def std_string(b: bytes) -> tuple[StdString, Any]:
    """A :class:`StdString` over ``b``, and the buffer it points into (keep it alive for the call)."""
    buf = ctypes.create_string_buffer(b)
    s = StdString()
    s.ptr = ctypes.addressof(buf)
    s.size = len(b)
    s.local = struct.pack("<Q", len(b)) + b"\0" * 8  # the capacity of a heap string
    return s, buf


class DirectKernelDb:
    """nvFuser's KernelDb singleton, opened on a folder of ours through its exported ``get``."""

    def __init__(self, lib_path: str) -> None:
        mode = getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1)
        self.lib = ctypes.CDLL(lib_path, mode=mode)  # already loaded by nvFuser: no new load
        fn = getattr(self.lib, GET_SYMBOL)  # AttributeError when not exported (or another ABI)
        fn.argtypes = [
            ctypes.POINTER(StdString),
            ctypes.POINTER(StdString),
            ctypes.c_bool,
            ctypes.c_bool,
            ctypes.c_bool,
        ]
        fn.restype = ctypes.c_void_p
        self._get = fn
        self.address: int | None = None

    def open(self, db_dir: str) -> bool:
        """Open the KernelDb on ``db_dir`` (absolute). True when nvFuser reports it open."""
        d, dkeep = std_string(os.fspath(db_dir).encode())
        f, fkeep = std_string(DB_FILE.encode())
        addr = self._get(ctypes.byref(d), ctypes.byref(f), False, False, True)
        del dkeep, fkeep
        if not addr:
            return False
        self.address = addr
        st = self.state()
        return st["initialized"] is True and st["disabled"] is False

    def state(self) -> dict[str, Any]:
        """The singleton's flags and kernel count, read from its memory (diagnostics).

        Layout: ``bool disabled_; bool initialized_;`` then the ``unordered_map``, whose element
        count is its fourth word (libstdc++)."""
        if not self.address:
            return {"initialized": None, "disabled": None, "entries": None}
        a = self.address
        n = ctypes.c_size_t.from_address(a + 8 + 24).value
        return {
            "disabled": bool(ctypes.c_uint8.from_address(a).value),
            "initialized": bool(ctypes.c_uint8.from_address(a + 1).value),
            "entries": n if n < 1 << 32 else None,
        }
