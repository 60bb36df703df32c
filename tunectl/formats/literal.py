"""Literals read from text without evaluating it: what a FlexAttention log key or shape text may hold.

The text is parsed by Python's own parser (``ast.parse(..., mode="eval")``) and read node by node
through a whitelist (integers, plain strings, None/True/False, names as symbols, tuples, lists).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Union


class LiteralError(ValueError):
    """Text outside the literals a log key may hold."""


@dataclass(frozen=True)
class Symbol:
    """A size Inductor printed as a symbol, as it does for a dynamic dimension: ``s37``."""

    name: str


Parsed = Union[None, bool, int, str, Symbol, tuple["Parsed", ...]]  # noqa: UP007 (recursive)

_MAX_LITERAL_CHARS = 10_000  # a log key is a few dozen characters; a deeper text is not one
_PLAIN_STRING = re.compile(r"'[^'\\\n]*'|\"[^\"\\\n]*\"")


def _refuse(text: str, node: ast.AST, indent: int) -> LiteralError:
    col = getattr(node, "col_offset", 0) + indent
    shown = ast.get_source_segment(text, node) or type(node).__name__
    return LiteralError(f"unexpected {shown[:24]!r} at column {col + 1}")


def _literal(text: str, node: ast.expr, indent: int) -> Parsed:
    """The value of one whitelisted node: constants, names (symbols), negative integers, tuples, lists."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(text, n, indent) for n in node.elts)
    if isinstance(node, ast.Name):  # None, True and False are constants to the parser, not names
        return Symbol(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(text, node.operand, indent)
        if isinstance(value, int) and not isinstance(value, bool) and isinstance(node.operand, ast.Constant):
            return -value
        raise _refuse(text, node, indent)
    if isinstance(node, ast.Constant):
        constant = node.value
        if constant is None or isinstance(constant, (bool, int)):
            return constant
        segment = ast.get_source_segment(text, node) or ""
        # One plainly quoted string: no escapes, prefixes or implicit concatenation ('a' 'b').
        if isinstance(constant, str) and _PLAIN_STRING.fullmatch(segment):
            return constant
    raise _refuse(text, node, indent)


def parse_literal(text: str) -> Parsed:
    """One literal: an integer, a quoted string, None/True/False, a symbol, or a tuple or list of those.

    The text is parsed by Python's own parser as an expression and read node by node through a
    whitelist; it is never evaluated. Lists come back as tuples. Anything else (an operator, a call,
    an attribute, a float, an escape in a string) raises LiteralError.
    """
    if len(text) > _MAX_LITERAL_CHARS:
        raise LiteralError(f"{len(text)} characters is too long for a key")
    body = text.strip()
    indent = len(text) - len(text.lstrip())  # the parser refuses leading blanks; columns count them
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as exc:
        col = f" at column {exc.offset + indent}" if exc.offset else ""
        raise LiteralError(f"not a literal{col}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        raise LiteralError(f"not a literal: {type(exc).__name__}") from None
    return _literal(body, tree.body, indent)
