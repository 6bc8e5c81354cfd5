"""The strings a pickle holds, read from its opcodes without the :mod:`pickle` module.

kcache never unpickles (a pickle is code: loading one runs what it names), and it does not import
:mod:`pickle` or :mod:`pickletools` either, so that no code path of kcache's can reach a loader.
What :mod:`.graphs` needs of an AOTAutograd entry is the strings its pickle holds (the class
names and the FX graph keys it names), so this walks the opcodes of protocols 0-5 as the pickle
format defines them (``Lib/pickletools.py`` documents each one) and collects the arguments of the
unicode opcodes. Nothing is built; an opcode this table does not know, or a pickle that ends
before its ``STOP``, is :class:`PickleFormatError`.
"""

from __future__ import annotations

import struct


class PickleFormatError(ValueError):
    """The bytes are not a pickle of protocol 0-5 (truncated, or an unknown opcode)."""


# Opcodes by how their argument is laid out.
_NO_ARG = frozenset(b"(.012N\x88\x89]aelt)\x85\x86\x87}dsu\x8f\x90\x91Rb\x81\x92\x93\x94oQ\x97\x98")
_FIXED = {  # opcode -> bytes of its argument
    **dict.fromkeys(b"Kqh\x82\x80", 1),  # BININT1 BINPUT BINGET EXT1 PROTO
    **dict.fromkeys(b"M\x83", 2),  # BININT2 EXT2
    **dict.fromkeys(b"Jrj\x84", 4),  # BININT LONG_BINPUT LONG_BINGET EXT4
    **dict.fromkeys(b"\x95G", 8),  # FRAME BINFLOAT
}
_SIZED = {  # opcode -> (struct format of its length, is it a unicode string)
    0x8A: ("<B", False),  # LONG1
    0x8B: ("<i", False),  # LONG4
    ord("U"): ("<B", False),  # SHORT_BINSTRING
    ord("T"): ("<i", False),  # BINSTRING
    ord("C"): ("<B", False),  # SHORT_BINBYTES
    ord("B"): ("<I", False),  # BINBYTES
    0x8E: ("<Q", False),  # BINBYTES8
    0x96: ("<Q", False),  # BYTEARRAY8
    0x8C: ("<B", True),  # SHORT_BINUNICODE
    ord("X"): ("<I", True),  # BINUNICODE
    0x8D: ("<Q", True),  # BINUNICODE8
}
_LINES = {  # opcode -> newline-terminated lines of its argument
    **dict.fromkeys(b"ILFSpgP", 1),  # INT LONG FLOAT STRING PUT GET PERSID
    **dict.fromkeys(b"ci", 2),  # GLOBAL INST
}
_UNICODE_LINE = ord("V")  # UNICODE: one raw-unicode-escape line


def unicode_strings(data: bytes) -> list[str]:
    """The arguments of every unicode opcode of the pickle ``data``, in order (what
    ``pickletools.genops`` yields for ``SHORT_BINUNICODE``, ``BINUNICODE``, ``BINUNICODE8`` and
    ``UNICODE``), up to its ``STOP``."""
    out: list[str] = []
    pos, end = 0, len(data)
    while pos < end:
        op = data[pos]
        pos += 1
        if op == 0x2E:  # STOP
            return out
        if op in _NO_ARG:
            continue
        n = _FIXED.get(op)
        if n is not None:
            pos += n
        elif op in _SIZED:
            fmt, text = _SIZED[op]
            width = struct.calcsize(fmt)
            if pos + width > end:
                break
            (size,) = struct.unpack_from(fmt, data, pos)
            pos += width
            if size < 0 or pos + size > end:
                raise PickleFormatError(f"a length of {size} at byte {pos - width}")
            if text:
                try:
                    out.append(data[pos : pos + size].decode("utf-8", "surrogatepass"))
                except UnicodeDecodeError as e:
                    raise PickleFormatError(f"a unicode string that is not UTF-8: {e}") from None
            pos += size
        elif op in _LINES or op == _UNICODE_LINE:
            for _ in range(_LINES.get(op, 1)):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    raise PickleFormatError(f"an unterminated line at byte {pos}")
                if op == _UNICODE_LINE:
                    out.append(data[pos:nl].decode("raw-unicode-escape"))
                pos = nl + 1
        else:
            raise PickleFormatError(f"opcode {op:#04x} at byte {pos - 1}")
    raise PickleFormatError("no STOP opcode: the pickle is cut short")
