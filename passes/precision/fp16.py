"""Convert a netlist to fp16 on onnx-ir: weights, activations and float ports, with fp32 islands; and an fp16/bf16
source up to fp32 (`to_fp32`: an fp32 target, where a half model would run as a half model labelled fp32).

Why not a converter off the shelf: onnxconverter-common's output fails to load in ORT
(stack-notes), and ORT's `convert_float_to_float16` works on a ModelProto in RAM (weights
materialised, hierarchy and symbolic dims left to its shape inference). Here weights are cast
lazily (at save time, one tensor at a time), every surviving value keeps its symbolic shape, and
each inserted Cast takes the hierarchy of the cell it feeds.

fp32 islands: cells where fp16 loses more than rounding.
- norm statistics: Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal/Div; x² overflows fp16
  (65504) once |x| > 256, which real hidden states reach;
- rotary angles: Cast(int positions -> float) ... -> Cos/Sin; fp16 holds integers exactly only up to
  2048, so angles at longer contexts would be wrong;
- an unfused MoE router's Softmax/Sigmoid and TopK (the rule `moe_router`, passes.rules.router);
- cells the user pinned (`dont_touch` hierarchy globs);
- control flow (Scan, Loop, If: a hybrid decoder's delta rule is a Scan) with the outer values its body reads: the
  body is a graph of its own, left fp32 (transformers runs the delta rule in fp32 whatever the model's dtype);
- float producers (Constant, ConstantOfShape, initializers) whose every consumer is fp32.
Casts sit on every edge between an fp16 and an fp32 cell.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from softsyn.netlist import HIERARCHY_KEY
from passes.rules.router import router_cells
from softsyn.netlist.keys import FP8_MATMUL

F32, F16 = ir.DataType.FLOAT, ir.DataType.FLOAT16
FP16_MAX = float(np.finfo(np.float16).max)
NORM_TAIL = {"Add", "Sqrt", "Reciprocal", "Div"}
ANGLE_OPS = {"Cast", "Mul", "MatMul", "Add", "Concat", "Transpose", "Reshape", "Unsqueeze", "Expand", "Div",
             "Cos", "Sin"}
ANGLE_DEPTH = 8  # Cast -> Unsqueeze -> MatMul/Mul -> Transpose -> Concat -> Cos: a few cells deep
CONTROL_FLOW = ("Scan", "Loop", "If")  # ops with a body graph, which the conversion leaves as it is (fp32)


@dataclass
class Fp16Result:
    fp16_cells: int = 0
    fp32_cells: int = 0
    weights: int = 0
    casts: int = 0
    ports: int = 0
    islands: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {"fp16_cells": self.fp16_cells, "fp32_cells": self.fp32_cells, "weights_fp16": self.weights,
                "casts_inserted": self.casts, "ports_fp16": self.ports,
                **{f"fp32_{kind}": n for kind, n in self.islands.items()}}


def to_fp16(model: ir.Model, dont_touch: list[str] = ()) -> Fp16Result:
    """Convert `model` in place; float graph inputs and outputs become fp16 too."""
    graph = model.graph
    result = Fp16Result()
    keep = _fp32_islands(graph, dont_touch, result.islands)
    result.ports = sum(1 for v in graph.outputs if v.dtype == F32)
    _keep_fp32_producers(graph, keep)

    for value in graph.inputs:
        if value.dtype == F32:
            value.dtype = F16
            result.ports += 1
    for value in list(graph.initializers.values()):
        if value.dtype == F32 and value.const_value is not None and \
                not all(u in keep or u.graph is not graph or _schema_fp32(u, i) for u, i in value.uses()):
            value.const_value = _half_tensor(value.const_value)
            value.dtype = F16
            result.weights += 1
    for node in graph:
        if node in keep:
            result.fp32_cells += 1
            continue
        result.fp16_cells += 1
        _half_attributes(node)
        for out in node.outputs:
            if out is not None and out.dtype == F32:
                out.dtype = F16

    casts: dict[tuple[int, ir.DataType], ir.Value] = {}
    for node in list(graph):
        want = F32 if node in keep and not _computes_in_half(node) else F16
        for i, value in enumerate(node.inputs):
            if value is not None and value.dtype in (F32, F16) and value.dtype != want and _is_float_operand(node, i) \
                    and not _schema_fp32(node, i):
                node.replace_input_with(i, _cast(graph, value, want, node, casts, result))
    for i, port in enumerate(graph.outputs):
        if port.dtype == F32:
            name = port.name
            port.name = f"{name}_fp32"
            half = _cast(graph, port, F16, None, casts, result)
            half.name = name
            graph.outputs[i] = half
    return result


def _fp32_islands(graph: ir.Graph, dont_touch, islands: dict[str, int]) -> set[ir.Node]:
    keep: set[ir.Node] = set()
    router = {id(n) for n in router_cells(graph)["scores"]}  # precision rule moe_router: routing out of fp16
    for node in graph:
        if node.op_type == "ReduceMean" and _is_square(node.inputs[0]):
            chain = [node.inputs[0].producer(), node]
            tail = node
            while len(tail.outputs[0].uses()) == 1:
                nxt = next(iter(tail.outputs[0].uses())).node
                if nxt.op_type not in NORM_TAIL:
                    break
                chain.append(nxt)
                tail = nxt
                if nxt.op_type in ("Reciprocal", "Div"):
                    break
            keep.update(chain)
            islands["norm_stats"] = islands.get("norm_stats", 0) + len(chain)
        elif node.op_type == "Cast" and _int_to_float(node):
            angles = _angle_cells(node)
            if angles:
                keep.update(angles)
                islands["rotary_angles"] = islands.get("rotary_angles", 0) + len(angles)
        elif id(node) in router:
            keep.add(node)
            islands["moe_router"] = islands.get("moe_router", 0) + 1
        elif node.op_type in CONTROL_FLOW and node.domain in ("", "ai.onnx"):
            keep.add(node)
            islands["control_flow"] = islands.get("control_flow", 0) + 1
        if dont_touch and any(fnmatch.fnmatchcase(node.metadata_props.get(HIERARCHY_KEY, ""), g) for g in dont_touch):
            if node not in keep:
                keep.add(node)
                islands["dont_touch"] = islands.get("dont_touch", 0) + 1
    return keep


def _computes_in_half(node: ir.Node) -> bool:
    """A kept cell of a source that is fp16 already (a real-size fp16 export): kept as it is, in fp16."""
    return any(o is not None and o.dtype == F16 for o in node.outputs)


def _is_square(value: ir.Value | None) -> bool:
    node = value.producer() if value is not None else None
    if node is None:
        return False
    if node.op_type == "Mul":
        return node.inputs[0] is node.inputs[1]
    if node.op_type == "Pow":
        exponent = ir.convenience.get_const_tensor(node.inputs[1])
        return exponent is not None and exponent.size == 1 and float(exponent.numpy().reshape(-1)[0]) == 2.0
    return False


def _int_to_float(node: ir.Node) -> bool:
    src = node.inputs[0]
    return src is not None and src.dtype is not None and not src.dtype.is_floating_point() and \
        node.outputs[0].dtype == F32


def _angle_cells(cast: ir.Node) -> list[ir.Node]:
    """The cells from an int->float Cast down to the Cos/Sin it feeds (empty if it feeds none)."""
    cells, frontier, found = {cast}, [cast], False
    for _ in range(ANGLE_DEPTH):
        nxt = []
        for node in frontier:
            if node.op_type in ("Cos", "Sin"):
                found = True
                continue
            for out in node.outputs:
                for use, _ in out.uses():
                    if use.op_type in ANGLE_OPS and use not in cells:
                        cells.add(use)
                        nxt.append(use)
        frontier = nxt
    if not found:
        return []
    # only what leads to an angle: drop branches that never reach Cos/Sin
    reach = {n for n in cells if n.op_type in ("Cos", "Sin")}
    changed = True
    while changed:
        changed = False
        for n in cells - reach:
            if any(u in reach for o in n.outputs for u, _ in o.uses()):
                reach.add(n)
                changed = True
    return [n for n in cast.graph if n in reach]


def _keep_fp32_producers(graph: ir.Graph, keep: set[ir.Node]) -> None:
    """Constants (and other cells without float inputs) that only feed fp32 cells stay fp32."""
    for node in reversed(list(graph)):
        if node in keep or any(v is not None and v.dtype in (F32, F16) for v in node.inputs):
            continue
        uses = [u for o in node.outputs for u, _ in o.uses()]
        outputs_port = any(o.is_graph_output() for o in node.outputs)
        if uses and not outputs_port and all(u in keep or u.graph is not graph for u in uses):  # a body reads fp32
            keep.add(node)


def _half_attributes(node: ir.Node) -> None:
    for name, attr in list(node.attributes.items()):
        if node.op_type == "Constant" and name in ("value_float", "value_floats"):
            del node.attributes[name]
            data = np.array(attr.value, dtype=np.float32)
            node.attributes["value"] = ir.AttrTensor("value", _half_tensor(ir.tensor(data)))
            continue
        if name in ("to", "dtype") and attr.type == ir.AttributeType.INT and attr.value == F32:
            node.attributes[name] = ir.AttrInt64(name, F16)
        elif attr.type == ir.AttributeType.TENSOR and attr.value.dtype == F32:
            node.attributes[name] = ir.AttrTensor(name, _half_tensor(attr.value))


def _half_tensor(tensor) -> ir.TensorProtocol:
    """fp16 copy, evaluated lazily (at save): finite values beyond fp16's range clip to ±65504."""
    def convert():
        data = np.asarray(tensor.numpy(), dtype=np.float32)
        finite = np.isfinite(data)
        data = np.where(finite, np.clip(data, -FP16_MAX, FP16_MAX), data)
        return ir.tensor(data.astype(np.float16), name=tensor.name)
    return ir.LazyTensor(convert, dtype=F16, shape=tensor.shape, name=tensor.name)


