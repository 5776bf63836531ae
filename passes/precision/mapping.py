"""Per-cell precision mapping: the candidates, their delays from the library, and applying a map.

A candidate is a MatMul whose weight is a 2-D float initializer (projections, packed QKV and gate-up after
fusion, the lm_head), outside `dont_touch`. Its options are the precisions `precision.allowed` names that the
target's library has a cell for (MatMulNBits.int4 / .int8; the cell's current float precision always), so
no chosen cell is one the provider cannot run. Weights are quantised by ONNX Runtime's own tooling
(`onnxruntime.quantization.matmul_nbits_quantizer`: the DEFAULT blockwise symmetric quantiser, the one
MatMulNBitsQuantizer runs per node), one node at a time, and the MatMulNBits replaces the MatMul under the
same name and hierarchy. A weightless netlist (a plan) gets the same node with weightless tensors of the
quantiser's shapes: it is timed and sized, never run.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from softsyn.frontends.export import META_WEIGHTS as WEIGHTLESS
from softsyn.netlist import HIERARCHY_KEY
from softsyn.timing.cost import node_work, precision_of
from softsyn.passes.precision.router import RULE as ROUTER_RULE, router_cells

BLOCK = 32  # the quantiser's block along K: the library's finest block axis point
NBITS = {"int4": 4, "int8": 8}
REQUESTED_KEY = "softsyn.precision_request"  # node metadata: the precision the mapping asked this cell for


@dataclass(frozen=True)
class Candidate:
    name: str  # the node's name (unique among candidates)
    hierarchy: str
    k: int
    n: int
    current: str  # the float precision it runs in now (fp32 / fp16)
    options: tuple[str, ...]  # current first, then the quantised precisions the library has a cell for
    params: int  # k x n

    def weight_bytes(self, precision: str, act_bytes: int) -> float:
        """Weight bytes at `precision`: packed bits plus one scale per block (no zero points: symmetric)."""
        if precision not in NBITS:
            return self.params * act_bytes
        return self.params * NBITS[precision] / 8 + self.n * math.ceil(self.k / BLOCK) * act_bytes


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


def has_cell(library, op: str, precision: str) -> bool:
    return any(c.op == op and c.precision == precision for c in library.cells)


def candidates(design) -> tuple[list[Candidate], dict[str, str]]:
    """(candidates in netlist order, {node or kind: why it is not a candidate}) for the design's netlist."""
    cons, lib = design.constraints, design.library
    allowed = set(cons.precision.allowed or ())
    quantised = [p for p in NBITS if p in allowed]
    skipped: dict[str, str] = {}
    for p in NBITS:
        if p not in allowed:
            skipped[p] = f"{p} is not in precision.allowed"
        elif not has_cell(lib, "MatMulNBits", p):
            skipped[p] = f"library {lib.name} has no MatMulNBits.{p} cell: the provider's kernel is not characterised"
    quantised = [p for p in quantised if has_cell(lib, "MatMulNBits", p)]
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
        found.append(Candidate(node.name, hierarchy, k, n, current, (current, *quantised), k * n))
    return found, skipped


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
        if p in NBITS:
            blocks = cand.n * math.ceil(cand.k / BLOCK)
            moved = act_io + cand.params * NBITS[p] / 8 + blocks * act_bytes
            op, sizes = "MatMulNBits", {"m": m, "n": cand.n, "k": cand.k, "block": BLOCK}
        else:
            moved, op, sizes = act_io + cand.params * act_bytes, "MatMul", {"m": m, "n": cand.n, "k": cand.k}
        delay, _, _, device = library.node_timing(op, p, flops, moved, sizes)
        if captured:
            device = library.device_in_graph(op, p, sizes, device)
        costs[p] = device if library.is_gpu else delay
    return costs


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
            act = node.inputs[0].dtype.itemsize if node.inputs[0].dtype is not None else 4
            rows[cand.name] = option_costs(design.library, cand, int(node_work(node, shapes).sizes.get("m", 1)), act,
                                           captured)
        tables[group.name] = rows
    return tables


