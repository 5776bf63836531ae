"""What ONNX Runtime will launch: the netlist after ORT's own load-time fusions.

ORT rewrites a graph when the session loads (level 2, "extended": GELU, LayerNorm, SkipLayerNorm, BiasGelu,
MatMul+scale, ...). On a GPU provider a run is host-bound until kernels grow long, and the host pays one
launch per node ORT kept, not per node the file holds: GPT-2-small's plain export has 648 nodes, ORT runs 550,
and the H200 run took 5.1-5.6 us per run node (bench/results/runtime-graph-cuda-2026-12-01.md).

`load_view(netlist)` asks ORT itself: a weightless copy of the graph (softsyn.netlist.shapes.skeleton_proto, small
constants kept so the fusions can check them) is loaded on the CPU provider at the extended level and the
optimised graph it writes is read back. The CPU provider stands in for the CUDA one because ORT registers these
fusions for both (graph_transformer_utils.cc); on that lease the CPU view held the 550 nodes the CUDA session
ran for GPT-2 and 456 of BERT-base's 467 (the CUDA provider leaves three LayerNorm + Add pairs unfused).
fp16 graphs fuse less on the CPU provider (it lacks fp16 kernels for some fused ops), so the view errs on the
side of more launches. bf16 has no CPU kernels at all (MatMul, the norms): the view types bf16 as fp32 (every Cast
into or out of bf16 stays a Cast between two types, so it still launches). fp8 weight cells
(com.microsoft.MatMulBlockQuantizedFp8Weight) run on CUDA only and take fp16/bf16 activations, which the CPU provider
recasts to fp32 (InvalidGraph, 2026-12-06): the view puts a MatMul of the same name in each one's place, so it
launches as one node and the rest of the graph is still viewed. Each node ORT created (a fused op) is
anchored on the netlist node that produced its output; the other netlist nodes that vanished were absorbed and
launch nothing.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx.numpy_helper
import onnx_ir as ir
from onnx_ir import serde

from softsyn.netlist import Netlist
from softsyn.netlist.shapes import skeleton_proto
from softsyn.runtime.session import SessionSettings, open_session

NAME = "softsyn_view_{}"  # unique node names in the copy: the netlist's may repeat or be empty
# What the CPU provider adds for fp16 graphs: Casts around ops it runs in fp32, and function bodies of ops it has
# no fp16 kernel for (their values are named _inlfunc_OP_...).
CPU_CAST = "InsertedPrecisionFreeCast"
VECTORS = 1 << 16  # norm scales and biases up to this size stay constants (as zeros) for the fusions that check it
INLINED = re.compile(r"_inlfunc_([A-Za-z0-9]+)_")


@dataclass(frozen=True)
class LoadView:
    """The netlist as ORT will run it: `absorbed` nodes launch nothing, `anchors` carry a fused op's launch."""

    absorbed: frozenset = field(default_factory=frozenset)  # netlist nodes (identity) ORT fused or folded away
    anchors: dict = field(default_factory=dict)  # netlist node -> the op type ORT fused into it
    kept: int = 0  # netlist nodes ORT runs as they are
    fused: int = 0  # nodes ORT created
    error: str | None = None  # why no view could be made (then nothing is absorbed)

    @property
    def runs(self) -> int:
        """Nodes the runtime executes: the kept ones and the fused ones."""
        return self.kept + self.fused

    def describe(self) -> str:
        if self.error:
            return f"ONNX Runtime's load-time fusions not modelled ({self.error}): every cell launches"
        ops = sorted(set(self.anchors.values()))
        return (f"ONNX Runtime's load-time fusions (extended level, CPU provider's view): {self.runs} nodes run, "
                f"{len(self.absorbed)} cells absorbed (no launch) into {self.fused} fused nodes"
                + (f" ({', '.join(ops)})" if ops else ""))


BF16, FP32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT


def _bf16_tensor_as_fp32(tensor: onnx.TensorProto) -> None:
    if tensor.data_type == BF16:
        values = onnx.numpy_helper.to_array(tensor).astype("float32")  # ml_dtypes bfloat16 -> float32, exact
        tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))


def _bf16_as_fp32(proto: onnx.ModelProto) -> None:
    """Retype every bf16 value, tensor and Cast target of the view's graph as fp32, in place (the CPU provider has no
    bf16 kernels; the fusions it applies do not depend on the float type's width)."""
    graph = proto.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == BF16:
            value.type.tensor_type.elem_type = FP32
    for tensor in graph.initializer:
        _bf16_tensor_as_fp32(tensor)
    for node in graph.node:
        for attr in node.attribute:
            if attr.name == "to" and attr.i == BF16:
                attr.i = FP32
            elif attr.type == onnx.AttributeProto.TENSOR:
                _bf16_tensor_as_fp32(attr.t)


FP8_OP = "MatMulBlockQuantizedFp8Weight"


