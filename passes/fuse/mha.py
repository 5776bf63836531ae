"""MultiHeadAttention (com.microsoft): encoder attention, no KV cache -> one MHA node per layer.

MHA here is bidirectional: it claims sites without a cache and without a causal mask (GroupQueryAttention
takes the causal ones); their mask, if any, is a key-padding mask over [B, T], passed as key_padding_mask.
K and V go in as the site has them: [B, T, N*H] projections, or per head [B, N, T, H] where the rotary was applied
after the heads were split (a ViT's, Qwen3-VL's vision blocks): ORT's CPU and CUDA kernels take 4-D key/value
without a past (the cross-attention form, no bias input); the query is always [B, S, N*H].
"""
from __future__ import annotations

import onnx_ir as ir

from passes.fuse.attention import AttentionOp, Site, bsd_source, bsd_stand_in, fused_output, to_bsd
from passes.fuse.base import Cell, Replacement, stand_in
from passes.fuse.graph import MS, fresh, insert_before, make_node, replace_value


class MultiHeadAttentionRule(AttentionOp):
    target_op = "com.microsoft.MultiHeadAttention"

    def claims(self, ctx, site: Site) -> bool:
        return site.past_k is None

    def check(self, ctx, site: Site):
        if site.kv_heads != site.num_heads:
            return (f"{site.kv_heads} KV heads for {site.num_heads} query heads, not causal: MultiHeadAttention "
                    "takes one K/V head per query head")
        if site.softcap:
            return f"soft-capped scores (softcap {site.softcap:g}): MultiHeadAttention has no softcap"
        if ctx.netlist.kind == "decoder":
            return "attention without a KV cache in a decoder: not fused"
        return site

    def rewrite(self, ctx, m: Site):
        g = ctx.graph
        ctx.use_opset(MS, 1)
        new: list[ir.Node] = []
        anchor = m.softmax
        q = to_bsd(ctx, anchor, m.q, new)
        inputs = [q, m.k_new, m.v_new]  # K and V as the site has them: [B, T, N*H], or [B, N, T, H] (kv_bnsh)
        if m.mask_input is not None:
            cast = make_node(anchor, "", "Cast", [m.mask_input], {"to": ir.DataType.INT32})
            new.append(cast)
            inputs += [None, cast.outputs[0]]   # bias, key_padding_mask [B, T]
        node = make_node(anchor, MS, "MultiHeadAttention", inputs, {"num_heads": m.num_heads, "scale": float(m.scale)})
        new.append(node)
        out = fused_output(ctx, m, node, new)
        insert_before(g, m.out.producer(), new)
        replace_value(g, m.out, out)

    def replacement(self, ctx, m: Site) -> Replacement:
        q = bsd_stand_in(m.q)
        out = stand_in(fresh("mha_out"), [m.q.shape[0], m.q.shape[2], m.num_heads * m.head_size], m.q.dtype)
        cell = Cell("MultiHeadAttention", (q, m.k_new, m.v_new), (out,), {"num_heads": m.num_heads})
        reads = (bsd_source(m.q), m.k_new, m.v_new) + ((m.mask_input,) if m.mask_input is not None else ())
        return Replacement((cell,), (m.out,), reads)
