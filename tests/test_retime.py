"""Measured re-timing inside effort ultra: the map timed against the design before it on the target's provider, one
interleaved run; a map no faster back-annotates the tables and is searched again, at most ROUNDS times. The real
measurement runs on the CPU; the decision logic runs on injected measurements (the CI machine is noisy)."""
import json
from pathlib import Path

import pytest

from softsyn import passes
from softsyn.design import Design
from softsyn.emit import session_json
from softsyn.flow.compile import CompileLog
from softsyn.passes import effort
from softsyn.passes import optimize
from softsyn.passes.precision import mapping as mp
from softsyn.passes.precision import retime as rt
from softsyn.passes.precision import search
from softsyn.reports import report_precision
from softsyn.runtime.measure import Measurement

ROOT = Path(__file__).resolve().parents[1]
# qwen3-tiny on the CPU library with int4 allowed and a decode clock it misses: the tables move the lm_head to int4
# (7.7 against 8.1 us at m 1), a change no measurement on this machine can tell from noise.
TIGHT = """target: cpu-ort
input_delay: 1ms
output_delay: 100us
workload: {batch: 1, prompt_len: 32, context_len: 64}
path_groups:
  prefill: {kind: prefill, clock_period: 20ms, dims: {batch: 1, seq: 32, past: 0}}
  decode: {kind: decode, clock_period: 300us, weight: 2, dims: {batch: 1, seq: 1, past: 64}}
accuracy: {max_rel_error: 50%}
precision: {allowed: [fp32, int4], default: fp32}
kv_cache: {dtype: fp32, max_length: 128}
"""


def low_design(cache_dir, tmp_path, text: str = TIGHT) -> Design:
    (tmp_path / "c.yaml").write_text(text)
    design = Design.load("zoo:qwen3-tiny", tmp_path / "c.yaml", cache_dir=cache_dir, progress=False)
    for step in effort("low").steps:
        passes.run_pass(design, step.pass_name, dict(step.options))
    return design


def ultra(design) -> optimize.OptimizeReport:
    (step,) = [s for s in effort("ultra").steps if s.pass_name == "optimize"]
    assert dict(step.options)["retime"] is True and "measured re-timing" in step.what
    passes.run_pass(design, "optimize", dict(step.options))
    return design.pass_reports["optimize"]


def fake(scale: float, calls: list | None = None):
    """A measurement: every group's baseline at 100 us x (1 + 1 % per round), the map at `scale` times that."""
    def measure(design, mapped, provider):
        if calls is not None:
            calls.append({n.name: n.op_type for n in mapped.nodes() if n.op_type == "MatMulNBits"})
        out = {}
        for g in design.groups:
            base = [1e-4 * (1 + 0.01 * r) for r in range(10)]
            out[g.name] = tuple(Measurement(sorted(m)[5], max(m), 10, "CPUExecutionProvider", min(m), list(m), list(m))
                                for m in (base, [scale * x for x in base]))
        return out
    return measure


