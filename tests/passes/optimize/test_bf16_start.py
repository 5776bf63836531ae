"""precision.default: bf16 with bf16 in precision.allowed: on a GPU target whose library has MatMul.bf16 the compile
loop starts from uniform bf16 (every MatMul candidate a bf16 cell, as accuracy.fallback builds it), its moves priced
against the bf16 cell; under a budget that cannot take fp8 everywhere the map mixes fp8 and bf16 cells. On the CPU
target default bf16 is realised as today (fp16, said in the log). ORT CPU through the CPU view runs both cells."""
import numpy as np
import onnx
import onnx_ir as ir
import pytest

import passes
from passes.optimize import mapping as mp
from softsyn.constraints import parse_constraints
from softsyn.design import Design
from softsyn.library.model import Ceilings, Cell, Library
from softsyn.netlist import Netlist
from softsyn.timing.cost import precision_of
from pathlib import Path

D = 256  # each cell's weight [D, D]
CELLS = 4

CONS = """workload: {batch: 1, prompt_len: 8, context_len: 16}
path_groups:
  decode: {kind: decode, clock_period: 1us, dims: {batch: 64}}
accuracy: {max_rel_error: BUDGET}
precision: {allowed: [ALLOWED], default: bf16}
"""


def _chain(weights: list[np.ndarray]) -> Netlist:
    """x [batch, 1, D] -> mm0 -> mm1 -> ... -> y, each an fp16 MatMul with its own initializer."""
    x = ir.Value(name="x", shape=ir.Shape(["batch", 1, D]), type=ir.TensorType(ir.DataType.FLOAT16))
    nodes, inits, src = [], [], x
    for i, w in enumerate(weights):
        value = ir.Value(name=f"w{i}", shape=ir.Shape([D, D]), type=ir.TensorType(ir.DataType.FLOAT16),
                         const_value=ir.tensor(w, name=f"w{i}"))
        mm = ir.node("MatMul", [src, value], name=f"mm{i}")
        out = mm.outputs[0]
        out.name, out.shape, out.dtype = f"h{i}", ir.Shape(["batch", 1, D]), ir.DataType.FLOAT16
        nodes.append(mm), inits.append(value)
        src = out
    graph = ir.Graph([x], [src], nodes=nodes, initializers=inits, opset_imports={"": 18}, name="g")
    return Netlist(ir.Model(graph, ir_version=10), "g")


def _library() -> Library:
    """A synthetic CUDA library like the H200's in kind: bf16 no faster than fp16 (200 us each at m 64, so the loop
    would never pick bf16 for speed), fp8 10 us (the move the loop makes)."""
    def cell(op, p, big, extra=()):
        axes = ("m", "n", "k", *(("block",) if extra else ()))
        points = [[1, 64], [D], [D], *extra]
        delays = [[[1e-6]], [[big]]] if not extra else [[[[1e-6]]], [[[big]]]]
        return Cell(op, p, "ort-cuda", list(axes), points, delays)

    cells = [cell("MatMul", "fp16", 200e-6), cell("MatMul", "bf16", 200e-6),
             cell(mp.FP8_OP, "fp8", 10e-6, ([mp.FP8_BLOCK],))]
    header = {"provider": "CUDAExecutionProvider", "runtime": "onnxruntime", "device": "synthetic", "date": "2026-12-06"}
    return Library("synthetic-cuda", header, Ceilings(3e12, {"fp32": 1e14, "fp16": 1e15, "bf16": 1e15}, 1e-9, None,
                                                        1e-6), cells, Path("synthetic-cuda.yaml"))


def _weights() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float16) for _ in range(CELLS)]


def _design(budget: str, allowed: str = "bf16, fp8", library=None) -> Design:
    text = CONS.replace("BUDGET", budget).replace("ALLOWED", allowed)
    return Design(_chain(_weights()), parse_constraints(text), library or _library(), progress=True)


def _run(netlist: Netlist, tmp_path, x: np.ndarray) -> np.ndarray:
    from softsyn.flow.cpu_view import cpu_view_session

    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(ir.to_proto(netlist.model), str(path))
    session, _ = cpu_view_session(path)
    return session.run(None, {"x": x})[0].astype(np.float32)


