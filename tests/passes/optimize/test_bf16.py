"""bf16 per cell and accuracy.fallback: bf16. The cell the map writes (Casts at its boundary, a bf16 weight
initializer) checked by structure and through its CPU view, since ORT's CPU provider has no bf16 MatMul; where the loop
offers it; the loop choosing it on a small synthetic library where it is the best move; the fallback rule's log line
and record, on a library with the bf16 cell and on one without."""
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest

import passes
from passes.optimize import mapping as mp
from softsyn.constraints import parse_constraints
from softsyn.design import Design
from softsyn.library.model import Ceilings, Cell, Library
from softsyn.timing.cost import precision_of
from test_fp8 import _tiny

BF = ir.DataType.BFLOAT16


def _bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_the_bf16_cell_is_cast_matmul_cast_with_a_bf16_weight_and_its_cpu_view_computes_it(tmp_path):
    """apply_mapping writes Cast(x -> bf16) -> MatMul (the cell's name, its request, weight [K, N] bf16, the source's
    transposed weight rounded to nearest even) -> Cast(-> fp16) under the old output's name; the fp16 weight and its
    Transpose are gone. ORT's CPU provider refuses the MatMul; the CPU view runs it and equals the bf16 product."""
    from softsyn.flow.cpu_view import cpu_view_session
    from softsyn.runtime.session import open_model

    k, n = 320, 96
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float16)
    netlist = _tiny(k, n, weight, transposed=True)
    assert mp.apply_mapping(netlist, {"proj": "bf16"}, {"proj": "bf16"}) == {"bf16": 1}
    cast_in, matmul, cast_out = list(netlist.model.graph)
    assert [n.op_type for n in (cast_in, matmul, cast_out)] == ["Cast", "MatMul", "Cast"]
    assert cast_in.attributes.get_int("to") == BF and cast_in.inputs[0].name == "x"
    assert cast_out.attributes.get_int("to") == ir.DataType.FLOAT16 and cast_out.outputs[0].name == "y"
    assert cast_out.outputs[0] in netlist.model.graph.outputs and cast_out.outputs[0].dtype == ir.DataType.FLOAT16
    assert matmul.name == "proj" and matmul.metadata_props[mp.REQUESTED_KEY] == "bf16" and precision_of(matmul) == "bf16"
    assert mp.REQUESTED_KEY not in cast_out.metadata_props
    w = matmul.inputs[1]
    assert w.dtype == BF and list(w.shape) == [k, n] and list(netlist.model.graph.initializers) == [w.name]
    np.testing.assert_array_equal(w.const_value.numpy().astype(np.float32), _bf16(weight))

    proto = ir.to_proto(netlist.model)
    onnx.checker.check_model(proto, full_check=True)
    path = tmp_path / "model.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(Exception, match="MatMul"):
        open_model(path, "cpu")
    session, changed = cpu_view_session(path)
    assert changed == {"gqa": 0, "fp8": 0, "bf16": 1}
    x = rng.standard_normal((2, 1, k)).astype(np.float16)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, _bf16(_bf16(x) @ _bf16(weight)).astype(np.float16))


def test_bf16_cells_reading_one_activation_share_its_cast_and_a_plan_gets_a_weightless_bf16_weight():
    """Two cells reading x (gate and up) pay one Cast in; a weightless weight stays weightless at 2 B per value."""
    x = ir.Value(name="x", shape=ir.Shape([1, 64]), type=ir.TensorType(ir.DataType.FLOAT16))
    nodes, outs, inits = [], [], []
    for name in ("gate", "up"):
        t = ir.ExternalTensor(location=mp.WEIGHTLESS, offset=0, length=64 * 32 * 2, dtype=ir.DataType.FLOAT16,
                              shape=ir.Shape([64, 32]), name=f"{name}.w")
        w = ir.Value(name=f"{name}.w", shape=ir.Shape([64, 32]), type=ir.TensorType(ir.DataType.FLOAT16), const_value=t)
        mm = ir.node("MatMul", [x, w], name=name)
        mm.outputs[0].name, mm.outputs[0].dtype, mm.outputs[0].shape = f"{name}.y", ir.DataType.FLOAT16, ir.Shape([1, 32])
        nodes.append(mm), outs.append(mm.outputs[0]), inits.append(w)
    graph = ir.Graph([x], outs, nodes=nodes, initializers=inits, opset_imports={"": 18}, name="g")
    from softsyn.netlist import Netlist

    netlist = Netlist(ir.Model(graph, ir_version=10), "g")
    assert mp.apply_mapping(netlist, {"gate": "bf16", "up": "bf16"}) == {"bf16": 2}
    casts = [n for n in netlist.model.graph if n.op_type == "Cast" and n.attributes.get_int("to") == BF]
    assert len(casts) == 1 and len(casts[0].outputs[0].uses()) == 2
    for w in netlist.model.graph.initializers.values():
        assert w.dtype == BF and mp.is_weightless(w) and w.const_value.nbytes == 64 * 32 * 2
    assert [n.name for n in netlist.model.graph if n.op_type == "MatMul"] == ["gate", "up"]


