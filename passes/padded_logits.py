"""Last-position logits at each row's last real token, for right-padded prompts (serving.prompt_buckets).

A serving engine that pads prompts up to a bucket length meets a few prefill shapes instead of one per prompt
length. GroupQueryAttention already serves such a prompt: the causal mask keeps every real position's output and
KV from the padding behind it, and seqlens_k (the attention mask's row sums - 1) tells the next decode where the
real sequence ends (ORT CPU, qwen3-tiny, 11 tokens padded to 16: the KV of the 11 positions bit-identical to the
unpadded run's, 2026-12-06). What breaks is the logits: kv_layout's Slice takes the last position, a padding one.
Here the lm_head's input is gathered per row at

    index = clamp(seqlens_k - (total_sequence_length - seq), 0, seq - 1)

which is the row's last real token in a prefill (total = seq: its real length - 1) and 0 in a decode step (seq 1,
whatever the row's length), from the values GroupQueryAttention already reads; 14 small nodes where the Slice was one.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.fuse.graph import add_initializer, make_node

GQA_SEQLENS, GQA_TOTAL = 5, 6  # GroupQueryAttention's seqlens_k and total_sequence_length inputs


def gather_last_real(graph: ir.Graph, head: ir.Node, x: ir.Value, gqa: ir.Node, hierarchy: str) -> ir.Value:
    """Nodes before `head` (the lm_head reading x [batch, seq, hidden]) that give x at each row's last real position,
    [batch, 1, hidden]; `gqa` supplies seqlens_k and total_sequence_length."""
    nodes: list[ir.Node] = []

    def node(op: str, inputs, **attrs) -> ir.Value:
        n = make_node(head, "", op, inputs, attrs or None, hierarchy=hierarchy)
        nodes.append(n)
        return n.outputs[0]

    def const(name: str, values) -> ir.Value:
        return add_initializer(graph, f"padded_logits_{name}", np.asarray(values, dtype=np.int64))

    shape = node("Shape", [x])
    seq = node("Gather", [shape, const("one_index", [1])], axis=0)
    total = node("Cast", [gqa.inputs[GQA_TOTAL]], to=ir.DataType.INT64)
    past = node("Sub", [total, seq])
    lengths = node("Cast", [gqa.inputs[GQA_SEQLENS]], to=ir.DataType.INT64)
    index = node("Sub", [lengths, past])
    last = node("Sub", [seq, const("one", [1])])
    index = node("Min", [node("Max", [index, const("zero", [0])]), last])
    index = node("Unsqueeze", [index, const("axes", [1, 2])])
    target = node("Add", [node("Mul", [shape, const("keep_batch_hidden", [1, 0, 1])]), const("one_position", [0, 1, 0])])
    out = node("GatherElements", [x, node("Expand", [index, target])], axis=1)
    out.shape = ir.Shape([x.shape[0], 1, x.shape[2]])
    out.type = x.type
    graph.insert_before(head, nodes)
    return out
