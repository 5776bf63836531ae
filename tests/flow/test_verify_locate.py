"""verify --locate: every node output probed on two providers, and the node where the values start to depart named
(the GPU side is replaced here by the same run with one node's output corrupted: the walk must name that node,
not the nodes downstream that only inherit its error)."""
import json
import shutil

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from helpers import cli
from reports.verify import report_verify
import onnx_ir as ir
import onnxruntime as ort

import softsyn.flow.verify as verify_module
from softsyn.flow.verify_locate import Departure, Located, both_runs, departures, rel_error, routing_flips
from softsyn.netlist import Netlist
from softsyn.runtime.decoder import kv_aliases
from softsyn.runtime.inputs import scenario_inputs
from softsyn.results.verify import OutputCheck, VerifyResult


def _model(path):
    """x -> Relu -> Mul(w) -> Add(x) -> Softmax -> y, w stored as external data beside the model."""
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, 64, dtype=np.float32).reshape(8, 8), "w")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("MatMul", ["r", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "x"], ["a"], name="add"), helper.make_node("Softmax", ["a"], ["y"], name="sm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
              size_threshold=0)
    return model


def test_every_node_output_is_probed_and_the_copy_is_removed(tmp_path):
    path = tmp_path / "model.onnx"
    _model(path)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    first, second = both_runs(path, feeds, {}, "cpu")
    assert set(first) == {"r", "m", "a", "y"} == set(second)
    assert all(rel_error(first[k], second[k]) == 0.0 for k in first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_the_walk_names_the_node_that_departs_not_the_ones_downstream(tmp_path):
    path = tmp_path / "model.onnx"
    model = _model(path)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    gpu, cpu = both_runs(path, feeds, {}, "cpu")
    gpu["m"] = gpu["m"] * 1.5  # a MatMul kernel computing another function on "the GPU"
    gpu["a"] = gpu["m"] + feeds["x"]
    gpu["y"] = np.exp(gpu["a"]) / np.exp(gpu["a"]).sum(-1, keepdims=True)
    errors = {k: rel_error(gpu[k], cpu[k]) for k in gpu}
    found = departures(model.graph, errors, 1e-2)
    assert [(d.node, d.op, d.output) for d in found] == [("mm", "MatMul", "m")]
    assert found[0].rel > 0.3 and found[0].inputs_rel == 0.0


def _moe_graph(k: int) -> onnx.GraphProto:
    """router MatMul -> com.microsoft.MoE (top-k over 8 experts): departures reads the structure, nothing runs."""
    nodes = [helper.make_node("MatMul", ["x", "w_router"], ["logits"], name="router"),
             helper.make_node("MoE", ["x", "logits", "w1", "w2"], ["moe_out"], name="moe", domain="com.microsoft", k=k)]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 16])],
                             [helper.make_tensor_value_info("moe_out", TensorProto.FLOAT16, [4, 16])])


def test_a_moe_departure_says_how_many_tokens_were_routed_another_way():
    """Token 2's 2nd and 3rd experts are nearly tied: fp16-sized noise on the router logits swaps them on "the GPU",
    so that token (and only it) picks another top-2 set; the node is named with the count, as a routing flip. With
    no tie broken, the departure says every token picked the same experts (a kernel difference, then)."""
    rng = np.random.default_rng(0)
    cpu_logits = rng.standard_normal((4, 8)) * 2
    cpu_logits[2, :3] = [5.0, 3.0, 2.9996]
    gpu_logits = cpu_logits.copy()
    gpu_logits[2, 2] = 3.0004
    graph = _moe_graph(2)
    errors = {"logits": rel_error(gpu_logits, cpu_logits), "moe_out": 0.2}
    found = departures(graph, errors, 1e-2, ({"logits": gpu_logits}, {"logits": cpu_logits}))
    assert [(d.node, d.op) for d in found] == [("moe", "MoE")]
    assert found[0].cause.startswith("routing: 1 of 4 tokens pick another top-2 expert set")
    assert "not a kernel fault" in found[0].cause
    same = routing_flips(graph.node[1], {"logits": cpu_logits + 1e-6}, {"logits": cpu_logits})
    assert same == "routing: all 4 tokens pick the same top-2 experts on both providers"
    assert routing_flips(graph.node[0], {"logits": gpu_logits}, {"logits": cpu_logits}) == ""  # not an expert op
    text = report_verify(_result([Located("prefill", "cuda", 9, tuple(found))]), "x")
    assert "prefill moe: routing: 1 of 4 tokens" in text


