"""reports: golden text of every report on a hand-built Analysis, plus fold_points,
JSON round-trip and the MET/VIOLATED lines. SOFTSYN_UPDATE_GOLDEN=1 rewrites tests/reports/golden/."""
from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest

from softsyn.timing import (Analysis, AreaItem, AreaResult, GroupTiming, KVBudget, PathPoint, Scenario, TimingPath,
                            WeightOption, WorkspacePoint)
from softsyn.timing.area import kv_budget, weight_options
from softsyn.results.serving import Distribution, ServingCheck, ServingResult, ServingSuggestion, StepPoint
from reports import (REPORTS, fold_points, from_json, report_area, report_constraint,
                     report_qor, report_timing, to_json, write_reports)

GOLDEN = Path(__file__).parent / "golden"
MS = 1e-3

# (hierarchy, node, cell, op type, source, delay in ms)
LAYER = [
    ("input_layernorm", "SimplifiedLayerNormalization", "RMSNorm.fp16", "SimplifiedLayerNormalization", "table", 0.003),
    ("self_attn.qkv_proj", "MatMul", "MatMul.fp16", "MatMul", "table", 0.021),
    ("self_attn", "GroupQueryAttention", "GroupQueryAttention.fp16", "GroupQueryAttention", "est", 0.012),
    ("self_attn.o_proj", "MatMul", "MatMul.fp16", "MatMul", "table", 0.008),
    ("post_attention_layernorm", "SkipSimplifiedLayerNormalization", "SkipRMSNorm.fp16",
     "SkipSimplifiedLayerNormalization", "est", 0.004),
    ("mlp.gate_up_proj", "MatMul", "MatMul.fp16", "MatMul", "table", 0.030),
    ("mlp.down_proj", "MatMul", "MatMul.fp16", "MatMul", "table", 0.015),
    ("mlp", "Mul", "Mul.fp16", "Mul", "est", 0.002),
]


def make_points(input_delay: float, scale: float) -> list[PathPoint]:
    rows = [("", "session.run", "Run.overhead", "Run", "est", 0.010),
            ("model.embed_tokens", "Gather", "Gather.fp16", "Gather", "table", 0.004)]
    for i in range(3):
        rows += [(f"model.layers.{i}.{h}", n, c, o, s, d) for h, n, c, o, s, d in LAYER]
    rows += [("model.norm", "SimplifiedLayerNormalization", "RMSNorm.fp16", "SimplifiedLayerNormalization", "table", 0.003),
             ("lm_head", "MatMulNBits_lm_head_quantized_int4_block32", "MatMulNBits.int4.b32", "MatMulNBits", "table", 0.060)]
    points, t = [], input_delay
    for hier, node, cell, op, src, d in rows:
        delay = d * scale * MS
        t += delay
        points.append(PathPoint(name=f"{hier}/{node}" if hier else node, cell=cell, incr=delay, arrival=t,
                                source=src, hierarchy=hier, op_type=op, flops=1e9 * d, bytes=2e7 * d))
    return points


def make_path(group: str, scenario: Scenario, endpoint: str, period: float, scale: float) -> TimingPath:
    input_delay, unc, out = 0.2 * MS, 0.1 * MS, 0.05 * MS
    points = make_points(input_delay, scale)
    arrival = points[-1].arrival
    required = period - unc - out
    return TimingPath(group=group, scenario=scenario, startpoint="input_ids", endpoint=endpoint,
                      clock_period=period, input_delay=input_delay, clock_uncertainty=unc, output_delay=out,
                      points=points, arrival=arrival, required=required, slack=required - arrival)


def make_kv_budget(area: AreaResult) -> KVBudget:
    """The budget area.py derives, on the hand-built figures: 0.5 GB of KV at 4096 tokens, a workspace
    measured at three KV lengths."""
    budget = KVBudget(
        tensors=6, layout="[batch, kv_heads, past, head_dim]", dtype="fp16", bytes_per_token=0.5e9 / 4096, batch=1,
        concurrency=1, length=4096, length_key="workload.context_len", limit=area.limit, weights=3.355e9,
        workspace=0.045e9, workspace_scenario="prefill",
        workspace_points=[WorkspacePoint(1, 0.040e9), WorkspacePoint(4096, 0.045e9), WorkspacePoint(8192, 0.052e9)],
        available=None, max_concurrency=None, max_context=None, max_positions=40960, requested_dtype="fp8",
        weight_precisions=[WeightOption(p, "estimate" if i else "netlist", b, 0.0, None, None)
                           for i, (p, b) in enumerate(weight_options(area.by_kind, ["fp16", "int8", "int4"]))])
    return kv_budget(budget)


