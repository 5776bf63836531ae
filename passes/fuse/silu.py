"""SiLU (Swish) and quick_gelu, x * sigmoid(alpha * x) -> com.microsoft.QuickGelu(x, alpha): one kernel, not two.

QuickGelu computes y = x * sigmoid(alpha * x); at alpha 1 that is SiLU exactly (the gate activation of every
SwiGLU MLP: Qwen, Llama, Mistral), at alpha 1.702 CLIP's quick_gelu. ONNX Runtime 1.31 has no SwiGLU op for a
dense MLP, and a decode step captured as a CUDA graph pays per kernel, so the Sigmoid + Mul pair of each layer
becomes one node (Qwen3-1.7B: 28 kernels fewer per token).

Candidates (anchors): every Sigmoid. The form: Mul(x, Sigmoid(x)) or Mul(x, Sigmoid(Mul(x, alpha))) with alpha a
constant scalar (operands in either order), the Sigmoid (and the alpha Mul) read by that form only, x a float
tensor. torch.nn.functional.silu and transformers' quick_gelu export exactly this (dynamo); a Sigmoid feeding
anything else (a gate, a router) is a miss with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from passes.fuse.base import Cell, Replacement, Rule
from passes.fuse.graph import MS, attr, consumers, insert_before, make_node, op, other_input, replace_value, scalar

FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, None)


@dataclass
class _Silu:
    anchor: ir.Node  # the Sigmoid
    x: ir.Value
    out: ir.Value  # the Mul's output
    alpha: float = 1.0


class SiluRule(Rule):
    kind = "silu"
    target_op = "com.microsoft.QuickGelu (alpha: the model's)"

    def anchors(self, ctx):
        return [n for n in ctx.graph if n.op_type == "Sigmoid" and n.domain in ("", "ai.onnx")]

    def check(self, ctx, anchor):
        x = anchor.inputs[0]
        users = consumers(anchor.outputs[0])
        if len(users) != 1 or users[0].op_type != "Mul" or users[0].domain not in ("", "ai.onnx"):
            return f"sigmoid feeds {[u.op_type for u in users]}, not one Mul (not x * sigmoid(x))"
        if anchor.outputs[0] in ctx.graph.outputs:
            return "sigmoid output is a graph output"
        mul = users[0]
        y = other_input(mul, anchor.outputs[0])
        x, alpha = _scaled(x, y)
        if y is not x:
            return (f"the Mul multiplies the sigmoid by {y.name}, not by the value the sigmoid reads (scaled by a "
                    "constant alpha or not): a gate, not x * sigmoid(alpha * x)")
        if x.dtype not in FLOATS:
            return f"SiLU of {x.dtype}"
        return _Silu(anchor, x, mul.outputs[0], alpha)

    def rewrite(self, ctx, m: _Silu):
        ctx.use_opset(MS, 1)
        node = make_node(m.anchor, MS, "QuickGelu", [m.x], {"alpha": m.alpha})
        node.outputs[0].type, node.outputs[0].shape = m.out.type, m.out.shape
        insert_before(ctx.graph, m.out.producer(), [node])
        replace_value(ctx.graph, m.out, node.outputs[0])

    def replacement(self, ctx, m: _Silu) -> Replacement:
        return Replacement((Cell("QuickGelu", (m.x,), (m.out,), {"alpha": m.alpha}),), (m.out,), (m.x,))

    def note(self, ctx):
        alphas = sorted({round(attr(n, "alpha", 1.0), 6) for n in ctx.graph if n.op_type == "QuickGelu"} - {1.0})
        return f"QuickGelu alpha {', '.join(f'{a:g}' for a in alphas)} (quick_gelu), not SiLU's 1" if alphas else ""


def _scaled(x: ir.Value, y: ir.Value) -> tuple[ir.Value, float]:
    """(v, alpha) when the sigmoid's input x is Mul(v, alpha) with alpha a constant scalar read only there and v the
    Mul's other operand y (quick_gelu's sigmoid(1.702 * x)); else (x, 1.0)."""
    n = op(x, "Mul")
    if n is None or n.domain not in ("", "ai.onnx") or len(consumers(x)) != 1:
        return x, 1.0
    for v, c in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        alpha = scalar(c)
        if v is y and alpha is not None:
            return v, float(alpha)
    return x, 1.0
