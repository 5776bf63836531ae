"""SiLU (Swish), x * sigmoid(x) -> com.microsoft.QuickGelu(x, alpha=1.0): one kernel instead of two.

QuickGelu computes y = x * sigmoid(alpha * x); at alpha 1 that is SiLU exactly (the gate activation of every
SwiGLU MLP: Qwen, Llama, Mistral). ONNX Runtime 1.31 has no SwiGLU op for a dense MLP, and a decode step captured as
a CUDA graph pays per kernel, so the Sigmoid + Mul pair of each layer becomes one node (Qwen3-1.7B: 28 kernels
fewer per token).

Candidates (anchors): every Sigmoid. The form: Mul(x, Sigmoid(x)) (operands in either order) with the Sigmoid read
by that Mul only, x a float tensor. torch.nn.functional.silu exports exactly this (dynamo); a Sigmoid feeding
anything else (a gate, a router) is a miss with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from passes.fuse.base import Cell, Replacement, Rule
from passes.fuse.graph import MS, consumers, insert_before, make_node, other_input, replace_value

FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, None)


@dataclass
class _Silu:
    anchor: ir.Node  # the Sigmoid
    x: ir.Value
    out: ir.Value  # the Mul's output


class SiluRule(Rule):
    kind = "silu"
    target_op = "com.microsoft.QuickGelu (alpha 1)"

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
        if other_input(mul, anchor.outputs[0]) is not x:
            return "the Mul multiplies the sigmoid by another value than its input (a gate, not SiLU)"
        if x.dtype not in FLOATS:
            return f"SiLU of {x.dtype}"
        return _Silu(anchor, x, mul.outputs[0])

    def rewrite(self, ctx, m: _Silu):
        ctx.use_opset(MS, 1)
        node = make_node(m.anchor, MS, "QuickGelu", [m.x], {"alpha": 1.0})
        node.outputs[0].type, node.outputs[0].shape = m.out.type, m.out.shape
        insert_before(ctx.graph, m.out.producer(), [node])
        replace_value(ctx.graph, m.out, node.outputs[0])

    def replacement(self, ctx, m: _Silu) -> Replacement:
        return Replacement((Cell("QuickGelu", (m.x,), (m.out,), {"alpha": 1.0}),), (m.out,), (m.x,))
