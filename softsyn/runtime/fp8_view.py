"""The CPU-runnable form of com.microsoft.MatMulBlockQuantizedFp8Weight, which ORT runs on its CUDA provider only.

`expand_fp8_matmuls` rewrites each such node whose B is an initializer into ops every opset the exporter writes has:
B's bytes retyped uint8 (the same bytes: e4m3fn has no other layout) and decoded through a 256-entry fp32 table
(Gather; Cast from float8 needs opset 19), each value times its block's scale (b_scale gathered along K by the
block index k // block_size), cast to the activation type, transposed to [K, N] and multiplied: the op's
`A @ (fp8_e4m3(B) * b_scale)^T (+ bias)`. W8A8 nodes (an a_scale) are left as they are: the CPU session then says
it has no kernel. Used on files (softsyn.flow.cpu_view) and on in-memory protos (passes.optimize.sensitivity).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

OP = "MatMulBlockQuantizedFp8Weight"
A_SCALE, BIAS = 3, 4  # the op's optional inputs


def e4m3_table() -> np.ndarray:
    """fp32 value of every float8e4m3fn byte (0x7F / 0xFF are NaN)."""
    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def _value_type(model: onnx.ModelProto, name: str) -> int | None:
    for v in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if v.name == name and v.type.tensor_type.elem_type:
            return v.type.tensor_type.elem_type
    return None


def expand_fp8_matmuls(model: onnx.ModelProto, external: dict | None = None) -> int:
    """Rewrite every weight-only MatMulBlockQuantizedFp8Weight in place; returns how many nodes changed. `external`:
    name -> (elem, array) of initializers the session gets as arrays (sensitivity's): retyped there too."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    out, changed, retyped = [], 0, set()
    table = None
    for node in graph.node:
        ins = list(node.input) + [""] * (BIAS + 1 - len(node.input))
        if node.op_type != OP or node.domain != "com.microsoft" or ins[A_SCALE] or ins[1] not in inits:
            out.append(node)
            continue
        b = inits[ins[1]]
        k = int(b.dims[1])  # B is [N, K]
        block = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "block_size"), 128)
        act = _value_type(model, ins[0]) or _value_type(model, node.output[0]) or onnx.TensorProto.FLOAT16
        if table is None:
            table = f"{OP}_cpu_view_e4m3"
            graph.initializer.append(numpy_helper.from_array(e4m3_table(), table))
        if b.name not in retyped:
            b.data_type = onnx.TensorProto.UINT8
            if external and b.name in external:
                external[b.name] = (onnx.TensorProto.UINT8, np.ascontiguousarray(external[b.name][1]).view(np.uint8))
            retyped.add(b.name)
        base = f"{node.name or node.output[0]}_cpu_view"
        index = f"{base}_block_index"
        graph.initializer.append(numpy_helper.from_array(np.arange(k, dtype=np.int64) // int(block), index))
        step = [("Cast", [b.name], "codes", {"to": onnx.TensorProto.INT32}),
                ("Gather", [table, f"{base}_codes"], "values", {"axis": 0}),
                ("Gather", [ins[2], index], "scales", {"axis": 1}),  # [N, ceil(K/block)] -> [N, K]
                ("Mul", [f"{base}_values", f"{base}_scales"], "weight32", {}),
                ("Cast", [f"{base}_weight32"], "weight", {"to": act}),
                ("Transpose", [f"{base}_weight"], "weight_t", {"perm": [1, 0]})]
        for op, args, res, attrs in step:
            out.append(helper.make_node(op, args, [f"{base}_{res}"], name=f"{base}_{res}_op", **attrs))
        y = node.output[0]
        if ins[BIAS]:
            out.append(helper.make_node("MatMul", [ins[0], f"{base}_weight_t"], [f"{base}_matmul"],
                                        name=f"{base}_matmul_op"))
            out.append(helper.make_node("Add", [f"{base}_matmul", ins[BIAS]], [y], name=node.name))
        else:
            out.append(helper.make_node("MatMul", [ins[0], f"{base}_weight_t"], [y], name=node.name))
        changed += 1
    if changed:
        del graph.node[:]
        graph.node.extend(out)
    return changed
