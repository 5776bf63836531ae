"""Per-cell precision mapping: the candidates, their delays from the library, and applying a map.

A candidate is a MatMul whose weight is a 2-D float initializer (projections, packed QKV and gate-up after
fusion, the lm_head), outside `dont_touch`, or a fused MoE cell's expert weights (passes.optimize.experts: QMoE
int4/int8, where the library has a QMoE cell; the router MatMul never). Its options are the precisions `precision.allowed` names that the
target's library has a cell for (MatMulNBits.int4 / .int8, MatMulBlockQuantizedFp8Weight.fp8; the cell's current
float precision always), so no chosen cell is one the provider cannot run. int4/int8 weights are quantised by ONNX
Runtime's own tooling (`onnxruntime.quantization.matmul_nbits_quantizer`: the DEFAULT blockwise symmetric quantiser,
the one MatMulNBitsQuantizer runs per node), one node at a time, and the MatMulNBits replaces the MatMul under the
same name and hierarchy. fp8 (`quantise_fp8`): com.microsoft.MatMulBlockQuantizedFp8Weight's layout, the weight
transposed to B [N, K] in float8e4m3fn and one fp32 scale per FP8_BLOCK values along K (amax / 448, a saturating
cast), for fp16/bf16 activations (the op's only types). A weightless netlist (a plan) gets the same node with
weightless tensors of the quantiser's shapes: it is timed and sized, never run.
bf16 (`BF16`, GPU targets only: ORT's CPU provider has no bf16 MatMul) is a float option, not a quantised one: the
cell is the library's MatMul.bf16, its weight a bf16 initializer [K, N], with a Cast to bf16 on its input (shared by
the bf16 cells that read one activation) and a Cast back to the design's fp16 on its output. The Casts are the
cell's: its cost (`option_costs`) adds them, and the STA times them as the nodes they are once the map is applied.
"""
from __future__ import annotations

import fnmatch
import logging
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from softsyn.netlist import HIERARCHY_KEY
from softsyn.netlist.keys import META_WEIGHTS as WEIGHTLESS, REQUESTED_KEY, is_weightless
from softsyn.timing.cost import FP8_MATMUL as FP8_OP, node_work, precision_of
from passes.fuse.graph import swap_node
from passes.optimize import experts
from passes.optimize.tooling import ort_quantisers
from passes.rules.router import RULE as ROUTER_RULE, router_cells
from passes.rules.bf16 import BF16  # the float option: MatMul.bf16 with Casts at its boundary (GPU)

BLOCK = 32  # the quantiser's block along K without a library to choose by: the library's finest block axis point
BLOCK_TIE = 0.03  # blocks timed within 3 % of the fastest count as tied: the finer (more accurate) one is taken
NBITS = {"int4": 4, "int8": 8}
# fp8's block along K: the op's default and the one its DeepGEMM path and fp8 checkpoints (128 x 128 tiles) use; fp8
# keeps a relative error per value, so a finer block buys little (the library's block axis also holds 32 and 64)
FP8_BLOCK = 128
FP8_MAX = 448.0  # float8e4m3fn's largest finite value
QUANTISED = ("int4", "int8", "fp8")  # the quantised options, in the order they are offered
FP8_ACTS = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)  # the op's activation types (T)
OFFERED = (*QUANTISED, BF16)  # every per-cell option the loop may offer besides a cell's own precision


