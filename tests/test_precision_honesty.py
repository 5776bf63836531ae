"""Issue 25: the realised precision is what the model holds (softsyn.timing.realised), per weight and per KV port,
re-read after every pass; an fp16 source on an fp32 target is converted up (it ran as an fp16 model labelled fp32,
TPOT 688 ms against 32.5 ms predicted); area labels come from the realised cells (a 4-bit lm_head read "weights
int8" with half its parameters: MatMulNBits' packed uint8 bytes)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import passes
from passes.optimize import mapping as mp
from passes.precision import PrecisionReport, record_realised
from passes.precision.fp16 import HALF
from reports import report_area
from reports.html import area_table
from softsyn.constraints import load_constraints
from softsyn.design import Design
from softsyn.frontends import hf, read_design, zoo
from softsyn.library import load_library
from softsyn.runtime.inputs import scenario_inputs
from softsyn.timing.area import weight_items
from softsyn.timing.realised import realised_precision

ROOT = Path(__file__).resolve().parents[1]
CPU_TINY = ROOT / "constraints" / "cpu-tiny.yaml"


def _fp16_source(cache_dir):
    """qwen3-tiny exported in float16, as the real-size zoo entries are (fp16 weights, ports and KV)."""
    cfg = zoo.make_config(zoo.ZOO["qwen3-tiny"])
    return hf.load_transformers_design(cfg, "qwen3-tiny-fp16", "zoo:qwen3-tiny (float16)", cache_dir,
                                       progress=False, weights="random", dtype="float16")


def _run(model: ir.Model, path: Path, feeds: dict) -> dict[str, np.ndarray]:
    ir.save(model, str(path), external_data=path.name + ".data")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    kinds = {i.name: i.type for i in sess.get_inputs()}
    fed = {k: v.astype(np.float16 if kinds[k] == "tensor(float16)" else np.float32) if v.dtype.kind == "f" else v
           for k, v in feeds.items()}
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, fed)))


def _half_values(model: ir.Model) -> list[str]:
    g = model.graph
    values = [*g.inputs, *g.outputs, *g.initializers.values(), *(o for n in g for o in n.outputs)]
    return [v.name for v in values if v is not None and v.dtype in HALF]


def test_fp16_source_on_an_fp32_target_is_converted_up(cache_dir, tmp_path):
    source = _fp16_source(cache_dir)
    assert realised_precision(source).to_dict()["float"] == "fp16" and realised_precision(source).kv_precision == "fp16"
    # the fp32 function of the source's own weights: the fp32 export with each weight replaced by the fp16 one, upcast
    exact = read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False)
    half = source.model.graph.initializers
    for name, value in exact.model.graph.initializers.items():
        if name in half and half[name].dtype == ir.DataType.FLOAT16:
            value.const_value = ir.tensor(half[name].const_value.numpy().astype(np.float32), name=name)
    feeds = scenario_inputs(exact, {"batch": 1, "seq": 5, "past": 3}, seed=1)
    reference = _run(exact.model, tmp_path / "exact.onnx", feeds)
    as_fp16 = _run(source.model, tmp_path / "fp16.onnx", feeds)

    design = Design(source, load_constraints(CPU_TINY), load_library("cpu-ort"), progress=False)
    passes.run_pass(design, "flatten")
    result = passes.run_pass(design, "precision")  # unfused: the source's fp32 upcasts around norms become no-ops
    assert result.counts["weights_fp32"] > 0 and result.counts["ports_fp32"] == 9 and result.counts["casts_removed"] > 0
    assert _half_values(design.netlist.model) == []
    assert not [n for n in design.netlist.model.graph if n.op_type == "Cast" and n.attributes.get_int("to") in HALF]
    held = realised_precision(design.netlist)
    assert held.float_precision == "fp32" and set(held.kv.values()) == {"fp32"}
    assert design.pass_reports["precision"] == {"requested": "fp32", "target": "fp32", "realised": "fp32", "kv": "fp32"}
    got = _run(design.netlist.model, tmp_path / "up.onnx", feeds)
    for name, ref in reference.items():
        assert got[name].dtype == np.float32, name
        err = np.abs(got[name] - ref).max() / np.abs(ref).max()
        half_err = np.abs(as_fp16[name].astype(np.float32) - ref).max() / np.abs(ref).max()
        assert err < 1e-5 and err < half_err / 10, (name, err, half_err)  # fp32 arithmetic, not fp16's


def test_labels_are_read_from_the_model_not_the_request(cache_dir):
    """A report that says fp32 over a model that holds fp16 is corrected from the model after the pass, with a note."""
    design = Design(_fp16_source(cache_dir), load_constraints(CPU_TINY), load_library("cpu-ort"), progress=False)
    design.pass_reports["precision"] = PrecisionReport(requested="fp32", target="fp32", realised="fp32", kv="fp32")
    note = record_realised(design, "some_pass")
    assert design.pass_reports["precision"]["realised"] == "fp16" and design.pass_reports["precision"]["kv"] == "fp16"
    assert note.startswith("precision: the model's float weights are mostly fp16 (") and \
        note.endswith("not the uniform fp32 (read after some_pass, dont_touch cells keep the source's); "
                      "session.json says fp16")


def test_int4_lm_head_is_labelled_int4_with_its_logical_parameters(cache_dir):
    design = Design(read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False), load_constraints(CPU_TINY),
                    load_library("cpu-ort"), progress=False)
    netlist = design.netlist
    head = next(n for n in netlist.nodes() if n.op_type == "MatMul" and "lm_head" in netlist.hierarchy(n))
    k, n = (int(d) for d in head.inputs[1].shape)
    parameters = weight_items(netlist)[2]
    mp.apply_mapping(netlist, {head.name: "int4"})
    design.netlist_changed()
    kinds = {item.name: item for item in weight_items(netlist)[0]}
    assert "weights int8" not in kinds
    assert kinds["weights int4"].count == k * n  # the logical K x N, not the packed bytes (k * n / 2)
    assert kinds["weights int4"].bytes == k * n / 2 + k * n / mp.BLOCK * 4  # packed nibbles + fp32 scales
    assert weight_items(netlist)[2] == parameters  # quantising moves parameters between labels, never loses them
    held = realised_precision(netlist)
    assert held.weights["int4"] == k * n and held.cells["int4"] == 1
    analysis = design.analyze()
    line = next(x for x in report_area(analysis).splitlines() if "weights int4" in x)
    assert re.search(rf"weights int4 +[\d.]+ GB +{k * n / 1e3:.2f} K ", line), line  # 131.07 K parameters
    chart = {row["name"]: row for row in area_table(analysis.area).to_dict()["rows"]}
    assert chart["weights int4"]["count"] == k * n and "weights int8" not in chart


def test_dont_touch_cells_of_an_fp16_source_keep_fp16_on_an_fp32_target(tmp_path):
    """A pinned lm_head of an fp16 source stays fp16 (Casts on its edges) while the rest goes up to fp32; the model
    loads and computes the unpinned function in fp32, the pinned MatMul in fp16."""
    from passes.precision.fp16 import to_fp32
    from softsyn.netlist import HIERARCHY_KEY

    rng = np.random.default_rng(0)
    w16 = rng.standard_normal((16, 8)).astype(np.float16)
    w = ir.Value(name="w", shape=ir.Shape([16, 8]), type=ir.TensorType(ir.DataType.FLOAT16),
                 const_value=ir.tensor(w16, name="w"))
    ids = ir.Value(name="ids", shape=ir.Shape([1, 4]), type=ir.TensorType(ir.DataType.INT64))
    gather = ir.node("Gather", [w, ids], name="emb")
    trans = ir.node("Transpose", [w], attributes={"perm": [1, 0]}, name="t")
    mm = ir.node("MatMul", [gather.outputs[0], trans.outputs[0]], name="mm")
    for n, h, shape in ((gather, "model.embed_tokens", [1, 4, 8]), (trans, "lm_head", [8, 16]),
                        (mm, "lm_head", [1, 4, 16])):
        n.metadata_props[HIERARCHY_KEY] = h
        n.outputs[0].name, n.outputs[0].shape = f"{n.name}_out", ir.Shape(shape)
        n.outputs[0].type = ir.TensorType(ir.DataType.FLOAT16)
    graph = ir.Graph([ids], [mm.outputs[0]], nodes=[gather, trans, mm], initializers=[w], opset_imports={"": 17})
    model = ir.Model(graph, ir_version=10)
    result = to_fp32(model, ["lm_head"])
    assert result.pinned_cells == 2 and result.weights == 1 and result.ports == 1
    assert w.dtype == ir.DataType.FLOAT and gather.outputs[0].dtype == ir.DataType.FLOAT
    assert trans.inputs[0].dtype == mm.inputs[0].dtype == mm.outputs[0].dtype == ir.DataType.FLOAT16  # pinned
    assert graph.outputs[0].dtype == ir.DataType.FLOAT and graph.outputs[0].name == "mm_out"
    path = tmp_path / "m.onnx"
    ir.save(model, str(path))
    token = np.array([[1, 2, 3, 4]])
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": token})[0]
    want = (w16[token[0]].astype(np.float32) @ w16.T.astype(np.float32))[None]
    assert out.dtype == np.float32 and np.abs(out - want).max() / np.abs(want).max() < 2e-3  # fp16 MatMul rounding
