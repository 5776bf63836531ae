"""Quantised experts: a fused com.microsoft.MoE cell's expert weights as com.microsoft.QMoE int4/int8.

The compile loop offers each MoE cell (the fuse pass's, SwiGLU with interleaved gate/up, no biases, no fc3) at int4
and int8 where `precision.allowed` names them and the target's library has a QMoE cell at that precision; the
router MatMul stays outside the op at its float precision (rule moe_router). Packing is ONNX Runtime's own tooling:
`onnxruntime.quantization.cuda_quantizer.CudaQuantizer.matmulnbits_blockwise_quantize`, the MatMulNBits blockwise
symmetric encoding that the onnxruntime-genai builder ships for CPU QMoE (`make_qmoe_weights`): each row of a
weight [N, K] in blocks of QMOE_BLOCK along K, value + 2^(bits-1) packed low nibble first into uint8 [N, K/pack],
one scale per block. Stacked per expert to fc [E, N, K * bits / 8] and scales [E, N, K / block] in the activation
type, no zero points (the op's default 2^(bits-1)), `weights_prepacked=0`: the raw layout the CPU kernel reads and
the CUDA kernel prepacks at load. The MoE's own attributes (k, activation, swiglu_fusion, normalisation) carry over.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir

from passes.fuse.graph import swap_node
from passes.optimize.search import map_error
from passes.optimize.tooling import ort_quantisers
from softsyn.netlist.keys import META_WEIGHTS as WEIGHTLESS, is_weightless
from softsyn.timing.cost import active_experts, node_work

# the onnxruntime-genai builder's default qmoe_block_size (CPU/CUDA block-wise QMoE take 32/64/128) and the
# loop's MatMulNBits block: the finest block the kernels take, the smallest error
QMOE_BLOCK = 32
BITS = {"int4": 4, "int8": 8}
FC = (2, 4)  # MoE's fc1 and fc2 inputs; QMoE's are 2 and 5, each followed by its scales


def fc_weights(node: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """(fc1 [E, 2I, H], fc2 [E, H, I]) of an MoE cell the rewrite takes: initializer weights of static 3-D shapes,
    no biases, no fc3; None for anything else."""
    ins = list(node.inputs) + [None] * (8 - len(node.inputs))
    fc1, fc2 = ins[2], ins[4]
    if any(v is not None for v in (ins[3], ins[5], ins[6], ins[7])) or fc1 is None or fc2 is None:
        return None
    if not (fc1.is_initializer() and fc2.is_initializer()) or fc1.shape is None or fc2.shape is None \
            or len(fc1.shape) != 3 or len(fc2.shape) != 3 or not (fc1.shape.is_static() and fc2.shape.is_static()):
        return None
    return fc1, fc2


def why_not(node: ir.Node) -> str:
    """Why an MoE cell cannot be a QMoE one ("" when it can)."""
    if node.attributes.get_int("swiglu_fusion", 0) != 1 or node.attributes.get_string("activation_type", "") != "swiglu":
        return "not SwiGLU with interleaved gate/up (swiglu_fusion=1)"
    weights = fc_weights(node)
    if weights is None:
        return "expert weights are not initializers of static shape, or the cell has biases or fc3"
    hidden, inter = int(weights[1].shape[1]), int(weights[1].shape[2])
    if hidden % QMOE_BLOCK or inter % QMOE_BLOCK:
        return f"hidden {hidden} and expert width {inter} must be multiples of the QMoE block {QMOE_BLOCK}"
    return ""


def label(hierarchy: str) -> str:
    """The name the loop's reports give an MoE cell's experts: the fused node inherits the router's scope
    (model.layers.0.mlp.gate), which stays a float MatMul, so the experts are named model.layers.0.mlp.experts."""
    return f"{hierarchy[:-len('.gate')] if hierarchy.endswith('.gate') else hierarchy}.experts"


def kept_float(cells, quantised: list[float], budget: float, share: float, per_role: bool = False) -> list[str]:
    """Why each MoE cell (CellMap rows whose name is an MoE cell's) that had QMoE options stays at its float
    precision, one line each: its cheapest option's error over what the budget leaves a map's estimate (`share`),
    alone or with the map's `quantised` cells' errors, else the search's cost. `per_role`: the errors are a role's
    share (sensitivity per role), not the cell measured alone, and the line says so."""
    lines = []
    limit = budget * share
    for c, options in cells:
        if c.realised not in BITS and options:
            best = min(options, key=options.get)
            alone, joined = map_error([options[best]]), map_error([*quantised, options[best]])
            where = f"over the {share:.0%} of the accuracy budget {budget:.1e} a map's estimate may use"
            if alone > limit:
                why = f"its estimate {alone:.2e} is {where}"
            elif joined > limit:
                why = (f"with the map's {len(quantised)} quantised cell{'s' if len(quantised) != 1 else ''} the "
                       f"estimate {joined:.2e} would be {where}")
            else:
                why = "the search found no gain in cost from it"
            how = "as its share of its role's error (measured per role)" if per_role else "alone"
            lines.append(f"{c.hierarchy}: experts kept {c.realised} (MoE): QMoE {best} adds {options[best]:.2e} "
                         f"{how}, {why}")
    return lines


def sizes(node: ir.Node) -> tuple[int, int]:
    """(hidden, summed expert width 3I) of an MoE cell fc_weights takes; E x H x 3I parameters."""
    fc2 = fc_weights(node)[1]
    return int(fc2.shape[1]), 3 * int(fc2.shape[2])


def option_costs(library, node: ir.Node, shapes, options, captured: bool = False) -> dict[str, float]:
    """{precision: s} of an MoE cell at each option: MoE at its float precision, QMoE at int4/int8 with the same
    FLOPs and the touched experts' weights at bits / 8 bytes a value (cost.node_work's count for both ops)."""
    work = node_work(node, shapes)
    act = node.inputs[0].dtype.itemsize if node.inputs[0].dtype is not None else 4
    s = work.sizes
    per_expert = s["hidden"] * s["inter"]
    touched = active_experts(s["experts"], s["k"], s["tokens"])
    costs = {}
    for p in options:
        moved = work.bytes - touched * per_expert * (act - BITS[p] / 8) if p in BITS else work.bytes
        op = "QMoE" if p in BITS else "MoE"
        delay, _, _, device = library.node_timing(op, p, work.flops, moved, s)
        if captured:
            device = library.device_in_graph(op, p, s, device)
        costs[p] = device if library.is_gpu else delay
    return costs


def quantise_matrix(weight: np.ndarray, bits: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 [..., N, K * bits / 8], scales [..., N, K / block] in `dtype`) of stacked weights [..., N, K]:
    ORT's MatMulNBits blockwise quantiser on every row at once (rows are quantised independently)."""
    ort = ort_quantisers()

    *lead, n, k = weight.shape
    rows = ort.torch.from_numpy(np.require(weight, np.float32, ['C', 'W']).reshape(-1, k))  # torch wants it writable
    q, scales = ort.qmoe.matmulnbits_blockwise_quantize(rows, bits, QMOE_BLOCK)
    packed = q.numpy()[:, : k * bits // 8]  # the builder drops the quantiser's whole-block padding
    return (packed.reshape(*lead, n, k * bits // 8),
            scales.numpy().astype(dtype).reshape(*lead, n, math.ceil(k / QMOE_BLOCK)))


def dequantise(packed: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """The weights [..., N, K] a QMoE kernel computes with: (stored value - 2^(bits-1)) x its block's scale."""
    q = packed.astype(np.int16)
    if bits == 4:
        q = np.stack([q & 0xF, q >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    w = (q - (1 << (bits - 1))).astype(np.float32)
    return w * np.repeat(scales.astype(np.float32), QMOE_BLOCK, axis=-1)[..., : w.shape[-1]]


def qmoe_attributes(moe_attributes: dict, bits: int) -> dict:
    """The QMoE's attributes: the MoE's, with the quantisation's."""
    return {**moe_attributes, "expert_weight_bits": bits, "block_size": QMOE_BLOCK, "weights_prepacked": 0}


def qmoe_proto(node: onnx.NodeProto, fc1: np.ndarray, fc2: np.ndarray,
               precision: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """One MoE node (proto) with its weights as a QMoE node (inputs x, router, fc1, fc1 scales, , fc2, fc2 scales)
    and its initializers: the design runner's quantised cell."""
    bits = BITS[precision]
    q1, s1 = quantise_matrix(fc1, bits, fc1.dtype)
    q2, s2 = quantise_matrix(fc2, bits, fc2.dtype)
    attrs = qmoe_attributes({a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}, bits)
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    qnode = onnx.helper.make_node("QMoE", ["x", "router", "fc1", "s1", "", "fc2", "s2"], ["y"], name=node.name,
                                  domain="com.microsoft", **attrs)
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in ((q1, "fc1"), (s1, "s1"), (q2, "fc2"), (s2, "s2"))]
    return qnode, inits


def _weightless(shape, dtype: ir.DataType, name: str) -> ir.ExternalTensor:
    return ir.ExternalTensor(location=WEIGHTLESS, offset=0, length=math.prod(shape) * dtype.itemsize, dtype=dtype,
                             shape=ir.Shape(shape), name=name)


def quantised_tensors(fc: ir.Value, bits: int) -> list[ir.TensorProtocol]:
    """(packed, scales) of one expert weight value: quantised, or weightless of the same shapes for a plan."""
    e, n, k = (int(d) for d in fc.shape)
    shapes = ((e, n, k * bits // 8), (e, n, math.ceil(k / QMOE_BLOCK)))
    if is_weightless(fc):
        return [_weightless(shapes[0], ir.DataType.UINT8, "packed"), _weightless(shapes[1], fc.dtype, "scales")]
    q, s = quantise_matrix(np.asarray(fc.const_value.numpy()), bits, fc.dtype.numpy())
    return [ir.tensor(q), ir.tensor(s)]


def apply(graph: ir.Graph, node: ir.Node, precision: str) -> ir.Node:
    """Replace MoE cell `node` by its QMoE at `precision` (same name, hierarchy, output); returns the new node.
    The float expert weights leave the graph when nothing else reads them."""
    bits = BITS[precision]
    inputs = [node.inputs[0], node.inputs[1]]
    for slot in FC:
        fc = node.inputs[slot]
        for tensor, suffix in zip(quantised_tensors(fc, bits), ("packed", "scales")):
            v = ir.Value(name=f"{fc.name}.{precision}.{suffix}", shape=ir.Shape(tensor.shape),
                         type=ir.TensorType(tensor.dtype), const_value=tensor)
            graph.register_initializer(v)
            inputs.append(v)
        if slot == FC[0]:
            inputs.append(None)  # fc1 bias
    attrs = qmoe_attributes({k: a.value for k, a in node.attributes.items()}, bits)
    new = ir.Node("com.microsoft", "QMoE", inputs, attributes=ir.convenience.convert_attributes(attrs),
                  name=node.name, num_outputs=1)
    weights = [node.inputs[slot] for slot in FC]
    swap_node(graph, node, new)
    for w in weights:
        if not w.uses():
            graph.initializers.pop(w.name, None)
    return new