def test_default_bf16_starts_the_loop_from_bf16_cells_and_a_tight_budget_keeps_a_mix_of_fp8_and_bf16(
        cache_dir, tmp_path, capsys):
    """The start: every cell bf16 (its cost the bf16 cell's, Casts included; fp16 not an option). The budget admits
    one fp8 cell's error over the bf16 start, not two: the map moves some cells to fp8 and keeps the rest bf16,
    checked end to end; the realised design's outputs (ORT CPU, CPU view) are within the budget of the fp16 design's;
    the precision report, session.json's precision_map and the log say the counts."""
    reference = _chain(_weights())
    design = _design("5%")
    passes.run_pass(design, "precision", {})
    passes.run_pass(design, "optimize", {})
    report = design.pass_reports["optimize"]
    err = capsys.readouterr().err
    assert "precision: requested bf16, realised fp16 for the float design" in err
    assert "optimize: start: uniform bf16 (precision.default bf16): 4 MatMul cells start as bf16 cells" in err
    assert report.start == {"bf16": CELLS}
    # the loop's tables: bf16 first (the start), fp8 the one move, priced against the bf16 cell (its Casts too)
    assert all(report.problem.options[c] == ("bf16", "fp8") for c in report.problem.cells)
    row = report.problem.cost["decode"]["mm0"]
    assert row["bf16"] == pytest.approx(200e-6 + mp.bf16_casts(design.library, 64, D, D), rel=1e-6)
    assert all(0 < report.problem.error[c]["bf16"] < report.problem.error[c]["fp8"] for c in report.problem.cells)

    realised = [c.realised for c in report.cells]
    assert 0 < realised.count("fp8") < CELLS and realised.count("bf16") == CELLS - realised.count("fp8")
    assert all(c.requested == c.realised for c in report.cells)
    assert report.checked_error is not None and report.checked_error <= 0.9 * 0.05
    entry = report.session_entries()["precision_map"]
    assert entry["realised"] == {"fp8": realised.count("fp8"), "bf16": realised.count("bf16")}
    assert entry["start"] == {"bf16": CELLS}
    assert f"the map: {realised.count('fp8')} fp8 + {realised.count('bf16')} bf16 cells (from a start of 4 bf16)" in err
    from reports.precision import report_precision

    rpt = report_precision(report)
    assert f"{realised.count('bf16')} x bf16" in rpt and f"{realised.count('fp8')} x fp8" in rpt
    assert "start: uniform bf16" in rpt
    # the structure: bf16 cells are Cast -> MatMul(bf16 weight) -> Cast; an fp8 cell reads fp16 (no Casts)
    nodes = {n.name: n for n in design.netlist.nodes()}
    for c in report.cells:
        node = nodes[c.name]
        assert precision_of(node) == c.realised
        if c.realised == "fp8":
            assert node.op_type == mp.FP8_OP and node.inputs[0].dtype == ir.DataType.FLOAT16
        else:
            assert node.inputs[0].producer().op_type == "Cast" and node.inputs[1].dtype == mp.BF
    # equivalence: the realised design against the fp16 design, ORT CPU through the CPU view
    x = np.random.default_rng(5).standard_normal((2, 1, D)).astype(np.float16)
    want, got = _run(reference, tmp_path, x), _run(design.netlist, tmp_path, x)
    error = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < error <= 0.05


def test_a_budget_over_the_bf16_start_keeps_the_start_and_says_why(cache_dir, capsys):
    """A budget smaller than the bf16 start's own estimate: no move (each adds error); every cell stays bf16."""
    design = _design("0.1%")
    passes.run_pass(design, "optimize", {})
    report = design.pass_reports["optimize"]
    assert [c.realised for c in report.cells] == ["bf16"] * CELLS
    assert any(n.startswith("start: uniform bf16's estimate") and "no move searched" in n for n in report.notes)


@pytest.mark.parametrize("library, why", [
    ("cpu-ort", "the CPU target (library cpu-ort) has no bf16 MatMul kernel in ORT"),
    ("no-cell", "library synthetic-cuda has no MatMul.bf16 cell")])
def test_default_bf16_where_the_start_cannot_be_bf16_is_realised_as_today(library, why, cache_dir, capsys):
    """The CPU target (and a GPU library without MatMul.bf16): precision's substitution (fp16, its log line), and the
    loop's start is the float design, said once; no bf16 cell."""
    from softsyn.library import load_library

    lib = load_library("cpu-ort") if library == "cpu-ort" else _library()
    if library == "no-cell":
        lib.cells = [c for c in lib.cells if c.precision != "bf16"]
    design = _design("5%", "fp16, bf16, fp8", library=lib)
    passes.run_pass(design, "precision", {})
    passes.run_pass(design, "optimize", {})
    err = capsys.readouterr().err
    assert "precision: requested bf16, realised fp16 (the low-effort map is uniform fp32/fp16; fp16 is in " \
           "precision.allowed)" in err
    assert f"optimize: start: precision.default bf16 realised as the float design (fp16): {why}" in err
    report = design.pass_reports["optimize"]
    assert report.start is None and "bf16" not in {c.realised for c in report.cells}
    assert not any(n.op_type == "Cast" for n in design.netlist.nodes())
