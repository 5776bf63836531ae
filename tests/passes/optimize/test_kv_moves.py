"""The compile loop's KV moves (passes.optimize.kv_moves): the area-driven cut of the shared KV buffer to the
longest scenario's past + seq (kept when the area budget only fits the shorter buffer; still over, exit 1 with what
would close it), and the KV dtype move's decision on fake tables (a GroupQueryAttention.int8 cell faster than fp16:
kept with its measured error; slower: rejected and the fp16 cache restored)."""
from __future__ import annotations

import dataclasses
import json

import onnx_ir as ir
import pytest
from click.testing import CliRunner

from softsyn.cli import main
from softsyn.design import Design
from passes import LOW, run_pass
from passes.optimize import kv_moves

TINY = """target: h200-ort-cuda
area_constraint: {area}
workload: {{batch: 1, prompt_len: 64, context_len: 256}}
path_groups:
  prefill: {{kind: prefill, clock_period: 150ms, dims: {{batch: 1, seq: 64, past: 0}}}}
  decode: {{kind: decode, clock_period: 8ms, dims: {{batch: 1, seq: 1, past: 256}}}}
accuracy: {{max_rel_error: 2%}}
precision: {{allowed: [fp16, int8], default: fp16}}
kv_cache: {{max_length: 1024}}
"""
NEED = 257  # decode's past 256 + seq 1


def compile_cli(tmp_path, cache_dir, area: str):
    path = tmp_path / "c.yaml"
    path.write_text(TINY.format(area=area))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-tiny", "-c", str(path), "--effort", "medium", "-o",
                                       str(out), "--cache-dir", str(cache_dir), "-q"])
    return result, out


def test_area_budget_that_fits_only_the_shorter_buffer_keeps_the_cut(tmp_path, cache_dir):
    result, out = compile_cli(tmp_path, cache_dir, "2.3MB")  # 2.57 MB at 1024 positions, 1.79 MB at 257
    assert result.exit_code == 0, result.output
    session = json.loads((out / "runtime" / "session.json").read_text())
    assert session["kv_cache"]["max_length"] == NEED
    assert session["inputs"]["past_key_values.0.key"]["shape"][2] == NEED
    length = next(m for m in session["kv_moves"] if m["phase"] == "opt.kv.length")
    assert length["kept"] and length["requested"] == length["realised"] == f"max_length {NEED}"
    log = (out / "compile.log").read_text()
    assert "opt.kv.length (est)" in log and "kv_cache.max_length asked 1024, cut to the longest scenario" in log
    assert json.loads((out / "genai_config.json").read_text())["search"]["max_length"] == NEED


def test_impossible_area_budget_exits_1_with_the_suggestion(tmp_path, cache_dir):
    result, out = compile_cli(tmp_path, cache_dir, "1.5MB")
    assert result.exit_code == 1
    log = (out / "compile.log").read_text()
    assert "still over by 0.3 MB at the shortest buffer every scenario fits in" in log
    assert "set kv_cache.dtype int8 (1 B per cached element)" in log


@pytest.fixture(scope="module")
def fp16_design(cache_dir, tmp_path_factory):
    """qwen3-tiny after the low script on the cuda target: an fp16 shared buffer of 1024 positions."""
    path = tmp_path_factory.mktemp("kv-moves") / "c.yaml"
    path.write_text(TINY.format(area="1GiB"))
    design = Design.load("zoo:qwen3-tiny", path, cache_dir=cache_dir, progress=False, materialize=True)
    for step in LOW.steps:
        run_pass(design, step.pass_name, dict(step.options))
    return design


def with_int8_cell(design, library, factor: float):
    """`library` with fake GroupQueryAttention.int8 cells: the fp16 tables (eager and graph) x `factor`."""
    fake = [dataclasses.replace(c, precision="int8", delays=None, _flat=[d * factor for d in c._flat])
            for c in library.cells if c.op == "GroupQueryAttention" and c.precision == "fp16"]
    design.library = dataclasses.replace(library, cells=fake + list(without_int8_cell(library).cells))


