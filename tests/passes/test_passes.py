"""Passes: the registry, flatten and precision; each proven equivalent on ORT and checked for structure."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from softsyn.cli import main
from softsyn.constraints import Constraints, parse_constraints
from softsyn.design import Design
from softsyn.errors import SoftsynDefect, SoftsynError
from softsyn.frontends import read_design
from softsyn.library import load_library
from softsyn.runtime.inputs import scenario_inputs
from softsyn.netlist import HIERARCHY_KEY, Netlist
import passes
from passes import EFFORTS, LOW, Effort, Pass, PassReport, PassResult, Step, get, load_all, run_pass

SCENARIOS = [{"batch": 1, "seq": 8, "past": 0}, {"batch": 1, "seq": 1, "past": 8}]  # prefill, decode


@pytest.fixture
def tiny(cache_dir):
    """A fresh netlist per test: passes rewrite it in place."""
    return read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False)


def run_ort(model: ir.Model, feeds: dict, tmp_path) -> list[np.ndarray]:
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.onnx"
    ir.save(model, str(path), external_data=path.name + ".data")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in session.get_inputs()}
    feeds = {k: v.astype(np.float16) if types[k] == "tensor(float16)" else v for k, v in feeds.items()}
    return [o.astype(np.float32) for o in session.run(None, feeds)]


def reference_outputs(netlist: Netlist, tmp_path):
    feeds = [scenario_inputs(netlist, dims) for dims in SCENARIOS]
    return feeds, [run_ort(netlist.model, f, tmp_path) for f in feeds]


def max_rel_error(got, want) -> float:
    return max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want))


def assert_no_dead_nodes(model: ir.Model):
    ports = set(model.graph.outputs)
    dead = [n.name for n in model.graph if not any(o.uses() or o in ports for o in n.outputs)]
    assert dead == []


def test_registry_lists_passes_with_help():
    registered = load_all()
    assert {"flatten", "precision"} <= set(registered)
    result = CliRunner().invoke(main, ["passes"])
    assert result.exit_code == 0
    assert "flatten    inline functions" in result.output and "effort low: flatten -> fuse -> precision -> kv_layout" in result.output
    with pytest.raises(SoftsynError, match="no pass 'nope'; registered passes: .*flatten"):
        get("nope")


def test_passes_command_prints_each_effort_level_from_its_steps():
    result = CliRunner().invoke(main, ["passes"])
    level = EFFORTS["low"]
    assert level.script == ("flatten", "fuse", "precision", "kv_layout")
    assert f"effort low: flatten -> fuse -> precision -> kv_layout\n  {level.help}\n" in result.output
    for i, step in enumerate(level.steps, 1):
        assert f"  {i}. {step.pass_name:<9}  {step.what}\n" in result.output
    helptext = CliRunner().invoke(main, ["compile", "--help"]).output
    assert f"low     {level.help}" in helptext and "1-4. as low" in helptext and f"1. flatten    {level.steps[0].what}" in helptext


def test_a_higher_effort_level_extends_the_one_below():
    """The shape the compile loop's medium/high/ultra slot into: LOW's steps, then its own."""
    medium = Effort("medium", "test level", LOW.steps + (Step("fuse", "again"),))
    assert medium.script == ("flatten", "fuse", "precision", "kv_layout", "fuse")
    assert medium.step_lines()[-1] == "5. fuse       again"
    with pytest.raises(SoftsynError, match="no effort level 'extreme'; valid: low, medium, high, ultra"):
        passes.effort("extreme")


def test_run_pass_logs_counts_and_files_the_report(tiny, monkeypatch, capsys):
    load_all()
    probe = PassReport()
    monkeypatch.setitem(passes.PASSES, "probe", Pass("probe", "a test pass", lambda d: PassResult({"x": 2}, probe)))
    monkeypatch.setitem(passes.PASSES, "quiet", Pass("quiet", "changes nothing", lambda d: PassResult({})))
    design = Design(tiny, Constraints.default(), load_library("cpu-ort"), progress=True)

    assert run_pass(design, "probe") == PassResult({"x": 2}, probe)
    run_pass(design, "quiet")

    assert design.pass_reports == {"probe": probe} and passes.report_of(design, PassReport) is probe
    assert capsys.readouterr().err == ("[softsyn] pass probe: a test pass\n[softsyn] pass probe: x 2\n"
                                       "[softsyn] pass quiet: changes nothing\n[softsyn] pass quiet: no change\n")


def test_netlist_changed_drops_every_view_of_the_netlist(tiny):
    design = Design(tiny, Constraints.default(), load_library("cpu-ort"), progress=False)
    graph, groups, shapes = design.graph, design.groups, tiny.bind(SCENARIOS[0])
    assert design.graph is graph and design.groups is groups and tiny.bind(SCENARIOS[0]) is shapes
    design.netlist_changed()
    assert design.graph is not graph and design.groups is not groups and tiny.bind(SCENARIOS[0]) is not shapes
    assert [g.name for g in design.groups] == [g.name for g in groups]


def _deoptimise(netlist: Netlist) -> None:
    """What an unoptimised exporter leaves: an Identity, a constant chain, a multiply by one, a dead cell."""
    graph = netlist.model.graph
    matmul = next(n for n in graph if n.op_type == "MatMul")
    x = matmul.inputs[0]
    const = [ir.node("Constant", [], attributes={"value": ir.tensor(np.array([v], np.float32))}) for v in (2.0, 0.5)]
    one = ir.node("Mul", [const[0].outputs[0], const[1].outputs[0]])
    ident = ir.node("Identity", [x])
    times_one = ir.node("Mul", [ident.outputs[0], one.outputs[0]])
    dead = ir.node("Relu", [x])
    for out in (ident.outputs[0], times_one.outputs[0]):
        out.dtype, out.shape = x.dtype, x.shape
    graph.insert_before(matmul, [*const, one, ident, times_one, dead])
    matmul.replace_input_with(0, times_one.outputs[0])
    netlist.invalidate()


def test_flatten_removes_folds_and_keeps_equivalence(tiny, tmp_path):
    feeds, want = reference_outputs(tiny, tmp_path)
    hierarchy = {n.name: n.metadata_props[HIERARCHY_KEY] for n in tiny.nodes()}
    exported = len(tiny.nodes())
    _deoptimise(tiny)
    design = Design(tiny, Constraints.default(), load_library("cpu-ort"), progress=False)

    counts = run_pass(design, "flatten").counts

    assert counts["folded"] >= 3 and counts["noop"] >= 1 and counts["dead"] >= 1
    assert len(tiny.nodes()) == exported  # the dynamo export is already swept: back to it exactly
    assert_no_dead_nodes(tiny.model)
    assert {n.name: n.metadata_props[HIERARCHY_KEY] for n in tiny.nodes()} == hierarchy
    for f, w, dims in zip(feeds, want, SCENARIOS):
        assert max_rel_error(run_ort(tiny.model, f, tmp_path), w) < 1e-6
        assert tiny.bind_stats(dims)["unbound"] == 0
    assert sum(run_pass(design, "flatten").counts.values()) == 0  # a second run finds nothing


def test_flatten_inlines_functions_with_their_call_site_hierarchy(tmp_path):
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", 4]))
    fx = ir.Value(name="fx", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", 4]))
    body = ir.node("Relu", [fx])
    function = ir.Function("local", "block", "", graph=ir.Graph([fx], body.outputs, nodes=[body],
                                                                  opset_imports={"": 18}), attributes=[])
    call = ir.node("block", [x], domain="local", metadata_props={HIERARCHY_KEY: "model.layers.0.mlp"})
    out = ir.node("Add", [call.outputs[0], x])
    out.outputs[0].name, out.outputs[0].dtype, out.outputs[0].shape = "y", ir.DataType.FLOAT, ir.Shape(["batch", 4])
    graph = ir.Graph([x], out.outputs, nodes=[call, out], opset_imports={"": 18, "local": 1})
    model = ir.Model(graph, ir_version=10, functions=[function])
    netlist = Netlist.from_model(model, name="fn")
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    want = run_ort(model, feeds, tmp_path)

    design = Design(netlist, Constraints.default(), load_library("cpu-ort"), progress=False)
    counts = run_pass(design, "flatten").counts

    assert counts["inlined"] == 1 and not model.functions
    relu = next(n for n in model.graph if n.op_type == "Relu")
    assert relu.metadata_props[HIERARCHY_KEY] == "model.layers.0.mlp"
    np.testing.assert_array_equal(run_ort(model, feeds, tmp_path)[0], want[0])


def test_precision_fp16_on_gpu_target(tiny, tmp_path):
    feeds, want = reference_outputs(tiny, tmp_path)
    design = Design(tiny, Constraints.default(), load_library("h200-ort-cuda"), progress=False)

    counts = run_pass(design, "precision").counts

    assert counts["fp32_norm_stats"] == 9 * 5  # 9 RMSNorms (2 layers x 4 + final): Pow, ReduceMean, Add, Sqrt, Reciprocal
    assert counts["fp32_rotary_angles"] >= 3  # Cast(positions) ... Cos, Sin
    assert counts["ports_fp16"] == 4 + 5  # past KV in; logits, present KV out
    graph = tiny.model.graph
    assert all(v.dtype == ir.DataType.FLOAT16 for v in graph.outputs)
    assert {v.name: v.dtype for v in graph.inputs}["input_ids"] == ir.DataType.INT64
    matmul_weights = [v for v in graph.initializers.values() if any(u.op_type == "MatMul" for u, _ in v.uses())]
    assert matmul_weights and all(v.dtype == ir.DataType.FLOAT16 for v in matmul_weights)
    assert all(HIERARCHY_KEY in n.metadata_props for n in tiny.nodes())
    casts = [n for n in tiny.nodes() if n.op_type == "Cast" and n.name.endswith(("_to_float", "_to_float16"))]
    assert len(casts) == counts["casts_inserted"]
    assert Counter(n.metadata_props[HIERARCHY_KEY] for n in casts)["model.norm"] == 2  # into and out of the island
    # ORT CPU runs this fp16 model (its fp16 kernels or its own Cast fallbacks): equivalence within fp16 rounding
    for f, w, dims in zip(feeds, want, SCENARIOS):
        assert max_rel_error(run_ort(tiny.model, f, tmp_path), w) < 5e-3
        assert tiny.bind_stats(dims)["unbound"] == 0


def test_precision_is_fp32_on_cpu_and_honours_the_default(tiny):
    design = Design(tiny, Constraints.default(), load_library("cpu-ort"), progress=False)
    nodes = len(tiny.nodes())
    assert run_pass(design, "precision").counts == {} and len(tiny.nodes()) == nodes


def test_a_quantised_default_maps_every_weight_cell_at_low_effort(tiny, tmp_path):
    """precision.default int8 (int4, fp8) at effort low: the float design, then every weight cell the loop could move
    becomes that precision's cell (ORT's quantiser through the loop's apply_mapping), dont_touch kept; the model
    still computes the function within int8's error, and the report says how many cells were mapped."""
    feeds, want = reference_outputs(tiny, tmp_path)
    cons = parse_constraints("precision:\n  allowed: [fp32, int8]\n  default: int8\ndont_touch: [lm_head]\n")
    design = Design(tiny, cons, load_library("cpu-ort"), progress=False)
    result = run_pass(design, "precision")
    nbits = [n for n in tiny.nodes() if n.op_type == "MatMulNBits"]
    assert result.counts["weights_int8"] == len(nbits) == 14  # 2 layers x 7 projections; the lm_head kept
    assert all(n.attributes.get_int("bits") == 8 for n in nbits)
    assert not any(n.metadata_props.get(HIERARCHY_KEY, "").startswith("lm_head") for n in nbits)
    assert result.report["weights"] == {"precision": "int8", "cells": 14, "dont_touch": 1}
    for f, w in zip(feeds, want):
        assert 0 < max_rel_error(run_ort(tiny.model, f, tmp_path), w) < 0.05


