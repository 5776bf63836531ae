"""MoE on the H200: fused com.microsoft.MoE artifacts against plain exports, predicted vs measured.

    python3 bench/moe_cuda.py -o bench/results/moe-cuda-DATE.md          # on the H200 (PYTHONPATH=/tmp/site:.)
    python3 bench/moe_cuda.py --dry-run                                  # here: the configs, files and commands

Two models, each compiled for h200-ort-cuda (experts fused into MoE; compiles on the CPU) and analysed as its plain
export (the batched_mm experts: per-token GatherND of expert weights), both signed off on CUDA
(`softsyn signoff --provider cuda`: predicted per group, measured median, error):

- zoo:qwen3-moe-tiny (2 layers, 4 experts top-2);
- Qwen3-30B-A3B at its real width (hidden 2048, 32/4 heads, 128 experts top-8 of width 768), LAYERS layers only,
  seeded random weights: all 48 layers are 61 GB of fp16 weights, and materialising an export takes ~3.5x its
  weights in host RAM (213 GB > the H200 box's 128 GB); 4 layers are 6.2 GB (~22 GB of RAM), the prediction is
  for the same netlist. Its prefill touches nearly all 128 experts, its decode 8 per layer.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
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


def qwen3_30b_config(layers: int = LAYERS) -> dict:
    """The published Qwen3-30B-A3B config.json values (softsyn's zoo entry), cut to `layers` layers."""
    from softsyn.frontends import zoo

    cfg = zoo.make_config(zoo.ZOO["qwen3-30b-a3b"]).to_dict()
    cfg.update(num_hidden_layers=layers, architectures=["Qwen3MoeForCausalLM"], torch_dtype="float16")
    return cfg


def models(work: Path) -> list[tuple[str, str, dict]]:
    """(label, MODEL spec, workload) per model; writes the 30B-shaped config folder (no weights: seeded)."""
    folder = work / f"qwen3-30b-a3b-{LAYERS}layers"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(qwen3_30b_config(), indent=1))
    return [("qwen3-moe-tiny", "zoo:qwen3-moe-tiny", {"prompt": 128, "context": 1024}),
            (f"qwen3-30b-a3b x{LAYERS} layers", str(folder / "config.json"), {"prompt": 512, "context": 4096})]


def commands(model: str, cons: Path, out: Path) -> dict[str, list[list[str]]]:
    """The softsyn command lines of one model: fused (compile) and plain (analyze), each then signed off."""
    cli = [sys.executable, "-m", "softsyn.cli"]
    fused, plain = out / "fused", out / "plain"
    return {
        "fused": [cli + ["compile", model, "-c", str(cons), "--effort", "low", "-o", str(fused), "-q"],
                  cli + ["signoff", str(fused), "--provider", "cuda", "--runs", "30", "-q"]],
        "plain": [cli + ["analyze", model, "-c", str(cons), "--materialize", "-o", str(plain), "-q"],
                  cli + ["signoff", str(plain), "--provider", "cuda", "--runs", "30", "-q"]],
    }


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


def rows(label: str, form: str, directory: Path) -> list[str]:
    result = json.loads((directory / "signoff" / "signoff.json").read_text())
    cells = moe_cells(directory)
    out = []
    for g in result["groups"]:
        err = (g["predicted"] - g["measured_median"]) / g["measured_median"]
        out.append(f"| {label} | {form} | {g['name']} | {cells['MoE']}/{cells['GatherND']} | "
                   f"{g['predicted'] * 1e3:.3f} | {g['measured_median'] * 1e3:.3f} | {err * 100:+.1f} % |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "softsyn-moe-cuda")
    ap.add_argument("--only", choices=["tiny", "30b"], help="one model only")
    ap.add_argument("--dry-run", action="store_true", help="write the configs and print the commands, run nothing")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    lines = [f"# MoE on CUDA ({TARGET}), fused vs plain, predicted vs measured, {datetime.date.today()}", "",
             "| model | form | group | MoE / GatherND cells | predicted (ms) | measured median (ms) | error |",
             "|---|---|---|---|---|---|---|"]
    failed = 0
    for i, (label, spec, workload) in enumerate(models(args.work)):
        if args.only and args.only != ("tiny", "30b")[i]:
            continue
        out = args.work / f"model{i}"
        cons = args.work / f"constraints{i}.yaml"
        cons.write_text(CONSTRAINTS.format(**workload))
        for form, steps in commands(spec, cons, out).items():
            if args.dry_run:
                print("\n".join(" ".join(s) for s in steps))
                continue
            for step in steps:
                proc = subprocess.run(step, cwd=ROOT, capture_output=True, text=True)
                if proc.returncode not in (0, 1):  # 1: a violated clock or area; the outputs are written
                    print(f"{label} {form}: {' '.join(step[2:4])} failed ({proc.returncode}): "
                          f"{proc.stderr.strip()[-400:]}", file=sys.stderr)
                    failed += 1
                    break
            else:
                lines += rows(label, form, out / form)
    if args.dry_run:
        return 0
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