def _is_float_operand(node: ir.Node, index: int) -> bool:
    """Inputs that carry data, not shapes or indices (those keep their integer dtypes anyway)."""
    return node.op_type != "Resize" or index == 0


def _schema_fp32(node: ir.Node, index: int) -> bool:
    """Inputs whose schema takes fp32 only, whatever the activations: an fp8 weight cell's b_scale and a_scale."""
    return node.op_type == FP8_MATMUL and index in (2, 3)


def _cast(graph: ir.Graph, value: ir.Value, dtype: ir.DataType, consumer: ir.Node | None,
          casts: dict, result: Fp16Result | Fp32Result) -> ir.Value:
    key = (id(value), dtype)
    if key not in casts:
        cast = ir.node("Cast", [value], attributes={"to": dtype}, name=f"{value.name}_to_{dtype.name.lower()}")
        out = cast.outputs[0]
        out.name, out.dtype, out.shape = f"{value.name}_{dtype.name.lower()}", dtype, value.shape
        anchor = consumer if consumer is not None else value.producer()
        hierarchy = anchor.metadata_props.get(HIERARCHY_KEY, "") if anchor is not None else ""
        cast.metadata_props[HIERARCHY_KEY] = hierarchy
        if consumer is not None:
            graph.insert_before(consumer, cast)
        else:
            graph.append(cast)
        casts[key] = out
        result.casts += 1
    return casts[key]


