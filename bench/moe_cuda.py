"""MoE on the H200: fused com.microsoft.MoE artifacts against plain exports and QMoE int4 experts, predicted vs measured.

    python3 bench/moe_cuda.py -o bench/results/moe-cuda-DATE.md          # on the H200 (PYTHONPATH=/tmp/site:.)
    python3 bench/moe_cuda.py --only 30b --forms fp16,qmoe -o F.md      # the QMoE must-show (bench/h200_session.sh qmoe)
    python3 bench/moe_cuda.py --dry-run                                  # here: the configs, files and commands

Two models, each compiled for h200-ort-cuda (experts fused into MoE; compiles on the CPU) and analysed as its plain
export (the batched_mm experts: per-token GatherND of expert weights), both signed off on CUDA
(`softsyn signoff --provider cuda`: predicted per group, measured median, error):

- zoo:qwen3-moe-tiny (2 layers, 4 experts top-2);
- Qwen3-30B-A3B at its real width (hidden 2048, 32/4 heads, 128 experts top-8 of width 768), LAYERS layers only,
  seeded random weights: all 48 layers are 61 GB of fp16 weights, and materialising an export takes ~3.5x its
  weights in host RAM (213 GB > the H200 box's 128 GB); 4 layers are 6.2 GB (~22 GB of RAM), the prediction is
  for the same netlist. Its prefill touches nearly all 128 experts, its decode 8 per layer.

Forms: `fused` (compile --effort low: fp16 MoE experts), `plain` (analyze the export), `fp16` (the fused fp16 design
compiled --effort low under the qmoe form's constraints and library: the design `qmoe` is measured against, at the
same scenarios), `qmoe` (compile --effort
medium under QMOE_CONSTRAINTS: only the experts are candidates, int4 the one quantised precision, a decode clock the
fp16 design misses and an accuracy budget of QMOE_BUDGET, with QMOE_LIBRARY as the target: the shipped H200 library
plus the MoE/QMoE cells measured on 2026-12-01, since the shipped one has no QMoE cell and the loop offers QMoE only
where its library has one). The qmoe artifact is verified against the fp32 reference (`softsyn verify`, the worst
relative error over outputs in the table) and signed off on CUDA beside the fused one, in one run. Each compile's
whole output goes to OUTPUT-STEM-I-FORM-compile.log beside the table (I: the model's index), and its loop verdicts
(why an expert block stayed MoE) to stderr.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 4
TARGET = "h200-ort-cuda"
CONSTRAINTS = f"""\
target: {TARGET}
clock_period: 100ms
input_delay:
  text: 0ms
output_delay: 0ms
area_constraint: 141GB
workload:
  batch: 1
  prompt_len: {{prompt}}
  context_len: {{context}}
"""


QMOE_LIBRARY = ROOT / "bench" / "results" / "h200-ort-cuda-moe-cells-2026-12-01.yaml"
# admits int4 experts on zoo:qwen3-moe-tiny (seeded: 0.9-2.0 % per layer, CPU) and one of the 30B-shaped x2's two
# blocks: layer 1 alone 10.6 %, layer 0 alone 21.3 %, both 23.8 % (ORT CPU, 2026-12-03); both need ~40 %
QMOE_BUDGET = "25%"
QMOE_CONSTRAINTS = f"""\
target: {TARGET}
clock_uncertainty: 0us
input_delay: 0ms
output_delay: 0ms
area_constraint: 141GB
workload: {{{{batch: 1, prompt_len: {{prompt}}, context_len: {{context}}}}}}
path_groups:
  prefill: {{{{kind: prefill, clock_period: 1s, dims: {{{{batch: 1, seq: {{prompt}}, past: 0}}}}}}}}
  decode: {{{{kind: decode, clock_period: 10us, weight: 2, dims: {{{{batch: 1, seq: 1, past: {{prompt}}}}}}}}}}
accuracy: {{{{max_rel_error: {QMOE_BUDGET}}}}}
precision: {{{{allowed: [fp16, int4], default: fp16}}}}
dont_touch: ["model.layers.*.self_attn.*", "lm_head"]
"""


def qwen3_30b_config(layers: int = LAYERS) -> dict:
    """The published Qwen3-30B-A3B config.json values (softsyn's zoo entry), cut to `layers` layers."""
    from softsyn.frontends import zoo

    cfg = zoo.make_config(zoo.ZOO["qwen3-30b-a3b"]).to_dict()
    cfg.update(num_hidden_layers=layers, architectures=["Qwen3MoeForCausalLM"], torch_dtype="float16")
    return cfg


def models(work: Path, layers: int = LAYERS) -> list[tuple[str, str, dict]]:
    """(label, MODEL spec, workload) per model; writes the 30B-shaped config folder (no weights: seeded)."""
    folder = work / f"qwen3-30b-a3b-{layers}layers"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(qwen3_30b_config(layers), indent=1))
    return [("qwen3-moe-tiny", "zoo:qwen3-moe-tiny", {"prompt": 128, "context": 1024}),
            (f"qwen3-30b-a3b x{layers} layers", str(folder / "config.json"), {"prompt": 512, "context": 4096})]


