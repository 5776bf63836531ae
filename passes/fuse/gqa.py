"""GroupQueryAttention (com.microsoft): decoder attention over a KV cache -> one GQA node per layer.

GQA is always causal and takes K/V with their own (fewer) heads, so a site is GQA's when it appends to a KV
cache; its mask must be causal (+ key padding). The node reads the new K/V as [B, S, Nkv*H], the past cache
as is, and the lengths every layer shares (seqlens_k = valid tokens - 1 per row, total_sequence_length). On
cuda it also takes over the rotary and q/k norms around it (gqa_absorb).
"""
from __future__ import annotations

import onnx_ir as ir

from softsyn.passes.fuse.attention import AttentionOp, Site, to_bsd
from softsyn.passes.fuse.gqa_absorb import absorb_into, absorb_note
from softsyn.passes.fuse.graph import MS, attr, dim, insert_before, int64, make_node, replace_value


class GroupQueryAttentionRule(AttentionOp):
    target_op = "com.microsoft.GroupQueryAttention"

    def claims(self, ctx, site: Site) -> bool:
        return site.past_k is not None

    def check(self, ctx, site: Site):
        if not site.causal:
            return "decoder attention without a causal mask (GroupQueryAttention is always causal)"
        if dim(site.past_k, 3) != site.head_size:
            return f"past key head size {dim(site.past_k, 3)} differs from Q's {site.head_size}"
        return site

    def rewrite(self, ctx, m: Site):
        g = ctx.graph
        ctx.use_opset(MS, 1)
        new: list[ir.Node] = []
        anchor = m.softmax
        q = to_bsd(ctx, anchor, m.q, new)
        k = to_bsd(ctx, anchor, m.k_new, new)
        v = to_bsd(ctx, anchor, m.v_new, new)
        seqlens, total = self._lengths(ctx, anchor, m, q, new)
        inputs = [q, k, v, m.past_k, m.past_v, seqlens, total]
        attrs = {"num_heads": m.num_heads, "kv_num_heads": m.kv_heads, "scale": float(m.scale)}
        if ctx.target == "cuda":
            absorb_into(ctx, ctx.site(anchor), inputs, attrs, m.num_heads, m.kv_heads)
        node = make_node(anchor, MS, "GroupQueryAttention", inputs, attrs, num_outputs=3)
        node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
        node.outputs[1].shape, node.outputs[1].type = m.present_k.shape, m.present_k.type
        node.outputs[2].shape, node.outputs[2].type = m.present_v.shape, m.present_v.type
        new.append(node)
        insert_before(g, m.out.producer(), new)
        replace_value(g, m.out, node.outputs[0])
        replace_value(g, m.present_k, node.outputs[1])
        replace_value(g, m.present_v, node.outputs[2])

    def note(self, ctx):
        return absorb_note(ctx)

    def _lengths(self, ctx, anchor, m: Site, q, new):
        """seqlens_k = sum(mask, 1) - 1 (int32 [B]); total_sequence_length = mask.shape[1] (int32 scalar).
        Without a mask input: both from past length + new tokens. Shared by every layer."""
        key = ("gqa-lengths", id(m.mask_input) if m.mask_input is not None else id(m.past_k))
        if key in ctx.cache:
            return ctx.cache[key]
        g = ctx.graph
        if m.mask_input is not None:
            mask = m.mask_input
            red = make_node(anchor, "", "ReduceSum", [mask, int64(g, "axis1", [1])], {"keepdims": 0})
            one = int64(g, "one", 1)
            if mask.dtype != ir.DataType.INT64:
                c = make_node(anchor, "", "Cast", [mask], {"to": ir.DataType.INT64})
                red.replace_input_with(0, c.outputs[0])
                new.append(c)
            sub = make_node(anchor, "", "Sub", [red.outputs[0], one])
            seq32 = make_node(anchor, "", "Cast", [sub.outputs[0]], {"to": ir.DataType.INT32})
            shp = make_node(anchor, "", "Shape", [mask], {"start": 1, "end": 2})
            new += [red, sub, seq32, shp]
            total_src = shp.outputs[0]
            batch_src = None
        else:
            sp = make_node(anchor, "", "Shape", [m.past_k], {"start": 2, "end": 3})
            sq = make_node(anchor, "", "Shape", [q], {"start": 1, "end": 2})
            add = make_node(anchor, "", "Add", [sp.outputs[0], sq.outputs[0]])
            bq = make_node(anchor, "", "Shape", [q], {"start": 0, "end": 1})
            new += [sp, sq, add, bq]
            total_src, batch_src = add.outputs[0], bq.outputs[0]
        sqz = make_node(anchor, "", "Squeeze", [total_src, int64(g, "axis0", [0])])
        tot32 = make_node(anchor, "", "Cast", [sqz.outputs[0]], {"to": ir.DataType.INT32})
        new += [sqz, tot32]
        if batch_src is not None:
            minus = make_node(anchor, "", "Sub", [total_src, int64(g, "one", [1])])
            exp = make_node(anchor, "", "Expand", [minus.outputs[0], batch_src])
            seq32 = make_node(anchor, "", "Cast", [exp.outputs[0]], {"to": ir.DataType.INT32})
            new += [minus, exp, seq32]
        for n in new:
            if n.op_type == "Cast" and n.outputs[0].type is None:
                n.outputs[0].type = ir.TensorType(ir.DataType(attr(n, "to")))
        ctx.cache[key] = (seq32.outputs[0], tot32.outputs[0])
        return ctx.cache[key]


