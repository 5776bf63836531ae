"""The runtime view: what ONNX Runtime launches after its load-time fusions, and the GPU timing that follows it."""
from __future__ import annotations

import collections

import onnx
import pytest

from families import export_family
from softsyn.design import Design
from softsyn.frontends import read_design
from softsyn.runtime.load_view import load_view
from softsyn.runtime.session import SessionSettings, open_session


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return export_family("gpt2", tmp_path_factory.mktemp("view"))


def ort_graph(path, tmp_path):
    """The graph ORT itself runs for the file with its weights (CPU provider, extended level)."""
    target = tmp_path / "optimised.onnx"
    open_session(str(path), SessionSettings(provider="cpu", optimized_model_filepath=str(target), log_severity=3,
                                            options=(("graph_optimization_level", "ORT_ENABLE_EXTENDED"),)))
    return onnx.load(str(target), load_external_data=False).graph


def test_the_weightless_view_launches_what_ort_runs_with_the_weights(gpt2, tmp_path):
    netlist = read_design(str(gpt2), progress=False)
    view = load_view(netlist)
    real = ort_graph(gpt2, tmp_path)
    assert view.error is None
    assert view.runs == len(real.node) < len(netlist.nodes())
    # GPT-2's tanh GELU chain (Mul/Pow/Tanh) is one FastGelu per layer: its nodes launch nothing
    assert collections.Counter(view.anchors.values())["FastGelu"] == 2
    gone = collections.Counter(n.op_type for n in view.absorbed)
    assert gone["Tanh"] == 2 and gone["Pow"] == 2
    assert all(n not in view.absorbed for n in netlist.nodes() if n.op_type in ("MatMul", "Gemm"))


def test_a_gpu_target_times_one_launch_per_node_ort_runs(gpt2, tmp_path):
    cons = tmp_path / "c.yaml"
    cons.write_text("clock_period: 2000ms\ntarget: h200-ort-cuda\nworkload: {batch: 1, prompt_len: 16}\n")
    design = Design.load(str(gpt2), cons, progress=False)
    fused = design.time()[0].paths[0].arrival
    assert design.runtime_view.runs < len(design.netlist.nodes())
    design.runtime_view = type(design.runtime_view)()  # nothing absorbed: every netlist node launches
    unfused = design.time()[0].paths[0].arrival
    launch = design.library.ceilings.launch_overhead
    saved = len(design.netlist.nodes()) - Design.load(str(gpt2), cons, progress=False).runtime_view.runs
    # host-bound at this size: the difference is the launches of the absorbed nodes, within a few launches
    assert unfused - fused == pytest.approx(saved * launch, abs=4 * launch)
    assert any("load-time fusions" in note for note in Design.load(str(gpt2), cons, progress=False).analyze().notes)


def test_a_cpu_target_has_no_view(gpt2, tmp_path):
    cons = tmp_path / "c.yaml"
    cons.write_text("clock_period: 2000ms\ntarget: cpu-ort\nworkload: {batch: 1, prompt_len: 16}\n")
    assert Design.load(str(gpt2), cons, progress=False).runtime_view is None


def test_a_bf16_region_is_viewed_as_fp32_and_its_casts_still_launch(tmp_path):
    """The compile loop's bf16 cells (Cast fp16 -> bf16, MatMul in bf16, Cast back) have no CPU kernels: the view
    types them fp32, ORT loads it, and neither Cast is taken for a no-op."""
    import numpy as np
    from onnx import TensorProto, helper

    w_bf16 = helper.make_tensor("w", TensorProto.BFLOAT16, [8, 8], np.ones(64, np.float32))
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
         helper.make_node("MatMul", ["xb", "w"], ["yb"]),
         helper.make_node("Cast", ["yb"], ["y16"], to=TensorProto.FLOAT16),
         helper.make_node("Add", ["y16", "x"], ["y"])],
        "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 8])], [w_bf16])
    path = tmp_path / "bf16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
    netlist = read_design(str(path), progress=False)
    view = load_view(netlist)
    assert view.error is None, view.error
    kept = {n.op_type for n in netlist.nodes() if n not in view.absorbed}
    assert kept >= {"Cast", "MatMul"} and sum(n.op_type == "Cast" and n not in view.absorbed
                                              for n in netlist.nodes()) == 2


@pytest.mark.parametrize("activations", ["fp16", "bf16"])
def test_an_fp8_weight_cell_is_viewed_as_one_launch_and_the_graph_still_loads(tmp_path, activations):
    """MatMulBlockQuantizedFp8Weight has no CPU kernel and rejects the fp32 the CPU provider recasts fp16 (and the
    view types bf16) to: the H200's fp8 + bf16 map had no view (InvalidGraph, every cell charged a launch). The view
    now loads and the fp8 cell launches once."""
    import numpy as np
    from onnx import TensorProto, helper

    act = TensorProto.FLOAT16 if activations == "fp16" else TensorProto.BFLOAT16
    codes = helper.make_tensor("codes", TensorProto.FLOAT8E4M3FN, [16, 64], np.zeros(1024, np.uint8).tobytes(),
                               raw=True)
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [16, 1], np.ones(16, np.float32))
    nodes = [helper.make_node("Cast", ["x"], ["xa"], to=act),
             helper.make_node("MatMulBlockQuantizedFp8Weight", ["xa", "codes", "scale"], ["ya"], domain="com.microsoft",
                              block_size=64),
             helper.make_node("Cast", ["ya"], ["y"], to=TensorProto.FLOAT16)]
    graph = helper.make_graph(nodes, "fp8", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 16])], [codes, scale])
    path = tmp_path / "fp8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                                ir_version=10), str(path))
    netlist = read_design(str(path), progress=False)
    view = load_view(netlist)
    assert view.error is None, view.error
    fp8 = [n for n in netlist.nodes() if n.op_type == "MatMulBlockQuantizedFp8Weight"]
    assert len(fp8) == 1 and fp8[0] not in view.absorbed