def commands(model: str, cons: Path, out: Path, qmoe_cons: Path | None = None) -> dict[str, list[list[str]]]:
    """The softsyn command lines of one model: fused (compile) and plain (analyze), each then signed off; with
    `qmoe_cons`, fp16 (compile --effort low under it against QMOE_LIBRARY, signoff) and qmoe (compile --effort medium
    under it against QMOE_LIBRARY, verify, signoff)."""
    cli = [sys.executable, "-m", "softsyn.cli"]
    fused, plain, qmoe = out / "fused", out / "plain", out / "qmoe"
    steps = {
        "fused": [cli + ["compile", model, "-c", str(cons), "--effort", "low", "-o", str(fused)],
                  cli + ["signoff", str(fused), "--provider", "cuda", "--runs", "30", "-q"]],
        "plain": [cli + ["analyze", model, "-c", str(cons), "--materialize", "-o", str(plain), "-q"],
                  cli + ["signoff", str(plain), "--provider", "cuda", "--runs", "30", "-q"]],
    }
    if qmoe_cons is not None:
        # the fp16 MoE design the qmoe one is measured against: the same groups, library and scenarios, no loop
        steps["fp16"] = [cli + ["compile", model, "-c", str(qmoe_cons), "--target", str(QMOE_LIBRARY), "--effort",
                                "low", "-o", str(out / "fp16")],
                         cli + ["signoff", str(out / "fp16"), "--provider", "cuda", "--runs", "30", "-q"]]
        steps["qmoe"] = [cli + ["compile", model, "-c", str(qmoe_cons), "--target", str(QMOE_LIBRARY), "--effort",
                                "medium", "-o", str(qmoe)],
                         cli + ["verify", str(qmoe), "--json", "-q"],
                         cli + ["signoff", str(qmoe), "--provider", "cuda", "--runs", "30", "-q"]]
    return steps


def moe_cells(directory: Path) -> dict[str, int]:
    """MoE/QMoE/GatherND cells of an output directory's netlist (compile: netlist.json; analyze: analysis.json)."""
    counts: dict[str, int] = {}
    meta = directory / "netlist.json"
    if meta.is_file():
        for c in json.loads(meta.read_text())["cells"]:
            counts[c["op"]] = counts.get(c["op"], 0) + 1
    else:
        counts = dict(json.loads((directory / "analysis.json").read_text()).get("cell_counts") or {})
    return {op: counts.get(op, 0) for op in ("MoE", "QMoE", "GatherND", "TopK")}


def moe_fusion(directory: Path) -> str:
    """The fusion report's moe row and MoE misses of a compiled directory (a site kept unfused says why)."""
    report = directory / "reports" / "fusion.rpt"
    if not report.is_file():
        return f"{directory}: no fusion report"
    lines = report.read_text().splitlines()
    keep = [ln for ln in lines if ln.startswith("moe ")]
    for i, ln in enumerate(lines):
        if ln.strip().startswith("[moe]"):
            keep += lines[i:i + 2]
    return "\n".join(keep) or f"{report}: no moe row"


def keep_compile_log(proc: subprocess.CompletedProcess, path: Path) -> None:
    """The compile's whole output (progress lines: each sensitivity run's error) to `path`, which the h200 step
    brings back beside the table, and its loop verdicts (the optimize notes: why an expert block stayed MoE, the
    suggestion) on stderr, in the step's log."""
    path.write_text(proc.stdout + "\n" + proc.stderr)
    verdicts = [ln for ln in proc.stdout.splitlines() if ln.startswith(("note: optimize:", "note: suggestion:"))]
    print("\n".join(verdicts + [f"compile log: {path}"]), file=sys.stderr)


def worst_error(verify_stdout: str) -> float | None:
    """The worst relative error over `softsyn verify --json`'s checks (None: no checks)."""
    checks = [c["rel"] for c in json.loads(verify_stdout)["checks"] if c["rel"] is not None]
    return max(checks) if checks else None


