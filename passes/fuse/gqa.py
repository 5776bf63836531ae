"""GroupQueryAttention (com.microsoft): causal attention -> one GQA node per layer.

GQA is always causal and takes K/V with their own (fewer) heads. It claims a site that appends to a KV cache
(softsyn's own decoder exports: its mask must be causal + key padding) and a causal site without a cache (a
plain decoder export: past_key/past_value left out, the presents computed but unused). MultiHeadAttention
(unidirectional=1) would need K/V repeated to every head, and under a padding mask it gives NaN for a query row
with no open key on ORT CPU; ORT's CPU and CUDA providers both run GQA without a past. The node reads the new K/V
as [B, S, Nkv*H], the past cache as is, and the lengths every layer shares (seqlens_k = valid tokens - 1 per row,
total_sequence_length). A site without a cache under a padding mask takes that mask as attention_bias on cpu
(gqa_padding). On cuda the node also takes over the rotary and q/k norms around it (gqa_absorb).
"""
from __future__ import annotations

from dataclasses import replace

import onnx_ir as ir

from passes.fuse import gqa_padding
from passes.fuse.attention import AttentionOp, Site, bsd_source, bsd_stand_in, fused_output, to_bsd
from passes.fuse.base import Cell, Replacement, stand_in
from passes.fuse.gqa_absorb import absorb_into, absorb_note
from passes.fuse.graph import MS, attr, dim, fresh, insert_before, int64, make_node, replace_value
from passes.fuse.window import window_attrs


