"""passes.fuse.chain: a pattern's hops as Links, followed forward (each value read by exactly one node, besides
allowed side readers) or traced back (each value made by a node), with optional and repeated links; a broken chain
is a reason naming the value it broke at. Attention's straight hops are such chains (passes.fuse.attention)."""
import onnx
import onnx.helper as oh
import onnx_ir as ir

from passes.fuse.attention import CACHE_APPEND, LAYOUT_BACK, PROBS_TO_V
from passes.fuse.chain import Link, follow, reached, trace

F = onnx.TensorProto.FLOAT


def _graph(nodes, inputs=("s", "v"), outputs=("out",)):
    """An onnx_ir graph of `nodes` over 4-D float inputs (shapes left open: the chains look at structure)."""
    vi = [oh.make_tensor_value_info(n, F, None) for n in inputs]
    vo = [oh.make_tensor_value_info(n, F, None) for n in outputs]
    model = oh.make_model(oh.make_graph(nodes, "g", vi, vo), opset_imports=[oh.make_opsetid("", 18)])
    graph = ir.serde.deserialize_model(model).graph
    return graph, {v.name: v for n in graph for v in n.outputs} | {v.name: v for v in graph.inputs}


def _ops(nodes):
    return [n.op_type for n in nodes]


def test_probs_reach_v_with_or_without_the_nan_guard():
    _, values = _graph([oh.make_node("Softmax", ["s"], ["probs"], name="sm"),
                              oh.make_node("IsNaN", ["probs"], ["nan"]),
                              oh.make_node("Where", ["nan", "s", "probs"], ["safe"], name="guard"),
                              oh.make_node("MatMul", ["safe", "v"], ["out"], name="pv")])
    assert _ops(follow(values["probs"], "softmax output", *PROBS_TO_V)) == ["Where", "MatMul"]
    _, values = _graph([oh.make_node("Softmax", ["s"], ["probs"]), oh.make_node("MatMul", ["probs", "v"], ["out"])])
    assert _ops(follow(values["probs"], "softmax output", *PROBS_TO_V)) == ["MatMul"]


def test_a_where_that_is_no_nan_guard_is_no_link_and_the_reason_names_the_probs():
    """Where(mask, s, probs) changes the probabilities: it is not skipped as a guard; the chain breaks at probs."""
    _, values = _graph([oh.make_node("Softmax", ["s"], ["probs"]), oh.make_node("Where", ["m", "s", "probs"], ["w"],
                                                                                 name="fill"),
                        oh.make_node("MatMul", ["w", "v"], ["out"])], inputs=("s", "v", "m"))
    assert follow(values["probs"], "softmax output", *PROBS_TO_V) == \
        "softmax output (probs) feeds Where (fill), not MatMul(probs, V)"
    _, values = _graph([oh.make_node("Softmax", ["s"], ["probs"]), oh.make_node("MatMul", ["v", "probs"], ["out"],
                                                                                 name="vp")])
    assert follow(values["probs"], "softmax output", *PROBS_TO_V) == ("softmax output (probs) feeds MatMul (vp), not "
                                                                       "MatMul(probs, V): probs is its second operand, "
                                                                       "not the first")


def test_traced_back_through_layout_ops_to_the_cache_concat():
    _, values = _graph([oh.make_node("Concat", ["past", "new"], ["present"], axis=-2, name="cat"),
                            oh.make_node("Unsqueeze", ["present", "ax"], ["u"]),
                            oh.make_node("Expand", ["u", "shape"], ["e"]),
                            oh.make_node("Reshape", ["e", "shape"], ["out"])],
                           inputs=("past", "new", "ax", "shape"))
    layout = trace(values["out"], "K operand", LAYOUT_BACK)
    assert _ops(layout) == ["Reshape", "Expand", "Unsqueeze"]
    source = reached(values["out"], layout, forward=False)
    assert source.name == "present" and _ops(trace(source, "K source", CACHE_APPEND)) == ["Concat"]
    assert trace(values["present"], "K operand", LAYOUT_BACK) == []  # a repeated link may match nothing


def test_a_broken_trace_names_the_value_and_why():
    _, values = _graph([oh.make_node("Relu", ["past"], ["p"], name="act"),
                        oh.make_node("Concat", ["p", "new"], ["out"], axis=2, name="cat")], inputs=("past", "new"))
    assert trace(values["out"], "K source", CACHE_APPEND) == ("K source (out) comes from Concat (cat), not the "
                                                              "KV-cache Concat(past, new, axis=-2): its past (p) is "
                                                              "not a graph input")
    assert trace(values["past"], "K source", CACHE_APPEND) == ("K source (past) comes from nothing, not the KV-cache "
                                                               "Concat(past, new, axis=-2)")


def test_times_bound_a_repeated_link_and_least_makes_it_required():
    _, values = _graph([oh.make_node("Relu", ["s"], ["a"]), oh.make_node("Relu", ["a"], ["b"]),
                        oh.make_node("Relu", ["b"], ["out"], name="third")], inputs=("s",))
    relu = Link("Relu", ("Relu",))
    assert len(follow(values["s"], "x", Link("Relu", ("Relu",), times=(0, 2)))) == 2
    assert len(follow(values["s"], "x", Link("Relu", ("Relu",), times=(1, None)))) == 3
    assert follow(values["s"], "x", relu, relu, relu, Link("Tanh", ("Tanh",), times=(1, 2))) == \
        ("Relu (out) has 0 consumers and is a graph output (an intermediate of the pattern is used outside it), "
         "not only Tanh")