@dataclass(frozen=True)
class Candidate:
    name: str  # the node's name (unique among candidates)
    hierarchy: str
    k: int
    n: int
    current: str  # the float precision it runs in now (fp32 / fp16)
    options: tuple[str, ...]  # current first, then the quantised precisions the library has a cell for
    params: int  # k x n (an MoE cell: experts x hidden x summed expert width)
    op: str = "MatMul"  # or "MoE": the expert weights, whose quantised cell is QMoE
    blocks: tuple[tuple[str, int], ...] = ()  # int4/int8: the quantiser's block (nbits_block); BLOCK where absent

    @property
    def moves(self) -> tuple[str, ...]:
        """The options other than what the netlist holds (a uniform bf16 start lists bf16 first: a move to measure)."""
        return tuple(p for p in self.options if p != self.current)

    def block(self, precision: str) -> int:
        return dict(self.blocks).get(precision, BLOCK)

    def weight_bytes(self, precision: str, act_bytes: int) -> float:
        """Weight bytes at `precision`: packed bits plus one scale per block (no zero points: symmetric); fp8 one
        byte per value and an fp32 scale per FP8_BLOCK."""
        if self.op == "MoE" and precision in NBITS:
            return self.params * NBITS[precision] / 8 + self.params / experts.QMOE_BLOCK * act_bytes
        if precision == "fp8":
            return self.params + self.n * math.ceil(self.k / FP8_BLOCK) * 4
        if precision == BF16:
            return self.params * 2.0
        if precision not in NBITS:
            return self.params * act_bytes
        return self.params * NBITS[precision] / 8 + self.n * math.ceil(self.k / self.block(precision)) * act_bytes


def cell_op(precision: str) -> str:
    """The library op an option's cell is (MatMulNBits for int4/int8, MatMul for bf16)."""
    return FP8_OP if precision == "fp8" else "MatMul" if precision == BF16 else "MatMulNBits"