# --------------------------------------------------------------------------- up to fp32
HALF = (F16, ir.DataType.BFLOAT16)


@dataclass
class Fp32Result:
    fp32_cells: int = 0
    pinned_cells: int = 0
    weights: int = 0
    casts: int = 0
    casts_removed: int = 0
    ports: int = 0

    def counts(self) -> dict[str, int]:
        return {"fp32_cells": self.fp32_cells, "weights_fp32": self.weights, "ports_fp32": self.ports,
                "casts_inserted": self.casts, "casts_removed": self.casts_removed,
                **({"half_dont_touch": self.pinned_cells} if self.pinned_cells else {})}


def holds_half(model: ir.Model) -> bool:
    """Whether any port, weight or value of the main graph is fp16 or bf16."""
    graph = model.graph
    values = [*graph.inputs, *graph.outputs, *graph.initializers.values(), *(o for n in graph for o in n.outputs)]
    return any(v is not None and v.dtype in HALF for v in values)


def to_fp32(model: ir.Model, dont_touch: list[str] = ()) -> Fp32Result:
    """Convert an fp16/bf16 `model` up to fp32 in place: weights, activations, float ports, Cast targets and
    tensor attributes. Exact (every half value is an fp32 value). Cells the user pinned (`dont_touch`) keep the
    source's dtypes, with Casts on their edges; Casts left converting fp32 to fp32 are removed."""
    graph = model.graph
    result = Fp32Result()
    pinned = {n for n in graph if dont_touch and
              any(fnmatch.fnmatchcase(n.metadata_props.get(HIERARCHY_KEY, ""), g) for g in dont_touch)}
    result.pinned_cells = len(pinned)
    wanted = {(id(n), i): v.dtype for n in pinned for i, v in enumerate(n.inputs) if v is not None}
    result.ports = sum(1 for v in [*graph.inputs, *graph.outputs] if v.dtype in HALF)
    for value in graph.inputs:
        if value.dtype in HALF:
            value.dtype = F32
    for value in list(graph.initializers.values()):
        if value.dtype in HALF and value.const_value is not None and not all(u in pinned for u, _ in value.uses()):
            value.const_value = _full_tensor(value.const_value)
            value.dtype = F32
            result.weights += 1
    for node in graph:
        if node in pinned:
            continue
        result.fp32_cells += 1
        _full_attributes(node)
        for out in node.outputs:
            if out is not None and out.dtype in HALF:
                out.dtype = F32
    casts: dict = {}
    for node in list(graph):
        for i, value in enumerate(node.inputs):
            if value is None or value.dtype not in (F32, *HALF) or not _is_float_operand(node, i):
                continue
            want = wanted.get((id(node), i)) if node in pinned else (F32 if node.op_type != "Cast" else None)
            if want is not None and value.dtype != want:
                node.replace_input_with(i, _cast(graph, value, want, node, casts, result))
    for i, port in enumerate(graph.outputs):
        if port.dtype in HALF:  # a pinned cell's output
            name = port.name
            port.name = f"{name}_{port.dtype.name.lower()}"
            full = _cast(graph, port, F32, None, casts, result)
            full.name = name
            graph.outputs[i] = full
    result.casts_removed = _drop_noop_casts(graph, pinned)
    return result


