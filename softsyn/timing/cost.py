"""Work per cell: FLOPs, bytes moved and the size indices of its delay table, from bound shapes.

FLOPs and bytes feed the roofline estimate (library.delay) and the reports. Bytes count what a
kernel must touch in memory: every input it reads in full (weights included), the output it writes,
and nothing for view ops the runtime does without a copy. Gather reads only the rows it gathers.

`Work.sizes` are exactly the axes of the library's delay tables (softsyn/characterize/recipes.py builds the
characterisation graphs on the same conventions):

| op | sizes |
|---|---|
| MatMul, B of rank 2 (a weight), Gemm, FusedMatMul | m (product of the output's leading dims), n, k |
| MatMul, B of rank >= 3 (two activations) | batch (product of the output's leading dims but the last two), m, n, k |
| MatMulNBits | m, n, k, block (precision int4/int8 from `bits`) |
| MatMulBlockQuantizedFp8Weight | m, n, k, block (precision fp8; B is [N, K], fp32 scales per block along K) |
| GroupQueryAttention, MultiHeadAttention, Attention | batch, q_tokens, kv_len, heads, kv_heads, head_dim (tables: q_tokens x kv_len x heads; batch and head_dim by the cell's scale rule) |
| MoE, QMoE | tokens, experts, k, hidden, inter |
| reductions, Softmax, norms, TopK | elements = input elements |
| everything else (element-wise, moves, views, Gather) | elements = output elements |
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import onnx.defs
import onnx_ir as ir

from softsyn.netlist.keys import FP8_MATMUL

Shapes = dict[str, tuple[int, ...]]

# Ops the runtime executes without moving data (metadata only or buffer reuse).
VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant", "ConstantOfShape"}
# Ops whose output has their first input's dtype.
DTYPE_PRESERVING = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Expand",
                    "Concat", "Split", "Gather", "Tile", "Pad"}
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
QUANTISED_CACHE = {ir.DataType.INT8: "int8", ir.DataType.FLOAT8E4M3FN: "fp8"}  # GQA past dtype -> cell precision
ATTENTION_OPS = {"GroupQueryAttention", "MultiHeadAttention", "Attention"}
MOE_OPS = {"MoE", "QMoE"}
LINEAR_ATTENTION = "LinearAttention"  # com.microsoft's recurrent linear attention (the gated delta rule)
# FLOPs per state element per token of the gated delta rule: decay, S^T k (2), delta, outer product (2), read (2)
DELTA_RULE_FLOPS = 8
# Ops with a rule of their own in node_work; any other standard ONNX op counts 1 FLOP per output element.
MODELLED = (VIEW_OPS | MOVE_OPS | set(PER_INPUT_ELEMENT) | set(PER_OUTPUT_ELEMENT) | ATTENTION_OPS | MOE_OPS
            | {"MatMul", "Gemm", "FusedMatMul", "MatMulNBits", FP8_MATMUL, "QuantizeLinear", "DequantizeLinear",
               "DynamicQuantizeLinear", "Conv", "ConvTranspose", "Gather", LINEAR_ATTENTION})


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    sizes: dict  # the problem-size indices a delay table looks up (e.g. m, n, k)


def numel(shape: tuple[int, ...] | None) -> int:
    return math.prod(shape) if shape is not None else 0


def value_bytes(value: ir.Value | None, shapes: Shapes) -> float:
    dtype = dtype_of(value)
    if dtype is None:
        return 0.0
    return numel(shape_of(value, shapes)) * dtype.itemsize


def dtype_of(value: ir.Value | None) -> ir.DataType | None:
    """A value's dtype; where the exporter left it out, that of the layout op's data input it came from."""
    while value is not None and value.dtype is None:
        producer = value.producer()
        if producer is None or producer.op_type not in DTYPE_PRESERVING or not producer.inputs:
            return None
        value = producer.inputs[0]
    return None if value is None else value.dtype


def shape_of(value: ir.Value, shapes: Shapes) -> tuple[int, ...] | None:
    shape = shapes.get(value.name)
    if shape is None and value.shape is not None and value.shape.is_static():
        shape = tuple(value.shape.numpy())
    return shape


def precision_of(node: ir.Node) -> str:
    """The arithmetic precision of a cell: its weight dtype where it has one, else its first float input.

    MatMulNBits / QMoE: int4 or int8 from the `bits` / `expert_weight_bits` attribute (the packed weight
    is uint8 whatever the bit width). GroupQueryAttention with a quantised cache (kv_layout's int8 past/present):
    the cache's dtype, its library cell GroupQueryAttention.int8 (fp16 activations). Ops without a float tensor
    (shape arithmetic on int64, bool logic) are "fp32", the library's default precision for such cells.
    """
    if node.op_type == "MatMulNBits":
        return "int8" if node.attributes.get_int("bits", 4) == 8 else "int4"
    if node.op_type == "QMoE":
        return "int8" if node.attributes.get_int("expert_weight_bits", 4) == 8 else "int4"
    if node.op_type == FP8_MATMUL:  # its fp32 scales are initializers too: the fp8 weight decides
        return "fp8"
    if node.op_type == "GroupQueryAttention" and len(node.inputs) > 3 and node.inputs[3] is not None \
            and node.inputs[3].dtype in QUANTISED_CACHE:
        return QUANTISED_CACHE[node.inputs[3].dtype]
    candidates = [v for v in node.inputs if v is not None and v.dtype is not None]
    weights = [v for v in candidates if v.is_initializer() and v.dtype in PRECISION_BY_DTYPE]
    for v in weights + candidates + [o for o in node.outputs if o.dtype is not None]:
        if v.dtype in PRECISION_BY_DTYPE:
            return PRECISION_BY_DTYPE[v.dtype]
    return "fp32"


def has_cost_model(node: ir.Node) -> bool:
    """Whether node_work knows the op: a rule of its own, or a standard ONNX op (an element-wise count)."""
    if node.op_type in MODELLED:
        return True
    return node.domain in ("", "ai.onnx") and onnx.defs.has(node.op_type)


def node_work(node: ir.Node, shapes: Shapes) -> Work:
    """FLOPs, bytes and table sizes of one cell; 0 work for an op the cost model does not know (has_cost_model)."""
    op = node.op_type
    if not has_cost_model(node):
        return Work(0.0, 0.0, {})
    ins = [v for v in node.inputs if v is not None]
    out_bytes = sum(value_bytes(o, shapes) for o in node.outputs)
    in_bytes = sum(value_bytes(v, shapes) for v in ins)
    out_elems = sum(numel(shape_of(o, shapes)) for o in node.outputs)

    if op in VIEW_OPS:
        return Work(0.0, 0.0, {"elements": out_elems})
    if op in ("MatMul", "Gemm", "FusedMatMul") and len(ins) >= 2:
        return _matmul(node, ins, shapes, in_bytes, out_bytes)
    if op == "MatMulNBits" and ins:
        return _matmul_nbits(node, ins, shapes, out_bytes)
    if op == FP8_MATMUL and len(ins) >= 3:
        return _matmul_fp8(node, ins, shapes, in_bytes, out_bytes)
    if op in ATTENTION_OPS and ins:
        return _attention(node, ins, shapes, in_bytes, out_bytes)
    if op in MOE_OPS and len(ins) >= 3:
        return _moe(node, ins, shapes, out_bytes)
    if op == LINEAR_ATTENTION and len(node.outputs) > 1:
        return _linear_attention(node, shapes, in_bytes, out_bytes)
    if op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"):
        return Work(2.0 * out_elems, in_bytes + out_bytes, {"elements": out_elems})
    if op in ("Conv", "ConvTranspose") and len(ins) >= 2:
        w = shape_of(ins[1], shapes) or ()
        per_out = 2 * numel(w[1:]) if len(w) > 1 else 2
        return Work(float(out_elems * per_out), in_bytes + out_bytes, {"out": out_elems})
    if op == "Gather":
        # Embedding lookups read the gathered rows, not the table.
        indices = value_bytes(ins[1], shapes) if len(ins) > 1 else 0.0
        return Work(0.0, 2 * out_bytes + indices, {"elements": out_elems})
    if op in MOVE_OPS:
        return Work(0.0, in_bytes + out_bytes, {"elements": out_elems})
    if op in PER_INPUT_ELEMENT:
        in_elems = numel(shape_of(ins[0], shapes)) if ins else 0
        return Work(float(PER_INPUT_ELEMENT[op] * in_elems), in_bytes + out_bytes, {"elements": in_elems})
    return Work(float(PER_OUTPUT_ELEMENT.get(op, 1) * out_elems), in_bytes + out_bytes, {"elements": out_elems})


def _linear_attention(node: ir.Node, shapes: Shapes, in_bytes: float, out_bytes: float) -> Work:
    """The recurrence touches the whole state [batch, heads, d_k, d_v] once per token: DELTA_RULE_FLOPS per state
    element per token; the bytes are its inputs and outputs (the state read and written once)."""
    tokens = (shape_of(node.inputs[0], shapes) or (1, 1))[1]
    state = numel(shape_of(node.outputs[1], shapes))
    return Work(float(DELTA_RULE_FLOPS * state * tokens), in_bytes + out_bytes, {"tokens": tokens, "state": state})


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
    n = out[-1]
    if node.op_type == "MatMul" and len(b) >= 3:  # two activations: batched (attention scores, attn x V)
        m = out[-2] if len(out) > 1 else 1
        batch = numel(out[:-2]) if len(out) > 2 else 1
        return Work(2.0 * batch * m * n * k, in_bytes + out_bytes, {"batch": batch, "m": m, "n": n, "k": k})
    m = numel(out[:-1]) if len(out) > 1 else 1
    return Work(2.0 * m * n * k, in_bytes + out_bytes, {"m": m, "n": n, "k": k})


def _itemsize(value: ir.Value | None, default: int = 4) -> int:
    return value.dtype.itemsize if value is not None and value.dtype is not None else default


def _matmul_nbits(node: ir.Node, ins: list[ir.Value], shapes: Shapes, out_bytes: float) -> Work:
    """Weight-only quantised MatMul: weight bytes at bits/8 plus per-block scales (and zero points)."""
    a = shape_of(ins[0], shapes) or ()
    k = node.attributes.get_int("K", a[-1] if a else 0)
    n = node.attributes.get_int("N", 0)
    bits = node.attributes.get_int("bits", 4)
    block = node.attributes.get_int("block_size", 32)
    m = numel(a[:-1]) if len(a) > 1 else 1
    blocks = n * -(-k // block) if block else 0
    act = _itemsize(ins[0])
    weight = n * k * bits / 8
    scales = blocks * _itemsize(ins[2] if len(ins) > 2 else None, act)
    zeros = blocks * bits / 8 if len(node.inputs) > 3 and node.inputs[3] is not None else 0.0
    return Work(2.0 * m * n * k, m * k * act + weight + scales + zeros + out_bytes,
                {"m": m, "n": n, "k": k, "block": block})


def _matmul_fp8(node: ir.Node, ins: list[ir.Value], shapes: Shapes, in_bytes: float, out_bytes: float) -> Work:
    """Block-scaled fp8 weight MatMul: A [.., K] @ B[N, K]^T; bytes = its inputs (1 B per weight, fp32 scales)."""
    a = shape_of(ins[0], shapes) or ()
    b = shape_of(ins[1], shapes) or ()
    if not a or len(b) != 2:
        return Work(0.0, in_bytes + out_bytes, {})
    n, k = b
    m = numel(a[:-1]) if len(a) > 1 else 1
    return Work(2.0 * m * n * k, in_bytes + out_bytes,
                {"m": m, "n": n, "k": k, "block": node.attributes.get_int("block_size", 128)})


def _attention(node: ir.Node, ins: list[ir.Value], shapes: Shapes, in_bytes: float, out_bytes: float) -> Work:
    """Fused attention: QK^T and PV (4 * B * H * S * L * D) plus softmax; bytes = Q/K/V/cache in + out.

    GroupQueryAttention: query [B, S, H*D], key/value [B, S, Hkv*D] (or no key/value and packed QKV
    [B, S, (H + 2 Hkv) D] as the query), past [B, Hkv, P, D], kv_len = the
    present length (P + S); of a shared max_length buffer (past and present one shape), total_sequence_length
    (the mask's width: past + seq of the scenario), and bytes count the positions read and written, not the buffer. MultiHeadAttention: key [B, L, H*D]
    (or 4-D BNSH), plus past. Attention (BERT-style, packed QKV weights): adds the QKV projection.
    """
    op = node.op_type
    q = shape_of(ins[0], shapes) or ()
    heads = node.attributes.get_int("num_heads", 1)
    batch = q[0] if len(q) >= 1 else 1
    seq = q[1] if len(q) >= 2 else 1
    hidden = q[-1] if q else 0
    flops_proj = 0.0
    if op == "Attention":
        w = shape_of(ins[1], shapes) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        qkv = w[-1] if w else 3 * hidden
        hidden_q = node.attributes.get_ints("qkv_hidden_sizes", [qkv // 3])[0] if qkv else hidden
        head_dim = max(1, hidden_q // max(heads, 1))
        flops_proj = 2.0 * batch * seq * hidden * qkv
        kv_heads, kv_len = heads, seq
        past = shape_of(node.inputs[4], shapes) if len(node.inputs) > 4 and node.inputs[4] is not None else None
        if past and len(past) >= 4:
            kv_len += past[-2]
    else:
        kv_heads = node.attributes.get_int("kv_num_heads", heads) if op == "GroupQueryAttention" else heads
        present = shape_of(node.outputs[1], shapes) if len(node.outputs) > 1 and node.outputs[1] is not None else None
        k = shape_of(node.inputs[1], shapes) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        packed = op == "GroupQueryAttention" and k is None  # query is packed QKV [B, S, (H + 2 Hkv) D]
        head_dim = max(1, hidden // max(heads + 2 * kv_heads if packed else heads, 1))
        if op == "GroupQueryAttention":
            kv_len = present[-2] if present and len(present) == 4 else seq
            total = host_length(node.inputs[6] if len(node.inputs) > 6 else None, shapes)
            past = shape_of(node.inputs[3], shapes) if len(node.inputs) > 3 and node.inputs[3] is not None else None
            if total is not None and past and present and len(past) == 4 and tuple(past) == tuple(present):
                # a shared max_length buffer: GQA reads seqlens_k + 1 = total positions of it and writes seq new ones
                in_bytes -= value_bytes(node.inputs[3], shapes) + value_bytes(node.inputs[4], shapes)
                out_bytes -= value_bytes(node.outputs[1], shapes) + value_bytes(node.outputs[2], shapes)
                per_position = 2 * numel(past) / past[-2] * _itemsize(node.inputs[3])  # K and V, one position
                in_bytes += per_position * max(total - seq, 0)
                out_bytes += per_position * seq
                kv_len = total
        else:
            kv_len = (k[-2] if k and len(k) == 4 else k[1] if k and len(k) == 3 else seq)
            past = shape_of(node.inputs[6], shapes) if len(node.inputs) > 6 and node.inputs[6] is not None else None
            if past and len(past) == 4:
                kv_len += past[-2]
            if present and len(present) == 4:
                kv_len = present[-2]
    flops = flops_proj + 4.0 * batch * heads * seq * kv_len * head_dim + 5.0 * batch * heads * seq * kv_len
    sizes = {"batch": batch, "q_tokens": seq, "kv_len": kv_len, "heads": heads, "kv_heads": kv_heads,
             "head_dim": head_dim}
    return Work(flops, in_bytes + out_bytes, sizes)


def host_length(value: ir.Value | None, shapes: Shapes) -> int | None:
    """The value of a length computed on the host from a tensor's shape (GroupQueryAttention's
    total_sequence_length: Shape(attention_mask)[1], through Cast/Squeeze/Gather/Reshape), else None."""
    while value is not None and value.producer() is not None:
        node = value.producer()
        if node.op_type == "Shape":
            shape = shape_of(node.inputs[0], shapes)
            if shape is None:
                return None
            start = node.attributes.get_int("start", 0)
            end = node.attributes.get_int("end", len(shape))
            picked = shape[start:end]
            return int(picked[0]) if len(picked) == 1 else None
        if node.op_type not in ("Cast", "Squeeze", "Reshape", "Unsqueeze") or not node.inputs:
            return None
        value = node.inputs[0]
    return None


def _moe(node: ir.Node, ins: list[ir.Value], shapes: Shapes, out_bytes: float) -> Work:
    """Fused mixture of experts: each token runs k experts, every expert weight read by one multiply-add.

    Counted from the expert weight tensors themselves (MoE: fc1 = inputs[2], fc2 = inputs[4], fc3 = inputs[6];
    QMoE: inputs[2], [5], [8]
    when present), so it holds for any layout (ORT 1.31: fc1 [E, 2I, H] interleaved SwiGLU, fc2 [E, H, I])
    and for QMoE's packed weights (`expert_weight_bits`). Bytes: activations + the weights of the experts
    touched: `active_experts` of E, the expected number of distinct experts T tokens route to.
    """
    x = shape_of(ins[0], shapes) or ()
    router = shape_of(node.inputs[1], shapes) or ()
    tokens = numel(x[:-1]) if len(x) > 1 else 1
    hidden = x[-1] if x else 0
    experts = max(router[-1] if router else 1, 1)
    k = node.attributes.get_int("k", 1)
    bits = node.attributes.get_int("expert_weight_bits", 0) if node.op_type == "QMoE" else 0
    slots = (2, 5, 8) if node.op_type == "QMoE" else (2, 4, 6)  # QMoE: each weight is followed by its scales
    weights = [node.inputs[i] for i in slots if i < len(node.inputs) and node.inputs[i] is not None]
    stored = sum(numel(shape_of(w, shapes)) for w in weights)  # elements as stored (packed bytes for QMoE)
    per_expert = stored * (8 // bits if bits else 1) / experts
    flops = 2.0 * tokens * k * per_expert
    act = _itemsize(ins[0])
    per_expert_bytes = per_expert * (bits / 8 if bits else act)
    touched = active_experts(experts, k, tokens)
    bytes_moved = tokens * hidden * act + tokens * experts * act + touched * per_expert_bytes + out_bytes
    inter = int(per_expert // max(hidden, 1))  # summed width of the expert's matrices
    return Work(flops, bytes_moved, {"tokens": tokens, "experts": experts, "k": k, "hidden": hidden, "inter": inter})


def active_experts(experts: int, k: int, tokens: int) -> float:
    """Expected distinct experts T tokens touch when each picks k of E (uniform routing): E * (1 - (1 - k/E)^T).
    Decode (T = 1) reads k experts' weights; a long prefill reads nearly all E."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    k = min(max(k, 0), experts)
    return experts * (1.0 - (1.0 - k / experts) ** tokens)
