"""A Scan (a hybrid decoder's delta rule) through the fp16 map and the CUDA-graph decision: its body stays fp32 with
the outer constants it reads (the model still loads and computes the same), and a graph holding control flow is not
captured (ORT refuses enable_cuda_graph on such a model)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper

from softsyn.library import load_library
from softsyn.netlist import Netlist
from softsyn.timing.capture import group_launch
from passes.precision.fp16 import to_fp16


def _scan_model() -> ir.Model:
    """x [seq, 1, 8] -> MatMul(W) -> Scan(state' = state * decay + h) -> MatMul(W) -> y; `decay` an outer
    initializer the body reads."""
    body = oh.make_graph(
        [oh.make_node("Mul", ["s", "decay"], ["m"]), oh.make_node("Add", ["m", "h"], ["s2"]),
         oh.make_node("Identity", ["s2"], ["o"])], "body",
        [oh.make_tensor_value_info("s", T.FLOAT, [1, 8]), oh.make_tensor_value_info("h", T.FLOAT, [1, 8])],
        [oh.make_tensor_value_info("s2", T.FLOAT, [1, 8]), oh.make_tensor_value_info("o", T.FLOAT, [1, 8])])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
             numpy_helper.from_array(np.full((1, 8), 0.9, np.float32), "decay")]
    nodes = [oh.make_node("MatMul", ["x", "W"], ["h_all"], name="proj"),
             oh.make_node("Scan", ["state", "h_all"], ["final", "ys"], body=body, num_scan_inputs=1, name="scan"),
             oh.make_node("MatMul", ["ys", "W"], ["y"], name="out")]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("state", T.FLOAT, [1, 8]),
                                       oh.make_tensor_value_info("x", T.FLOAT, ["seq", 1, 8])],
                          [oh.make_tensor_value_info("final", T.FLOAT, [1, 8]),
                           oh.make_tensor_value_info("y", T.FLOAT, ["seq", 1, 8])], inits,
                          value_info=[oh.make_tensor_value_info(n, T.FLOAT, ["seq", 1, 8]) for n in ("h_all", "ys")])
    return ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))


def _run(model: ir.Model, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in sess.get_inputs()}
    return sess.run(None, {k: v.astype(np.float16 if types[k] == "tensor(float16)" else np.float32)
                           for k, v in feeds.items()})


def test_fp16_keeps_a_scan_and_its_outer_constants_fp32():
    rng = np.random.default_rng(1)
    feeds = {"state": rng.standard_normal((1, 8)), "x": rng.standard_normal((5, 1, 8))}
    reference = _run(_scan_model(), feeds)
    model = _scan_model()
    result = to_fp16(model)
    assert result.islands.get("control_flow") == 1
    assert model.graph.initializers["decay"].dtype == ir.DataType.FLOAT  # read inside the body only
    assert model.graph.initializers["W"].dtype == ir.DataType.FLOAT16
    for got, want in zip(_run(model, feeds), reference):
        assert got.dtype == np.float16 and np.abs(got.astype(np.float32) - want).max() <= 2e-2 * np.abs(want).max()


def test_a_graph_with_control_flow_is_not_captured():
    nl = Netlist(_scan_model(), "scan", kind="causal")
    launch = group_launch(nl, load_library("h200-ort-cuda"), {"batch": 1, "seq": 1, "past": 4}, shared=True)
    assert not launch.captured and "node scan: Scan is control flow" in launch.reason
