"""The CPU-runnable form of a bf16 MatMul cell, which ORT runs on its CUDA provider only (no CPU bf16 MatMul kernel).

`expand_bf16_matmuls` rewrites each MatMul whose weight is a bf16 initializer (the compile loop's bf16 cell,
passes.optimize.mapping.bf16_cell) into Cast(a -> fp32), Cast(W -> fp32), an fp32 MatMul and a Cast of the product
back to bf16: the values the GPU kernel reads (a and W already rounded to bf16), accumulated in fp32 as cuBLAS does for
bf16 GEMMs, the product rounded to bf16 as the kernel writes it. The sums' order differs from the GPU's, so the view's
output may differ from the device's by the fp32 accumulation's rounding, far under bf16's. Used on files
(softsyn.flow.cpu_view) and on in-memory protos (softsyn.runtime.design_runner).
"""
from __future__ import annotations

import onnx
from onnx import helper

BF16, FLOAT = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT


def expand_bf16_matmuls(model: onnx.ModelProto) -> int:
    """Rewrite every MatMul of a bf16 weight initializer in place; returns how many nodes changed."""
    graph = model.graph
    bf16 = {t.name for t in graph.initializer if t.data_type == BF16}
    out, changed = [], 0
    for node in graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) < 2 \
                or node.input[1] not in bf16:
            out.append(node)
            continue
        base = f"{node.name or node.output[0]}_cpu_view"
        out += [helper.make_node("Cast", [node.input[0]], [f"{base}_a32"], name=f"{base}_a32_op", to=FLOAT),
                helper.make_node("Cast", [node.input[1]], [f"{base}_w32"], name=f"{base}_w32_op", to=FLOAT),
                helper.make_node("MatMul", [f"{base}_a32", f"{base}_w32"], [f"{base}_y32"], name=node.name),
                helper.make_node("Cast", [f"{base}_y32"], list(node.output), name=f"{base}_y_op", to=BF16)]
        changed += 1
    if changed:
        del graph.node[:]
        graph.node.extend(out)
    return changed