class GroupQueryAttentionRule(AttentionOp):
    target_op = "com.microsoft.GroupQueryAttention"

    def claims(self, ctx, site: Site) -> bool:
        return site.past_k is not None or site.causal

    def check(self, ctx, site: Site):
        if not site.causal:
            return "decoder attention without a causal mask (GroupQueryAttention is always causal)"
        if site.kv_bnsh:
            return (f"K/V sources {site.k_new.name}, {site.v_new.name} are per head [B, Nkv, T, H] without a KV cache: "
                    "GroupQueryAttention takes new K/V as [B, T, Nkv*H] (not fused)")
        if site.past_k is not None and dim(site.past_k, 3) != site.head_size:
            return f"past key head size {dim(site.past_k, 3)} differs from Q's {site.head_size}"
        if gqa_padding.uses_bias(ctx, site):
            causal = gqa_padding.check_bias(ctx, site)
            if isinstance(causal, str):
                return causal
            ctx.cache.setdefault("gqa-bias-causal", {})[id(site.softmax)] = causal
        return site

    def rewrite(self, ctx, m: Site):
        g = ctx.graph
        ctx.use_opset(MS, 1)
        new: list[ir.Node] = []
        anchor = m.softmax
        q = to_bsd(ctx, anchor, m.q, new)
        if m.past_k is not None:
            k, v = to_bsd(ctx, anchor, m.k_new, new), to_bsd(ctx, anchor, m.v_new, new)
        else:  # the projections, already [B, T, Nkv*H]
            k, v = m.k_new, m.v_new
        padded = gqa_padding.uses_bias(ctx, m)
        # with the mask as attention_bias every row's keys count (seqlens_k = T - 1), as without a mask
        seqlens, total = self._lengths(ctx, anchor, replace(m, mask_input=None) if padded else m, q, new)
        inputs = [q, k, v, m.past_k, m.past_v, seqlens, total]
        attrs = {"num_heads": m.num_heads, "kv_num_heads": m.kv_heads, "scale": float(m.scale)} | window_attrs(m)
        if padded:
            inputs = gqa_padding.bias_input(inputs, m)
            attrs.pop("local_window_size", None)  # the bias holds the window, as it holds the causal mask
            if not ctx.cache["gqa-bias-causal"][id(m.softmax)]:
                attrs["causal"] = 0  # a finite mask: the mask alone, as the export's Softmax reads it
        if m.past_k is None and m.mask_input is not None:
            ctx.cache["gqa-padding"] = ctx.cache.get("gqa-padding", 0) + 1
        if ctx.target == "cuda":
            absorb_into(ctx, ctx.site(anchor), inputs, attrs, m.num_heads, m.kv_heads)
        node = make_node(anchor, MS, "GroupQueryAttention", inputs, attrs, num_outputs=3)
        for o, like in zip(node.outputs[1:], self._presents(m)):
            o.shape, o.type = like.shape, like.type
        new.append(node)
        out = fused_output(ctx, m, node, new)
        insert_before(g, m.out.producer(), new)
        replace_value(g, m.out, out)
        if m.past_k is not None:
            replace_value(g, m.present_k, node.outputs[1])
            replace_value(g, m.present_v, node.outputs[2])

    def replacement(self, ctx, m: Site) -> Replacement:
        q = bsd_stand_in(m.q)
        k, v = (bsd_stand_in(m.k_new), bsd_stand_in(m.v_new)) if m.past_k is not None else (m.k_new, m.v_new)
        batch = [m.q.shape[0]] if m.q.shape is not None else None
        lengths = (stand_in(fresh("seqlens_k"), batch, ir.DataType.INT32),
                   stand_in(fresh("total_sequence_length"), [], ir.DataType.INT32))
        bias = (None, None, None, m.bias) if gqa_padding.uses_bias(ctx, m) else ()
        cell = Cell("GroupQueryAttention", (q, k, v, m.past_k, m.past_v) + lengths + bias,
                    (stand_in(fresh("gqa_out"), [m.q.shape[0], m.q.shape[2], m.num_heads * m.head_size], m.q.dtype),)
                    + self._presents(m), {"num_heads": m.num_heads, "kv_num_heads": m.kv_heads} | window_attrs(m))
        replaces = (m.out,) if m.past_k is None else (m.out, m.present_k, m.present_v)
        sources = (bsd_source(m.q),) + ((bsd_source(m.k_new), bsd_source(m.v_new)) if m.past_k is not None else (k, v))
        reads = tuple(x for x in sources + (m.past_k, m.past_v, m.mask_input) + bias[3:] if x is not None)
        return Replacement((cell,), replaces, reads)

    def note(self, ctx):
        return "; ".join(n for n in (absorb_note(ctx), gqa_padding.note(ctx, ctx.cache.get("gqa-padding", 0))) if n)

    @staticmethod
    def _presents(m: Site) -> tuple[ir.Value, ir.Value]:
        """The present K/V the node outputs: the cache Concats' values, or without a cache [B, Nkv, T, H]
        stand-ins (outputs the graph does not read)."""
        if m.past_k is not None:
            return m.present_k, m.present_v
        shape = None if m.k_new.shape is None else [m.k_new.shape[0], m.kv_heads, m.k_new.shape[1], m.head_size]
        return (stand_in(fresh("present_key"), shape, m.k_new.dtype),
                stand_in(fresh("present_value"), shape, m.v_new.dtype))

    def _lengths(self, ctx, anchor, m: Site, q, new):
        """seqlens_k = sum(mask, 1) - 1 (int32 [B]); total_sequence_length = mask.shape[1] (int32 scalar).
        Without a mask input: both from past length + new tokens (no past: the new tokens). Shared by every
        layer."""
        key = ("gqa-lengths", id(m.mask_input) if m.mask_input is not None else id(m.past_k) if m.past_k is not None
               else "no past")
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
            sq = make_node(anchor, "", "Shape", [q], {"start": 1, "end": 2})
            bq = make_node(anchor, "", "Shape", [q], {"start": 0, "end": 1})
            if m.past_k is not None:
                sp = make_node(anchor, "", "Shape", [m.past_k], {"start": 2, "end": 3})
                add = make_node(anchor, "", "Add", [sp.outputs[0], sq.outputs[0]])
                new += [sp, sq, add, bq]
                total_src = add.outputs[0]
            else:
                new += [sq, bq]
                total_src = sq.outputs[0]
            batch_src = bq.outputs[0]
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