def _library(bf16: bool = True, fp8: bool = False) -> Library:
    """A small synthetic CUDA library: MatMul at m 1 and 64 of one [1024 x 4096] weight, the m-64 row device-bound
    (its table the kernel time): fp16 200 us, bf16 50 us (so bf16 is the best move), fp8 10 us where asked."""
    def cell(op, p, big, axes=("m", "n", "k"), extra=()):
        points = [[1, 64], [4096], [1024], *extra]
        delays = [[[1e-6]], [[big]]] if not extra else [[[[1e-6]]], [[[big]]]]
        return Cell(op, p, "ort-cuda", list(axes), points, delays)

    cells = [cell("MatMul", "fp16", 200e-6)] + ([cell("MatMul", "bf16", 50e-6)] if bf16 else [])
    if fp8:
        cells.append(cell(mp.FP8_OP, "fp8", 10e-6, ("m", "n", "k", "block"), ([mp.FP8_BLOCK],)))
    header = {"provider": "CUDAExecutionProvider", "runtime": "onnxruntime", "device": "synthetic", "date": "2026-12-03"}
    return Library("synthetic-cuda", header, Ceilings(3e12, {"fp32": 1e14, "fp16": 1e15, "bf16": 1e15}, 1e-9, None,
                                                        1e-6), cells, Path("synthetic-cuda.yaml"))


CONS = """workload: {batch: 1, prompt_len: 8, context_len: 16}
path_groups:
  decode: {kind: decode, clock_period: 1us, dims: {batch: 64}}
accuracy: {max_rel_error: BUDGET FALLBACK}
precision: {allowed: [fp16, ALLOWED], default: fp16}
"""


def _design(allowed="bf16", budget="5%", fallback="", library=None, weights=True):
    k, n = 1024, 4096
    weight = (np.random.default_rng(0).standard_normal((k, n)) * 0.05).astype(np.float16) if weights else None
    text = CONS.replace("ALLOWED", allowed).replace("BUDGET", budget).replace(" FALLBACK", fallback)
    return Design(_tiny(k, n, weight), parse_constraints(text), library or _library(), progress=False)


@pytest.mark.parametrize("library, allowed, why", [
    ("synthetic", "bf16", None),
    ("synthetic", "fp8", ""),  # not asked for: nothing said
    ("no-cell", "bf16", "has no MatMul.bf16 cell"),
    ("cpu-ort", "bf16", "not offered on the CPU target (library cpu-ort): ORT's CPU provider has no bf16 MatMul")])
def test_bf16_is_offered_on_a_gpu_target_with_the_cell_when_allowed_else_said_once(library, allowed, why, capsys):
    from softsyn.library import load_library

    lib = {"synthetic": _library(), "no-cell": _library(bf16=False)}.get(library) or load_library(library)
    design = _design(allowed, library=lib, weights=False)
    if library == "cpu-ort":
        design.progress = True  # the line on stderr
    (cand,), skipped = mp.candidates(design)
    assert ("bf16" in cand.options) == (why is None)
    assert skipped.get("bf16", "") == (why or "") if not why else why in skipped["bf16"]
    if why is None:
        tables = mp.delay_tables(design, [cand])["decode"]["proj"]
        casts = mp.bf16_casts(lib, 64, 1024, 4096)
        assert casts > 0 and tables["bf16"] == pytest.approx(50e-6 + casts, rel=1e-6)
        assert cand.weight_bytes("bf16", 2) == cand.weight_bytes("fp16", 2) == 1024 * 4096 * 2
    if why and library == "cpu-ort":
        passes.run_pass(design, "optimize", {})
        notes = [n for n in design.pass_reports["optimize"].notes if n.startswith("bf16: ")]
        assert len(notes) == 1 and why in notes[0]
        assert capsys.readouterr().err.count("optimize: bf16: not offered on the CPU target") == 1


