"""Projection merges (packed QKV, gate + up) and bias + GELU. (MoE experts: passes/fuse/moe.py.)"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from softsyn.passes.fuse.rules import Rule
from softsyn.passes.fuse.graph import (MS, add_initializer, const, consumers, insert_before, int64, make_node, op,
                                  other_input, replace_value, scalar)


def _projections(ctx):
    """Groups of MatMuls by a constant 2-D weight that read the same input, in graph order."""
    groups: dict[int, list[ir.Node]] = {}
    order = []
    for n in ctx.graph:
        if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and n.inputs[1] is not None \
                and n.inputs[1].producer() is None and n.inputs[1].const_value is not None \
                and n.inputs[1].shape is not None and len(n.inputs[1].shape) == 2:
            key = id(n.inputs[0])
            if key not in groups:
                groups[key] = []
                order.append(key)
            groups[key].append(n)
    return [groups[k] for k in order if len(groups[k]) >= 2]


def _bias_of(mm: ir.Node):
    users = consumers(mm.outputs[0])
    if len(users) == 1 and users[0].op_type == "Add":
        b = other_input(users[0], mm.outputs[0])
        c = const(b)
        if c is not None and c.ndim == 1:
            return users[0], c
    return None, None


class ProjectionMergeRule(Rule):
    """Several MatMuls of one input -> one MatMul on the concatenated weights + Split (packed QKV: 3+
    projections; gate + up: 2). Wins on small M (decode), where each GEMV is launch/bandwidth bound."""

    def __init__(self, kind: str):
        self.kind = kind
        self.target_op = "MatMul + Split"

    def anchors(self, ctx):
        groups = _projections(ctx)
        want = (lambda g: len(g) >= 3) if self.kind == "packed_qkv" else (lambda g: len(g) == 2)
        sel = [g for g in groups if want(g)]
        ctx.cache[("proj", self.kind)] = {id(g[0]): g for g in sel}
        return [g[0] for g in sel]

    def check(self, ctx, anchor):
        group = ctx.cache[("proj", self.kind)][id(anchor)]
        if any(n.graph is None for n in group):
            return "a projection of the group was rewritten by an earlier rule"
        ws = [const(n.inputs[1]) for n in group]
        if any(w is None for w in ws):
            return "weights are not materialised (meta/external data not readable): cannot concatenate"
        if len({w.shape[0] for w in ws}) != 1 or len({w.dtype for w in ws}) != 1:
            return f"weights differ in input size or dtype: {[w.shape for w in ws]}"
        biases = [_bias_of(n) for n in group]
        has_bias = [b[0] is not None for b in biases]
        if any(has_bias) and not all(has_bias):
            biases = [(None, None)] * len(group)  # merge the MatMuls only; the bias Adds stay
        return group, ws, biases

    def rewrite(self, ctx, match):
        group, ws, biases = match
        g = ctx.graph
        x = group[0].inputs[0]
        sizes = [int(w.shape[1]) for w in ws]
        name = (group[0].inputs[1].name or "proj") + f".merged{len(group)}"
        w = add_initializer(g, name, np.concatenate(ws, axis=1))
        mm = make_node(group[0], "", "MatMul", [x, w])
        mm.outputs[0].type = group[0].outputs[0].type
        new = [mm]
        src = mm.outputs[0]
        outs = [n.outputs[0] for n in group]
        if biases[0][0] is not None:
            b = add_initializer(g, name + ".bias", np.concatenate([c for _, c in biases]))
            add = make_node(group[0], "", "Add", [src, b])
            add.outputs[0].type = src.type
            new.append(add)
            src = add.outputs[0]
            outs = [a.outputs[0] for a, _ in biases]
        split = make_node(group[0], "", "Split", [src, int64(g, f"{name}.sizes", sizes)], {"axis": -1},
                          num_outputs=len(group))
        new.append(split)
        for o, old in zip(split.outputs, outs):
            o.type, o.shape = old.type, old.shape
        insert_before(g, group[0], new)
        for o, old in zip(split.outputs, outs):
            replace_value(g, old, o)


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
