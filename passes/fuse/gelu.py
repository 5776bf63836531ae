"""Bias + GELU: exact (erf) GELU of MatMul + bias -> com.microsoft.BiasGelu (no bias: com.microsoft.Gelu)."""
from __future__ import annotations

import numpy as np

from softsyn.passes.fuse.base import Rule
from softsyn.passes.fuse.graph import (MS, const, consumers, insert_before, make_node, op, other_input,
                                       replace_value, scalar)


class BiasGeluRule(Rule):
    """x*0.5*(1+erf(x/sqrt2)) with x = MatMul + bias -> com.microsoft.BiasGelu (no bias: com.microsoft.Gelu)."""
    kind = "bias_gelu"
    target_op = "com.microsoft.BiasGelu"

    def anchors(self, ctx):
        return [n for n in ctx.graph if n.op_type == "Erf"]

    def check(self, ctx, erf):
        d = erf.inputs[0].producer()
        if d is None or d.op_type not in ("Div", "Mul"):
            return "erf input is not x/sqrt(2)"
        x = d.inputs[0]
        c = scalar(d.inputs[1])
        if c is None or not (abs(c - np.sqrt(2)) < 1e-3 if d.op_type == "Div" else abs(c - 1 / np.sqrt(2)) < 1e-3):
            return f"erf input is x {d.op_type} {c}, not x/sqrt(2)"
        users = consumers(erf.outputs[0])
        if len(users) != 1 or users[0].op_type != "Add" or scalar(other_input(users[0], erf.outputs[0])) != 1.0:
            return "erf does not feed 1 + erf(...)"
        v, half, times_x = users[0].outputs[0], False, False
        out = None
        for _ in range(2):
            us = consumers(v)
            if len(us) != 1 or us[0].op_type != "Mul":
                break
            o = other_input(us[0], v)
            if scalar(o) == 0.5 and not half:
                half = True
            elif o is x and not times_x:
                times_x = True
            else:
                break
            v = out = us[0].outputs[0]
        if not (half and times_x):
            # 0.5 may multiply x first: (x*0.5) * (1+erf)
            return "not x * 0.5 * (1 + erf(x/sqrt2)) (exact GELU)"
        bias_add, bias = op(x, "Add"), None
        if bias_add is not None:
            for i in (0, 1):
                cb = const(bias_add.inputs[1 - i])
                if cb is not None and cb.ndim == 1 and len(consumers(x)) == 2:
                    x, bias = bias_add.inputs[i], bias_add.inputs[1 - i]
                    break
        return erf, x, bias, out

    def rewrite(self, ctx, m):
        erf, x, bias, out = m
        ctx.use_opset(MS, 1)
        if bias is not None:
            node = make_node(erf, MS, "BiasGelu", [x, bias])
        else:
            node = make_node(erf, MS, "Gelu", [x])
        node.outputs[0].type, node.outputs[0].shape = out.type, out.shape
        insert_before(ctx.graph, out.producer(), [node])
        replace_value(ctx.graph, out, node.outputs[0])
