"""Timing of architectures softsyn has never seen: plain ONNX exports of GPT-2-small and BERT-base shapes
(random weights, fp32, `torch.onnx.export(dynamo=True)` with dynamic dims, no KV cache), analysed with a
guide-style constraints file (batch 1, 128 tokens) and signed off on the target's runtime.

    python bench/family_signoff.py --provider cuda -o bench/results/family-signoff-cuda-DATE.md   # on the H200
    python bench/family_signoff.py --provider cpu                                                # here

Prints, per family: predicted (arrival - input delay), measured median, error = (predicted - measured) /
measured, and the five op types whose predicted total is furthest from their profiled total (the signoff's
per-op table), then the median |error| over the families.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {  # name -> (config class, kwargs: the published small shapes, model class)
    "gpt2-small": ("GPT2Config", {}, "GPT2LMHeadModel"),
    "bert-base": ("BertConfig", {}, "BertModel"),
}
CONSTRAINTS = """\
clock_period: 2000ms
input_delay:
  text: 10ms
output_delay: 1ms
area_constraint: 80GB
target: {target}
workload:
  batch: 1
  prompt_len: 128
"""


def export(name: str, folder: Path) -> Path:
    import torch
    import transformers

    path = folder / f"{name}.onnx"
    if path.exists():
        return path
    cfg_cls, kwargs, model_cls = FAMILIES[name]
    cfg = getattr(transformers, cfg_cls)(**kwargs)
    cfg.use_cache = False
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 128))
    dims = ({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC},)
    with torch.no_grad():
        torch.onnx.export(model, (ids,), str(path), dynamo=True, dynamic_shapes=dims, external_data=True)
    return path


def softsyn(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softsyn.cli", *args], capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--target", help="library (default h200-ort-cuda on cuda, cpu-ort on cpu)")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "softsyn-families")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    target = args.target or ("h200-ort-cuda" if args.provider == "cuda" else "cpu-ort")
    args.work.mkdir(parents=True, exist_ok=True)
    cons = args.work / "guide.yaml"
    cons.write_text(CONSTRAINTS.format(target=target))
    lines = [f"# Unseen families, predicted vs measured ({args.provider}, {target}), {datetime.date.today()}", "",
             f"Command: `python bench/family_signoff.py --provider {args.provider}"
             + (f" --target {args.target}" if args.target else "") + "`", "",
             "| family | group | predicted (ms) | measured median (ms) | error |", "|---|---|---|---|---|"]
    errors, details = [], []
    for name in FAMILIES:
        model = export(name, args.work)
        out = args.work / f"{name}-{args.provider}"
        an = softsyn("analyze", str(model), "-c", str(cons), "-o", str(out), "-q")
        if an.returncode not in (0, 1):
            print(f"{name}: analyze failed: {an.stderr.strip()}", file=sys.stderr)
            continue
        so = softsyn("signoff", str(out), "--provider", args.provider, "--runs", str(args.runs), "-q")
        if so.returncode not in (0, 1):
            print(f"{name}: signoff failed: {so.stderr.strip()}", file=sys.stderr)
            continue
        result = json.loads((out / "signoff" / "signoff.json").read_text())
        for g in result["groups"]:
            err = (g["predicted"] - g["measured_median"]) / g["measured_median"]
            quiet = (g["predicted"] - g["measured_quiet"]) / g["measured_quiet"]
            errors.append(abs(err))
            lines.append(f"| {name} | {g['name']} | {g['predicted'] * 1e3:.3f} | {g['measured_median'] * 1e3:.3f} "
                         f"(quiet {g['measured_quiet'] * 1e3:.3f}) | {err * 100:+.1f} % (quiet {quiet * 100:+.1f} %) |")
        details.append(f"## {name}\n\n```\n{so.stdout.strip()}\n```\n")
    if errors:
        lines += ["", f"Median |error| over the families: {statistics.median(errors) * 100:.1f} %", ""]
    text = "\n".join(lines + [""] + details)
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0 if errors else 1


if __name__ == "__main__":
    sys.exit(main())
