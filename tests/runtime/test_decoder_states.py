"""decoder_io reads a hybrid decoder's state ports (past.N.conv / past.N.recurrent with their presents) beside KV
layers numbered with gaps, and names a state port it cannot pair."""
from __future__ import annotations

import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from softsyn.runtime.decoder import NotDecoder, decoder_io


def _model(states=(("conv", [256, 3]), ("recurrent", [4, 32, 32])), drop_present: str | None = None) -> ir.Model:
    """input_ids, KV of layer 1, states of layer 0 -> logits and the presents (Identity nodes)."""
    ins = [oh.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq"]),
           oh.make_tensor_value_info("attention_mask", T.INT64, ["batch", "total"])]
    outs = [oh.make_tensor_value_info("logits", T.FLOAT, ["batch", "seq", 1024])]
    nodes = [oh.make_node("Constant", [], ["logits"], value=oh.make_tensor("z", T.FLOAT, [1, 1, 1024], [0.0] * 1024))]
    for kind in ("key", "value"):
        ins.append(oh.make_tensor_value_info(f"past_key_values.1.{kind}", T.FLOAT, ["batch", 2, "past", 32]))
        outs.append(oh.make_tensor_value_info(f"present.1.{kind}", T.FLOAT, ["batch", 2, "total", 32]))
        nodes.append(oh.make_node("Identity", [f"past_key_values.1.{kind}"], [f"present.1.{kind}"]))
    for kind, shape in states:
        ins.append(oh.make_tensor_value_info(f"past.0.{kind}", T.FLOAT, ["batch", *shape]))
        if kind != drop_present:
            outs.append(oh.make_tensor_value_info(f"present.0.{kind}", T.FLOAT, ["batch", *shape]))
            nodes.append(oh.make_node("Identity", [f"past.0.{kind}"], [f"present.0.{kind}"]))
    graph = oh.make_graph(nodes, "hybrid", ins, outs)
    return ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))


def test_state_ports_beside_kv_layers_with_gaps():
    io = decoder_io(_model())
    assert [layer.index for layer in io.layers] == [1]
    assert io.template("past_key_names") == "past_key_values.%d.key"
    assert [(p.layer, p.kind, p.past, p.present, p.shape) for p in io.states] == [
        (0, "conv", "past.0.conv", "present.0.conv", (256, 3)),
        (0, "recurrent", "past.0.recurrent", "present.0.recurrent", (4, 32, 32))]


def test_a_state_without_its_present_is_named():
    with pytest.raises(NotDecoder, match=r"past\.0\.recurrent: no output present\.0\.recurrent"):
        decoder_io(_model(drop_present="recurrent"))


def test_a_state_of_symbolic_size_is_named():
    with pytest.raises(NotDecoder, match=r"state input past\.0\.conv: shape \['batch', 256, 'width'\]"):
        decoder_io(_model(states=(("conv", [256, "width"]),)))
