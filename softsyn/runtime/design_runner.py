"""The design runner: the design as it stands, or with some cells rewritten, run on every path group's seeded inputs.

Shared by the loop's sensitivity and end-to-end checks (passes.optimize.sensitivity subclasses it to quantise cells)
and by kv_layout's KV calibration and the KV moves (the design's own outputs). Weights travel as ORT external
initializers (numpy arrays the session reads), never in the protobuf: no 2 GB limit, no copy per run. Where: the
target's device when it is here (the CUDA provider for a CUDA library's design, when a session opens), else ORT CPU
through the CPU view verify uses (softsyn.runtime.gqa_view, softsyn.runtime.fp8_view, softsyn.runtime.bf16_view).
"""
from __future__ import annotations

import gc
import math

import numpy as np
import onnx
import onnx_ir as ir

from softsyn.netlist.keys import FP8_MATMUL as FP8_OP
from softsyn.runtime.bf16_view import expand_bf16_matmuls
from softsyn.runtime.fp8_view import expand_fp8_matmuls
from softsyn.runtime.gqa_view import expand_qk_norms
from softsyn.runtime.inputs import scenario_inputs
from softsyn.runtime.session import (SessionSettings, external_initializer, host_array, open_session,
                                     provider_opens)

SEED = 0
EXTERNAL_MIN = 1 << 16  # initializers of at least this many bytes go to the session as external initializers


class CannotRun(Exception):
    """ORT cannot run the design on any provider here (e.g. an op without a kernel): the message says why."""


def target_provider(design) -> str:
    """"cuda" for a CUDA library's design where onnxruntime's CUDA provider opens a session here, else "cpu"."""
    if not design.library.is_gpu or "cuda" not in design.library.provider.lower() or not provider_opens("cuda"):
        return "cpu"
    return "cuda"


def stub(t: onnx.TensorProto) -> onnx.TensorProto:
    """The initializer's header, its data named external (the session gets the array itself)."""
    return external_initializer(t.name, t.data_type, t.dims, location="softsyn-sensitivity")


