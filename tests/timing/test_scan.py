"""A Scan cell is timed as its body's cells (each from the library, at the body's shapes) times its trip count: a
recurrent loop over the sequence costs in proportion to the tokens, not one element-wise launch."""
from __future__ import annotations

import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from softsyn.library import load_library
from softsyn.netlist import Netlist
from softsyn.timing.cost import node_work, precision_of
from softsyn.timing.sta import cell_timings


def _scan_netlist() -> Netlist:
    """state [batch, 64] scanned over x [seq, batch, 64]: state' = state * x + x, y = state' (Mul, Add, Identity)."""
    body = oh.make_graph(
        [oh.make_node("Mul", ["s", "x"], ["m"]), oh.make_node("Add", ["m", "x"], ["s2"]),
         oh.make_node("Identity", ["s2"], ["y"])], "body",
        [oh.make_tensor_value_info("s", T.FLOAT, ["batch", 64]), oh.make_tensor_value_info("x", T.FLOAT, ["batch", 64])],
        [oh.make_tensor_value_info("s2", T.FLOAT, ["batch", 64]), oh.make_tensor_value_info("y", T.FLOAT, ["batch", 64])],
        value_info=[oh.make_tensor_value_info("m", T.FLOAT, ["batch", 64])])
    scan = oh.make_node("Scan", ["state", "xs"], ["final", "ys"], body=body, num_scan_inputs=1, name="scan")
    graph = oh.make_graph([scan], "g", [oh.make_tensor_value_info("state", T.FLOAT, ["batch", 64]),
                                        oh.make_tensor_value_info("xs", T.FLOAT, ["seq", "batch", 64])],
                          [oh.make_tensor_value_info("final", T.FLOAT, ["batch", 64]),
                           oh.make_tensor_value_info("ys", T.FLOAT, ["seq", "batch", 64])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    return Netlist(ir.serde.deserialize_model(model), "scan", kind="causal")


def test_a_scan_costs_its_body_once_per_token():
    nl, lib = _scan_netlist(), load_library("cpu-ort")
    (short,) = cell_timings(nl, lib, nl.bind({"batch": 1, "seq": 8}))
    (long,) = cell_timings(nl, lib, nl.bind({"batch": 1, "seq": 32}))
    assert short.source == long.source == "est"
    assert long.delay == pytest.approx(4 * short.delay) and short.delay > 0
    scan = next(iter(nl.model.graph))
    body = scan.attributes["body"].value
    inner = {v.name: (1, 64) for n in body for v in (*n.inputs, *n.outputs)}
    works = [(n, node_work(n, inner)) for n in body]
    per_token = sum(lib.node_timing(n.op_type, precision_of(n), w.flops, w.bytes, w.sizes)[0] for n, w in works)
    assert short.delay == pytest.approx(8 * per_token)
