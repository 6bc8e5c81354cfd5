"""A spec's TOML as the ``KCACHE_RECORD`` recorder writes it (:mod:`.record`): one
``[[triton]]`` table per kernel (:func:`entry_toml`), comments (:func:`toml_comment`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: A lone surrogate (U+D800-U+DFFF): no TOML string can hold one (see :func:`toml_ready`).
SURROGATE = re.compile("[\ud800-\udfff]")

# tomli_w writes the TOML (values, keys, string escapes); what is here is what it does not do for
# the recorder: values are made plain first (tomli_w writes str(v): an Enum mixed with int, a
# float subclass or IntEnum on Python 3.10 would not read back), a lone surrogate is refused with
# its reason (tomli_w writes it, and the file could not be UTF-8), non-printable characters are
# escaped (tomli_w escapes only ASCII control characters), and comments (tomli_w writes none).
# Every value written reads back equal with tomllib (tests/test_prewarm_spec.py checks it on
# generated text, keys and nested values).


def toml_ready(v: Any) -> Any:
    """``v`` with plain types only, as TOML holds it: booleans, integers, floats, strings, lists
    (from lists and tuples) and dicts with string keys (from mappings). An int or float subclass
    (IntEnum, numpy's float64) becomes its value, a str subclass a str. Raises TypeError for
    anything else, ValueError for a string TOML cannot hold (a lone surrogate, U+D800-U+DFFF, e.g.
    an undecodable byte of a file name or an environment variable under ``surrogateescape``: not a
    Unicode scalar value, so no TOML string holds it, and writing another would change it)."""
    if isinstance(v, bool):
        return v  # bool cannot be subclassed
    if isinstance(v, int):
        return int.__int__(v)  # the value itself, whatever a subclass's __int__ or __str__ says
    if isinstance(v, float):
        return float.__float__(v)
    if isinstance(v, str):
        bad = SURROGATE.search(v)
        if bad is not None:
            raise ValueError(f"{surrogate_text(bad.group())}, which TOML cannot hold")
        return str.__str__(v)
    if isinstance(v, (list, tuple)):
        return [toml_ready(x) for x in v]
    if isinstance(v, Mapping):
        out: dict[str, Any] = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"cannot write a {type(k).__name__} key to TOML")
            out[toml_ready(k)] = toml_ready(x)
        return out
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def toml_text(table: Mapping[str, Any]) -> str:
    """``table`` as a TOML document (tomli_w) that tomllib reads back equal, printable but for its
    line ends. Raises as :func:`toml_ready`."""
    import tomli_w  # only when a spec is written, not in every process that imports triton

    return _visible(tomli_w.dumps(toml_ready(table)))


def toml_comment(text: str) -> str:
    """``text`` as comment lines (``# ...``). A comment may hold no control character but tab and
    no lone surrogate (the file is UTF-8): every non-printable character is written as an escape
    (``\\u000b``), which is only text in a comment."""
    lines = text.split("\n")  # only "\n" ends a line: "\r", "\x0b"... are escaped like the rest
    return "\n".join("# " + _visible(line) for line in lines)


def _visible(text: str) -> str:
    """Every non-printable character but "\\n" of ``text`` as a ``\\uXXXX`` escape. In tomli_w's
    output (no multi-line strings) such a character can only be inside a basic string, where the
    escape stands for the same character, and "\\n" only ends a line (inside a string it is
    ``\\n``); in a comment the escape is text."""
    if text.replace("\n", "").isprintable():
        return text  # the common case: nothing to escape
    return "".join(c if c.isprintable() or c == "\n" else _escape(c) for c in text)


def surrogate_text(ch: str) -> str:
    return f"a string with a lone surrogate (U+{ord(ch):04X}: an undecodable byte?)"


def _escape(ch: str) -> str:
    o = ord(ch)
    return f"\\u{o:04X}" if o <= 0xFFFF else f"\\U{o:08X}"


def entry_toml(entry: Mapping[str, Any], comment: str | None = None) -> str:
    """One ``[[triton]]`` table: kernel, grid, then the tables options, env and args (tensors as
    their own tables, ``[triton.args.x_ptr]``). Raises as :func:`toml_ready`."""
    if not isinstance(entry["kernel"], str):
        raise TypeError(f"the kernel is a {type(entry['kernel']).__name__}, not a module:name")
    table: dict[str, Any] = {"kernel": entry["kernel"]}
    table.update((k, entry[k]) for k in ("grid", "options", "env") if entry.get(k))
    table["args"] = entry["args"]
    # tomli_w heads the table "[triton]" (its first key, kernel, is a string); in the file the
    # entry is one more element of the array of tables: "[[triton]]", and the sub-tables after it
    # ([triton.args] ...) belong to that element.
    body = toml_text({"triton": table})
    head = "[triton]\n"
    if not body.startswith(head):
        raise ValueError(f"tomli_w began the entry with {body[:40]!r}, not {head!r}")
    text = "[[triton]]\n" + body[len(head) :]
    return (toml_comment(comment) + "\n" + text) if comment else text