def test_the_loop_takes_bf16_where_the_library_says_it_is_the_best_move(cache_dir):
    """fp16 200 us against bf16 50 us + its Casts in a 1 us decode clock: the map moves the cell to bf16, its error
    measured on ORT CPU through the bf16 view (nonzero, within the budget), realised bf16, session.json's map says so."""
    design = _design()
    passes.run_pass(design, "optimize", {})
    report = design.pass_reports["optimize"]
    (row,) = report.cells
    assert (row.requested, row.realised) == ("bf16", "bf16") and 0 < row.error < 0.05
    assert report.sensitivity.startswith("measured") and report.checked_error is not None
    assert [n.op_type for n in design.netlist.nodes()] == ["Cast", "MatMul", "Cast"]
    entry = report.session_entries()["precision_map"]
    assert entry["realised"] == {"bf16": 1} and entry["fallback"] is None


def _under_read(monkeypatch):
    """The loop's sensitivities reading 1e-5 for every option: the estimate admits the fp8 map, the end-to-end check
    (fp8's real error on these weights, over the 0.5 % budget) rejects it every time."""
    import passes.optimize as optimize

    def sensitivities(design, cands):
        return ({c.name: {c.current: 0.0, **{p: 1e-5 for p in c.options[1:]}} for c in cands},
                "measured (test: under-read)", True)
    monkeypatch.setattr(optimize, "sensitivities", sensitivities)


def test_accuracy_fallback_bf16_takes_uniform_bf16_when_every_map_fails_and_says_by_how_much(cache_dir, monkeypatch):
    _under_read(monkeypatch)
    design = _design("bf16, fp8", "0.5%", ", fallback: bf16", library=_library(fp8=True))
    passes.run_pass(design, "optimize", {})
    report = design.pass_reports["optimize"]
    fb = report.fallback
    assert fb is not None and fb.realised == "bf16" and fb.cells == 1 and fb.attempts == 3
    assert fb.failed_map == {"fp8": 1} and fb.failed_error > fb.limit == pytest.approx(0.9 * 0.005)
    assert fb.checked_error is not None and 0 < fb.checked_error < fb.limit
    line = next(n for n in report.notes if n.startswith("accuracy.fallback bf16: "))
    assert f"measured {fb.failed_error:.3e} against {fb.limit:.3e}" in line and f"over by {fb.failed_error - fb.limit:.3e}" in line
    assert "fell back to uniform bf16: 1 MatMul cells bf16 (attention and norms stay fp16)" in line
    assert [(c.requested, c.realised) for c in report.cells] == [("bf16", "bf16")]
    assert report.session_entries()["precision_map"]["fallback"]["realised"] == "bf16"
    from reports.advice import design_facts
    from reports.qor import report_qor

    analysis = design.analyze(tp_plan=False)
    qor = report_qor(analysis, facts=design_facts(design, analysis, "medium"))
    assert "fell back to uniform bf16" in qor and "over by" in qor


def test_accuracy_fallback_bf16_without_the_cell_keeps_the_float_design_and_says_so(cache_dir, monkeypatch):
    _under_read(monkeypatch)
    design = _design("bf16, fp8", "0.5%", ", fallback: bf16", library=_library(bf16=False, fp8=True))
    passes.run_pass(design, "optimize", {})
    report = design.pass_reports["optimize"]
    assert report.fallback.realised == "fp16" and report.fallback.cells == 0
    assert "realised as the float design before the map (fp16): library synthetic-cuda has no MatMul.bf16 cell" \
        in report.fallback.why
    assert [n.op_type for n in design.netlist.nodes()] == ["MatMul"] and precision_of(design.netlist.nodes()[0]) == "fp16"
