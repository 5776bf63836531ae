"""softsyn.names: a pass's new names count on from the netlist's own _fz indices, so they depend on the
netlist alone (two compiles in one process are byte-identical) and never repeat a name an artifact compiled before
already holds."""
import onnx_ir as ir
from onnx import TensorProto as T
from onnx import helper as oh

from softsyn.names import fresh, restart_names


def _model(*names: str) -> ir.Model:
    vi = oh.make_tensor_value_info
    nodes, prev = [], "x"
    for name in names:
        nodes.append(oh.make_node("Relu", [prev], [f"{name}_out"], name=name))
        prev = f"{name}_out"
    graph = oh.make_graph(nodes, "g", [vi("x", T.FLOAT, [2])], [vi(prev, T.FLOAT, [2])])
    return ir.serde.deserialize_model(oh.make_model(graph))


def test_names_restart_past_the_models_own_and_repeat_for_the_same_model():
    plain = _model("relu")
    restart_names(plain)
    first = [fresh("Cast") for _ in range(3)]
    fresh("Other")  # what else this process named in between
    restart_names(plain)
    assert [fresh("Cast") for _ in range(3)] == first == ["Cast_fz0", "Cast_fz1", "Cast_fz2"]
    compiled = _model("Cast_fz3", "Add_fz11_out0_fz12")  # an artifact compiled before, read again
    restart_names(compiled)
    assert fresh("Cast") == "Cast_fz13"
