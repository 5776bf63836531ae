"""`softsyn analyze zoo:qwen3-tiny -c` a constraints file with a serving: block (issue 30's CPU must-show): the four
serving groups with slack in report_qor, exit 0 when met and 1 when violated, quantified suggestions, and the same
rows in analysis.json and report.html."""
from __future__ import annotations

import json
import re

from helpers import cli, mlp
from paths import ROOT

SERVING = ROOT / "constraints" / "serving-tiny.yaml"
GROUPS = ("ttft_p50", "ttft_p99", "tpot_p99", "throughput")


def _rows(out: str) -> dict[str, list[str]]:
    """Each serving group's row, split: group, required, achieved, slack, status words."""
    return {g: line.split() for line in out.splitlines() for g in GROUPS if line.split()[:1] == [g]}


def test_serving_met_prints_four_groups_with_slack(capsys, cache_dir):
    code, out, _ = cli(capsys, "analyze", "zoo:qwen3-tiny", "-c", SERVING, "-q")
    assert code == 0, out
    rows = _rows(out)
    assert sorted(rows) == sorted(GROUPS)
    for g in GROUPS:
        required, achieved, slack = (float(x.replace(",", "")) for x in rows[g][1:4])
        expected = achieved - required if g == "throughput" else required - achieved
        assert abs(slack - expected) < 2e-3 * max(1.0, abs(required)), rows[g]
        assert rows[g][4:] == ["MET", "(simulated,", "est)"]
    assert "Serving: 0 of 4 checks violated (simulated, est)" in out
    assert "Suggestions" not in out


def test_rate_too_high_violates_with_quantified_suggestions(capsys, cache_dir, tmp_path):
    hot = tmp_path / "hot.yaml"
    hot.write_text(SERVING.read_text().replace("arrival_rate: 20/s", "arrival_rate: 400/s"))
    out_dir = tmp_path / "out"
    code, out, _ = cli(capsys, "analyze", "zoo:qwen3-tiny", "-c", hot, "-q", "-o", out_dir)
    assert code == 1, out
    rows = _rows(out)
    assert rows["ttft_p99"][4] == "VIOLATED" and float(rows["ttft_p99"][3]) < 0
    suggestions = out.split("Suggestions (each re-runs the simulation with one knob changed)")[1]
    assert re.search(r"rate +yes +arrival_rate 400/s -> \d+/s \(the highest within 6.2/s meeting the latency "
                     r"checks\) +ttft_p50 [\d.]+ ms, ttft_p99 [\d.]+ ms, tpot_p99 [\d.]+ ms: all met", suggestions)
    assert re.search(r"max_batch +(yes|no) +max_batch 16 -> \d+", suggestions)
    assert re.search(r"precision +(yes|no) +weight matmuls int8 \(MatMulNBits what-if; decode at batch 16, past "
                     r"\d+: [\d.]+ ms -> [\d.]+ ms\) +ttft_p50 [\d.]+ ms", suggestions)
    assert re.search(r"kv_dtype +(yes|no) +kv_cache.dtype int8 \(KV budget [\d,]+ -> [\d,]+ tokens\)", suggestions)
    saved = json.loads((out_dir / "analysis.json").read_text())["serving"]
    checks = {c["group"]: c for c in saved["checks"]}
    assert checks["ttft_p99"]["slack"] == checks["ttft_p99"]["required"] - checks["ttft_p99"]["achieved"] < 0
    assert [s["knob"] for s in saved["suggestions"]] == ["rate", "max_batch", "precision", "precision", "kv_dtype", "steps"]
    for metric in ("ttft", "tpot"):  # TPOT: the requests with more than one token
        assert sum(b["count"] for b in saved["histogram"] if b["metric"] == metric) <= saved["completed"]
    assert sum(b["count"] for b in saved["histogram"] if b["metric"] == "ttft") == saved["completed"]
    html = (out_dir / "reports" / "report.html").read_text()
    assert '<section id="serving" data-verdict="VIOLATED">' in html
    assert '<figure data-metric="ttft">' in html and '<figure data-metric="tpot">' in html
    assert f'data-key="slack" data-title="Slack (ms)" data-si="{checks["ttft_p99"]["slack"]!r}"' in html
    violators = (out_dir / "reports" / "constraint.rpt").read_text()
    assert "serving latency (simulated, est) (ms)" in violators
    assert _rows(violators)["ttft_p99"] == rows["ttft_p99"] and "tpot_p99" not in _rows(violators)
    code, again, _ = cli(capsys, "report", "qor", out_dir)
    assert code == 0 and _rows(again) == rows


