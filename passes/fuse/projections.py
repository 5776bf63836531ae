"""Projection merges: MatMuls of one input -> one MatMul + Split (packed QKV, gate + up).

Where the three outputs of a packed QKV feed one GroupQueryAttention as its query, key and value, the node takes
the packed [B, S, (N + 2 Nkv) H] tensor as its query and no key/value (ORT's packed-QKV form, as
onnxruntime-genai's builder emits it): the Split is not made, one kernel and one launch fewer per layer.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.fuse.base import Cell, Replacement, Rule, stand_in
from passes.fuse.graph import (MS, add_initializer, add_weightless, attr, const, consumers, fresh, input_dependent,
                               insert_before, int64, make_node, op, other_input, replace_value, weightless)


def _weight(v: ir.Value | None):
    """(initializer, transposed) if v is a 2-D weight: an initializer (readable or weightless) or, as a weightless
    export leaves it (its Transposes cannot be folded), Transpose(perm 1,0) of one; else None."""
    t = op(v, "Transpose")
    transposed = t is not None and list(attr(t, "perm", [1, 0])) == [1, 0] and t.domain in ("", "ai.onnx")
    w = t.inputs[0] if transposed else v
    if w is None or w.producer() is not None or w.const_value is None or w.shape is None or len(w.shape) != 2:
        return None
    return w, transposed


def _weight_array(v: ir.Value):
    """The [in, out] values of weight v, or None if they are not readable (weightless)."""
    w, transposed = _weight(v)
    c = const(w)
    return None if c is None else (c.T if transposed else c)


def _weight_shape(v: ir.Value) -> tuple[int, int]:
    w, transposed = _weight(v)
    rows, cols = (int(d) for d in w.shape)
    return (cols, rows) if transposed else (rows, cols)


def _projections(ctx):
    """Groups of MatMuls by a constant 2-D weight that read the same input, in graph order."""
    groups: dict[int, list[ir.Node]] = {}
    order = []
    for n in ctx.graph:
        if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and _weight(n.inputs[1]) is not None:
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
        if weightless(b) and len(b.shape) == 1:
            return users[0], b  # a weightless bias: its shape, no data
    return None, None


def _packed_attention(outs: list[ir.Value], sizes: list[int]) -> ir.Node | None:
    """The GroupQueryAttention that reads q, k, v = outs (and nothing else does) as its inputs 0-2, with widths
    N*H, Nkv*H, Nkv*H: it can take them packed. Else None."""
    if len(outs) != 3:
        return None
    users = [consumers(o) for o in outs]
    if any(len(u) != 1 for u in users):
        return None
    node = users[0][0]
    if node.op_type != "GroupQueryAttention" or node.domain != MS or any(u[0] is not node for u in users):
        return None
    if any(node.inputs[i] is not o for i, o in enumerate(outs)) or any(o in node.inputs[3:] for o in outs):
        return None
    heads, kv_heads = attr(node, "num_heads", 0), attr(node, "kv_num_heads", 0)
    if not heads or not kv_heads or sizes[0] % heads or sizes[1:] != [sizes[0] // heads * kv_heads] * 2:
        return None
    return node


class ProjectionMergeRule(Rule):
    """Several MatMuls of one input -> one MatMul on the concatenated weights + Split (packed QKV: 3+
    projections; gate + up: 2). Wins on small M (decode), where each GEMV is launch/bandwidth bound."""

    def __init__(self, kind: str):
        self.kind = kind
        self.target_op = "MatMul + Split"

    def anchors(self, ctx):
        groups = _projections(ctx)
        want = (lambda g: len(g) >= 3) if self.kind == "packed_qkv" else (lambda g: len(g) == 2)
        # projections of a load-time constant (DeBERTa's relative position embeddings, read by every layer's
        # query and key projections) are folded by the runtime at load: nothing to merge, not a candidate
        dynamic = input_dependent(ctx.graph)
        sel = [g for g in groups if want(g) and id(g[0].inputs[0]) in dynamic]
        ctx.cache[("proj-folded", self.kind)] = sum(1 for g in groups if want(g) and id(g[0].inputs[0]) not in dynamic)
        ctx.cache[("proj", self.kind)] = {id(g[0]): g for g in sel}
        return [g[0] for g in sel]

    def check(self, ctx, anchor):
        group = ctx.cache[("proj", self.kind)][id(anchor)]
        if any(n.graph is None for n in group):
            return "a projection of the group was rewritten by an earlier rule"
        ws = [_weight_array(n.inputs[1]) for n in group]
        if any(w is None for w in ws):
            if not all(weightless(_weight(n.inputs[1])[0]) for n in group):
                return "weights are not readable (external data missing), and not all weightless: cannot concatenate"
            # a weightless (meta) netlist: the merged weight is weightless too, with the concatenated shape
            ws = [None] * len(group)
        shapes = [_weight_shape(n.inputs[1]) for n in group]
        dtypes = {_weight(n.inputs[1])[0].dtype for n in group}
        if len({r for r, _ in shapes}) != 1 or len(dtypes) != 1:
            return f"weights differ in input size or dtype: {shapes}"
        biases = [_bias_of(n) for n in group]
        has_bias = [b[0] is not None for b in biases]
        if (any(has_bias) and not all(has_bias)) or len({isinstance(c, ir.Value) for _, c in biases}) > 1:
            biases = [(None, None)] * len(group)  # merge the MatMuls only; the bias Adds stay
        return group, ws, biases

    def rewrite(self, ctx, match):
        group, ws, biases = match
        g = ctx.graph
        x = group[0].inputs[0]
        sizes = [_weight_shape(n.inputs[1])[1] for n in group]
        first = _weight(group[0].inputs[1])[0]
        name = (first.name or "proj") + f".merged{len(group)}"
        if ws[0] is None:
            w = add_weightless(g, name, (_weight_shape(group[0].inputs[1])[0], sum(sizes)), first.dtype)
        else:
            w = add_initializer(g, name, np.concatenate(ws, axis=1))
        mm = make_node(group[0], "", "MatMul", [x, w])
        mm.outputs[0].type = group[0].outputs[0].type
        if x.shape is not None:
            mm.outputs[0].shape = ir.Shape(list(x.shape)[:-1] + [sum(sizes)])
        new = [mm]
        src = mm.outputs[0]
        outs = [n.outputs[0] for n in group]
        if biases[0][0] is not None:
            if isinstance(biases[0][1], ir.Value):
                b = add_weightless(g, name + ".bias", (sum(int(c.shape[0]) for _, c in biases),), biases[0][1].dtype)
            else:
                b = add_initializer(g, name + ".bias", np.concatenate([c for _, c in biases]))
            add = make_node(group[0], "", "Add", [src, b])
            add.outputs[0].type = src.type
            new.append(add)
            src = add.outputs[0]
            outs = [a.outputs[0] for a, _ in biases]
        gqa = _packed_attention(outs, sizes) if self.kind == "packed_qkv" else None
        if gqa is not None:
            insert_before(g, group[0], new)
            gqa.replace_input_with(0, src)
            gqa.replace_input_with(1, None)
            gqa.replace_input_with(2, None)
            ctx.cache["packed-into-gqa"] = ctx.cache.get("packed-into-gqa", 0) + 1
            return
        split = make_node(group[0], "", "Split", [src, int64(g, f"{name}.sizes", sizes)], {"axis": -1},
                          num_outputs=len(group))
        new.append(split)
        for o, old in zip(split.outputs, outs):
            o.type, o.shape = old.type, old.shape
        insert_before(g, group[0], new)
        for o, old in zip(split.outputs, outs):
            replace_value(g, old, o)

    def note(self, ctx):
        n = ctx.cache.get("packed-into-gqa", 0) if self.kind == "packed_qkv" else 0
        folded = ctx.cache.get(("proj-folded", self.kind), 0)
        notes = [f"{n} packed QKV feed GroupQueryAttention as its query (no Split, no key/value inputs)" if n else "",
                 f"{folded} group(s) of projections of a load-time constant not counted (the runtime folds them at "
                 "load)" if folded else ""]
        return "; ".join(x for x in notes if x)

    def replacement(self, ctx, match) -> Replacement:
        group, ws, biases = match
        x = group[0].inputs[0]
        k, width = _weight_shape(group[0].inputs[1])[0], sum(_weight_shape(n.inputs[1])[1] for n in group)
        dtype = _weight(group[0].inputs[1])[0].dtype
        shape = None if x.shape is None else list(x.shape)[:-1] + [width]
        merged = stand_in(fresh("proj_merged"), shape, dtype)
        cells = [Cell("MatMul", (x, stand_in(fresh("proj_weight"), [k, width], dtype)), (merged,), domain="")]
        outs = tuple(n.outputs[0] for n in group)
        if biases[0][0] is not None:
            cells.append(Cell("Add", (merged, stand_in(fresh("proj_bias"), [width], dtype)), (merged,), domain=""))
            outs = tuple(a.outputs[0] for a, _ in biases)
        # a GroupQueryAttention that takes the packed tensor makes no Split (rewrite): costing it is conservative
        cells.append(Cell("Split", (merged,), outs, {"axis": -1}, domain=""))
        return Replacement(tuple(cells), outs, (x,))
