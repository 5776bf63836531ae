"""The CPU-runnable form of GroupQueryAttention nodes that absorbed Qwen3's per-head q/k RMSNorms.

The cuda target's GroupQueryAttention takes q_norm_weight and k_norm_weight: ORT runs that prologue on its CUDA and
WebGPU providers only. `expand_qk_norms` computes the same function with ops the CPU provider has: the norms as
SimplifiedLayerNormalization over each head's features, before the GQA node (which keeps its rotary), exactly the
graph the fusion absorbed. Used on files (softsyn.flow.cpu_view, for verify and run) and on in-memory protos
(passes.optimize.sensitivity, for the compile loop's runs on a machine without the device).
"""
from __future__ import annotations

import onnx
from onnx import helper

Q_NORM, K_NORM = 14, 15  # GroupQueryAttention's q_norm_weight / k_norm_weight inputs


def expand_qk_norms(model: onnx.ModelProto) -> int:
    """Move absorbed q/k norms out of every GroupQueryAttention node, in place; returns how many nodes changed."""
    graph = model.graph
    out, changed = [], 0
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or len(node.input) <= K_NORM or not node.input[Q_NORM]:
            out.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nq, nkv = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
        eps = float(attrs.get("qk_norm_epsilon", 1e-6))
        base = f"{node.name}_cpu_view"
        packed = len(node.input) < 2 or not node.input[1]
        if packed:
            split = f"{base}_split"
            out.append(helper.make_node("Constant", [], [split], name=f"{base}_split_sizes",
                                        value=helper.make_tensor(split, onnx.TensorProto.INT64, [3], [nq, nkv, nkv])))
            heads = [f"{base}_{x}_heads" for x in "qkv"]
            shape = f"{base}_heads_shape"
            out.append(helper.make_node("Constant", [], [shape], name=f"{base}_heads_shape_c",
                                        value=helper.make_tensor(shape, onnx.TensorProto.INT64, [4],
                                                                 [0, 0, nq + 2 * nkv, -1])))
            grouped = f"{base}_grouped"
            out.append(helper.make_node("Reshape", [node.input[0], shape], [grouped], name=f"{base}_group"))
            out.append(helper.make_node("Split", [grouped, split], heads, name=f"{base}_split_heads", axis=2))
            q, k, v = heads
        else:
            q, k, v = node.input[0], node.input[1], node.input[2]
        normed = []
        for x, w, tag, n in ((q, node.input[Q_NORM], "q", nq), (k, node.input[K_NORM], "k", nkv)):
            src = x
            if not packed:  # [B, S, N*H] -> [B, S, N, H]
                shape = f"{base}_{tag}_shape"
                out.append(helper.make_node("Constant", [], [shape], name=f"{base}_{tag}_shape_c",
                                            value=helper.make_tensor(shape, onnx.TensorProto.INT64, [4], [0, 0, n, -1])))
                src = f"{base}_{tag}_4d"
                out.append(helper.make_node("Reshape", [x, shape], [src], name=f"{base}_{tag}_to_heads"))
            y = f"{base}_{tag}_normed"
            out.append(helper.make_node("SimplifiedLayerNormalization", [src, w], [y], name=f"{base}_{tag}_norm",
                                        axis=-1, epsilon=eps))
            normed.append(y)
        flat = f"{base}_flat"
        out.append(helper.make_node("Constant", [], [flat], name=f"{base}_flat_c",
                                    value=helper.make_tensor(flat, onnx.TensorProto.INT64, [3], [0, 0, -1])))
        if packed:
            merged = f"{base}_merged"
            out.append(helper.make_node("Concat", [normed[0], normed[1], v], [merged], name=f"{base}_concat", axis=2))
            query = f"{base}_query"
            out.append(helper.make_node("Reshape", [merged, flat], [query], name=f"{base}_unheads"))
            new_inputs = [query] + list(node.input[1:Q_NORM])
        else:
            qf, kf = f"{base}_q_flat", f"{base}_k_flat"
            out.append(helper.make_node("Reshape", [normed[0], flat], [qf], name=f"{base}_q_unheads"))
            out.append(helper.make_node("Reshape", [normed[1], flat], [kf], name=f"{base}_k_unheads"))
            new_inputs = [qf, kf] + list(node.input[2:Q_NORM])
        while new_inputs and not new_inputs[-1]:
            new_inputs.pop()
        del node.input[:]
        node.input.extend(new_inputs)
        kept = [a for a in node.attribute if a.name != "qk_norm_epsilon"]
        del node.attribute[:]
        node.attribute.extend(kept)
        out.append(node)
        changed += 1
    del graph.node[:]
    graph.node.extend(out)
    return changed