def make_analysis() -> Analysis:
    decode_sc = Scenario("decode", {"batch": 1, "seq": 1, "past": 512}, "decode (batch 1, past 512)")
    prefill_sc = Scenario("prefill", {"batch": 1, "seq": 512, "past": 0}, "prefill (batch 1, seq 512)")
    decode = GroupTiming(name="decode", clock_period=2.0 * MS, weight=1.0, critical_range=0.0, scenario=decode_sc,
                         paths=[make_path("decode", decode_sc, "logits", 2.0 * MS, 1.0)], cell_count=30,
                         estimated_cells=10, total_flops=8.192e9, total_bytes=3.44e9)
    p1 = make_path("prefill", prefill_sc, "logits", 5.0 * MS, 30.0)
    p2 = make_path("prefill", prefill_sc, "present.2.value", 5.0 * MS, 28.0)
    prefill = GroupTiming(name="prefill", clock_period=5.0 * MS, weight=1.0, critical_range=0.0,
                          scenario=prefill_sc, paths=[p1, p2], cell_count=30, estimated_cells=10,
                          total_flops=4.19e12, total_bytes=3.61e9)
    per_layer = [AreaItem(f"model.layers.{i}.{m}", b, n, "parameters")
                 for i in range(3) for m, b, n in (("mlp", 0.6e9, 300_000_000), ("self_attn", 0.3e9, 150_000_000))]
    area = AreaResult(
        by_kind=[AreaItem("weights float16", 3.2e9, 1_600_000_000, "parameters"),
                 AreaItem("weights int4", 0.155e9, 310_000_000, "parameters"),
                 AreaItem("kv_cache", 0.50e9, 6, "6 tensors (float16) x batch 1 x concurrency 1 x 4096 tokens"),
                 AreaItem("activations (peak)", 0.045e9, 0, "live intermediates, prefill scenario")],
        by_hierarchy=[AreaItem("model.embed_tokens", 0.31e9, 155_000_000, "parameters"), *per_layer,
                      AreaItem("model.norm", 4096.0, 2048, "parameters"),
                      AreaItem("lm_head", 0.155e9, 310_000_000, "parameters")],
        total=3.2e9 + 0.155e9 + 0.5e9 + 0.045e9, limit=4.0e9, parameters=1_910_000_000,
        kv_detail="6 tensors (float16) x batch 1 x concurrency 1 x 4096 tokens", activation_scenario="prefill")
    area.kv_budget = make_kv_budget(area)
    return Analysis(design="toy-3layer", library="h200-ort-cuda", library_source="roofline estimate",
                    version="softsyn 0.1.0", date="Mon Jan  5 12:00:00 2026",
                    provenance={"source": "hand-built test"}, constraints_file="toy.sdc.yaml",
                    groups=[decode, prefill], area=area,
                    cell_counts={"MatMul": 12, "GroupQueryAttention": 3, "SimplifiedLayerNormalization": 4,
                                 "SkipSimplifiedLayerNormalization": 3, "Mul": 3, "Gather": 1, "MatMulNBits": 1,
                                 "Run": 1},
                    notes=["10 of 30 cells are roofline estimates"])


def area_over(analysis: Analysis, limit: float) -> Analysis:
    """The analysis under a smaller area_constraint: the budget re-derived at it."""
    analysis.area.limit = limit
    analysis.area.kv_budget.limit = limit
    kv_budget(analysis.area.kv_budget)
    return analysis


@pytest.fixture
def analysis() -> Analysis:
    return make_analysis()


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SOFTSYN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if not path.exists():
        pytest.fail(f"golden file {path} missing; run with SOFTSYN_UPDATE_GOLDEN=1 to write it")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from golden (SOFTSYN_UPDATE_GOLDEN=1 rewrites)"