def test_rel_error_reads_shapes_and_integer_routing():
    assert rel_error(np.zeros((2, 3)), np.zeros((3, 2))) == float("inf")
    assert rel_error(np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4])) == 0.25
    assert rel_error(np.array([1.0, 2.0]), np.array([1.0, 4.0])) == 0.5
    mask = np.array([0.0, -np.inf, 2.0])
    assert rel_error(mask.copy(), mask) == 0.0 and rel_error(np.array([0.0, 1.0, 2.0]), mask) == float("inf")
    masked_row = np.array([np.nan, 1.0, 2.0])  # a softmax over a fully masked row, the same on both providers
    assert rel_error(masked_row.copy(), masked_row) == 0.0


def _result(located):
    check = OutputCheck(scenario="prefill", output="logits", max_abs=1.0, rel=1.2, cosine=0.1, top1=None,
                        violations=["rel error 1.2e+00 > 2.0e-02"])
    return VerifyResult(checks=[check], max_rel_error=2e-2, budget_source="default for fp16", min_top1=None,
                        provider="CUDAExecutionProvider", reference={}, precision="fp16", located=located)


def test_the_report_lists_the_nodes_located_or_says_why_none():
    found = Located("prefill", "cuda", 245, (Departure("layers.0/LinearAttention_1", "LinearAttention", "attn_out",
                                                       0.61, 3.1e-4),), unprobed_rel=0.61)
    text = report_verify(_result([found]), "out/x")
    row = next(line for line in text.splitlines() if "layers.0/LinearAttention_1" in line)
    assert "LinearAttention" in row and "6.100e-01" in row and "3.100e-04" in row and "attn_out" in row
    fused = report_verify(_result([Located("prefill", "cuda", 245, (), unprobed_rel=0.3)]), "x")
    assert "no node departs with every output probed" in fused and "load-time fusion" in fused
    agree = report_verify(_result([Located("prefill", "cuda", 245, (), unprobed_rel=1e-4)]), "x")
    assert "agree on all 245 values" in agree and "verify --cpu" in agree


def test_located_runs_a_compiled_decoder_with_its_shared_kv_buffer(tiny_cpu_artifact):
    """verify's locate step (_located) on a real artifact, its shared past/present buffer bound in place: the
    probed runs (both on the CPU here) agree on every value, and the unprobed run's outputs agree with them, so the
    report says the providers agree; the feeds given are not written into."""
    netlist = Netlist.from_model(ir.load(str(tiny_cpu_artifact / "model.onnx")))
    aliases = kv_aliases(netlist)
    assert aliases  # the artifact shares its KV buffer: present bound onto past
    layout = verify_module.shared_layout(netlist.model)  # the past fed in the buffer's first slots, as verify does
    feeds = {k: layout.feed(k, v) for k, v in scenario_inputs(netlist, {"batch": 1, "seq": 1, "past": 5}).items()}
    kept = {k: v.copy() for k, v in feeds.items()}
    session = ort.InferenceSession(str(tiny_cpu_artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    fed = {k: v.copy() for k, v in feeds.items()}  # alive while the bound run's outputs are read (as in verify)
    unprobed = {k: np.array(v) for k, v in zip([o.name for o in session.get_outputs()],
                                                verify_module.run_compiled(session, fed, aliases, "cpu"))}
    check = OutputCheck(scenario="decode", output="logits", max_abs=1.0, rel=1.0, cosine=0.0, top1=None,
                        violations=["rel error"])
    result = VerifyResult(checks=[check], max_rel_error=1e-4, budget_source="x", min_top1=None,
                          provider="CPUExecutionProvider", reference={}, precision="fp32")
    (found,) = verify_module._located(tiny_cpu_artifact / "model.onnx", result, fed={"decode": feeds},
                                      gpu={"decode": unprobed}, aliases=aliases, progress=False)
    assert found.scenario == "decode" and found.departures == () and found.compared > 50
    assert found.unprobed_rel is not None and found.unprobed_rel < 1e-6
    assert all(np.array_equal(feeds[k], kept[k]) for k in feeds)
    assert sorted(p.name for p in tiny_cpu_artifact.iterdir() if p.name.startswith(".")) == []


def test_locate_on_a_cpu_run_says_there_is_nothing_to_compare(tiny_cpu_artifact, tmp_path, capsys, cache_dir):
    # a violated budget on the CPU provider: the checks print as without --locate, and one stderr line says why
    # nothing was located
    copy = tmp_path / "art"
    shutil.copytree(tiny_cpu_artifact, copy)
    session = copy / "runtime" / "session.json"
    settings = json.loads(session.read_text())
    settings["accuracy"] = {**(settings.get("accuracy") or {}), "max_rel_error": 1e-12}
    session.write_text(json.dumps(settings))
    code, out, err = cli(capsys, "verify", copy, "--locate", "--cache-dir", cache_dir, "-q")
    assert code == 1 and "VIOLATED" in out and "Located:" not in out
    assert "softsyn verify --locate: nothing located" in err and "CPUExecutionProvider" in err