def rows(label: str, form: str, directory: Path, error: float | None = None,
         measured: dict | None = None) -> list[str]:
    """The table's rows of one signed-off form; each group's measured median also goes into `measured`
    [(label, form, group)] for the qmoe-vs-fp16 lines."""
    result = json.loads((directory / "signoff" / "signoff.json").read_text())
    cells = moe_cells(directory)
    out = []
    for g in result["groups"]:
        if measured is not None:
            measured[(label, form, g["name"])] = (g["predicted"], g["measured_median"])
        err = (g["predicted"] - g["measured_median"]) / g["measured_median"]
        out.append(f"| {label} | {form} | {g['name']} | {cells['MoE']}/{cells['QMoE']}/{cells['GatherND']} | "
                   f"{g['predicted'] * 1e3:.3f} | {g['measured_median'] * 1e3:.3f} | {err * 100:+.1f} % | "
                   f"{'-' if error is None else f'{error:.3e}'} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "softsyn-moe-cuda")
    ap.add_argument("--only", choices=["tiny", "30b"], help="one model only")
    ap.add_argument("--forms", default="fused,plain", help="comma-separated forms: fused, plain, qmoe")
    ap.add_argument("--dry-run", action="store_true", help="write the configs and print the commands, run nothing")
    ap.add_argument("--layers", type=int, default=LAYERS, help=f"the 30B-shaped model's layers (default {LAYERS}; the "
                    "qmoe step takes 2: its two compiles, verify and two signoffs of 4 ran past 420 s on 2026-12-03)")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    lines = [f"# MoE on CUDA ({TARGET}), fused vs plain, predicted vs measured, {datetime.date.today()}", "",
             "| model | form | group | MoE / QMoE / GatherND cells | predicted (ms) | measured median (ms) | error | "
             "verify: worst rel error vs fp32 |", "|---|---|---|---|---|---|---|---|"]
    forms = args.forms.split(",")
    failed = 0
    measured: dict = {}
    for i, (label, spec, workload) in enumerate(models(args.work, args.layers)):
        if args.only and args.only != ("tiny", "30b")[i]:
            continue
        out = args.work / f"model{i}"
        cons = args.work / f"constraints{i}.yaml"
        cons.write_text(CONSTRAINTS.format(**workload))
        qmoe_cons = args.work / f"constraints{i}-qmoe.yaml"
        qmoe_cons.write_text(QMOE_CONSTRAINTS.format(**workload))
        for form, steps in commands(spec, cons, out, qmoe_cons).items():
            if form not in forms:
                continue
            if args.dry_run:
                print("\n".join(" ".join(s) for s in steps))
                continue
            error = None
            for step in steps:
                started = time.perf_counter()
                proc = subprocess.run(step, cwd=ROOT, capture_output=True, text=True)
                print(f"{label} {form}: {step[3]} exit {proc.returncode} in {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)  # where the time went, even if the call is cut later
                if proc.returncode not in (0, 1):  # 1: a violated clock, area or accuracy; the outputs are written
                    print(f"{label} {form}: {' '.join(step[2:4])} failed ({proc.returncode}): "
                          f"{proc.stderr.strip()[-400:]}", file=sys.stderr)
                    failed += 1
                    break
                if step[3] == "compile":  # what the MoE rule and the loop said (a miss names its reason), in the log
                    logs = args.output.parent if args.output else args.work
                    keep_compile_log(proc, logs / f"{(args.output or Path('moe-cuda')).stem}-{i}-{form}-compile.log")
                    print(moe_fusion(Path(step[step.index("-o") + 1])), file=sys.stderr)
                if step[3] == "verify":
                    error = worst_error(proc.stdout)
                    print(f"{label} {form}: verify exit {proc.returncode}, worst rel error {error}", file=sys.stderr)
            else:
                lines += rows(label, form, out / form, error, measured)
    if args.dry_run:
        return 0
    pairs = [(k, measured[(k[0], "fp16", k[2])]) for k in measured if k[1] == "qmoe" and (k[0], "fp16", k[2]) in measured]
    if pairs:
        lines += ["", "QMoE against the fp16 MoE design (same constraints, library and scenarios; medians measured in "
                  "this run, predictions est):", ""]
        for (label, _, group), (p16, m16) in pairs:
            pq, mq = measured[(label, "qmoe", group)]
            lines.append(f"- {label} {group}: measured {mq * 1e3:.3f} vs {m16 * 1e3:.3f} ms ({(mq / m16 - 1) * 100:+.1f} %); "
                         f"predicted {pq * 1e3:.3f} vs {p16 * 1e3:.3f} ms ({(pq / p16 - 1) * 100:+.1f} %)")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
