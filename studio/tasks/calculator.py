"""The calculator tool of the sample agent world: integer arithmetic read with ``ast``, never ``eval``.

An expression is integers joined by ``+ - * /`` with parentheses and signs; anything else (a
name, an attribute, a call, a float, a power) is refused with a message the policy reads in its
tool response::

    >>> calculator("37*24"), calculator("(888 - 129) / 3"), calculator("-5+2")
    (888, 253, -3)
    >>> calculator("7/2")
    Traceback (most recent call last):
    ...
    ValueError: 7/2 is not a whole number (the calculator divides exactly)
    >>> calculator("__import__('os')")
    Traceback (most recent call last):
    ...
    ValueError: the calculator cannot call functions: it knows integers and + - * / ( ) only

A top-level function (a sandbox process imports it by name).
"""
from __future__ import annotations

import ast

MAX_CHARS = 200  # a longer expression is refused before it is parsed
MAX_DIGITS = 40  # a result (or an intermediate one) longer than this is refused
_ONLY = "it knows integers and + - * / ( ) only"


def calculator(expression: str) -> int:
    """The exact integer value of ``expression``; ``ValueError`` says what it cannot compute."""
    if not isinstance(expression, str):
        raise ValueError(f"the expression must be text, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise ValueError("an empty expression")
    if len(text) > MAX_CHARS:
        raise ValueError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {text!r} as arithmetic: {_ONLY}") from None
    return _value(tree.body, text)


def _value(node: ast.AST, text: str) -> int:
    """The value of one node of the expression's tree (the recursion of :func:`calculator`)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise ValueError(f"{node.value!r} is not an integer: {_ONLY}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _value(node.operand, text)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _value(node.left, text), _value(node.right, text)
        if isinstance(node.op, ast.Add):
            return _checked(a + b)
        if isinstance(node.op, ast.Sub):
            return _checked(a - b)
        if isinstance(node.op, ast.Mult):
            return _checked(a * b)
        if b == 0:
            raise ValueError(f"division by zero in {text}")
        if a % b:
            raise ValueError(f"{text} is not a whole number (the calculator divides exactly)")
        return a // b
    if isinstance(node, ast.Name):
        raise ValueError(f"unknown name {node.id!r}: {_ONLY}")
    if isinstance(node, ast.Call):
        raise ValueError(f"the calculator cannot call functions: {_ONLY}")
    if isinstance(node, ast.Attribute):
        raise ValueError(f"the calculator reads no attributes: {_ONLY}")
    if isinstance(node, ast.BinOp):
        raise ValueError(f"unsupported operator {type(node.op).__name__} in {text!r}: {_ONLY}")
    raise ValueError(f"cannot compute {text!r}: {_ONLY}")


def _checked(v: int) -> int:
    if len(str(abs(v))) > MAX_DIGITS:
        raise ValueError(f"a number longer than {MAX_DIGITS} digits")
    return v
