"""Quantised experts on ORT CPU: zoo:qwen3-moe-tiny's fused MoE experts fp32 vs QMoE int8 / int4, and the compile
loop's choice under a loose and a tight accuracy budget; each artifact verified against its fp32 reference and
signed off on the CPU (predicted vs measured per group).

    python bench/qmoe_cpu.py -o bench/results/qmoe-cpu-DATE.md [--runs 50]

Every form compiles under the same constraints (cpu-ort-xeon, whose MoE.fp32 / QMoE.int4 / QMoE.int8 cells were
measured at the tiny widths; a 10 us decode clock no design meets, so the loop moves whatever is faster; only the
experts are candidates: attention projections and lm_head in dont_touch, the router by rule moe_router):
`fp32` at --effort low (the fused MoE as the fuse pass leaves it), `int8` / `int4` at --effort medium with that one
quantised precision allowed and a 50 % budget (the experts forced), `loop 5%` / `loop 0.1%` at --effort medium with
both allowed. The H200 counterpart is bench/moe_cuda.py --forms fp16,qmoe.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from moe_cuda import moe_cells, worst_error

ROOT = Path(__file__).resolve().parents[1]
MODEL = "zoo:qwen3-moe-tiny"
CONSTRAINTS = """\
target: cpu-ort-xeon
clock_uncertainty: 0us
input_delay: 0ms
output_delay: 0us
workload: {{batch: 1, prompt_len: 16, context_len: 64}}
path_groups:
  prefill: {{kind: prefill, clock_period: 100ms, dims: {{batch: 1, seq: 16, past: 0}}}}
  decode: {{kind: decode, clock_period: 10us, dims: {{batch: 1, seq: 1, past: 16}}}}
accuracy: {{max_rel_error: {budget}}}
precision: {{allowed: [{allowed}], default: fp32}}
dont_touch: ["model.layers.*.self_attn.*", "lm_head"]
kv_cache: {{dtype: fp32, max_length: 64}}
"""
# form -> (effort, allowed precisions, accuracy budget)
FORMS = {"fp32": ("low", "fp32", "50%"), "int8": ("medium", "fp32, int8", "50%"),
         "int4": ("medium", "fp32, int4", "50%"), "loop 5%": ("medium", "fp32, int8, int4", "5%"),
         "loop 0.1%": ("medium", "fp32, int8, int4", "0.1%")}


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 1: a missed clock (the 10 us decode) or budget; the outputs are written
        sys.exit(f"{' '.join(cmd[2:4])} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return proc


def measure(form: str, work: Path, runs: int) -> str:
    effort, allowed, budget = FORMS[form]
    name = form.replace(" ", "-").replace("%", "pct").replace(".", "")
    cons, out = work / f"{name}.yaml", work / name
    cons.write_text(CONSTRAINTS.format(budget=budget, allowed=allowed))
    cli = [sys.executable, "-m", "softsyn.cli"]
    run(cli + ["compile", MODEL, "-c", str(cons), "--effort", effort, "-o", str(out), "-q"])
    error = worst_error(run(cli + ["verify", str(out), "--json", "-q"]).stdout)
    run(cli + ["signoff", str(out), "--runs", str(runs), "-q"])
    cells = moe_cells(out)
    pmap = json.loads((out / "runtime" / "session.json").read_text()).get("precision_map") or {}
    checked = pmap.get("checked_error")
    groups = {g["name"]: g for g in json.loads((out / "signoff" / "signoff.json").read_text())["groups"]}
    times = " | ".join(f"{groups[g]['predicted'] * 1e3:.3f} | {groups[g]['measured_median'] * 1e3:.3f}"
                       for g in ("prefill", "decode"))
    return (f"| {form} | {budget} | {cells['MoE']}/{cells['QMoE']} | {pmap.get('realised', {'fp32': 'all'})} | "
            f"{'-' if checked is None else f'{checked:.3e}'} | {error:.3e} | {times} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "softsyn-qmoe-cpu")
    ap.add_argument("--runs", type=int, default=50, help="signoff's timed runs per group")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    lines = [f"# Quantised experts on ORT CPU ({MODEL}, cpu-ort-xeon), {datetime.date.today()}", "",
             f"`python bench/qmoe_cpu.py --runs {args.runs}`; signoff medians of {args.runs} runs (ms); verify: the "
             "worst relative error over outputs against the fp32 reference; checked: the loop's end-to-end check.", "",
             "| form | budget | MoE/QMoE cells | loop's cells by precision | checked error | verify worst | "
             "prefill predicted | prefill measured | decode predicted | decode measured |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for form in FORMS:
        lines.append(measure(form, args.work, args.runs))
        print(lines[-1], file=sys.stderr)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