def with_serving(analysis: Analysis) -> Analysis:
    """The analysis with a hand-built serving result: a violated TTFT p99, a met throughput, two suggestions."""
    analysis.serving = ServingResult(
        load="100 requests, Poisson at 50/s (seed 0)", model="continuous batching (hand-built)", requests=100,
        completed=100, throughput=1234.5, offered=1300.0, kv_tokens=8000.0,
        checks=[ServingCheck("ttft_p50", "time", 0.3, 0.1205, 0.1795),
                ServingCheck("ttft_p99", "time", 0.8, 0.95, -0.15),
                ServingCheck("throughput", "rate", 1000.0, 1234.5, 234.5)],
        distributions=[Distribution("ttft", 0.1205, 0.5, 0.95, 0.2, 1.1)],
        steps=[StepPoint("decode", 4, 256, 0.0021)],
        suggestions=[ServingSuggestion("max_batch", "max_batch 16 -> 32", "ttft_p99 700.0 ms: all met", True),
                     ServingSuggestion("kv_dtype", "kv_cache.dtype int8", "not simulated: no area_constraint", None)],
        notes=["a note"])
    return analysis


GOLDEN_CASES = {
    "qor_serving.rpt": lambda a: report_qor(with_serving(a)),
    "constraint_serving.rpt": lambda a: report_constraint(with_serving(a)),
    "timing_full.rpt": lambda a: report_timing(a),
    "timing_folded.rpt": lambda a: report_timing(a, fold=True),
    "timing_prefill_2paths.rpt": lambda a: report_timing(a, group="prefill", max_paths=2, fold=True),
    "qor.rpt": report_qor,
    "area.rpt": report_area,
    "area_violated.rpt": lambda a: report_area(area_over(a, 3.7e9)),
    "area_weights_over.rpt": lambda a: report_area(area_over(a, 3.0e9)),
    "constraint.rpt": report_constraint,
    "constraint_all.rpt": lambda a: report_constraint(a, all_violators=False),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden(analysis, name):
    check_golden(name, GOLDEN_CASES[name](analysis))


# -------------------------------------------------------------------------------- timing

def test_banner_and_options(analysis):
    text = report_timing(analysis, group="decode", max_paths=3, fold=True)
    lines = text.splitlines()
    assert lines[0] == "*" * 40 and lines[1] == "Report : timing"
    for opt in ("-path full", "-delay max", "-max_paths 3", "-group decode", "-fold"):
        assert f"        {opt}" in lines
    for head in ("Design : toy-3layer", "Version: softsyn 0.1.0", "Date   : Mon Jan  5 12:00:00 2026",
                 "Library: h200-ort-cuda (roofline estimate)", "Scenario: decode (batch 1, past 512)"):
        assert head in lines
    assert "Path Group: prefill" not in text
    assert "Incr (ms)" in text and "Path (ms)" in text


def test_launch_half_has_input_external_delay(analysis):
    text = report_timing(analysis, group="decode")
    line = next(l for l in text.splitlines() if "input external delay" in l)
    assert line.split()[-2:] == ["0.200", "0.200"]
    launch = text.split("data arrival time")[0]
    assert launch.index("clock decode (rise edge)") < launch.index("input external delay") < launch.index("input_ids (in)")


def test_required_half_and_slack_lines(analysis):
    text = report_timing(analysis)
    lines = [l.strip() for l in text.splitlines()]
    unc = next(l for l in lines if l.startswith("clock uncertainty"))
    assert unc.split()[-2:] == ["-0.100", "1.900"]
    out = next(l for l in lines if l.startswith("output external delay"))
    assert out.split()[-2:] == ["-0.050", "1.850"]
    decode_path = analysis.group("decode").critical
    prefill_path = analysis.group("prefill").critical
    assert decode_path.met and not prefill_path.met
    assert f"slack (MET) {decode_path.slack / MS:.3f}" in [" ".join(l.split()) for l in lines]
    assert f"slack (VIOLATED) {prefill_path.slack / MS:.3f}" in [" ".join(l.split()) for l in lines]
    # footer negates the arrival
    assert f"data arrival time -{decode_path.arrival / MS:.3f}" in [" ".join(l.split()) for l in lines]


def test_significant_digits(analysis):
    text = report_timing(analysis, group="decode", significant_digits=5)
    assert "-significant_digits 5" in text
    assert "0.20000" in text


def test_long_instance_name_wraps(analysis):
    lines = report_timing(analysis, group="decode").splitlines()
    i = next(k for k, l in enumerate(lines) if l.strip() == "lm_head/MatMulNBits_lm_head_quantized_int4_block32")
    nxt = lines[i + 1]
    assert nxt.startswith(" " * 50) and "MatMulNBits.int4.b32 (table)" in nxt


def test_suggestions_only_when_violated(analysis):
    met = report_timing(analysis, group="decode")
    assert "Suggestions" not in met
    bad = report_timing(analysis, group="prefill")
    assert "Suggestions" in bad
    assert "prefill misses by" in bad and "MatMul" in bad and "int4" in bad


def test_max_paths(analysis):
    one = report_timing(analysis, group="prefill")
    two = report_timing(analysis, group="prefill", max_paths=2)
    assert one.count("Startpoint:") == 1 and two.count("Startpoint:") == 2
    assert "Endpoint: present.2.value (output port)" in two
    # without a group: one section per group
    assert report_timing(analysis).count("Startpoint:") == 2


def test_unconstrained_path(analysis):
    g = analysis.group("decode")
    g.clock_period = math.inf
    p = g.critical
    p.clock_period, p.required, p.slack = math.inf, math.inf, math.inf
    text = report_timing(analysis, group="decode")
    assert "(Path is unconstrained)" in text and "slack (" not in text


# -------------------------------------------------------------------------------- fold_points

def test_fold_points_collapses_layers(analysis):
    points = analysis.group("decode").critical.points
    rows = fold_points(points)
    names = [r.point for r in rows]
    assert names == ["session.run", "model.embed_tokens/Gather", "model.layers.* (x3, folded)",
                     "model.norm/SimplifiedLayerNormalization",
                     "lm_head/MatMulNBits_lm_head_quantized_int4_block32"]
    folded = rows[2]
    layer_points = [p for p in points if p.hierarchy.startswith("model.layers.")]
    assert folded.folded == 3 and folded.cells == len(layer_points) == 24
    assert folded.incr == pytest.approx(sum(p.incr for p in layer_points))
    assert folded.path == layer_points[-1].arrival
    assert rows[0].cell == "Run.overhead (est)"


def test_fold_points_keeps_points_between_layers():
    def pt(h, t):
        return PathPoint(name=f"{h}/X", cell="Add.fp32", incr=1.0, arrival=t, source="est", hierarchy=h, op_type="Add")
    pts = [pt("model.layers.0.a", 1), pt("model.layers.1.a", 2), pt("model.shared", 3),
           pt("model.layers.2.a", 4), pt("model.layers.3.a", 5), pt("model.layers.3.b", 6),
           pt("encoder.block.7.x", 7), pt("", 8)]
    rows = fold_points(pts)
    assert [(r.point, r.incr, r.path) for r in rows] == [
        ("model.layers.* (x2, folded)", 2.0, 2),
        ("model.shared/X", 1.0, 3),
        ("model.layers.* (x2, folded)", 3.0, 6),
        ("encoder.block.7.x/X", 1.0, 7),  # a single index is not repeated: kept
        ("/X", 1.0, 8),
    ]


def test_fold_points_single_layer_and_empty():
    assert fold_points([]) == []
    p = PathPoint(name="model.layers.0.mlp/MatMul", cell="MatMul.fp32", incr=1.0, arrival=1.0, source="table",
                  hierarchy="model.layers.0.mlp", op_type="MatMul")
    rows = fold_points([p, p])
    assert [r.point for r in rows] == [p.name, p.name] and all(r.folded == 0 for r in rows)


def test_folded_report_is_shorter(analysis):
    full = report_timing(analysis)
    folded = report_timing(analysis, fold=True)
    assert "model.layers.* (x3, folded)" in folded and "model.layers.1" not in folded
    assert len(folded.splitlines()) < len(full.splitlines())


# -------------------------------------------------------------------------------- qor / area / constraint

def test_qor_summary(analysis):
    text = report_qor(analysis)
    assert "Timing Path Group 'decode'" in text and "Timing Path Group 'prefill'" in text
    assert "Estimated cells:" in text and "10 of 30 (roofline)" in text
    last = [l for l in text.splitlines() if l.strip().startswith("Design  WNS:")]
    prefill = analysis.group("prefill")
    assert last and f"WNS: {analysis.wns / MS:.3f}" in last[0]
    assert f"Number of Violating Paths: {prefill.violating_paths}" in last[0]
    assert "Total Number of Cells:" in text


def test_area_folds_hierarchy(analysis):
    text = report_area(analysis, hierarchy_depth=3)
    assert "model.layers.* (x3, folded)" in text
    assert "model.layers.0" not in text
    assert "slack (MET)" in text
    deep = report_area(analysis, hierarchy_depth=4)
    assert "model.layers.*.mlp (x3, folded)" in deep and "model.layers.*.self_attn (x3, folded)" in deep


def test_area_violated(analysis):
    analysis.area.limit = 3.0e9
    text = report_area(analysis)
    assert "slack (VIOLATED)" in text and "VRAM exceeds the limit" in text
    con = report_constraint(analysis)
    assert "max_area" in con and "(VIOLATED)" in con


def test_constraint_no_violations(analysis):
    analysis.groups = [analysis.group("decode")]
    text = report_constraint(analysis)
    assert "This design has no violated constraints." in text
    assert "max_delay/setup" not in text
    full = report_constraint(analysis, all_violators=False)
    assert "max_delay/setup ('decode' group)" in full and "(MET)" in full


def test_constraint_lists_only_violators(analysis):
    text = report_constraint(analysis)
    assert "max_delay/setup ('prefill' group)" in text
    assert "max_delay/setup ('decode' group)" not in text
    assert text.count("(VIOLATED)") == 2


# -------------------------------------------------------------------------------- JSON / files

def test_json_round_trip(analysis):
    text = to_json(analysis)
    data = json.loads(text)
    assert data["units"]["time"] == "s" and data["units"]["bytes"] == "B"
    assert data["groups"][0]["paths"][0]["input_delay"] == pytest.approx(0.2e-3)
    back = from_json(text)
    assert back == analysis
    for name, fn in REPORTS.items():
        assert fn(back) == fn(analysis), name
    assert report_timing(back, fold=True) == report_timing(analysis, fold=True)


def test_json_round_trip_with_serving(analysis):
    a = with_serving(analysis)
    back = from_json(to_json(a))
    assert back.serving == a.serving and back.serving.violated
    assert report_qor(back) == report_qor(a)


def test_json_round_trip_unconstrained(analysis):
    g = analysis.group("decode")
    g.clock_period = g.critical.clock_period = g.critical.required = g.critical.slack = math.inf
    back = from_json(to_json(analysis))
    assert back.group("decode").critical.slack == math.inf


def test_write_reports(analysis, tmp_path):
    written = write_reports(analysis, tmp_path)
    names = sorted(p.relative_to(tmp_path).as_posix() for p in written)
    assert names == ["analysis.json", "reports/area.rpt", "reports/constraint.rpt", "reports/qor.rpt",
                     "reports/suggestions.json", "reports/timing.rpt", "reports/timing_full.rpt"]
    assert (tmp_path / "reports/timing.rpt").read_text() == report_timing(analysis, fold=True)
    assert (tmp_path / "reports/timing_full.rpt").read_text() == report_timing(analysis)
    assert from_json((tmp_path / "analysis.json").read_text()) == analysis
    assert not [p for p in tmp_path.rglob("*.tmp")]
    # rewriting replaces in place
    write_reports(analysis, tmp_path)
    assert len(list((tmp_path / "reports").iterdir())) == 6


def test_reports_registry():
    assert set(REPORTS) == {"timing", "qor", "area", "constraint"}
    a = make_analysis()
    for fn in REPORTS.values():
        assert fn(copy.deepcopy(a)).startswith("*" * 40 + "\n")


def test_fold_points_collapses_long_runs_in_one_scope():
    def pt(name, hierarchy, t):
        return PathPoint(name=name, cell="Mul.fp32", incr=1e-6, arrival=t, source="est", hierarchy=hierarchy,
                         op_type="Mul")
    points = [pt(f"model/n{i}", "model", i * 1e-6) for i in range(4)] + [pt("lm_head/mm", "lm_head", 5e-6),
                                                                          pt("a/x", "a", 6e-6), pt("a/y", "a", 7e-6)]
    rows = fold_points(points)
    assert [r.point for r in rows] == ["model/* (4 cells, folded)", "lm_head/mm", "a/x", "a/y"]
    assert rows[0].incr == pytest.approx(4e-6) and rows[0].path == pytest.approx(3e-6) and rows[0].cells == 4
