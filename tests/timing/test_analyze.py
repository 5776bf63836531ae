"""The analysis flow end to end: netlist + constraints + library -> timing, area, reports, CLI."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import onnx_ir as ir
import pytest
from click.testing import CliRunner

from paths import ROOT
from softsyn.cli import main
from softsyn.constraints import parse_constraints
from softsyn.design import Design
from softsyn.frontends import read_design
from softsyn.library import load_library
from softsyn.timing import load_time_constants, node_work

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
        executed = [n for n in design.netlist.nodes() if n not in folded]
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

    assert load_time_constants(Netlist(ir.Model(graph, ir_version=10), "toy")) == {transpose}


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
        "area.rpt", "constraint.rpt", "qor.rpt", "report.html", "suggestions.json", "timing.rpt", "timing_full.rpt"]
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


def _chain_onnx(path, ops):
    """x[8, 64] through `ops` in order ("add": + a constant, "mm": @ W[64, 64]); y = the last output."""
    f = ir.DataType.FLOAT
    x = ir.Value(name="x", shape=ir.Shape([8, 64]), type=ir.TensorType(f))
    w = ir.Value(name="w", shape=ir.Shape([64, 64]), type=ir.TensorType(f),
                 const_value=ir.tensor([[0.0] * 64] * 64, dtype=f, name="w"))
    one = ir.Value(name="one", shape=ir.Shape([1]), type=ir.TensorType(f), const_value=ir.tensor([1.0], dtype=f, name="one"))
    nodes, prev = [], x
    for i, op in enumerate(ops):
        node = ir.node("MatMul" if op == "mm" else "Add", [prev, w if op == "mm" else one], name=f"n{i}")
        node.outputs[0].name, node.outputs[0].shape, node.outputs[0].type = f"t{i}", ir.Shape([8, 64]), ir.TensorType(f)
        nodes.append(node)
        prev = node.outputs[0]
    graph = ir.Graph([x], [prev], nodes=nodes, initializers=[w, one], name="chain", opset_imports={"": 21})
    ir.save(ir.Model(graph, ir_version=10), path)
    return path


def test_gpu_host_and_device_overlap(tmp_path):
    """On a GPU library the host issues each node in launch_overhead and kernels overlap it on the device:
    a long kernel hides the launches behind it; on a CPU library the same cells add up."""
    import yaml

    cells = [{"op": "Add", "precision": "fp32", "implementation": "t", "axes": ["elements"], "points": [[1, 1e6]],
              "delays": [5e-6, 5e-6]},  # host-bound: at its floor
             {"op": "MatMul", "precision": "fp32", "implementation": "t", "axes": ["m", "n", "k"],
              "points": [[1, 64], [64], [64]], "delays": [[[5e-6]], [[2000e-6]]]}]  # m = 8: 100 us, device-bound
    ceilings = {"memory_bandwidth": 1e12, "peak_flops": {"fp32": 1e14}, "launch_overhead": 5e-6,
                "launch_overhead_graph": None, "run_overhead": 10e-6}
    header = {"library": "toy", "format": 1, "runtime": "onnxruntime 1.31.1", "date": "2026-11-30",
              "device": "toy", "command": "hand-written for a test", "ceilings": ceilings, "cells": cells}
    model = _chain_onnx(tmp_path / "chain.onnx", ["mm"] + ["add"] * 10)
    cons = tmp_path / "c.yaml"
    cons.write_text("clock_period: 1s\ninput_delay: 0ms\npath_groups:\n  infer: {}\n")
    arrivals = {}
    for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
        lib = tmp_path / f"{provider}.yaml"
        lib.write_text(yaml.safe_dump(dict(header, provider=provider), sort_keys=False))
        analysis = Design.load(str(model), cons, target=str(lib), progress=False).analyze()
        path = analysis.group("infer").critical
        assert sum(p.incr for p in path.points) == pytest.approx(path.arrival - path.input_delay)
        arrivals[provider] = path.arrival
    mm = math.exp(math.log(5e-6) + (math.log(2000e-6) - math.log(5e-6)) * math.log(8) / math.log(64))  # log-log
    assert mm == pytest.approx(100e-6)
    # CPU: run overhead + every cell in turn
    assert arrivals["CPUExecutionProvider"] == pytest.approx(10e-6 + mm + 10 * 5e-6)
    # GPU: the MatMul starts after its launch and runs while the host launches the ten Adds (5 us each, 50 us
    # < 100 us); each Add then runs for its roofline time behind it
    adds_device = 10 * (8 * 64 * 4 * 2 / 1e12)  # bytes in + out of each Add at 1 TB/s
    assert arrivals["CUDAExecutionProvider"] == pytest.approx(10e-6 + 5e-6 + mm + adds_device, rel=1e-3)
    # ... and when the launches outlast the kernels, the host sets the pace: 11 launches, then the last Add
    short = _chain_onnx(tmp_path / "short.onnx", ["add"] * 11)
    path = Design.load(str(short), cons, target=str(tmp_path / "CUDAExecutionProvider.yaml"),
                       progress=False).analyze().group("infer").critical
    assert path.arrival == pytest.approx(10e-6 + 11 * 5e-6 + adds_device / 10, rel=1e-3)
    # a view op (no FLOPs, no bytes) aliases its input in a model: it costs the host a launch, the device nothing
    gpu = load_library(str(tmp_path / "CUDAExecutionProvider.yaml"))
    assert gpu.host_device("Reshape", "fp32", 0.0, 0.0, {"elements": 1 << 24}, 3e-3) == (5e-6, 0.0)
    assert load_library(str(tmp_path / "CPUExecutionProvider.yaml")).host_device(
        "Reshape", "fp32", 0.0, 0.0, {"elements": 1 << 24}, 3e-3) == (3e-3, 0.0)