def weight_of(node: ir.Node) -> ir.Value | None:
    """The initializer a candidate's weight is read from: a MatMul's (weight_source), an MoE cell's fc1."""
    if node.op_type == "MoE":
        return node.inputs[2]
    source = weight_source(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    return None if source is None else source[0]


def weight_source(value: ir.Value) -> tuple[ir.Value, bool] | None:
    """(the initializer, transposed?) behind a MatMul's weight: the initializer itself, or a 2-D Transpose of one
    (how a weightless export keeps nn.Linear's weight; ORT folds it at load); None for anything else."""
    if value.is_initializer():
        return value, False
    node = value.producer()
    if node is not None and node.op_type == "Transpose" and node.inputs[0] is not None and \
            node.inputs[0].is_initializer() and list(node.attributes.get_ints("perm", [1, 0])) == [1, 0]:
        return node.inputs[0], True
    return None


def nbits_block(library, precision: str, n: int, k: int) -> int:
    """The quantiser's block along K for an int4/int8 cell of weight [k, n]: of the block points the library measured
    MatMulNBits.<precision> at, the one whose decode row (m 1) is fastest for this shape, in a captured graph where
    the library has a graph table (on the H200 int4 runs fastest at block 128 and block 32 engages another kernel,
    bench/results/nbits-kernels-cuda-2026-12-02.md); within BLOCK_TIE of the fastest the finer block (the more
    accurate). BLOCK when the library has no block axis for it (or no library)."""
    if library is None:
        return BLOCK
    points = sorted({int(b) for c in library.cells if c.op == "MatMulNBits" and c.precision == precision
                     and "block" in c.axes for b in c.points[c.axes.index("block")]})
    if not points:
        return BLOCK
    times = {}
    for block in points:
        sizes = {"m": 1, "n": n, "k": k, "block": block}
        moved = k * 2 + n * 2 + k * n * NBITS[precision] / 8 + n * math.ceil(k / block) * 2
        delay, _, _, device = library.node_timing("MatMulNBits", precision, 2.0 * n * k, moved, sizes)
        graphed = library.graph_delay("MatMulNBits", precision, sizes) if library.is_gpu else None
        times[block] = graphed if graphed is not None else (device if library.is_gpu else delay)
    fastest = min(times.values())
    return min(b for b, t in times.items() if t <= fastest * (1 + BLOCK_TIE))


def candidates(design) -> tuple[list[Candidate], dict[str, str]]:
    """(candidates in netlist order, {node or kind: why it is not a candidate}) for the design's netlist."""
    cons, lib = design.constraints, design.library
    allowed = set(cons.precision.allowed or ())
    skipped: dict[str, str] = {}
    for p in QUANTISED:
        if p not in allowed:
            skipped[p] = f"{p} is not in precision.allowed"
        elif not lib.has_cell(cell_op(p), p):
            skipped[p] = f"library {lib.name} has no {cell_op(p)}.{p} cell: the provider's kernel is not characterised"
    quantised = [p for p in QUANTISED if p in allowed and lib.has_cell(cell_op(p), p)]
    bf16, why_not = bf16_offered(design)
    if why_not:
        skipped[BF16] = why_not
    fp8_refused = bf16_refused = 0
    found = []
    seen: set[str] = set()
    routers = {id(n) for n in router_cells(design.netlist.model.graph)["matmul"]}
    for node in design.netlist.nodes():
        if node.op_type != "MatMul" or len(node.inputs) < 2:
            continue
        if id(node) in routers:  # top-k routing flips experts under rounding: never below fp16
            skipped[node.name or node.metadata_props.get(HIERARCHY_KEY, "")] = f"{ROUTER_RULE}: MoE router"
            continue
        w = node.inputs[1]
        hierarchy = node.metadata_props.get(HIERARCHY_KEY, "")
        if w is None or weight_source(w) is None or w.shape is None or len(w.shape) != 2 or \
                w.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            continue
        if any(fnmatch.fnmatchcase(hierarchy, g) for g in cons.dont_touch):
            skipped[node.name] = "dont_touch"
            continue
        if not node.name or node.name in seen or len(w.uses()) != 1:
            skipped[node.name or hierarchy] = "unnamed, repeated name or shared weight"
            continue
        seen.add(node.name)
        k, n = int(w.shape[0]), int(w.shape[1])
        current = precision_of(node)
        offered = [p for p in quantised if p != "fp8" or node.inputs[0].dtype in FP8_ACTS]
        fp8_refused += len(quantised) - len(offered)
        if bf16 and current == "fp16":  # from an fp16 design only: a cell in fp32 on purpose is not lowered
            offered.append(BF16)
        bf16_refused += bool(bf16 and current != "fp16")
        blocks = tuple((p, nbits_block(design.library, p, n, k)) for p in offered if p in NBITS)
        found.append(Candidate(name=node.name, hierarchy=hierarchy, k=k, n=n, current=current,
                               options=(current, *offered), params=k * n, blocks=blocks))
    if fp8_refused:
        skipped["fp8"] = (f"{fp8_refused} cell{'s' if fp8_refused != 1 else ''} with activations other than "
                          f"fp16/bf16: {FP8_OP} takes only those")
    if bf16_refused:
        skipped[BF16] = (f"{bf16_refused} cell{'s' if bf16_refused != 1 else ''} not in fp16: a bf16 cell replaces an "
                         "fp16 one (same bytes, 8 mantissa bits instead of 11, fp32's range)")
    return found + expert_candidates(design, allowed, skipped), skipped


def bf16_offered(design) -> tuple[bool, str]:
    """(whether the loop offers bf16 per cell, why not where it does not): only where precision.allowed names it, on
    a GPU target (ORT's CPU provider has no bf16 MatMul kernel) whose library has a MatMul.bf16 cell."""
    lib = design.library
    if BF16 not in (design.constraints.precision.allowed or ()):
        return False, ""  # not asked for: nothing to say
    if not lib.is_gpu:
        return False, (f"not offered on the CPU target (library {lib.name}): ORT's CPU provider has no bf16 MatMul "
                       "kernel")
    if not lib.has_cell("MatMul", BF16):
        return False, f"library {lib.name} has no MatMul.bf16 cell: the provider's kernel is not characterised"
    return True, ""


def expert_candidates(design, allowed: set[str], skipped: dict[str, str]) -> list[Candidate]:
    """The fused MoE cells outside dont_touch with their QMoE options (int4/int8 the constraints allow and the
    library has a QMoE cell for); why not, per cell or per precision, into `skipped` (keys "qmoe ...")."""
    cons, lib = design.constraints, design.library
    moes = [n for n in design.netlist.nodes() if n.op_type == "MoE"]
    offered = [p for p in experts.BITS if p in allowed and lib.has_cell("QMoE", p)]
    for p in experts.BITS:
        if moes and p in allowed and p not in offered:
            skipped[f"qmoe {p}"] = f"library {lib.name} has no QMoE.{p} cell: the experts stay MoE"
    found = []
    for node in moes:
        hierarchy = node.metadata_props.get(HIERARCHY_KEY, "")
        why = "dont_touch" if any(fnmatch.fnmatchcase(hierarchy, g) for g in cons.dont_touch) else \
            experts.why_not(node)
        if why or not offered:
            skipped[node.name or hierarchy] = why or "no QMoE option"
            continue
        hidden, width = experts.sizes(node)
        e = int(node.inputs[2].shape[0])
        found.append(Candidate(name=node.name, hierarchy=experts.label(hierarchy), k=hidden, n=width, current=precision_of(node),
                               options=(precision_of(node), *offered), params=e * hidden * width, op="MoE"))
    return found


def option_costs(library, cand: Candidate, m: int, act_bytes: int, captured: bool = False) -> dict[str, float]:
    """{precision: s} of the candidate at m rows: MatMul at its float precision, MatMulNBits at each quantised one
    (cost.node_work's bytes and sizes). The cost is the cell's delay on a CPU (the host runs the cells one after
    another, so a group's latency is their sum); on a GPU its device time (kernels queue behind the launches,
    which no option changes); in a captured CUDA graph (`captured`) the time the STA gives it there
    (softsyn.timing.sta.in_graph: the graph table, else the device time or the graph's per-node cost)."""
    flops = 2.0 * m * cand.n * cand.k
    act_io = m * cand.k * act_bytes + m * cand.n * act_bytes
    costs = {}
    for p in cand.options:
        if p == "fp8":
            moved = act_io + cand.weight_bytes(p, act_bytes)
            op, sizes = FP8_OP, {"m": m, "n": cand.n, "k": cand.k, "block": FP8_BLOCK}
        elif p in NBITS:
            moved = act_io + cand.weight_bytes(p, act_bytes)
            op, sizes = "MatMulNBits", {"m": m, "n": cand.n, "k": cand.k, "block": cand.block(p)}
        else:
            moved, op, sizes = act_io + cand.params * act_bytes, "MatMul", {"m": m, "n": cand.n, "k": cand.k}
        delay, _, _, device = library.node_timing(op, p, flops, moved, sizes)
        if captured:
            device = library.device_in_graph(op, p, sizes, device)
        costs[p] = device if library.is_gpu else delay
        if p == BF16:
            costs[p] += bf16_casts(library, m, cand.k, cand.n, captured)
    return costs


def bf16_casts(library, m: int, k: int, n: int, captured: bool = False) -> float:
    """Seconds a bf16 cell's two Casts add (fp16 -> bf16 on its m x k input, bf16 -> fp16 on its m x n output), timed
    as the STA times a Cast (the library's Cast cell, else the roofline): each its device time, in a captured graph
    its time there; eager, at least a launch each (the host issues them, and decode is launch-bound). An input Cast
    shared with another bf16 cell is charged to each (an over-estimate; the STA after the map counts it once)."""
    total = 0.0
    for elements, precision in ((m * k, "fp16"), (m * n, BF16)):
        sizes = {"elements": elements}
        delay, _, host, device = library.node_timing("Cast", precision, 0.0, 4.0 * elements, sizes)
        if not library.is_gpu:
            total += delay
        elif captured:
            total += library.device_in_graph("Cast", precision, sizes, device)
        else:
            total += max(device, host, library.ceilings.launch_overhead)
    return total


def delay_tables(design, cands: list[Candidate]) -> dict[str, dict[str, dict[str, float]]]:
    """{group: {cell: {precision: s}}}: each option's cost to its group (option_costs), tabulated once."""
    by_name = {n.name: n for n in design.netlist.nodes()}
    tables: dict[str, dict[str, dict[str, float]]] = {}
    for group in design.groups:
        shapes = design.netlist.bind(group.scenario.dims)
        launch = design.launches.get(group.name)
        captured = bool(launch is not None and launch.captured)
        rows = {}
        for cand in cands:
            node = by_name[cand.name]
            if cand.op == "MoE":
                rows[cand.name] = experts.option_costs(design.library, node, shapes, cand.options, captured)
                continue
            act = node.inputs[0].dtype.itemsize if node.inputs[0].dtype is not None else 4
            rows[cand.name] = option_costs(design.library, cand, int(node_work(node, shapes).sizes.get("m", 1)), act,
                                           captured)
        tables[group.name] = rows
    return tables


def quantise_weight(name: str, weight: np.ndarray, bits: int,
                    block: int = BLOCK) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """ONNX Runtime's blockwise quantiser on one MatMul: its MatMulNBits node and initializers (packed, scales)."""
    nbits = ort_quantisers().nbits
    nbits.logger.setLevel(logging.WARNING)  # it logs two INFO lines per node

    config = nbits.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, bits=bits)
    node = onnx.helper.make_node("MatMul", ["a", "w"], ["y"], name=name)
    graph = onnx.helper.make_graph([node], "cell", [], [], initializer=[onnx.numpy_helper.from_array(weight, "w")])
    out = nbits.DefaultWeightOnlyQuantizer(config).quantize(node, [graph])
    if len(out) != 1 or out[0].op_type != "MatMulNBits":
        raise RuntimeError(f"{name}: the quantiser returned {[n.op_type for n in out]}, not one MatMulNBits")
    return out[0], [t for t in graph.initializer if t.name != "w"]