def test_ultra_on_cpu_measures_the_map_against_the_design_before_it(cache_dir, tmp_path):
    design = low_design(cache_dir, tmp_path)
    report = ultra(design)
    assert report.retime is not None and report.retime.provider == "cpu" and report.retime.rounds
    first = report.retime.rounds[0]
    assert list(first.moved.values()) == ["int4"]  # the lm_head, the one cell int4 makes faster at decode
    for g in first.groups:  # both designs measured, the paired ratio's spread around its median
        assert g.measured_base > 0 and g.measured_map > 0 and g.ratio_p10 <= g.ratio <= g.ratio_p90
        assert g.slack_map == pytest.approx(g.budget - g.measured_map)
    rows = [t for t in report.trace if t.measured]
    assert [t.phase for t in rows][:2] == ["opt.measured.base", "opt.measured.1"]
    decode = next(g for g in first.groups if g.group == "decode")
    assert rows[1].wns == pytest.approx(min(0.0, min(g.slack_map for g in first.groups)))
    assert rows[1].worst_group == "decode" and decode.slack_map < 0
    log = CompileLog("qwen3-tiny", "cpu-ort", effort("ultra"))
    log.add_estimates(report, design.analyze(tp_plan=False), 1)
    phases = [r.phase for r in log.rows]
    assert "opt.measured.1" in phases and "opt.greedy (est)" in phases  # measured rows are not labelled estimates
    note = next(n for n in report.notes if n.startswith("measured re-timing round 1 on cpu (baseline vs map of 1 int4)"))
    assert "prefill" in note and "decode" in note and note.count(" -> ") >= 4 and "load average" in note
    assert "paired x" in note and "(median [p10-p90] over 10 rounds)" in note
    kept = report.retime.kept is not None
    nbits = [n for n in design.netlist.nodes() if n.op_type == "MatMulNBits"]
    assert bool(nbits) == kept  # what the design holds is what the measurement decided
    assert any(n.startswith("measured re-timing: ") for n in report.notes)
    assert not kept or report.checked_error is not None
    assert optimize.GPU_SPEED_UNMEASURED not in report.notes
    text = report_precision(report, "qwen3-tiny", "cpu-ort")
    assert "Measured re-timing on cpu" in text and "Meas base (ms)" in text and "Pred map (ms)" in text
    assert f"Outcome: {report.retime.why}" in text
    measured = json.loads(json.dumps(session_json(design, {})["precision_map"]["measured"], allow_nan=False))
    assert measured["provider"] == "cpu" and measured["outcome"] == report.retime.why
    assert len(measured["rows"]) == 2 * len(report.retime.rounds)  # session.json: the report's rows, in seconds
    assert measured["rows"][0]["measured_base"] == first.groups[0].measured_base


def test_a_map_measured_slower_corrects_the_tables_and_the_design_keeps_its_precision(cache_dir, tmp_path,
                                                                                     monkeypatch):
    design = low_design(cache_dir, tmp_path)
    calls = []
    monkeypatch.setattr(rt, "Bench", lambda folder: fake(1.3, calls))
    report = ultra(design)
    (rnd,) = report.retime.rounds  # the corrected tables leave no faster map: nothing more to measure
    assert not rnd.kept and rnd.ratio == pytest.approx(1.3)
    assert rnd.verdict.startswith("rejected: the map's measured weighted negative slack") and "is worse" in rnd.verdict
    assert len(calls) == 1 and set(calls[0].values()) == {"MatMulNBits"}  # the measured copy held the map ...
    assert not [n for n in design.netlist.nodes() if n.op_type == "MatMulNBits"]  # ... the design keeps fp32
    corrected = next(n for n in report.notes if n.startswith("tables back-annotated from round 1"))
    assert "decode x-" in corrected  # a predicted saving measured as a loss: the factor flips its sign
    cell = next(iter(rnd.moved))
    for g in report.problem.cost:  # the tables the design ends on time the moved cell's int4 slower than fp32
        assert report.problem.cost[g][cell]["int4"] > report.problem.cost[g][cell]["fp32"]
    phases = [t.phase for t in report.trace]
    assert phases.index("opt.measured.1") < len(phases) - 1 - phases[::-1].index("opt.greedy")  # re-searched after
    assert report.notes[-1] == ("measured re-timing: the re-search on the corrected tables finds no map faster than "
                                "the baseline: the design keeps its precision")
    assert report.checked_error is None and report.estimate_error == 0.0
    assert all(c.realised == "fp32" for c in report.cells)


def test_the_loop_stops_at_its_cap_and_a_faster_map_is_kept(cache_dir, tmp_path):
    design = low_design(cache_dir, tmp_path)
    cands, _ = mp.candidates(design)  # unpruned: every cell has int4, so three distinct maps exist
    problem = optimize.build_problem(design, cands, {c.name: {"fp32": 0.0, "int4": 0.01} for c in cands}, 0.5)
    maps = [{**search.baseline(problem), c.name: "int4"} for c in cands[:rt.ROUNDS + 1]]
    proposed = []

    def propose(tables):
        proposed.append(tables)
        return search.outcome(tables, maps[len(proposed)], [])

    report = optimize.OptimizeReport("ultra", "test", 0.5)
    chosen, tables = rt.retime(design, problem, search.outcome(problem, maps[0], []), propose, report,
                               measure=fake(1.5))
    assert len(report.retime.rounds) == rt.ROUNDS and len(proposed) == rt.ROUNDS - 1
    assert [r.moved for r in report.retime.rounds] == [{c.name: "int4"} for c in cands[:rt.ROUNDS]]
    assert chosen.mapping == search.baseline(problem) and report.retime.kept is None
    assert report.retime.why.startswith(f"no measured map beat the baseline in {rt.ROUNDS} rounds (the cap)")
    assert sum(1 for t in report.trace if t.measured) == rt.ROUNDS + 1  # the baseline's row, then one per round

    report = optimize.OptimizeReport("ultra", "test", 0.5)
    chosen, _ = rt.retime(design, problem, search.outcome(problem, maps[0], []), propose, report, measure=fake(0.8))
    assert chosen.mapping == maps[0] and report.retime.kept == 1
    assert report.retime.rounds[0].verdict.startswith("kept: the map is measured faster (x0.800")