def _full_attributes(node: ir.Node) -> None:
    for name, attr in list(node.attributes.items()):
        if name in ("to", "dtype") and attr.type == ir.AttributeType.INT and attr.value in HALF:
            node.attributes[name] = ir.AttrInt64(name, F32)
        elif attr.type == ir.AttributeType.TENSOR and attr.value.dtype in HALF:
            node.attributes[name] = ir.AttrTensor(name, _full_tensor(attr.value))


def _full_tensor(tensor) -> ir.TensorProtocol:
    """fp32 copy of a half tensor, evaluated lazily (at save)."""
    def convert():
        return ir.tensor(np.asarray(tensor.numpy()).astype(np.float32), name=tensor.name)
    return ir.LazyTensor(convert, dtype=F32, shape=tensor.shape, name=tensor.name)


def _drop_noop_casts(graph: ir.Graph, pinned: set[ir.Node]) -> int:
    """Casts from fp32 to fp32 (an fp16 source's upcasts and downcasts, now both fp32): their readers read the input."""
    removed = []
    for node in graph:
        src, out = node.inputs[0] if node.inputs else None, node.outputs[0] if node.outputs else None
        if node.op_type != "Cast" or node in pinned or src is None or src.dtype != F32 or out.dtype != F32 \
                or out.is_graph_output():
            continue
        out.replace_all_uses_with(src)
        removed.append(node)
    graph.remove(removed, safe=True)
    return len(removed)