def _fp8_as_matmul(proto: onnx.ModelProto) -> int:
    """Put a MatMul (same name, activation and output; a weightless [K, N] input as B) in place of every fp8 weight
    cell of the view, in place; returns how many."""
    graph = proto.graph
    typed = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    for node in graph.node:  # a Cast's output has its `to` type, recorded or not
        if node.op_type == "Cast" and not node.domain:
            typed.setdefault(node.output[0], next(a.i for a in node.attribute if a.name == "to"))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    count = 0
    for node in graph.node:
        if node.op_type != FP8_OP or node.domain != "com.microsoft":
            continue
        elem = typed.get(node.output[0]) or typed.get(node.input[0])  # the op's T: its output's or activation's type
        dims = shapes.get(node.input[1], [])  # the codes, a weightless input of the view
        if len(dims) != 2 or not all(dims) or elem is None:
            continue  # unknown shapes: the node stays, and ORT says why the view cannot load
        stand_in = f"{node.name}_fp8_weight"
        graph.input.append(onnx.helper.make_tensor_value_info(stand_in, elem, dims[::-1]))
        activation = node.input[0]
        del node.input[:], node.attribute[:]
        node.input.extend([activation, stand_in])
        node.op_type, node.domain = "MatMul", ""
        count += 1
    return count


def _bf16_casts(nodes: list[ir.Node]) -> set[ir.Node]:
    """Casts into or out of bf16: they launch on the GPU, though the fp32 view may pair one with a Cast the CPU
    provider inserted for an fp16 op and drop both."""
    def cast_to_bf16(node) -> bool:
        return node.op_type == "Cast" and node.attributes.get_int("to") == BF16

    def bf16(value) -> bool:  # typed bf16, or (types not inferred) made from bf16 operands by a non-Cast
        if value is None:
            return False
        if value.dtype is not None:
            return value.dtype == ir.DataType.BFLOAT16
        producer = value.producer()
        return producer is not None and (cast_to_bf16(producer) or producer.op_type != "Cast" and any(
            i is not None and i.dtype == ir.DataType.BFLOAT16 for i in producer.inputs))
    return {n for n in nodes if cast_to_bf16(n) or n.op_type == "Cast" and bf16(n.inputs[0])}


def load_view(netlist: Netlist) -> LoadView:
    """The netlist's view through ORT's load-time optimiser; an empty view (with `error`) when ORT cannot load it."""
    model = netlist.model
    if model.functions:
        return LoadView(error="the netlist has local functions")
    nodes = list(model.graph)
    proto = skeleton_proto(model, any_dtype=True, vectors=VECTORS)
    for i, node_proto in enumerate(proto.graph.node):
        node_proto.name = NAME.format(i)
    # the fusions compare operand shapes, which ORT's own inference cannot derive through symbolic dims
    proto.graph.value_info.extend(serde.serialize_value(out) for node in nodes for out in node.outputs
                                  if out is not None and out.name and out.type is not None and out.shape is not None
                                  and not out.is_graph_output())
    _bf16_as_fp32(proto)
    _fp8_as_matmul(proto)
    with tempfile.TemporaryDirectory(prefix="softsyn-view-") as tmp:
        target = Path(tmp) / "optimized.onnx"
        settings = SessionSettings(provider="cpu", optimized_model_filepath=str(target), log_severity=3,
                                   options=(("graph_optimization_level", "ORT_ENABLE_EXTENDED"),))
        try:
            open_session(proto, settings)
            optimised = onnx.load(str(target), load_external_data=False).graph
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            return LoadView(error=f"onnxruntime cannot load the graph: {type(exc).__name__}: {str(exc)[:120]}")
    names = {NAME.format(i): node for i, node in enumerate(nodes)}
    producer = {out.name: node for node in nodes for out in node.outputs if out is not None and out.name}
    kept = [names[n.name] for n in optimised.node if n.name in names]
    anchors: dict[ir.Node, str] = {}
    fused = 0  # nodes ORT made in place of netlist ones (a Split may become several Gathers)
    orphans: list[str] = []  # op types of nodes ORT made that no netlist output names (rewritten chains)
    expanded: set[str] = set()  # ops the CPU provider ran as their function body (fp16 Softmax...): one kernel on a GPU
    for n in optimised.node:
        if n.name in names:
            continue
        inlined = next((m.group(1) for o in n.output if (m := INLINED.search(o))), None)
        if inlined or n.name.startswith(CPU_CAST):
            expanded.update([inlined] if inlined else [])
            continue  # the CPU provider's own: a GPU provider has the kernel
        anchor = next((producer[o] for o in n.output if o in producer), None)
        if anchor is not None:
            anchors.setdefault(anchor, n.op_type)
            fused += 1
        elif n.op_type != "Constant":
            orphans.append(n.op_type)
    ran = set(kept) | {node for node in nodes if node.op_type in expanded} | _bf16_casts(nodes)
    run = ran | set(anchors)
    gone = [node for node in nodes if node not in run]
    # An orphan still launches: it gives its launch back to a vanished node of its op type, else to any vanished
    # node that computes at run time, so the view launches as many nodes as ORT's graph holds.
    by_op: dict[str, list[ir.Node]] = {}
    for node in gone:
        by_op.setdefault(node.op_type, []).append(node)
    live = [node for node in gone if node.op_type != "Constant" and not all(
        v is None or v.is_initializer() or (v.producer() is not None and v.producer().op_type == "Constant")
        for v in node.inputs)]
    relaunch: set[ir.Node] = set()
    for op in orphans:
        same = by_op.get(op)
        if same:
            relaunch.add(same.pop(0))
    rest = iter(node for node in live if node not in relaunch)
    for _ in range(len(orphans) - len(relaunch)):  # orphans of an op no vanished node had
        node = next(rest, None)
        if node is None:
            break
        relaunch.add(node)
    absorbed = frozenset(node for node in gone if node not in relaunch)
    return LoadView(absorbed=absorbed, anchors=anchors, kept=len(ran) + len(relaunch),
                    fused=fused)
