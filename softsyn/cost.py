"""Work per cell: FLOPs and bytes moved, from shapes bound to a scenario.

These two numbers feed the roofline estimate (library.delay) and the reports.
Bytes count what a kernel must touch in memory: every input it reads in full
(weights included), the output it writes, and nothing for view ops the runtime
does without a copy. Gather reads only the rows it gathers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

Shapes = dict[str, tuple[int, ...]]

# Ops the runtime executes without moving data (metadata only or buffer reuse).
VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant", "ConstantOfShape"}
# Ops that move data without arithmetic.
MOVE_OPS = {"Transpose", "Concat", "Split", "Slice", "Expand", "Tile", "Pad", "ScatterND", "ScatterElements",
            "GatherND", "GatherElements", "Cast", "CastLike", "Where", "Trilu", "Range", "Resize"}
# FLOPs per output element for reductions and normalisations (per input element).
PER_INPUT_ELEMENT = {"ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceL2": 2,
                     "Softmax": 5, "LogSoftmax": 5, "LayerNormalization": 8, "SimplifiedLayerNormalization": 5,
                     "SkipLayerNormalization": 9, "SkipSimplifiedLayerNormalization": 6, "RMSNormalization": 5,
                     "ArgMax": 1, "TopK": 2, "CumSum": 1}
# FLOPs per output element for element-wise math that is more than one operation.
PER_OUTPUT_ELEMENT = {"Gelu": 8, "FastGelu": 8, "BiasGelu": 9, "Erf": 8, "Tanh": 6, "Sigmoid": 4, "Exp": 4,
                      "Log": 4, "Pow": 4, "Sqrt": 2, "Reciprocal": 1, "Softplus": 5, "HardSigmoid": 2,
                      "QuickGelu": 5, "RotaryEmbedding": 3}

PRECISION_BY_DTYPE = {
    ir.DataType.FLOAT: "fp32", ir.DataType.DOUBLE: "fp64", ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16",
    ir.DataType.FLOAT8E4M3FN: "fp8", ir.DataType.FLOAT8E5M2: "fp8", ir.DataType.FLOAT8E4M3FNUZ: "fp8",
    ir.DataType.FLOAT8E5M2FNUZ: "fp8", ir.DataType.INT8: "int8", ir.DataType.UINT8: "int8",
    ir.DataType.INT4: "int4", ir.DataType.UINT4: "int4",
}


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    sizes: dict  # the problem-size indices a delay table looks up (e.g. m, n, k)


def numel(shape: tuple[int, ...] | None) -> int:
    return math.prod(shape) if shape is not None else 0


def value_bytes(value: ir.Value | None, shapes: Shapes) -> float:
    if value is None or value.dtype is None:
        return 0.0
    return numel(shape_of(value, shapes)) * value.dtype.itemsize


def shape_of(value: ir.Value, shapes: Shapes) -> tuple[int, ...] | None:
    shape = shapes.get(value.name)
    if shape is None and value.shape is not None and value.shape.is_static():
        shape = tuple(value.shape.numpy())
    return shape


def precision_of(node: ir.Node) -> str:
    """The arithmetic precision of a cell: its weight dtype where it has one, else its first float input."""
    candidates = [v for v in node.inputs if v is not None and v.dtype is not None]
    weights = [v for v in candidates if v.is_initializer() and v.dtype in PRECISION_BY_DTYPE]
    for v in weights + candidates + [o for o in node.outputs if o.dtype is not None]:
        if v.dtype in PRECISION_BY_DTYPE:
            return PRECISION_BY_DTYPE[v.dtype]
    return "fp32"


def node_work(node: ir.Node, shapes: Shapes) -> Work:
    op = node.op_type
    ins = [v for v in node.inputs if v is not None]
    out_bytes = sum(value_bytes(o, shapes) for o in node.outputs)
    in_bytes = sum(value_bytes(v, shapes) for v in ins)
    out_elems = sum(numel(shape_of(o, shapes)) for o in node.outputs)

    if op in VIEW_OPS:
        return Work(0.0, 0.0, {})
    if op in ("MatMul", "Gemm", "FusedMatMul") and len(ins) >= 2:
        return _matmul(node, ins, shapes, in_bytes, out_bytes)
    if op in ("Conv", "ConvTranspose") and len(ins) >= 2:
        w = shape_of(ins[1], shapes) or ()
        per_out = 2 * numel(w[1:]) if len(w) > 1 else 2
        return Work(float(out_elems * per_out), in_bytes + out_bytes, {"out": out_elems})
    if op == "Gather":
        # Embedding lookups read the gathered rows, not the table.
        indices = value_bytes(ins[1], shapes) if len(ins) > 1 else 0.0
        return Work(0.0, 2 * out_bytes + indices, {"rows": out_elems})
    if op in MOVE_OPS:
        return Work(0.0, in_bytes + out_bytes, {"elements": out_elems})
    if op in PER_INPUT_ELEMENT:
        in_elems = numel(shape_of(ins[0], shapes)) if ins else 0
        return Work(float(PER_INPUT_ELEMENT[op] * in_elems), in_bytes + out_bytes, {"elements": in_elems})
    return Work(float(PER_OUTPUT_ELEMENT.get(op, 1) * out_elems), in_bytes + out_bytes, {"elements": out_elems})


def _matmul(node: ir.Node, ins: list[ir.Value], shapes: Shapes, in_bytes: float, out_bytes: float) -> Work:
    a = shape_of(ins[0], shapes)
    b = shape_of(ins[1], shapes)
    out = shape_of(node.outputs[0], shapes)
    if not a or not b or not out:
        return Work(0.0, in_bytes + out_bytes, {})
    if node.op_type == "Gemm":
        trans_a = node.attributes.get_int("transA", 0)
        k = a[0] if trans_a else a[-1]
    else:
        k = a[-1]
    m = numel(out[:-1]) if len(out) > 1 else 1
    n = out[-1]
    return Work(2.0 * m * n * k, in_bytes + out_bytes, {"m": m, "n": n, "k": k})
