"""Rotary rule: x*cos + rotate_half(x)*sin -> com.microsoft.RotaryEmbedding with cos/sin caches.

The caches are computed by evaluating the model's own cos/sin subgraph for positions
0..max_position-1 (so rope scaling variants — linear, llama3, attention factor — come for free),
and position_ids stays a live input: the fused op is exact for any positions the model is fed.

The positions the fused op reads are the ones the model's own cos/sin subgraph reads: the nearest integer
tensor every path from cos/sin to the graph inputs goes through — the ``position_ids`` input when the model
reads it, else what the model computes (e.g. ``arange(seq)`` from ``Shape(input_ids)`` in a plain export with
no position input, or positions derived from the attention mask). A graph input read only through ``Shape``
(token ids) is never taken as positions. On a weightless (meta) netlist the subgraph's weights (``inv_freq``)
have no data: it is evaluated on placeholders to check its structure and the caches are weightless too.
"""
from __future__ import annotations

import hashlib

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from passes.fuse.base import Cell, Replacement, Rule, stand_in
from passes.fuse.chain import Link, follow
from passes.fuse.graph import (MS, add_initializer, add_weightless, attr, cone_inputs, const, dim,
                                       evaluate, fresh, insert_before, int64, make_node, op, other_input, placeholders,
                                       replace_value)

_INT = (ir.DataType.INT64, ir.DataType.INT32)


def _slice_params(n: ir.Node):
    """(start, end, axis, step) of a constant single-axis Slice, else None."""
    if n is None or n.op_type != "Slice":
        return None
    vals = [const(v) if v is not None else None for v in list(n.inputs)[1:]]
    while len(vals) < 4:
        vals.append(None)
    starts, ends, axes, steps = vals
    if starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return None
    axis = int(np.ravel(axes)[0]) if axes is not None else 0
    step = int(np.ravel(steps)[0]) if steps is not None else 1
    return int(np.ravel(starts)[0]), int(np.ravel(ends)[0]), axis, step


def _is_rotate_half(concat: ir.Node):
    """x if concat == Concat(-x[..., h/2:], x[..., :h/2], axis=-1)."""
    if concat.op_type != "Concat" or len(concat.inputs) != 2:
        return None
    neg = op(concat.inputs[0], "Neg")
    lo = op(concat.inputs[1], "Slice")
    hi = op(neg.inputs[0], "Slice") if neg is not None else None
    if hi is None or lo is None or hi.inputs[0] is not lo.inputs[0]:
        return None
    return lo.inputs[0]


def _position_source(cos: ir.Value, sin: ir.Value):
    """The position tensor cos/sin are computed from: the nearest (breadth-first from cos/sin) integer value of
    rank 1 ([S]) or 2 ([B|1, S]) whose values the subgraph reads (not only its Shape) and that cuts every path
    from cos/sin to the graph inputs. None if there is none."""
    seen, frontier = set(), [cos, sin]
    while frontier:
        nxt = []
        for v in frontier:
            if v is None or id(v) in seen:
                continue
            seen.add(id(v))
            if v.dtype in _INT and v.shape is not None and len(v.shape) in (1, 2) and v.const_value is None \
                    and not cone_inputs([cos, sin], stop={id(v)}):
                return v
            n = v.producer()
            if n is not None and n.op_type != "Shape":  # Shape reads only the shape of its input
                nxt.extend(n.inputs)
        frontier = nxt
    return None


def _rotary_tail(x: ir.Value) -> tuple[Link, ...]:
    """rotate_half(x) -> Mul(sin) -> Add(x*cos, .)."""
    def plus_x_cos(add: ir.Node, v: ir.Value) -> str | None:
        mcos = op(other_input(add, v), "Mul")
        return None if mcos is not None and x in list(mcos.inputs) else "the Add's other operand is not x*cos"

    return (Link("Mul(sin)", ("Mul",), gives="rotate_half(x)*sin"), Link("Add(x*cos, .)", ("Add",), test=plus_x_cos))


@dataclass
class _Rot:
    anchor: ir.Node
    x: ir.Value
    cos: ir.Value
    sin: ir.Value
    out: ir.Value
    pos: ir.Value
    cos_cache: np.ndarray
    sin_cache: np.ndarray
    weightless: bool = False  # computed from placeholders of weightless weights: the caches get no data either


