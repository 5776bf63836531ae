"""The latency-error front: which points are on it (ties, dominated, missing coordinates), pareto.rpt's golden text
and pareto.json's round trip, peers.json as untrusted input, and a searching compile of qwen3-tiny whose reports hold
every map the loop evaluated, the uniform designs and, after `softsyn report pareto DIR --peers FILE`, the peers."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from reports.pareto import pareto_json, pareto_table, report_pareto, with_peers
from softsyn.cli import main, run
from softsyn.errors import SoftsynError
from softsyn.results.pareto import ParetoPoint, ParetoSet, axis_group, front, peer_points

from paths import ROOT

GOLDEN = Path(__file__).parent / "golden"
MS = 1e-3


def point(label: str, decode: float | None, error: float | None, measured: float | None = None, **kw) -> ParetoPoint:
    predicted = {"decode": decode} if decode is not None else {"prefill": 1.0}
    return ParetoPoint(label, kw.get("origin", "loop"), kw.get("mix", ""), predicted,
                       None if measured is None else {"decode": measured}, error, kw.get("how", "estimated"))


def test_the_front_is_the_points_no_other_dominates_ties_included():
    points = [point("a", 1.0, 0.1), point("b", 2.0, 0.05),
              point("c", 2.0, 0.1),  # dominated by a (faster, as accurate) and by b (as fast, more accurate)
              point("a-tie", 1.0, 0.1),  # equal to a on both axes: neither dominates, both on the front
              point("e", 3.0, 0.05),  # dominated by b
              point("no-decode", None, 0.0),  # no latency in the axis group: on no front, dominates nothing
              point("no-error", 0.5, None),
              point("measured", 5.0, 0.2, measured=0.5)]  # its measured latency, not the prediction, is its x
    assert front(points, "decode") == [True, True, False, True, False, False, False, True]
    assert front(points[2:3], "decode") == [True]  # alone, nothing dominates it
    assert front([point("x", 1.0, 0.1), point("y", 1.0, 0.05)], "decode") == [False, True]  # equal x: lower error


def test_the_axis_is_decode_else_the_heaviest_group():
    assert axis_group(["prefill", "decode"]) == "decode"
    assert axis_group(["encoder"]) == "encoder"
    assert axis_group(["short", "long"], {"short": 1.0, "long": 2.0}) == "long"
    assert axis_group(["a", "b"], {"a": 1.0, "b": 1.0}) == "a"


def golden_set() -> ParetoSet:
    def p(label, origin, mix, pred, error, how, measured=None, kept=False):
        return ParetoPoint(label, origin, mix, {"prefill": pred[0] * MS, "decode": pred[1] * MS},
                           None if measured is None else {"prefill": measured[0] * MS, "decode": measured[1] * MS},
                           error, how, kept)

    return ParetoSet("qwen3-1.7b", "h200-ort-cuda", "decode", ["prefill", "decode"], 0.05,
                     "measured per role on ORT CUDA", [
                         p("uniform fp16 (start)", "uniform", "196 fp16", (3.0, 1.2), 0.0, "estimated"),
                         p("greedy", "loop", "12 int4 + 184 fp16", (2.9, 1.0), 0.012, "estimated"),
                         p("ilp = recover = measured 1", "loop", "39 int4 + 53 int8 + 104 fp16", (2.8, 0.9), 0.008,
                           "measured", measured=(2.9, 0.95), kept=True),
                         p("uniform int4", "uniform", "196 int4", (2.5, 0.6), 0.09, "estimated"),
                         p("uniform int8", "uniform", "196 int8", (3.2, 0.94), 0.004, "estimated"),
                         ParetoPoint("builder: onnxruntime-genai 0.18 model builder, -p int4", "peer", "", {},
                                     {"prefill": 2.0 * MS, "decode": 0.7 * MS}, 0.03, "measured"),
                         ParetoPoint("plain", "peer", "", {}, {"decode": 1.3 * MS}, None, "measured")],
                     ["uniform fp8: no point: no cell runs faster at fp8 in any group (h200-ort-cuda), so the loop "
                      "never measured its error", "peers: bench/compare_peers.py, a test"])


def test_pareto_rpt_golden_and_its_json_round_trip():
    ps = golden_set()
    text = report_pareto(ps)
    path = GOLDEN / "pareto.rpt"
    if os.environ.get("SOFTSYN_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), "pareto.rpt differs from golden (SOFTSYN_UPDATE_GOLDEN=1 rewrites)"
    # the kept map is off the front: uniform int8 is faster at decode (predicted) and more accurate, slower in prefill
    assert "Kept: ilp = recover = measured 1 (39 int4 + 53 int8 + 104 fp16), off the front: dominated by 1 point" in text
    assert "uniform int8: decode 0.940 ms vs 0.950 ms" in text and "slower in prefill (3.200 ms vs 2.900 ms)" in text
    data = json.loads(pareto_json(ps))
    assert ParetoSet.from_dict(data) == ps
    assert data["front"] == ps.on_front() == [True, False, False, True, True, True, False]
    assert data["table"]["rows"] == [dict(r) for r in pareto_table(ps).rows]
    # a second peers file replaces the first one's points and note, never adds to them
    again = with_peers(ps, [ParetoPoint("other", "peer", "", {}, {"prefill": 1e-3}, 0.1, "measured")], [])
    assert [p.label for p in again.points if p.origin == "peer"] == ["other"]
    assert not [n for n in again.notes if "a test" in n] and "peers: no decode latency for other: on no front" in again.notes


@pytest.mark.parametrize("data, message", [
    ([], "not a JSON object"),
    ({"peers": []}, "peers: not a non-empty list"),
    ({"schema": "x/2", "peers": [{}]}, "schema: 'x/2' is not 'softsyn.peers/1'"),
    ({"peers": [3]}, "peers[0]: not an object"),
    ({"peers": [{"label": "", "latency": {"decode": 1e-3}}]}, "peers[0].label: '' is not a name"),
    ({"peers": [{"label": "x", "latency": []}]}, "peers[0].latency: not an object"),
    ({"peers": [{"label": "x", "latency": {"decode": "fast"}}]}, "peers[0].latency['decode']: 'fast' is not a positive"),
    ({"peers": [{"label": "x", "latency": {"decode": 0}}]}, "peers[0].latency['decode']: 0 is not a positive"),
    ({"peers": [{"label": "x", "latency": {"decode": 1e-3}, "error": -0.1}]}, "peers[0].error: -0.1 is not a number"),
    ({"peers": [{"label": "x", "latency": {"decode": 1e-3}, "error": True}]}, "peers[0].error: True is not a number"),
])
def test_a_bad_peers_file_is_one_line_naming_the_key(data, message):
    with pytest.raises(SoftsynError) as exc:
        peer_points(data, "p.json")
    text = str(exc.value)
    assert text.startswith("p.json: ") and message in text and "\n" not in text


def test_compare_peers_writes_a_peers_file_softsyn_reads(monkeypatch):
    spec = importlib.util.spec_from_file_location("compare_peers", ROOT / "bench" / "compare_peers.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "compare_peers", bench)  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    scenarios = {"decode128": {"batch": 1, "seq": 1, "past": 128}, "decode512": {"batch": 1, "seq": 1, "past": 512},
                 "prefill128": {"batch": 1, "seq": 128, "past": 0}}
    rows = [{"scenario": s, "variant": v, "median": m, "err": e} for s, v, m, e in [
        ("decode128", "plain", 2e-4, (None, None)), ("decode512", "plain", 3e-4, (None, None)),
        ("prefill128", "plain", 2e-3, (None, None)), ("decode128", "builder", 1e-4, (0.01, 0.02)),
        ("decode512", "builder", 1.5e-4, (0.5, 0.5)), ("prefill128", "builder", 1e-3, (0.03, 0.01))]]
    rows.append({"scenario": "decode128", "variant": "ort_fusions", "error": "failed"})  # no median: not a peer
    points, notes = peer_points(json.loads(json.dumps(bench.peers_json(rows, scenarios, "a test"))), "peers.json")
    assert [(p.label.split(":")[0], p.measured, p.error) for p in points] == [
        ("plain", {"decode": 2e-4, "prefill": 2e-3}, 0.0),  # the reference itself
        ("builder", {"decode": 1e-4, "prefill": 1e-3}, 0.03)]  # decode128 stands for decode: its error, not decode512's
    assert "decode = decode128 (b1 s1 p128), prefill = prefill128 (b1 s128 p0)" in notes[0]


# ------------------------------------------------------------------------------------------ a searching compile

def cli(capsys, *args) -> tuple[int, str, str]:
    """`softsyn ARGS` in this process, as the entry point maps errors to exit codes: (status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        run([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# qwen3-tiny on the CPU library, int8 and int4 allowed, a decode clock it misses and a loose budget: the loop searches
# (int4 moves the lm_head; int8 is slower than fp32 on every cell here, so it has no uniform point)
SEARCHING = """target: cpu-ort
input_delay: 1ms
output_delay: 100us
workload: {batch: 1, prompt_len: 32, context_len: 64}
path_groups:
  prefill: {kind: prefill, clock_period: 20ms, dims: {batch: 1, seq: 32, past: 0}}
  decode: {kind: decode, clock_period: 300us, weight: 2, dims: {batch: 1, seq: 1, past: 64}}
accuracy: {max_rel_error: 50%}
precision: {allowed: [fp32, int8, int4], default: fp32}
kv_cache: {dtype: fp32, max_length: 128}
"""


@pytest.fixture(scope="module")
def searched(cache_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pareto")
    (folder / "c.yaml").write_text(SEARCHING)
    out = folder / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-tiny", "-c", str(folder / "c.yaml"), "--effort", "high",
                                       "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 1, result.output + repr(result.exception)  # decode's I/O alone exceeds its clock
    return out


def test_a_searching_compile_reports_every_map_it_evaluated(searched):
    text = (searched / "reports" / "pareto.rpt").read_text()
    data = json.loads((searched / "reports" / "pareto.json").read_text())
    ps = ParetoSet.from_dict(data)
    labels = [p.label for p in ps.points]
    assert labels[0] == "uniform fp32 (start)" and "uniform int4" in labels
    assert any("greedy" in label and "ilp" in label for label in labels)  # one map, found by both searches
    assert "uniform int8: no point" in text
    (kept,) = [p for p in ps.points if p.kept]
    assert kept.origin == "loop" and kept.error_how == "measured"  # the end-to-end check's figure
    realised = json.loads((searched / "runtime" / "session.json").read_text())["precision_map"]["realised"]
    assert kept.mix == " + ".join(f"{n} {p}" for p, n in sorted(realised.items(), key=lambda kv: kv[0] != "int4"))
    analysis = json.loads((searched / "analysis.json").read_text())
    for g in analysis["groups"]:  # the kept map's prediction is the STA of the design as emitted
        path = g["paths"][0]
        assert kept.predicted[g["name"]] == pytest.approx(path["arrival"] - path["input_delay"], rel=1e-9)
    assert ps.on_front()[ps.points.index(kept)] or "off the front: dominated by" in text
    assert "Kept: " in text and data["front"] == ps.on_front()
    html = (searched / "reports" / "report.html").read_text()
    assert 'id="pareto"' in html and "kept-ring" in html and 'class="pt peer' not in html


def test_report_pareto_adds_peers_and_refuses_a_bad_file(searched, tmp_path, capsys):
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"schema": "softsyn.peers/1", "what": "a test", "peers": [
        {"label": "builder -p int4", "latency": {"decode": 1e-5, "prefill": 5e-5}, "error": 0.2},
        {"label": "plain", "latency": {"decode": 9e-5}, "error": 0.0}]}))
    result = CliRunner().invoke(main, ["report", "pareto", str(searched), "--peers", str(peers)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "builder -p int4" in result.output and "peers: a test" in result.output
    assert result.output == (searched / "reports" / "pareto.rpt").read_text()
    ps = ParetoSet.from_dict(json.loads((searched / "reports" / "pareto.json").read_text()))
    assert [p.label for p in ps.points if p.origin == "peer"] == ["builder -p int4", "plain"]
    assert ps.on_front()[[p.label for p in ps.points].index("builder -p int4")]  # fastest of all, on the front
    assert sum(p.kept for p in ps.points) == 1
    html = (searched / "reports" / "report.html").read_text()
    assert html.count('class="pt peer meas"') == 2 and "2 peers" in html

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"peers": [{"label": "x", "latency": {"decode": -1}}]}))
    before = (searched / "reports" / "pareto.json").read_text()
    code, _, err = cli(capsys, "report", "pareto", searched, "--peers", bad)
    assert code == 2
    assert err == f"softsyn: error: {bad}: peers[0].latency['decode']: -1 is not a positive number of seconds\n"
    assert (searched / "reports" / "pareto.json").read_text() == before  # nothing written
    bad.write_text("{not json")
    code, _, err = cli(capsys, "report", "pareto", searched, "--peers", bad)
    assert code == 2 and f"{bad}: not a readable peers file" in err
    code, _, err = cli(capsys, "report", "timing", searched, "--peers", peers)
    assert code == 2 and "--peers goes with KIND pareto" in err


def test_compare_peers_default_variants_need_no_extra_artifact(monkeypatch):
    # the H200 session's `peers` step passes no --variants: its defaults must run without --torch-dir/--compiled-dir
    spec = importlib.util.spec_from_file_location("compare_peers", ROOT / "bench" / "compare_peers.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "compare_peers", bench)
    spec.loader.exec_module(bench)
    for plan in bench.PLANS.values():
        assert not set(bench.TORCH_VARIANTS) & set(plan["variants"])
        assert not any(v.startswith("low") for v in plan["variants"])
    assert {"compiled+graph", "builder+graph"} <= set(bench.PLANS["cuda"]["variants"])
    # a torch variant without its artifact is refused before anything is built
    monkeypatch.setattr(sys, "argv", ["compare_peers.py", "--variants", "compiled,torch2", "--prepare-only"])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2