def without_int8_cell(library):
    """`library` with no GroupQueryAttention.int8 cell (as one characterised before the cell existed)."""
    return dataclasses.replace(library, cells=[c for c in library.cells if not (
        c.op == "GroupQueryAttention" and c.precision == "int8")])


def gqa_ports(design):
    node = next(n for n in design.netlist.model.graph if n.op_type == "GroupQueryAttention")
    return node, {node.inputs[3].dtype, node.inputs[4].dtype, node.outputs[1].dtype, node.outputs[2].dtype}


def test_dtype_move_decides_on_the_tables_and_the_measured_error(fp16_design):
    """On one design, in turn: an int8 cell slower than fp16 (rejected, the fp16 cache restored), a faster one under a
    budget its measured error exceeds (rejected), a faster one within the budget (kept, its error reported)."""
    design, library = fp16_design, fp16_design.library
    design.library = without_int8_cell(library)
    assert kv_moves.dtype_blocker(design).startswith("library h200-ort-cuda has no GroupQueryAttention.int8")
    design.library = library
    assert kv_moves.dtype_blocker(design) == ""  # the shipped library has the measured cell
    for factor, budget, kept, why in ((2.0, 1.8e-2, False, "rejected (no lower cost"),
                                      (0.5, 1e-5, False, "rejected (over the accuracy budget)"),
                                      (0.5, 1.8e-2, True, "kept: error")):
        with_int8_cell(design, library, factor)
        assert kv_moves.dtype_blocker(design) == ""
        rows = []
        move, _ = kv_moves.dtype_move(design, design.analyze(tp_plan=False), lambda p, a: rows.append(p), budget, 0.0)
        assert rows == ["opt.kv.dtype"] and move.kept is kept and move.why.startswith(why)
        assert 0 < move.error < 1.8e-2
        node, dtypes = gqa_ports(design)
        if kept:
            assert dtypes == {ir.DataType.INT8} and node.attributes["kv_cache_bit_width"].value == 8
            assert design.pass_reports["kv_layout"].kv_dtype == "int8" and move.realised == "int8"
        else:
            assert dtypes == {ir.DataType.FLOAT16} and "kv_cache_bit_width" not in node.attributes
            assert all(v is None for v in node.inputs[12:14])
            assert not any(name.endswith("_k_scale") for name in design.netlist.model.graph.initializers)


SERVING = """serving:
  arrival_rate: 2000/s
  max_batch: 16
  batch_timeout: 2ms
  prompt_len: {p50: 128, p99: 200}
  gen_len: {p50: 64, p99: 120}
  ttft: {p99: 5ms}
  requests: 300
  seed: 0
"""


def test_with_a_serving_block_the_dtype_move_is_judged_on_the_simulated_load_too(cache_dir, tmp_path):
    """An int8 cell twice as slow as fp16 raises every step's latency (rejected without a serving block, above), but
    under a load whose KV budget binds (2.5 MB: 1,394 fp16 tokens) the int8 cache admits twice the tokens and the
    simulated TTFT p99 falls: the serving checks' violation ranks above latency, so the move is kept and says so."""
    path = tmp_path / "c.yaml"
    path.write_text(TINY.format(area="2.5MB").replace("max_length: 1024", "max_length: 512") + SERVING)
    design = Design.load("zoo:qwen3-tiny", path, cache_dir=cache_dir, progress=False, materialize=True)
    for step in LOW.steps:
        run_pass(design, step.pass_name, dict(step.options))
    with_int8_cell(design, design.library, 2.0)
    before = design.analyze(tp_plan=False, serving=True)
    move, after = kv_moves.dtype_move(design, design.analyze(tp_plan=False), lambda p, a: None, 1.8e-2, 0.0)
    assert move.kept, move.why
    assert "serving checks violated: ttft_p99 -> " in move.why
    assert kv_moves.loop_cost(after).serving < kv_moves.loop_cost(before).serving
    assert kv_moves.loop_cost(after).latency > kv_moves.loop_cost(before).latency  # bought with step time
    assert gqa_ports(design)[1] == {ir.DataType.INT8}