def fp8_blocks(weight_nk: np.ndarray, block: int = FP8_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(q float8e4m3fn [N, K], scales fp32 [N, ceil(K / block)]) of a weight laid out [N, K]: each block of `block`
    values along K scaled by amax / 448 into e4m3's range (an all-zero block keeps scale 1) and cast saturating
    (clipped first: ml_dtypes' cast gives NaN past 448), round to nearest even."""
    w = np.asarray(weight_nk, np.float32)
    n, k = w.shape
    kb = -(-k // block)
    if k % block:  # a ragged last block: zero-padded (zeros change no block's amax)
        w = np.concatenate([w, np.zeros((n, kb * block - k), np.float32)], axis=1)
    blocks = w.reshape(n, kb, block)  # no copy when K is whole blocks: a real-size model's weights quantise ~5x faster
    amax = np.abs(blocks).max(axis=2)
    scales = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    q = (blocks / scales[:, :, None]).reshape(n, kb * block)[:, :k]
    np.clip(q, -FP8_MAX, FP8_MAX, out=q)
    return q.astype(ml_dtypes.float8_e4m3fn), scales


def fp8_dequantised(q: np.ndarray, scales: np.ndarray, block: int = FP8_BLOCK) -> np.ndarray:
    """The op's weight B_scaled [N, K] in fp32: fp8_e4m3(B[n, k]) * b_scale[n, k // block] (its schema's formula)."""
    k = q.shape[1]
    return q.astype(np.float32) * np.repeat(np.asarray(scales, np.float32), block, axis=1)[:, :k]


def quantise_fp8(name: str, weight: np.ndarray) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """One MatMul's weight W [K, N] as com.microsoft.MatMulBlockQuantizedFp8Weight: its node (inputs a, B, b_scale)
    and initializers (B = W^T in float8e4m3fn, per-block fp32 scales), in quantise_weight's form."""
    q, scales = fp8_blocks(np.asarray(weight).T)
    node = onnx.helper.make_node(FP8_OP, ["a", "B", "b_scale"], ["y"], name=name, domain="com.microsoft",
                                 block_size=FP8_BLOCK)
    return node, [onnx.numpy_helper.from_array(q, "B"), onnx.numpy_helper.from_array(scales, "b_scale")]


def quantise(name: str, weight: np.ndarray, precision: str, block: int = BLOCK,
             library=None) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """The quantised node and initializers of one MatMul weight [K, N] at a QUANTISED precision (`block`: int4/int8's
    block along K), carrying the node attributes `library`'s cell was measured with (Library.node_attributes: the
    CPU's MatMulNBits at accuracy_level 4), so the node runs the kernel the table timed."""
    node, inits = (quantise_fp8(name, weight) if precision == "fp8"
                   else quantise_weight(name, weight, NBITS[precision], block))
    extra = library.node_attributes(cell_op(precision), precision) if library is not None else {}
    if extra:
        kept = [a for a in node.attribute if a.name not in extra]
        del node.attribute[:]
        node.attribute.extend(kept + [onnx.helper.make_attribute(k, v) for k, v in sorted(extra.items())])
    return node, inits


def _weightless_tensors(cand: Candidate, precision: str, dtype: ir.DataType) -> list[ir.ExternalTensor]:
    """The packed weight and scales the quantiser would write, as weightless tensors (shapes and dtypes exact)."""
    if precision == "fp8":
        weight, scales = ir.Shape([cand.n, cand.k]), ir.Shape([cand.n, math.ceil(cand.k / FP8_BLOCK)])
        wtype, dtype = ir.DataType.FLOAT8E4M3FN, ir.DataType.FLOAT
    else:
        block = cand.block(precision)
        blocks = math.ceil(cand.k / block)
        weight = ir.Shape([cand.n, blocks, block * NBITS[precision] // 8])
        scales, wtype = ir.Shape([cand.n, blocks]), ir.DataType.UINT8
    return [ir.ExternalTensor(location=WEIGHTLESS, offset=0, length=math.prod(weight.dims), dtype=wtype,
                              shape=weight, name="packed"),
            ir.ExternalTensor(location=WEIGHTLESS, offset=0, length=int(math.prod(scales.dims) * dtype.itemsize),
                              dtype=dtype, shape=scales, name="scales")]


def apply_mapping(netlist, mapping: dict[str, str], requested: dict[str, str] | None = None,
                  library=None) -> dict[str, int]:
    """Replace each mapped MatMul by its quantised cell: MatMulNBits (int4/int8, at the block `library` times fastest
    for its shape: nbits_block), MatMulBlockQuantizedFp8Weight (fp8); float entries stay as they are.
    `requested`: what was asked of each cell, recorded on the node (REQUESTED_KEY). Returns counts by precision.
    The caller calls design.netlist_changed()."""
    graph = netlist.model.graph
    by_name = {n.name: n for n in graph}
    counts: dict[str, int] = {}
    for name, precision in mapping.items():
        node = by_name[name]
        if requested and name in requested:
            node.metadata_props[REQUESTED_KEY] = requested[name]
        if node.op_type == "MoE" and precision in experts.BITS:
            experts.apply(graph, node, precision)
            counts[f"qmoe_{precision}"] = counts.get(f"qmoe_{precision}", 0) + 1
            continue
        if precision == BF16 and node.op_type == "MatMul":
            bf16_cell(graph, node)
            counts[BF16] = counts.get(BF16, 0) + 1
            continue
        if precision not in QUANTISED or node.op_type != "MatMul":
            continue
        w = node.inputs[1]
        k, n = int(w.shape[0]), int(w.shape[1])
        blocks = ((precision, nbits_block(library, precision, n, k)),) if precision in NBITS else ()
        cand = Candidate(name=name, hierarchy="", k=k, n=n, current="", options=(), params=k * n, blocks=blocks)
        source, transposed = weight_source(w)
        if is_weightless(source):
            tensors = _weightless_tensors(cand, precision, w.dtype)
            attrs = {"block_size": FP8_BLOCK} if precision == "fp8" else \
                {"K": k, "N": n, "bits": NBITS[precision], "block_size": cand.block(precision)}
        else:
            data = np.asarray(source.const_value.numpy())
            proto, inits = quantise(name, data.T if transposed else data, precision, cand.block(precision))
            tensors = [ir.from_proto(t) for t in inits]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
        # the attributes the library's cell was measured with (the CPU's accuracy_level 4), weightless or not
        attrs.update(library.node_attributes(cell_op(precision), precision) if library is not None else {})
        values = []
        for tensor, suffix in zip(tensors, ("packed", "scales")):
            v = ir.Value(name=f"{source.name}.{precision}.{suffix}", shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
            graph.register_initializer(v)
            values.append(v)
        new = ir.Node("com.microsoft", cell_op(precision), [node.inputs[0], *values], attributes=[
            ir.AttrInt64(key, int(val)) for key, val in attrs.items()], name=name, num_outputs=1)
        swap_node(graph, node, new)
        if not w.uses() and w.producer() is not None:  # the Transpose fed only this MatMul
            graph.remove(w.producer(), safe=True)
        if not source.uses():
            graph.initializers.pop(source.name, None)
        counts[precision] = counts.get(precision, 0) + 1
    if counts and "com.microsoft" not in netlist.model.opset_imports:
        netlist.model.opset_imports["com.microsoft"] = 1
    return counts


BF = ir.DataType.BFLOAT16


def _bf16_tensor(source: ir.Value, transposed: bool, name: str) -> ir.TensorProtocol:
    """The weight [K, N] in bf16 (round to nearest even from what the design holds), evaluated lazily (at save) like
    the fp16 pass's weights; a weightless weight stays weightless, at bf16's size."""
    tensor = source.const_value
    k, n = (tensor.shape[1], tensor.shape[0]) if transposed else (tensor.shape[0], tensor.shape[1])
    shape = ir.Shape([k, n])
    if is_weightless(source):
        return ir.ExternalTensor(location=WEIGHTLESS, offset=0, length=int(k) * int(n) * 2, dtype=BF, shape=shape,
                                 name=name)

    def convert():
        data = np.asarray(tensor.numpy(), dtype=np.float32)
        return ir.tensor((data.T if transposed else data).astype(ml_dtypes.bfloat16), name=name)
    return ir.LazyTensor(convert, dtype=BF, shape=shape, name=name)


def _bf16_input(graph, value: ir.Value, before: ir.Node) -> ir.Value:
    """`value` cast to bf16: the Cast another bf16 cell already reads it through, else a new one before `before`."""
    for use, _ in value.uses():
        if use.op_type == "Cast" and use.attributes.get_int("to", 0) == BF and use.graph is graph:
            return use.outputs[0]
    cast = ir.node("Cast", [value], attributes={"to": BF}, name=f"{value.name}_to_bf16")
    out = cast.outputs[0]
    out.name, out.dtype, out.shape = f"{value.name}_bf16", BF, value.shape
    cast.metadata_props[HIERARCHY_KEY] = before.metadata_props.get(HIERARCHY_KEY, "")
    producer = value.producer()
    if producer is not None and producer.graph is graph:  # right after its producer, so every later reader sees it
        graph.insert_after(producer, cast)
    else:
        graph.insert_before(before, cast)
    return out


def bf16_cell(graph, node: ir.Node) -> None:
    """One fp16 MatMul as a bf16 cell (module docstring): Cast(x -> bf16) -> MatMul(x, W bf16 [K, N]) -> Cast(-> the
    output's dtype) under the MatMul's name and hierarchy; the output Cast takes the old output's name and uses."""
    w = node.inputs[1]
    source, transposed = weight_source(w)
    weight = ir.Value(name=f"{source.name}.bf16", shape=ir.Shape([int(w.shape[0]), int(w.shape[1])]),
                      type=ir.TensorType(BF),
                      const_value=_bf16_tensor(source, transposed, f"{source.name}.bf16"))
    graph.register_initializer(weight)
    x = _bf16_input(graph, node.inputs[0], node)
    matmul = ir.Node("", "MatMul", [x, weight], name=node.name, num_outputs=1)
    matmul.metadata_props.update(node.metadata_props)
    was = node.outputs[0]
    mid = matmul.outputs[0]
    mid.name, mid.dtype, mid.shape = f"{was.name}_bf16", BF, was.shape
    graph.insert_before(node, matmul)
    back = ir.node("Cast", [mid], attributes={"to": was.dtype}, name=f"{node.name}_from_bf16")
    back.metadata_props[HIERARCHY_KEY] = node.metadata_props.get(HIERARCHY_KEY, "")
    swap_node(graph, node, back)
    back.metadata_props.pop(REQUESTED_KEY, None)  # the request is the MatMul's (netlist.json's cell)
    if not w.uses() and w.producer() is not None:  # the Transpose fed only this MatMul
        graph.remove(w.producer(), safe=True)
    if not source.uses():
        graph.initializers.pop(source.name, None)
