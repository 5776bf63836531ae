"""MultiHeadAttention (com.microsoft): encoder attention, no KV cache -> one MHA node per layer.

MHA here is bidirectional: it claims sites without a cache, whose mask (if any) is a key-padding mask over
[B, T], passed as key_padding_mask; a causal site without a cache is not its to take.
"""
from __future__ import annotations

import onnx_ir as ir

from softsyn.passes.fuse.attention import AttentionOp, Site, to_bsd
from softsyn.passes.fuse.graph import MS, insert_before, make_node, replace_value


class MultiHeadAttentionRule(AttentionOp):
    target_op = "com.microsoft.MultiHeadAttention"

    def claims(self, ctx, site: Site) -> bool:
        return site.past_k is None

    def check(self, ctx, site: Site):
        if site.causal:
            return "causal attention without a KV cache: not fused (MultiHeadAttention here is bidirectional)"
        if ctx.netlist.kind == "decoder":
            return "attention without a KV cache in a decoder: not fused"
        return site

    def rewrite(self, ctx, m: Site):
        g = ctx.graph
        ctx.use_opset(MS, 1)
        new: list[ir.Node] = []
        anchor = m.softmax
        q = to_bsd(ctx, anchor, m.q, new)
        inputs = [q, m.k_new, m.v_new]  # K and V sources are already [B, T, N*H]
        if m.mask_input is not None:
            cast = make_node(anchor, "", "Cast", [m.mask_input], {"to": ir.DataType.INT32})
            new.append(cast)
            inputs += [None, cast.outputs[0]]   # bias, key_padding_mask [B, T]
        node = make_node(anchor, MS, "MultiHeadAttention", inputs, {"num_heads": m.num_heads, "scale": float(m.scale)})
        node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
        new.append(node)
        insert_before(g, m.out.producer(), new)
        replace_value(g, m.out, node.outputs[0])