def test_a_quantised_default_the_library_cannot_build_is_said_not_faked(tiny):
    """fp8 on the CPU library (no MatMulBlockQuantizedFp8Weight cell): nothing is mapped, the float design stands, and
    the log and report say why, as a bf16 request realised fp16 is said."""
    cons = parse_constraints("precision:\n  allowed: [fp32, fp8]\n  default: fp8\n")
    design = Design(tiny, cons, load_library("cpu-ort"), progress=False)
    result = run_pass(design, "precision")
    assert result.counts["weights_fp8"] == 0 and not any(n.op_type != "MatMul" and "Quantized" in n.op_type
                                                          for n in tiny.nodes())
    assert result.report["weights"]["not_mapped"].startswith("library cpu-ort has no MatMulBlockQuantizedFp8Weight.fp8")


def test_a_bf16_request_is_realised_as_fp16_and_said(tmp_path):
    """The uniform map realises fp16 for a bf16 request when fp16 is allowed, logs it, and reports both; without fp16
    allowed it is a one-line constraints error, except on a target whose loop starts from bf16 cells (a GPU library
    with MatMul.bf16: the float design under them is fp16, tests/passes/optimize/test_bf16_start.py)."""
    from softsyn.constraints import parse_constraints
    from softsyn.errors import SoftsynError
    from passes.rules.uniform import default_precision

    class _D:
        def __init__(self, text, library="h200-ort-cuda"):
            self.constraints = parse_constraints(text, "c.yaml")
            self.library = load_library(library)

    assert default_precision(_D("precision: {default: bf16, allowed: [bf16, fp16]}\n")) == ("bf16", "fp16")
    assert default_precision(_D("precision: {default: fp16}\n")) == ("fp16", "fp16")
    with pytest.raises(SoftsynError, match=r"c.yaml: precision.default: bf16 is not .* \(or bf16 with fp16 in "):
        default_precision(_D("precision: {default: bf16, allowed: [bf16, int4]}\n", "cpu-ort"))
    assert default_precision(_D("precision: {default: bf16, allowed: [bf16, int4]}\n")) == ("bf16", "fp16")


