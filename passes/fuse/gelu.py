"""GELU, every form an exporter writes -> com.microsoft.Gelu / BiasGelu (exact) or FastGelu (tanh approximation).

Candidates (anchors): every Erf, every Tanh of sqrt(2/pi) * (...), every ONNX Gelu (opset 20). The forms:

* exact:  x * 0.5 * (1 + erf(x / sqrt(2)))  (x / sqrt2 also as x * (1/sqrt2)), or ONNX Gelu(approximate="none");
* tanh:   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  (GPT-2's gelu_new; x^3 as Pow or Mul), or ONNX
          Gelu(approximate="tanh");

the three factors of the product in any order and grouping. A bias Add (x = y + b, b a constant vector over the
last axis) goes into the fused op: BiasGelu(y, b) or FastGelu(y, b).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from passes.fuse.base import Cell, Replacement, Rule
from passes.fuse.graph import (MS, attr, const_shape, consumers, dim, insert_before, make_node, op,
                                       other_input, replace_value, scalar)

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
TANH_CUBIC = 0.044715


@dataclass
class _Gelu:
    anchor: ir.Node
    x: ir.Value            # the GELU's input (the bias Add's other operand when the bias is taken in)
    bias: ir.Value | None  # [C] constant added to x before the GELU
    out: ir.Value
    approximate: str       # "none" (erf) | "tanh"

    @property
    def op_type(self) -> str:
        if self.approximate == "tanh":
            return "FastGelu"
        return "BiasGelu" if self.bias is not None else "Gelu"


def _near(v: ir.Value | None, value: float, rel: float = 1e-3) -> bool:
    c = scalar(v)
    return c is not None and abs(c - value) <= rel * abs(value)


def _scaled(v: ir.Value, factor: float) -> ir.Value | None:
    """x if v = x * factor or x / (1 / factor) with a scalar constant, else None."""
    n = op(v, "Mul", "Div")
    if n is None:
        return None
    if n.op_type == "Div":
        return n.inputs[0] if _near(n.inputs[1], 1 / factor) else None
    for i in (0, 1):
        if _near(n.inputs[1 - i], factor):
            return n.inputs[i]
    return None


def _cube_of(v: ir.Value) -> ir.Value | None:
    """x if v = Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x)."""
    n = op(v, "Pow", "Mul")
    if n is None:
        return None
    if n.op_type == "Pow":
        return n.inputs[0] if scalar(n.inputs[1]) == 3.0 else None
    for a, b in (n.inputs, reversed(n.inputs)):
        sq = op(b, "Mul")
        if sq is not None and sq.inputs[0] is a and sq.inputs[1] is a:
            return a
    return None


def _tanh_input(tanh: ir.Node) -> ir.Value | str:
    """x if tanh reads sqrt(2/pi) * (x + 0.044715 x^3), else a reason."""
    inner = _scaled(tanh.inputs[0], SQRT_2_OVER_PI)
    add = op(inner, "Add") if inner is not None else None
    if add is None:
        return "tanh input is not sqrt(2/pi) * (x + 0.044715 x^3)"
    for x, cubic in (add.inputs, reversed(add.inputs)):
        cube = _scaled(cubic, TANH_CUBIC)
        if cube is not None and _cube_of(cube) is x:
            return x
    return "tanh input is sqrt(2/pi) * (...), but not of x + 0.044715 x^3"


def _product(t: ir.Value, x: ir.Value) -> ir.Value | str:
    """The value t * x * 0.5 in any order and grouping (t = 1 + erf/tanh(...)), or a reason."""
    users = consumers(t)
    if len(users) != 1 or users[0].op_type != "Mul":
        return f"1 + {{erf|tanh}} feeds {[u.op_type for u in users]}, not a Mul"
    m1 = users[0]
    o = other_input(m1, t)
    if o is not None and _scaled(o, 0.5) is x:
        return m1.outputs[0]                         # (0.5 * x) * t
    if o is x or _near(o, 0.5):
        want_half = o is x                           # (t * x) * 0.5, else (t * 0.5) * x
        nxt = consumers(m1.outputs[0])
        if len(nxt) == 1 and nxt[0].op_type == "Mul":
            last = other_input(nxt[0], m1.outputs[0])
            if _near(last, 0.5) if want_half else last is x:
                return nxt[0].outputs[0]
    return "not x * 0.5 * (1 + erf|tanh(...)) (the GELU product)"


def _bias(x: ir.Value):
    """(y, b) if x = y + b with b a constant vector over x's last axis, else (x, None)."""
    add = op(x, "Add")
    if add is not None:
        for i in (0, 1):
            b = add.inputs[1 - i]
            shape = const_shape(b)  # readable or weightless: the fused op takes the same initializer
            if shape is not None and len(shape) == 1 and shape[0] == dim(x, -1) and const_shape(add.inputs[i]) is None:
                return add.inputs[i], b
    return x, None


class GeluRule(Rule):
    kind = "gelu"
    target_op = "com.microsoft.Gelu | BiasGelu | FastGelu"

    def anchors(self, ctx):
        return [n for n in ctx.graph
                if n.op_type == "Erf"
                or (n.op_type == "Tanh" and _scaled(n.inputs[0], SQRT_2_OVER_PI) is not None)
                or (n.op_type == "Gelu" and n.domain in ("", "ai.onnx"))]

    def check(self, ctx, anchor):
        if anchor.op_type == "Gelu":
            approximate = attr(anchor, "approximate", "none")
            if approximate not in ("none", "tanh"):
                return f"Gelu approximate={approximate!r}"
            x, out = anchor.inputs[0], anchor.outputs[0]
        else:
            if anchor.op_type == "Erf":
                x, approximate = _scaled(anchor.inputs[0], 1 / math.sqrt(2)), "none"
                if x is None:
                    return "erf input is not x/sqrt(2)"
            else:
                x, approximate = _tanh_input(anchor), "tanh"
                if isinstance(x, str):
                    return x
            users = consumers(anchor.outputs[0])
            if len(users) != 1 or users[0].op_type != "Add" or scalar(other_input(users[0], anchor.outputs[0])) != 1.0:
                return f"{anchor.op_type.lower()} does not feed 1 + {anchor.op_type.lower()}(...)"
            out = _product(users[0].outputs[0], x)
            if isinstance(out, str):
                return out
        if x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, None):
            return f"GELU of {x.dtype}"
        y, bias = _bias(x)
        return _Gelu(anchor, y, bias, out, approximate)

    def rewrite(self, ctx, m: _Gelu):
        ctx.use_opset(MS, 1)
        node = make_node(m.anchor, MS, m.op_type, [m.x] + ([m.bias] if m.bias is not None else []))
        node.outputs[0].type, node.outputs[0].shape = m.out.type, m.out.shape
        insert_before(ctx.graph, m.out.producer(), [node])
        replace_value(ctx.graph, m.out, node.outputs[0])

    def replacement(self, ctx, m: _Gelu) -> Replacement:
        inputs = (m.x,) + ((m.bias,) if m.bias is not None else ())
        return Replacement((Cell(m.op_type, inputs, (m.out,)),), (m.out,), inputs)
