"""The tool of the tool-arithmetic recipe: a calculator the model calls as
``calculator(expression="347 * 86")``."""

from __future__ import annotations

import ast
import operator

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_MAX_DIGITS = 30
"""Results (and numbers) longer than this are refused: no expression can make the tool slow."""


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):  # True and False are ints to Python, not to a calculator
            raise ValueError("only numbers, + - * / and parentheses are allowed")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        result: int | float = _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
        if len(str(abs(int(result)))) > _MAX_DIGITS:
            raise ValueError(f"the result has more than {_MAX_DIGITS} digits")
        return result
    raise ValueError("only numbers, + - * / and parentheses are allowed")


def calculator(expression: str) -> str:
    """Work out an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / and parentheses, such as "347 * 86".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {expression!r} as arithmetic") from None
    result = _value(tree.body)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)