def test_dont_touch_cells_of_an_fp16_source_stay_fp16_and_load(tmp_path):
    """A real-size export is fp16 already: its dont_touch cells (a tied embedding / lm_head) keep their fp16,
    no Cast to fp32 feeds them, and the converted model loads and runs in ORT (it did not: a Transpose declared
    fp16 read an fp32 Cast)."""
    import numpy as np
    import onnxruntime as ort

    from passes.precision.fp16 import to_fp16

    w = ir.Value(name="w", shape=ir.Shape([16, 8]), type=ir.TensorType(ir.DataType.FLOAT16),
                 const_value=ir.tensor(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float16), name="w"))
    ids = ir.Value(name="ids", shape=ir.Shape([1, 4]), type=ir.TensorType(ir.DataType.INT64))
    gather = ir.node("Gather", [w, ids], name="emb")
    trans = ir.node("Transpose", [w], attributes={"perm": [1, 0]}, name="t")
    mm = ir.node("MatMul", [gather.outputs[0], trans.outputs[0]], name="mm")
    for n, h, shape in ((gather, "model.embed_tokens", [1, 4, 8]), (trans, "lm_head", [8, 16]), (mm, "lm_head", [1, 4, 16])):
        n.metadata_props[HIERARCHY_KEY] = h
        n.outputs[0].name, n.outputs[0].shape = f"{n.name}_out", ir.Shape(shape)
        n.outputs[0].type = ir.TensorType(ir.DataType.FLOAT16)
    graph = ir.Graph([ids], [mm.outputs[0]], nodes=[gather, trans, mm], initializers=[w], opset_imports={"": 17})
    model = ir.Model(graph, ir_version=10)
    to_fp16(model, ["lm_head", "model.embed_tokens"])
    assert not [n for n in graph if n.op_type == "Cast"]
    path = tmp_path / "m.onnx"
    ir.save(model, str(path))
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": np.array([[1, 2, 3, 4]])})
    assert out[0].dtype == np.float16 and out[0].shape == (1, 4, 16)