def test_an_absent_device_skips_the_measurement_in_one_note(cache_dir, tmp_path):
    """A cuda target where no CUDA session opens: one note, the map kept as the tables chose it, still labelled an
    estimate. The cuda path's inputs are checked on that design: decode captured (graph replay), shared KV aliases,
    fp16 feeds; its CPU view (llama-tiny's GQA runs on ORT CPU) is measured by the same code."""
    from softsyn.runtime.decoder import kv_aliases

    text = ("target: h200-ort-cuda\nworkload: {batch: 1, prompt_len: 16, context_len: 32}\npath_groups:\n"
            "  prefill: {kind: prefill, clock_period: 100ms, dims: {batch: 1, seq: 16, past: 0}}\n"
            "  decode: {kind: decode, clock_period: 10us, dims: {batch: 1, seq: 1, past: 32}}\n"
            "accuracy: {max_rel_error: 50%}\nprecision: {allowed: [fp16, int8, int4], default: fp16}\n")
    (tmp_path / "g.yaml").write_text(text)
    design = Design.load("zoo:llama-tiny", tmp_path / "g.yaml", cache_dir=cache_dir, progress=False)
    for step in effort("low").steps:
        passes.run_pass(design, step.pass_name, dict(step.options))
    cands, _ = mp.candidates(design)
    mapped = rt.mapped_netlist(design.netlist, {cands[0].name: "int4"})
    assert rt.graph_flags(design, mapped, "cuda") == {"base": [False, True], "map": [False, True]}
    assert rt.graph_flags(design, mapped, "cpu") == {"base": [False, False], "map": [False, False]}
    assert len(kv_aliases(mapped)) == 2 * design.netlist.config["num_layers"]
    bench = rt.Bench(tmp_path / "bench", runs=2, rounds=2, warmup=1)
    pairs = bench(design, mapped, "cpu")
    base = bench.base
    assert set(pairs) == {"prefill", "decode"} and all(len(m.round_medians) == 2 for p in pairs.values() for m in p)
    bench(design, rt.mapped_netlist(design.netlist, {cands[1].name: "int8"}), "cpu")
    assert bench.base is base and bench.maps == 2  # the baseline opened once for every round
    assert not list((tmp_path / "bench" / "map1").iterdir()) and (tmp_path / "bench" / "base" / "model.onnx").is_file()
    bench.close()
    report = ultra(design)
    skipped = [n for n in report.notes if n.startswith("measured re-timing")]
    assert len(skipped) == 1 and skipped[0].startswith("measured re-timing skipped: provider cuda not available here")
    assert report.retime is None and optimize.GPU_SPEED_UNMEASURED in report.notes
    assert not any(t.measured for t in report.trace)


def test_a_measurement_that_cannot_run_leaves_the_tables_map_labelled(cache_dir, tmp_path, monkeypatch):
    design = low_design(cache_dir, tmp_path)

    def broken(design, mapped, provider):
        raise RuntimeError("CUDA failure 2: out of memory")

    monkeypatch.setattr(rt, "Bench", lambda folder: broken)
    report = ultra(design)
    assert report.retime is None and [n.op_type for n in design.netlist.nodes()].count("MatMulNBits") == 1
    assert "measured re-timing round 1 could not run on cpu: RuntimeError: CUDA failure 2: out of memory" in report.notes
