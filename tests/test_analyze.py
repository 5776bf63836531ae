"""The analysis flow end to end: netlist + constraints + library -> timing, area, reports, CLI."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import onnx_ir as ir
import pytest
from click.testing import CliRunner

from softsyn.cli import main
from softsyn.constraints import parse_constraints
from softsyn.cost import node_work
from softsyn.design import Design
from softsyn.frontends import read_design
from softsyn.library import load_library
from softsyn.timing import load_time_constants

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "constraints" / "guide-short.yaml"
CPU_TINY = ROOT / "constraints" / "cpu-tiny.yaml"


@pytest.fixture(scope="session")
def tiny(cache_dir):
    return read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False)


@pytest.fixture(scope="session")
def tiny_analysis(tiny):
    from softsyn.constraints import load_constraints

    design = Design(tiny, load_constraints(CPU_TINY), load_library("cpu-ort"), progress=False)
    return design, design.analyze()


def test_decoder_gets_prefill_and_decode_groups(tiny):
    design = Design(tiny, parse_constraints("clock_period: 50ms\n"), load_library("cpu-ort"), progress=False)
    groups = {g.name: g.scenario.dims for g in design.groups}
    assert groups == {"prefill": {"batch": 1, "seq": 512, "past": 0}, "decode": {"batch": 1, "seq": 1, "past": 512}}


def test_arrival_is_input_delay_plus_every_cell(tiny_analysis):
    design, analysis = tiny_analysis
    for group in analysis.groups:
        path = group.critical
        assert path.input_delay == pytest.approx(1e-3)
        assert path.arrival == pytest.approx(path.input_delay + sum(p.incr for p in path.points))
        assert [p.arrival for p in path.points] == sorted(p.arrival for p in path.points)
        assert path.required == pytest.approx(path.clock_period - 100e-6 - 100e-6)
        assert path.slack == pytest.approx(path.required - path.arrival)
        # one stream: the logits path runs through every executed cell of the netlist
        assert path.endpoint == "logits"
        folded = load_time_constants(design.netlist)
        executed = [n for n in design.netlist.nodes() if n.name not in folded]
        assert len(path.points) == len(executed) + 1  # + the session.run overhead row
        assert all(p.source in ("est", "table", "table-extrap") for p in path.points)


def test_weight_only_subgraphs_are_folded_at_load(tiny):
    """Constant and Transpose(weight) cost nothing per run: the runtime folds them when the session loads."""
    x = ir.Value(name="x", shape=ir.Shape([4, 8]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([8, 8]), type=ir.TensorType(ir.DataType.FLOAT),
                 const_value=ir.tensor([[0.0] * 8] * 8, dtype=ir.DataType.FLOAT, name="w"))
    transpose = ir.node("Transpose", [w], attributes={"perm": [1, 0]}, name="t")
    matmul = ir.node("MatMul", [x, transpose.outputs[0]], name="mm")
    graph = ir.Graph([x], matmul.outputs, nodes=[transpose, matmul], initializers=[w], opset_imports={"": 21})
    from softsyn.netlist import Netlist

    assert load_time_constants(Netlist(ir.Model(graph, ir_version=10), "toy")) == {"t"}


def test_prefill_does_more_work_than_decode(tiny_analysis):
    _, analysis = tiny_analysis
    prefill, decode = analysis.group("prefill"), analysis.group("decode")
    assert prefill.total_flops > 50 * decode.total_flops
    assert prefill.critical.arrival > decode.critical.arrival


def test_matmul_work_from_bound_shapes(tiny):
    shapes = tiny.bind({"batch": 2, "seq": 7, "past": 0})
    q_proj = next(n for n in tiny.nodes() if n.op_type == "MatMul" and tiny.hierarchy(n).endswith("layers.0.self_attn.q_proj"))
    work = node_work(q_proj, shapes)
    hidden = tiny.config["hidden_size"]
    out = tiny.config["num_attention_heads"] * tiny.config["head_dim"]
    assert work.sizes == {"m": 14, "n": out, "k": hidden}
    assert work.flops == 2 * 14 * out * hidden
    assert work.bytes == 4 * (14 * hidden + hidden * out + 14 * out)


def test_area_weights_and_kv_cache(tiny_analysis):
    design, analysis = tiny_analysis
    cfg = design.netlist.config
    kinds = {item.name: item for item in analysis.area.by_kind}
    assert kinds["weights fp32"].bytes == 4 * analysis.area.parameters
    assert analysis.area.parameters == sum(
        math.prod(v.shape.numpy()) for v in design.netlist.model.graph.initializers.values()
        if v.dtype == ir.DataType.FLOAT)
    # kv_cache.max_length 512 in cpu-tiny.yaml: K and V per layer, fp32
    assert kinds["kv_cache"].bytes == 2 * cfg["num_layers"] * cfg["num_kv_heads"] * cfg["head_dim"] * 512 * 4
    assert kinds["activations (peak)"].bytes > 0
    assert analysis.area.total == pytest.approx(sum(i.bytes for i in analysis.area.by_kind))


def test_guide_short_form_text_model_starts_at_text_delay(cache_dir):
    result = CliRunner().invoke(main, ["analyze", "zoo:qwen3-tiny", "-c", str(GUIDE), "-q"])
    assert result.exit_code == 0, result.output
    launch_half = result.output.split("data arrival time")[0]
    row = next(line for line in launch_half.splitlines() if "input external delay" in line)
    assert row.split()[-2:] == ["10.000", "10.000"]
    assert "slack (MET)" in result.output
    assert "Timing Path Group 'prefill'" in result.output and "Timing Path Group 'decode'" in result.output


def test_violation_exit_code_and_saved_reports(tmp_path, cache_dir):
    tight = tmp_path / "tight.yaml"
    tight.write_text("clock_period: 100us\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["analyze", "zoo:qwen3-tiny", "-c", str(tight), "-o", str(out), "-q"])
    assert result.exit_code == 1, result.output
    assert "slack (VIOLATED)" in result.output
    assert sorted(p.name for p in (out / "reports").iterdir()) == [
        "area.rpt", "constraint.rpt", "qor.rpt", "timing.rpt", "timing_full.rpt"]
    again = CliRunner().invoke(main, ["report", "timing", str(out)])
    assert again.exit_code == 0
    assert again.output.strip() == (out / "reports" / "timing.rpt").read_text().strip()
    violators = CliRunner().invoke(main, ["report", "constraint", str(out)])
    assert "VIOLATED" in violators.output


def test_refuses_to_write_into_a_foreign_directory(tmp_path, cache_dir):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["analyze", "zoo:qwen3-tiny", "-o", str(mine), "-q"], standalone_mode=False)
    assert "not a softsyn output directory" in str(result.exception)
    assert (mine / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("text, expected", [
    ("clock_period: 2000mss\n", ":1: clock_period: unknown time unit"),
    ("clok_period: 2ms\n", "did you mean 'clock_period'"),
    ("clock_period: -5ms\n", ":1: clock_period:"),
    ("clock_period: 2ms\ninput_delay: [unclosed\n", ":2:"),
])
def test_bad_constraints_one_line_exit_2(tmp_path, text, expected):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "softsyn.cli", "analyze", "zoo:qwen3-tiny", "-c", str(bad)],
                          capture_output=True, text=True, env={**os.environ, "SOFTSYN_CACHE": "/nonexistent"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"softsyn: error: {bad}") and expected in lines[0]


def test_hand_built_onnx_with_named_dims(tmp_path, cache_dir):
    """A generic ONNX file: its free dims are bound from path_groups.dims; missing ones are named."""
    x = ir.Value(name="x", shape=ir.Shape(["n", 64]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([64, 32]), type=ir.TensorType(ir.DataType.FLOAT),
                 const_value=ir.tensor([[0.0] * 32] * 64, dtype=ir.DataType.FLOAT, name="w"))
    node = ir.node("MatMul", [x, w], name="mm")
    node.outputs[0].name, node.outputs[0].shape = "y", ir.Shape(["n", 32])
    node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([x], node.outputs, nodes=[node], initializers=[w], name="toy", opset_imports={"": 21})
    path = tmp_path / "toy.onnx"
    ir.save(ir.Model(graph, ir_version=10), path)

    ok = tmp_path / "ok.yaml"
    ok.write_text("clock_period: 1ms\npath_groups:\n  infer:\n    dims: {n: 8}\n")
    result = CliRunner().invoke(main, ["analyze", str(path), "-c", str(ok), "-q"])
    assert result.exit_code == 0, result.output
    assert "MatMul.fp32 (" in result.output

    missing = tmp_path / "missing.yaml"
    missing.write_text("clock_period: 1ms\npath_groups:\n  infer:\n    weight: 1\n")
    result = CliRunner().invoke(main, ["analyze", str(path), "-c", str(missing), "-q"], standalone_mode=False)
    assert "path_groups.infer.dims" in str(result.exception) and "n" in str(result.exception)