def test_flatten_keeps_a_weightless_scalar_weight_it_cannot_read():
    """A plan's one-element weight (Gemma's embed_scale) has no data: flatten cannot tell it is neutral, keeps it."""
    from softsyn.frontends.export import META_WEIGHTS

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", 4]))
    scale = ir.Value(name="embed_scale", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]),
                     const_value=ir.ExternalTensor(location=META_WEIGHTS, offset=0, length=4, dtype=ir.DataType.FLOAT,
                                                   shape=ir.Shape([]), name="embed_scale"))
    mul = ir.node("Mul", [x, scale])
    out = ir.node("Relu", mul.outputs)
    out.outputs[0].name, out.outputs[0].dtype, out.outputs[0].shape = "y", ir.DataType.FLOAT, ir.Shape(["batch", 4])
    graph = ir.Graph([x], out.outputs, nodes=[mul, out], initializers=[scale], opset_imports={"": 18})
    design = Design(Netlist.from_model(ir.Model(graph, ir_version=10), name="plan"), Constraints.default(),
                    load_library("cpu-ort"), progress=False)
    run_pass(design, "flatten")
    assert [n.op_type for n in design.netlist.model.graph] == ["Mul", "Relu"]


def test_a_report_outside_the_protocol_is_a_defect(tiny, monkeypatch):
    """The loop and emit read reports only through passes.PassReport: a pass returning anything else is softsyn's own
    defect (exit 3), caught where it is filed."""
    monkeypatch.setitem(passes.PASSES, "bare", Pass("bare", "a test pass", lambda d: PassResult({}, {"a": "dict"})))
    design = Design(tiny, Constraints.default(), load_library("cpu-ort"), progress=False)
    with pytest.raises(SoftsynDefect, match="pass 'bare' returned a dict report, not a PassReport"):
        run_pass(design, "bare")