class DesignRunner:
    """Runs the design, or the design with some MatMuls quantised, on every group's seeded inputs, on `provider`
    (default: target_provider); a CUDA session that does not open falls back to the CPU view, said in `where`."""
    def __init__(self, design, provider: str | None = None):
        proto = ir.to_proto(design.netlist.model)
        values = design.netlist.model.graph.initializers
        self.arrays: dict[str, tuple[int, np.ndarray]] = {}  # name -> (onnx elem type, array): external initializers
        for i, t in enumerate(proto.graph.initializer):
            if t.data_location == onnx.TensorProto.EXTERNAL or len(t.raw_data) >= EXTERNAL_MIN:
                self.arrays[t.name] = (t.data_type, host_array(values[t.name].const_value.numpy()))
                proto.graph.initializer[i].CopyFrom(stub(t))
        self.proto = proto
        names = {t.name for t in proto.graph.initializer}
        self.transposed = {n.output[0]: n.input[0] for n in proto.graph.node  # Transpose(W) weights
                           if n.op_type == "Transpose" and n.input and n.input[0] in names}
        self.feeds = {g.name: scenario_inputs(design.netlist, g.scenario.dims, seed=SEED) for g in design.groups}
        self.provider, self.where = provider or target_provider(design), ""
        self.fp8_view = False
        if self.provider == "cuda":
            try:
                self.where = "ORT CUDA"
                self.reference = self.run({})
                return
            except CannotRun as exc:
                self.provider, self.where = "cpu", f" (the CUDA session did not open: {str(exc)[:120]})"
        self._cpu_view()
        self.reference = self.run({})

    def _cpu_view(self) -> None:
        viewed = expand_qk_norms(self.proto)
        self.fp8_view = True  # fp8 and bf16 cells (the design's own, or a map's) run as their views: no CPU kernel
        self.where = "ORT CPU" + (f" (CPU view: q/k norms outside {viewed} GroupQueryAttention nodes)" if viewed
                                  else "") + self.where

    def node(self, name: str) -> onnx.NodeProto:
        return self.proto.graph.node[self.index[name]]

    def _array(self, name: str) -> np.ndarray:
        if name in self.arrays:
            return self.arrays[name][1]
        return onnx.numpy_helper.to_array(next(t for t in self.proto.graph.initializer if t.name == name))

    def _weight(self, name: str) -> np.ndarray | tuple[np.ndarray, ...]:
        """A MatMul cell's weight [K, N]; an MoE cell's expert weights (fc1, fc2: its inputs 2 and 4)."""
        node = self.node(name)
        if node.op_type == "MoE":
            return self._array(node.input[2]), self._array(node.input[4])
        source = self.transposed.get(node.input[1])
        weight = self._array(source or node.input[1])
        return weight.T if source else weight

    @property
    def index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.proto.graph.node)}

    def quantise_cell(self, name: str, weight: np.ndarray, precision: str):
        """(the node that replaces cell `name` at `precision`, its initializers), or None to leave it as it is: the
        plain runner rewrites nothing; passes.optimize.sensitivity.Runner quantises. The node may be a list of nodes
        in order (a bf16 cell's Casts and MatMul), the last writing the cell's output: their inputs are names as
        they stand, the initializers' renamed alike."""
        return None

    def run(self, mapping: dict[str, str]) -> dict[str, list[np.ndarray]]:
        """Outputs per group with `mapping`'s cells quantised (the proto is restored afterwards)."""
        graph = self.proto.graph
        index = self.index
        saved, added, external = {}, 0, dict(self.arrays)
        before: dict[int, list] = {}  # node index -> the nodes a multi-node cell puts before it
        for name, precision in mapping.items():
            quantised = self.quantise_cell(name, self._weight(name), precision)
            if quantised is None:
                continue
            i = index[name]
            node = graph.node[i]
            qnode, inits = quantised
            renamed = {t.name: f"{node.input[1]}.sens.{t.name}" for t in inits}
            for t in inits:
                t.name = renamed[t.name]
                if len(t.raw_data) >= EXTERNAL_MIN:
                    external[t.name] = (t.data_type, host_array(onnx.numpy_helper.to_array(t)))
                    t.CopyFrom(stub(t))
            if isinstance(qnode, list):  # names as they stand, the cell's initializers renamed
                for n in qnode:
                    n.input[:] = [renamed.get(x, x) for x in n.input]
                before[i], qnode = qnode[:-1], qnode[-1]
            else:  # the cell's own initializers renamed; its other inputs the node's at the same position
                qnode.input[:] = [renamed.get(x) or (node.input[j] if x else "") for j, x in enumerate(qnode.input)]
            qnode.output[:] = list(node.output)
            saved[i] = onnx.NodeProto()
            saved[i].CopyFrom(node)
            node.CopyFrom(qnode)
            graph.initializer.extend(inits)
            added += len(inits)
        if saved and not any(o.domain == "com.microsoft" for o in self.proto.opset_import):
            self.proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        model = self.proto
        if before:  # a copy with the extra nodes in place (big weights are stubs: the copy is the graph)
            model = onnx.ModelProto()
            model.CopyFrom(self.proto)
            nodes = [x for j, n in enumerate(model.graph.node) for x in (*before.get(j, ()), n)]
            del model.graph.node[:]
            model.graph.node.extend(nodes)
        used = {x for n in model.graph.node for x in n.input}
        external = {name: v for name, v in external.items() if name in used}  # ORT drops the unused before it reads
        session = None
        if self.fp8_view and any(n.op_type == FP8_OP for n in model.graph.node):
            model = self._copy(model)
            expand_fp8_matmuls(model, external)
        if self.fp8_view and any(t.data_type == onnx.TensorProto.BFLOAT16 for t in model.graph.initializer):
            model = self._copy(model)
            expand_bf16_matmuls(model)
        try:
            session = open_session(model, SessionSettings(provider=self.provider, log_severity=3), external)
            return {g: session.run(None, feeds) for g, feeds in self.feeds.items()}
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise CannotRun(" ".join(str(exc).split())[:300]) from None
        finally:
            del session, external, model  # one session (and one set of quantised weights) at a time
            gc.collect()
            for i, node in saved.items():
                graph.node[i].CopyFrom(node)
            for _ in range(added):
                graph.initializer.pop()

    def _copy(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """`model` itself when it is a copy already, else a copy of the runner's proto (whose graph run restores)."""
        if model is not self.proto:
            return model
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy

    def error(self, mapping: dict[str, str]) -> float:
        """verify's relative error (max|quantised - design| / max|design|, softsyn.flow.verify.compare) of the
        quantised design against the design, the worst over outputs and groups."""
        got = self.run(mapping)
        worst = 0.0
        for g, outputs in got.items():
            for have, want in zip(outputs, self.reference[g]):
                scale = float(np.abs(want.astype(np.float64)).max()) if want.size else 0.0
                diff = float(np.abs(have.astype(np.float64) - want).max()) if want.size else 0.0
                worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
        return worst
