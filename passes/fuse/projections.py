"""Projection merges: MatMuls of one input -> one MatMul + Split (packed QKV, gate + up)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from softsyn.passes.fuse.base import Rule
from softsyn.passes.fuse.graph import (add_initializer, const, consumers, insert_before, int64, make_node,
                                       other_input, replace_value)


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