def quantise_weight(name: str, weight: np.ndarray, bits: int) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """ONNX Runtime's blockwise quantiser on one MatMul: its MatMulNBits node and initializers (packed, scales)."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 DefaultWeightOnlyQuantizer, logger)

    logger.setLevel(logging.WARNING)  # it logs two INFO lines per node

    config = DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=True, bits=bits)
    node = onnx.helper.make_node("MatMul", ["a", "w"], ["y"], name=name)
    graph = onnx.helper.make_graph([node], "cell", [], [], initializer=[onnx.numpy_helper.from_array(weight, "w")])
    out = DefaultWeightOnlyQuantizer(config).quantize(node, [graph])
    if len(out) != 1 or out[0].op_type != "MatMulNBits":
        raise RuntimeError(f"{name}: the quantiser returned {[n.op_type for n in out]}, not one MatMulNBits")
    return out[0], [t for t in graph.initializer if t.name != "w"]


def _weightless_tensors(cand: Candidate, bits: int, dtype: ir.DataType) -> list[ir.ExternalTensor]:
    """The packed weight and scales the quantiser would write, as weightless tensors (shapes and dtypes exact)."""
    blocks = math.ceil(cand.k / BLOCK)
    packed = ir.Shape([cand.n, blocks, BLOCK * bits // 8])
    scales = ir.Shape([cand.n, blocks])
    return [ir.ExternalTensor(location=WEIGHTLESS, offset=0, length=math.prod(packed.dims), dtype=ir.DataType.UINT8,
                              shape=packed, name="packed"),
            ir.ExternalTensor(location=WEIGHTLESS, offset=0, length=math.prod(scales.dims) * dtype.itemsize,
                              dtype=dtype, shape=scales, name="scales")]


def apply_mapping(netlist, mapping: dict[str, str], requested: dict[str, str] | None = None) -> dict[str, int]:
    """Replace each mapped MatMul by a MatMulNBits at its precision (int4/int8; float entries stay as they are).
    `requested`: what was asked of each cell, recorded on the node (REQUESTED_KEY). Returns counts by precision.
    The caller calls design.netlist_changed()."""
    graph = netlist.model.graph
    by_name = {n.name: n for n in graph}
    counts: dict[str, int] = {}
    for name, precision in mapping.items():
        node = by_name[name]
        if requested and name in requested:
            node.metadata_props[REQUESTED_KEY] = requested[name]
        if precision not in NBITS or node.op_type != "MatMul":
            continue
        bits = NBITS[precision]
        w = node.inputs[1]
        k, n = int(w.shape[0]), int(w.shape[1])
        cand = Candidate(name, "", k, n, "", (), k * n)
        source, transposed = weight_source(w)
        if is_weightless(source):
            tensors = _weightless_tensors(cand, bits, w.dtype)
            attrs = {"K": k, "N": n, "bits": bits, "block_size": BLOCK}
        else:
            data = np.asarray(source.const_value.numpy())
            proto, inits = quantise_weight(name, data.T if transposed else data, bits)
            tensors = [ir.from_proto(t) for t in inits]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
        values = []
        for tensor, suffix in zip(tensors, ("packed", "scales")):
            v = ir.Value(name=f"{source.name}.{precision}.{suffix}", shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
            graph.register_initializer(v)
            values.append(v)
        new = ir.Node("com.microsoft", "MatMulNBits", [node.inputs[0], *values], attributes=[
            ir.AttrInt64(key, int(val)) for key, val in attrs.items()], name=name, num_outputs=1)
        new.metadata_props.update(node.metadata_props)
        out, old = new.outputs[0], node.outputs[0]
        out.dtype, out.shape = old.dtype, old.shape
        graph.insert_before(node, new)
        old_name = old.name
        old.replace_all_uses_with(out, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        out.name = old_name
        if not w.uses() and w.producer() is not None:  # the Transpose fed only this MatMul
            graph.remove(w.producer(), safe=True)
        if not source.uses():
            graph.initializers.pop(source.name, None)
        counts[precision] = counts.get(precision, 0) + 1
    if counts and "com.microsoft" not in netlist.model.opset_imports:
        netlist.model.opset_imports["com.microsoft"] = 1
    return counts


def is_weightless(value: ir.Value) -> bool:
    t = value.const_value
    return isinstance(t, ir.ExternalTensor) and str(t.location) == WEIGHTLESS
