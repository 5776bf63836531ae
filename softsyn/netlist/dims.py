"""Symbolic dim expressions: the exporter's dim names ("past + seq", "2*seq", "Max(1, seq)") evaluated safely.

Expressions are parsed once with :mod:`ast` (cached per string) and evaluated over a small whitelist of
arithmetic operators and sympy-style functions; anything else counts as "cannot be evaluated" (None), never
as an error, because an unevaluable dim is left for shape inference to fill.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any


class _Unknown(Exception):
    pass


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _truediv(a, b):
    return a / b


_FUNCS = {
    "Max": max,
    "max": max,
    "Min": min,
    "min": min,
    "floor": math.floor,
    "ceiling": math.ceil,
    "ceil": math.ceil,
    "FloorDiv": operator.floordiv,
    "CeilDiv": lambda a, b: -(-a // b),
    "CeilToInt": math.ceil,
    "FloorToInt": math.floor,
    "IntTrueDiv": _truediv,
    "TruncToInt": int,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
    "Abs": abs,
    "abs": abs,
    "sqrt": math.sqrt,
}

_EXPR_CACHE: dict[str, Any] = {}


def _compile_expr(expr: str):
    code = _EXPR_CACHE.get(expr)
    if code is None:
        try:
            code = ast.parse(expr.strip(), mode="eval").body
        except SyntaxError:
            code = False
        _EXPR_CACHE[expr] = code
    return code


def _eval_node(node, env: dict[str, int]):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _Unknown(node.id)
    if isinstance(node, ast.BinOp):
        a, b = _eval_node(node.left, env), _eval_node(node.right, env)
        if isinstance(node.op, ast.Div):
            return a / b
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise _Unknown(ast.dump(node.op))
        return fn(a, b)
    if isinstance(node, ast.UnaryOp):
        v = _eval_node(node.operand, env)
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return v
        raise _Unknown("unary")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        return _FUNCS[node.func.id](*(_eval_node(a, env) for a in node.args))
    raise _Unknown(ast.dump(node))


def eval_dim_expr(expr: str, env: dict[str, int]) -> int | None:
    """Evaluate a symbolic dim expression ("past + seq", "2*seq", "Max(1, seq)") safely.

    Returns None when the expression cannot be evaluated with ``env``.
    """
    if expr in env:
        return int(env[expr])
    code = _compile_expr(expr)
    if code is False:
        return None
    try:
        value = _eval_node(code, env)
    except (_Unknown, ZeroDivisionError, TypeError, ValueError, OverflowError):
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    return int(value)


def expr_names(expr: str) -> set[str]:
    """Dim names an expression reads ("past + seq" -> {"past", "seq"}); an unparsable one is its own name."""
    code = _compile_expr(expr)
    if code is False:
        return {expr}
    return {n.id for n in ast.walk(code) if isinstance(n, ast.Name) and n.id not in _FUNCS}


def is_dim_name(expr: str) -> bool:
    """True when ``expr`` is a bare dim name ("seq"), not an expression over names ("past + seq")."""
    return isinstance(_compile_expr(expr), ast.Name)
