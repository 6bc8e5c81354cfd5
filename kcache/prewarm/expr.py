"""The safe expression language of prewarm specs: ``"=cdiv(N, BLOCK) * 2"``.

A spec is data, and evaluating it must take microseconds whatever it says: numbers, the
``sizes`` symbols, ``+ - * / // % **``, unary ``-``/``+`` and the functions of :data:`FUNCS`;
no attribute access, no other call, no strings or sequences; every value within +-2**64, at
most :data:`MAX_EXPR_LEN` characters and :data:`MAX_EXPR_DEPTH` levels of nesting.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Expr:
    """An integer (or float) expression over the ``sizes`` symbols, e.g. ``cdiv(N, 128) * 2``."""

    text: str

    def eval(self, names: Mapping[str, Any]) -> Any:
        return eval_expr(self.text, names)


def cdiv(a: Any, b: Any) -> Any:
    return -(-a // b)


def next_power_of_2(n: Any) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


FUNCS: dict[str, Any] = {
    "cdiv": cdiv,
    "min": min,
    "max": max,
    "abs": abs,
    "next_power_of_2": next_power_of_2,
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Div: lambda a, b: a / b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,  # not called: eval_expr's power() checks the size first
}
_OP_TEXT = {
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}

# Limits of expressions: a spec is data, and evaluating it must take microseconds whatever it
# says. Python's integers are unbounded: 9**9**9 alone would compute for hours and take 1 GB.
#: Every value, operand or result, constant or symbol: |value| <= 2**64 (a float also finite).
#: Sizes, strides and grids are far below; 2**64 leaves room for any 64-bit argument.
MAX_VALUE = 2**64
#: Characters of an expression (the parser itself runs out of stack on very long ones).
MAX_EXPR_LEN = 1000
#: Nesting of an expression's operations (``1+1+...+1`` nests once per ``+``).
MAX_EXPR_DEPTH = 64


class ExprSyntaxError(ValueError):
    """An expression that is wrong whatever the values of its symbols: not an expression, a
    construct the evaluator does not know, too long or nested too deeply."""


def _quoted(text: str) -> str:
    """An expression as error messages name it: quoted, and shortened (the limit is 1000)."""
    text = text.strip()
    return repr(text) if len(text) <= 80 else repr(text[:60]) + f"... ({len(text)} characters)"


def parse_expr(text: str) -> ast.Expression:
    """Parse an expression, within :data:`MAX_EXPR_LEN` and :data:`MAX_EXPR_DEPTH`. Raises
    :class:`ExprSyntaxError`."""
    body = text.strip()
    if len(body) > MAX_EXPR_LEN:
        raise ExprSyntaxError(f"expression too long (at most {MAX_EXPR_LEN} characters): {_quoted(text)}")
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as e:
        raise ExprSyntaxError(f"not an expression: {_quoted(text)} ({e.msg})") from None
    except (RecursionError, MemoryError):  # the parser's own stack; not reached within the length
        raise ExprSyntaxError(f"expression nested too deeply: {_quoted(text)}") from None
    # Depth first, without recursion: the evaluator recurses, and must not meet Python's limit.
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_EXPR_DEPTH:
            raise ExprSyntaxError(
                f"expression nested too deeply (more than {MAX_EXPR_DEPTH} levels): {_quoted(text)}"
            )
        stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
    return tree


def eval_expr(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate a small arithmetic expression safely: numbers, the names in ``names`` (numbers),
    ``+ - * / // % **``, unary ``-``/``+`` and the functions of ``FUNCS``; no attribute access, no
    other call, no strings or sequences. Bounded (:data:`MAX_VALUE`, :data:`MAX_EXPR_LEN`,
    :data:`MAX_EXPR_DEPTH`): a power is refused before it is computed when its result would be
    beyond the limit. Raises ValueError (:class:`ExprSyntaxError` when no values can help) with a
    message that names the expression."""
    tree = parse_expr(text)
    body, q = text.strip(), _quoted(text)

    def seg(node: ast.AST) -> str:  # the part of the expression that went wrong, as written
        part = ast.get_source_segment(body, node) or ast.unparse(node)
        return part if len(part) <= 60 else part[:57] + "..."

    def bounded(v: Any, node: ast.AST) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            # (-8) ** 0.5 is a complex number
            raise ValueError(f"{seg(node)} is not a real number in {q}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{seg(node)} is not finite in {q}")
        if abs(v) > MAX_VALUE:
            raise ValueError(f"{seg(node)} is beyond the limit of 2**64 in {q}")
        return v

    def power(a: Any, b: Any, node: ast.AST) -> Any:
        # |a| >= 2 and b > 64 is at least 2**65: refused before Python computes it. Below that,
        # a bounded base to at most the 64th power is a few thousand bits: computed, then checked.
        if isinstance(a, int) and isinstance(b, int) and b > 64 and abs(a) >= 2:
            raise ValueError(f"{seg(node)} is beyond the limit of 2**64 (an exponent of {b}) in {q}")
        return a**b

    def ev(node: ast.AST) -> Any:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            return bounded(node.value, node)
        if isinstance(node, ast.Name):
            if node.id in names:
                v = names[node.id]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ValueError(f"{node.id} is not a number in {q}")
                return bounded(v, node)
            raise ValueError(f"unknown name {node.id!r} in {q} (known: {', '.join(sorted(names)) or 'none'})")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                return bounded(power(a, b, node), node)
            return bounded(_BINOPS[type(node.op)](a, b), node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FUNCS
            and not node.keywords
        ):
            return bounded(FUNCS[node.func.id](*[ev(a) for a in node.args]), node)
        if isinstance(node, (ast.BinOp, ast.UnaryOp)) and type(node.op) in _OP_TEXT:
            raise ExprSyntaxError(
                f"unsupported operator {_OP_TEXT[type(node.op)]} in {q} (operators: + - * / // % **)"
            )
        raise ExprSyntaxError(f"unsupported syntax in {q}: {ast.dump(node)[:60]}")

    try:
        return ev(tree.body)
    except ZeroDivisionError:
        raise ValueError(f"division by zero in {q}") from None
    except OverflowError:  # float arithmetic: 10.0 ** 400
        raise ValueError(f"a value beyond the limit of 2**64 in {q}") from None
    except TypeError as e:  # a function's arguments: min(), cdiv(1)
        raise ValueError(f"{e} in {q}") from None