def test_step_times_are_the_sta_at_those_dims(capsys, cache_dir):
    """The step table's points where the default groups sit (workload: prompt 128, context 256; no input delay in
    serving-tiny.yaml) are those groups' critical arrivals: the same STA at the same dims."""
    code, out, _ = cli(capsys, "analyze", "zoo:qwen3-tiny", "-c", SERVING, "-q", "--json")
    assert code == 0
    data = json.loads(out)
    arrival = {g["name"]: g["paths"][0]["arrival"] for g in data["groups"]}
    steps = {(p["kind"], p["batch"], p["tokens"]): p["time"] for p in data["serving"]["steps"]}
    assert steps[("decode", 1, 256)] == arrival["decode"]
    assert steps[("prefill", 1, 128)] == arrival["prefill"]
    assert steps[("decode", 16, 256)] > steps[("decode", 1, 256)]


def test_serving_on_a_model_without_kv_cache_is_refused(capsys, tmp_path):
    model = mlp(tmp_path / "mlp.onnx")
    code, _, err = cli(capsys, "analyze", model, "-c", SERVING, "-q")
    assert code == 2
    assert f"{SERVING}:11: serving: design mlp is a generic model; serving simulates a decoder" in err


def test_a_declared_batched_decode_group_is_timed_as_the_simulations_step(capsys, cache_dir, tmp_path):
    """Batched scenarios as path groups: a decode group at batch 16 (declared like any group) shows in report_timing,
    and its arrival is the serving simulation's step-table point at the same batch and past: one STA, two views."""
    batched = tmp_path / "batched.yaml"
    batched.write_text(SERVING.read_text() + "\npath_groups:\n"
                       "  prefill: {kind: prefill}\n  decode: {kind: decode}\n"
                       "  decode_b16: {kind: decode, batch: 16, dims: {past: 256}, clock_period: 2ms, input_delay: {}}\n")
    out_dir = tmp_path / "out"
    code, out, _ = cli(capsys, "analyze", "zoo:qwen3-tiny", "-c", batched, "-q", "-o", out_dir)
    assert code == 0, out
    analysis = json.loads((out_dir / "analysis.json").read_text())
    group = next(g for g in analysis["groups"] if g["name"] == "decode_b16")
    assert group["scenario"]["dims"]["batch"] == 16 and group["scenario"]["dims"]["past"] == 256
    point = next(p for p in analysis["serving"]["steps"] if (p["kind"], p["batch"], p["tokens"]) == ("decode", 16, 256))
    arrival = max(path["arrival"] for path in group["paths"])  # the critical path's (no input delay here)
    assert point["time"] > 0 and abs(arrival - point["time"]) <= 1e-9 * point["time"]
    code, timing, _ = cli(capsys, "report", "timing", out_dir, "--group", "decode_b16")
    assert code == 0 and "decode_b16" in timing


def test_a_prompt_length_met_first_is_charged_per_distinct_gemm_shape_and_warming_is_reported(capsys, cache_dir,
                                                                                                tmp_path):
    """With first-shape figures in the library's serving_host block, the compile's host model charges a first-met
    prompt length distinct GEMM shapes x first_shape_gemm + the other nodes x first_shape_node: qwen3-tiny's layers
    repeat the same projections, so its GEMM shapes are a handful while its GEMM nodes grow with the layers. With
    serving.warm_prompts the note gives the load time."""
    library = tmp_path / "cpu-first.yaml"
    text = (ROOT / "softsyn" / "library" / "libs" / "cpu-ort.yaml").read_text()
    library.write_text(text.replace("\nserving_host:", "\nserving_host:\n  first_shape_gemm: 1.0e-3\n"
                                    "  first_shape_node: 1.0e-9", 1))
    warm = tmp_path / "warm.yaml"
    warm.write_text(SERVING.read_text().replace("serving:\n", "serving:\n  warm_prompts: true\n", 1))
    out_dir = tmp_path / "out"
    code, out, _ = cli(capsys, "analyze", "zoo:qwen3-tiny", "-c", warm, "--target", library, "-q", "-o", out_dir)
    assert code in (0, 1), out
    saved = json.loads((out_dir / "analysis.json").read_text())["serving"]
    gemm_shapes, others = divmod(round(saved["host"]["first_shape"] * 1e9), 1_000_000)
    assert 2 <= gemm_shapes <= 8 and others > 20, saved["host"]["first_shape"]  # a layer's projections, the lm_head
    assert "once per prompt length met first" in saved["host"]["line"] and saved["completed"] > 0
    assert re.search(r"serving.warm_prompts: the engine prefills every prompt length 1\.\.\d+ once at load, "
                     r"[\d.]+ s \(est", out), out[-2000:]