class RotaryRule(Rule):
    kind = "rotary"
    target_op = "com.microsoft.RotaryEmbedding"

    def anchors(self, ctx):
        return [n for n in ctx.graph if n.op_type == "Concat" and len(n.inputs) == 2 and op(n.inputs[0], "Neg") is not None
                and op(op(n.inputs[0], "Neg").inputs[0], "Slice") is not None]

    def check(self, ctx, concat):
        x = _is_rotate_half(concat)
        if x is None:
            return "Concat(Neg(Slice), ...) is not rotate_half(x): the halves come from different tensors"
        if attr(concat, "axis") not in (-1, (len(x.shape) - 1) if x.shape is not None else -1):
            return f"rotate_half concatenates on axis {attr(concat, 'axis')}, not the last"
        h = dim(x, -1)
        if not isinstance(h, int):
            return "head size (last dim of x) is not static"
        neg = op(concat.inputs[0], "Neg")
        hi, lo = _slice_params(op(neg.inputs[0], "Slice")), _slice_params(op(concat.inputs[1], "Slice"))
        r = len(x.shape)
        if hi is None or lo is None:
            return "rotate_half slices are not constant"
        if hi[2] not in (-1, r - 1) or lo[2] not in (-1, r - 1) or hi[3] != 1 or lo[3] != 1:
            return "rotate_half slices are not contiguous slices of the last axis (interleaved rotary?)"
        if not (hi[0] == h // 2 and hi[1] >= h and lo[0] == 0 and lo[1] == h // 2):
            return (f"rotary covers part of the head (slices [{lo[0]}:{lo[1]}] and [{hi[0]}:{hi[1]}] of {h}): "
                    "partial rotary is not fused")
        chain = follow(concat.outputs[0], "rotate_half(x)", *_rotary_tail(x))
        if isinstance(chain, str):
            return chain
        msin, add = chain
        sin = other_input(msin, concat.outputs[0])
        cos = other_input(op(other_input(add, msin.outputs[0]), "Mul"), x)
        caches = self._caches(ctx, cos, sin, h)
        if isinstance(caches, str):
            return caches
        pos, cc, sc, meta = caches
        return _Rot(anchor=concat, x=x, cos=cos, sin=sin, out=add.outputs[0], pos=pos, cos_cache=cc, sin_cache=sc,
                    weightless=meta)

    def _caches(self, ctx, cos, sin, h):
        key = ("rotary", id(cos), id(sin))
        if key in ctx.cache:
            return ctx.cache[key]
        ctx.cache[key] = res = self._compute_caches(ctx, cos, sin, h)
        return res

    def _compute_caches(self, ctx, cos, sin, h):
        srcs = cone_inputs([cos, sin])
        pos = _position_source(cos, sin) if srcs else None
        if pos is None:
            return (f"cos/sin depend on {', '.join(v.name for v in srcs) or 'no input'}, not on one integer "
                    "[batch, seq] position tensor")
        # the cache covers every position the KV buffer holds (GQA refuses a total length past the cache's rows)
        max_pos = max(int(ctx.netlist.config.get("max_position_embeddings") or 4096), ctx.positions or 0)
        ids = np.arange(max_pos, dtype=pos.dtype.numpy()).reshape((1, max_pos)[2 - len(pos.shape):])
        weights = placeholders([cos, sin])
        try:
            c, s = evaluate(ctx.graph, [cos, sin], {pos: ids, **weights}, dict(ctx.model.opset_imports))
        except Exception as exc:
            return f"could not evaluate the cos/sin subgraph: {exc}"
        c, s = np.asarray(c), np.asarray(s)
        if c.shape[-1] != h or c.size != max_pos * h or s.shape != c.shape:
            return f"cos has shape {c.shape}, expected positions x {h}"
        c, s = c.reshape(max_pos, h), s.reshape(max_pos, h)
        if not (np.array_equal(c[:, : h // 2], c[:, h // 2:]) and np.array_equal(s[:, : h // 2], s[:, h // 2:])):
            return "cos/sin halves differ: not the rotate_half (non-interleaved) layout"
        # a probe with another batch row must give the same table (no batch-dependent rope)
        return pos, np.ascontiguousarray(c[:, : h // 2]), np.ascontiguousarray(s[:, : h // 2]), bool(weights)

    def _positions(self, ctx, m: _Rot) -> ir.Value:
        """m.pos as the op wants it: int64 [B, S]. A computed [S] or [1, S] (e.g. arange(seq)) is expanded to
        the batch (read from a graph input with x's batch dim); one Cast/Expand per position tensor, placed right
        after it and shared by every layer."""
        key = ("rotary-pos", id(m.pos))
        if key in ctx.cache:
            return ctx.cache[key]
        g, pos, new = ctx.graph, m.pos, []

        def add(op_type, inputs, attrs=None):
            new.append(make_node(m.anchor, "", op_type, inputs, attrs))
            new[-1].outputs[0].type = ir.TensorType(ir.DataType.INT64)
            return new[-1].outputs[0]

        if pos.dtype != ir.DataType.INT64:
            pos = add("Cast", [pos], {"to": ir.DataType.INT64})
        batch = m.x.shape[0] if m.x.shape is not None else None
        if len(m.pos.shape) == 1 or (dim(m.pos, 0) == 1 and batch != 1):
            if len(m.pos.shape) == 1:
                pos = add("Unsqueeze", [pos, int64(g, "axis0", [0])])
            # the batch size from a graph input with the same batch dim (shared by all layers), else from x
            name = getattr(batch, "value", None)
            src = next((v for v in g.inputs if name and v.shape is not None and len(v.shape)
                        and getattr(v.shape[0], "value", None) == name), None)
            if src is None and not isinstance(batch, int):  # batch from this layer's x: not shared
                src, key = m.x, None
            b = int64(g, "batch", [batch]) if isinstance(batch, int) else add("Shape", [src], {"start": 0, "end": 1})
            shape = add("Concat", [b, add("Shape", [pos], {"start": -1})], {"axis": 0})
            pos = add("Expand", [pos, shape])
            pos.shape = ir.Shape([batch, m.pos.shape[-1]])
        if new and key is None:  # just before this rotary
            insert_before(g, m.out.producer(), new)
        elif new:  # right after the positions are computed (a graph input: first), so every layer can read it
            where = m.pos.producer()
            g.insert_after(where, new) if where is not None else insert_before(g, next(iter(g)), new)
        if key is not None:
            ctx.cache[key] = pos
        return pos

    def rewrite(self, ctx, m: _Rot):
        g = ctx.graph
        ctx.use_opset(MS, 1)
        # one cos/sin table pair for every layer that computes the same rotation (shared, not copied per layer)
        dtype = m.x.dtype.numpy()
        key = ("rotary-cache", m.cos_cache.shape, np.dtype(dtype).str, hashlib.sha1(m.cos_cache.tobytes()).hexdigest(),
               hashlib.sha1(m.sin_cache.tobytes()).hexdigest())
        if key not in ctx.cache:
            if m.weightless:
                ctx.cache[key] = tuple(add_weightless(g, f"rotary.{n}_cache", m.cos_cache.shape, m.x.dtype)
                                       for n in ("cos", "sin"))
            else:
                ctx.cache[key] = (add_initializer(g, "rotary.cos_cache", m.cos_cache.astype(dtype)),
                                  add_initializer(g, "rotary.sin_cache", m.sin_cache.astype(dtype)))
        cc, sc = ctx.cache[key]
        pos = self._positions(ctx, m)
        x, new = m.x, []
        tr = op(x, "Transpose")
        y = tr.inputs[0] if tr is not None else None
        n_heads = dim(y, 2) if y is not None else None
        if tr is not None and list(attr(tr, "perm", [])) == [0, 2, 1, 3] and isinstance(n_heads, int):
            # x = BNSH view of y [B,S,N,H]: rotate the [B,S,N*H] form (what GQA/MHA consume), view back
            h = dim(x, -1)
            flat = make_node(m.anchor, "", "Reshape", [y, int64(g, "shape_bs_flat", [0, 0, -1])])
            rot = make_node(m.anchor, MS, "RotaryEmbedding", [flat.outputs[0], pos, cc, sc],
                            {"interleaved": 0, "num_heads": n_heads})
            back = make_node(m.anchor, "", "Reshape", [rot.outputs[0], int64(g, "shape_bsnh", [0, 0, n_heads, h])])
            tr2 = make_node(m.anchor, "", "Transpose", [back.outputs[0]], {"perm": [0, 2, 1, 3]})
            new = [flat, rot, back, tr2]
            if y.shape is not None:
                flat.outputs[0].shape = ir.Shape([y.shape[0], y.shape[1], n_heads * h])
                rot.outputs[0].shape = flat.outputs[0].shape
                back.outputs[0].shape = y.shape
            for n in new:
                n.outputs[0].type = x.type
            tr2.outputs[0].shape = m.out.shape
            result = tr2.outputs[0]
        else:
            if x.shape is None or len(x.shape) != 4:
                raise ValueError("x is neither BNSH 4-D nor a transposed BSNH tensor")
            rot = make_node(m.anchor, MS, "RotaryEmbedding", [x, pos, cc, sc], {"interleaved": 0})
            rot.outputs[0].shape, rot.outputs[0].type = m.out.shape, m.out.type
            new, result = [rot], rot.outputs[0]
        insert_before(g, m.out.producer(), new)
        replace_value(g, m.out, result)

    def replacement(self, ctx, m: _Rot) -> Replacement:
        half = m.cos_cache.shape
        caches = tuple(stand_in(f"rotary.{n}_cache", half, m.x.dtype) for n in ("cos", "sin"))
        tr = op(m.x, "Transpose")
        y = tr.inputs[0] if tr is not None else None
        heads = dim(y, 2) if y is not None else None
        if tr is not None and list(attr(tr, "perm", [])) == [0, 2, 1, 3] and isinstance(heads, int) and y.shape is not None:
            # as the rewrite does: rotate the [B,S,N*H] form of y [B,S,N,H], then transpose back
            flat = stand_in(fresh("rotary_flat"), [y.shape[0], y.shape[1], heads * dim(m.x, -1)], m.x.dtype)
            rotated = stand_in(fresh("rotary_out"), flat.shape, m.x.dtype)
            cells = (Cell("RotaryEmbedding", (flat, m.pos) + caches, (rotated,)),
                     Cell("Transpose", (stand_in(fresh("rotary_bsnh"), y.shape, m.x.dtype),), (m.out,), {"perm": [0, 2, 1, 3]},
                          domain=""))
            return Replacement(cells, (m.out,), (y, m.pos))
        return Replacement((Cell("RotaryEmbedding", (m.x, m.pos) + caches, (m.out,)),), (m.out,), (m.x, m.pos))
