"""passes.optimize.serving_target: a violated serving block gives the weight map a target (every step x s, the
`steps` suggestion's factor), which the search trades accuracy for; the groups' own clocks stay what is reported."""
import json
import re

from helpers import cli

CONS = """target: h200-ort-cuda
area_constraint: 1GiB
workload: {prompt_len: 128, context_len: 256}
accuracy: {max_rel_error: 30%}
precision: {allowed: [fp16, int8, int4], default: fp16}
serving:
  arrival_rate: 20/s
  max_batch: 16
  batch_timeout: 10ms
  prompt_len: {p50: 128, p99: 512}
  gen_len: {p50: 64, p99: 256}
  tpot: {p99: TPOT}
  requests: 200
  seed: 0
kv_cache: {max_length: 1536}
"""


def test_a_tpot_no_max_batch_meets_moves_the_weight_map_toward_the_steps_target(cache_dir, tmp_path, capsys):
    """qwen3-tiny on the H200 library: its fp16 design simulates tpot_p99 0.184 ms (est) and every path group meets
    its clock (none is given), so without a serving target the loop moves nothing (the cost order puts latency after slack). At a
    0.175 ms budget no max_batch meets it; the `steps` suggestion finds the factor that does, the map's targets are
    logged, and the search moves the one cell the library times faster at int4 (lm_head) within the budget."""
    cons = tmp_path / "c.yaml"
    cons.write_text(CONS.replace("TPOT", "0.175ms"))
    code, out, err = cli(capsys, "compile", "zoo:qwen3-tiny", "-c", cons, "--effort", "medium", "-o", tmp_path / "o",
                         "--cache-dir", cache_dir, "-q")
    assert code in (0, 1), err
    log = (tmp_path / "o" / "compile.log").read_text()
    line = next(ln for ln in log.splitlines() if ln.startswith("note: optimize: serving:"))
    match = re.search(r"every step x(0\.\d+) meets every check \(simulated, est\), so the map's targets are "
                      r"prefill ([\d.]+) ms -> ([\d.]+) ms, decode ([\d.]+) ms -> ([\d.]+) ms", line)
    assert match, line
    scale, *times = map(float, match.groups())
    assert 0.25 <= scale < 1 and times[1] < times[0] and times[3] < times[2]
    start = next(ln for ln in log.splitlines() if "opt.start" in ln)
    assert float(start.split("(est)")[1].split()[0]) < 0  # the search saw the target as a miss ...
    analysis = json.loads((tmp_path / "o" / "analysis.json").read_text())
    paths = [p for g in analysis["groups"] for p in g["paths"]]  # ... where the groups' own clocks meet (none given)
    assert paths and all(p["slack"] is None or p["slack"] >= 0 for p in paths)
    steps = next(s for s in analysis["serving"]["suggestions"] if s["knob"] == "steps")
    assert steps["meets"] and 0.25 <= steps["scale"] < 1
    rpt = (tmp_path / "o" / "reports" / "precision.rpt").read_text()
    assert re.search(r"^lm_head +int4 +int4 ", rpt, re.M), rpt
